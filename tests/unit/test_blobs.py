"""infra/storage/blobs.py on real files and a real SQLite index (no plan reads
the server's disk: content-addressed per-tenant blobs, limits checked from the header before
decoding, nothing partial kept). The gRPC surface is tested in
tests/integration/test_uploads.py."""

from __future__ import annotations

import hashlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from fortis.infra.storage.blobs import BlobStore, check_blob_id, iter_chunks
from fortis.services.common.codec import encode_png
from fortis.services.common.errors import InvalidArgument, NotFound, QuotaExceeded
from fortis.services.common.paths import tenant_dir_name


def _put(store: BlobStore, tenant: str, kind: str, data: bytes, chunk: int = 1 << 20):
    up = store.begin(tenant, kind=kind, size=len(data))
    for c in iter_chunks(data, chunk):
        up.write(c)
    return up.finish()


def _jpeg(h: int, w: int) -> bytes:
    ok, buf = cv2.imencode(".jpg", np.full((h, w, 3), 90, np.uint8))
    assert ok
    return buf.tobytes()


def _sof_declaring(jpeg: bytes, w: int, h: int) -> bytes:
    """``jpeg`` with its frame header (SOF0) rewritten to declare ``w`` x ``h``."""
    i = jpeg.index(b"\xff\xc0")
    return jpeg[:i + 5] + h.to_bytes(2, "big") + w.to_bytes(2, "big") + jpeg[i + 9:]


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.is_file() and p.suffix != ".sqlite"
                  and not p.name.startswith("blobs.sqlite"))


def test_ids_are_the_content_hash_and_uploads_are_idempotent(tmp_path):
    store = BlobStore(tmp_path)
    data = encode_png(np.arange(64, dtype=np.uint8).reshape(8, 8))
    info, existed = _put(store, "a", "image", data, chunk=7)     # header split over chunks
    assert info.blob_id == "sha256:" + hashlib.sha256(data).hexdigest() and not existed
    assert (info.width, info.height, info.media_type, info.size) == (8, 8, "image/png", len(data))
    again, existed = _put(store, "a", "image", data)
    assert existed and again == info
    assert (tmp_path / "a" / info.blob_id[7:]).read_bytes() == data
    with pytest.raises(InvalidArgument) as e:      # same bytes, another kind
        _put(store, "a", "manifest", data)
    assert e.value.violations[0].field == "header.kind"
    assert store.read("a", info.blob_id, "f", kind="image") == data


def test_a_jpeg_header_is_read_without_decoding(tmp_path):
    store = BlobStore(tmp_path)
    info, _ = _put(store, "a", "image", _jpeg(30, 50), chunk=3)
    assert (info.width, info.height, info.media_type) == (50, 30, "image/jpeg")
    huge = _sof_declaring(_jpeg(30, 50), 60_000, 60_000)
    with pytest.raises(InvalidArgument) as e:
        _put(store, "a", "image", huge)
    assert e.value.violations[0].field == "chunk" and "60000x60000" in e.value.message
    assert _leftovers(tmp_path) == [info.blob_id[7:]]


def test_tenants_never_share_blobs_or_folders(tmp_path):
    store = BlobStore(tmp_path)
    data = b'{"image": "sha256:' + b"0" * 64 + b'"}\n'
    a, _ = _put(store, "a", "manifest", data)
    with pytest.raises(NotFound) as unknown:
        store.get("b", "sha256:" + "1" * 64)
    with pytest.raises(NotFound) as foreign:
        store.get("b", a.blob_id)
    assert foreign.value.message.replace(a.blob_id, "X") == \
        unknown.value.message.replace("sha256:" + "1" * 64, "X")
    with pytest.raises(InvalidArgument):
        store.path_of("b", a.blob_id, "dataset.manifest")
    weird = "../../etc"
    b, existed = _put(store, weird, "manifest", data)
    assert not existed and b.blob_id == a.blob_id
    d = store.tenant_dir(weird)
    assert d.parent == tmp_path.resolve() and d.name == tenant_dir_name(weird) != "a"
    store.delete(weird, b.blob_id)
    assert store.get("a", a.blob_id) == a


def test_quota_counts_uploads_in_progress_and_frees_them_on_abort(tmp_path):
    store = BlobStore(tmp_path, quota_bytes=1000)
    first = store.begin("a", kind="manifest", size=600)
    first.write(b"x" * 100)
    with pytest.raises(QuotaExceeded) as e:
        store.begin("a", kind="manifest", size=500)        # 600 reserved + 500 > 1000
    assert e.value.violations[0].subject == "tenant:a"
    store.begin("b", kind="manifest", size=1000).abort()   # b's quota is its own
    first.abort()
    assert _leftovers(tmp_path) == []
    _put(store, "a", "manifest", b"y" * 1000)               # the whole quota again
    assert store.usage("a") == (1000, 1)


def test_a_crash_leaves_nothing_visible_after_restart(tmp_path):
    store = BlobStore(tmp_path)
    kept, _ = _put(store, "a", "manifest", b"{}\n")
    store.begin("a", kind="manifest", size=50).write(b"partial")      # never finished
    (tmp_path / "a" / ("f" * 64)).write_bytes(b"renamed but never recorded")
    store.close()
    reopened = BlobStore(tmp_path)
    assert _leftovers(tmp_path) == [kept.blob_id[7:]]
    assert [b.blob_id for b in reopened.list("a")] == [kept.blob_id]


def test_listing_pages_newest_first(tmp_path):
    store = BlobStore(tmp_path)
    ids = [_put(store, "a", "manifest", f"{i}\n".encode())[0].blob_id for i in range(5)]
    page1 = store.list("a", limit=2)
    page2 = store.list("a", limit=10, after=(page1[-1].created, page1[-1].blob_id[7:]))
    got = [b.blob_id for b in page1 + page2]
    assert sorted(got) == sorted(ids) and len(got) == 5
    assert [b.created for b in page1 + page2] == sorted((b.created for b in page1 + page2),
                                                        reverse=True)


@pytest.mark.parametrize("raw", ["", "sha256:", "sha256:" + "G" * 64, "sha1:" + "0" * 40,
                                 "sha256:" + "0" * 63, "sha256:" + "0" * 64 + "\n", 7, None])
def test_blob_ids_are_checked_without_echo(raw):
    with pytest.raises(InvalidArgument) as e:
        check_blob_id(raw, "blob_id")
    assert e.value.violations[0].field == "blob_id"
    if isinstance(raw, str) and len(raw) > 20:     # never quoted back
        assert raw.strip() not in e.value.message


def _uploads_plan(manifest: str, task: str) -> object:
    """The two parts of a Plan the dataset port reads (source: uploads)."""
    from types import SimpleNamespace
    return SimpleNamespace(dataset=SimpleNamespace(source="uploads", manifest=manifest, path="",
                                                   offset=0, limit=100, label_map={}),
                           target=SimpleNamespace(task=task))


def test_uploaded_segmentation_and_detection_manifests(tmp_path):
    """IEEE-C4/C5 ground truth from uploads: masks are blob ids too; every problem names the
    manifest line; another tenant's datasets port sees none of it."""
    import json

    from fortis.services.evaluation.datasets import PlanDatasets

    store = BlobStore(tmp_path)
    img = np.zeros((6, 10, 3), np.uint8)
    img[:, 5:] = 200
    mask = np.zeros((6, 10), np.uint8)
    mask[:, 5:] = 2
    iid = _put(store, "a", "image", encode_png(img))[0].blob_id
    mid = _put(store, "a", "image", encode_png(mask))[0].blob_id
    seg = _put(store, "a", "manifest", json.dumps({"id": "s", "image": iid, "mask": mid})
               .encode())[0].blob_id
    ds = PlanDatasets({}, blobs=store).for_tenant("a")
    truths = ds.truths(_uploads_plan(seg, "segmentation"))
    np.testing.assert_array_equal(truths["s"], mask.astype(np.int64))
    (got,) = ds.images(_uploads_plan(seg, "segmentation"))
    assert got[0] == "s" and got[1].shape == (6, 10, 3)
    det = _put(store, "a", "manifest", json.dumps({"id": "d", "image": iid,
                                                   "boxes": [[5, 0, 10, 6]], "labels": [1]})
               .encode())[0].blob_id
    t = ds.truths(_uploads_plan(det, "detection"))["d"]
    assert t["boxes"] == [[5, 0, 10, 6]] and t["image_size"] == [10, 6]
    # a mask that is a manifest, and the same plan run as tenant b: named, never read
    bad = _put(store, "a", "manifest", json.dumps({"id": "s", "image": iid, "mask": seg})
               .encode())[0].blob_id
    with pytest.raises(InvalidArgument) as e:
        ds.truths(_uploads_plan(bad, "segmentation"))
    assert e.value.violations[0].field == "dataset.manifest:1.mask"
    with pytest.raises(InvalidArgument) as e:
        PlanDatasets({}, blobs=store).for_tenant("b").images(_uploads_plan(seg, "segmentation"))
    assert e.value.violations[0].field == "dataset.manifest"
