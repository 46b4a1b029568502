"""Datasets read from the tenant's uploaded archives (IEEE-P3, IEEE-P4): the upload
implementation of the dataset store (``dataset_store.py``), so COCO, VOC, class-folder and
Hugging Face folders -- and WebDataset shards -- reach a shared server through the upload API
as one tar (optionally gzip), never as a server path and never extracted. Domain code.

A plan names ``dataset.store.upload: "sha256:..."`` (for WebDataset, one id or a list: each
upload is one shard). The blob is read through the blob storage's random-access reader
(``BlobStorage.open_reader``: positional reads of the file, or of only the ``bytea`` chunk rows
a read spans in PostgreSQL), so every pod reads the same bytes and nothing is copied.

The index. Once per archive (kept for the few archives read last: the content id names the
bytes, so an index is never stale; tenancy is checked again on every open), the tar headers
are scanned -- member data is skipped, not read -- into ``name -> (offset, size)``. The tar is
not trusted: links, devices, FIFOs, sparse files, absolute names, names with ``..`` or NUL,
names longer than :data:`MAX_NAME_CHARS`, a name twice, more than :data:`MAX_MEMBERS`
members, a header extension (pax, GNU long name) over :data:`MAX_HEADER_BYTES`, a member
reaching past the end of the archive (a lying size, a truncated upload) and an archive that
does not end with its end-of-archive block are each refused, naming the member.

Gzip. A ``.tar.gz`` is inflated once while its headers are scanned; the inflater's state is
kept every :data:`CHECKPOINT_BYTES` of output, so reading a member later inflates at most
that much before it. What inflation may cost is bounded: at most
:data:`MAX_INFLATED_BYTES` of tar, at most :data:`MAX_RATIO`-fold the compressed bytes once
past :data:`RATIO_GRACE_BYTES` (a gzip bomb is refused long before it fills anything), and
at most :data:`MAX_INFLATE_WORK` bytes inflated by one store in all.

Another tenant's blob id reads exactly like a missing one ("no such upload of this tenant").
"""

from __future__ import annotations

import re
import tarfile
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from fortis.infra.storage.blobs import BlobReader, BlobStorage
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.paths import relative_path

__all__ = [
    "CHECKPOINT_BYTES",
    "MAX_HEADER_BYTES",
    "MAX_INFLATED_BYTES",
    "MAX_INFLATE_WORK",
    "MAX_MEMBERS",
    "MAX_NAME_CHARS",
    "MAX_RATIO",
    "ArchiveIndex",
    "ArchiveStore",
    "UploadedShards",
    "open_upload_store",
]

#: Members (headers) of one archive.
MAX_MEMBERS = 200_000
#: Longest member name, characters.
MAX_NAME_CHARS = 512
#: Largest tar header extension (a pax record set, a GNU long name), bytes.
MAX_HEADER_BYTES = 64 * 1024
#: Largest tar a gzip archive may inflate to, bytes.
MAX_INFLATED_BYTES = 16 * 1024**3
#: Most bytes one store inflates in all (re-inflating from a checkpoint counts again).
MAX_INFLATE_WORK = 64 * 1024**3
#: Largest inflation ratio, once :data:`RATIO_GRACE_BYTES` have been inflated.
MAX_RATIO = 200
RATIO_GRACE_BYTES = 64 * 1024 * 1024
#: Inflated bytes between kept inflater states.
CHECKPOINT_BYTES = 16 * 1024 * 1024
#: Archive indexes kept (by content id).
_KEEP_INDEXES = 4
_IN_BLOCK = 64 * 1024
_WINDOW = 4 * 1024 * 1024
_FIELD = "dataset.store.upload"
NOT_FOUND = "not found in the uploaded archive"
_PAST_END = "the member reaches past the end of the archive (a wrong size, or a cut-short upload)"


class _Inflated:
    """Random access to the inflated bytes of a gzip blob (see the module docstring)."""

    def __init__(
        self, reader: BlobReader, field: str, checkpoints: list[tuple[int, int, Any]] | None = None
    ) -> None:
        self._reader, self._field = reader, field
        #: (inflated offset, compressed offset, inflater state there)
        self.checkpoints = checkpoints if checkpoints is not None else []
        self._lock = threading.Lock()
        self.work = 0
        self.truncated = False
        self._restart(0, 0, None)

    def _restart(self, out: int, pos: int, state: Any) -> None:
        self._d = state.copy() if state is not None else zlib.decompressobj(wbits=31)
        self._in, self._out, self._buf, self._eof = pos, out, bytearray(), False
        self._buf_start = out

    def _step(self) -> None:
        # ``_in`` is the compressed offset of the first byte not yet handed to the inflater;
        # an unconsumed tail was handed over already (so a checkpoint is taken only without)
        tail = self._d.unconsumed_tail
        block = tail or self._reader.read_at(self._in, _IN_BLOCK)
        if not block:
            self._eof = True
            self.truncated = not self._d.eof
            return
        try:
            out = self._d.decompress(block, 1024 * 1024)
        except zlib.error:
            raise InvalidArgument(self._field, "the archive's gzip stream is damaged") from None
        if not tail:
            self._in += len(block)
        if self._d.eof:
            self._in -= len(self._d.unused_data)
        self._buf += out
        self._out += len(out)
        self.work += len(out)
        if self._out > MAX_INFLATED_BYTES:
            raise InvalidArgument(
                self._field, f"the archive inflates to more than {MAX_INFLATED_BYTES:,} bytes"
            )
        if self._out > RATIO_GRACE_BYTES and self._out > MAX_RATIO * max(self._in, 1):
            raise InvalidArgument(
                self._field,
                f"the archive inflates more than {MAX_RATIO}-fold "
                "(a gzip bomb?); upload an uncompressed tar",
            )
        if self.work > MAX_INFLATE_WORK:
            raise InvalidArgument(
                self._field,
                "reading the gzip archive in this order costs "
                "too much inflating; upload an uncompressed tar",
            )
        if self._d.eof:
            if self._reader.read_at(self._in, 2) == b"\x1f\x8b":  # another gzip member
                self._d = zlib.decompressobj(wbits=31)
            else:
                self._eof = True
        elif not self._d.unconsumed_tail and (
            not self.checkpoints or self._out >= self.checkpoints[-1][0] + CHECKPOINT_BYTES
        ):
            self.checkpoints.append((self._out, self._in, self._d.copy()))

    def read_at(self, offset: int, n: int) -> bytes:
        with self._lock:
            if offset < self._buf_start:
                cp = max(
                    (c for c in self.checkpoints if c[0] <= offset),
                    key=lambda c: c[0],
                    default=(0, 0, None),
                )
                self._restart(*cp)
            while self._out < offset + n and not self._eof:
                self._step()
                if len(self._buf) > _WINDOW and self._buf_start + _WINDOW < offset:
                    drop = min(len(self._buf) - _WINDOW, offset - self._buf_start)
                    del self._buf[:drop]
                    self._buf_start += drop
            start = offset - self._buf_start
            return bytes(self._buf[start : start + n])

    def length(self) -> int | None:
        """The inflated length when the end has been reached, else None."""
        return self._out if self._eof else None


class _Seq:
    """A seekable file over ``read_at`` for :mod:`tarfile`'s header scan: reads larger than
    :data:`MAX_HEADER_BYTES` (only a header extension is read during the scan) are refused."""

    def __init__(self, read_at: Any, field: str) -> None:
        self._read_at, self._field, self._pos = read_at, field, 0

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > MAX_HEADER_BYTES:
            raise InvalidArgument(
                self._field, f"a tar header extension larger than {MAX_HEADER_BYTES:,} bytes"
            )
        data: bytes = self._read_at(self._pos, n)
        self._pos += len(data)
        return data

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence != 0:
            raise OSError("only absolute seeks")
        self._pos = pos
        return pos

    def tell(self) -> int:
        return self._pos


def _name(m: tarfile.TarInfo, where: str) -> str:
    raw = m.name
    if len(raw) > MAX_NAME_CHARS:
        raise InvalidArgument(where, f"member names of at most {MAX_NAME_CHARS} characters")
    if m.issym() or m.islnk():
        raise InvalidArgument(where, "links are refused in an uploaded archive")
    if m.ischr() or m.isblk() or m.isfifo() or m.isdev():
        raise InvalidArgument(where, "devices and FIFOs are refused in an uploaded archive")
    if m.issparse():
        raise InvalidArgument(where, "sparse members are refused in an uploaded archive")
    if raw.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", raw):
        raise InvalidArgument(where, "absolute member names are refused")
    if "\x00" in raw or ".." in PurePosixPath(raw).parts or "\\" in raw:
        raise InvalidArgument(where, "member names with '..', '\\' or NUL are refused")
    return PurePosixPath(raw).as_posix()


def _printable(name: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in name[:120]) + (
        "..." if len(name) > 120 else ""
    )


@dataclass
class ArchiveIndex:
    """An archive's regular files: name -> (offset of its data, size), in the inflated tar
    for a gzip archive (``gzip``: the inflater checkpoints kept while scanning)."""

    members: dict[str, tuple[int, int]]
    gzip: bool
    checkpoints: list[tuple[int, int, Any]] = field(default_factory=list)

    @classmethod
    def scan(cls, reader: BlobReader, field: str) -> tuple[ArchiveIndex, Any]:
        """Scan the headers; returns the index and the random-access reader of the tar."""
        gz = reader.read_at(0, 2) == b"\x1f\x8b"
        inflated = _Inflated(reader, field) if gz else None
        read_at = inflated.read_at if inflated is not None else reader.read_at
        members: dict[str, tuple[int, int]] = {}
        count, end = 0, 0
        last: tuple[str, int] | None = None
        try:
            tf = tarfile.open(fileobj=_Seq(read_at, field), mode="r:")  # type: ignore[call-overload]
        except (tarfile.TarError, EOFError, OSError, ValueError, RecursionError):
            raise InvalidArgument(field, "not a readable tar archive") from None
        try:
            while True:
                try:
                    m = tf.next()
                # RecursionError: tarfile follows chained header extensions recursively
                except (
                    tarfile.TarError,
                    EOFError,
                    OSError,
                    ValueError,
                    UnicodeError,
                    RecursionError,
                ):
                    if last and last[1] > _length_bound(reader, inflated):
                        raise InvalidArgument(last[0], _PAST_END) from None
                    raise InvalidArgument(
                        field, f"not a readable tar archive (after {count} members)"
                    ) from None
                if m is None:
                    break
                tf.members = []  # the index keeps what is needed; TarInfos are let go
                count += 1
                if count > MAX_MEMBERS:
                    raise InvalidArgument(field, f"more than {MAX_MEMBERS:,} members")
                where = f"{field}:{_printable(m.name)}"
                name = _name(m, where)
                if m.isdir():
                    continue
                if not m.isfile():
                    raise InvalidArgument(where, "only regular files and folders are read")
                if name in members:
                    raise InvalidArgument(where, "the name appears twice in the archive")
                members[name] = (m.offset_data, m.size)
                last = (where, m.offset_data + m.size)
                end = max(end, m.offset_data + m.size)
                if m.offset_data + m.size > _length_bound(reader, inflated):
                    raise InvalidArgument(where, _PAST_END)
            stop = tf.offset
        finally:
            tf.close()
        # a tar ends with a zero block; anything else after the last member is damage
        # (tarfile stops quietly at a bad or cut-short header)
        tail = read_at(stop, tarfile.BLOCKSIZE)
        if last and last[1] > _length_bound(reader, inflated):
            raise InvalidArgument(last[0], _PAST_END)
        if len(tail) < tarfile.BLOCKSIZE or any(tail):
            raise InvalidArgument(
                field,
                f"the archive is cut short or damaged after {count} "
                "members (no end-of-archive block)",
            )
        if inflated is not None and inflated.truncated and inflated.length() is not None:
            raise InvalidArgument(field, "the archive's gzip stream is cut short")
        index = cls(members, gz, inflated.checkpoints if inflated is not None else [])
        return index, read_at


def _length_bound(reader: BlobReader, inflated: _Inflated | None) -> int:
    """What a member may reach: the blob's size for a tar; for gzip, the inflated length
    once known (members are checked again when read)."""
    if inflated is None:
        return reader.size
    n = inflated.length()
    return n if n is not None else MAX_INFLATED_BYTES


class _Member:
    """One member's bytes as a binary stream (sequential reads, as the S3 body)."""

    def __init__(
        self, read_at: Any, offset: int, size: int, where: str, on_close: Any = None
    ) -> None:
        self._read_at, self._off, self._left, self._where = read_at, offset, size, where
        self._on_close = on_close
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        n = self._left if n is None or n < 0 else min(n, self._left)
        if n <= 0:
            return b""
        data: bytes = self._read_at(self._off, n)
        if len(data) < n:
            raise InvalidArgument(self._where, "the member is cut short")
        self._off += n
        self._left -= n
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        if not self.closed and self._on_close is not None:
            self._on_close()
        self.closed = True

    def __enter__(self) -> _Member:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


_indexes: OrderedDict[str, ArchiveIndex] = OrderedDict()
_indexes_lock = threading.Lock()


class ArchiveStore:
    """One uploaded archive as a dataset store: names are member paths inside it."""

    root_name = "uploaded archive"

    def __init__(self, blobs: BlobStorage, tenant: str, blob_id: str, field: str = _FIELD) -> None:
        # the tenancy and kind check, on every open (an index is shared by content only)
        reader = blobs.open_reader(tenant, blob_id, field, kind="archive")
        self._reader = reader
        with _indexes_lock:
            index = _indexes.get(blob_id)
            if index is not None:
                _indexes.move_to_end(blob_id)
        if index is None:
            index, self._read_at = ArchiveIndex.scan(reader, field)
            with _indexes_lock:
                _indexes[blob_id] = index
                while len(_indexes) > _KEEP_INDEXES:
                    _indexes.popitem(last=False)
        elif index.gzip:
            self._read_at = _Inflated(reader, field, index.checkpoints).read_at
        else:
            self._read_at = reader.read_at
        self.index = index

    def locate(self, base: PurePosixPath, raw: object, field: str) -> tuple[str, int, int]:
        rel = relative_path(raw, field, self.root_name)
        name = (base / rel).as_posix()
        hit = self.index.members.get(name)
        if hit is None or ".." in PurePosixPath(name).parts:
            raise InvalidArgument(field, NOT_FOUND)
        return name, hit[0], hit[1]

    def size(self, ref: tuple[str, int, int]) -> int:
        return ref[2]

    def read(self, ref: tuple[str, int, int], limit: int, field: str, what: str) -> bytes:
        if ref[2] > limit:
            raise InvalidArgument(field, f"the {what} is larger than {limit} bytes")
        data: bytes = self._read_at(ref[1], ref[2])
        if len(data) != ref[2]:
            raise InvalidArgument(field, "the member is cut short in the uploaded archive")
        return data

    def open(self, ref: tuple[str, int, int], field: str) -> IO[bytes]:
        return _Member(self._read_at, ref[1], ref[2], field)  # type: ignore[return-value]

    def local_path(self, ref: Any) -> Path | None:
        return None

    def list_files(self, raw: object, field: str, limit: int) -> list[str]:
        folder = relative_path(raw, field, self.root_name).as_posix().rstrip("/") + "/"
        if folder == "./":
            folder = ""
        out = [n[len(folder) :] for n in self.index.members if n.startswith(folder)]
        if not out:
            raise InvalidArgument(field, "no such folder in the uploaded archive")
        if len(out) > limit:
            raise InvalidArgument(field, f"more than {limit} files in the folder")
        return sorted(out)


class UploadedShards:
    """Uploaded WebDataset shards as a dataset store: each name is one of the plan's blob
    ids, checked (tenancy and kind) when located and opened again when streamed, so no more
    than one shard is held open at a time; the WebDataset reader reads each as a tar stream
    (gzip too) with its own bounds."""

    root_name = "uploads"

    def __init__(self, blobs: BlobStorage, tenant: str, ids: tuple[str, ...]) -> None:
        self._blobs, self._tenant, self._ids = blobs, tenant, ids

    def _open(self, blob_id: str) -> BlobReader:
        k = self._ids.index(blob_id)
        where = f"{_FIELD}[{k}]" if len(self._ids) > 1 else _FIELD
        return self._blobs.open_reader(self._tenant, blob_id, where, kind="archive")

    def locate(self, base: PurePosixPath, raw: object, field: str) -> tuple[str, int]:
        if raw not in self._ids:
            raise InvalidArgument(field, NOT_FOUND)
        reader = self._open(str(raw))
        try:
            return str(raw), reader.size
        finally:
            reader.close()

    def size(self, ref: tuple[str, int]) -> int:
        return ref[1]

    def read(self, ref: tuple[str, int], limit: int, field: str, what: str) -> bytes:
        if ref[1] > limit:
            raise InvalidArgument(field, f"the {what} is larger than {limit} bytes")
        with self.open(ref, field) as f:
            return f.read()

    def open(self, ref: tuple[str, int], field: str) -> IO[bytes]:
        reader = self._open(ref[0])
        return _Member(reader.read_at, 0, ref[1], field, reader.close)  # type: ignore[return-value]

    def local_path(self, ref: Any) -> Path | None:
        return None

    def list_files(self, raw: object, field: str, limit: int) -> list[str]:
        raise InvalidArgument(field, "uploaded shards are read by source 'webdataset' only")


def open_upload_store(
    blobs: BlobStorage, tenant: str, source: str, ids: tuple[str, ...]
) -> ArchiveStore | UploadedShards:
    """The store of a plan's ``dataset.store.upload``."""
    if source == "webdataset":
        return UploadedShards(blobs, tenant, ids)
    return ArchiveStore(blobs, tenant, ids[0])
