"""Which blob storage a process opens: the one composition rule shared by
``fortis serve`` (``server/app/stack.py``) and ``fortis worker`` (``server/app/worker.py``), so
the evaluation service, the perturbation service and every worker read the same uploads.

With ``database_url``: ``blobs_pg.PgBlobStore``, the blobs in the shared PostgreSQL (separate
pods and worker Job pods share no disk); without: the file store under the state folder
(``blobs.BlobStore``), exactly as before. Pure code, no gRPC.
"""

from __future__ import annotations

from pathlib import Path

from fortis.infra.storage.blobs import DEFAULT_QUOTA_BYTES, BlobStorage, BlobStore

__all__ = ["open_blobs"]


def open_blobs(state_dir: Path, *, database_url: str | None = None,
               quota_bytes: int = DEFAULT_QUOTA_BYTES, reader: bool = False) -> BlobStorage:
    """The blob storage of a service or worker: with ``database_url`` the blobs
    shared in that PostgreSQL (a local cache of materialised models under
    ``<state_dir>/blob-cache``), else the file store under ``<state_dir>/blobs`` as always.
    ``reader``: a process that only reads another's folder (``fortis worker``), which must
    not sweep the temporary files of uploads in progress there."""
    if database_url:
        from fortis.infra.storage.blobs_pg import PgBlobStore  # SQLAlchemy only when used
        return PgBlobStore(database_url, cache_dir=Path(state_dir) / "blob-cache",
                           quota_bytes=quota_bytes)
    return BlobStore(Path(state_dir) / "blobs", quota_bytes=quota_bytes, sweep=not reader)
