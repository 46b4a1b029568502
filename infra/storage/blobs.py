"""Content-addressed blobs stored per tenant: the storage behind ``UploadService`` (no plan
reads the server's disk: images and tenant models come in through the API, with
size and pixel limits checked from the header before decoding, referenced from plans by id).

Pure code (no gRPC), shared: the evaluation service stores and reads uploads (its servicer in
``services/evaluation/uploads.py``, its datasets for ``dataset: {source: uploads}``, and dataset
archives read in place through :meth:`BlobStore.open_reader` for ``dataset.store.upload``), and the
perturbation service reads a tenant's ``neural_style`` model (IEEE-A6) through
:meth:`BlobStore.path_of`.

Layout: ``<root>/<tenant dir>/<sha256 hex>`` (the tenant folder named by
:func:`~fortis.services.common.paths.tenant_dir_name`, as artifacts are), and an index
``<root>/blobs.sqlite`` (tenant, id, kind, size, created, media type, image width/height).
The id is ``sha256:<hex>`` of the content, so uploading the same bytes twice is idempotent
and a plan naming blobs pins its data exactly (IEEE-P4: the report lets anyone repeat it).

Tenancy: every lookup is by (tenant, id); another tenant's id is NOT_FOUND with the same
message as an unknown one, even when the same bytes exist for that other tenant.

Bounded work: per-kind maximum sizes (:data:`MAX_BLOB_BYTES`), chunks of at most
:data:`MAX_CHUNK_BYTES`, a per-tenant storage quota (RESOURCE_EXHAUSTED with a QuotaFailure),
a per-tenant blob count, and for images the PNG/JPEG header's format and pixel count checked
as soon as the header has arrived (``codec.check_image_header``), before the rest is received
and without ever decoding. An upload writes a temporary file in the tenant folder, fsyncs and
renames it; a failed or cancelled upload removes it, and leftovers of a crash are swept when
the store opens.

Scale-out on Kubernetes: :class:`BlobStorage` is what the callers
use (the upload servicer, the plan datasets, the perturbation service's model resolver,
``fortis worker``); :class:`BlobStore` (files + SQLite, the embedded default) and
``blobs_pg.PgBlobStore`` (content in chunks of ``bytea`` rows in the shared PostgreSQL, so
separate pods and worker Job pods read the same uploads) implement it with the same checks,
which live once in ``blob_checks.py`` (re-exported here): :func:`check_header` (the header
of an upload) and :class:`UploadChecks` (each chunk as it arrives, the whole at the end);
``blob_backends.open_blobs`` picks one from the settings.
"""

from __future__ import annotations

import builtins
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from fortis.infra.storage import sqlite_schema
from fortis.services.common.blob_checks import (
    BLOB_ID_PREFIX,
    DEFAULT_QUOTA_BYTES,
    KINDS,
    MAX_BLOB_BYTES,
    MAX_BLOBS_PER_TENANT,
    MAX_CHUNK_BYTES,
    MAX_IMAGE_HEADER_BYTES,
    BlobInfo,
    BlobReader,
    BlobStorage,
    BlobUpload,
    Reservations,
    UploadChecks,
    check_blob_id,
    check_header,
    check_room,
    is_blob_id,
    no_such_upload,
    not_found,
    quota_violation,
    same_kind,
)
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.paths import tenant_dir_name

__all__ = ["BLOB_ID_PREFIX", "DEFAULT_QUOTA_BYTES", "INDEX_SCHEMA", "KINDS",
           "MAX_BLOBS_PER_TENANT", "MAX_BLOB_BYTES", "MAX_CHUNK_BYTES", "MAX_IMAGE_HEADER_BYTES",
           "BlobInfo", "BlobReader", "BlobStorage", "BlobStore", "BlobUpload", "FileReader",
           "Reservations", "Upload",
           "UploadBase", "UploadChecks", "check_blob_id", "check_header", "check_room",
           "is_blob_id", "iter_chunks", "no_such_upload", "not_found", "quota_violation",
           "same_kind"]

#: Suffix of an upload's temporary file (removed on failure, swept when the store opens).
_PART = ".part"


#: The index's versioned schema (``infra/storage/sqlite_schema.py``): version 1 is what
#: Fortis 0.2.0 wrote, unchanged since uploads exist.
INDEX_SCHEMA = sqlite_schema.Schema(
    kind="blob index",
    application_id=sqlite_schema.BLOB_INDEX_ID,
    baseline=[
        "CREATE TABLE IF NOT EXISTS blobs (tenant TEXT NOT NULL, hex TEXT NOT NULL, "
        "kind TEXT NOT NULL, size INTEGER NOT NULL, created REAL NOT NULL, "
        "media_type TEXT NOT NULL, width INTEGER NOT NULL, height INTEGER NOT NULL, "
        "PRIMARY KEY (tenant, hex))",
        "CREATE INDEX IF NOT EXISTS blobs_by_time ON blobs (tenant, created DESC, hex)",
    ],
)


class BlobStore:
    """The blobs of every tenant under ``root``; thread-safe."""

    def __init__(self, root: Path, *, quota_bytes: int = DEFAULT_QUOTA_BYTES,
                 max_blobs: int = MAX_BLOBS_PER_TENANT, sweep: bool = True) -> None:
        """``sweep``: remove what a crash left (see :meth:`_sweep`); False for a reader
        opening the folder of a service that may be uploading now (``fortis worker``)."""
        if quota_bytes < 0:
            raise ValueError("quota_bytes must be >= 0")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.quota_bytes = int(quota_bytes)
        self.max_blobs = int(max_blobs)
        self._lock = threading.Lock()
        self._reserved = Reservations()      # tenant -> bytes of uploads in progress
        # a reader (sweep=False) never changes another process's index: an older one is
        # refused naming `fortis db upgrade --state-dir DIR`, not migrated under its owner
        self._db = sqlite_schema.open_db(self.root / "blobs.sqlite", INDEX_SCHEMA,
                                         migrate=sweep)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        if sweep:
            self._sweep()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- folders ---------------------------------------------------------------------------

    def tenant_dir(self, tenant: str) -> Path:
        """The tenant's folder, checked to lie directly inside the root."""
        top = self.root.resolve()
        d = (top / tenant_dir_name(tenant)).resolve()
        if d.parent != top:
            raise RuntimeError("blob folder outside the blob root")
        return d

    def _sweep(self) -> None:
        """Remove what a crash left: temporary upload files, and files without an index row
        (renamed but not yet recorded); index rows whose file is gone are dropped."""
        with self._lock:
            rows = {(t, h) for t, h in self._db.execute("SELECT tenant, hex FROM blobs")}
            dirs = {tenant_dir_name(t): t for t, _ in rows}
            for sub in self.root.iterdir():
                if not sub.is_dir():
                    continue
                tenant = dirs.get(sub.name)
                for f in sub.iterdir():
                    if f.name.endswith(_PART) or tenant is None or (tenant, f.name) not in rows:
                        f.unlink(missing_ok=True)
            for t, h in rows:
                if not (self.root / tenant_dir_name(t) / h).is_file():
                    self._db.execute("DELETE FROM blobs WHERE tenant = ? AND hex = ?", (t, h))

    # -- reading ---------------------------------------------------------------------------

    @staticmethod
    def _info(row: tuple[str, str, int, float, str, int, int]) -> BlobInfo:
        h, kind, size, created, media, w, hh = row
        return BlobInfo(blob_id=BLOB_ID_PREFIX + h, kind=kind, size=size, created=created,
                        media_type=media, width=w, height=hh)

    def _row(self, tenant: str, hexd: str) -> BlobInfo | None:
        with self._lock:
            row = self._db.execute(
                "SELECT hex, kind, size, created, media_type, width, height FROM blobs "
                "WHERE tenant = ? AND hex = ?", (tenant, hexd)).fetchone()
        return self._info(row) if row else None

    def get(self, tenant: str, blob_id: str, field: str = "blob_id") -> BlobInfo:
        """The metadata of ``tenant``'s blob; NotFound for an unknown or foreign id."""
        info = self._row(tenant, check_blob_id(blob_id, field))
        if info is None:
            raise not_found(blob_id)
        return info

    def path_of(self, tenant: str, blob_id: str, field: str, *, kind: str = "") -> Path:
        """The file of ``tenant``'s blob for a reader naming it in a request or plan field:
        InvalidArgument on ``field`` when it is malformed, unknown, foreign (same message) or
        not of ``kind``."""
        hexd = check_blob_id(blob_id, field)
        info = self._row(tenant, hexd)
        if info is None:
            raise no_such_upload(field)
        if kind and info.kind != kind:
            raise InvalidArgument(field, f"the upload is a {info.kind}, a {kind} is needed")
        return self.tenant_dir(tenant) / hexd

    def read(self, tenant: str, blob_id: str, field: str, *, kind: str) -> bytes:
        """The content of ``tenant``'s blob of ``kind`` (see :meth:`path_of`)."""
        path = self.path_of(tenant, blob_id, field, kind=kind)
        try:
            return path.read_bytes()
        except OSError:
            raise no_such_upload(field) from None

    def open_reader(self, tenant: str, blob_id: str, field: str, *, kind: str) -> FileReader:
        """Random access to ``tenant``'s blob of ``kind`` (errors as :meth:`path_of`'s): the
        file stays open, so a blob deleted while an evaluation reads it reads to the end."""
        path = self.path_of(tenant, blob_id, field, kind=kind)
        try:
            return FileReader(path)
        except OSError:
            raise no_such_upload(field) from None

    def usage(self, tenant: str) -> tuple[int, int]:
        """(bytes, blobs) ``tenant`` stores now."""
        with self._lock:
            size, count = self._db.execute(
                "SELECT COALESCE(SUM(size), 0), COUNT(*) FROM blobs WHERE tenant = ?",
                (tenant,)).fetchone()
        return int(size), int(count)

    def list(self, tenant: str, *, kind: str = "", limit: int = 100,
             after: tuple[float, str] | None = None) -> builtins.list[BlobInfo]:
        """Up to ``limit`` of the tenant's blobs, newest first (then by id), starting after the
        (created, hex) position ``after``."""
        sql = ("SELECT hex, kind, size, created, media_type, width, height FROM blobs "
               "WHERE tenant = ?")
        args: builtins.list[object] = [tenant]
        if kind:
            sql += " AND kind = ?"
            args.append(kind)
        if after is not None:
            sql += " AND (created < ? OR (created = ? AND hex > ?))"
            args += [after[0], after[0], after[1]]
        sql += " ORDER BY created DESC, hex LIMIT ?"
        args.append(int(limit))
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [self._info(r) for r in rows]

    # -- writing ---------------------------------------------------------------------------

    def delete(self, tenant: str, blob_id: str, field: str = "blob_id") -> BlobInfo:
        """Remove ``tenant``'s blob; NotFound for an unknown or foreign id."""
        hexd = check_blob_id(blob_id, field)
        with self._lock:
            row = self._db.execute(
                "SELECT hex, kind, size, created, media_type, width, height FROM blobs "
                "WHERE tenant = ? AND hex = ?", (tenant, hexd)).fetchone()
            if row is None:
                raise not_found(blob_id)
            self._db.execute("DELETE FROM blobs WHERE tenant = ? AND hex = ?", (tenant, hexd))
            (self.tenant_dir(tenant) / hexd).unlink(missing_ok=True)
        return self._info(row)

    def begin(self, tenant: str, *, kind: str, size: int, media_type: str = "",
              expected_sha256: str = "") -> Upload:
        """Start an upload after checking its header: the kind, the declared size against the
        kind's maximum and the tenant's quota (the declared size is reserved until the upload
        ends), the media type and expected digest. Fields are named ``header.<field>``."""
        expected = check_header(kind=kind, size=size, media_type=media_type,
                                expected_sha256=expected_sha256)
        d = self.tenant_dir(tenant)
        with self._lock, self._reserved.lock:
            used, count = self._db.execute(
                "SELECT COALESCE(SUM(size), 0), COUNT(*) FROM blobs WHERE tenant = ?",
                (tenant,)).fetchone()
            check_room(tenant, used=used, count=count, held=self._reserved.held(tenant),
                       size=size, quota=self.quota_bytes, max_blobs=self.max_blobs)
            self._reserved.add(tenant, size)
        try:
            d.mkdir(parents=True, exist_ok=True)
            return Upload(self, tenant, d, kind=kind, size=size, media_type=media_type,
                          expected_hex=expected)
        except BaseException:
            self._release(tenant, size)
            raise

    def _release(self, tenant: str, size: int) -> None:
        self._reserved.release(tenant, size)

    def _commit(self, up: Upload, hexd: str) -> tuple[BlobInfo, bool]:
        """Record a finished upload (its temp file renamed to the blob's name) or, when the
        tenant already holds these bytes, keep the existing blob and drop the temp file.
        One ``BEGIN IMMEDIATE`` transaction: another process committing into the same folder
        waits, so the same bytes uploaded twice at once make one blob, and the quota is
        checked again against what is stored now (the same semantics as
        PostgreSQL's)."""
        final = up.folder / hexd
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT hex, kind, size, created, media_type, width, height FROM blobs "
                    "WHERE tenant = ? AND hex = ?", (up.tenant, hexd)).fetchone()
                if row is None:
                    used, count = self._db.execute(
                        "SELECT COALESCE(SUM(size), 0), COUNT(*) FROM blobs WHERE tenant = ?",
                        (up.tenant,)).fetchone()
                    check_room(up.tenant, used=used, count=count, held=0, size=up.size,
                               quota=self.quota_bytes, max_blobs=self.max_blobs)
                    os.replace(up.temp, final)
                    _fsync_dir(up.folder)
                    info = up.checks.info(hexd, time.time())
                    self._db.execute("INSERT INTO blobs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                     (up.tenant, hexd, info.kind, info.size, info.created,
                                      info.media_type, info.width, info.height))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        if row is not None:
            up.discard()
            return same_kind(self._info(row), up.kind), True
        return info, False


class FileReader:
    """A :class:`BlobReader` over a blob's file (positional reads, thread-safe)."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self._fd).st_size

    def read_at(self, offset: int, n: int) -> bytes:
        if offset < 0 or n < 0:
            raise ValueError("negative offset or length")
        return os.pread(self._fd, n, offset) if n and offset < self.size else b""

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class UploadBase:
    """What an upload in progress does in either store: chunks checked as they arrive
    (:class:`UploadChecks`) and appended to ``self._sink``; :meth:`finish` checks the whole
    and commits it through the store (``store._commit(upload, hexd)``); :meth:`abort` (or any
    refusal) keeps nothing and gives the held quota back once. Subclasses say where the bytes
    go (``_sink``), what must happen before the commit (:meth:`_before_commit`) and how to
    throw the bytes away (:meth:`_discard`)."""

    def __init__(self, store: Any, tenant: str, *, kind: str, size: int, media_type: str,
                 expected_hex: str) -> None:
        self.store, self.tenant, self.kind, self.size = store, tenant, kind, size
        self.checks = UploadChecks(kind=kind, size=size, media_type=media_type,
                                   expected_hex=expected_hex)
        self._held = size               # quota reserved by the store's begin, released once
        self._done = False
        self._sink: IO[bytes]

    @property
    def received(self) -> int:
        return self.checks.received

    def write(self, chunk: bytes) -> None:
        """Append one chunk; refuses (and aborts) a chunk over 1 MiB, content past the
        declared size, and an image whose header is not PNG/JPEG or declares too many pixels."""
        try:
            if self._done:
                raise InvalidArgument("chunk", "the upload has already ended")
            self.checks.accept(chunk)
            self._sink.write(chunk)
        except BaseException:
            self.abort()
            raise

    def finish(self) -> tuple[BlobInfo, bool]:
        """Check the whole (size, header, digest) and commit it: (the blob, whether the tenant
        already had these bytes)."""
        try:
            hexd = self.checks.digest()
            self._before_commit()
            result = self.store._commit(self, hexd)
            self._done = True
            return result
        except BaseException:
            self.abort()
            raise
        finally:
            self._release()

    def _before_commit(self) -> None:
        return None

    def _discard(self) -> None:
        if not self._sink.closed:
            self._sink.close()

    def abort(self) -> None:
        """Give up: nothing of this upload is kept."""
        if self._done:
            return
        self._done = True
        self._discard()
        self._release()

    def _release(self) -> None:
        held, self._held = self._held, 0
        if held:
            self.store._release(self.tenant, held)

    def __enter__(self) -> UploadBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()


class Upload(UploadBase):
    """One upload in progress into a :class:`BlobStore`: a temporary file in the tenant's
    folder, fsynced and renamed into place by the commit."""

    def __init__(self, store: BlobStore, tenant: str, folder: Path, *, kind: str, size: int,
                 media_type: str, expected_hex: str) -> None:
        super().__init__(store, tenant, kind=kind, size=size, media_type=media_type,
                         expected_hex=expected_hex)
        self.folder = folder
        self.temp = folder / f".{uuid.uuid4().hex}{_PART}"
        self._sink = self.temp.open("xb")

    def _before_commit(self) -> None:
        self._sink.flush()
        os.fsync(self._sink.fileno())
        self._sink.close()

    def discard(self) -> None:
        """Remove the temporary file."""
        self._discard()

    def _discard(self) -> None:
        super()._discard()
        self.temp.unlink(missing_ok=True)


def iter_chunks(data: bytes, size: int = MAX_CHUNK_BYTES) -> Iterator[bytes]:
    """``data`` in chunks of at most ``size`` bytes (for callers uploading from memory)."""
    for i in range(0, len(data), size):
        yield data[i:i + size]


