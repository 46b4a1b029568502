"""Helpers the PER-1 properties share: the epsilon interpolation, the ``direction`` and
``angle_deg`` parameters (re-checked here so a direct call with bad values fails clearly too; the
registry validates types and ranges first), the centred line kernel of the motion blur and the
snow streaks, and a reflected-border filter."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import cv2
import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.spec import hwc

Params = Mapping[str, Any]


def lerp(ends: tuple[float, float], eps: float) -> float:
    return ends[0] + eps * (ends[1] - ends[0])


def centred_line_kernel(length: float, angle_deg: float) -> np.ndarray:
    """Normalised motion kernel: a centred segment ``length`` px long (<= 1: identity) at
    ``angle_deg`` (0 = horizontal, 90 = vertical, counter-clockwise), sampled every 0.25 px and
    splatted bilinearly, so the kernel grows continuously with the length."""
    if length <= 1.0:
        return np.ones((1, 1), np.float32)
    half = (length - 1.0) / 2.0
    a = math.radians(angle_deg)
    dx, dy = math.cos(a), -math.sin(a)
    r = int(math.ceil(half)) + 1
    kernel = np.zeros((2 * r + 1, 2 * r + 1), np.float64)
    t = np.linspace(-half, half, max(2, int(math.ceil(4 * length))))
    xs, ys = r + t * dx, r + t * dy
    x0, y0 = np.floor(xs).astype(np.intp), np.floor(ys).astype(np.intp)
    fx, fy = xs - x0, ys - y0
    for oy, ox, wt in ((0, 0, (1 - fx) * (1 - fy)), (0, 1, fx * (1 - fy)),
                       (1, 0, (1 - fx) * fy), (1, 1, fx * fy)):
        np.add.at(kernel, (y0 + oy, x0 + ox), wt)
    return (kernel / kernel.sum()).astype(np.float32)


def filter_reflect(x: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """Correlate an HxWxC float image with ``kernel`` (reflected border, OpenCV's default)."""
    if kernel.shape == (1, 1):
        return x.copy()
    return hwc(cv2.filter2D(x, -1, kernel, borderType=cv2.BORDER_REFLECT_101), x.shape[2])


def pixel_centre(h: int, w: int) -> tuple[float, float]:
    """The pixel-centre of the image, (x, y). (The code uses (w/2, h/2), half a pixel off.)"""
    return ((w - 1) / 2.0, (h - 1) / 2.0)


def direction(params: Params) -> int:
    v = params.get("direction", 1)
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating) \
            or v not in (1, -1):
        raise InvalidArgument("params.direction", f"must be +1 or -1, got {v!r}")
    return int(v)


def angle_param(params: Params, default: float) -> float:
    v = params.get("angle_deg", default)
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating) \
            or not math.isfinite(float(v)):
        raise InvalidArgument("params.angle_deg", f"must be a finite number, got {v!r}")
    return float(v)
