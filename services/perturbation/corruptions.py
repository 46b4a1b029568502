"""Common corruptions (IEEE Std 3129-2023, 4.2 and Annex A.1): noise, blur, weather, digital,
geometric and mask perturbations, each at five severities.

Requirements implemented (see SPEC.md):

    IEEE-A1  noise     gaussian_noise, shot_noise (Poisson), impulse_noise (salt-and-pepper),
                       random_impulse_noise (random-valued impulse), speckle_noise
    IEEE-A2  blur      defocus_blur (Gaussian-blurred disk), glass_blur (frosted glass: random
                       local pixel swaps), motion_blur (line kernel), zoom_blur (mix of scaled
                       copies), gaussian_blur
    IEEE-A3  weather   snow, fog (diamond-square plasma), brightness (HSV value + c)
    IEEE-A4  digital   contrast (blend toward the mean), saturate, pixelate (down- then
                       up-sample), jpeg_compression, elastic_transform, and the geometric
                       ``affine`` (similarity + shear = six-degree-of-freedom affine, constant fill)
    IEEE-A5  mask      occlusion (a random rectangle covering part of the image)

The per-severity constants of the ImageNet-C corruptions are those of the reference package
``imagecorruptions`` 1.1.2 (Hendrycks & Dietterich, ICLR 2019; Michaelis et al. 2019), kept as
visible tables below (index 0 = severity 1). The algorithms are re-implemented with numpy,
OpenCV and (pixelate only) Pillow, with no Wand/ImageMagick, no scipy and no global RNG; given
the same random draws they reproduce the reference up to rounding, as
tests/reference/test_corruptions_vs_imagecorruptions.py checks side by side. ``affine``,
``occlusion`` and ``random_impulse_noise`` are Fortis additions with their own documented
tables. Frost (IEEE-A3) is not implemented yet: it needs the reference frost texture images.

Images: uint8, HxW, HxWx1 or HxWx3 (RGB), any size >= 1x1. The result has the same dtype and
shape. Grey images are processed as one channel; where an algorithm needs colour the grey value
is treated as an achromatic RGB pixel (brightness: V = the grey value, so V + c; saturate: a
grey pixel has no saturation, so it is returned unchanged, exactly as the reference does).

Randomness: every draw comes from the ``rng`` passed in (``numpy.random.Generator``); the
deterministic corruptions (``stochastic=False``) never touch it. Same generator state -> same
output, bit for bit (OpenCV filters used here are deterministic).

Image size. The ImageNet-C constants assume ~224 px images and are used unchanged at that size.
Constants that are *relative* to the image (zoom factors, pixelate factor, contrast, fog map,
affine translation, occlusion area, elastic sigma) behave the same at any size. Constants in
*pixels* (blur sigmas and radii, glass-blur swap distance) are kept in pixels, so on a 28x28
Fashion-MNIST image the blurs are proportionally much stronger than on a 224 px photo; the
following rules keep every corruption well-defined on small images:

* gaussian kernels (gaussian_blur, glass_blur, elastic) are truncated at 4 sigma (3 for elastic),
  and never wider than the image's longer side on each side of the centre;
* defocus_blur: the disk radius is capped at max(1, min(H, W) // 2);
* motion_blur / snow streaks: taps of the line kernel that would fall outside the image are
  dropped (as the reference does) and the remaining taps are renormalised to sum to 1, so the
  image is not darkened;
* glass_blur: pixels are moved only at least ``delta + 1`` px inside the border (as the
  reference); an image too small for that gets the two Gaussian blurs only;
* fog: the plasma map is a square power of two >= max(H, W) (>= 2), cropped to H x W;
* pixelate: the low-resolution image is at least 1x1; occlusion: the rectangle at least 1x1.

Implementation differences from the reference (same parameters, same result up to rounding
given the same draws): motion blur is one ``cv2.filter2D`` with the reference's tap pattern;
zoom (zoom_blur, snow) interpolates with numpy on the grid ``scipy.ndimage.zoom`` uses;
glass blur's sequential pixel moves are resolved vectorised; JPEG goes through OpenCV's libjpeg
instead of Pillow's (identical output in the side-by-side test); the uint8 result is rounded,
not truncated (the reference's ``np.uint8`` truncation makes it 0.5 levels darker on average).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import cv2
import numpy as np
from fortis.services.common.errors import InvalidArgument
from PIL import Image

# ---------------------------------------------------------------------------------------------
# Severity tables (index 0 = severity 1). ImageNet-C values from imagecorruptions 1.1.2.
# ---------------------------------------------------------------------------------------------

#: IEEE-A1 gaussian_noise: standard deviation of the additive noise, [0, 1] pixel scale.
GAUSSIAN_NOISE_SIGMA = (0.08, 0.12, 0.18, 0.26, 0.38)
#: IEEE-A1 shot_noise: photon count per unit intensity (lower = noisier); x' = Poisson(x*c)/c.
SHOT_NOISE_PHOTONS = (60, 25, 12, 5, 3)
#: IEEE-A1 impulse_noise: fraction of pixel values replaced, half by 0 and half by 1
#: (salt-and-pepper, per channel value as skimage.util.random_noise mode='s&p').
IMPULSE_NOISE_AMOUNT = (0.03, 0.06, 0.09, 0.17, 0.27)
#: IEEE-A1 random_impulse_noise (Fortis): fraction of pixel values replaced by a uniform random
#: value (random-valued impulse noise); same amounts as impulse_noise.
RANDOM_IMPULSE_AMOUNT = IMPULSE_NOISE_AMOUNT
#: IEEE-A1 speckle_noise: standard deviation of the multiplicative noise; x' = x + x*N(0, c).
SPECKLE_NOISE_SIGMA = (0.15, 0.2, 0.35, 0.45, 0.6)

#: IEEE-A2 gaussian_blur: sigma in pixels.
GAUSSIAN_BLUR_SIGMA = (1, 2, 3, 4, 6)
#: IEEE-A2 glass_blur: (sigma in pixels, max swap distance delta in pixels, iterations).
GLASS_BLUR_PARAMS = ((0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2))
#: IEEE-A2 defocus_blur: (disk radius in pixels, sigma of the anti-aliasing Gaussian).
DEFOCUS_BLUR_PARAMS = ((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5))
#: IEEE-A2 motion_blur: (radius in pixels, sigma of the Gaussian tap weights); the kernel is a
#: one-sided line of 2*radius+1 taps at an angle drawn uniformly in [-45, 45) degrees.
MOTION_BLUR_PARAMS = ((10, 3), (15, 5), (15, 8), (15, 12), (20, 15))
MOTION_BLUR_ANGLE_RANGE = (-45.0, 45.0)
#: IEEE-A2 zoom_blur: zoom factors as numpy.arange(start, stop, step); the output is the mean of
#: the image and its copies zoomed about the centre by each factor.
ZOOM_BLUR_RANGES = ((1, 1.11, 0.01), (1, 1.16, 0.01), (1, 1.21, 0.02), (1, 1.26, 0.02),
                    (1, 1.31, 0.03))

#: IEEE-A3 fog: (fog strength c0, wibble decay of the diamond-square plasma map);
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

#: IEEE-A4 contrast: factor c in x' = (x - mean) * c + mean (per-channel mean).
CONTRAST_FACTOR = (0.4, 0.3, 0.2, 0.1, 0.05)
#: IEEE-A4 saturate: (multiplier, offset) applied to S of HSV: S' = clip(S*c0 + c1).
SATURATE_PARAMS = ((0.3, 0), (0.1, 0), (2, 0), (5, 0.1), (20, 0.2))
#: IEEE-A4 pixelate: down-sampling factor (box/area down, nearest up).
PIXELATE_FACTOR = (0.6, 0.5, 0.4, 0.3, 0.25)
#: IEEE-A4 jpeg_compression: JPEG quality.
JPEG_QUALITY = (25, 18, 15, 10, 7)
#: IEEE-A4 elastic_transform: alpha (displacement gain). Displacement field: uniform noise in
#: +-0.005*H, Gaussian-smoothed with sigma = 0.01*(H, W) (truncate 3), times alpha; bilinear
#: resampling with reflected borders.
ELASTIC_ALPHA = (250 * 0.05, 250 * 0.065, 250 * 0.085, 250 * 0.1, 250 * 0.12)

#: IEEE-A4 affine (Fortis): (rotation degrees, relative scale change, shear degrees,
#: translation as a fraction of width/height). Magnitudes are fixed per severity; the rng picks
#: the sign of rotation and shear, zoom in (1 + s) or out (1 - s), and the translation
#: direction (uniform angle; shift = frac*W*cos, frac*H*sin). Centre of the image is the origin;
#: bilinear resampling; pixels from outside the image are filled with 0 (black).
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


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class CorruptionSpec:
    """One corruption: its ImageNet-C style id, family, requirement and severity table."""

    id: str                 # ImageNet-C style name, e.g. "gaussian_noise"
    family: str             # "noise" | "blur" | "weather" | "digital" | "geometric" | "mask"
    ieee_ref: str           # "IEEE-A1" .. "IEEE-A5"
    stochastic: bool        # uses the rng?
    description: str
    severity_params: tuple  # the 5 per-severity parameters (index 0 = severity 1)


CORRUPTIONS: dict[str, CorruptionSpec] = {c.id: c for c in (
    # IEEE-A1 noise
    CorruptionSpec(id="gaussian_noise", family="noise", ieee_ref="IEEE-A1", stochastic=True,
                   description="additive Gaussian noise; parameter: std on the [0,1] scale",
                   severity_params=GAUSSIAN_NOISE_SIGMA),
    CorruptionSpec(id="shot_noise", family="noise", ieee_ref="IEEE-A1", stochastic=True,
                   description="Poisson (shot) noise; parameter: photons per unit intensity",
                   severity_params=SHOT_NOISE_PHOTONS),
    CorruptionSpec(id="impulse_noise", family="noise", ieee_ref="IEEE-A1", stochastic=True,
                   description="salt-and-pepper impulse noise; parameter: fraction of values hit",
                   severity_params=IMPULSE_NOISE_AMOUNT),
    CorruptionSpec(id="random_impulse_noise", family="noise", ieee_ref="IEEE-A1", stochastic=True,
                   description="random-valued impulse noise; parameter: fraction of values "
                               "replaced by a uniform random value",
                   severity_params=RANDOM_IMPULSE_AMOUNT),
    CorruptionSpec(id="speckle_noise", family="noise", ieee_ref="IEEE-A1", stochastic=True,
                   description="multiplicative Gaussian noise; parameter: std",
                   severity_params=SPECKLE_NOISE_SIGMA),
    # IEEE-A2 blur
    CorruptionSpec(id="defocus_blur", family="blur", ieee_ref="IEEE-A2", stochastic=False,
                   description="filter with a Gaussian-aliased disk; parameters: (radius px, "
                               "alias sigma)",
                   severity_params=DEFOCUS_BLUR_PARAMS),
    CorruptionSpec(id="glass_blur", family="blur", ieee_ref="IEEE-A2", stochastic=True,
                   description="frosted glass: blur, random local pixel swaps, blur; parameters: "
                               "(sigma px, max swap distance px, iterations)",
                   severity_params=GLASS_BLUR_PARAMS),
    CorruptionSpec(id="motion_blur", family="blur", ieee_ref="IEEE-A2", stochastic=True,
                   description="line kernel at a random angle in [-45,45) deg; parameters: "
                               "(radius px, tap sigma)",
                   severity_params=MOTION_BLUR_PARAMS),
    CorruptionSpec(id="zoom_blur", family="blur", ieee_ref="IEEE-A2", stochastic=False,
                   description="mean of the image and centre-zoomed copies; parameters: zoom "
                               "factors arange(start, stop, step)",
                   severity_params=ZOOM_BLUR_RANGES),
    CorruptionSpec(id="gaussian_blur", family="blur", ieee_ref="IEEE-A2", stochastic=False,
                   description="Gaussian smoothing; parameter: sigma px",
                   severity_params=GAUSSIAN_BLUR_SIGMA),
    # IEEE-A3 weather
    CorruptionSpec(id="snow", family="weather", ieee_ref="IEEE-A3", stochastic=True,
                   description="random snow flakes streaked by motion blur over a brightened "
                               "image; parameters: (mean, std, zoom, threshold, radius, sigma, "
                               "blend)",
                   severity_params=SNOW_PARAMS),
    CorruptionSpec(id="fog", family="weather", ieee_ref="IEEE-A3", stochastic=True,
                   description="diamond-square plasma fog; parameters: (strength, wibble decay)",
                   severity_params=FOG_PARAMS),
    CorruptionSpec(id="brightness", family="weather", ieee_ref="IEEE-A3", stochastic=False,
                   description="add c to the HSV value channel (also IEEE-A4 a)); parameter: c",
                   severity_params=BRIGHTNESS_DELTA),
    # IEEE-A4 digital
    CorruptionSpec(id="contrast", family="digital", ieee_ref="IEEE-A4", stochastic=False,
                   description="blend toward the per-channel mean; parameter: kept fraction",
                   severity_params=CONTRAST_FACTOR),
    CorruptionSpec(id="saturate", family="digital", ieee_ref="IEEE-A4", stochastic=False,
                   description="scale and shift HSV saturation (grey images unchanged); "
                               "parameters: (multiplier, offset)",
                   severity_params=SATURATE_PARAMS),
    CorruptionSpec(id="pixelate", family="digital", ieee_ref="IEEE-A4", stochastic=False,
                   description="box down-sample then nearest up-sample; parameter: factor",
                   severity_params=PIXELATE_FACTOR),
    CorruptionSpec(id="jpeg_compression", family="digital", ieee_ref="IEEE-A4", stochastic=False,
                   description="JPEG encode/decode; parameter: quality",
                   severity_params=JPEG_QUALITY),
    CorruptionSpec(id="elastic_transform", family="digital", ieee_ref="IEEE-A4", stochastic=True,
                   description="smoothed random displacement field; parameter: alpha",
                   severity_params=ELASTIC_ALPHA),
    # IEEE-A4 c) geometric
    CorruptionSpec(id="affine", family="geometric", ieee_ref="IEEE-A4", stochastic=True,
                   description="rotation+scale+shear+translation, black fill; parameters: "
                               "(rotation deg, scale change, shear deg, translation fraction)",
                   severity_params=AFFINE_PARAMS),
    # IEEE-A5 mask
    CorruptionSpec(id="occlusion", family="mask", ieee_ref="IEEE-A5", stochastic=True,
                   description="one random rectangle of random solid colour; parameter: "
                               "fraction of the image area covered",
                   severity_params=OCCLUSION_AREA),
)}


def list_corruptions() -> list[CorruptionSpec]:
    """Every corruption, in registry order (IEEE-A1 .. IEEE-A5)."""
    return list(CORRUPTIONS.values())


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def _to_float(image: np.ndarray) -> np.ndarray:
    """uint8 HxW / HxWxC -> float32 HxWxC in [0, 1] (a new array)."""
    x = image.astype(np.float32) / np.float32(255.0)
    return x[:, :, None] if x.ndim == 2 else x


def _to_uint8(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """float [0, 1] -> uint8 (rounded) with the caller's original shape."""
    out = np.rint(np.clip(x, 0.0, 1.0) * 255.0).astype(np.uint8)
    return np.ascontiguousarray(out.reshape(shape))


def _hwc(x: np.ndarray, channels: int) -> np.ndarray:
    """OpenCV drops a trailing 1-channel axis: put it back."""
    return x.reshape(x.shape[0], x.shape[1], channels)


def _gauss(x: np.ndarray, sigma: float, truncate: float = 4.0,
           border: int = cv2.BORDER_REPLICATE) -> np.ndarray:
    """Gaussian blur of an HxWxC float image, like skimage.filters.gaussian (mode 'nearest',
    truncate 4): kernel half-width int(truncate*sigma + 0.5), capped at the longer side."""
    h, w, c = x.shape
    half = min(int(truncate * sigma + 0.5), max(h, w))
    k = 2 * half + 1
    return _hwc(cv2.GaussianBlur(x, (k, k), sigmaX=sigma, sigmaY=sigma, borderType=border), c)


def _motion_kernel(radius: int, sigma: float, angle_deg: float, h: int, w: int) -> np.ndarray:
    """Correlation kernel of the reference one-sided motion blur (ImageMagick-style).

    Tap i (i = 0 .. 2*radius) has weight exp(-i^2 / 2 sigma^2) and samples the pixel
    round(i) steps back along the angle. Taps that leave an h x w image are dropped (as the
    reference does) and the kept weights renormalised to sum to 1.
    """
    width = 2 * radius + 1
    weights = np.exp(-(np.arange(width, dtype=np.float64) ** 2) / (2.0 * sigma ** 2))
    a = math.radians(angle_deg)
    p0, p1 = width * math.sin(a), width * math.cos(a)
    hyp = math.hypot(p0, p1)
    taps: list[tuple[int, int, float]] = []
    for i in range(width):
        dy = -math.ceil(i * p0 / hyp - 0.5)
        dx = -math.ceil(i * p1 / hyp - 0.5)
        if abs(dy) >= h or abs(dx) >= w:
            break
        taps.append((dy, dx, float(weights[i])))
    half = max(max(abs(dy), abs(dx)) for dy, dx, _ in taps)
    kernel = np.zeros((2 * half + 1, 2 * half + 1), dtype=np.float32)
    for dy, dx, wt in taps:
        # out(p) = sum_i w_i * img(p - (dy, dx)); filter2D correlates: K[half + q] * img(p + q)
        kernel[half - dy, half - dx] += wt
    return kernel / kernel.sum()


def _motion(x: np.ndarray, radius: int, sigma: float, angle_deg: float) -> np.ndarray:
    h, w, c = x.shape
    kernel = _motion_kernel(radius, sigma, angle_deg, h, w)
    return _hwc(cv2.filter2D(x, -1, kernel, borderType=cv2.BORDER_REPLICATE), c)


def _clipped_zoom(x: np.ndarray, zoom: float, crop: bool = True) -> np.ndarray:
    """Zoom an HxWxC float image in by ``zoom`` (>= 1) on the reference's grid.

    The reference (``clipped_zoom``) crops the central ``ch = ceil(H / zoom)`` rows (top row
    ``(H - ch) // 2``) and up-samples them to ``round(ch * zoom)`` (>= H) rows with
    ``scipy.ndimage.zoom(order=1)``, whose grid maps the first and last samples onto each other
    (step ``(ch - 1) / (round(ch * zoom) - 1)``); columns alike. zoom_blur keeps the first H
    rows and W columns (``crop``); snow crops only after its motion blur (``crop=False``).
    That grid is up to ~1 px off-centre and its scale up to 0.3% off ``zoom`` at 224 px, and it
    sets the interpolation phases, which decide how much the snow layer's noise is smoothed
    before its threshold; so it is reproduced here exactly: separable linear interpolation at
    those sample positions (all inside the image, so no border rule is needed).
    """
    assert zoom >= 1.0
    out = x
    for axis, n in ((0, x.shape[0]), (1, x.shape[1])):
        ch = math.ceil(n / zoom)
        size = round(ch * zoom)
        step = (ch - 1) / (size - 1) if size > 1 else 0.0
        m = n if crop else size
        pos = (n - ch) // 2 + step * np.arange(m)
        i0 = np.minimum(np.floor(pos).astype(np.intp), n - 1)
        i1 = np.minimum(i0 + 1, n - 1)
        shape = (m, 1, 1) if axis == 0 else (1, m, 1)
        f = (pos - i0).astype(x.dtype).reshape(shape)
        out = np.take(out, i0, axis=axis) * (1 - f) + np.take(out, i1, axis=axis) * f
    return out


def _plasma_fractal(mapsize: int, wibbledecay: float, rng: np.random.Generator) -> np.ndarray:
    """Diamond-square height map, mapsize x mapsize (a power of two), values in [0, 1].

    Same recurrence as the ImageNet-C ``plasma_fractal`` (itself after FLHerne/mapgen),
    drawing from ``rng``."""
    assert mapsize >= 2 and mapsize & (mapsize - 1) == 0
    maparray = np.zeros((mapsize, mapsize), dtype=np.float64)
    stepsize = mapsize
    wibble = 100.0

    def wibbledmean(array: np.ndarray) -> np.ndarray:
        return array / 4 + wibble * rng.uniform(-wibble, wibble, array.shape)

    while stepsize >= 2:
        half = stepsize // 2
        # squares: centre of each square = mean of its corners + wibble
        cornerref = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        squareaccum = cornerref + np.roll(cornerref, shift=-1, axis=0)
        squareaccum += np.roll(squareaccum, shift=-1, axis=1)
        maparray[half:mapsize:stepsize, half:mapsize:stepsize] = wibbledmean(squareaccum)
        # diamonds: edge midpoints = mean of the two corners and two centres + wibble
        drgrid = maparray[half:mapsize:stepsize, half:mapsize:stepsize]
        ulgrid = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        ltsum = drgrid + np.roll(drgrid, 1, axis=0) + ulgrid + np.roll(ulgrid, -1, axis=1)
        maparray[0:mapsize:stepsize, half:mapsize:stepsize] = wibbledmean(ltsum)
        ttsum = drgrid + np.roll(drgrid, 1, axis=1) + ulgrid + np.roll(ulgrid, -1, axis=0)
        maparray[half:mapsize:stepsize, 0:mapsize:stepsize] = wibbledmean(ttsum)
        stepsize //= 2
        wibble /= wibbledecay

    maparray -= maparray.min()
    top = maparray.max()
    return maparray / top if top > 0 else maparray


def _rgb_gray(x: np.ndarray) -> np.ndarray:
    """HxWx1 luminance of an HxWxC float image (C = 1: the image itself)."""
    if x.shape[2] == 1:
        return x
    return _hwc(cv2.cvtColor(x, cv2.COLOR_RGB2GRAY), 1)


# ---------------------------------------------------------------------------------------------
# Corruptions. Each takes a float32 HxWxC image in [0, 1], the severity parameter and the rng,
# and returns a float image (clipped to [0, 1] by the caller), except the uint8-native ones.
# ---------------------------------------------------------------------------------------------

def _gaussian_noise(x, c, rng):
    return x + rng.normal(size=x.shape, scale=c)


def _shot_noise(x, c, rng):
    # rate from the exact uint8 level k/255 in float64 (as the reference), not from the float32
    # value: a rate one ulp off can change a Poisson draw and the draws that follow it
    return rng.poisson(np.rint(x.astype(np.float64) * 255.0) / 255.0 * c) / float(c)


def _impulse_noise(x, amount, rng):
    flipped = rng.random(x.shape) <= amount
    salted = rng.random(x.shape) <= 0.5
    out = x.copy()
    out[flipped & salted] = 1.0
    out[flipped & ~salted] = 0.0
    return out


def _random_impulse_noise(x, amount, rng):
    hit = rng.random(x.shape) <= amount
    values = rng.random(x.shape, dtype=np.float32)
    return np.where(hit, values, x)


def _speckle_noise(x, c, rng):
    return x + x * rng.normal(size=x.shape, scale=c)


def _gaussian_blur(x, sigma, rng):
    return _gauss(x, sigma)


def _glass_blur(x, params, rng):
    """IEEE-A2 b): blur, then ``iterations`` passes of random local pixel moves, then blur.

    Reference (imagecorruptions 1.1.2, as used to build ImageNet-C): each pass visits every
    pixel (h, w) with delta < h <= H - delta (same for w), in raster order from the
    bottom-right, draws ``dx, dy`` uniform in [-delta, delta) and runs
    ``x[h, w], x[h', w'] = x[h', w'], x[h, w]`` with (h', w') = (h + dy, w + dx). On numpy
    pixel *views* that statement is not a swap: the second assignment writes back the value
    just stored, so each visited pixel takes the *current* value of (h', w'), which is already
    this pass's new value when (h', w') was visited earlier. That is reproduced exactly (same
    draws, same order -> same result), vectorised: the pixel visited at step k copies from the
    step-j pixel when j < k, else from the value before the pass; following those links to
    their end by pointer doubling gives every pixel's source in O(log chain) numpy steps.
    """
    sigma, delta, iterations = params
    h, w, c = x.shape
    # The reference quantises to uint8 (truncation) between the two blurs. Blur the exact levels
    # k/255 in float64, as it does: in flat areas the blurred value is a whole level, and float32
    # noise would put it on the other side of the truncation.
    exact = np.rint(x.astype(np.float64) * 255.0) / 255.0
    y = np.floor(np.clip(_gauss(exact, sigma), 0.0, 1.0) * 255.0) / 255.0
    y = np.ascontiguousarray(y, dtype=np.float32)
    hs = np.arange(h - delta, delta, -1)      # delta < h <= H - delta, descending
    ws = np.arange(w - delta, delta, -1)
    if hs.size and ws.size:
        pos = (hs[:, None] * w + ws[None, :]).ravel()     # flat positions in visiting order
        n = pos.size
        step = np.arange(n)
        visited_at = np.full(h * w, n, dtype=np.int64)    # n = not visited in a pass
        visited_at[pos] = step
        source = np.arange(h * w)                         # original pixel now at each position
        for _ in range(iterations):
            # reference: dx, dy = randint(-delta, delta, size=2) per pixel, in visiting order
            offsets = rng.integers(-delta, delta, size=(n, 2))
            src = pos + offsets[:, 1] * w + offsets[:, 0]
            j = visited_at[src]
            link = np.where(j < step, j, step)           # earlier step: copy its new value
            while True:
                nxt = link[link]
                if np.array_equal(nxt, link):
                    break
                link = nxt
            source[pos] = source[src[link]]               # right side is the pre-pass state
        y = y.reshape(h * w, c)[source].reshape(h, w, c)
    return _gauss(y, sigma)


def _disk(radius: float, alias_blur: float) -> np.ndarray:
    """Gaussian-aliased disk kernel of the reference (L = -8..8 for radius <= 8)."""
    half = 8 if radius <= 8 else math.floor(radius)
    ksize = (3, 3) if radius <= 8 else (5, 5)
    coords = np.arange(-half, half + 1)
    xx, yy = np.meshgrid(coords, coords)
    disk = ((xx ** 2 + yy ** 2) <= radius ** 2).astype(np.float32)
    disk /= disk.sum()
    return cv2.GaussianBlur(disk, ksize=ksize, sigmaX=alias_blur)


def _defocus_blur(x, params, rng):
    radius, alias_blur = params
    h, w, c = x.shape
    radius = min(radius, max(1, min(h, w) // 2))
    return _hwc(cv2.filter2D(x, -1, _disk(radius, alias_blur)), c)


def _motion_blur(x, params, rng):
    radius, sigma = params
    angle = rng.uniform(*MOTION_BLUR_ANGLE_RANGE)
    return _motion(x, radius, sigma, angle)


def _zoom_blur(x, zrange, rng):
    zooms = np.arange(*zrange)
    out = np.zeros_like(x)
    for z in zooms:
        out += _clipped_zoom(x, float(z))
    return (x + out) / (len(zooms) + 1)


def _snow(x, params, rng):
    loc, scale, zoom, threshold, radius, sigma, blend = params
    h, w, _ = x.shape
    layer = rng.normal(size=(h, w, 1), loc=loc, scale=scale).astype(np.float32)
    layer = _clipped_zoom(layer, zoom, crop=False)   # may be a row/column larger than H x W
    layer[layer < threshold] = 0
    layer = np.clip(layer, 0.0, 1.0)
    layer = _motion(layer, radius, sigma, rng.uniform(*SNOW_ANGLE_RANGE))
    layer = np.round(layer[:h, :w] * 255.0) / 255.0    # cropped after the blur, as the reference
    x = blend * x + (1 - blend) * np.maximum(x, _rgb_gray(x) * 1.5 + 0.5)
    return x + layer + np.rot90(layer, k=2)


def _fog(x, params, rng):
    strength, decay = params
    h, w, _ = x.shape
    mapsize = max(2, 1 << (max(h, w) - 1).bit_length())
    max_val = float(x.max())
    plasma = _plasma_fractal(mapsize, decay, rng)[:h, :w, None]
    return (x + strength * plasma) * max_val / (max_val + strength)


def _brightness(x, c, rng):
    # HSV: each RGB component is V times a factor set by (H, S); raising V to V' with H, S
    # fixed scales the pixel by V'/V (exactly skimage rgb2hsv -> V += c -> hsv2rgb).
    v = x.max(axis=2, keepdims=True)
    nv = np.clip(v + c, 0.0, 1.0)
    scale = np.divide(nv, v, out=np.zeros_like(v), where=v > 0)
    return np.where(v > 0, x * scale, nv)


def _contrast(x, c, rng):
    # accumulate in float64: a float32 sum over H*W values drifts by ~0.1 level at 224 px
    means = x.mean(axis=(0, 1), keepdims=True, dtype=np.float64).astype(x.dtype)
    return (x - means) * c + means


def _saturate(x, params, rng):
    if x.shape[2] == 1:      # a grey pixel has no hue: the reference leaves it unchanged
        return x.copy()
    mult, offset = params
    hsv = cv2.cvtColor(x, cv2.COLOR_RGB2HSV)
    hsv[:, :, 1] = np.clip(hsv[:, :, 1] * mult + offset, 0.0, 1.0)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


def _elastic_transform(x, alpha, rng):
    h, w, c = x.shape
    sig_y, sig_x = 0.01 * h, 0.01 * w
    max_d = 0.005 * h
    kx = 2 * min(int(3 * sig_x + 0.5), w) + 1
    ky = 2 * min(int(3 * sig_y + 0.5), h) + 1

    def field() -> np.ndarray:
        noise = rng.uniform(-max_d, max_d, size=(h, w)).astype(np.float32)
        return cv2.GaussianBlur(noise, (kx, ky), sigmaX=sig_x, sigmaY=sig_y,
                                borderType=cv2.BORDER_REFLECT) * np.float32(alpha)

    dx = field()
    dy = field()
    gx, gy = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    return _hwc(cv2.remap(x, gx + dx, gy + dy, interpolation=cv2.INTER_LINEAR,
                          borderMode=cv2.BORDER_REFLECT), c)


def _affine(x, params, rng):
    rot, dscale, shear, trans = params
    h, w, c = x.shape
    rot_sign, shear_sign, zoom_sign = rng.choice((-1.0, 1.0), size=3)
    direction = rng.uniform(0.0, 2.0 * math.pi)
    theta = math.radians(rot_sign * rot)
    scale = 1.0 + zoom_sign * dscale
    r = np.array([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
    sh = np.array([[1.0, math.tan(math.radians(shear_sign * shear))], [0.0, 1.0]])
    a = r @ sh * scale
    centre = np.array([(w - 1) / 2.0, (h - 1) / 2.0])
    t = np.array([trans * w * math.cos(direction), trans * h * math.sin(direction)])
    m = np.hstack([a, (centre + t - a @ centre)[:, None]])
    return _hwc(cv2.warpAffine(x, m, (w, h), flags=cv2.INTER_LINEAR,
                               borderMode=cv2.BORDER_CONSTANT, borderValue=(0, 0, 0, 0)), c)


def _occlusion(x, frac, rng):
    h, w, c = x.shape
    area = frac * h * w
    lo, hi = OCCLUSION_ASPECT_RANGE
    aspect = math.exp(rng.uniform(math.log(lo), math.log(hi)))     # height / width
    rh = int(np.clip(round(math.sqrt(area * aspect)), 1, h))
    rw = int(np.clip(round(area / rh), 1, w))
    rh = int(np.clip(round(area / rw), 1, h))   # re-balance if the width was clipped
    top = int(rng.integers(0, h - rh + 1))
    left = int(rng.integers(0, w - rw + 1))
    colour = rng.integers(0, 256, size=c).astype(np.float32) / 255.0
    out = x.copy()
    out[top:top + rh, left:left + rw, :] = colour
    return out


# uint8-native corruptions (work on the uint8 HxWxC image directly)

def _pixelate_u8(img, factor, rng):
    # Pillow's BOX then NEAREST, as the reference. OpenCV is not equivalent: INTER_AREA weights
    # the pixels a fractional box cuts by area (PIL samples the box at pixel centres), and
    # INTER_NEAREST maps pixel corners, not centres (a shifted grid); at the non-integer factors
    # 0.6, 0.4 and 0.3 the two differed from the reference by 4-5 grey levels on average.
    h, w, c = img.shape
    pil = Image.fromarray(img[:, :, 0] if c == 1 else img)
    small = pil.resize((max(1, int(w * factor)), max(1, int(h * factor))), Image.Resampling.BOX)
    return _hwc(np.asarray(small.resize((w, h), Image.Resampling.NEAREST)), c)


def _jpeg_u8(img, quality, rng):
    h, w, c = img.shape
    src = img[:, :, 0] if c == 1 else np.ascontiguousarray(img[:, :, ::-1])   # RGB -> BGR
    ok, buf = cv2.imencode(".jpg", src, [int(cv2.IMWRITE_JPEG_QUALITY), int(quality)])
    if not ok:  # pragma: no cover - OpenCV always encodes a valid uint8 image
        raise RuntimeError("JPEG encoding failed")
    if c == 1:
        return _hwc(cv2.imdecode(buf, cv2.IMREAD_GRAYSCALE), 1)
    return np.ascontiguousarray(cv2.imdecode(buf, cv2.IMREAD_COLOR)[:, :, ::-1])


_FLOAT_IMPLS: dict[str, Callable] = {
    "gaussian_noise": _gaussian_noise,
    "shot_noise": _shot_noise,
    "impulse_noise": _impulse_noise,
    "random_impulse_noise": _random_impulse_noise,
    "speckle_noise": _speckle_noise,
    "defocus_blur": _defocus_blur,
    "glass_blur": _glass_blur,
    "motion_blur": _motion_blur,
    "zoom_blur": _zoom_blur,
    "gaussian_blur": _gaussian_blur,
    "snow": _snow,
    "fog": _fog,
    "brightness": _brightness,
    "contrast": _contrast,
    "saturate": _saturate,
    "elastic_transform": _elastic_transform,
    "affine": _affine,
    "occlusion": _occlusion,
}
_UINT8_IMPLS: dict[str, Callable] = {
    "pixelate": _pixelate_u8,
    "jpeg_compression": _jpeg_u8,
}
assert set(_FLOAT_IMPLS) | set(_UINT8_IMPLS) == set(CORRUPTIONS)


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------

def _check_image(image: object) -> None:
    if not isinstance(image, np.ndarray):
        raise InvalidArgument("image", f"must be a numpy array, got {type(image).__name__}")
    if image.dtype != np.uint8:
        raise InvalidArgument("image", f"must be uint8, got {image.dtype}")
    ok_shape = image.ndim == 2 or (image.ndim == 3 and image.shape[2] in (1, 3))
    if not ok_shape:
        raise InvalidArgument("image", f"must be HxW, HxWx1 or HxWx3, got shape {image.shape}")
    if image.shape[0] < 1 or image.shape[1] < 1:
        raise InvalidArgument("image", f"must be at least 1x1, got shape {image.shape}")


def apply_corruption(corruption_id: str, image: np.ndarray, severity: int,
                     rng: np.random.Generator) -> np.ndarray:
    """Apply one corruption (IEEE-A1..A5) at ``severity`` 1..5 to one image.

    ``image``: uint8 HxW, HxWx1 or HxWx3 (RGB), any size. Returns a new uint8 array of the
    same shape; the input is not modified. All randomness comes from ``rng``; deterministic
    corruptions do not use it.

    Raises ``InvalidArgument`` on field ``perturbation_id`` (unknown id), ``severity`` (not an
    integer in 1..5) or ``image`` (not uint8, bad shape).
    """
    spec = CORRUPTIONS.get(corruption_id) if isinstance(corruption_id, str) else None
    if spec is None:
        raise InvalidArgument("perturbation_id",
                              f"unknown corruption '{corruption_id}'; known: {', '.join(CORRUPTIONS)}")
    if isinstance(severity, bool) or not isinstance(severity, int | np.integer) \
            or not 1 <= int(severity) <= 5:
        raise InvalidArgument("severity", f"must be an integer in 1..5, got {severity!r}")
    _check_image(image)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")

    param = spec.severity_params[int(severity) - 1]
    shape = image.shape
    if corruption_id in _UINT8_IMPLS:
        img = image[:, :, None] if image.ndim == 2 else image
        out = _UINT8_IMPLS[corruption_id](np.ascontiguousarray(img), param, rng)
        return np.ascontiguousarray(out.reshape(shape).astype(np.uint8, copy=False))
    out = _FLOAT_IMPLS[corruption_id](_to_float(image), param, rng)
    return _to_uint8(out, shape)
