"""Dataset archives uploaded as blobs and read in place (``dataset.store.upload``), on both
blob back ends: the file store and a real PostgreSQL (``tests/infra/postgres.py``), where an
archive's members are read from only the ``bytea`` chunk rows they span.

Hostile archives are refused with a precise error naming the member: links, devices, FIFOs,
``..`` and absolute names, a name twice, too many members, over-long names, a pax header too
large, a member whose size runs past the end, an archive cut short, a gzip bomb; the upload
itself refuses what is not a tar from its first bytes; another tenant's archive reads exactly
like a missing one; an archive counts against the tenant's quota.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import zlib
from pathlib import PurePosixPath
from typing import Any

import pytest
from fortis.infra.storage.blobs import iter_chunks
from fortis.services.common.errors import InvalidArgument, QuotaExceeded
from fortis.services.evaluation import dataset_archive
from fortis.services.evaluation.dataset_archive import ArchiveStore, UploadedShards

from tests.storage.conftest import Backend
from tests.storage.test_blob_storage import open_store

MiB = 1024 * 1024
FIELD = "dataset.store.upload"


@pytest.fixture(autouse=True)
def _fresh_indexes() -> Any:
    """Each test scans its archives itself (indexes are kept by content id)."""
    dataset_archive._indexes.clear()
    yield
    dataset_archive._indexes.clear()


@pytest.fixture()
def store(backend: Backend) -> Any:
    s = open_store(backend, quota_bytes=64 * MiB)
    yield s
    s.close()


def upload(store: Any, data: bytes, tenant: str = "tenant-a", kind: str = "archive") -> str:
    up = store.begin(tenant, kind=kind, size=len(data))
    for c in iter_chunks(data):
        up.write(c)
    return str(up.finish()[0].blob_id)


def tar_of(members: list[tuple[str, bytes]], **kw: Any) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", **kw) as tf:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def special(name: str, kind: bytes, linkname: str = "") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        ti = tarfile.TarInfo("ok.txt")
        ti.size = 2
        tf.addfile(ti, io.BytesIO(b"ok"))
        ti = tarfile.TarInfo(name)
        ti.type, ti.linkname = kind, linkname
        tf.addfile(ti)
    return buf.getvalue()


def refused(store: Any, data: bytes) -> str:
    bid = upload(store, data)
    with pytest.raises(InvalidArgument) as e:
        ArchiveStore(store, "tenant-a", bid)
    v = e.value.violations[0]
    return f"{v.field}: {v.description}"


def test_members_read_in_place_plain_and_gzip(store: Any, monkeypatch: pytest.MonkeyPatch):
    # members larger than a chunk row and than the inflater's checkpoint interval, read in
    # reverse order so that gzip reads restart from kept checkpoints
    monkeypatch.setattr(dataset_archive, "CHECKPOINT_BYTES", 256 * 1024)
    monkeypatch.setattr(dataset_archive, "_WINDOW", 128 * 1024)
    members = [(f"set/part/f{i}.bin", os.urandom(300_000 * i + 7)) for i in range(8)]
    members.append(("set/ann.json", b'{"images": []}'))
    raw = tar_of(members)
    for data in (raw, gzip.compress(raw, compresslevel=1)):
        st = ArchiveStore(store, "tenant-a", upload(store, data))
        assert st.index.gzip == (data is not raw)
        for name, content in reversed(members):
            ref = st.locate(PurePosixPath("set"), name[len("set/") :], "dataset.path")
            assert st.size(ref) == len(content)
            assert st.read(ref, 10 * MiB, "dataset.path", "file") == content
            with st.open(ref, "dataset.path") as f:
                assert f.read(1000) + f.read() == content
        assert st.list_files("set/part", "dataset.path", 100) == [f"f{i}.bin" for i in range(8)]
        with pytest.raises(InvalidArgument, match="larger than 10 bytes"):
            st.read(st.locate(PurePosixPath(), "set/part/f3.bin", "x"), 10, "x", "file")
        for bad in ("set/nothing.json", "../set/ann.json", "/set/ann.json", "set/part"):
            with pytest.raises(InvalidArgument):
                st.locate(PurePosixPath(), bad, "dataset.path")
        dataset_archive._indexes.clear()


def test_uploaded_shards_stream_whole(store: Any):
    a, b = tar_of([("k0.cls", b"1")]), gzip.compress(tar_of([("k1.cls", b"2")]))
    ids = (upload(store, a), upload(store, b))
    st = UploadedShards(store, "tenant-a", ids)
    for bid, data in zip(ids, (a, b), strict=True):
        with st.open(st.locate(PurePosixPath(), bid, "dataset.path"), "x") as f:
            assert f.read() == data
    with pytest.raises(InvalidArgument, match="not found"):
        st.locate(PurePosixPath(), "sha256:" + "0" * 64, "dataset.path")


@pytest.mark.parametrize(
    "name,kind,link,expect",
    [
        ("evil", tarfile.SYMTYPE, "/etc/passwd", "links are refused"),
        ("evil", tarfile.LNKTYPE, "ok.txt", "links are refused"),
        ("evil", tarfile.CHRTYPE, "", "devices and FIFOs are refused"),
        ("evil", tarfile.BLKTYPE, "", "devices and FIFOs are refused"),
        ("evil", tarfile.FIFOTYPE, "", "devices and FIFOs are refused"),
    ],
)
def test_links_and_devices_refused(store: Any, name: str, kind: bytes, link: str, expect: str):
    msg = refused(store, special(name, kind, link))
    assert msg.startswith(f"{FIELD}:evil") and expect in msg, msg


@pytest.mark.parametrize(
    "name,expect",
    [
        ("../../etc/cron.d/x", "'..'"),
        ("a/../../x", "'..'"),
        ("/etc/passwd", "absolute member names"),
        ("C:/x", "absolute member names"),
        ("a\\..\\x", "'\\'"),
        ("n" * 600, "at most 512 characters"),
    ],
)
def test_bad_names_refused(store: Any, name: str, expect: str):
    msg = refused(store, tar_of([("ok.txt", b"ok"), (name, b"x")], format=tarfile.PAX_FORMAT))
    assert expect in msg, msg


def test_duplicate_names_and_member_count(store: Any, monkeypatch: pytest.MonkeyPatch):
    msg = refused(store, tar_of([("a/x.png", b"1"), ("a/./x.png", b"2")]))
    assert "a/./x.png" in msg and "appears twice" in msg, msg
    monkeypatch.setattr(dataset_archive, "MAX_MEMBERS", 10)
    msg = refused(store, tar_of([(f"m{i}", b"") for i in range(11)]))
    assert "more than 10 members" in msg, msg


def test_huge_pax_header_refused(store: Any):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        ti = tarfile.TarInfo("x.txt")
        ti.pax_headers = {"comment": "c" * 200_000}
        tf.addfile(ti, io.BytesIO(b""))
    assert "header extension larger than" in refused(store, buf.getvalue())


def _set_size(tar: bytes, member: int, size: int) -> bytes:
    """``tar`` with the size field of the header at block ``member`` rewritten (and its
    checksum made right again), as a lying archive would say it."""
    b = bytearray(tar)
    h = member * 512
    b[h + 124 : h + 136] = f"{size:011o}\0".encode()
    b[h + 148 : h + 156] = b" " * 8
    b[h + 148 : h + 156] = f"{sum(b[h : h + 512]):06o}\0 ".encode()
    return bytes(b)


def test_lying_sizes_and_truncation_refused(store: Any):
    tar = tar_of([("a.png", b"a" * 1000), ("b.png", b"b" * 10)])
    msg = refused(store, _set_size(tar, 0, 10**9))
    assert "a.png" in msg and "past the end" in msg, msg
    # the last member cut in its data, or the archive cut inside a later header
    assert "past the end" in refused(store, tar[: 512 + 600])
    assert "cut short or damaged" in refused(store, tar[: 3 * 512 + 100])
    # gzip: the stream itself cut short
    gz = gzip.compress(tar_of([("a.png", os.urandom(100_000)), ("b.png", b"b")]))
    msg = refused(store, gz[: len(gz) // 2])
    assert "a.png" in msg and "past the end" in msg, msg


def test_gzip_bomb_refused_quickly(store: Any):
    # one member of 256 MiB of zeros: ~250 KiB compressed
    head = tar_of([("bomb.png", b"")])[:512]
    head = _set_size(head + b"\0" * 1024, 0, 256 * MiB)[:512]
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts, zero = [z.compress(head)], bytes(MiB)
    parts += [z.compress(zero) for _ in range(256)]
    parts.append(z.compress(bytes(1024)) + z.flush())
    msg = refused(store, b"".join(parts))
    assert "fold" in msg and "gzip bomb" in msg, msg


def test_upload_checks_the_tar_header_as_it_arrives(store: Any):
    for data in (b"PK\x03\x04" + bytes(600), os.urandom(2048), gzip.compress(b"not a tar" * 100)):
        with pytest.raises(InvalidArgument) as e:
            upload(store, data)
        assert e.value.violations[0].field == "chunk"
    with pytest.raises(InvalidArgument, match="no complete tar header"):
        upload(store, tar_of([("a", b"1")])[:300])
    # a gzip archive is told by its inflated tar header too
    bid = upload(store, gzip.compress(tar_of([("a", b"1")])))
    assert store.get("tenant-a", bid).media_type == "application/gzip"


def test_tenancy_kind_and_quota(store: Any):
    bid = upload(store, tar_of([("a.txt", b"1")]))
    png = upload(
        store,
        bytes.fromhex(
            "89504e470d0a1a0a0000000d49484452000000010000000108020000"
            "00907753de0000000c4944415408d763f8cfc0000003010100c9fe92"
            "ef0000000049454e44ae426082"
        ),
        kind="image",
    )
    foreign = pytest.raises(InvalidArgument)
    with foreign as e1:
        ArchiveStore(store, "tenant-b", bid)
    with pytest.raises(InvalidArgument) as e2:
        ArchiveStore(store, "tenant-b", "sha256:" + "1" * 64)
    assert e1.value.violations == e2.value.violations  # another tenant's reads as missing
    assert e1.value.violations[0].field == FIELD
    with pytest.raises(InvalidArgument, match="a archive is needed"):
        ArchiveStore(store, "tenant-a", png)
    with pytest.raises(QuotaExceeded):
        store.begin("tenant-a", kind="archive", size=65 * MiB)
    with pytest.raises(InvalidArgument, match="header.size"):
        store.begin("tenant-a", kind="archive", size=2 * 1024**3 + 1)
