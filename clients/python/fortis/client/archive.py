"""Packing a local dataset folder into a tar as it is uploaded (``FortisClient.upload_folder``,
``fortis upload-dataset --archive``): nothing is written to disk. The tar is reproducible
(members sorted by name, times, owners and modes fixed), so it is made twice -- once to learn
its size and SHA-256 for the upload's header, once to send -- and the same folder always
gives the same blob id (an unchanged dataset is not stored twice). Only regular files and
folders are packed; a symbolic link or any other kind of file is refused, since the server
refuses links in an archive anyway."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["folder_entries", "tar_chunks", "tar_digest"]


def folder_entries(folder: Path) -> list[tuple[str, Path]]:
    """(member name, path) of the folder and everything under it, sorted; the members are
    named under the folder's own name (``val/ann.json``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder}: not a folder")
    top = folder.resolve().name or "data"
    out = [(top, folder)]
    for here, dirs, files in os.walk(folder, followlinks=False):
        dirs.sort()
        for name in sorted(dirs) + sorted(files):
            p = Path(here) / name
            mode = os.lstat(p).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise ValueError(
                    f"{p}: only files and folders are packed (links and special files are refused)"
                )
            out.append((f"{top}/{p.relative_to(folder).as_posix()}", p))
    out.sort(key=lambda e: e[0])
    return out


class _Sink(io.RawIOBase):
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        self.parts.append(bytes(b))
        return len(b)

    def drain(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


def tar_chunks(entries: list[tuple[str, Path]], chunk: int = 1024 * 1024) -> Iterator[bytes]:
    """The reproducible tar of ``entries`` in chunks of at most ``chunk`` bytes."""
    sink = _Sink()
    pending = b""
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tf:  # type: ignore[call-overload]
        for name, path in entries:
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if path.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(info)
            else:
                info.mode = 0o644
                with path.open("rb") as f:
                    info.size = os.fstat(f.fileno()).st_size
                    tf.addfile(info, f)
            pending += sink.drain()
            while len(pending) >= chunk:
                yield pending[:chunk]
                pending = pending[chunk:]
    pending += sink.drain()
    for i in range(0, len(pending), chunk):
        yield pending[i : i + chunk]


def tar_digest(entries: list[tuple[str, Path]]) -> tuple[int, str]:
    """(size, hex SHA-256) of the tar :func:`tar_chunks` makes."""
    h, size = hashlib.sha256(), 0
    for c in tar_chunks(entries):
        h.update(c)
        size += len(c)
    return size, h.hexdigest()
