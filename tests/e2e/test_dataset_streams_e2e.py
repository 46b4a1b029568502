"""End to end through the real services: plans reading WebDataset shards and a Hugging Face
``save_to_disk`` folder under the data root, and COCO, HF, VOC and WebDataset datasets from an S3 prefix
(s3rver on 127.0.0.1: an emulator, since no real S3 server installs offline here; see
tests/integration/_s3rver_support.py).

The HF folder holds Fashion-MNIST test images written by ``datasets`` itself, and a class-folder
tree the same images as PNGs under their class's folder; the clean accuracy of each must equal
that of the same images read from the built-in ``fashion-mnist`` source (the same pixels and
labels, only kept differently). The WebDataset shards hold the demo's
astronaut (its face box in the sample's .json, class "face" mapped by name) and the coffee
photo with no objects, as the COCO end-to-end test does, so the face detector scores both.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from fortis.client import FortisClient, progress_of
from fortis.client.errors import FortisError, code_for
from google.rpc import code_pb2

from tests import dataset_builders as build
from tests.integration._s3rver_support import ACCESS_KEY, SECRET_KEY, client, s3rver, upload_tree

KEY = "test-key-dataset-streams"


def _run(
    root: Path,
    targets: list[str],
    plans: list[str],
    stores: Path | None = None,
    refused: tuple[tuple[str, str, str], ...] = (),
) -> list[dict[str, Any]]:
    """Each plan validated, run and its report.json read; each of ``refused`` (plan, gRPC
    status name, text of the message) refused by ValidatePlan with that status."""
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    stack = start_stack(
        StackSettings(
            state_dir=root / "state",
            api_keys={KEY: "tenant-a"},
            data_root=root / "data",
            dataset_stores=stores,
            targets=[TargetConfig.parse(f"{t}=builtin:{t}") for t in targets],
            metrics_port=0,
            metrics_host="127.0.0.1",
        )
    )
    out = []
    try:
        with FortisClient(stack.address, api_key=KEY) as fc:
            for plan in plans:
                fc.validate(plan)
                ev = fc.submit(plan)
                final = fc.wait(ev.evaluation_id)
                assert progress_of(final).state == "SUCCEEDED", final.error.message
                path = fc.write_report(ev.evaluation_id, root / ev.evaluation_id)[0]
                out.append(dict(json.loads(path.read_text())))
            for plan, code, text in refused:
                with pytest.raises(FortisError) as e:
                    fc.validate(plan)
                assert code_pb2.Code.Name(code_for(e.value)) == code and text in e.value.message, (
                    code_for(e.value),
                    e.value.message,
                )
                assert SECRET_KEY not in e.value.message
    finally:
        stack.stop(0)
    return out


def _fmnist_hf(folder: Path, n: int) -> None:
    import datasets
    from fortis.adapters.torch_models.datasets import load_fashion_mnist
    from PIL import Image

    images, labels = load_fashion_mnist("test", limit=n)
    feats = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)}
    )
    datasets.Dataset.from_dict(
        {
            "image": [Image.fromarray(im[:, :, 0]) for im in images],
            "label": [int(x) for x in labels],
        },
        features=feats,
    ).save_to_disk(str(folder))


def _plan(name: str, dataset: str, target: str = "fmnist-cnn", task: str = "classification") -> str:
    section = (
        "detection: {mode: threshold, iou_threshold: 0.5, aggregate: all}\n"
        if task == "detection"
        else ""
    )
    return (
        f"name: {name}\nseed: 3\ntarget: {{name: {target}, task: {task}}}\n"
        f"dataset: {dataset}\n{section}corruptions:\n  - {{id: contrast, severities: [1]}}\n"
    )


def _face_samples() -> list[tuple[str, np.ndarray, list[list[float]]]]:
    from fortis.adapters.vision_demo import ASTRONAUT_FACE, _photos

    photos = _photos()
    a = photos["astronaut"]
    s = 160 / a.shape[0]
    small = cv2.resize(a, (160, 160), interpolation=cv2.INTER_AREA)
    coffee = cv2.resize(photos["coffee"], (213, 142), interpolation=cv2.INTER_AREA)
    return [("astronaut", small, [[v * s for v in ASTRONAUT_FACE]]), ("coffee", coffee, [])]


@pytest.mark.slow
def test_webdataset_hf_and_folder_plans_run_end_to_end(tmp_path):
    data = tmp_path / "data"
    _fmnist_hf(data / "hf" / "fmnist", 24)
    (data / "wds").mkdir(parents=True)
    with tarfile.open(data / "wds" / "faces-000.tar", "w") as tf:
        for key, img, boxes in _face_samples():
            ok, png = cv2.imencode(".png", cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
            build.add(tf, f"{key}.png", png.tobytes())
            build.add(
                tf,
                f"{key}.json",
                json.dumps({"boxes": boxes, "labels": ["face"] * len(boxes)}).encode(),
            )
    from fortis.adapters.torch_models.datasets import load_fashion_mnist

    for k, (im, lab) in enumerate(zip(*load_fashion_mnist("test", limit=24), strict=True)):
        (data / "fm" / str(int(lab))).mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(data / "fm" / str(int(lab)) / f"{k:03d}.png"), im[:, :, 0])
    label_map = ", ".join(f"{c}: {c}" for c in range(10))  # folder "3/" is class 3
    hf, folders, builtin, wds = _run(
        tmp_path,
        ["fmnist-cnn", "haar-face"],
        [
            _plan("hf", "{source: hf, path: hf/fmnist, limit: 24}"),
            _plan("folders", f"{{source: folders, path: fm, label_map: {{{label_map}}}}}"),
            _plan("builtin", "{source: fashion-mnist, split: test, limit: 24}"),
            _plan(
                "wds",
                "{source: webdataset, path: 'wds/faces-{000..000}.tar', label_map: {face: 0}}",
                "haar-face",
                "detection",
            ),
        ],
    )
    assert hf["metrics"]["accuracy"]["m"] == 24
    assert hf["metrics"]["accuracy"]["value"] == builtin["metrics"]["accuracy"]["value"]
    assert folders["metrics"]["accuracy"]["m"] == 24
    assert folders["metrics"]["accuracy"]["value"] == builtin["metrics"]["accuracy"]["value"]
    acc = wds["metrics"]["accuracy"]
    assert acc["m"] == 2 and acc["value"] == 1.0, acc  # face found, nothing on the coffee


@pytest.mark.slow
def test_coco_and_hf_from_s3_run_end_to_end(tmp_path, monkeypatch):
    local = tmp_path / "local"
    _fmnist_hf(local / "hf" / "fmnist", 12)
    coco = local / "coco"
    (coco / "val").mkdir(parents=True)
    images, annotations = [], []
    for k, (name, img, boxes) in enumerate(_face_samples(), start=1):
        cv2.imwrite(str(coco / "val" / f"{name}.png"), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
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
    (coco / "ann.json").write_text(
        json.dumps(
            {
                "images": images,
                "annotations": annotations,
                "categories": [{"id": 1, "name": "face"}],
            }
        )
    )
    (tmp_path / "data").mkdir()
    monkeypatch.setenv("FORTIS_TEST_S3_KEY", ACCESS_KEY)
    monkeypatch.setenv("FORTIS_TEST_S3_SECRET", SECRET_KEY)
    with s3rver(tmp_path / "s3", "team-data") as url:
        upload_tree(client(url), "team-data", local, "sets")
        stores = tmp_path / "stores.yaml"
        stores.write_text(
            f"s3:\n  tenants:\n    tenant-a:\n      team:\n"
            f"        access_key_id: env:FORTIS_TEST_S3_KEY\n"
            f"        secret_access_key: env:FORTIS_TEST_S3_SECRET\n"
            f"        endpoints: ['{url}']\n"
        )
        store = (
            f"{{s3: {{bucket: team-data, prefix: sets, endpoint_url: '{url}', credentials: team}}}}"
        )
        det, hf = _run(
            tmp_path,
            ["haar-face", "fmnist-cnn"],
            [
                _plan(
                    "coco-s3",
                    f"{{source: coco, path: coco/ann.json, images: coco/val, "
                    f"label_map: {{face: 0}}, store: {store}}}",
                    "haar-face",
                    "detection",
                ),
                _plan("hf-s3", f"{{source: hf, path: hf/fmnist, store: {store}}}"),
            ],
            stores,
            refused=(
                (
                    _plan(
                        "x",
                        "{source: hf, path: hf/fmnist, store: "
                        + store.replace("credentials: team", "credentials: other")
                        + "}",
                    ),
                    "FAILED_PRECONDITION",
                    "dataset.store.s3.credentials",
                ),
                (
                    _plan("x", f"{{source: hf, path: hf/nothing, store: {store}}}"),
                    "INVALID_ARGUMENT",
                    "not found under the S3 prefix",
                ),
                (
                    _plan(
                        "x",
                        "{source: hf, path: hf/fmnist, store: "
                        + store.replace("prefix: sets", "prefix: '../sets'")
                        + "}",
                    ),
                    "INVALID_ARGUMENT",
                    "dataset.store.s3.prefix",
                ),
            ),
        )
    acc = det["metrics"]["accuracy"]
    assert acc["m"] == 2 and acc["value"] == 1.0, acc
    assert hf["metrics"]["accuracy"]["m"] == 12
    # the plan in the report names the store and the credential's name, never a key
    text = json.dumps(det)
    assert "team-data" in text and ACCESS_KEY not in text


def _voc(root: Path) -> None:
    """A Pascal VOC root of the face samples: JPEGImages, Annotations (1-based inclusive
    pixel boxes, as VOC writes them), ImageSets/Main/val.txt."""
    for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (root / sub).mkdir(parents=True)
    ids = []
    for name, img, boxes in _face_samples():
        ids.append(name)
        cv2.imwrite(
            str(root / "JPEGImages" / f"{name}.jpg"),
            cv2.cvtColor(img, cv2.COLOR_RGB2BGR),
            [cv2.IMWRITE_JPEG_QUALITY, 95],
        )
        objects = "".join(
            f"<object><name>face</name><difficult>0</difficult><bndbox>"
            f"<xmin>{x1 + 1:.0f}</xmin><ymin>{y1 + 1:.0f}</ymin>"
            f"<xmax>{x2:.0f}</xmax><ymax>{y2:.0f}</ymax></bndbox></object>"
            for x1, y1, x2, y2 in boxes
        )
        (root / "Annotations" / f"{name}.xml").write_text(
            f"<annotation><filename>{name}.jpg</filename>{objects}</annotation>"
        )
    (root / "ImageSets" / "Main" / "val.txt").write_text("\n".join(ids) + "\n")


@pytest.mark.slow
def test_voc_and_webdataset_shards_from_s3_run_end_to_end(tmp_path, monkeypatch):
    """A VOC root and a WebDataset shard set (one sample per shard, read across the brace
    pattern) in an S3 prefix, evaluated through the services: the face detector finds the
    astronaut's face and nothing on the coffee photo in both, as it does from the data root."""
    local = tmp_path / "local"
    _voc(local / "voc" / "VOC2012")
    (local / "wds").mkdir(parents=True)
    for k, (key, img, boxes) in enumerate(_face_samples()):
        with tarfile.open(local / "wds" / f"faces-{k:03d}.tar", "w") as tf:
            ok, png = cv2.imencode(".png", cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
            build.add(tf, f"{key}.png", png.tobytes())
            build.add(
                tf,
                f"{key}.json",
                json.dumps({"boxes": boxes, "labels": ["face"] * len(boxes)}).encode(),
            )
    (tmp_path / "data").mkdir()
    monkeypatch.setenv("FORTIS_TEST_S3_KEY", ACCESS_KEY)
    monkeypatch.setenv("FORTIS_TEST_S3_SECRET", SECRET_KEY)
    with s3rver(tmp_path / "s3", "team-data") as url:
        upload_tree(client(url), "team-data", local, "sets")
        stores = tmp_path / "stores.yaml"
        stores.write_text(
            f"s3:\n  tenants:\n    tenant-a:\n      team:\n"
            f"        access_key_id: env:FORTIS_TEST_S3_KEY\n"
            f"        secret_access_key: env:FORTIS_TEST_S3_SECRET\n"
            f"        endpoints: ['{url}']\n"
        )
        store = (
            f"{{s3: {{bucket: team-data, prefix: sets, endpoint_url: '{url}', credentials: team}}}}"
        )
        voc, wds = _run(
            tmp_path,
            ["haar-face"],
            [
                _plan(
                    "voc-s3",
                    f"{{source: voc, path: voc/VOC2012, split: val, label_map: {{face: 0}}, "
                    f"store: {store}}}",
                    "haar-face",
                    "detection",
                ),
                _plan(
                    "wds-s3",
                    f"{{source: webdataset, path: 'wds/faces-{{000..001}}.tar', "
                    f"label_map: {{face: 0}}, store: {store}}}",
                    "haar-face",
                    "detection",
                ),
            ],
            stores,
            refused=(
                (
                    _plan(
                        "x",
                        f"{{source: voc, path: voc/VOC2012, split: test, label_map: {{face: 0}}, "
                        f"store: {store}}}",
                        "haar-face",
                        "detection",
                    ),
                    "INVALID_ARGUMENT",
                    "not found under the S3 prefix",
                ),
                (
                    _plan(
                        "x",
                        f"{{source: webdataset, path: 'wds/faces-{{000..002}}.tar', "
                        f"label_map: {{face: 0}}, store: {store}}}",
                        "haar-face",
                        "detection",
                    ),
                    "INVALID_ARGUMENT",
                    "wds/faces-002.tar",
                ),
            ),
        )
    for report in (voc, wds):
        acc = report["metrics"]["accuracy"]
        assert acc["m"] == 2 and acc["value"] == 1.0, acc
        assert ACCESS_KEY not in json.dumps(report)
