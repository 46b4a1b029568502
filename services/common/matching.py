"""IEEE-C4 / IEEE-C5 matching arithmetic shared by the services that judge answers: one
definition each, so the scoring service's verdicts and the perturbation service's attack
criteria (``perturbation/judges.py``) apply the same rules.

- Boxes (IEEE-C4): :func:`to_xyxy` converts validated boxes in any of
  :data:`~fortis.services.common.criteria.BOX_FORMATS` to pixel xyxy (COCO convention: area =
  w * h); IoU is :func:`fortis.services.common.arrays.iou_xyxy`; :func:`match_objects` is the
  IEEE-C4 matching of one image's objects with one answer's boxes (greedy, one-to-one, by
  decreasing IoU, modes top1 / topk / threshold), the rule the scoring service's batched
  matching (``scoring/correctness/detection.py``) applies, checked equal on random answers
  (tests/unit/test_judges.py).
- Segmentation (IEEE-C5): :func:`iou_per_class` gives the per-image IoU of each class of
  interest between label maps (NaN where a class is absent from both), :func:`mean_iou`
  their mean over the classes present (NaN: none), and :func:`miou_correct` the verdict
  (mIoU strictly above the threshold; ``all_absent`` decides a NaN).

Pure numpy, no gRPC, no service imported.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
from fortis.services.common.criteria import (
    BOX_FORMATS,
    MAX_LISTED,
    is_number,
    raise_violations,
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
    """(n, 4) boxes in ``fmt`` -> pixel xyxy, with per-row (width, height) ``wh`` for the
    normalised formats. ``where(row)`` names a row in an error."""
    violations: list[FieldViolation] = []
    bad = ~np.isfinite(raw).all(axis=1)
    for r in np.flatnonzero(bad)[:MAX_LISTED]:
        violations.append(FieldViolation(where(int(r)), f"coordinates must be finite, got "
                                                        f"{raw[r].tolist()}"))
    if violations:
        return raw, violations
    b = raw
    if fmt.endswith("n"):
        out_of = ((b < 0.0) | (b > 1.0)).any(axis=1)
        for r in np.flatnonzero(out_of)[:MAX_LISTED]:
            violations.append(FieldViolation(
                where(int(r)), f"normalised '{fmt}' coordinates must be in [0, 1], got "
                               f"{b[r].tolist()} (pixel boxes given as normalised?)"))
        if violations:
            return raw, violations
        assert wh is not None
        b = b * np.concatenate([wh, wh], axis=1)
        fmt = fmt[:-1]
    if fmt == "xyxy":
        w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
        xyxy = b
    else:
        w, h = b[:, 2], b[:, 3]
        if fmt == "xywh":
            x1, y1 = b[:, 0], b[:, 1]
        else:                                               # cxcywh
            x1, y1 = b[:, 0] - w / 2.0, b[:, 1] - h / 2.0
        xyxy = np.stack([x1, y1, x1 + w, y1 + h], axis=1)
    degenerate = ~((w > 0) & (h > 0))
    for r in np.flatnonzero(degenerate)[:MAX_LISTED]:
        what = "zero-area box" if (w[r] == 0 or h[r] == 0) else "negative width or height"
        hint = " (x2 < x1 or y2 < y1: is it 'xywh'?)" if fmt == "xyxy" and what != \
            "zero-area box" else ""
        violations.append(FieldViolation(where(int(r)), f"{what} {raw[r].tolist()} in "
                                                        f"'{fmt}'{hint}: boxes need w, h > 0"))
    return xyxy, violations


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


def match_objects(iou: np.ndarray, obj_labels: np.ndarray, labels: np.ndarray,
                  scores: np.ndarray, *, iou_threshold: float,
                  score_threshold: float | None = None, mode: str = "threshold",
                  k: int = 5) -> np.ndarray:
    """IEEE-C4 for one image: which of its s objects are found by the answer's p boxes.

    ``iou`` (s, p) IoU of objects x boxes; ``obj_labels`` (s,) / ``labels`` (p,) 0-based
    classes; ``scores`` (p,). A box is a candidate for an object when IoU > ``iou_threshold``
    and (``score_threshold`` set) score >= it. Candidate pairs are visited by decreasing IoU
    (ties: higher score, lower box index, lower object index); a pair whose object is already
    matched or whose box is already taken is skipped; otherwise the box is the object's next
    ranked prediction: it matches (and is taken) when its class agrees and its rank is within
    1 (``top1``), ``k`` (``topk``) or any (``threshold``); a box of another class is not
    taken but uses up one of the object's ranks. -> (s,) bool."""
    s, p = iou.shape
    found = np.zeros(s, bool)
    if s == 0 or p == 0:
        return found
    sc = np.where(np.isnan(scores), -np.inf, np.asarray(scores, dtype=np.float64))
    cand = iou > iou_threshold
    if score_threshold is not None:
        cand &= (sc >= score_threshold)[None, :]
    oi, pi = np.nonzero(cand)
    if not len(oi):
        return found
    order = np.lexsort((oi, pi, -sc[pi], -iou[oi, pi]))
    limit = 1 if mode == "top1" else int(k) if mode == "topk" else p + 1
    rank = np.zeros(s, np.int64)
    taken = np.zeros(p, bool)
    for j in order.tolist():
        o, b = int(oi[j]), int(pi[j])
        if found[o] or taken[b]:
            continue
        rank[o] += 1
        if labels[b] == obj_labels[o] and rank[o] <= limit:
            found[o] = True
            taken[b] = True
    return found


def class_slots(x: np.ndarray, classes_sorted: np.ndarray) -> np.ndarray:
    """Label map -> slot of each pixel's class among the classes of interest (Y: any other).
    A lookup table when the labels are small non-negative integers (one gather per pixel),
    else a binary search."""
    y = len(classes_sorted)
    dtype = np.uint8 if y < 250 else np.int64       # slots 0..Y+1 (see iou_per_class)
    if x.size == 0:
        return np.zeros(x.shape, dtype)
    lo, hi = int(x.min()), int(x.max())
    if lo >= 0 and hi < (1 << 16):
        lut = np.full(hi + 1, y, dtype=dtype)
        inside = classes_sorted[classes_sorted <= hi]
        lut[inside] = np.searchsorted(classes_sorted, inside)
        return np.asarray(lut[x])
    pos = np.minimum(np.searchsorted(classes_sorted, x), y - 1)
    return np.where(classes_sorted[pos] == x, pos, y).astype(dtype)


def iou_per_class(pred: np.ndarray, truth: np.ndarray, cs: np.ndarray,
                   ignore: int | None) -> np.ndarray:
    """(n, H, W) label maps -> (n, Y) IoU per class of interest (NaN: absent from both).

    Each pixel gets a slot: its class's index among the Y classes, Y for "any other label",
    Y + 1 for "ignored". Few classes: one bincount of (image, truth slot, prediction slot)
    gives per-image confusion matrices. Many classes: three bincounts (truth count,
    prediction count, intersection), O(pixels + n * Y). No loop over classes or images."""
    n = len(pred)
    y = len(cs)
    w = y + 2
    t = truth.reshape(n, -1)
    gi = class_slots(t, cs)
    pi = class_slots(pred.reshape(n, -1), cs)
    if ignore is not None and t.size and int(t.min()) <= ignore <= int(t.max()):
        skip = t == ignore
        gi[skip] = y + 1
        pi[skip] = y + 1
    if w * w <= 256:
        code = gi.astype(np.uint16)
        code *= w
        code += pi
        flat = np.add(code, (np.arange(n, dtype=np.int64) * (w * w))[:, None], dtype=np.int64)
        conf = np.bincount(flat.ravel(), minlength=n * w * w).reshape(n, w, w)
        inter = np.diagonal(conf, axis1=1, axis2=2)[:, :y].astype(np.float64)
        gt_count = conf[:, :y, :].sum(axis=2)
        pred_count = conf[:, :, :y].sum(axis=1)
    else:
        base = (np.arange(n, dtype=np.int64) * w)[:, None]
        code_g = np.add(gi, base, dtype=np.int64).ravel()
        code_p = np.add(pi, base, dtype=np.int64).ravel()
        size = n * w
        gt_count = np.bincount(code_g, minlength=size).reshape(n, w)[:, :y]
        pred_count = np.bincount(code_p, minlength=size).reshape(n, w)[:, :y]
        same = (gi == pi).ravel()
        inter = np.bincount(code_g[same], minlength=size).reshape(n, w)[:, :y].astype(np.float64)
    union = gt_count + pred_count - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / np.maximum(union, 1), np.nan)


def mean_iou(iou: np.ndarray) -> np.ndarray:
    """(n, Y) per-class IoU (NaN: class absent from both) -> (n,) mean over the classes
    present; NaN when none is (IEEE-C5)."""
    present = ~np.isnan(iou)
    count = present.sum(axis=1)
    total = np.where(present, iou, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(np.where(count > 0, total / np.maximum(count, 1), np.nan))


def miou_correct(miou: np.ndarray, threshold: float, all_absent_correct: bool) -> np.ndarray:
    """IEEE-C5 verdicts: mIoU strictly above ``threshold``; an undefined (NaN) mIoU is
    ``all_absent_correct``."""
    m = np.asarray(miou, dtype=np.float64)
    return np.asarray(np.where(np.isnan(m), all_absent_correct, m > threshold), dtype=bool)
