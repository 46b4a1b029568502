"""One rule for every file a request may name on the server.

A request never names a server path: it names a file *relative to a root the operator
configured* (the data root for manifests, the model root for style models). The path must be
relative, without a ``..`` part or a NUL, and its resolved location (symlinks followed) must be
a regular file inside the root. A missing file, one outside the root and one that is not a
regular file all give the same "not found under the <root>" message, naming no server path,
so no caller learns which server files exist. Pure code, no gRPC.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path, PurePosixPath

from fortis.services.common.errors import InvalidArgument

__all__ = ["MAX_PATH_CHARS", "confined_file", "relative_path", "tenant_dir_name"]

MAX_PATH_CHARS = 1024
_SAFE_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,63}")


def tenant_dir_name(tenant: str) -> str:
    """A folder name for ``tenant``: the name itself when it is safe, else its safe
    characters plus a digest (two different tenants never share a folder). Used for every
    per-tenant folder (artifacts, uploaded blobs), so everything stored is tenant-scoped."""
    if _SAFE_NAME.fullmatch(tenant):
        return tenant
    kept = re.sub(r"[^A-Za-z0-9_\-]", "_", tenant)[:40] or "tenant"
    return f"{kept}-{hashlib.sha256(tenant.encode('utf-8', 'replace')).hexdigest()[:16]}"


def relative_path(raw: object, field: str, root_name: str = "data root") -> PurePosixPath:
    """``raw`` as a path relative to a root: a non-empty string, bounded, neither absolute nor
    with a ``..`` part; InvalidArgument on ``field`` otherwise. Where it leads is checked by
    :func:`confined_file` (a folder is checked file by file, as each is opened)."""
    if not isinstance(raw, str) or not raw.strip():
        raise InvalidArgument(field, f"a path relative to the {root_name} is needed")
    if len(raw) > MAX_PATH_CHARS:
        raise InvalidArgument(field, f"a path of at most {MAX_PATH_CHARS} characters is needed")
    rel = PurePosixPath(raw)
    if rel.is_absolute() or raw.startswith("\\"):
        raise InvalidArgument(field, f"must be a path relative to the {root_name}, not absolute")
    if ".." in rel.parts:
        raise InvalidArgument(field, f"must not contain '..': paths stay under the {root_name}")
    if "\x00" in raw:
        raise InvalidArgument(field, f"not found under the {root_name}")
    return rel


def confined_file(root: Path, raw: object, field: str, *, base: PurePosixPath = PurePosixPath(),
                  root_name: str = "data root") -> Path:
    """The regular file ``raw`` names, relative to ``base`` (itself relative) under ``root``;
    InvalidArgument on ``field`` otherwise (see the module docstring)."""
    rel = relative_path(raw, field, root_name)
    not_found = f"not found under the {root_name}"
    try:
        top = root.resolve(strict=True)
        found = (top / base / rel).resolve(strict=True)
        ok = found.is_relative_to(top) and found.is_file()
    except (OSError, RuntimeError, ValueError):   # missing, loop, unreadable: all "not found"
        ok = False
    if not ok:
        raise InvalidArgument(field, not_found)
    return found
