"""PER-1 luminance, spatial, blur and noise properties: float32 HxWxC image in [0, 1], epsilon,
rng, params -> float image (the caller clips and rounds). Stochastic ones draw everything before
using epsilon (PER-3 coherence)."""

from __future__ import annotations

import math

import cv2
import numpy as np
from fortis.services.perturbation.corruptions.geometric import warp_black
from fortis.services.perturbation.properties.knobs import (
    Params,
    angle_param,
    centred_line_kernel,
    direction,
    filter_reflect,
    pixel_centre,
)
from fortis.services.perturbation.properties.tables import (
    BLENDED_NOISE_MAX,
    BRIGHTNESS_MAX_DELTA,
    CONTRAST_MAX,
    CONTRAST_TARGET,
    GAUSSIAN_BLUR_MAX_SIGMA_FRAC,
    GAUSSIAN_NOISE_MAX_STD,
    MOTION_BLUR_ANGLE_DEG,
    MOTION_BLUR_MAX_FRAC,
    ROT_TRANS_MAX_DEG,
    ROT_TRANS_MAX_SHIFT_FRAC,
    ROTATION_MAX_DEG,
    SALT_PEPPER_MAX,
    TRANSLATION_MAX_FRAC,
    UNIFORM_NOISE_MAX,
)
from fortis.services.perturbation.spec import hwc

# ---------------------------------------------------------------------------------------------
# Properties: float32 HxWxC image in [0, 1], epsilon, rng, params -> float image (the caller
# clips and rounds). Stochastic ones draw everything before using epsilon.
# ---------------------------------------------------------------------------------------------

def per_brightness(x: np.ndarray, eps: float, rng: np.random.Generator, p: Params) -> np.ndarray:
    return x + direction(p) * eps * BRIGHTNESS_MAX_DELTA


def per_contrast_reduction(x: np.ndarray, eps: float, rng: np.random.Generator,
                           p: Params) -> np.ndarray:
    c = eps * CONTRAST_MAX
    return (1.0 - c) * x + c * CONTRAST_TARGET


def per_rotation(x: np.ndarray, eps: float, rng: np.random.Generator, p: Params) -> np.ndarray:
    h, w, _ = x.shape
    angle = direction(p) * eps * ROTATION_MAX_DEG
    return warp_black(x, cv2.getRotationMatrix2D(pixel_centre(h, w), angle, 1.0))


def _whole_pixel_shift(x: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """Whole-pixel translation, black fill (the code's integer warpAffine shift)."""
    h, w, _ = x.shape
    out = np.zeros_like(x)
    if abs(dy) >= h or abs(dx) >= w:
        return out
    out[max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
        x[max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)]
    return out


def per_horizontal_translation(x: np.ndarray, eps: float, rng: np.random.Generator,
                               p: Params) -> np.ndarray:
    shift = direction(p) * int(round(eps * TRANSLATION_MAX_FRAC * x.shape[1]))
    return _whole_pixel_shift(x, 0, shift)


def per_vertical_translation(x: np.ndarray, eps: float, rng: np.random.Generator,
                             p: Params) -> np.ndarray:
    shift = direction(p) * int(round(eps * TRANSLATION_MAX_FRAC * x.shape[0]))
    return _whole_pixel_shift(x, shift, 0)


def per_rotation_translation(x: np.ndarray, eps: float, rng: np.random.Generator,
                             p: Params) -> np.ndarray:
    h, w, _ = x.shape
    d = direction(p)
    m = cv2.getRotationMatrix2D(pixel_centre(h, w), d * eps * ROT_TRANS_MAX_DEG, 1.0)
    m[0, 2] += d * eps * ROT_TRANS_MAX_SHIFT_FRAC * w
    m[1, 2] += d * eps * ROT_TRANS_MAX_SHIFT_FRAC * h
    return warp_black(x, m)


def per_motion_blur(x: np.ndarray, eps: float, rng: np.random.Generator, p: Params) -> np.ndarray:
    length = eps * MOTION_BLUR_MAX_FRAC * min(x.shape[0], x.shape[1])
    return filter_reflect(x, centred_line_kernel(length, angle_param(p, MOTION_BLUR_ANGLE_DEG)))


def per_gaussian_blur(x: np.ndarray, eps: float, rng: np.random.Generator,
                      p: Params) -> np.ndarray:
    h, w, c = x.shape
    sigma = eps * GAUSSIAN_BLUR_MAX_SIGMA_FRAC * max(h, w)
    if sigma < 1e-3:
        return x.copy()
    half = max(1, int(math.ceil(4.0 * sigma)))   # truncate at 4 sigma (scipy's default)
    k = 2 * half + 1
    return hwc(cv2.GaussianBlur(x, (k, k), sigmaX=sigma, sigmaY=sigma,
                                 borderType=cv2.BORDER_REFLECT), c)


def per_uniform_noise(x: np.ndarray, eps: float, rng: np.random.Generator,
                      p: Params) -> np.ndarray:
    u = rng.uniform(-1.0, 1.0, size=x.shape).astype(np.float32)
    return x + np.float32(eps * eps * UNIFORM_NOISE_MAX) * u


def per_gaussian_noise(x: np.ndarray, eps: float, rng: np.random.Generator,
                       p: Params) -> np.ndarray:
    n = rng.standard_normal(size=x.shape, dtype=np.float32)
    return x + np.float32(eps * eps * GAUSSIAN_NOISE_MAX_STD) * n


def per_blended_uniform_noise(x: np.ndarray, eps: float, rng: np.random.Generator,
                              p: Params) -> np.ndarray:
    r = rng.random(size=x.shape, dtype=np.float32)
    b = np.float32(eps * BLENDED_NOISE_MAX)
    return (1 - b) * x + b * r


def per_salt_and_pepper(x: np.ndarray, eps: float, rng: np.random.Generator,
                        p: Params) -> np.ndarray:
    u = rng.random(size=(x.shape[0], x.shape[1], 1))
    q = eps * SALT_PEPPER_MAX
    out = x.copy()
    out[np.broadcast_to(u >= 1.0 - q / 2.0, x.shape)] = 1.0
    out[np.broadcast_to(u < q / 2.0, x.shape)] = 0.0
    return out
