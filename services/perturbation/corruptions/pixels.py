"""Pixel-format helpers shared by the corruption families: uint8 <-> float32 in one OpenCV pass,
the trailing channel axis OpenCV drops, and the skimage-compatible Gaussian blur the ImageNet-C
reference uses (``gauss``). One copy, so every family rounds and blurs the same way."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import cv2
import numpy as np
from fortis.services.perturbation.spec import hwc

#: OpenCV, for the calls its type stubs describe too narrowly (a number as the second operand
#: of ``compare``, no second map for ``remap`` with fixed-point nearest maps)
cv_any: Any = cv2


#: A corruption's implementation: (uint8 HxWxC image, the severity's table entry, rng) -> a
#: uint8 image with H*W*C values (HxWxC or HxW; ``apply_corruption`` reshapes).
Impl = Callable[[np.ndarray, Any, np.random.Generator], np.ndarray]


def to_float(image: np.ndarray) -> np.ndarray:
    """uint8 HxWxC -> float32 HxWxC in [0, 1] (a new array)."""
    h, w, c = image.shape
    return hwc(cv2.addWeighted(image, 1.0 / 255.0, image, 0.0, 0.0, dtype=cv2.CV_32F), c)


def to_u8(y: np.ndarray, scale: float = 1.0, offset: float = 0.0) -> np.ndarray:
    """float (any shape OpenCV takes) -> uint8 ``y * scale + offset``, rounded half to even
    and saturated, in one pass."""
    return cv2.addWeighted(y, scale, y, 0.0, offset, dtype=cv2.CV_8U)


def to_uint8(x: np.ndarray) -> np.ndarray:
    """float [0, 1] -> uint8 (rounded, saturated)."""
    return to_u8(x, 255.0)


def plane(img: np.ndarray) -> np.ndarray:
    """HxWx1 -> HxW (a view) for OpenCV calls whose output must be 2-D; HxWx3 unchanged."""
    return img[:, :, 0] if img.shape[2] == 1 else img


def gauss(x: np.ndarray, sigma: float, truncate: float = 4.0,
          border: int = cv2.BORDER_REPLICATE) -> np.ndarray:
    """Gaussian blur of an HxWxC (or HxW) float image, like skimage.filters.gaussian (mode
    'nearest', truncate 4): kernel half-width int(truncate*sigma + 0.5), capped at the longer
    side."""
    h, w = x.shape[:2]
    half = min(int(truncate * sigma + 0.5), max(h, w))
    k = 2 * half + 1
    out = cv2.GaussianBlur(x, (k, k), sigmaX=sigma, sigmaY=sigma, borderType=border)
    return out.reshape(x.shape)


def float_impl(fn: Callable[[np.ndarray, Any, np.random.Generator], np.ndarray]) -> Impl:
    """A corruption written on float32 [0, 1] images as a uint8 -> uint8 one."""
    @functools.wraps(fn)
    def run(img: np.ndarray, param: Any, rng: np.random.Generator) -> np.ndarray:
        return to_uint8(fn(to_float(img), param, rng))
    return run
