"""Small array helpers shared by every service: one definition each (no copies).

Pure numpy, no gRPC. Distances are measured on the [0, 1] pixel scale of uint8 images
(IEEE-A9: the bound of an attack is fixed in that scale). ``iou_xyxy`` (the plain area ratio
of axis-aligned xyxy boxes: IEEE-C4 matching, PER-2 detection criteria) is
:mod:`fortis.core.boxes`'s, named here for its callers.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from fortis.core.boxes import iou_xyxy  # noqa: F401 - re-exported

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
