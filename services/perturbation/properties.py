"""Real-world safety properties (PER-1), each with one knob epsilon in [0, 1] for the
minimal-perturbation search (PER-3).

Source: seed 004, Zhong, Hu, Chen, "Quantifying DNN Model Robustness to the Real-World
Threats" (DSN 2020), section II-B (Eq. 1-11), and the authors' open-source benchmark
(Baidu "Perceptron", ``perceptron/benchmarks/*.py``), whose search ranges give the strongest
setting (epsilon = 1) of each property. The algorithms are re-implemented here with numpy and
OpenCV; nothing is copied.

    PER-1 group   id                              epsilon = 1 (see ``EPSILON_ONE`` below)
    luminance     per_brightness                  x +- 1.0 (the whole [0, 1] range)
                  per_contrast_reduction          every pixel at the mid-grey 0.5
    spatial       per_rotation                    180 degrees about the centre
                  per_horizontal_translation      shifted by the whole width (black fill)
                  per_vertical_translation        shifted by the whole height
                  per_rotation_translation        180 degrees + a shift of 5/224 of W and H
    blur          per_motion_blur                 line kernel as long as min(H, W), vertical
                  per_gaussian_blur               sigma = 0.2 * max(H, W)
    corruption    per_uniform_noise               + U(-1, 1)       (eps * U(-eps, eps))
                  per_gaussian_noise              + N(0, 1/sqrt 3) (eps * N(0, eps/sqrt 3))
                  per_blended_uniform_noise       a uniform random image
                  per_salt_and_pepper             every pixel black or white
    weather       per_fog                         diamond-square fog, strength 3.5, decay 1.0
                  per_snow                        100 motion-blurred flakes
                  per_frost                       0.5 * x + 0.8 * procedural frost texture

The paper's text names 14 properties and counts 15; the authors' code also has frost, the 15th
(SPEC PER-1). Ids carry the ``per_`` prefix so they never clash with the corruptions of
IEEE-A1..A5 (``gaussian_noise``, ``fog``, ...), which are different algorithms at fixed severities.

Epsilon. Every property is a function of (image, epsilon, rng): epsilon = 0 gives the original
image exactly (a copy), epsilon = 1 the strongest setting above, and in between the parameter
moves linearly from "no change" to its epsilon = 1 value (for the additive noises the paper's
and code's ``eps * noise(eps)`` form makes the amplitude eps^2). Where the code's range does not
start at "no change" (fog strength starts at 1.0, frost's texture weight at 0.3, snow at 1
flake) the start is moved to zero so that epsilon = 0 is the original, as PER-3 needs; the
epsilon = 1 end is the code's.

Directions. The paper and the code search both signs of brightness, rotation and translation
(x +- eps; +-180 degrees; left/right, up/down). One epsilon knob is one direction, chosen with
the ``direction`` parameter (+1 default, -1 the other way); a search over both signs runs the
property twice.

Coherence along epsilon (PER-3). A stochastic property draws its whole random pattern (noise
field, flake positions, plasma map, frost texture) from ``rng`` before looking at epsilon, with
the same number and order of draws whatever epsilon is (0 included). So a generator in the same
state (the engine builds one per (seed, property, image), epsilon not in the key) gives the
same pattern at every epsilon, scaled by epsilon: a larger epsilon is a larger perturbation of
the same kind, and the L2 distance to the original does not decrease with epsilon for the
noises, blends, salt-and-pepper and snow (nested flake sets).

Images: uint8 HxW, HxWx1 or HxWx3 (RGB), any size >= 1x1; the result has the same shape and
dtype, rounded (not truncated) from float, and the input is never modified. Grey images are
processed as one channel (frost uses the texture's luminance). Every random draw comes from
the ``numpy.random.Generator`` passed in; deterministic properties never touch it.
Domain code: no gRPC.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal

import cv2
import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.spec import (
    ApplyContext,
    ApplyFn,
    Characterisation,
    Param,
    PerturbationSpec,
    check_image,
)

# ---------------------------------------------------------------------------------------------
# Parameter tables: the value of each property's parameter at epsilon = 1 ([0, 1] pixel scale
# unless stated). "code" = Perceptron, perceptron/benchmarks/<file>.py; "paper" = seed 004.
# ---------------------------------------------------------------------------------------------

#: per_brightness: x' = clip(x + direction * eps * delta). Paper Eq. 1 (x' = Clip(x +- eps));
#: the code scales by a factor searched up to 255 and down to 1/255, i.e. to the same ends (an
#: all-white or all-black image); delta = 1.0 reaches them.
BRIGHTNESS_MAX_DELTA = 1.0
#: per_contrast_reduction: x' = (1 - c) x + c * target, c = eps * max. Paper Eq. 2; code
#: contrast_reduction.py: threshold 1.0, target (min + max) / 2.
CONTRAST_MAX = 1.0
CONTRAST_TARGET = 0.5
#: per_rotation: angle = direction * eps * 180 degrees about the image centre, bilinear, black
#: fill. Paper Eq. 3 (+-180); code rotation.py: ang_range +-pi.
ROTATION_MAX_DEG = 180.0
#: per_horizontal/vertical_translation: shift = direction * round(eps * W) (or H) whole pixels,
#: black fill. Code translation.py: pixel shifts up to the image width (height).
TRANSLATION_MAX_FRAC = 1.0
#: per_rotation_translation: rotation eps * 180 degrees about the centre, then a shift of
#: eps * (5/224 W, 5/224 H), both signed by ``direction``, one bilinear warp. Code spatial.py:
#: angular limits +-pi, x/y shift limits +-5 px (on 224-px ImageNet inputs; relative here).
ROT_TRANS_MAX_DEG = 180.0
ROT_TRANS_MAX_SHIFT_FRAC = 5.0 / 224.0
#: per_motion_blur: a line kernel of length eps * min(H, W) px at ``angle_deg``. Code
#: motion_blur.py: kernel size up to min(h, w); paper Eq. 4 fixes the angle to vertical (90
#: degrees, the default here; the code's default motion_angle is 0 = horizontal).
MOTION_BLUR_MAX_FRAC = 1.0
MOTION_BLUR_ANGLE_DEG = 90.0
#: per_gaussian_blur: sigma = eps * 0.2 * max(H, W) px (reflected border). Code
#: gaussian_blur.py: epsilons in [0, 0.2], sigma = epsilon * max(h, w). Paper Eq. 5.
GAUSSIAN_BLUR_MAX_SIGMA_FRAC = 0.2
#: per_uniform_noise: x' = clip(x + eps * u), u ~ U(-eps * w, eps * w), w = 1.0: drawn once as
#: U(-1, 1) and scaled by eps^2. Paper Eq. 6; code additive_noise.py (AdditiveUniformNoise).
UNIFORM_NOISE_MAX = 1.0
#: per_gaussian_noise: x' = clip(x + eps * n), n ~ N(0, eps * s), s = 1/sqrt(3) (the std of
#: U(-1, 1)): drawn once as N(0, 1), scaled by eps^2 * s. Paper Eq. 7; code additive_noise.py.
GAUSSIAN_NOISE_MAX_STD = 1.0 / math.sqrt(3.0)
#: per_blended_uniform_noise: x' = (1 - eps) x + eps * r, r ~ U(0, 1) per value (one random
#: image). Paper Eq. 8; code blended_noise.py (the code draws up to 1000 random images until one
#: fools the model; without a model one image is drawn from the rng).
BLENDED_NOISE_MAX = 1.0
#: per_salt_and_pepper: p = eps * max of the pixels flipped (all channels of a pixel together):
#: u ~ U(0, 1) per pixel, salt (1) where u >= 1 - p/2, pepper (0) where u < p/2. Paper Eq. 9;
#: code salt_pepper.py (max_epsilon 1). One u per pixel: the flipped sets are nested in eps.
SALT_PEPPER_MAX = 1.0
#: per_fog: x' = (x + s * plasma) * max(x) / (max(x) + s), plasma = diamond-square map in [0, 1]
#: with wibble decay d. s = eps * 3.5, d = 2.3 + eps * (1.0 - 2.3). Paper Eq. 10; code fog.py:
#: cc0 = [1.0, 3.5] (strength, from 1.0 at eps -> 0: moved to 0 here), cc1 = [2.3, 1.0] (decay).
FOG_MAX_STRENGTH = 3.5
FOG_DECAY = (2.3, 1.0)           # (eps = 0, eps = 1)
#: per_snow: ceil(eps * 100) flakes added (white, clipped). Flake: a disk of squared radius
#: 0.1 * min(H, W) on a square of side min(H, W) // 10 ("one-hundredth of the image"),
#: motion-blurred by a line of 0.9 * (side // 2) px at ``angle_deg`` (45). Paper II-B-5b; code
#: snow.py (cc0 = [1, 100] flakes, angle 45). 100 positions are drawn once; eps uses the first n.
SNOW_MAX_FLAKES = 100
SNOW_SIDE_FRAC = 0.1
SNOW_RADIUS2_FRAC = 0.1
SNOW_STREAK_FRAC = 0.9
SNOW_ANGLE_DEG = 45.0
#: per_frost: x' = clip(a x + b F), a = 1 + eps * (0.5 - 1), b = eps * 0.8, F = a frost texture
#: generated procedurally from the rng (no image files). Code frost.py: cc0 = [1.0, 0.5] (image
#: weight), cc1 = [0.3, 0.8] (texture weight, from 0.3 at eps -> 0: moved to 0 here).
FROST_IMAGE_WEIGHT = (1.0, 0.5)   # (eps = 0, eps = 1)
FROST_TEXTURE_MAX = 0.8
#: Frost texture (Fortis; the code loads photos of frost, which Fortis does not ship): drawn on
#: a canvas whose longer side is 256 px, then resized to the image: a diamond-square haze
#: (decay FROST_HAZE_DECAY) plus FROST_SEEDS dendritic ice crystals, placed more densely towards
#: the borders (frost grows from the window frame): a needle of length U(FROST_NEEDLE) * 256 px
#: at a uniform angle carrying FROST_BRANCHES pairs of side branches at +-60 degrees (+- N(0, 8)
#: jitter), FROST_DEPTH levels deep, each branch U(0.6, 1) * 0.45 of its parent's remaining
#: length (see ``_frost_segments``); then a soft glow, fine grain, more haze towards the
#: borders, tinted ice-blue (FROST_TINT). All drawn from the rng.
FROST_CANVAS = 256
FROST_HAZE_DECAY = 1.5
FROST_SEEDS = 160
FROST_NEEDLE = (0.04, 0.16)
FROST_BRANCHES = 3
FROST_DEPTH = 2
FROST_TINT = (0.86, 0.93, 1.0)

#: The parameters at epsilon = 1 of every property, with where they come from (level_table).
EPSILON_ONE: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "per_brightness": {"delta": BRIGHTNESS_MAX_DELTA,
                       "source": "paper Eq. 1 (x +- eps); code brightness.py (to all-white/black)"},
    "per_contrast_reduction": {"contrast_reduction": CONTRAST_MAX, "target": CONTRAST_TARGET,
                               "source": "paper Eq. 2; code contrast_reduction.py threshold 1.0"},
    "per_rotation": {"angle_deg": ROTATION_MAX_DEG,
                     "source": "paper Eq. 3 (+-180 deg); code rotation.py ang_range +-pi"},
    "per_horizontal_translation": {"shift_frac_of_width": TRANSLATION_MAX_FRAC,
                                   "source": "code translation.py (shift up to the width)"},
    "per_vertical_translation": {"shift_frac_of_height": TRANSLATION_MAX_FRAC,
                                 "source": "code translation.py (shift up to the height)"},
    "per_rotation_translation": {"angle_deg": ROT_TRANS_MAX_DEG,
                                 "shift_frac": ROT_TRANS_MAX_SHIFT_FRAC,
                                 "source": "code spatial.py: +-pi, +-5 px on 224-px inputs"},
    "per_motion_blur": {"kernel_length_frac_of_min_side": MOTION_BLUR_MAX_FRAC,
                        "angle_deg": MOTION_BLUR_ANGLE_DEG,
                        "source": "code motion_blur.py (size up to min(h, w)); paper Eq. 4 "
                                  "(vertical)"},
    "per_gaussian_blur": {"sigma_frac_of_max_side": GAUSSIAN_BLUR_MAX_SIGMA_FRAC,
                          "source": "code gaussian_blur.py (eps in [0, 0.2] x max(h, w))"},
    "per_uniform_noise": {"half_width": UNIFORM_NOISE_MAX,
                          "source": "paper Eq. 6; code additive_noise.py (eps * U(-eps, eps))"},
    "per_gaussian_noise": {"std": GAUSSIAN_NOISE_MAX_STD,
                           "source": "paper Eq. 7; code additive_noise.py (std eps/sqrt 3)"},
    "per_blended_uniform_noise": {"blend": BLENDED_NOISE_MAX,
                                  "source": "paper Eq. 8; code blended_noise.py"},
    "per_salt_and_pepper": {"fraction": SALT_PEPPER_MAX,
                            "source": "paper Eq. 9; code salt_pepper.py max_epsilon 1"},
    "per_fog": {"strength": FOG_MAX_STRENGTH, "wibble_decay": FOG_DECAY[1],
                "source": "paper Eq. 10; code fog.py cc0 [1.0, 3.5], cc1 [2.3, 1.0]"},
    "per_snow": {"flakes": SNOW_MAX_FLAKES, "angle_deg": SNOW_ANGLE_DEG,
                 "source": "paper II-B-5b; code snow.py cc0 [1, 100], angle 45"},
    "per_frost": {"image_weight": FROST_IMAGE_WEIGHT[1], "texture_weight": FROST_TEXTURE_MAX,
                  "source": "code frost.py cc0 [1.0, 0.5], cc1 [0.3, 0.8]; procedural texture"},
})


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

Params = Mapping[str, Any]


def _hwc(x: np.ndarray, channels: int) -> np.ndarray:
    """OpenCV drops a trailing 1-channel axis: put it back."""
    return x.reshape(x.shape[0], x.shape[1], channels)


def _lerp(ends: tuple[float, float], eps: float) -> float:
    return ends[0] + eps * (ends[1] - ends[0])


def _line_kernel(length: float, angle_deg: float) -> np.ndarray:
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


def _filter(x: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """Correlate an HxWxC float image with ``kernel`` (reflected border, OpenCV's default)."""
    if kernel.shape == (1, 1):
        return x.copy()
    return _hwc(cv2.filter2D(x, -1, kernel, borderType=cv2.BORDER_REFLECT_101), x.shape[2])


def _warp(x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Affine warp (bilinear), pixels from outside the image black (as cv2.warpAffine's default,
    which the authors' code uses)."""
    h, w, c = x.shape
    return _hwc(cv2.warpAffine(x, m, (w, h), flags=cv2.INTER_LINEAR,
                               borderMode=cv2.BORDER_CONSTANT, borderValue=(0, 0, 0, 0)), c)


def _centre(h: int, w: int) -> tuple[float, float]:
    """The pixel-centre of the image, (x, y). (The code uses (w/2, h/2), half a pixel off.)"""
    return ((w - 1) / 2.0, (h - 1) / 2.0)


def _plasma(mapsize: int, decay: float, unit: list[np.ndarray]) -> np.ndarray:
    """Diamond-square height map (mapsize a power of two), values in [0, 1].

    The recurrence of the code's ``plasma_fractal`` (after FLHerne/mapgen): square and diamond
    centres = mean of their corners + wibble * U(-wibble, wibble), wibble = 100, divided by
    ``decay`` after each step. The uniform draws come precomputed in [-1, 1] (``unit``, from
    ``_plasma_draws``), so one set of draws gives a coherent map at any decay."""
    m = np.zeros((mapsize, mapsize), dtype=np.float64)
    step = mapsize
    wibble = 100.0
    k = 0
    while step >= 2:
        half = step // 2
        corners = m[0:mapsize:step, 0:mapsize:step]
        acc = corners + np.roll(corners, shift=-1, axis=0)
        acc += np.roll(acc, shift=-1, axis=1)
        m[half:mapsize:step, half:mapsize:step] = acc / 4 + wibble * wibble * unit[k]
        dr = m[half:mapsize:step, half:mapsize:step]
        ul = m[0:mapsize:step, 0:mapsize:step]
        lt = dr + np.roll(dr, 1, axis=0) + ul + np.roll(ul, -1, axis=1)
        m[0:mapsize:step, half:mapsize:step] = lt / 4 + wibble * wibble * unit[k + 1]
        tt = dr + np.roll(dr, 1, axis=1) + ul + np.roll(ul, -1, axis=0)
        m[half:mapsize:step, 0:mapsize:step] = tt / 4 + wibble * wibble * unit[k + 2]
        k += 3
        step //= 2
        wibble /= decay
    m -= m.min()
    top = m.max()
    return m / top if top > 0 else m


def _plasma_draws(mapsize: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The uniform draws of one diamond-square map, in [-1, 1], in the order ``_plasma`` uses."""
    out: list[np.ndarray] = []
    step = mapsize
    while step >= 2:
        n = mapsize // step
        for _ in range(3):
            out.append(rng.uniform(-1.0, 1.0, size=(n, n)))
        step //= 2
    return out


def _mapsize(h: int, w: int) -> int:
    """Smallest power of two >= max(h, w), at least 2 (the code's map_size)."""
    return max(2, 1 << (max(h, w) - 1).bit_length())


# ---------------------------------------------------------------------------------------------
# Parameter access (the registry validates types and ranges; these re-check what the
# algorithms rely on, so a direct call with bad values fails clearly too)
# ---------------------------------------------------------------------------------------------

def _direction(params: Params) -> int:
    v = params.get("direction", 1)
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating) \
            or v not in (1, -1):
        raise InvalidArgument("params.direction", f"must be +1 or -1, got {v!r}")
    return int(v)


def _angle(params: Params, default: float) -> float:
    v = params.get("angle_deg", default)
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating) \
            or not math.isfinite(float(v)):
        raise InvalidArgument("params.angle_deg", f"must be a finite number, got {v!r}")
    return float(v)


# ---------------------------------------------------------------------------------------------
# Properties: float32 HxWxC image in [0, 1], epsilon, rng, params -> float image (the caller
# clips and rounds). Stochastic ones draw everything before using epsilon.
# ---------------------------------------------------------------------------------------------

def _brightness(x: np.ndarray, eps: float, rng: np.random.Generator, p: Params) -> np.ndarray:
    return x + _direction(p) * eps * BRIGHTNESS_MAX_DELTA


def _contrast_reduction(x: np.ndarray, eps: float, rng: np.random.Generator,
                        p: Params) -> np.ndarray:
    c = eps * CONTRAST_MAX
    return (1.0 - c) * x + c * CONTRAST_TARGET


def _rotation(x: np.ndarray, eps: float, rng: np.random.Generator, p: Params) -> np.ndarray:
    h, w, _ = x.shape
    angle = _direction(p) * eps * ROTATION_MAX_DEG
    return _warp(x, cv2.getRotationMatrix2D(_centre(h, w), angle, 1.0))


def _shift(x: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """Whole-pixel translation, black fill (the code's integer warpAffine shift)."""
    h, w, _ = x.shape
    out = np.zeros_like(x)
    if abs(dy) >= h or abs(dx) >= w:
        return out
    out[max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
        x[max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)]
    return out


def _horizontal_translation(x: np.ndarray, eps: float, rng: np.random.Generator,
                            p: Params) -> np.ndarray:
    return _shift(x, 0, _direction(p) * int(round(eps * TRANSLATION_MAX_FRAC * x.shape[1])))


def _vertical_translation(x: np.ndarray, eps: float, rng: np.random.Generator,
                          p: Params) -> np.ndarray:
    return _shift(x, _direction(p) * int(round(eps * TRANSLATION_MAX_FRAC * x.shape[0])), 0)


def _rotation_translation(x: np.ndarray, eps: float, rng: np.random.Generator,
                          p: Params) -> np.ndarray:
    h, w, _ = x.shape
    d = _direction(p)
    m = cv2.getRotationMatrix2D(_centre(h, w), d * eps * ROT_TRANS_MAX_DEG, 1.0)
    m[0, 2] += d * eps * ROT_TRANS_MAX_SHIFT_FRAC * w
    m[1, 2] += d * eps * ROT_TRANS_MAX_SHIFT_FRAC * h
    return _warp(x, m)


def _motion_blur(x: np.ndarray, eps: float, rng: np.random.Generator, p: Params) -> np.ndarray:
    length = eps * MOTION_BLUR_MAX_FRAC * min(x.shape[0], x.shape[1])
    return _filter(x, _line_kernel(length, _angle(p, MOTION_BLUR_ANGLE_DEG)))


def _gaussian_blur(x: np.ndarray, eps: float, rng: np.random.Generator,
                   p: Params) -> np.ndarray:
    h, w, c = x.shape
    sigma = eps * GAUSSIAN_BLUR_MAX_SIGMA_FRAC * max(h, w)
    if sigma < 1e-3:
        return x.copy()
    half = max(1, int(math.ceil(4.0 * sigma)))   # truncate at 4 sigma (scipy's default)
    k = 2 * half + 1
    return _hwc(cv2.GaussianBlur(x, (k, k), sigmaX=sigma, sigmaY=sigma,
                                 borderType=cv2.BORDER_REFLECT), c)


def _uniform_noise(x: np.ndarray, eps: float, rng: np.random.Generator,
                   p: Params) -> np.ndarray:
    u = rng.uniform(-1.0, 1.0, size=x.shape).astype(np.float32)
    return x + np.float32(eps * eps * UNIFORM_NOISE_MAX) * u


def _gaussian_noise(x: np.ndarray, eps: float, rng: np.random.Generator,
                    p: Params) -> np.ndarray:
    n = rng.standard_normal(size=x.shape, dtype=np.float32)
    return x + np.float32(eps * eps * GAUSSIAN_NOISE_MAX_STD) * n


def _blended_uniform_noise(x: np.ndarray, eps: float, rng: np.random.Generator,
                           p: Params) -> np.ndarray:
    r = rng.random(size=x.shape, dtype=np.float32)
    b = np.float32(eps * BLENDED_NOISE_MAX)
    return (1 - b) * x + b * r


def _salt_and_pepper(x: np.ndarray, eps: float, rng: np.random.Generator,
                     p: Params) -> np.ndarray:
    u = rng.random(size=(x.shape[0], x.shape[1], 1))
    q = eps * SALT_PEPPER_MAX
    out = x.copy()
    out[np.broadcast_to(u >= 1.0 - q / 2.0, x.shape)] = 1.0
    out[np.broadcast_to(u < q / 2.0, x.shape)] = 0.0
    return out


def _fog(x: np.ndarray, eps: float, rng: np.random.Generator, p: Params) -> np.ndarray:
    h, w, _ = x.shape
    size = _mapsize(h, w)
    draws = _plasma_draws(size, rng)
    strength = eps * FOG_MAX_STRENGTH
    plasma = _plasma(size, _lerp(FOG_DECAY, eps), draws)[:h, :w, None].astype(np.float32)
    max_val = float(x.max())
    return (x + strength * plasma) * max_val / (max_val + strength) if max_val + strength > 0 \
        else x.copy()


def _snow_flake(h: int, w: int, angle_deg: float) -> np.ndarray:
    """One motion-blurred flake (float, peak <= 1), as the code's snow.py builds it: a disk of
    squared radius 0.1 * min(H, W) on a square of side min(H, W) // 10, blurred by a line of
    0.9 * (side // 2) px; padded so the streak is not cut."""
    m = min(h, w)
    side = max(3, int(m * SNOW_SIDE_FRAC))
    radius = min(math.sqrt(SNOW_RADIUS2_FRAC * m), side / 2.0)
    kernel = _line_kernel(max(1.0, SNOW_STREAK_FRAC * (side // 2)), angle_deg)
    pad = kernel.shape[0] // 2
    n = side + 2 * pad
    yy, xx = np.mgrid[0:n, 0:n].astype(np.float32)
    c = (n - 1) / 2.0
    disk = ((yy - c) ** 2 + (xx - c) ** 2 <= radius ** 2).astype(np.float32)
    if kernel.shape == (1, 1):
        return disk
    return cv2.filter2D(disk, -1, kernel, borderType=cv2.BORDER_CONSTANT)


def _snow(x: np.ndarray, eps: float, rng: np.random.Generator, p: Params) -> np.ndarray:
    h, w, _ = x.shape
    flake = _snow_flake(h, w, _angle(p, SNOW_ANGLE_DEG))
    fh, fw = flake.shape
    ys = rng.integers(0, max(1, h - fh + 1), size=SNOW_MAX_FLAKES)
    xs = rng.integers(0, max(1, w - fw + 1), size=SNOW_MAX_FLAKES)
    n = int(math.ceil(eps * SNOW_MAX_FLAKES - 1e-9))
    layer = np.zeros((h, w), np.float32)
    for y, xx in zip(ys[:n], xs[:n], strict=True):
        y1, x1 = min(h, y + fh), min(w, xx + fw)
        layer[y:y1, xx:x1] += flake[:y1 - y, :x1 - xx]
    return x + layer[:, :, None]


def _frost_segments(h: int, w: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The ice crystals of a frost texture on an h x w canvas: segments (n, 2, 2) as (x, y)
    end points and their brightness (n,), generated level by level (vectorised).

    Level 0: FROST_SEEDS needles, positions pushed towards the borders (frost grows from the
    window frame), uniform angles, length U(FROST_NEEDLE) * canvas. Each needle of level k
    carries FROST_BRANCHES pairs of side branches at +-60 degrees (+- N(0, 8) degrees) at
    evenly spaced points t; a branch is U(0.6, 1) * 0.45 * (1 - t) of its parent's length.
    The number and order of draws depend only on the canvas size (never on epsilon)."""
    n = FROST_SEEDS
    v = rng.uniform(-1.0, 1.0, size=(n, 2))
    pos = 0.5 + 0.5 * np.sign(v) * np.abs(v) ** 0.6
    x0, y0 = pos[:, 0] * w, pos[:, 1] * h
    ang = rng.uniform(0.0, 2.0 * math.pi, n)
    ln = rng.uniform(*FROST_NEEDLE, n) * max(h, w)
    segs, levels = [], []
    for depth in range(FROST_DEPTH + 1):
        x1, y1 = x0 + ln * np.cos(ang), y0 + ln * np.sin(ang)
        segs.append(np.stack([np.stack([x0, y0], 1), np.stack([x1, y1], 1)], 1))
        levels.append(rng.uniform(0.35, 1.0, size=x0.size) * (0.8 ** depth))
        if depth == FROST_DEPTH:
            break
        t = (np.arange(FROST_BRANCHES) + 1.0) / (FROST_BRANCHES + 1.0)          # (B,)
        side = np.array([-1.0, 1.0])                                           # (2,)
        jitter = rng.normal(0.0, math.radians(8.0), size=(x0.size, FROST_BRANCHES, 2))
        shrink = rng.uniform(0.6, 1.0, size=(x0.size, FROST_BRANCHES, 2))
        bx = x0[:, None, None] + (t * ln[:, None])[:, :, None] * np.cos(ang)[:, None, None]
        by = y0[:, None, None] + (t * ln[:, None])[:, :, None] * np.sin(ang)[:, None, None]
        ang = (ang[:, None, None] + side * math.radians(60.0) + jitter).ravel()
        ln = (0.45 * (1.0 - t)[None, :, None] * ln[:, None, None] * shrink).ravel()
        x0 = np.broadcast_to(bx, shrink.shape).ravel()
        y0 = np.broadcast_to(by, shrink.shape).ravel()
    return np.concatenate(segs), np.concatenate(levels)


def _frost_texture(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """A procedural frost texture, HxWx3 float32 in [0, 1] (see FROST_* above)."""
    scale = FROST_CANVAS / max(h, w)
    ch, cw = max(1, round(h * scale)), max(1, round(w * scale))
    haze = _plasma(FROST_CANVAS, FROST_HAZE_DECAY, _plasma_draws(FROST_CANVAS, rng))[:ch, :cw]
    segs, levels = _frost_segments(ch, cw, rng)
    noise = rng.random((ch, cw), dtype=np.float32)
    canvas = np.zeros((ch, cw), np.uint8)
    pts = np.rint(segs * 16.0).astype(np.int32)           # 4 fractional bits
    buckets = np.minimum((levels * 4).astype(int), 3)
    for b in range(4):                                      # dim crystals first
        sel = pts[buckets == b]
        if len(sel):
            cv2.polylines(canvas, list(sel), False, 255.0 * (b + 1) / 4, 1, cv2.LINE_AA, 4)
    crystals = canvas.astype(np.float32) / 255.0
    glow = cv2.GaussianBlur(crystals, (0, 0), 2.0)
    grain = cv2.GaussianBlur(noise, (3, 3), 0.7)
    yy, xx = np.mgrid[0:ch, 0:cw].astype(np.float32)
    r2 = ((yy - (ch - 1) / 2) / max(ch / 2, 1)) ** 2 + ((xx - (cw - 1) / 2) / max(cw / 2, 1)) ** 2
    edge = 0.65 + 0.45 * np.clip(r2, 0.0, 1.5)
    frost = np.clip(edge * (0.55 * haze.astype(np.float32) + 0.7 * crystals + 1.2 * glow)
                    + 0.15 * grain - 0.05, 0.0, 1.0)
    interp = cv2.INTER_AREA if (ch > h or cw > w) else cv2.INTER_LINEAR
    frost = cv2.resize(frost, (w, h), interpolation=interp).reshape(h, w, 1)
    return np.clip(frost * np.array(FROST_TINT, np.float32), 0.0, 1.0)


def _frost(x: np.ndarray, eps: float, rng: np.random.Generator, p: Params) -> np.ndarray:
    h, w, c = x.shape
    tex = _frost_texture(h, w, rng)
    if c == 1:
        tex = _hwc(cv2.cvtColor(tex, cv2.COLOR_RGB2GRAY), 1)
    return _lerp(FROST_IMAGE_WEIGHT, eps) * x + eps * FROST_TEXTURE_MAX * tex


# ---------------------------------------------------------------------------------------------
# Validation and entry point
# ---------------------------------------------------------------------------------------------

def check_epsilon(level: object) -> float:
    """PER-1: epsilon is a finite number in [0, 1] (not a bool); raises InvalidArgument on
    field ``epsilon``."""
    if isinstance(level, bool) or not isinstance(level, int | float | np.integer | np.floating) \
            or not math.isfinite(float(level)) or not 0.0 <= float(level) <= 1.0:
        raise InvalidArgument("epsilon", f"must be a number in [0, 1], got {level!r}")
    return float(level)


PropertyFn = Callable[[np.ndarray, float, np.random.Generator, Params], np.ndarray]


def _make_apply(fn: PropertyFn) -> ApplyFn:
    def apply(image: np.ndarray, level: Any, rng: np.random.Generator,
              ctx: ApplyContext) -> np.ndarray:
        check_image(image)
        eps = check_epsilon(level)
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        params = ctx.params if ctx is not None else {}
        x = image.astype(np.float32) / np.float32(255.0)
        x = x[:, :, None] if x.ndim == 2 else x
        out = fn(x, eps, rng, params)     # draws (stochastic ones) happen whatever eps is
        if eps == 0.0:
            return image.copy()
        return np.ascontiguousarray(
            np.rint(np.clip(out, 0.0, 1.0) * 255.0).astype(np.uint8).reshape(image.shape))
    apply.__name__ = f"apply{fn.__name__}"
    apply.__doc__ = fn.__doc__
    return apply


def apply_property(property_id: str, image: np.ndarray, epsilon: float,
                   rng: np.random.Generator, params: Mapping[str, Any] | None = None) -> np.ndarray:
    """Apply one safety property (PER-1) at ``epsilon`` in [0, 1] to one image.

    ``params``: the property's parameters (``direction``, ``angle_deg``), defaults filled in.
    Raises ``InvalidArgument`` on ``perturbation_id``, ``epsilon``, ``image`` or
    ``params.<name>``."""
    spec = PROPERTIES.get(property_id) if isinstance(property_id, str) else None
    if spec is None:
        raise InvalidArgument("perturbation_id", f"unknown property '{property_id}'; known: "
                              f"{', '.join(PROPERTIES)}")
    known = {q.name for q in spec.params}
    given = dict(params or {})
    for key in given:
        if key not in known:
            raise InvalidArgument(f"params.{key}", f"unknown parameter for {property_id}")
    full = {q.name: q.default for q in spec.params} | given
    return spec.apply(image, epsilon, rng, ApplyContext(params=MappingProxyType(full)))


# ---------------------------------------------------------------------------------------------
# Catalogue entries
# ---------------------------------------------------------------------------------------------

_DIRECTION = Param(name="direction", type="int", default=1, minimum=-1, maximum=1,
                   description="+1 or -1: which way the knob moves (brighter/darker, "
                               "counter-clockwise/clockwise, right/left, down/up)")


def _char(scope: Literal["global", "local"], randomness: Literal["deterministic", "stochastic"],
          domain: Literal["colour", "pixel"]) -> Characterisation:
    return Characterisation(scope=scope, randomness=randomness, domain=domain)


def _spec(pid: str, family: str, fn: PropertyFn, char: Characterisation, description: str,
          params: tuple[Param, ...] = ()) -> PerturbationSpec:
    return PerturbationSpec(
        id=pid, kind="property", family=family, refs=("PER-1",), description=description,
        level_kind="epsilon", levels=(), level_table=(MappingProxyType(dict(EPSILON_ONE[pid])),),
        level_table_doc="the parameters at epsilon = 1 (epsilon = 0 is the original image; "
                        "linear in between unless stated) and where they come from",
        characterisation=char, apply=_make_apply(fn), params=params)


_G_DET_COL = _char("global", "deterministic", "colour")
_G_DET_PIX = _char("global", "deterministic", "pixel")
_G_STO_PIX = _char("global", "stochastic", "pixel")

SPECS: tuple[PerturbationSpec, ...] = (
    # luminance
    _spec("per_brightness", "luminance", _brightness, _G_DET_COL,
          "add direction * epsilon to every value (paper Eq. 1); eps = 1: all white (or black)",
          (_DIRECTION,)),
    _spec("per_contrast_reduction", "luminance", _contrast_reduction, _G_DET_COL,
          "blend toward mid-grey: (1 - eps) x + eps * 0.5 (paper Eq. 2)"),
    # spatial
    _spec("per_rotation", "spatial", _rotation, _G_DET_PIX,
          "rotate about the centre by direction * eps * 180 degrees, black fill (paper Eq. 3)",
          (_DIRECTION,)),
    _spec("per_horizontal_translation", "spatial", _horizontal_translation, _G_DET_PIX,
          "shift right (direction +1) or left by round(eps * width) px, black fill",
          (_DIRECTION,)),
    _spec("per_vertical_translation", "spatial", _vertical_translation, _G_DET_PIX,
          "shift down (direction +1) or up by round(eps * height) px, black fill",
          (_DIRECTION,)),
    _spec("per_rotation_translation", "spatial", _rotation_translation, _G_DET_PIX,
          "rotate by eps * 180 degrees and shift by eps * 5/224 of the size, one warp",
          (_DIRECTION,)),
    # blur
    _spec("per_motion_blur", "blur", _motion_blur, _G_DET_PIX,
          "line kernel of length eps * min(H, W) at a fixed angle (paper Eq. 4)",
          (Param(name="angle_deg", type="float", default=MOTION_BLUR_ANGLE_DEG, minimum=0.0,
                 maximum=180.0, description="motion direction in degrees (90 = vertical, "
                 "the paper's; 0 = horizontal, the code's default)"),)),
    _spec("per_gaussian_blur", "blur", _gaussian_blur, _G_DET_PIX,
          "Gaussian blur, sigma = eps * 0.2 * max(H, W) (paper Eq. 5)"),
    # corruption
    _spec("per_uniform_noise", "corruption", _uniform_noise, _G_STO_PIX,
          "x + eps * U(-eps, eps) per value: one U(-1, 1) field scaled by eps^2 (paper Eq. 6)"),
    _spec("per_gaussian_noise", "corruption", _gaussian_noise, _G_STO_PIX,
          "x + eps * N(0, eps/sqrt 3) per value: one N(0, 1) field scaled (paper Eq. 7)"),
    _spec("per_blended_uniform_noise", "corruption", _blended_uniform_noise, _G_STO_PIX,
          "(1 - eps) x + eps * a uniform random image (paper Eq. 8)"),
    _spec("per_salt_and_pepper", "corruption", _salt_and_pepper,
          _char("local", "stochastic", "pixel"),
          "a fraction eps of the pixels set to black or white, half each (paper Eq. 9)"),
    # weather
    _spec("per_fog", "weather", _fog, _char("global", "stochastic", "colour"),
          "diamond-square fog, strength 3.5 eps, wibble decay 2.3 -> 1.0 (paper Eq. 10)"),
    _spec("per_snow", "weather", _snow, _char("local", "stochastic", "pixel"),
          "ceil(eps * 100) motion-blurred snow flakes of 1/100 of the image (paper II-B-5b)",
          (Param(name="angle_deg", type="float", default=SNOW_ANGLE_DEG, minimum=0.0,
                 maximum=180.0, description="direction of the flakes' motion blur, degrees"),)),
    _spec("per_frost", "weather", _frost, _char("global", "stochastic", "colour"),
          "(1 - eps/2) x + 0.8 eps * a procedural frost texture drawn from the rng"),
)

#: id -> spec, in PER-1 order.
PROPERTIES: Mapping[str, PerturbationSpec] = MappingProxyType({s.id: s for s in SPECS})
assert len(PROPERTIES) == 15 and set(PROPERTIES) == set(EPSILON_ONE)
