"""Small array helpers shared by every service: one definition each (no copies).

Pure numpy, no gRPC. Distances are measured on the [0, 1] pixel scale of uint8 images
(IEEE-A9: the bound of an attack is fixed in that scale); IoU is the plain area ratio of
axis-aligned xyxy boxes (IEEE-C4 matching, PER-2 detection criteria).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

__all__ = ["chunk_slices", "iou_xyxy", "l2_distance", "linf_distance"]


def chunk_slices(n: int, size: int) -> Iterator[slice]:
    """``slice``s covering ``range(n)`` in consecutive pieces of at most ``size`` (>= 1)."""
    step = max(1, int(size))
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))


def l2_distance(original: np.ndarray, perturbed: np.ndarray) -> float:
    """``||(perturbed - original) / 255||_2`` over all values of two uint8 images."""
    d = (np.asarray(perturbed, dtype=np.float64) - np.asarray(original, dtype=np.float64)) / 255.0
    return float(np.sqrt(np.sum(d * d)))


def linf_distance(original: np.ndarray, perturbed: np.ndarray) -> float:
    """``max |perturbed - original| / 255`` of two uint8 images (0 for empty arrays)."""
    diff = np.abs(np.asarray(perturbed, dtype=np.int16) - np.asarray(original, dtype=np.int16))
    return float(diff.max()) / 255.0 if diff.size else 0.0


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
    area_x = np.clip(x[:, 2] - x[:, 0], 0.0, None) * np.clip(x[:, 3] - x[:, 1], 0.0, None)
    area_y = np.clip(y[:, 2] - y[:, 0], 0.0, None) * np.clip(y[:, 3] - y[:, 1], 0.0, None)
    union = area_x[:, None] + area_y[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)
