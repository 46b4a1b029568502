"""Small datasets written in their real formats for the dataset reader tests: WebDataset shards
(tar members by key, as webdataset's TarWriter lays them out), Hugging Face folders written by
``datasets``' own ``save_to_disk``, and a COCO annotations file."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import cv2
import numpy as np


def png(value: int, h: int = 12, w: int = 10) -> bytes:
    ok, buf = cv2.imencode(".png", np.full((h, w, 3), value, np.uint8))
    assert ok
    return buf.tobytes()


def add(tf: tarfile.TarFile, name: str, data: bytes, **info: Any) -> None:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    for k, v in info.items():
        setattr(ti, k, v)
    tf.addfile(ti, io.BytesIO(data))


def shards(
    folder: Path, n_shards: int, per_shard: int, *, detection: bool = False
) -> list[tuple[str, int]]:
    """``folder/s-000.tar`` ..: sample k of shard s is key ``s{s}/k{k}``, its class
    ``(s * per_shard + k) % 3`` (a .cls, or a .json with one box for detection); returns the
    (key, class) of every sample in order."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for s in range(n_shards):
        with tarfile.open(folder / f"s-{s:03d}.tar", "w") as tf:
            for k in range(per_shard):
                key, cls = f"s{s}/k{k}", (s * per_shard + k) % 3
                add(tf, f"{key}.png", png(40 * cls))
                if detection:
                    add(
                        tf,
                        f"{key}.json",
                        json.dumps(
                            {"boxes": [[1, 2, 5, 6]], "labels": [["cat", "dog", "car"][cls]]}
                        ).encode(),
                    )
                else:
                    add(tf, f"{key}.cls", str(cls).encode())
                out.append((key, cls))
    return out


def hf_classification(
    folder: Path, labels: list[int], names: list[str], *, split: str | None = None
) -> None:
    """A Dataset (or a DatasetDict with ``split``) of small images, made by ``datasets``."""
    import datasets
    from PIL import Image

    feats = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=names)}
    )
    images = [
        Image.fromarray(np.full((12, 10, 3), 30 * (i % 8), np.uint8)) for i in range(len(labels))
    ]
    ds = datasets.Dataset.from_dict({"image": images, "label": labels}, features=feats)
    if split is not None:
        datasets.DatasetDict({split: ds}).save_to_disk(str(folder))
    else:
        ds.save_to_disk(str(folder))


def hf_detection(
    folder: Path, images: list[np.ndarray], objects: list[dict[str, Any]], names: list[str]
) -> None:
    """A detection Dataset: ``objects`` {bbox: [[x, y, w, h]], category: [i]} per image."""
    import datasets
    from PIL import Image

    feats = datasets.Features(
        {
            "image": datasets.Image(),
            "objects": {
                "bbox": datasets.List(datasets.List(datasets.Value("float32"), length=4)),
                "category": datasets.List(datasets.ClassLabel(names=names)),
            },
        }
    )
    datasets.Dataset.from_dict(
        {"image": [Image.fromarray(i) for i in images], "objects": objects}, features=feats
    ).save_to_disk(str(folder))
