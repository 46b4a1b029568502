"""Uploaded blobs on both back ends, the same assertions (pods share no disk, so with
``database_url`` the uploads live in PostgreSQL; the upload rules hold on either:
content-addressed ids, tenant isolation, per-kind size limits, the per-tenant quota, header
checks as bytes arrive, nothing partial kept, idempotent re-uploads; SPEC IEEE-P4: a plan names
exactly the data evaluated).

Real back ends only: the file store (``BlobStore``: files + SQLite index in the test's temp
dir) and ``PgBlobStore`` on a real PostgreSQL (``tests/infra/postgres.py``, a fresh database
per test, migrated to head). Two *processes* upload the same bytes at once, and two stores
("replicas") commit past the quota at once.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from fortis.infra.storage import sqldb
from fortis.infra.storage.blob_backends import open_blobs
from fortis.infra.storage.blobs import MAX_BLOB_BYTES, BlobStorage, BlobStore, iter_chunks
from fortis.services.common.codec import encode_png
from fortis.services.common.errors import InvalidArgument, NotFound, QuotaExceeded

from tests.storage.conftest import Backend, migrate

MiB = 1024 * 1024


def open_store(backend: Backend, **kw: Any) -> Any:
    """The blob storage of ``backend``: what ``fortis serve`` opens with its settings."""
    if backend.kind == "sqlite":
        return BlobStore(backend.dir / "blobs", **kw)
    from fortis.infra.storage.blobs_pg import PgBlobStore
    return PgBlobStore(backend.url, cache_dir=backend.dir / "blob-cache", **kw)


@pytest.fixture()
def store(backend: Backend) -> Any:
    s = open_store(backend)
    yield s
    s.close()


def leftovers(backend: Backend) -> dict[str, int]:
    """What is stored besides the index: content files (SQLite) or blob and chunk rows."""
    if backend.kind == "sqlite":
        root = backend.dir / "blobs"
        files = [p for p in root.rglob("*") if p.is_file() and not p.name.startswith("blobs.sqlite")]
        return {"files": len(files)}
    engine = sqldb.create_engine(backend.url)
    try:
        with engine.connect() as c:
            return {"blobs": int(c.execute(sa.text("SELECT COUNT(*) FROM blobs")).scalar_one()),
                    "chunks": int(c.execute(sa.text("SELECT COUNT(*) FROM blob_chunks"))
                                  .scalar_one())}
    finally:
        engine.dispose()


def nothing(backend: Backend) -> dict[str, int]:
    return {"files": 0} if backend.kind == "sqlite" else {"blobs": 0, "chunks": 0}


def put(store: Any, tenant: str, kind: str, data: bytes, chunk: int = MiB) -> Any:
    up = store.begin(tenant, kind=kind, size=len(data))
    for c in iter_chunks(data, chunk):
        up.write(c)
    return up.finish()


def png_header(width: int, height: int) -> bytes:
    """The first bytes of a PNG declaring ``width`` x ``height`` (8-bit grey)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk + \
        struct.pack(">I", zlib.crc32(chunk))


def test_both_back_ends_have_the_protocols_methods(store: Any) -> None:
    wanted = [n for n in dir(BlobStorage) if not n.startswith("_")]
    assert {"begin", "read", "path_of", "delete", "usage", "list"} <= set(wanted)
    assert [n for n in wanted if not hasattr(store, n)] == []


def test_content_addressed_idempotent_and_readable(store: Any, backend: Backend) -> None:
    img = encode_png(np.arange(64, dtype=np.uint8).reshape(8, 8))
    info, existed = put(store, "a", "image", img, chunk=7)       # header split over chunks
    assert info.blob_id == "sha256:" + hashlib.sha256(img).hexdigest() and not existed
    assert (info.kind, info.size, info.width, info.height, info.media_type) == \
        ("image", len(img), 8, 8, "image/png")
    again, existed = put(store, "a", "image", img)
    assert existed and again == info
    assert store.get("a", info.blob_id) == info
    assert store.read("a", info.blob_id, "f", kind="image") == img
    with pytest.raises(InvalidArgument) as e:               # the same bytes as another kind
        put(store, "a", "manifest", img)
    assert e.value.violations[0].field == "header.kind"
    with pytest.raises(InvalidArgument) as e:               # read as the wrong kind
        store.read("a", info.blob_id, "dataset.manifest", kind="manifest")
    assert e.value.violations[0].field == "dataset.manifest"
    # larger than one stored chunk: the content comes back whole
    big = os.urandom(2 * MiB + 12345)
    binfo, _ = put(store, "a", "manifest", big, chunk=MiB)
    assert store.read("a", binfo.blob_id, "f", kind="manifest") == big
    assert store.usage("a") == (len(img) + len(big), 2)
    if backend.kind == "postgres":                           # 1 MiB bytea rows
        engine = sqldb.create_engine(backend.url)
        with engine.connect() as c:
            sizes = c.execute(sa.text("SELECT seq, octet_length(data) FROM blob_chunks WHERE"
                                      " hex=:h ORDER BY seq"), {"h": binfo.blob_id[7:]}).all()
        engine.dispose()
        assert [tuple(r) for r in sizes] == [(0, MiB), (1, MiB), (2, 12345)]


def test_another_tenants_blob_is_exactly_an_unknown_one(store: Any) -> None:
    data = b'{"image": "sha256:' + b"0" * 64 + b'"}\n'
    a, _ = put(store, "tenant-a", "manifest", data)
    unknown = "sha256:" + "1" * 64
    answers = []
    for blob_id in (a.blob_id, unknown):
        with pytest.raises(NotFound) as nf:
            store.get("tenant-b", blob_id)
        with pytest.raises(InvalidArgument) as ia:
            store.read("tenant-b", blob_id, "dataset.manifest", kind="manifest")
        with pytest.raises(InvalidArgument) as ip:
            store.path_of("tenant-b", blob_id, "params.model")
        with pytest.raises(NotFound) as nd:
            store.delete("tenant-b", blob_id)
        answers.append([x.value.message.replace(blob_id, "<id>") for x in (nf, ia, ip, nd)])
    assert answers[0] == answers[1]
    assert store.list("tenant-b") == [] and store.usage("tenant-b") == (0, 0)
    # B's own copy of the same bytes is B's; deleting it leaves A's
    b, existed = put(store, "tenant-b", "manifest", data)
    assert not existed and b.blob_id == a.blob_id
    store.delete("tenant-b", b.blob_id)
    assert store.read("tenant-a", a.blob_id, "f", kind="manifest") == data
    with pytest.raises(NotFound):
        store.get("tenant-b", b.blob_id)


def test_quota_counts_uploads_in_progress_and_frees_them(backend: Backend) -> None:
    store = open_store(backend, quota_bytes=1000, max_blobs=2)
    try:
        first = store.begin("a", kind="manifest", size=600)
        first.write(b"x" * 100)
        with pytest.raises(QuotaExceeded) as e:
            store.begin("a", kind="manifest", size=500)         # 600 in progress + 500
        assert e.value.violations[0].subject == "tenant:a"
        assert "quota of 1,000 bytes" in e.value.violations[0].description
        store.begin("b", kind="manifest", size=1000).abort()    # b's quota is its own
        first.abort()
        assert leftovers(backend) == nothing(backend)
        put(store, "a", "manifest", b"y" * 700)
        with pytest.raises(QuotaExceeded):
            put(store, "a", "manifest", b"z" * 301)
        put(store, "a", "manifest", b"z" * 300)                # exactly the quota
        assert store.usage("a") == (1000, 2)
        roomy = open_store(backend, quota_bytes=10_000, max_blobs=2)
        try:
            with pytest.raises(QuotaExceeded) as e:             # max_blobs
                roomy.begin("a", kind="manifest", size=1)
            assert "at most 2 blobs" in e.value.violations[0].description
        finally:
            roomy.close()
    finally:
        store.close()


def test_two_replicas_never_pass_the_quota_together(backend: Backend) -> None:
    """Each store sees only its own uploads in progress; the commit checks the quota again
    against what is stored, so two replicas finishing at once cannot pass it."""
    one, two = open_store(backend, quota_bytes=1000), open_store(backend, quota_bytes=1000)
    try:
        u1 = one.begin("a", kind="manifest", size=600)
        u2 = two.begin("a", kind="manifest", size=600)
        u1.write(b"1" * 600)
        u2.write(b"2" * 600)
        u1.finish()
        with pytest.raises(QuotaExceeded) as e:
            u2.finish()
        assert e.value.violations[0].subject == "tenant:a"
        assert one.usage("a") == (600, 1) == two.usage("a")
        assert len(one.list("a")) == 1
    finally:
        one.close()
        two.close()


def test_limits_are_refused_as_bytes_arrive_and_nothing_is_kept(store: Any,
                                                                backend: Backend) -> None:
    cases = [("header.size", lambda: store.begin("a", kind="image",
                                                 size=MAX_BLOB_BYTES["image"] + 1)),
             ("header.size", lambda: store.begin("a", kind="manifest", size=0)),
             ("header.kind", lambda: store.begin("a", kind="video", size=10)),
             ("header.media_type", lambda: store.begin("a", kind="manifest", size=1,
                                                       media_type="x" * 200)),
             ("header.expected_sha256", lambda: store.begin("a", kind="manifest", size=1,
                                                            expected_sha256="md5:abc"))]
    for field, call in cases:
        with pytest.raises(InvalidArgument) as e:
            call()
        assert e.value.violations[0].field == field
    refusals = [
        ("manifest", 10, [b"z" * 11], "chunk"),                         # past the declared size
        ("manifest", MiB + 10, [b"z" * (MiB + 1)], "chunk"),            # a chunk over 1 MiB
        ("image", 100, [b"<html>" + b" " * 94], "chunk"),               # not PNG/JPEG
        ("image", 4096, [png_header(100_000, 100_000)], "chunk"),       # 10^10 pixels, header
        ("model", 100, [b"not a zip" + b" " * 91], "chunk"),            # not TorchScript
    ]
    for kind, size, chunks, field in refusals:
        up = store.begin("a", kind=kind, size=size)
        with pytest.raises(InvalidArgument) as e:
            for c in chunks:
                up.write(c)
        assert e.value.violations[0].field == field, (kind, e.value.message)
    up = store.begin("a", kind="manifest", size=10)
    up.write(b"12345")
    with pytest.raises(InvalidArgument) as e:                   # fewer bytes than declared
        up.finish()
    assert e.value.violations[0].field == "header.size"
    up = store.begin("a", kind="manifest", size=3, expected_sha256="sha256:" + "0" * 64)
    up.write(b"abc")
    with pytest.raises(InvalidArgument) as e:                   # the digest does not match
        up.finish()
    assert e.value.violations[0].field == "header.expected_sha256"
    up = store.begin("a", kind="manifest", size=2 * MiB)         # cancelled half way
    up.write(b"q" * MiB)
    up.abort()
    assert leftovers(backend) == nothing(backend)
    assert store.usage("a") == (0, 0) and store.list("a") == []
    # the reservations were all released: the whole quota is free again
    put(store, "a", "manifest", b"r" * MiB)


def test_path_of_gives_a_file_with_the_blobs_bytes(store: Any, backend: Backend) -> None:
    model = b"PK\x03\x04" + os.urandom(3 * MiB)                  # a zip's signature first
    info, _ = put(store, "a", "model", model)
    path = store.path_of("a", info.blob_id, "params.model", kind="model")
    assert path.read_bytes() == model
    with pytest.raises(InvalidArgument) as e:
        store.path_of("a", info.blob_id, "params.model", kind="image")
    assert e.value.violations[0].field == "params.model" and "is a model" in e.value.message
    if backend.kind == "postgres":
        # materialised under the cache folder, checked by SHA-256: a damaged cache file is
        # replaced, by this store and by a new one (another pod's restart)
        assert path.is_relative_to((backend.dir / "blob-cache").resolve())
        path.write_bytes(b"PK\x03\x04" + b"\x00" * (len(model) - 4))
        assert store.path_of("a", info.blob_id, "params.model").read_bytes() == model
        path.write_bytes(b"x" * len(model))
        fresh = open_store(backend)
        try:
            assert fresh.path_of("a", info.blob_id, "params.model").read_bytes() == model
        finally:
            fresh.close()
        assert not list((backend.dir / "blob-cache").rglob("*.part"))
    store.delete("a", info.blob_id)
    with pytest.raises(InvalidArgument) as e:               # gone: never served from a cache
        store.path_of("a", info.blob_id, "params.model", kind="model")
    assert "no such upload" in e.value.message


def test_listing_pages_newest_first(store: Any) -> None:
    ids = [put(store, "a", "manifest", f"{i}\n".encode())[0].blob_id for i in range(5)]
    put(store, "a", "image", encode_png(np.zeros((2, 2), np.uint8)))
    page1 = store.list("a", kind="manifest", limit=2)
    page2 = store.list("a", kind="manifest", limit=10,
                       after=(page1[-1].created, page1[-1].blob_id[7:]))
    got = [b.blob_id for b in page1 + page2]
    assert sorted(got) == sorted(ids) and len(got) == 5
    assert [b.created for b in page1 + page2] == sorted((b.created for b in page1 + page2),
                                                        reverse=True)
    assert [b.kind for b in store.list("a", kind="image")] == ["image"]


def _upload_same_bytes(backend: Backend, data: bytes, barrier: Any, out: Any) -> None:
    store = open_store(backend)
    try:
        barrier.wait(30)
        up = store.begin("a", kind="manifest", size=len(data))
        for c in iter_chunks(data):
            up.write(c)
        info, existed = up.finish()
        out.put(("ok", info.blob_id, existed))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        out.put(("error", type(exc).__name__, str(exc)))
    finally:
        store.close()


def test_two_processes_upload_the_same_bytes_at_once(store: Any, backend: Backend) -> None:
    data = os.urandom(3 * MiB)
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_upload_same_bytes, args=(backend, data, barrier, out))
             for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    assert all(r[0] == "ok" for r in results), results
    blob_id = "sha256:" + hashlib.sha256(data).hexdigest()
    assert {r[1] for r in results} == {blob_id}
    assert sorted(r[2] for r in results) == [False, True]        # one stored, one found it
    assert store.usage("a") == (len(data), 1)
    assert store.read("a", blob_id, "f", kind="manifest") == data
    if backend.kind == "postgres":
        assert leftovers(backend) == {"blobs": 1, "chunks": 3}


def test_open_blobs_picks_the_back_end_from_the_settings(backend: Backend) -> None:
    s = open_blobs(backend.dir / "state", database_url=backend.url or None, quota_bytes=123)
    try:
        assert type(s).__name__ == ("BlobStore" if backend.kind == "sqlite" else "PgBlobStore")
        assert s.quota_bytes == 123
        put(s, "a", "manifest", b"{}\n")
        assert (backend.dir / "state" / "blobs").is_dir() == (backend.kind == "sqlite")
    finally:
        s.close()


def test_a_database_not_at_head_is_refused_naming_the_setting(postgres_url: str,
                                                              tmp_path: Path) -> None:
    from fortis.infra.storage.blobs_pg import PgBlobStore

    with pytest.raises(InvalidArgument) as e:
        PgBlobStore(postgres_url, cache_dir=tmp_path)
    assert e.value.violations[0].field == "database_url"
    assert "fortis db upgrade" in e.value.message and "pw-" not in e.value.message


def test_a_database_that_stops_answering_is_unavailable(tmp_path: Path) -> None:
    """Its own server (stopped mid-test): calls fail UNAVAILABLE "upload storage unavailable",
    never INTERNAL, and work again once it is back."""
    from fortis.infra.storage.blobs_pg import PgBlobStore
    from fortis.services.common.errors import Unavailable

    from tests.infra.postgres import PostgresServer

    server = PostgresServer().start()
    try:
        url = server.url(server.create_database())
        migrate(url)
        store = PgBlobStore(url, cache_dir=tmp_path / "cache")
        info, _ = put(store, "a", "manifest", b"{}\n")
        server.stop_server()
        for call in (lambda: store.get("a", info.blob_id),
                     lambda: put(store, "a", "manifest", b"[]\n")):
            with pytest.raises(Unavailable) as e:
                call()
            assert "upload storage unavailable" in e.value.message
        server.start_server()
        assert store.read("a", info.blob_id, "f", kind="manifest") == b"{}\n"
        store.close()
    finally:
        server.stop()
