"""IEEE-A3 weather corruptions but frost (``frost.py``): ImageNet-C snow
(``imagenet_c_snow``), fog (``imagenet_c_fog``, on the shared diamond-square map of
``plasma.py``), brightness and spatter. The PER-1 properties ``per_snow``/``per_fog`` are
different algorithms with an epsilon knob (``properties``)."""

from __future__ import annotations

import functools

import cv2
import numpy as np
from fortis.services.perturbation.corruptions import sampling
from fortis.services.perturbation.corruptions.blur import clipped_zoom, one_sided_motion_blur
from fortis.services.perturbation.corruptions.pixels import gauss, plane
from fortis.services.perturbation.corruptions.plasma import (
    diamond_square,
    imagenet_c_noise,
    plasma_mapsize,
)

# Severity tables (index 0 = severity 1). ImageNet-C values from imagecorruptions 1.1.2.

#: x' = (x + c0*plasma) * max(x) / (max(x) + c0).
FOG_PARAMS = ((1.5, 2), (2.0, 2), (2.5, 1.7), (2.5, 1.5), (3.0, 1.4))
#: IEEE-A3 / A4 brightness: value added to V of HSV, [0, 1] scale.
BRIGHTNESS_DELTA = (0.1, 0.2, 0.3, 0.4, 0.5)
#: IEEE-A3 snow: (flake mean, flake std, flake zoom, threshold, streak radius, streak sigma,
#: image blend weight); streak angle uniform in [-135, -45) degrees.
SNOW_PARAMS = ((0.1, 0.3, 3, 0.5, 10, 4, 0.8),
               (0.2, 0.3, 2, 0.5, 12, 4, 0.7),
               (0.55, 0.3, 4, 0.9, 12, 8, 0.7),
               (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
               (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55))
SNOW_ANGLE_RANGE = (-135.0, -45.0)


#: IEEE-A3 spatter: (liquid mean, liquid std, liquid blur sigma px, threshold, intensity,
#: mode). Mode 0 = liquid: pale-turquoise water drops with embossed edges, x' = x + m * colour
#: with m the drop mask scaled to max ``intensity``; mode 1 = mud: brown blobs, x' = x (1 - m)
#: + m * colour with m the thresholded mask blurred with sigma ``intensity``.
SPATTER_PARAMS = ((0.65, 0.3, 4, 0.69, 0.6, 0),
                  (0.65, 0.3, 3, 0.68, 0.6, 0),
                  (0.65, 0.3, 2, 0.68, 0.5, 0),
                  (0.65, 0.3, 1, 0.65, 1.5, 1),
                  (0.67, 0.4, 1, 0.65, 1.5, 1))
SPATTER_WATER_RGB = (175, 238, 238)      # pale turquoise
SPATTER_MUD_RGB = (63, 42, 20)           # mud brown
#: the reference's edge emboss kernel (liquid mode) and its grey weights (applied to R, G, B)
SPATTER_EMBOSS = ((-2, -1, 0), (-1, 1, 1), (0, 1, 2))
SPATTER_GREY = (0.2989, 0.5870, 0.1140)


def imagenet_c_snow(img: np.ndarray, params: tuple, rng: np.random.Generator) -> np.ndarray:
    """ImageNet-C snow: a thresholded, zoomed Gaussian flake layer streaked by the one-sided
    motion blur, over a greyed, brightened image (not the PER-1 ``per_snow``'s disk flakes)."""
    loc, scale, zoom, threshold, radius, sigma, blend = params
    h, w, c = img.shape
    z = sampling.standard_normal(rng, (h, w))
    layer = cv2.addWeighted(z, float(scale), z, 0.0, float(loc))        # N(loc, scale)
    layer = clipped_zoom(layer[:, :, None], zoom, crop=False)[:, :, 0]  # may be a row larger
    layer[layer < threshold] = 0
    np.clip(layer, 0.0, 1.0, out=layer)
    layer = one_sided_motion_blur(np.ascontiguousarray(layer), radius, sigma,
                                  rng.uniform(*SNOW_ANGLE_RANGE))
    flakes = np.rint(layer[:h, :w] * np.float32(255.0))    # cropped after the blur, as there
    flakes += flakes[::-1, ::-1]                           # and the same turned by 180 degrees
    x = plane(img).astype(np.float32)
    grey = x if c == 1 else cv2.cvtColor(x, cv2.COLOR_RGB2GRAY)
    lifted = cv2.addWeighted(grey, 1.5, grey, 0.0, 127.5)          # grey * 1.5 + 0.5, levels
    if c == 3:      # (numpy's broadcasting of HxW against HxWx3 is slow: merge instead)
        lifted, flakes = cv2.merge([lifted] * 3), cv2.merge([flakes] * 3)
    y = cv2.addWeighted(x, float(blend), cv2.max(x, lifted), 1.0 - float(blend), 0.0)
    return cv2.add(y, flakes.astype(np.float32), dtype=cv2.CV_8U)


def imagenet_c_fog(img: np.ndarray, params: tuple[float, float],
                   rng: np.random.Generator) -> np.ndarray:
    """ImageNet-C fog: x' = (x + c0 plasma) * max(x) / (max(x) + c0), plasma the
    diamond-square map normalised to [0, 1] (not the PER-1 ``per_fog``, whose strength and
    decay follow epsilon)."""
    strength, decay = params
    h, w, c = img.shape
    mapsize = plasma_mapsize(h, w)
    max_val = float(img.max()) / 255.0
    plasma = diamond_square(mapsize, decay, imagenet_c_noise(rng))
    lo, hi = float(plasma.min()), float(plasma.max())
    k = 255.0 * strength / (hi - lo) if hi > lo else 0.0
    crop = plasma[:h, :w]
    haze = cv2.addWeighted(crop, k, crop, 0.0, -lo * k, dtype=cv2.CV_32F)   # 255 c0 plasma
    if c == 3:
        haze = cv2.merge([haze, haze, haze])
    # (x + c0 plasma) * max(x) / (max(x) + c0), in levels
    scale = max_val / (max_val + strength)
    return cv2.addWeighted(plane(img), scale, haze, scale, 0.0, dtype=cv2.CV_8U)


@functools.cache
def _brightness_scale(delta: float) -> np.ndarray:
    """Per value level v: the factor that takes V = v to min(v + 255 delta, 255); level 0
    (black, any hue) maps to the grey min(255 delta, 255) via ``brightness``."""
    v = np.arange(256, dtype=np.float64)
    nv = np.minimum(v / 255.0 + delta, 1.0) * 255.0
    scale = np.divide(nv, v, out=np.zeros_like(v), where=v > 0)
    return scale.astype(np.float32)


def brightness(img: np.ndarray, delta: float, rng: np.random.Generator) -> np.ndarray:
    # HSV: each RGB component is V times a factor set by (H, S); raising V to V' with H, S
    # fixed scales the pixel by V'/V (exactly skimage rgb2hsv -> V += c -> hsv2rgb).
    c = img.shape[2]
    if c == 1:
        value = img[:, :, 0]
    else:
        r, g, b = cv2.split(img)
        value = cv2.max(cv2.max(r, g), b)
    gain = cv2.LUT(value, _brightness_scale(delta))
    src = img
    black = value == 0
    if black.any():                  # V = 0: the grey V' (hsv2rgb of an undefined hue)
        src = img.copy()
        src[black] = 1
        gain[black] = min(255.0 * delta, 255.0)
    if c == 3:
        gain = cv2.merge([gain, gain, gain])
    return cv2.multiply(plane(src), gain, dtype=cv2.CV_8U)


def spatter(x: np.ndarray, params: tuple, rng: np.random.Generator) -> np.ndarray:
    loc, scale, sigma, threshold, intensity, mode = params
    h, w, c = x.shape
    liquid = gauss(rng.normal(loc, scale, (h, w)), sigma)     # float64, as the reference
    liquid[liquid < threshold] = 0
    if mode == 0:      # liquid: water drops, brighter towards embossed edges
        drops = (np.clip(liquid, 0.0, 1.0) * 255).astype(np.uint8)      # truncation, as there
        dist = cv2.distanceTransform(255 - cv2.Canny(drops, 50, 150), cv2.DIST_L2, 5)
        _, dist = cv2.threshold(dist, 20, 20, cv2.THRESH_TRUNC)
        dist = cv2.equalizeHist(cv2.blur(dist, (3, 3)).astype(np.uint8))
        dist = cv2.filter2D(dist, cv2.CV_8U, np.array(SPATTER_EMBOSS, dtype=np.float32))
        dist = cv2.blur(dist, (3, 3)).astype(np.float32)
        mask = drops * dist
        top = float(mask.max())
        if top <= 0:
            return x.copy()
        mask *= np.float32(intensity / top)
        colour = mask[:, :, None] * (np.array(SPATTER_WATER_RGB, np.float32) / 255.0)
        if c == 1:
            colour = np.clip(colour, 0.0, 1.0) @ np.array(SPATTER_GREY, np.float32)
            return x + colour[:, :, None]
        return x + colour
    # mud: opaque brown blobs
    mask = gauss((liquid > threshold).astype(np.float32), intensity)
    mask[mask < 0.8] = 0
    colour = mask[:, :, None] * (np.array(SPATTER_MUD_RGB, np.float32) / 255.0)
    if c == 1:
        colour = (colour @ np.array(SPATTER_GREY, np.float32))[:, :, None]
    return x * (1.0 - mask[:, :, None]) + colour
