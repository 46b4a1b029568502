"""API keys: how they are written in configuration and how new ones are made. Pure code (the
gRPC interceptor that checks them is in ``server.py``)."""

from __future__ import annotations

import secrets

from fortis.services.common import errors

__all__ = ["new_api_key", "parse_api_keys"]


def parse_api_keys(text: str) -> dict[str, str]:
    """Parse ``"key1=tenantA,key2=tenantB"`` (the FORTIS_API_KEYS format)."""
    keys: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, tenant = part.partition("=")
        if not sep or not key or not tenant:
            raise errors.InvalidArgument("api_keys", f"entry '{part[:60]}' is not KEY=TENANT")
        keys[key] = tenant
    return keys


def new_api_key() -> str:
    """A new random key (192 bits)."""
    return "fk_" + secrets.token_urlsafe(24)
