"""What every CANARY metric module shares (seed 003): the result nodes and the image checks.
Domain code: no gRPC.

Every metric is a node ``{"value", "n", "status", "reason", ...}``: ``status`` is ``"ok"``,
``"not available"`` (an input the metric needs is missing, e.g. DISTS weights or a white-box
model) or ``"not applicable"`` (the metric has no meaning here, e.g. no successful adversarial
example); ``value`` is then ``None``, never 0. Images are N x H x W x C (or N x H x W grey),
uint8 (divided by 255) or float in [0, 1]: every distance is on the [0, 1] scale.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from fortis.services.common.errors import InvalidArgument

__all__ = [
    "NOT_APPLICABLE",
    "NOT_AVAILABLE",
    "OK",
    "check_images",
    "check_mask",
    "mean_node",
    "missing_node",
    "ok_node",
    "to_unit",
]

OK = "ok"
NOT_AVAILABLE = "not available"
NOT_APPLICABLE = "not applicable"

_RANGE_TOL = 1e-6  # float images may overshoot [0, 1] by rounding this much


def ok_node(value: float, n: int, **extra: Any) -> dict[str, Any]:
    """A computed metric."""
    return {"value": float(value), "n": int(n), "status": OK, "reason": None, **extra}


def missing_node(status: str, reason: str, n: int = 0, **extra: Any) -> dict[str, Any]:
    """A metric that could not be computed: ``value`` None with the reason, never 0."""
    return {"value": None, "n": int(n), "status": status, "reason": reason, **extra}


def mean_node(values: np.ndarray, *, empty_reason: str, **extra: Any) -> dict[str, Any]:
    """Mean of ``values`` or "not applicable" when there is none."""
    if values.size == 0:
        return missing_node(NOT_APPLICABLE, empty_reason, 0, **extra)
    return ok_node(float(np.mean(values)), int(values.size), **extra)


# --------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------


def check_images(images: Any, field: str) -> np.ndarray:
    """N x H x W x C (or N x H x W grey) uint8, or float in [0, 1]. Returns the array as given
    (4-D); :func:`to_unit` converts a slice to float64 [0, 1]."""
    a = np.asarray(images)
    if a.ndim == 3:
        a = a[..., None]
    if a.ndim != 4 or 0 in a.shape:
        raise InvalidArgument(field, f"must be N x H x W x C images (or N x H x W grey); "
                                     f"got shape {tuple(np.shape(images))}")
    if a.dtype == np.uint8:
        return a
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.floating):
        raise InvalidArgument(field, f"must be uint8 or float in [0, 1]; got dtype {a.dtype}")
    if not np.all(np.isfinite(a)):
        raise InvalidArgument(field, "contains NaN or infinite values")
    lo, hi = float(a.min()), float(a.max())
    if lo < -_RANGE_TOL or hi > 1.0 + _RANGE_TOL:
        raise InvalidArgument(field, f"float images must lie in [0, 1]; got [{lo:.4g}, {hi:.4g}]"
                                     " (uint8 images are scaled by 1/255)")
    return a


def to_unit(a: np.ndarray) -> np.ndarray:
    """uint8 -> float64 / 255; float -> float64 clipped to [0, 1]."""
    if a.dtype == np.uint8:
        return a.astype(np.float64) / 255.0
    return np.clip(a.astype(np.float64), 0.0, 1.0)


def check_mask(mask: Any, field: str, n: int) -> np.ndarray:
    m = np.asarray(mask)
    if m.shape != (n,):
        raise InvalidArgument(field, f"must be a boolean vector of length {n}; got shape {m.shape}")
    if m.dtype != np.bool_:
        if not np.issubdtype(m.dtype, np.integer) or not np.isin(m, (0, 1)).all():
            raise InvalidArgument(field, "must be boolean (or 0/1)")
        m = m.astype(bool)
    return m
