"""Opaque page tokens for every List RPC (Google AIP-158).

A token is base64url of a small JSON object naming the list it belongs to and where the next
page starts; callers must treat it as opaque. Decoding validates everything (length, base64,
JSON, the list's name, field types and ranges) and turns any problem into ``InvalidArgument``
naming the ``page_token`` field, so garbage, NaN or a 2^70 offset never reaches a query.
Pure code, no gRPC.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from fortis.services.common.errors import InvalidArgument

__all__ = ["MAX_TOKEN_CHARS", "decode_token", "encode_token", "page_of", "page_size",
           "tenant_list"]

MAX_TOKEN_CHARS = 512
_MAX_INT = 2**53
T = TypeVar("T")


def tenant_list(kind: str, tenant: str) -> str:
    """The list name of ``kind`` as ``tenant`` sees it, for lists whose content depends on the
    caller (a page token minted for one tenant is INVALID_ARGUMENT for another, never
    a position in its list). A digest of the tenant, so the token does not spell its name."""
    return f"{kind}@{hashlib.sha256(tenant.encode()).hexdigest()[:16]}"


def encode_token(kind: str, **position: Any) -> str:
    """The token of the page starting at ``position`` in list ``kind``."""
    doc = {"k": kind, **position}
    return base64.urlsafe_b64encode(json.dumps(doc, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_token(token: str, kind: str, fields: Mapping[str, type],
                 field: str = "page_token") -> dict[str, Any]:
    """The position a token of list ``kind`` encodes; ``fields`` maps each key to its type
    (``int`` keys must be integers in [0, 2^53), ``float`` keys finite numbers, ``str`` keys
    strings of at most 256 characters)."""
    bad = InvalidArgument(field, "not a page token from a previous response of this list")
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        doc = json.loads(raw.decode())
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise bad from None
    if not isinstance(doc, dict) or doc.get("k") != kind or set(doc) != {"k", *fields}:
        raise bad
    out: dict[str, Any] = {}
    for key, typ in fields.items():
        v = doc[key]
        if typ is int:
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < _MAX_INT:
                raise bad
        elif typ is float:
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise bad
            v = float(v)
        elif not isinstance(v, str) or len(v) > 256:
            raise bad
        out[key] = v
    return out


def page_size(requested: int, *, default: int, maximum: int, field: str = "page_size") -> int:
    """The page size to use: ``default`` for 0, else ``requested`` within 1..maximum."""
    if requested == 0:
        return default
    if not 1 <= requested <= maximum:
        raise InvalidArgument(field, f"must be in 1..{maximum} (0 = {default}), got {requested}")
    return requested


def page_of(items: Sequence[T], kind: str, size: int, token: str,
            field: str = "page_token") -> tuple[list[T], str]:
    """One page of an in-memory list (catalogues, targets) and the next page's token."""
    start = decode_token(token, kind, {"o": int}, field)["o"] if token else 0
    if start > len(items):
        raise InvalidArgument(field, "not a page token from a previous response of this list")
    end = start + size
    return list(items[start:end]), (encode_token(kind, o=end) if end < len(items) else "")
