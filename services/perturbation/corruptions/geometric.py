"""IEEE-A4 c) geometric corruptions (rotation, translation, scale, shear, affine) and the
IEEE-A5 mask (occlusion): Fortis additions with their own tables. ``warp_black`` is the one
bilinear, black-filled affine warp, shared with the PER-1 spatial properties."""

from __future__ import annotations

import math

import cv2
import numpy as np
from fortis.services.perturbation.spec import hwc

#: IEEE-A4 c) geometric transforms (Fortis). All: about the image centre, bilinear resampling,
#: pixels from outside the image filled with 0 (black); magnitudes fixed per severity, the rng
#: picks sign and direction.
#: rotation: angle in degrees, clockwise or counter-clockwise.
ROTATION_DEGREES = (5.0, 10.0, 15.0, 20.0, 30.0)
#: translation: shift as a fraction of (width, height) along a uniform random direction theta:
#: (dx, dy) = (f W cos theta, f H sin theta).
TRANSLATION_FRACTION = (0.05, 0.10, 0.15, 0.20, 0.25)
#: scale: zoom factor s; zoom in (x s) or out (x 1/s), equal chance.
SCALE_FACTOR = (1.1, 1.2, 1.3, 1.4, 1.5)
#: shear: shear angle in degrees, sign and axis (horizontal x' = x + tan(a) y, or vertical
#: y' = y + tan(a) x) random.
SHEAR_DEGREES = (5.0, 10.0, 15.0, 20.0, 30.0)
#: affine: (rotation degrees, relative scale change, shear degrees, translation as a fraction
#: of width/height), all at once. The rng picks the sign of rotation and shear, zoom in (1 + s)
#: or out (1 - s), and the translation direction (uniform angle; shift = frac*W*cos,
#: frac*H*sin).
AFFINE_PARAMS = ((5.0, 0.05, 3.0, 0.02),
                 (10.0, 0.10, 6.0, 0.04),
                 (15.0, 0.15, 9.0, 0.06),
                 (20.0, 0.20, 12.0, 0.08),
                 (30.0, 0.25, 15.0, 0.10))

#: IEEE-A5 occlusion (Fortis): fraction of the image area covered by one axis-aligned rectangle
#: (aspect ratio log-uniform in [1/2, 2], position uniform, fully inside the image) filled with
#: one random solid colour (uniform per channel). A random colour, not black, so that the mask
#: is visible on dark-background images such as Fashion-MNIST.
OCCLUSION_AREA = (0.05, 0.10, 0.20, 0.30, 0.40)
OCCLUSION_ASPECT_RANGE = (0.5, 2.0)


# IEEE-A4 c) geometric: one 2x2 linear map about the centre plus a shift, black fill

def warp_black(img: np.ndarray, m: np.ndarray) -> np.ndarray:
    """HxWxC image warped by the 2x3 affine map ``m`` (``cv2.warpAffine``'s convention),
    bilinear, pixels from outside the image black (OpenCV's default, which the PER-1 authors'
    code uses too). Any dtype OpenCV warps; returns HxWxC."""
    h, w, c = img.shape
    return hwc(cv2.warpAffine(img, m, (w, h), flags=cv2.INTER_LINEAR,
                              borderMode=cv2.BORDER_CONSTANT, borderValue=(0, 0, 0, 0)), c)


def warp_about_centre(img: np.ndarray, a: np.ndarray,
                      shift: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
    """Output pixel p shows the input at the point that the forward map x -> a (x - centre)
    + centre + shift sends to p; outside the image: 0."""
    h, w, _ = img.shape
    centre = np.array([(w - 1) / 2.0, (h - 1) / 2.0])
    return warp_black(img, np.hstack([a, (centre + np.asarray(shift) - a @ centre)[:, None]]))


def _rotation_matrix(degrees: float) -> np.ndarray:
    t = math.radians(degrees)
    return np.array([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]])


def rotation(img: np.ndarray, degrees: float, rng: np.random.Generator) -> np.ndarray:
    sign = float(rng.choice((-1.0, 1.0)))
    return warp_about_centre(img, _rotation_matrix(sign * degrees))


def translation(img: np.ndarray, frac: float, rng: np.random.Generator) -> np.ndarray:
    h, w, _ = img.shape
    direction = rng.uniform(0.0, 2.0 * math.pi)
    return warp_about_centre(img, np.eye(2),
                             (frac * w * math.cos(direction), frac * h * math.sin(direction)))


def scale(img: np.ndarray, factor: float, rng: np.random.Generator) -> np.ndarray:
    zoom_in = bool(rng.integers(2))
    return warp_about_centre(img, np.eye(2) * (factor if zoom_in else 1.0 / factor))


def shear(img: np.ndarray, degrees: float, rng: np.random.Generator) -> np.ndarray:
    sign = float(rng.choice((-1.0, 1.0)))
    horizontal = bool(rng.integers(2))
    k = math.tan(math.radians(sign * degrees))
    return warp_about_centre(img, np.array([[1.0, k], [0.0, 1.0]] if horizontal
                                           else [[1.0, 0.0], [k, 1.0]]))


def affine(img: np.ndarray, params: tuple[float, float, float, float],
           rng: np.random.Generator) -> np.ndarray:
    rot, dscale, shear, trans = params
    h, w, _ = img.shape
    rot_sign, shear_sign, zoom_sign = rng.choice((-1.0, 1.0), size=3)
    direction = rng.uniform(0.0, 2.0 * math.pi)
    sh = np.array([[1.0, math.tan(math.radians(shear_sign * shear))], [0.0, 1.0]])
    a = _rotation_matrix(rot_sign * rot) @ sh * (1.0 + zoom_sign * dscale)
    return warp_about_centre(img, a, (trans * w * math.cos(direction),
                                      trans * h * math.sin(direction)))


# IEEE-A5 mask

def occlusion(img: np.ndarray, frac: float, rng: np.random.Generator) -> np.ndarray:
    h, w, c = img.shape
    area = frac * h * w
    lo, hi = OCCLUSION_ASPECT_RANGE
    aspect = math.exp(rng.uniform(math.log(lo), math.log(hi)))     # height / width
    rh = int(np.clip(round(math.sqrt(area * aspect)), 1, h))
    rw = int(np.clip(round(area / rh), 1, w))
    rh = int(np.clip(round(area / rw), 1, h))   # re-balance if the width was clipped
    top = int(rng.integers(0, h - rh + 1))
    left = int(rng.integers(0, w - rw + 1))
    colour = rng.integers(0, 256, size=c).astype(np.uint8)
    out = img.copy()
    out[top:top + rh, left:left + rw, :] = colour
    return out
