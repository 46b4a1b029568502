"""Start-up steps of a server, each failing on its own: ``fortis serve`` says which step
failed and what was missing, and exits with the code of the failure's class
(docs/pipelines.md, "Exit codes of fortis serve").

A failure deep inside start-up otherwise surfaces as whatever exception escaped, caught by
the nearest handler, which may belong to another step (a model's missing package was once
reported as a metrics-port failure). Wrapping every step in :func:`step` keeps the step's
name with its error.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from fortis.services.common import errors

#: What the operator gave is wrong or points at something unusable: an option, the API keys
#: (file), the TLS material, the targets configuration, the state folder or database.
EXIT_CONFIG: Final = 2
#: The installation lacks something a built-in target, surrogate or model needs (a package,
#: a weights file): an installation problem, not a setting.
EXIT_MODELS: Final = 5
#: An address cannot be listened on (the gRPC address or the metrics address): in use, or
#: not this machine's.
EXIT_LISTEN: Final = 6


_HINT_MARKERS = ("pip install", "scripts/")


class StartupError(Exception):
    """A start-up step failed: ``step`` names it, ``detail`` says what is missing or wrong."""

    def __init__(self, step: str, detail: str, exit_code: int) -> None:
        super().__init__(f"startup failed at '{step}': {detail}")
        self.step = step
        self.detail = detail
        self.exit_code = exit_code


def describe(exc: BaseException) -> str:
    """One line naming what failed, without a traceback: a missing module by name, an OS
    error with its file, a Fortis error's own message."""
    if isinstance(exc, ModuleNotFoundError):
        return f"module '{exc.name}' is not installed"
    if isinstance(exc, OSError) and exc.strerror:
        where = f" '{exc.filename}'" if exc.filename else ""
        return f"{exc.strerror}{where}"
    text = str(exc) or type(exc).__name__
    if isinstance(exc, (errors.FortisError, OSError)):
        return text
    return f"{type(exc).__name__}: {text}"


@contextmanager
def step(name: str, exit_code: int = EXIT_CONFIG, *, hint: str = "",
         subject: str = "") -> Iterator[None]:
    """Run a start-up step: any failure inside becomes a :class:`StartupError` naming ``name``.

    ``exit_code`` is the class of the step's failures; whatever the step, an InvalidArgument
    (a bad setting) is EXIT_CONFIG, a module that is not installed EXIT_MODELS and a bind
    error (address in use, not available) EXIT_LISTEN. ``hint`` (e.g. the command that installs a missing package) is appended to
    failures of the step's own class; ``subject`` (e.g. which target) prefixes every
    failure."""
    try:
        yield
    except StartupError:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure of the step is reported as one
        code = exit_code
        if isinstance(exc, errors.InvalidArgument):
            code = EXIT_CONFIG
        elif isinstance(exc, ModuleNotFoundError):      # whichever step imports it first
            code = EXIT_MODELS
        elif isinstance(exc, OSError) and exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
            code = EXIT_LISTEN
        detail = f"{subject}: {describe(exc)}" if subject else describe(exc)
        # A message that already says how to install what is missing keeps its own hint.
        if hint and code == exit_code and not any(m in detail for m in _HINT_MARKERS):
            detail = f"{detail} ({hint})"
        raise StartupError(name, detail, code) from exc
