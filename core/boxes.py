"""Detection boxes (IEEE-C4): conversion of any of the :data:`~fortis.core.task.BOX_FORMATS`
to pixel xyxy, and IoU. Pure numpy.

Coordinates are continuous (COCO convention: area = w * h, no +1). The conversion reports
what is wrong with a row (non-finite, normalised outside [0, 1], zero or negative area) as
``(row, description)`` pairs instead of raising, so that each caller names the row in its own
terms (a request field, a recorded answer).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["iou_xyxy", "pair_iou", "rows_to_xyxy"]

#: A problem found in one row of boxes: (row index, description).
Problem = tuple[int, str]


def rows_to_xyxy(raw: np.ndarray, fmt: str, wh: np.ndarray | None, *,
                 limit: int = 10) -> tuple[np.ndarray, list[Problem]]:
    """(n, 4) float boxes in ``fmt`` -> (pixel xyxy, problems). ``wh``: per-row (width,
    height), needed by the normalised formats. At most ``limit`` problems of a kind are
    listed; the conversion stops at the first kind found (non-finite, then out of [0, 1]),
    and the input is returned unconverted with them."""
    problems: list[Problem] = []
    bad = ~np.isfinite(raw).all(axis=1)
    for r in np.flatnonzero(bad)[:limit]:
        problems.append((int(r), f"coordinates must be finite, got {raw[r].tolist()}"))
    if problems:
        return raw, problems
    b = raw
    if fmt.endswith("n"):
        out_of = ((b < 0.0) | (b > 1.0)).any(axis=1)
        for r in np.flatnonzero(out_of)[:limit]:
            problems.append((int(r), f"normalised '{fmt}' coordinates must be in [0, 1], got "
                                     f"{b[r].tolist()} (pixel boxes given as normalised?)"))
        if problems:
            return raw, problems
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
    for r in np.flatnonzero(degenerate)[:limit]:
        what = "zero-area box" if (w[r] == 0 or h[r] == 0) else "negative width or height"
        hint = " (x2 < x1 or y2 < y1: is it 'xywh'?)" if fmt == "xyxy" and what != \
            "zero-area box" else ""
        problems.append((int(r), f"{what} {raw[r].tolist()} in '{fmt}'{hint}: boxes need "
                                 f"w, h > 0"))
    return xyxy, problems


def iou_xyxy(a: npt.ArrayLike, b: npt.ArrayLike) -> np.ndarray:
    """Pairwise IoU ``(n, m)`` of pixel xyxy boxes ``a`` (n x 4) and ``b`` (m x 4).

    No validation (callers validate formats first). Disjoint or touching boxes, and pairs of
    zero-area boxes, have IoU exactly 0."""
    x = np.asarray(a, dtype=np.float64).reshape(-1, 4)
    y = np.asarray(b, dtype=np.float64).reshape(-1, 4)
    iw = np.clip(np.minimum(x[:, None, 2], y[None, :, 2]) - np.maximum(x[:, None, 0], y[None, :, 0]),
                 0.0, None)
    ih = np.clip(np.minimum(x[:, None, 3], y[None, :, 3]) - np.maximum(x[:, None, 1], y[None, :, 1]),
                 0.0, None)
    inter = iw * ih
    union = _area(x)[:, None] + _area(y)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def pair_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise IoU of pixel xyxy boxes ``a[i]`` and ``b[i]`` (both ``(n, 4)``), the same
    values as :func:`iou_xyxy` gives for those pairs. The matching needs the IoU of a flat
    list of same-image (object, box) pairs only, where the pairwise form would build an
    ``(n, n)`` matrix."""
    iw = np.clip(np.minimum(a[:, 2], b[:, 2]) - np.maximum(a[:, 0], b[:, 0]), 0.0, None)
    ih = np.clip(np.minimum(a[:, 3], b[:, 3]) - np.maximum(a[:, 1], b[:, 1]), 0.0, None)
    inter = iw * ih
    union = _area(a) + _area(b) - inter
    return np.asarray(np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0))


def _area(x: np.ndarray) -> np.ndarray:
    return np.asarray(np.clip(x[:, 2] - x[:, 0], 0.0, None) * np.clip(x[:, 3] - x[:, 1], 0.0, None))
