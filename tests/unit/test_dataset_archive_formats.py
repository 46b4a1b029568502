"""Each format read from an uploaded archive (``dataset.store.upload``) gives exactly what
the same folder gives from the data root: COCO and VOC (boxes and masks), class folders, and
a Hugging Face folder written by ``datasets``, each from a plain tar packed by the SDK's
packer and from a ``.tar.gz`` (file blob store; the PostgreSQL reader is covered in
tests/storage/test_archive_store.py)."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fortis.client.archive import folder_entries, tar_chunks
from fortis.infra.storage.blobs import BlobStore, iter_chunks
from fortis.services.evaluation import dataset_archive
from fortis.services.evaluation.datasets import PlanDatasets

from tests import dataset_builders as build
from tests.unit.test_dataset_formats import _coco, _plan, _voc, coco, voc  # noqa: F401
from tests.unit.test_dataset_streams import _plan as _stream_plan


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _archives(root: Path, top: str, tmp: Path) -> list[tuple[str, PlanDatasets]]:
    """(blob id, datasets of tenant t) for ``root/top`` packed as a tar and as a .tar.gz."""
    dataset_archive._indexes.clear()
    blobs = BlobStore(tmp / "blobs")
    tar = b"".join(tar_chunks(folder_entries(root / top)))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        tf.add(root / top, arcname=top)
    out = []
    for data in (tar, buf.getvalue()):
        up = blobs.begin("t", kind="archive", size=len(data))
        for c in iter_chunks(data):
            up.write(c)
        out.append((up.finish()[0].blob_id, PlanDatasets({}, blobs=blobs).for_tenant("t")))
    assert gzip.decompress(buf.getvalue())[257:262] == b"ustar"
    return out


def _both(plan_of: Any, dataset: dict[str, Any], root: Path, top: str, tmp: Path) -> None:
    local = PlanDatasets({}, data_root=root).for_tenant("t")
    want_truths = local.truths(plan_of(dataset))
    want_images = local.images(plan_of(dataset))
    assert want_images
    for blob_id, ds in _archives(root, top, tmp):
        plan = plan_of({**dataset, "store": {"upload": blob_id}})
        ds.check(plan)
        assert _same(ds.truths(plan), want_truths)
        got = ds.images(plan)
        assert [i for i, _, _ in got] == [i for i, _, _ in want_images]
        assert all(
            _same(a[1], b[1]) and a[2] == b[2] for a, b in zip(got, want_images, strict=True)
        )


@pytest.mark.parametrize("task", ["detection", "segmentation"])
def test_coco_from_an_archive_equals_the_data_root(coco, tmp_path, task):  # noqa: F811
    _both(lambda d: _plan(d, task), _coco(), coco, "coco", tmp_path)


@pytest.mark.parametrize("task", ["detection", "segmentation"])
def test_voc_from_an_archive_equals_the_data_root(voc, tmp_path, task):  # noqa: F811
    _both(lambda d: _plan(d, task), _voc(), voc, "VOCdevkit", tmp_path)


def test_folders_and_hf_from_an_archive_equal_the_data_root(tmp_path):
    root = tmp_path / "data"
    for cls, n in (("dog", 2), ("cat", 3)):
        for k in range(n):
            (root / "pets" / cls).mkdir(parents=True, exist_ok=True)
            (root / "pets" / cls / f"{k:03d}.png").write_bytes(build.png(20 * k + 3))
    _both(
        _stream_plan,
        {"source": "folders", "path": "pets", "label_map": {"cat": 0, "dog": 1}},
        root,
        "pets",
        tmp_path / "a",
    )
    build.hf_classification(root / "hf", [0, 1, 2, 1, 0], ["a", "b", "c"], split="test")
    _both(_stream_plan, {"source": "hf", "path": "hf", "split": "test"}, root, "hf", tmp_path / "b")
