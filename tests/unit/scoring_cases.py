"""Hand-built inputs shared by the scoring unit tests (correctness for detection and
segmentation, the IEEE-M tree, CANARY): one definition each, imported by the test modules."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.correctness import (
    DetectionCriterion,
    Detections,
    SegmentationCriterion,
)


def fields(err: InvalidArgument) -> list[str]:
    """The field paths an :class:`InvalidArgument` names, in order."""
    return [v.field for v in err.violations]


def json_roundtrip(d: dict) -> dict:
    """``d`` through strict JSON (no NaN): what a report would carry."""
    return json.loads(json.dumps(d, allow_nan=False))


def gt(boxes: Sequence[Sequence[float]], labels: list[int], **kw: Any) -> Detections:
    return Detections(boxes=np.array(boxes, dtype=float).reshape(-1, 4), labels=labels, **kw)


def det(boxes: Sequence[Sequence[float]], labels: list[int],
        scores: list[float] | None = None, **kw: Any) -> Detections:
    return Detections(boxes=np.array(boxes, dtype=float).reshape(-1, 4), labels=labels,
                      scores=scores, **kw)


THRESH = DetectionCriterion(mode="threshold", iou_threshold=0.5)
TOP1 = DetectionCriterion(mode="top1", iou_threshold=0.5)

# A 10 x 10 object at the origin, and boxes sharing its top-left corner whose IoU with it is
# exactly their height / 10 (contained boxes: IoU = area ratio).
OBJ = [0.0, 0.0, 10.0, 10.0]


def inside(h: float) -> list[float]:
    return [0.0, 0.0, 10.0, h]


# IEEE-C5: 4 x 4 hand-built maps; classes of interest 1 and 2; 0 = background, 255 = ignore.
SEG_GT = np.array([[1, 1, 0, 0],
                   [1, 1, 0, 0],
                   [2, 2, 2, 0],
                   [255, 255, 0, 0]])
SEG_PRED = np.array([[1, 1, 1, 0],
                     [1, 0, 0, 0],
                     [2, 2, 0, 0],
                     [2, 2, 2, 2]])
# class 1: truth 4 px, pred 4 px, both 3 -> IoU 3 / 5 = 0.6
# class 2: the pred's 2s on row 3 at cols 0-1 are ignored (truth 255); truth 3 px, pred
#          2 (row 2) + 2 (row 3, cols 2-3) = 4 px, both 2 -> IoU 2 / 5 = 0.4
# mIoU = 0.5
SEG_CRIT = SegmentationCriterion(classes=(1, 2), miou_threshold=0.45)

# CANARY CAN-4: one 2 x 2 grey image and its adversarial example.
X_TINY = np.array([[[0.2], [0.4]], [[0.6], [0.8]]])[None]    # 1 x 2 x 2 x 1
XA_TINY = np.array([[[0.3], [0.4]], [[0.6], [0.5]]])[None]   # delta = [[0.1, 0], [0, -0.3]]
