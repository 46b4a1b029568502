"""Uploaded blobs in PostgreSQL (scale-out on Kubernetes: separate pods and worker Job pods
share no disk, so the uploads a plan names must live in the shared database, not in one
pod's state folder).

The same :class:`~.blobs.BlobStorage` surface, limits, messages and tenancy as the file store
(``blobs.BlobStore``, behind the upload API), in SQLAlchemy 2 Core over psycopg 3, on the
schema of the Alembic migrations (``infra/storage/migrations``, 0003; the store refuses a
database that is not at head and names ``fortis db upgrade``):

- ``blobs``: one row per (tenant, hex) with the metadata; ``blob_chunks``: the content in
  rows of at most :data:`~.blobs.MAX_CHUNK_BYTES` of ``bytea`` (seq 0, 1, ...), deleted with
  their blob (``ON DELETE CASCADE``). Ids are ``sha256:<hex>`` of the content, so a plan that
  names blobs pins its data (IEEE-P4).
- **Tenancy**: every lookup is by (tenant, hex); another tenant's id is NOT_FOUND with the
  message an unknown id gets, even when that tenant stores the same bytes (each tenant has
  its own rows).
- **Checks as bytes arrive**: the header (kind, size against the kind's maximum, media type,
  expected digest) at ``begin`` and each chunk as it arrives (size, an image's PNG/JPEG
  header and pixel count, a model's zip signature) are :mod:`~.blobs`'s own code.
- **Nothing partial**: an upload is spooled to an anonymous temporary file of this process
  (unlinked from the start, so a crash leaves nothing on disk) and written to the database
  in one transaction when it finishes; a refused, failed or cancelled upload never touches
  the database.
- **Quota** (RESOURCE_EXHAUSTED + QuotaFailure ``tenant:<name>``): ``begin`` refuses when the
  tenant's stored bytes plus the uploads in progress in this process plus the declared size
  pass it; the commit checks it again against the stored bytes under a per-tenant
  transaction advisory lock, so uploads committing on several replicas at once never pass it
  in total (an upload in progress on another replica counts once it commits).
- **Idempotent, also across processes**: the commit takes the same per-tenant lock and looks
  for the (tenant, hex) row first; two processes uploading the same bytes at once make one
  blob, the second gets it back as ``already_existed``.
- ``path_of`` (a TorchScript model for ``neural_style``) materialises the blob into
  ``<cache_dir>/<tenant dir>/<hex>``: streamed from the chunks, its SHA-256 checked against
  the id, fsynced, then renamed into place; a cached file is re-hashed before its first use
  by this process. The database row is checked on every call, so a deleted or foreign blob is
  never served from the cache.

A database that stops answering is ``Unavailable`` ("upload storage unavailable: ..."). Pure
code: no gRPC, no service imports.
"""

from __future__ import annotations

import builtins
import hashlib
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import sqlalchemy as sa
from fortis.infra.storage import sqldb
from fortis.infra.storage.blobs import (
    BLOB_ID_PREFIX,
    DEFAULT_QUOTA_BYTES,
    MAX_BLOBS_PER_TENANT,
    MAX_CHUNK_BYTES,
    BlobInfo,
    Reservations,
    UploadBase,
    check_blob_id,
    check_header,
    check_room,
    no_such_upload,
    not_found,
    same_kind,
)
from fortis.services.common.errors import Internal, InvalidArgument
from fortis.services.common.paths import tenant_dir_name

__all__ = ["PgBlobStore", "PgUpload", "blob_chunks", "blobs"]

metadata = sa.MetaData()
blobs = sa.Table(
    "blobs", metadata,
    sa.Column("tenant", sa.Text(), nullable=False),
    sa.Column("hex", sa.Text(), nullable=False),
    sa.Column("kind", sa.Text(), nullable=False),
    sa.Column("size", sa.BigInteger(), nullable=False),
    sa.Column("created", sa.Float(), nullable=False),
    sa.Column("media_type", sa.Text(), nullable=False),
    sa.Column("width", sa.Integer(), nullable=False),
    sa.Column("height", sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint("tenant", "hex", name="blobs_pkey"),
)
blob_chunks = sa.Table(
    "blob_chunks", metadata,
    sa.Column("tenant", sa.Text(), nullable=False),
    sa.Column("hex", sa.Text(), nullable=False),
    sa.Column("seq", sa.Integer(), nullable=False),
    sa.Column("data", sa.LargeBinary(), nullable=False),
    sa.PrimaryKeyConstraint("tenant", "hex", "seq", name="blob_chunks_pkey"),
    sa.ForeignKeyConstraint(["tenant", "hex"], ["blobs.tenant", "blobs.hex"],
                            ondelete="CASCADE", name="blob_chunks_blob"),
)

_WHAT = "upload storage"
#: First key of the per-tenant commit lock ("FRBL"); the second is ``hashtext(tenant)``.
BLOB_LOCK = 0x4652424C
#: Chunk rows written per INSERT, and read per SELECT when streaming a blob.
_ROWS_PER_STATEMENT = 8
_INFO = (blobs.c.hex, blobs.c.kind, blobs.c.size, blobs.c.created, blobs.c.media_type,
         blobs.c.width, blobs.c.height)
_PART = ".part"


def _info(r: Any) -> BlobInfo:
    h, kind, size, created, media, w, hh = r
    return BlobInfo(blob_id=BLOB_ID_PREFIX + h, kind=kind, size=int(size),
                    created=float(created), media_type=media, width=int(w), height=int(hh))


def _damaged(blob_id: str) -> Internal:
    return Internal(f"blob {blob_id} is damaged in the upload storage (its content does not "
                    "hash to its id)")


class PgBlobStore:
    """PostgreSQL implementation of :class:`~.blobs.BlobStorage` (see the module doc).
    Thread-safe: a connection pool, each method one transaction."""

    def __init__(self, url: str, *, cache_dir: Path, quota_bytes: int = DEFAULT_QUOTA_BYTES,
                 max_blobs: int = MAX_BLOBS_PER_TENANT, engine: Any = None,
                 spool_dir: Path | None = None) -> None:
        """Connect to ``url`` (InvalidArgument naming ``database_url`` when it is malformed,
        unreachable or not at the schema head). ``cache_dir``: where :meth:`path_of`
        materialises blobs (the state folder's ``blob-cache``); ``spool_dir``: where uploads
        in progress are spooled (default: the system's temporary folder)."""
        if quota_bytes < 0:
            raise ValueError("quota_bytes must be >= 0")
        self.quota_bytes = int(quota_bytes)
        self.max_blobs = int(max_blobs)
        self._own_engine = engine is None
        self._engine = engine if engine is not None else sqldb.create_engine(url, pool_size=4)
        try:
            sqldb.require_head(self._engine)
        except BaseException:
            self.close()
            raise
        self.cache_dir = Path(cache_dir)
        self.spool_dir = Path(spool_dir) if spool_dir is not None else None
        self._reserved = Reservations()
        self._materialise = threading.Lock()
        #: cached files hashed by this process: (path, size, mtime_ns)
        self._verified: set[tuple[str, int, int]] = set()
        self._sweep_cache()

    def close(self) -> None:
        if self._own_engine:
            self._engine.dispose()

    def _run(self, fn: Any) -> Any:
        """``fn(conn)`` in one transaction; a lost database is Unavailable."""
        with sqldb.unavailable_on_loss(_WHAT), self._engine.begin() as conn:
            return fn(conn)

    @staticmethod
    def _key(tenant: str, hexd: str) -> Any:
        return sa.and_(blobs.c.tenant == tenant, blobs.c.hex == hexd)

    # -- reading ---------------------------------------------------------------------------

    def _row(self, tenant: str, hexd: str) -> BlobInfo | None:
        r = self._run(lambda c: c.execute(sa.select(*_INFO).where(self._key(tenant, hexd)))
                      .first())
        return _info(r) if r is not None else None

    def get(self, tenant: str, blob_id: str, field: str = "blob_id") -> BlobInfo:
        """The metadata of ``tenant``'s blob; NotFound for an unknown or foreign id."""
        info = self._row(tenant, check_blob_id(blob_id, field))
        if info is None:
            raise not_found(blob_id)
        return info

    def _readable(self, tenant: str, blob_id: str, field: str, kind: str) -> BlobInfo:
        info = self._row(tenant, check_blob_id(blob_id, field))
        if info is None:
            raise no_such_upload(field)
        if kind and info.kind != kind:
            raise InvalidArgument(field, f"the upload is a {info.kind}, a {kind} is needed")
        return info

    def _chunks(self, tenant: str, hexd: str) -> Iterator[bytes]:
        """The blob's content, chunk by chunk, a few rows per query (never the whole of a
        256 MiB model in memory)."""
        seq = 0
        while True:
            rows = self._run(lambda c, s=seq: c.execute(
                sa.select(blob_chunks.c.seq, blob_chunks.c.data)
                .where(blob_chunks.c.tenant == tenant, blob_chunks.c.hex == hexd,
                       blob_chunks.c.seq >= s)
                .order_by(blob_chunks.c.seq).limit(_ROWS_PER_STATEMENT)).all())
            for n, data in rows:
                if n != seq:
                    return          # a gap: the hash check that follows fails
                seq += 1
                yield bytes(data)
            if len(rows) < _ROWS_PER_STATEMENT:
                return

    def read(self, tenant: str, blob_id: str, field: str, *, kind: str) -> bytes:
        """The content of ``tenant``'s blob of ``kind``: InvalidArgument on ``field`` when it
        is malformed, unknown, foreign (same message) or not of ``kind``; checked against its
        id."""
        info = self._readable(tenant, blob_id, field, kind)
        hexd = info.blob_id[len(BLOB_ID_PREFIX):]
        data = b"".join(self._chunks(tenant, hexd))
        if len(data) != info.size or hashlib.sha256(data).hexdigest() != hexd:
            if self._row(tenant, hexd) is None:     # deleted while it was read
                raise no_such_upload(field)
            raise _damaged(blob_id)
        return data

    def open_reader(self, tenant: str, blob_id: str, field: str, *, kind: str) -> PgReader:
        """Random access to ``tenant``'s blob of ``kind`` (errors as :meth:`read`'s): each
        read selects only the chunk rows it spans (the content is never materialised)."""
        info = self._readable(tenant, blob_id, field, kind)
        return PgReader(self, tenant, info.blob_id[len(BLOB_ID_PREFIX):], info.size)

    def path_of(self, tenant: str, blob_id: str, field: str, *, kind: str = "") -> Path:
        """A local file holding ``tenant``'s blob (see the module doc: materialised into the
        cache, checked by SHA-256); errors as :meth:`read`'s."""
        info = self._readable(tenant, blob_id, field, kind)
        hexd = info.blob_id[len(BLOB_ID_PREFIX):]
        folder = self._cache_folder(tenant)
        path = folder / hexd
        if self._cached(path, hexd, info.size):
            return path
        with self._materialise:
            if self._cached(path, hexd, info.size):
                return path
            folder.mkdir(parents=True, exist_ok=True)
            temp = folder / f".{uuid.uuid4().hex}{_PART}"
            try:
                digest, size = hashlib.sha256(), 0
                with temp.open("xb") as f:
                    for chunk in self._chunks(tenant, hexd):
                        digest.update(chunk)
                        size += len(chunk)
                        f.write(chunk)
                    f.flush()
                    os.fsync(f.fileno())
                if size != info.size or digest.hexdigest() != hexd:
                    if self._row(tenant, hexd) is None:
                        raise no_such_upload(field)
                    raise _damaged(blob_id)
                os.replace(temp, path)
            finally:
                temp.unlink(missing_ok=True)
            st = path.stat()
            self._verified.add((str(path), st.st_size, st.st_mtime_ns))
        return path

    def _cache_folder(self, tenant: str) -> Path:
        top = self.cache_dir.resolve()
        d = (top / tenant_dir_name(tenant)).resolve()
        if d.parent != top:
            raise RuntimeError("blob cache folder outside the cache root")
        return d

    def _cached(self, path: Path, hexd: str, size: int) -> bool:
        """Whether ``path`` holds the blob: hashed once by this process, then trusted while
        its size and modification time stay the same."""
        try:
            st = path.stat()
        except OSError:
            return False
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key in self._verified:
            return True
        if st.st_size != size:
            return False
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(MAX_CHUNK_BYTES), b""):
                digest.update(block)
        if digest.hexdigest() != hexd:
            return False
        self._verified.add(key)
        return True

    def _sweep_cache(self) -> None:
        """Remove what a crash left in the cache: temporary files of unfinished writes."""
        if not self.cache_dir.is_dir():
            return
        for f in self.cache_dir.glob(f"*/*{_PART}"):
            f.unlink(missing_ok=True)

    def usage(self, tenant: str) -> tuple[int, int]:
        """(bytes, blobs) ``tenant`` stores now."""
        r = self._run(lambda c: c.execute(
            sa.select(sa.func.coalesce(sa.func.sum(blobs.c.size), 0), sa.func.count())
            .where(blobs.c.tenant == tenant)).one())
        return int(r[0]), int(r[1])

    def list(self, tenant: str, *, kind: str = "", limit: int = 100,
             after: tuple[float, str] | None = None) -> builtins.list[BlobInfo]:
        """Up to ``limit`` of the tenant's blobs, newest first (then by id), starting after the
        (created, hex) position ``after``."""
        q = sa.select(*_INFO).where(blobs.c.tenant == tenant)
        if kind:
            q = q.where(blobs.c.kind == kind)
        if after is not None:
            q = q.where(sa.or_(blobs.c.created < after[0], sa.and_(
                blobs.c.created == after[0], blobs.c.hex > after[1])))
        q = q.order_by(blobs.c.created.desc(), blobs.c.hex).limit(int(limit))
        return [_info(r) for r in self._run(lambda c: c.execute(q).all())]

    # -- writing ---------------------------------------------------------------------------

    def delete(self, tenant: str, blob_id: str, field: str = "blob_id") -> BlobInfo:
        """Remove ``tenant``'s blob (its chunks go with it); NotFound for an unknown or
        foreign id."""
        hexd = check_blob_id(blob_id, field)
        r = self._run(lambda c: c.execute(blobs.delete().where(self._key(tenant, hexd))
                                          .returning(*_INFO)).first())
        if r is None:
            raise not_found(blob_id)
        (self._cache_folder(tenant) / hexd).unlink(missing_ok=True)
        return _info(r)

    def begin(self, tenant: str, *, kind: str, size: int, media_type: str = "",
              expected_sha256: str = "") -> PgUpload:
        """Start an upload after checking its header and the tenant's room (see
        ``BlobStore.begin``: the same fields, limits and messages)."""
        expected = check_header(kind=kind, size=size, media_type=media_type,
                                expected_sha256=expected_sha256)
        used, count = self.usage(tenant)
        with self._reserved.lock:
            check_room(tenant, used=used, count=count, held=self._reserved.held(tenant),
                       size=size, quota=self.quota_bytes, max_blobs=self.max_blobs)
            self._reserved.add(tenant, size)
        try:
            return PgUpload(self, tenant, kind=kind, size=size, media_type=media_type,
                            expected_hex=expected)
        except BaseException:
            self._reserved.release(tenant, size)
            raise

    def _release(self, tenant: str, size: int) -> None:
        self._reserved.release(tenant, size)

    def _commit(self, up: PgUpload, hexd: str) -> tuple[BlobInfo, bool]:
        """Write a finished upload in one transaction under the tenant's commit lock: the
        existing blob when the tenant already holds these bytes (same kind), else the quota
        checked against what is stored now, the row and its chunks."""
        def run(c: Any) -> tuple[BlobInfo, bool]:
            c.execute(sa.text("SELECT pg_advisory_xact_lock(CAST(:k AS integer), hashtext(:t))"),
                      {"k": BLOB_LOCK, "t": up.tenant})
            r = c.execute(sa.select(*_INFO).where(self._key(up.tenant, hexd))).first()
            if r is not None:
                return same_kind(_info(r), up.kind), True
            used, count = c.execute(
                sa.select(sa.func.coalesce(sa.func.sum(blobs.c.size), 0), sa.func.count())
                .where(blobs.c.tenant == up.tenant)).one()
            check_room(up.tenant, used=int(used), count=int(count), held=0,
                       size=up.size, quota=self.quota_bytes, max_blobs=self.max_blobs)
            info = up.checks.info(hexd, time.time())
            c.execute(blobs.insert().values(
                tenant=up.tenant, hex=hexd, kind=info.kind, size=info.size,
                created=info.created, media_type=info.media_type, width=info.width,
                height=info.height))
            up.spool.seek(0)
            seq, batch = 0, []
            for block in iter(lambda: up.spool.read(MAX_CHUNK_BYTES), b""):
                batch.append({"tenant": up.tenant, "hex": hexd, "seq": seq, "data": block})
                seq += 1
                if len(batch) == _ROWS_PER_STATEMENT:
                    c.execute(blob_chunks.insert(), batch)
                    batch = []
            if batch:
                c.execute(blob_chunks.insert(), batch)
            return info, False
        result: tuple[BlobInfo, bool] = self._run(run)
        return result


class PgReader:
    """A :class:`~.blobs.BlobReader` over a blob's chunk rows: a read of ``n`` bytes at
    ``offset`` selects the rows ``offset // chunk`` .. ``(offset + n - 1) // chunk`` (every row
    but the last holds exactly :data:`~.blobs.MAX_CHUNK_BYTES`, as the commit writes them);
    the last few rows read are kept, since an archive's small members share rows."""

    _KEEP = 4

    def __init__(self, store: PgBlobStore, tenant: str, hexd: str, size: int) -> None:
        self._store, self._tenant, self._hex, self.size = store, tenant, hexd, size
        self._rows: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def _fetch(self, first: int, last: int) -> dict[int, bytes]:
        got = self._store._run(lambda c: c.execute(
            sa.select(blob_chunks.c.seq, blob_chunks.c.data)
            .where(blob_chunks.c.tenant == self._tenant, blob_chunks.c.hex == self._hex,
                   blob_chunks.c.seq >= first, blob_chunks.c.seq <= last)
            .order_by(blob_chunks.c.seq)).all())
        return {int(n): bytes(d) for n, d in got}

    def read_at(self, offset: int, n: int) -> bytes:
        if offset < 0 or n < 0:
            raise ValueError("negative offset or length")
        n = min(n, self.size - offset)
        if n <= 0:
            return b""
        first, last = offset // MAX_CHUNK_BYTES, (offset + n - 1) // MAX_CHUNK_BYTES
        with self._lock:
            rows = {k: self._rows[k] for k in range(first, last + 1) if k in self._rows}
            missing = [k for k in range(first, last + 1) if k not in rows]
            if missing:
                rows.update(self._fetch(missing[0], missing[-1]))
            for k in range(max(first, last - self._KEEP + 1), last + 1):
                if k in rows:
                    self._rows[k] = rows[k]
            while len(self._rows) > self._KEEP:
                self._rows.pop(min(self._rows))
        parts = []
        for k in range(first, last + 1):
            row = rows.get(k)
            if row is None:     # deleted while read, or damaged: the caller sees a short read
                break
            parts.append(row)
        data = b"".join(parts)
        start = offset - first * MAX_CHUNK_BYTES
        return data[start:start + n]

    def close(self) -> None:
        with self._lock:
            self._rows.clear()


class PgUpload(UploadBase):
    """One upload in progress into a :class:`PgBlobStore`: chunks checked as they arrive and
    spooled to an anonymous temporary file; written to the database by :meth:`finish` (one
    transaction); :meth:`abort` (or any refusal) keeps nothing (the database was never
    written)."""

    def __init__(self, store: PgBlobStore, tenant: str, *, kind: str, size: int,
                 media_type: str, expected_hex: str) -> None:
        super().__init__(store, tenant, kind=kind, size=size, media_type=media_type,
                         expected_hex=expected_hex)
        if store.spool_dir is not None:
            store.spool_dir.mkdir(parents=True, exist_ok=True)
        self._sink = tempfile.TemporaryFile(  # noqa: SIM115 - closed by abort/finish
            dir=store.spool_dir, prefix="fortis-upload-")

    @property
    def spool(self) -> IO[bytes]:
        return self._sink

    def _release(self) -> None:
        self._discard()             # the spool goes once the database has the bytes
        super()._release()
