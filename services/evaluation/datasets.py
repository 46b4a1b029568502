"""The plan's image source (IEEE-P3): built-in datasets available offline. Domain code.

    fashion-mnist     Fashion-MNIST (Debian dataset-fashion-mnist), 28x28 grey, ids fmnist-<split>-NNNNN
    imagenet-photos   natural photos available offline with their ImageNet labels, resized
                      (shorter side 256) and centre-cropped to 224x224, ids photo-<name>
    manifest          your own images with ground truth: a JSON-lines file (``dataset.path``,
                      on the evaluation service's disk), one image per line:
                        {"id": "img-1", "image": "photos/1.jpg", "labels": [3]}            classification
                        {"id": "img-2", "image": "2.png", "boxes": [[x1, y1, x2, y2]],
                         "labels": [0], "box_format": "xyxy", "label_base": 0}              detection (IEEE-C4)
                        {"id": "img-3", "image": "3.png", "mask": "3-mask.png"}            segmentation (IEEE-C5)
                      paths relative to the manifest; masks are PNGs of class indices

``dataset.label_map`` (IEEE-P6) maps dataset labels to the service's labels.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from fortis.services.common.errors import FailedPrecondition, InvalidArgument
from fortis.services.evaluation.plan import DatasetRef, Plan
from fortis.services.evaluation.runner import DatasetPort
from fortis.services.evaluation.stages.base import LabeledImage

#: A built-in image source: (split, offset, limit) of a dataset -> images with their dataset
#: labels. Wired in by the composition root (services/app.py) from the adapters' data sets,
#: so this service imports no model or data code.
BuiltinSource = Callable[[DatasetRef], list[LabeledImage]]


def _read_image(path: Path, field: str, flags: int = cv2.IMREAD_COLOR) -> np.ndarray:
    if not path.is_file():
        raise InvalidArgument(field, f"no such file: {path}")
    img = cv2.imread(str(path), flags)
    if img is None:
        raise InvalidArgument(field, f"not a readable PNG/JPEG: {path}")
    if flags == cv2.IMREAD_COLOR:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    return np.ascontiguousarray(img)


def read_manifest(plan: Plan) -> list[dict[str, Any]]:
    """The manifest's entries (selected by offset/limit), with images loaded and every problem
    named by line: ``dataset.path:LINE.field``."""
    path = Path(plan.dataset.path)
    if not path.is_file():
        raise InvalidArgument("dataset.path", f"no such manifest on the evaluation service: {path}")
    rows = []
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    for n, line in enumerate(lines[plan.dataset.offset:plan.dataset.offset + plan.dataset.limit],
                             start=plan.dataset.offset + 1):
        where = f"dataset.path:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(where, f"not JSON: {exc.msg}") from None
        if not isinstance(row, dict) or not isinstance(row.get("image"), str):
            raise InvalidArgument(f"{where}.image", "each line needs an 'image' path")
        img_path = (path.parent / row["image"])
        row["_image"] = _read_image(img_path, f"{where}.image")
        row.setdefault("id", img_path.stem)
        row["_where"] = where
        row["_dir"] = path.parent
        rows.append(row)
    ids = [str(r["id"]) for r in rows]
    if len(set(ids)) != len(ids):
        raise InvalidArgument("dataset.path", "image ids repeat in the manifest")
    return rows


def load_plan_truths(plan: Plan) -> dict[str, Any]:
    """Ground truth of a detection or segmentation plan, per image id: detection
    ``{boxes, labels, box_format, label_base, image_size}``; segmentation an HxW int array."""
    out: dict[str, Any] = {}
    for row in read_manifest(plan):
        iid, where = str(row["id"]), row["_where"]
        h, w = row["_image"].shape[:2]
        if plan.target.task == "detection":
            boxes = row.get("boxes")
            if not isinstance(boxes, list):
                raise InvalidArgument(f"{where}.boxes", "a detection manifest needs boxes per image (may be [])")
            labels = row.get("labels", [0] * len(boxes))
            if not isinstance(labels, list) or len(labels) != len(boxes):
                raise InvalidArgument(f"{where}.labels", "one label per box")
            out[iid] = {"boxes": boxes, "labels": labels, "box_format": row.get("box_format", "xyxy"),
                        "label_base": int(row.get("label_base", 0)), "image_size": [w, h]}
        elif plan.target.task == "segmentation":
            if not isinstance(row.get("mask"), str):
                raise InvalidArgument(f"{where}.mask", "a segmentation manifest needs a mask PNG per image")
            mask = _read_image(row["_dir"] / row["mask"], f"{where}.mask", cv2.IMREAD_UNCHANGED)
            if mask.ndim == 3:
                mask = mask[:, :, 0]
            if mask.shape != (h, w):
                raise InvalidArgument(f"{where}.mask", f"mask is {mask.shape[1]}x{mask.shape[0]}, image {w}x{h}")
            out[iid] = mask.astype(np.int64)
    return out


class PlanDatasets(DatasetPort):
    """The plan's images: a built-in source (by name) or a manifest."""

    def __init__(self, builtin: Mapping[str, BuiltinSource]) -> None:
        self.builtin = dict(builtin)

    def truths(self, plan: Plan) -> dict[str, Any]:
        return load_plan_truths(plan)

    def images(self, plan: Plan) -> list[LabeledImage]:
        ds = plan.dataset
        lm = ds.label_map
        if ds.source == "manifest":
            out: list[LabeledImage] = []
            for row in read_manifest(plan):
                truth_labels: tuple[int, ...] = ()
                if plan.target.task == "classification":
                    lab = row.get("labels")
                    lab = [lab] if isinstance(lab, int) else lab
                    if not isinstance(lab, list) or not lab:
                        raise InvalidArgument(f"{row['_where']}.labels", "a classification manifest needs labels per image")
                    truth_labels = tuple(lm.get(int(x), int(x)) for x in lab)
                out.append((str(row["id"]), row["_image"], truth_labels))
            return out
        source = self.builtin.get(ds.source)
        if source is None:
            raise FailedPrecondition(f"dataset source '{ds.source}' is not available on this server")
        try:
            rows = source(ds)
        except FileNotFoundError as exc:
            raise FailedPrecondition(str(exc)) from None
        return [(i, im, tuple(lm.get(lab, lab) for lab in labels)) for i, im, labels in rows]
