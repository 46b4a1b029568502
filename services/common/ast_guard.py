"""One lock around ``ast.parse`` in every Fortis process.

CPython 3.11 keeps the recursion depth of the AST constructor in one place for the whole
interpreter (cpython gh-106905). When a thread is converting a parse tree to ``ast`` objects
and the garbage collector runs a finalizer that lets another thread in, and that thread
parses too, the first one fails with ``SystemError: AST constructor recursion depth
mismatch``. Fortis parses from many threads without asking for it: numpy reads the header of
every ``.npy`` array with ``ast.literal_eval`` (every work item's result is an ``.npz``
blob, unpacked by the item threads), and ``inspect.signature`` parses text signatures. Found
by the fresh-clone CI: a resumed evaluation failed INTERNAL with that SystemError.

:func:`install` makes ``ast.parse`` (and so ``ast.literal_eval``, which calls it) hold one
process-wide lock: parses are short (headers of a few dozen characters), so the lock costs
nothing measurable. Called by every composition root (``start_stack``, ``run_worker``, the
CLI). ``tests/unit/test_ast_guard.py`` reproduces the failure (finalizers that yield, four
threads parsing) and checks the guard removes it. Pure code: no gRPC.
"""

from __future__ import annotations

import ast
import threading
from typing import Any

_LOCK = threading.RLock()     # a finalizer run inside a parse may parse too


def install() -> None:
    """Serialise ``ast.parse`` in this process (idempotent)."""
    if getattr(ast.parse, "_fortis_guarded", False):
        return
    unguarded = ast.parse

    def parse(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return unguarded(*args, **kwargs)

    parse._fortis_guarded = True  # type: ignore[attr-defined]
    parse.__doc__ = unguarded.__doc__
    ast.parse = parse  # type: ignore[assignment]
