"""End to end through the real services: datasets uploaded as archives (``UploadService``,
kind archive) and evaluated in place (``dataset.store.upload``), with the blobs in the file
store and, in the second test, in a real PostgreSQL (``tests/infra/postgres.py``: the whole
stack on ``--database-url``, archive members read from ``bytea`` chunk rows).

A COCO folder (the demo's astronaut with its face box, and the coffee photo with none, as the
other COCO tests use) is packed by the SDK as it is sent (``FortisClient.upload_folder``), so
the face detector must score both; a Hugging Face ``save_to_disk`` folder of Fashion-MNIST
test images, uploaded as a ``.tar.gz`` and as a plain tar packed by the SDK, must give the
clean accuracy the same images give from the built-in ``fashion-mnist`` source; WebDataset
shards uploaded one archive each give the same as the HF folder. Another tenant's archive id
is refused exactly like an unknown one, and the report names the archive by its content id.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import cv2
import pytest
from fortis.client import FortisClient, progress_of
from fortis.client.errors import FortisError, code_for
from google.rpc import code_pb2

from tests import dataset_builders as build
from tests.e2e.test_dataset_streams_e2e import _face_samples, _fmnist_hf, _plan

KEY_A, KEY_B = "test-key-archives-a", "test-key-archives-b"
N = 12


def _coco(folder: Path) -> None:
    (folder / "val").mkdir(parents=True)
    images, annotations = [], []
    for k, (name, img, boxes) in enumerate(_face_samples(), start=1):
        cv2.imwrite(str(folder / "val" / f"{name}.png"), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
        images.append(
            {"id": k, "file_name": f"{name}.png", "width": img.shape[1], "height": img.shape[0]}
        )
        annotations += [
            {
                "id": 10 * k + j,
                "image_id": k,
                "category_id": 1,
                "iscrowd": 0,
                "bbox": [x1, y1, x2 - x1, y2 - y1],
            }
            for j, (x1, y1, x2, y2) in enumerate(boxes)
        ]
    (folder / "ann.json").write_text(
        json.dumps(
            {
                "images": images,
                "annotations": annotations,
                "categories": [{"id": 1, "name": "face"}],
            }
        )
    )


def _targz(folder: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        tf.add(folder, arcname=folder.name)
    return buf.getvalue()


def _wds_shards() -> list[bytes]:
    """The same Fashion-MNIST images as WebDataset shards of 6 samples each."""
    from fortis.adapters.torch_models.datasets import load_fashion_mnist

    images, labels = load_fashion_mnist("test", limit=N)
    shards = []
    for s in range(2):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for k in range(6 * s, 6 * s + 6):
                ok, png = cv2.imencode(".png", images[k][:, :, 0])
                build.add(tf, f"s{s}/{k:03d}.png", png.tobytes())
                build.add(tf, f"s{s}/{k:03d}.cls", str(int(labels[k])).encode())
        shards.append(buf.getvalue())
    return shards


def _stack(root: Path, **kw: Any) -> Any:
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    return start_stack(
        StackSettings(
            state_dir=root / "state",
            api_keys={KEY_A: "tenant-a", KEY_B: "tenant-b"},
            targets=[TargetConfig.parse(f"{t}=builtin:{t}") for t in ("fmnist-cnn", "haar-face")],
            metrics_port=0,
            metrics_host="127.0.0.1",
            **kw,
        )
    )


def _evaluate(fc: FortisClient, plan: str, out: Path) -> dict[str, Any]:
    fc.validate(plan)
    ev = fc.submit(plan)
    final = fc.wait(ev.evaluation_id, timeout_s=120)
    assert progress_of(final).state == "SUCCEEDED", final.error.message
    return dict(
        json.loads(fc.write_report(ev.evaluation_id, out / ev.evaluation_id)[0].read_text())
    )


def _refused(fc: FortisClient, plan: str) -> tuple[str, str]:
    with pytest.raises(FortisError) as e:
        fc.validate(plan)
    return code_pb2.Code.Name(code_for(e.value)), e.value.message


@pytest.mark.slow
def test_coco_hf_and_webdataset_archives_run_end_to_end(tmp_path):
    local = tmp_path / "local"
    _coco(local / "faces")
    _fmnist_hf(local / "fmnist", N)
    stack = _stack(tmp_path)
    try:
        with FortisClient(stack.address, api_key=KEY_B) as other:
            foreign = other.upload(_targz(local / "faces"), kind="archive").blob_id
        with FortisClient(stack.address, api_key=KEY_A) as fc:
            coco = fc.upload_folder(local / "faces")
            assert coco.kind == "archive" and coco.media_type == "application/x-tar"
            # the packed tar is reproducible: the same folder is the same blob
            assert fc.upload_folder(local / "faces").already_existed
            hf_gz = fc.upload(_targz(local / "fmnist"), kind="archive")
            assert hf_gz.media_type == "application/gzip"
            hf_tar = fc.upload_folder(local / "fmnist")
            shards = [fc.upload(s, kind="archive").blob_id for s in _wds_shards()]
            store = f"{{upload: '{coco.blob_id}'}}"
            det = _evaluate(
                fc,
                _plan(
                    "coco-archive",
                    f"{{source: coco, path: faces/ann.json, images: faces/val, "
                    f"label_map: {{face: 0}}, store: {store}}}",
                    "haar-face",
                    "detection",
                ),
                tmp_path,
            )
            reports = [
                _evaluate(fc, _plan(name, dataset), tmp_path)
                for name, dataset in (
                    (
                        "hf-gz",
                        f"{{source: hf, path: fmnist, store: {{upload: '{hf_gz.blob_id}'}}}}",
                    ),
                    (
                        "hf-tar",
                        f"{{source: hf, path: fmnist, store: {{upload: '{hf_tar.blob_id}'}}}}",
                    ),
                    ("wds", f"{{source: webdataset, store: {{upload: {json.dumps(shards)}}}}}"),
                    ("builtin", f"{{source: fashion-mnist, split: test, limit: {N}}}"),
                )
            ]
            # another tenant's archive reads exactly like an unknown id
            unknown = "sha256:" + "e" * 64
            hf = "{source: hf, path: fmnist, store: {upload: '%s'}}"
            code_f, msg_f = _refused(fc, _plan("x", hf % foreign))
            assert (code_f, msg_f) == _refused(fc, _plan("x", hf % unknown))
            assert code_f == "INVALID_ARGUMENT" and "dataset.store.upload" in msg_f
            with FortisClient(stack.address, api_key=KEY_B) as other:
                code_b, msg_b = _refused(other, _plan("x", hf % coco.blob_id))
            assert (code_b, msg_b) == (code_f, msg_f)
            for dataset, field, text in (
                (hf % coco.blob_id, "dataset.path", "not found in the uploaded archive"),
                (
                    f"{{source: hf, path: nothing, store: {{upload: '{hf_tar.blob_id}'}}}}",
                    "dataset.path",
                    "not found in the uploaded archive",
                ),
                (
                    f"{{source: hf, path: fmnist, store: {{upload: ['{hf_tar.blob_id}']}}}}",
                    "dataset.store.upload",
                    "a list of uploads is for WebDataset shards",
                ),
                (
                    f"{{source: webdataset, path: x.tar, store: {{upload: '{shards[0]}'}}}}",
                    "dataset.path",
                    "leave dataset.path out",
                ),
            ):
                code, msg = _refused(fc, _plan("x", dataset))
                assert code == "INVALID_ARGUMENT" and field in msg and text in msg, msg
    finally:
        stack.stop(0)
    acc = det["metrics"]["accuracy"]
    assert acc["m"] == 2 and acc["value"] == 1.0, acc  # face found, nothing on the coffee
    builtin = reports[-1]["metrics"]["accuracy"]
    for report in reports[:-1]:
        assert report["metrics"]["accuracy"]["m"] == N
        assert report["metrics"]["accuracy"]["value"] == builtin["value"]
    assert coco.blob_id in json.dumps(det)  # the report's plan pins the data (IEEE-P4)


@pytest.mark.slow
def test_hf_archive_on_the_postgres_stack(tmp_path, postgres_url):
    from tests.storage.conftest import migrate

    _fmnist_hf(tmp_path / "fmnist", N)
    migrate(postgres_url)
    stack = _stack(tmp_path, database_url=postgres_url)
    try:
        with FortisClient(stack.address, api_key=KEY_A) as fc:
            gz = fc.upload(_targz(tmp_path / "fmnist"), kind="archive").blob_id
            tar = fc.upload_folder(tmp_path / "fmnist").blob_id
            got = [
                _evaluate(
                    fc,
                    _plan(n, f"{{source: hf, path: fmnist, store: {{upload: '{b}'}}}}"),
                    tmp_path,
                )["metrics"]["accuracy"]
                for n, b in (("pg-gz", gz), ("pg-tar", tar))
            ]
            builtin = _evaluate(
                fc, _plan("b", f"{{source: fashion-mnist, split: test, limit: {N}}}"), tmp_path
            )["metrics"]["accuracy"]
    finally:
        stack.stop(0)
    assert [a["m"] for a in got] == [N, N]
    assert [a["value"] for a in got] == [builtin["value"]] * 2
