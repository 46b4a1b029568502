"""Validated IEEE-C4 box conversion and the per-image IEEE-C4 matching, for the services that
judge answers (the scoring service's verdicts, the perturbation service's attack criteria in
``perturbation/judges.py``); the rules themselves are :mod:`fortis.core.matching` and
:mod:`fortis.core.boxes`, defined once.

- Boxes (IEEE-C4): :func:`to_xyxy` converts validated boxes in any of
  :data:`~fortis.core.criteria.BOX_FORMATS` to pixel xyxy (COCO convention: area =
  w * h), raising :class:`InvalidArgument` naming the row; :func:`convert_box_rows` is the
  same conversion listing every problem as a :class:`FieldViolation`; :func:`match_objects`
  is the IEEE-C4 matching of one image's objects with one answer's boxes: the batched rule
  on a batch of one.
- Segmentation (IEEE-C5): :func:`iou_per_class`, :func:`mean_iou` and :func:`miou_correct`
  are :mod:`fortis.core.matching`'s, named here for the callers that import them from here.

Pure numpy, no gRPC, no service imported.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
from fortis.core.boxes import rows_to_xyxy
from fortis.core.criteria import (
    BOX_FORMATS,
    MAX_LISTED,
    is_number,
    raise_violations,
)
from fortis.core.matching import (
    class_slots,
    iou_per_class,
    match_batch,
    mean_iou,
    miou_correct,
    rank_limit,
)
from fortis.services.common.errors import FieldViolation, InvalidArgument

__all__ = ["check_image_size", "class_slots", "convert_box_rows", "iou_per_class",
           "match_objects", "mean_iou", "miou_correct", "to_xyxy"]


def check_image_size(size: Any) -> tuple[float, float] | None:
    if size is None:
        return None
    try:
        w, h = size
    except (TypeError, ValueError):
        return None
    if not (is_number(w) and is_number(h)) or not (w > 0 and h > 0) \
            or not math.isfinite(w) or not math.isfinite(h):
        return None
    return float(w), float(h)


def convert_box_rows(raw: np.ndarray, fmt: str, wh: np.ndarray | None,
                     where: Any) -> tuple[np.ndarray, list[FieldViolation]]:
    """(n, 4) boxes in ``fmt`` -> pixel xyxy (:func:`fortis.core.boxes.rows_to_xyxy`), with
    per-row (width, height) ``wh`` for the normalised formats. ``where(row)`` names a row in
    an error."""
    xyxy, problems = rows_to_xyxy(raw, fmt, wh, limit=MAX_LISTED)
    return xyxy, [FieldViolation(where(r), description) for r, description in problems]


def to_xyxy(boxes: npt.ArrayLike, box_format: str = "xyxy", *,
            image_size: tuple[int, int] | None = None, field: str = "boxes") -> np.ndarray:
    """Validated conversion of ``(n, 4)`` boxes in ``box_format`` to pixel xyxy (float64).

    Normalised formats need ``image_size`` = (width, height). Rejects non-finite values,
    zero- or negative-area boxes and normalised coordinates outside [0, 1], naming
    ``field[row]``."""
    if box_format not in BOX_FORMATS:
        raise InvalidArgument(f"{field}.box_format", f"must be one of {', '.join(BOX_FORMATS)}; "
                                                     f"got {box_format!r}")
    b = np.asarray(boxes, dtype=np.float64)
    if b.size == 0:
        b = b.reshape(0, 4)
    if b.ndim != 2 or b.shape[1] != 4:
        raise InvalidArgument(field, f"must be (n, 4), got shape {np.shape(boxes)}")
    wh = None
    if box_format.endswith("n"):
        size = check_image_size(image_size)
        if size is None:
            raise InvalidArgument(f"{field}.image_size", f"normalised '{box_format}' boxes need "
                                  f"image_size (width, height) > 0, got {image_size!r}")
        wh = np.broadcast_to(np.array(size), (len(b), 2))
    xyxy, violations = convert_box_rows(b, box_format, wh, lambda r: f"{field}[{r}]")
    raise_violations(violations)
    return xyxy


def match_objects(object_boxes: npt.ArrayLike, object_labels: npt.ArrayLike,
                  boxes: npt.ArrayLike, labels: npt.ArrayLike, scores: npt.ArrayLike, *,
                  iou_threshold: float, score_threshold: float | None = None,
                  mode: str = "threshold", k: int = 5) -> np.ndarray:
    """IEEE-C4 for one image: which of its s objects (``object_boxes`` (s, 4) pixel xyxy,
    ``object_labels`` (s,)) the answer's p boxes (``boxes`` (p, 4) pixel xyxy, ``labels``
    (p,), ``scores`` (p,)) find, in ``mode`` (top1 / topk with ``k`` / threshold): the
    batched rule :func:`fortis.core.matching.match_batch` on a batch of one. -> (s,) bool."""
    ob = np.asarray(object_boxes, dtype=np.float64).reshape(-1, 4)
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    return match_batch(ob, np.asarray(object_labels).reshape(-1), [len(ob)], b,
                       np.asarray(labels).reshape(-1), scores, [len(b)],
                       iou_threshold=iou_threshold, rank_limit=rank_limit(mode, k),
                       score_threshold=score_threshold).found
