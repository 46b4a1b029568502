"""Authentication by secret *reference*: a profile names where a secret lives (``env:VAR`` or
``file:/path``), never the secret itself; the value is read on every request (a rotated file
is picked up) and scrubbed from anything the adapter reports.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from fortis.services.common import errors


@dataclass(frozen=True)
class SecretRef:
    """A reference to a secret: ``env:VAR`` or ``file:/path``. Resolved on every request (so a
    rotated file is picked up); the value never appears in reprs, errors or logs."""

    ref: str

    def resolve(self) -> str:
        """The secret as one line (a header value)."""
        value = self.resolve_text()
        if "\r" in value or "\n" in value:
            raise errors.FailedPrecondition(f"secret {self.ref}: contains a line break")
        return value

    def resolve_text(self) -> str:
        """The secret as written, line breaks kept (a service-account key file is JSON)."""
        kind, _, where = self.ref.partition(":")
        if kind == "env":
            value = os.environ.get(where)
            if not value:
                raise errors.FailedPrecondition(
                    f"secret {self.ref}: environment variable is not set")
        else:
            try:
                value = Path(where).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise errors.FailedPrecondition(
                    f"secret {self.ref}: cannot read the file ({exc.strerror})") from None
            if not value:
                raise errors.FailedPrecondition(f"secret {self.ref}: the file is empty")
        return value


@dataclass(frozen=True, kw_only=True)
class AuthSpec:
    header: str
    secret: SecretRef
    prefix: str = ""


def auth_headers(auth: AuthSpec | None) -> dict[str, str]:
    """The header carrying the secret (empty without ``auth``)."""
    if auth is None:
        return {}
    return {auth.header: auth.prefix + auth.secret.resolve()}


def redact(text: str, auths: Iterable[AuthSpec | None], extra: Iterable[str] = ()) -> str:
    """``text`` with the current value of every secret, and each of ``extra`` (the tokens and
    keys a cloud signer used), replaced by ``[secret]`` (a service may echo the request's
    headers back in an error message)."""
    for value in extra:
        if len(value) >= 4:
            text = text.replace(value, "[secret]")
    for a in auths:
        if a is None:
            continue
        try:
            secret = a.secret.resolve()
        except errors.FortisError:
            continue
        if len(secret) >= 4:
            text = text.replace(secret, "[secret]")
    return text
