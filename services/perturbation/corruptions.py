"""Common corruptions (IEEE Std 3129-2023, 4.2 and Annex A.1): noise, blur, weather, digital,
geometric and mask perturbations, each at five severities.

Requirements implemented (see SPEC.md):

    IEEE-A1  noise      gaussian_noise, shot_noise (Poisson), impulse_noise (salt-and-pepper),
                        random_impulse_noise (random-valued impulse), speckle_noise
    IEEE-A2  blur       defocus_blur (Gaussian-blurred disk), glass_blur (frosted glass: random
                        local pixel swaps), motion_blur (line kernel), zoom_blur (mix of scaled
                        copies), gaussian_blur
    IEEE-A3  weather    snow, frost (procedural frost-on-glass texture), fog (diamond-square
                        plasma), brightness (HSV value + c), spatter (liquid and mud splashes)
    IEEE-A4  digital    contrast (blend toward the mean), saturate, pixelate (down- then
                        up-sample), jpeg_compression, elastic_transform
    IEEE-A4  geometric  rotation, translation, scale, shear (one transform each) and affine
                        (all four at once: a six-degree-of-freedom affine); constant black fill
    IEEE-A5  mask       occlusion (a random rectangle covering part of the image)

Every corruption also carries its DEG-5 characterisation (global/local, deterministic/
stochastic, colour/pixel) and is exported as a ``PerturbationSpec`` in ``SPECS`` for the one
registry (``registry.py``); ``CORRUPTIONS`` / ``apply_corruption`` are the older interface and
stay.

The per-severity constants of the ImageNet-C corruptions are those of the reference package
``imagecorruptions`` 1.1.2 (Hendrycks & Dietterich, ICLR 2019; Michaelis et al. 2019), kept as
visible tables below (index 0 = severity 1). The algorithms are re-implemented with numpy,
OpenCV and (pixelate only) Pillow, with no Wand/ImageMagick, no scipy and no global RNG.
tests/reference/test_corruptions_vs_imagecorruptions.py runs them side by side with the
reference. ``rotation``, ``translation``, ``scale``, ``shear``, ``affine``, ``occlusion`` and
``random_impulse_noise`` are Fortis additions with their own documented tables.

Frost. The reference blends the image with a random crop of one of its frost photographs
(``c0 * x + c1 * frost``). Fortis ships no image files: it draws the texture procedurally from
the rng (one of five styles mirroring the five photographs the reference can pick: wavy ice,
dense feathery needles (twice: the reference's frost2 and frost3 are the same picture), small
crystals, fern-like dendrites; multi-scale noise plus splatted needle segments with side
branches, a soft glow and a little blur), standardises it and gives it, per colour channel, the
mean and standard deviation that the reference's photograph of the same style has over the
224x224 crops it blends (``FROST_TEXTURES``, measured from the package's files; the reference
test re-measures them), plus a per-image shift of that mean as large as the reference's
crop-to-crop spread, and bends its shape to the photograph's skewness (``FROST_BEND``), which
sets how much clips at white. Same blend constants per severity as the reference. Result, on
the same photos: the mean and the standard deviation of ``corrupted - clean`` within about
1% of the reference's at every severity (the reference test requires 5%). Grey images get the
BT.601 luminance of the texture (the reference weighs its BGR photo as if it were RGB).

Speed. bench/corruptions.py times every ImageNet-C corruption against the reference on the same
photos. Implementation choices made for speed (outputs equal the reference's up to rounding
except where said):

* uint8 in, uint8 out with OpenCV doing the element-wise work (``addWeighted``/``multiply``
  with a uint8 result round and saturate in one pass; ``LUT`` for per-level maps: contrast's
  blend toward the mean, brightness's value scale, shot noise's levels);
* Gaussian draws (gaussian_noise, speckle_noise, snow) come from ``_standard_normal``: inverse
  transform sampling on a 2**16-entry table of standard-normal quantiles (bin midpoints, scaled
  to unit variance) indexed by 16 random bits, several times faster here than
  ``Generator.normal``. It is a different stream than numpy's normals, and its tails stop at
  4.17 standard deviations (probability 3e-5 of a draw beyond), invisible after rounding to
  uint8;
* shot_noise draws min(Poisson(k c / 255), c) (counts above c all clip to white) by Walker's
  alias method on per-level tables (the exact distribution to float32 resolution, one uniform
  per value; numpy's ``poisson`` is the slowest step of the reference);
* impulse_noise uses one uniform per value (u < amount/2: salt, u < amount: pepper), the same
  distribution as scikit-image's two Bernoulli draws;
* zoom_blur resamples the uint8 image with ``cv2.warpAffine`` on the reference's exact sampling
  grid (OpenCV rounds sampling positions to 1/32 px; the layers are averaged in float32), which
  moves the result by at most a grey level, 0.26 levels on average against 0.25 from rounding;
* motion blur (motion_blur, snow's streaks) is a weighted sum of shifted views of a padded copy
  (``cv2.scaleAdd``), one per tap, instead of a mostly-empty 2-D kernel;
* defocus_blur filters with the disk kernel cropped to its non-zero support (weights below
  1e-12 of the largest, float32 denormals at severity 1, are dropped: they made it 20x slower);
* pixelate gives Pillow's BOX + NEAREST pixels bit for bit, on square images through OpenCV
  (box means per length, picked by two nearest-neighbour remaps) or Pillow's reduce();
* the diamond-square plasma map of fog draws its uniforms one level at a time (the same values
  in the same order as the reference) and sums in place.

Images: uint8, HxW, HxWx1 or HxWx3 (RGB), any size >= 1x1. The result has the same dtype and
shape. Grey images are processed as one channel; where an algorithm needs colour the grey value
is treated as an achromatic RGB pixel (brightness: V = the grey value, so V + c; saturate: a
grey pixel has no saturation, so it is returned unchanged, exactly as the reference does; frost
and spatter: the luminance of their colour layer).

Randomness: every draw comes from the ``rng`` passed in (``numpy.random.Generator``); the
deterministic corruptions (``stochastic=False``) never touch it. Same generator state -> same
output, bit for bit (OpenCV filters used here are deterministic).

Image size. The ImageNet-C constants assume ~224 px images and are used unchanged at that size.
Constants that are *relative* to the image (zoom factors, pixelate factor, contrast, fog map,
geometric translation, occlusion area, elastic sigma) behave the same at any size. Constants in
*pixels* (blur sigmas and radii, glass-blur swap distance, frost crystal sizes) are kept in
pixels, so on a 28x28 Fashion-MNIST image the blurs are proportionally much stronger than on a
224 px photo; the following rules keep every corruption well-defined on small images:

* gaussian kernels (gaussian_blur, glass_blur, elastic, spatter) are truncated at 4 sigma (3 for
  elastic), and never wider than the image's longer side on each side of the centre;
* defocus_blur: the disk radius is capped at max(1, min(H, W) // 2);
* motion_blur / snow streaks: taps of the line kernel that would fall outside the image are
  dropped (as the reference does) and the remaining taps are renormalised to sum to 1, so the
  image is not darkened;
* glass_blur: pixels are moved only at least ``delta + 1`` px inside the border (as the
  reference); an image too small for that gets the two Gaussian blurs only;
* fog: the plasma map is a square power of two >= max(H, W) (>= 2), cropped to H x W;
* frost: the texture is drawn at the image's size up to FROST_MAX_SIDE px (larger images get
  it scaled up, as the reference scales its photographs); a 1x1 texture is its mean colour;
* pixelate: the low-resolution image is at least 1x1; occlusion: the rectangle at least 1x1.

Implementation differences from the reference (same parameters): motion blur is a sum of
shifted copies with the reference's taps; zoom (zoom_blur, snow) uses the grid
``scipy.ndimage.zoom`` uses (snow: numpy interpolation on it, exact; zoom_blur: OpenCV, see
above); glass blur's sequential pixel moves are resolved vectorised; JPEG goes through OpenCV's
libjpeg-turbo instead of Pillow's (identical output in the side-by-side test); the uint8 result
is rounded, not truncated (the reference's ``np.uint8`` truncation makes it 0.5 levels darker
on average); spatter on an image with no liquid at all returns the image (the reference divides
by zero).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal

import cv2
import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.spec import ApplyContext, Characterisation, PerturbationSpec
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
#: IEEE-A3 frost: (image weight c0, frost weight c1); x' = clip(c0 * x + c1 * frost), both in
#: [0, 255] (the reference's table).
FROST_BLEND = ((1.0, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75))
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


# ---------------------------------------------------------------------------------------------
# Frost textures: what the reference blends, measured; what Fortis draws instead
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class FrostTexture:
    """One frost style and the statistics its texture is given, per channel (R, G, B), on the
    [0, 255] scale."""

    style: Literal["ice", "needles", "crystals", "ferns"]
    source: str                              # the reference photograph it stands in for
    mean: tuple[float, float, float]         # mean over crops of the crop mean
    std: tuple[float, float, float]          # mean over crops of the crop standard deviation
    mean_sd: tuple[float, float, float]      # standard deviation over crops of the crop mean
    skew: float                              # mean over crops of the luminance's skewness


#: IEEE-A3 frost: the five textures the reference's frost() can pick (``randint(5)``: frost1
#: to frost5; its frost6.jpg is never used; frost2.png and frost3.png are the same picture),
#: one chosen uniformly per image as there. Statistics measured from imagecorruptions 1.1.2's
#: files (imagecorruptions/frost/*) as the reference uses them on a 224x224 image: photo read
#: as BGR, scaled x1.1 (cubic), every 224x224 crop its randint calls can pick; exact over all
#: crops (summed-area tables). Measured by tests/reference/imagecorruptions_ref.py
#: ``frost_crop_statistics``, which test_frost_texture_table_matches_the_reference_files
#: re-runs. The texture gets ``mean + g * mean_sd`` (g ~ N(0, 1), one per image: crops differ
#: in brightness) and ``std``; its shape is bent to the luminance skewness ``skew``
#: (FROST_BEND), which sets how much of it clips at white.
FROST_TEXTURES = (
    FrostTexture(style="ice", source="frost1.png", mean=(76.9, 147.8, 164.3),
                 std=(22.6, 13.7, 13.0), mean_sd=(15.8, 8.5, 6.6), skew=0.40),
    FrostTexture(style="needles", source="frost2.png", mean=(197.9, 202.2, 211.5),
                 std=(18.7, 19.3, 20.0), mean_sd=(6.4, 7.1, 7.5), skew=-0.97),
    FrostTexture(style="needles", source="frost3.png", mean=(197.9, 202.2, 211.5),
                 std=(18.7, 19.3, 20.0), mean_sd=(6.4, 7.1, 7.5), skew=-0.97),
    FrostTexture(style="crystals", source="frost4.jpg", mean=(144.3, 159.1, 172.0),
                 std=(25.5, 25.6, 26.9), mean_sd=(7.5, 7.3, 7.9), skew=-0.22),
    FrostTexture(style="ferns", source="frost5.jpg", mean=(101.2, 112.6, 124.5),
                 std=(34.8, 34.4, 33.7), mean_sd=(13.2, 12.7, 12.0), skew=0.35),
)
#: per style, b in z' = sign(b) exp(b z) (then standardised again): bends the standardised
#: texture z to the skewness of its photograph (FROST_TEXTURES ``skew``); tuned by bisection
#: over 40 textures each, checked by the unit tests (within 0.15)
FROST_BEND = {"ice": 0.131, "needles": -0.857, "crystals": -0.292, "ferns": -0.062}
#: the texture is drawn at the image's size up to this many pixels on the longer side, then
#: scaled up (crystal sizes below are in pixels at that resolution)
FROST_MAX_SIDE = 512
#: needle styles: (needles per 50,000 px, needle length px, side branches per needle, branch
#: angle rad, orientation spread rad, taper, branch length / parent's remaining length)
FROST_NEEDLES = {
    "needles": (260, 22.0, 6, 0.6, 1.5, 0.4, 0.35),
    "crystals": (800, 7.0, 4, 1.05, 3.0, 0.3, 0.5),
    "ferns": (60, 35.0, 14, 1.05, 0.5, 0.6, 0.3),
}
#: luminance weights for grey images (ITU-R BT.601)
LUMA = (0.299, 0.587, 0.114)


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------

def _char(scope: Literal["global", "local"], randomness: Literal["deterministic", "stochastic"],
          domain: Literal["colour", "pixel"]) -> Characterisation:
    return Characterisation(scope=scope, randomness=randomness, domain=domain)


@dataclass(frozen=True, kw_only=True)
class CorruptionSpec:
    """One corruption: its ImageNet-C style id, family, requirement and severity table."""

    id: str                 # ImageNet-C style name, e.g. "gaussian_noise"
    family: str             # "noise" | "blur" | "weather" | "digital" | "geometric" | "mask"
    ieee_ref: str           # "IEEE-A1" .. "IEEE-A5"
    stochastic: bool        # uses the rng?
    description: str
    severity_params: tuple  # the 5 per-severity parameters (index 0 = severity 1)
    characterisation: Characterisation   # DEG-5
    table_doc: str = ""     # what an entry of severity_params means


def _c(cid: str, family: str, ref: str, description: str, table: tuple, table_doc: str,
       char: Characterisation) -> CorruptionSpec:
    return CorruptionSpec(id=cid, family=family, ieee_ref=ref,
                          stochastic=char.randomness == "stochastic", description=description,
                          severity_params=table, characterisation=char, table_doc=table_doc)


# DEG-5 (Swingler, seed 001): global = every pixel altered, local = only some; colour = the
# palette is remapped (a function of the pixel's own value, or a blend toward a colour), pixel
# = pixels are moved, mixed with their neighbours or replaced one by one.
CORRUPTIONS: dict[str, CorruptionSpec] = {c.id: c for c in (
    # IEEE-A1 noise
    _c("gaussian_noise", "noise", "IEEE-A1", "additive Gaussian noise", GAUSSIAN_NOISE_SIGMA,
       "std of the noise, [0,1] scale", _char("global", "stochastic", "pixel")),
    _c("shot_noise", "noise", "IEEE-A1", "Poisson (shot) noise", SHOT_NOISE_PHOTONS,
       "photons per unit intensity (lower = noisier)", _char("global", "stochastic", "pixel")),
    _c("impulse_noise", "noise", "IEEE-A1", "salt-and-pepper impulse noise",
       IMPULSE_NOISE_AMOUNT, "fraction of values set to 0 or 255",
       _char("local", "stochastic", "pixel")),
    _c("random_impulse_noise", "noise", "IEEE-A1",
       "random-valued impulse noise: values replaced by a uniform random value",
       RANDOM_IMPULSE_AMOUNT, "fraction of values replaced", _char("local", "stochastic", "pixel")),
    _c("speckle_noise", "noise", "IEEE-A1", "multiplicative Gaussian noise", SPECKLE_NOISE_SIGMA,
       "std of the multiplicative noise", _char("global", "stochastic", "pixel")),
    # IEEE-A2 blur
    _c("defocus_blur", "blur", "IEEE-A2", "filter with a Gaussian-aliased disk",
       DEFOCUS_BLUR_PARAMS, "(disk radius px, alias sigma px)",
       _char("global", "deterministic", "pixel")),
    _c("glass_blur", "blur", "IEEE-A2", "frosted glass: blur, random local pixel swaps, blur",
       GLASS_BLUR_PARAMS, "(sigma px, max swap distance px, iterations)",
       _char("global", "stochastic", "pixel")),
    _c("motion_blur", "blur", "IEEE-A2", "line kernel at a random angle in [-45,45) deg",
       MOTION_BLUR_PARAMS, "(radius px, tap sigma px)", _char("global", "stochastic", "pixel")),
    _c("zoom_blur", "blur", "IEEE-A2", "mean of the image and centre-zoomed copies",
       ZOOM_BLUR_RANGES, "zoom factors numpy.arange(start, stop, step)",
       _char("global", "deterministic", "pixel")),
    _c("gaussian_blur", "blur", "IEEE-A2", "Gaussian smoothing", GAUSSIAN_BLUR_SIGMA,
       "sigma px", _char("global", "deterministic", "pixel")),
    # IEEE-A3 weather
    _c("snow", "weather", "IEEE-A3",
       "random snow flakes streaked by motion blur over a brightened image", SNOW_PARAMS,
       "(flake mean, flake std, flake zoom, threshold, streak radius px, streak sigma px, "
       "image blend)", _char("global", "stochastic", "pixel")),
    _c("frost", "weather", "IEEE-A3",
       "blend with a procedural frost-on-glass texture (one of five styles, calibrated to the "
       "ImageNet-C frost photographs, see FROST_TEXTURES)", FROST_BLEND,
       "(image weight c0, frost weight c1): x' = c0 x + c1 frost",
       _char("global", "stochastic", "pixel")),
    _c("fog", "weather", "IEEE-A3", "diamond-square plasma fog", FOG_PARAMS,
       "(fog strength, plasma wibble decay)", _char("global", "stochastic", "colour")),
    _c("brightness", "weather", "IEEE-A3", "add c to the HSV value channel (also IEEE-A4 a))",
       BRIGHTNESS_DELTA, "c added to V, [0,1] scale", _char("global", "deterministic", "colour")),
    _c("spatter", "weather", "IEEE-A3",
       "liquid (severities 1-3: water drops) or mud (4-5: brown blobs) splashed on the lens",
       SPATTER_PARAMS, "(liquid mean, liquid std, blur sigma px, threshold, intensity, "
       "mode 0 = liquid / 1 = mud)", _char("local", "stochastic", "pixel")),
    # IEEE-A4 digital
    _c("contrast", "digital", "IEEE-A4", "blend toward the per-channel mean", CONTRAST_FACTOR,
       "fraction of the deviation from the mean kept", _char("global", "deterministic", "colour")),
    _c("saturate", "digital", "IEEE-A4",
       "scale and shift HSV saturation (grey images unchanged)", SATURATE_PARAMS,
       "(multiplier, offset) of S", _char("global", "deterministic", "colour")),
    _c("pixelate", "digital", "IEEE-A4", "box down-sample then nearest up-sample",
       PIXELATE_FACTOR, "down-sampling factor", _char("global", "deterministic", "pixel")),
    _c("jpeg_compression", "digital", "IEEE-A4", "JPEG encode/decode", JPEG_QUALITY,
       "JPEG quality", _char("global", "deterministic", "colour")),
    _c("elastic_transform", "digital", "IEEE-A4", "smoothed random displacement field",
       ELASTIC_ALPHA, "alpha (displacement gain)", _char("global", "stochastic", "pixel")),
    # IEEE-A4 c) geometric
    _c("rotation", "geometric", "IEEE-A4", "rotation about the centre, random sense, black fill",
       ROTATION_DEGREES, "angle in degrees", _char("global", "stochastic", "pixel")),
    _c("translation", "geometric", "IEEE-A4", "shift in a random direction, black fill",
       TRANSLATION_FRACTION, "shift as a fraction of (width, height)",
       _char("global", "stochastic", "pixel")),
    _c("scale", "geometric", "IEEE-A4", "zoom in or out about the centre, black fill",
       SCALE_FACTOR, "zoom factor s (x s or x 1/s)", _char("global", "stochastic", "pixel")),
    _c("shear", "geometric", "IEEE-A4",
       "horizontal or vertical shear about the centre, random sign, black fill", SHEAR_DEGREES,
       "shear angle in degrees", _char("global", "stochastic", "pixel")),
    _c("affine", "geometric", "IEEE-A4",
       "rotation+scale+shear+translation at once, black fill", AFFINE_PARAMS,
       "(rotation deg, scale change, shear deg, translation fraction)",
       _char("global", "stochastic", "pixel")),
    # IEEE-A5 mask
    _c("occlusion", "mask", "IEEE-A5", "one random rectangle of random solid colour",
       OCCLUSION_AREA, "fraction of the image area covered", _char("local", "stochastic", "pixel")),
)}


def list_corruptions() -> list[CorruptionSpec]:
    """Every corruption, in registry order (IEEE-A1 .. IEEE-A5)."""
    return list(CORRUPTIONS.values())


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

#: OpenCV, for the calls its type stubs describe too narrowly (a number as the second operand
#: of ``compare``, no second map for ``remap`` with fixed-point nearest maps)
_cv: Any = cv2


def _to_float(image: np.ndarray) -> np.ndarray:
    """uint8 HxWxC -> float32 HxWxC in [0, 1] (a new array)."""
    h, w, c = image.shape
    return _hwc(cv2.addWeighted(image, 1.0 / 255.0, image, 0.0, 0.0, dtype=cv2.CV_32F), c)


def _u8(y: np.ndarray, scale: float = 1.0, offset: float = 0.0) -> np.ndarray:
    """float (any shape OpenCV takes) -> uint8 ``y * scale + offset``, rounded half to even
    and saturated, in one pass."""
    return cv2.addWeighted(y, scale, y, 0.0, offset, dtype=cv2.CV_8U)


def _to_uint8(x: np.ndarray) -> np.ndarray:
    """float [0, 1] -> uint8 (rounded, saturated)."""
    return _u8(x, 255.0)


def _hwc(x: np.ndarray, channels: int) -> np.ndarray:
    """OpenCV drops a trailing 1-channel axis: put it back."""
    return x.reshape(x.shape[0], x.shape[1], channels)


def _plane(img: np.ndarray) -> np.ndarray:
    """HxWx1 -> HxW (a view) for OpenCV calls whose output must be 2-D; HxWx3 unchanged."""
    return img[:, :, 0] if img.shape[2] == 1 else img


def _gauss(x: np.ndarray, sigma: float, truncate: float = 4.0,
           border: int = cv2.BORDER_REPLICATE) -> np.ndarray:
    """Gaussian blur of an HxWxC (or HxW) float image, like skimage.filters.gaussian (mode
    'nearest', truncate 4): kernel half-width int(truncate*sigma + 0.5), capped at the longer
    side."""
    h, w = x.shape[:2]
    half = min(int(truncate * sigma + 0.5), max(h, w))
    k = 2 * half + 1
    out = cv2.GaussianBlur(x, (k, k), sigmaX=sigma, sigmaY=sigma, borderType=border)
    return out.reshape(x.shape)


@functools.cache
def _normal_table() -> np.ndarray:
    """2**16 standard-normal quantiles at the bin midpoints (i + 0.5) / 2**16, scaled to unit
    variance (the tails beyond +-4.17 are cut: their variance is restored by the scaling)."""
    nd = NormalDist()
    half = np.array([nd.inv_cdf((i + 0.5) / 65536.0) for i in range(32768, 65536)])
    table = np.concatenate([-half[::-1], half])
    return (table / math.sqrt(float(np.mean(table * table)))).astype(np.float32)


def _standard_normal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Standard-normal float32 draws: 16 random bits each, through ``_normal_table``
    (inverse transform sampling); ~4x faster than ``rng.standard_normal`` here."""
    n = math.prod(shape)
    bits = np.frombuffer(rng.bytes(2 * n), dtype="<u2")
    return np.take(_normal_table(), bits).reshape(shape)


def _motion_taps(radius: int, sigma: float, angle_deg: float, h: int,
                 w: int) -> list[tuple[int, int, float]]:
    """Taps (dy, dx, weight) of the reference one-sided motion blur (ImageMagick-style):
    out(p) = sum_i weight_i * img(p - (dy_i, dx_i)).

    Tap i (i = 0 .. 2*radius) has weight exp(-i^2 / 2 sigma^2) and samples the pixel
    round(i) steps back along the angle. Taps that leave an h x w image are dropped (as the
    reference does) and the kept weights renormalised to sum to 1; taps landing on the same
    offset are merged.
    """
    width = 2 * radius + 1
    a = math.radians(angle_deg)
    p0, p1 = width * math.sin(a), width * math.cos(a)
    hyp = math.hypot(p0, p1)
    merged: dict[tuple[int, int], float] = {}
    for i in range(width):
        dy = -math.ceil(i * p0 / hyp - 0.5)
        dx = -math.ceil(i * p1 / hyp - 0.5)
        if abs(dy) >= h or abs(dx) >= w:
            break
        merged[(dy, dx)] = merged.get((dy, dx), 0.0) + math.exp(-(i * i) / (2.0 * sigma ** 2))
    total = sum(merged.values())
    return [(dy, dx, wt / total) for (dy, dx), wt in merged.items()]


def _motion(x: np.ndarray, radius: int, sigma: float, angle_deg: float) -> np.ndarray:
    """Motion blur of a float32 HxW or HxWxC image (edge pixels replicated outside), as a
    weighted sum of shifted views of one padded copy."""
    h, w = x.shape[:2]
    taps = _motion_taps(radius, sigma, angle_deg, h, w)
    top = max(0, max(dy for dy, _, _ in taps))
    bottom = max(0, -min(dy for dy, _, _ in taps))
    left = max(0, max(dx for _, dx, _ in taps))
    right = max(0, -min(dx for _, dx, _ in taps))
    padded = cv2.copyMakeBorder(x, top, bottom, left, right, cv2.BORDER_REPLICATE)
    if x.ndim == 3 and padded.ndim == 2:
        padded = padded[:, :, None]
    out: np.ndarray | None = None
    for dy, dx, wt in taps:
        view = padded[top - dy:top - dy + h, left - dx:left - dx + w]
        out = view * np.float32(wt) if out is None else cv2.scaleAdd(view, wt, out, dst=out)
    assert out is not None
    return out.reshape(x.shape)


def _zoom_grid(n: int, zoom: float) -> tuple[int, int, float]:
    """The reference's ``clipped_zoom`` along one axis of length n: it crops the central
    ``ch = ceil(n / zoom)`` samples (first one ``top = (n - ch) // 2``) and up-samples them to
    ``size = round(ch * zoom)`` samples with ``scipy.ndimage.zoom(order=1)``, whose grid maps
    the first and last samples onto each other: output i samples ``top + i * step``.
    Returns (top, size, step)."""
    ch = math.ceil(n / zoom)
    size = round(ch * zoom)
    step = (ch - 1) / (size - 1) if size > 1 else 0.0
    return (n - ch) // 2, size, step


def _clipped_zoom(x: np.ndarray, zoom: float, crop: bool = True) -> np.ndarray:
    """Zoom an HxWxC float image in by ``zoom`` (>= 1) on the reference's grid (``_zoom_grid``),
    exactly: separable linear interpolation at those sample positions (all inside the image,
    so no border rule is needed). ``crop``: keep the first H rows and W columns (the reference
    may produce a row/column more; snow crops only after its motion blur).

    That grid is up to ~1 px off-centre and its scale up to 0.3% off ``zoom`` at 224 px, and it
    sets the interpolation phases, which decide how much the snow layer's noise is smoothed
    before its threshold; so snow uses this exact version.
    """
    assert zoom >= 1.0
    out = x
    for axis, n in ((0, x.shape[0]), (1, x.shape[1])):
        top, size, step = _zoom_grid(n, zoom)
        m = n if crop else size
        pos = top + step * np.arange(m)
        i0 = np.minimum(np.floor(pos).astype(np.intp), n - 1)
        i1 = np.minimum(i0 + 1, n - 1)
        shape = (m, 1, 1) if axis == 0 else (1, m, 1)
        f = (pos - i0).astype(x.dtype).reshape(shape)
        out = np.take(out, i0, axis=axis) * (1 - f) + np.take(out, i1, axis=axis) * f
    return out


@functools.lru_cache(maxsize=1024)
def _zoom_matrices(h: int, w: int, zrange: tuple[float, float, float]) -> tuple[np.ndarray, ...]:
    """Inverse affine maps (output -> input) of zoom_blur's layers on the reference's grid."""
    mats = []
    for z in np.arange(*zrange):
        ty, _, sy = _zoom_grid(h, float(z))
        tx, _, sx = _zoom_grid(w, float(z))
        mats.append(np.array([[sx, 0.0, tx], [0.0, sy, ty]], dtype=np.float64))
    return tuple(mats)


def _plasma_fractal(mapsize: int, wibbledecay: float, rng: np.random.Generator) -> np.ndarray:
    """Diamond-square height map, mapsize x mapsize (a power of two), *not* yet normalised
    (the reference then maps it to [0, 1]: (map - min) / (max - min); ``_fog`` does that on
    the part it uses).

    Same recurrence as the ImageNet-C ``plasma_fractal`` (itself after FLHerne/mapgen), with
    the same uniform draws in the same order: per level, the square centres, then the two
    sets of diamond points, each ``wibble * U(-wibble, wibble)`` (drawn here in one call per
    level; consecutive doubles, so the same values), and the same sums in the same order; the
    toroidal neighbours (``np.roll`` there) come from ``_roll``."""
    assert mapsize >= 2 and mapsize & (mapsize - 1) == 0
    maparray = np.zeros((mapsize, mapsize), dtype=np.float64)
    stepsize = mapsize
    wibble = 100.0
    while stepsize >= 2:
        half = stepsize // 2
        n = mapsize // stepsize
        noise = rng.uniform(-wibble, wibble, (3, n, n))
        noise *= wibble
        # squares: centre of each square = mean of its 4 corners + wibble
        corner = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        centre = corner + _roll(corner, -1, 0)
        centre += _roll(centre, -1, 1)
        centre /= 4
        centre += noise[0]
        maparray[half:mapsize:stepsize, half:mapsize:stepsize] = centre
        # diamonds: edge midpoints = mean of the two corners and two centres + wibble
        lt = centre + _roll(centre, 1, 0)
        lt += corner + _roll(corner, -1, 1)
        lt /= 4
        lt += noise[1]
        maparray[0:mapsize:stepsize, half:mapsize:stepsize] = lt
        tt = centre + _roll(centre, 1, 1)
        tt += corner + _roll(corner, -1, 0)
        tt /= 4
        tt += noise[2]
        maparray[half:mapsize:stepsize, 0:mapsize:stepsize] = tt
        stepsize //= 2
        wibble /= wibbledecay
    return maparray


def _roll(a: np.ndarray, shift: int, axis: int) -> np.ndarray:
    """``np.roll(a, shift, axis)`` for shift +-1 on a 2-D array, without its overhead (the
    plasma map calls it 48 times on mostly tiny arrays)."""
    if axis == 0:
        return np.concatenate((a[-shift:], a[:-shift]), axis=0)
    return np.concatenate((a[:, -shift:], a[:, :-shift]), axis=1)


# ---------------------------------------------------------------------------------------------
# Corruptions. Each takes the uint8 HxWxC image, the severity parameter and the rng and returns
# a uint8 image with H*W*C values (HxWxC or HxW; the caller reshapes). Float ones work on
# float32 in [0, 1] through ``_float``.
# ---------------------------------------------------------------------------------------------

Impl = Callable[[np.ndarray, Any, np.random.Generator], np.ndarray]


def _float(fn: Callable[[np.ndarray, Any, np.random.Generator], np.ndarray]) -> Impl:
    """A corruption written on float32 [0, 1] images as a uint8 -> uint8 one."""
    @functools.wraps(fn)
    def run(img: np.ndarray, param: Any, rng: np.random.Generator) -> np.ndarray:
        return _to_uint8(fn(_to_float(img), param, rng))
    return run


# IEEE-A1 noise

def _gaussian_noise(img: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    z = _standard_normal(rng, img.shape)
    return cv2.addWeighted(img, 1.0, z, 255.0 * sigma, 0.0, dtype=cv2.CV_8U)


@functools.cache
def _poisson_alias(photons: int) -> tuple[np.ndarray, np.ndarray]:
    """Walker alias tables of min(Poisson(k * photons / 255), photons) for k = 0..255, flat
    (index k * (photons + 1) + j): acceptance probability (float32) and alias (uint8)."""
    m = photons + 1
    prob = np.ones((256, m), dtype=np.float64)
    alias = np.tile(np.arange(m, dtype=np.uint8), (256, 1))
    for k in range(256):
        lam = k / 255.0 * photons
        pmf = np.empty(m)
        p = math.exp(-lam)
        for t in range(photons):
            pmf[t] = p
            p *= lam / (t + 1)
        pmf[photons] = max(0.0, 1.0 - float(pmf[:photons].sum()))
        scaled = pmf / pmf.sum() * m
        small = [j for j in range(m) if scaled[j] < 1.0]
        large = [j for j in range(m) if scaled[j] >= 1.0]
        while small and large:
            s, g = small.pop(), large.pop()
            prob[k, s] = scaled[s]
            alias[k, s] = g
            scaled[g] -= 1.0 - scaled[s]
            (small if scaled[g] < 1.0 else large).append(g)
        for j in small + large:          # numerically 1
            prob[k, j] = 1.0
    return prob.astype(np.float32).ravel(), alias.ravel()


def _truncated_poisson(rng: np.random.Generator, img: np.ndarray, photons: int) -> np.ndarray:
    """uint8 counts min(Poisson(img / 255 * photons), photons), one uniform per value (alias
    method: column j = floor(u m), kept if the fraction u m - j is below its acceptance
    probability, else its alias)."""
    m = photons + 1
    prob, alias = _poisson_alias(photons)
    h, w, c = img.shape
    u = rng.random((h, w * c), dtype=np.float32)
    u *= np.float32(m)
    j = u.astype(np.uint8)                                   # floor
    j = np.minimum(j, m - 1) if j.size == 1 else _cv.min(j, m - 1)   # u m may round up to m
    u -= j                                                   # the fraction
    idx = img.reshape(h, w * c).astype(np.int32)
    idx *= m
    idx += j
    if idx.size == 1:      # OpenCV would read 1x1 arrays as scalars
        return np.where(u < np.take(prob, idx), j, np.take(alias, idx)).astype(np.uint8)
    keep = cv2.compare(u, np.take(prob, idx), cv2.CMP_LT)    # 255 where column j is kept
    return cv2.bitwise_or(cv2.bitwise_and(j, keep),
                          cv2.bitwise_and(np.take(alias, idx), cv2.bitwise_not(keep)))


@functools.cache
def _shot_levels(photons: int) -> np.ndarray:
    t = np.arange(256, dtype=np.float64)
    return np.rint(np.clip(t / photons, 0.0, 1.0) * 255.0).astype(np.uint8)


def _shot_noise(img: np.ndarray, photons: int, rng: np.random.Generator) -> np.ndarray:
    return cv2.LUT(_truncated_poisson(rng, img, photons), _shot_levels(photons))


def _impulse_noise(img: np.ndarray, amount: float, rng: np.random.Generator) -> np.ndarray:
    h, w, c = img.shape
    u = rng.random((h, w * c), dtype=np.float32)
    if u.size == 1:      # OpenCV would read a 1x1 array next to a number as two scalars
        out = np.where(u < amount, np.where(u < amount / 2.0, 255, 0), img.reshape(1, 1))
        return out.astype(np.uint8)
    hit = _cv.compare(u, float(amount), cv2.CMP_LT)          # 255 where salt or pepper
    salt = _cv.compare(u, float(amount) / 2.0, cv2.CMP_LT)   # 255 where salt
    kept = cv2.bitwise_and(img.reshape(h, w * c), cv2.bitwise_not(hit))
    return cv2.bitwise_or(kept, salt)


def _random_impulse_noise(img: np.ndarray, amount: float,
                          rng: np.random.Generator) -> np.ndarray:
    hit = rng.random(img.shape, dtype=np.float32) < amount
    values = rng.integers(0, 256, size=img.shape, dtype=np.uint8)
    return np.where(hit, values, img)


def _speckle_noise(img: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    gain = cv2.addWeighted(_standard_normal(rng, img.shape), float(sigma), img, 0.0, 1.0,
                           dtype=cv2.CV_32F)                 # 1 + sigma * z
    return cv2.multiply(img, gain, dtype=cv2.CV_8U)


# IEEE-A2 blur

def _gaussian_blur(x: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    return _gauss(x, sigma)


def _glass_blur(x: np.ndarray, params: tuple[float, int, int],
                rng: np.random.Generator) -> np.ndarray:
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


@functools.cache
def _disk(radius: float, alias_blur: float) -> np.ndarray:
    """Gaussian-aliased disk kernel of the reference (L = -8..8 for radius <= 8), with the
    weights below 1e-12 of the largest set to 0 (with alias sigma 0.1 they are ~1e-22 and
    less, some float32 denormals, which slow filtering ~6x) and cropped to the rest."""
    half = 8 if radius <= 8 else math.floor(radius)
    ksize = (3, 3) if radius <= 8 else (5, 5)
    coords = np.arange(-half, half + 1)
    xx, yy = np.meshgrid(coords, coords)
    disk = ((xx ** 2 + yy ** 2) <= radius ** 2).astype(np.float32)
    disk /= disk.sum()
    kernel = cv2.GaussianBlur(disk, ksize=ksize, sigmaX=alias_blur)
    kernel[kernel < 1e-12 * kernel.max()] = 0.0
    live = np.flatnonzero(kernel.max(axis=0) > 0)
    r = max(int(half - live.min()), int(live.max() - half))   # symmetric: keep it centred
    return np.ascontiguousarray(kernel[half - r:half + r + 1, half - r:half + r + 1])


def _defocus_blur(x: np.ndarray, params: tuple[float, float],
                  rng: np.random.Generator) -> np.ndarray:
    radius, alias_blur = params
    h, w, c = x.shape
    kernel = _disk(min(radius, max(1, min(h, w) // 2)), alias_blur)
    return _hwc(cv2.filter2D(x, -1, kernel), c)


def _motion_blur(x: np.ndarray, params: tuple[int, float],
                 rng: np.random.Generator) -> np.ndarray:
    radius, sigma = params
    angle = rng.uniform(*MOTION_BLUR_ANGLE_RANGE)
    return _motion(x, radius, sigma, angle)


def _zoom_blur(img: np.ndarray, zrange: tuple[float, float, float],
               rng: np.random.Generator) -> np.ndarray:
    h, w, c = img.shape
    src = _plane(img)
    acc = src.astype(np.float32)
    mats = _zoom_matrices(h, w, tuple(zrange))
    for m in mats:
        layer = cv2.warpAffine(src, m, (w, h), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                               borderMode=cv2.BORDER_REPLICATE)
        cv2.accumulate(layer, acc)
    return _u8(acc, 1.0 / (len(mats) + 1))


# IEEE-A3 weather

def _snow(img: np.ndarray, params: tuple, rng: np.random.Generator) -> np.ndarray:
    loc, scale, zoom, threshold, radius, sigma, blend = params
    h, w, c = img.shape
    z = _standard_normal(rng, (h, w))
    layer = cv2.addWeighted(z, float(scale), z, 0.0, float(loc))        # N(loc, scale)
    layer = _clipped_zoom(layer[:, :, None], zoom, crop=False)[:, :, 0]  # may be a row larger
    layer[layer < threshold] = 0
    np.clip(layer, 0.0, 1.0, out=layer)
    layer = _motion(np.ascontiguousarray(layer), radius, sigma, rng.uniform(*SNOW_ANGLE_RANGE))
    flakes = np.rint(layer[:h, :w] * np.float32(255.0))    # cropped after the blur, as there
    flakes += flakes[::-1, ::-1]                           # and the same turned by 180 degrees
    x = _plane(img).astype(np.float32)
    grey = x if c == 1 else cv2.cvtColor(x, cv2.COLOR_RGB2GRAY)
    lifted = cv2.addWeighted(grey, 1.5, grey, 0.0, 127.5)          # grey * 1.5 + 0.5, levels
    if c == 3:      # (numpy's broadcasting of HxW against HxWx3 is slow: merge instead)
        lifted, flakes = cv2.merge([lifted] * 3), cv2.merge([flakes] * 3)
    y = cv2.addWeighted(x, float(blend), cv2.max(x, lifted), 1.0 - float(blend), 0.0)
    return cv2.add(y, flakes.astype(np.float32), dtype=cv2.CV_8U)


def _ridges(rng: np.random.Generator, h: int, w: int, cell: float) -> np.ndarray:
    """Smooth random field with features ~``cell`` px: Gaussian values on a grid, cubic
    up-sampling to at most 4x the grid, then linear to h x w."""
    gh, gw = max(2, math.ceil(h / cell) + 1), max(2, math.ceil(w / cell) + 1)
    grid = _standard_normal(rng, (gh, gw))
    mid = cv2.resize(grid, (max(1, min(w, 4 * gw)), max(1, min(h, 4 * gh))),
                     interpolation=cv2.INTER_CUBIC)
    return cv2.resize(mid, (w, h), interpolation=cv2.INTER_LINEAR).reshape(h, w)


def _needles(rng: np.random.Generator, h: int, w: int, style: str) -> np.ndarray:
    """Ice needles with side branches, splatted (one sample per pixel of length, tapering
    toward the tip) into an h x w float32 canvas that wraps around."""
    per_50k, length, branches, spread, orient_sd, taper, blen = FROST_NEEDLES[style]
    n = int(per_50k * h * w / 50_000)
    x0 = rng.random(n) * w
    y0 = rng.random(n) * h
    theta = rng.random() * 2.0 * math.pi + rng.standard_normal(n) * orient_sd
    size = length * rng.lognormal(0.0, 0.35, n)
    weight = rng.uniform(0.5, 1.0, n)
    t = (np.arange(branches) + rng.random((n, branches))) / branches     # along the parent
    side = np.where(np.arange(branches) % 2 == 0, -1.0, 1.0)
    bsize = size[:, None] * (1.0 - t) * blen * rng.uniform(0.6, 1.4, (n, branches))
    xs = np.concatenate([x0, (x0[:, None] + t * (size * np.cos(theta))[:, None]).ravel()])
    ys = np.concatenate([y0, (y0[:, None] + t * (size * np.sin(theta))[:, None]).ravel()])
    angle = np.concatenate([theta, (theta[:, None] + side * spread).ravel()])
    lengths = np.concatenate([size, bsize.ravel()])
    weights = np.concatenate([weight, np.repeat(weight * 0.7, branches)])
    steps = np.maximum(1, np.ceil(lengths).astype(np.intp))
    seg = np.repeat(np.arange(steps.size), steps)
    k = np.arange(seg.size) - (np.cumsum(steps) - steps)[seg]
    px = (xs[seg] + k * np.cos(angle)[seg]).astype(np.intp) % w
    py = (ys[seg] + k * np.sin(angle)[seg]).astype(np.intp) % h
    value = weights[seg] * (1.0 - taper * k / steps[seg])
    canvas = np.bincount(py * w + px, value, minlength=h * w).astype(np.float32)
    return cv2.GaussianBlur(canvas.reshape(h, w), (3, 3), 0.75)


def _glow(x: np.ndarray, factor: int = 4) -> np.ndarray:
    """A cheap wide blur: area down-sampling by ``factor``, linear back up."""
    h, w = x.shape
    small = cv2.resize(x, (max(1, w // factor), max(1, h // factor)),
                       interpolation=cv2.INTER_AREA)
    return cv2.resize(small, (w, h), interpolation=cv2.INTER_LINEAR).reshape(h, w)


def _frost_texture(style: str, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """An h x w float32 frost texture of one style, standardised (mean 0, std 1; a constant
    image, e.g. 1x1, is all 0)."""
    scale = min(1.0, FROST_MAX_SIDE / max(h, w))
    th, tw = max(1, round(h * scale)), max(1, round(w * scale))
    if style == "ice":            # wavy ice glass: smooth relief with bright wandering ridges
        ridge = _ridges(rng, th, tw, 12)
        t = _ridges(rng, th, tw, 64) + 0.5 * _ridges(rng, th, tw, 24)
        t += 0.8 * np.exp(-4.0 * ridge * ridge) + 0.15 * _ridges(rng, th, tw, 3)
    elif style == "needles":      # dense feathery needles, saturating to white
        nd = _needles(rng, th, tw, style)
        t = 1.0 - np.exp(-0.9 * nd - 0.3 * _glow(nd)) + 0.1 * _ridges(rng, th, tw, 40)
    elif style == "crystals":     # many small crystals over an uneven haze
        nd = _needles(rng, th, tw, style)
        t = 0.9 * nd + 0.4 * _glow(nd) + 0.3 * _ridges(rng, th, tw, 60)
        t += 0.1 * _ridges(rng, th, tw, 16)
    else:                         # ferns: long dendrites on dark glass
        nd = _needles(rng, th, tw, style)
        t = 0.7 * nd + 1.2 * _glow(nd) + 0.3 * _ridges(rng, th, tw, 50)
    tex: np.ndarray = np.asarray(t, dtype=np.float32)
    if (th, tw) != (h, w):
        tex = cv2.resize(tex, (w, h), interpolation=cv2.INTER_LINEAR).reshape(h, w)
    bend = FROST_BEND[style]
    return _standardise(np.exp(_standardise(tex) * np.float32(bend))
                        * np.float32(math.copysign(1.0, bend)))


def _standardise(t: np.ndarray) -> np.ndarray:
    """(t - mean) / std of a 2-D float32 array; all 0 for a constant one."""
    mean, std = cv2.meanStdDev(t)
    sd = float(std[0, 0])
    if sd <= 1e-6:
        return np.zeros_like(t)
    return cv2.addWeighted(t, 1.0 / sd, t, 0.0, -float(mean[0, 0]) / sd).reshape(t.shape)


def _frost(img: np.ndarray, params: tuple[float, float], rng: np.random.Generator) -> np.ndarray:
    texture = FROST_TEXTURES[int(rng.integers(len(FROST_TEXTURES)))]   # as randint(5) there
    return _frost_blend(img, params, texture, rng)


def _frost_blend(img: np.ndarray, params: tuple[float, float], texture: FrostTexture,
                 rng: np.random.Generator) -> np.ndarray:
    """x' = c0 x + c1 F with F = (mean + g mean_sd) + std z per channel, z the standardised
    texture of ``texture.style`` and g ~ N(0, 1) (grey images: the luminance of that)."""
    image_weight, frost_weight = params
    h, w, c = img.shape
    z = _frost_texture(texture.style, h, w, rng)
    g = float(rng.standard_normal())
    mean = np.array(texture.mean) + g * np.array(texture.mean_sd)
    std = np.array(texture.std)
    if c == 1:
        mean, std = np.array([mean @ LUMA]), np.array([std @ LUMA])
    # c1 (mean + std z), one channel at a time (numpy's broadcasting to HxWx3 is slow)
    planes = [cv2.addWeighted(z, frost_weight * float(sd), z, 0.0, frost_weight * float(m))
              for m, sd in zip(mean, std, strict=True)]
    layer = planes[0] if c == 1 else cv2.merge(planes)
    return cv2.addWeighted(_plane(img), float(image_weight), layer, 1.0, 0.0, dtype=cv2.CV_8U)


def _fog(img: np.ndarray, params: tuple[float, float], rng: np.random.Generator) -> np.ndarray:
    strength, decay = params
    h, w, c = img.shape
    mapsize = max(2, 1 << (max(h, w) - 1).bit_length())
    max_val = float(img.max()) / 255.0
    plasma = _plasma_fractal(mapsize, decay, rng)
    lo, hi = float(plasma.min()), float(plasma.max())
    k = 255.0 * strength / (hi - lo) if hi > lo else 0.0
    crop = plasma[:h, :w]
    haze = cv2.addWeighted(crop, k, crop, 0.0, -lo * k, dtype=cv2.CV_32F)   # 255 c0 plasma
    if c == 3:
        haze = cv2.merge([haze, haze, haze])
    # (x + c0 plasma) * max(x) / (max(x) + c0), in levels
    scale = max_val / (max_val + strength)
    return cv2.addWeighted(_plane(img), scale, haze, scale, 0.0, dtype=cv2.CV_8U)


@functools.cache
def _brightness_scale(delta: float) -> np.ndarray:
    """Per value level v: the factor that takes V = v to min(v + 255 delta, 255); level 0
    (black, any hue) maps to the grey min(255 delta, 255) via ``_brightness``."""
    v = np.arange(256, dtype=np.float64)
    nv = np.minimum(v / 255.0 + delta, 1.0) * 255.0
    scale = np.divide(nv, v, out=np.zeros_like(v), where=v > 0)
    return scale.astype(np.float32)


def _brightness(img: np.ndarray, delta: float, rng: np.random.Generator) -> np.ndarray:
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
    return cv2.multiply(_plane(src), gain, dtype=cv2.CV_8U)


def _spatter(x: np.ndarray, params: tuple, rng: np.random.Generator) -> np.ndarray:
    loc, scale, sigma, threshold, intensity, mode = params
    h, w, c = x.shape
    liquid = _gauss(rng.normal(loc, scale, (h, w)), sigma)     # float64, as the reference
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
    mask = _gauss((liquid > threshold).astype(np.float32), intensity)
    mask[mask < 0.8] = 0
    colour = mask[:, :, None] * (np.array(SPATTER_MUD_RGB, np.float32) / 255.0)
    if c == 1:
        colour = (colour @ np.array(SPATTER_GREY, np.float32))[:, :, None]
    return x * (1.0 - mask[:, :, None]) + colour


# IEEE-A4 digital

def _contrast(img: np.ndarray, factor: float, rng: np.random.Generator) -> np.ndarray:
    c = img.shape[2]
    means = np.array(cv2.mean(img)[:c]) / 255.0                 # float64, as the reference
    levels = np.arange(256, dtype=np.float64)[:, None] / 255.0
    lut = np.rint(np.clip(((levels - means) * factor + means) * 255.0, 0.0, 255.0))
    return cv2.LUT(img, lut.astype(np.uint8).reshape(256, 1, c))


def _saturate(x: np.ndarray, params: tuple[float, float], rng: np.random.Generator) -> np.ndarray:
    if x.shape[2] == 1:      # a grey pixel has no hue: the reference leaves it unchanged
        return x.copy()
    mult, offset = params
    hsv = cv2.cvtColor(x, cv2.COLOR_RGB2HSV)
    hsv[:, :, 1] = np.clip(hsv[:, :, 1] * mult + offset, 0.0, 1.0)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


@functools.lru_cache(maxsize=256)
def _pil_box_bounds(n_in: int, n_out: int) -> tuple[tuple[int, int], ...] | None:
    """(first input index, count) of the pixels Pillow's BOX filter averages for each output
    pixel along one axis (its ``precompute_coeffs``: box centred at (i + 0.5) * scale, pixels
    whose centre offset lies in (-scale/2, scale/2], equal weights); None if that is not one
    run of pixels (never seen)."""
    scale = n_in / n_out
    support = 0.5 * max(scale, 1.0)
    boxes = []
    for i in range(n_out):
        centre = (i + 0.5) * scale
        lo = max(0, int(centre - support + 0.5))
        hi = min(n_in, int(centre + support + 0.5))
        ones = [x for x in range(lo, hi) if -support < x - centre + 0.5 <= support]
        if not ones or ones != list(range(ones[0], ones[-1] + 1)):
            return None
        boxes.append((ones[0], len(ones)))
    return tuple(boxes)


@functools.lru_cache(maxsize=256)
def _pil_nearest_index(n_in: int, n_out: int) -> np.ndarray:
    """Source index of each output sample of Pillow's NEAREST resize from n_in to n_out,
    read off Pillow itself (OpenCV's nearest-neighbour grids differ at some sizes)."""
    row = Image.fromarray(np.arange(n_in, dtype=np.int32).reshape(1, n_in))       # mode "I"
    return np.asarray(row.resize((n_out, 1), Image.Resampling.NEAREST)).ravel().astype(np.intp)


@functools.lru_cache(maxsize=64)
def _pixelate_plan(n: int, factor: float) -> tuple[tuple[int, ...], tuple, tuple] | None:
    """For an n x n image: the box lengths, and the nearest-neighbour maps (OpenCV fixed-point)
    that pick each box's mean out of the stacked per-length mean images, first along x (to
    the small width), then along y fused with the up-sampling back to n x n. None where a box
    is longer than 3 pixels (Pillow is faster there)."""
    small = max(1, int(n * factor))
    boxes = _pil_box_bounds(n, small)
    if boxes is None or max(count for _, count in boxes) > 3:
        return None
    lengths = tuple(sorted({count for _, count in boxes}))
    offset, o = {}, 0
    for count in lengths:              # the mean images, stacked along the axis
        offset[count] = o
        o += n - count + 1
    pos = np.array([offset[count] + first for first, count in boxes], dtype=np.float32)
    near = _pil_nearest_index(small, n)
    rows = np.arange(n, dtype=np.float32)[:, None]
    hmap = cv2.convertMaps(np.ascontiguousarray(np.broadcast_to(pos[None, :], (n, small))),
                           np.ascontiguousarray(np.broadcast_to(rows, (n, small))),
                           cv2.CV_16SC2, nninterpolation=True)
    vmap = cv2.convertMaps(np.ascontiguousarray(np.broadcast_to(near[None, :], (n, n)),
                                                dtype=np.float32),
                           np.ascontiguousarray(np.broadcast_to(pos[near][:, None], (n, n))),
                           cv2.CV_16SC2, nninterpolation=True)
    return lengths, hmap, vmap


def _box_means(src: np.ndarray, n: int, axis: int) -> np.ndarray:
    """Means of n consecutive pixels along ``axis`` (1: x, 0: y) at every start, rounded half
    up as Pillow rounds them (uint8; the result is n - 1 shorter along that axis)."""
    if n == 1:
        return src
    if n == 2:          # (a + b) / 2, the 0.001 turns OpenCV's round-half-even into half-up
        a, b = (src[:, :-1], src[:, 1:]) if axis == 1 else (src[:-1], src[1:])
        return cv2.addWeighted(a, 0.5, b, 0.5, 1e-3)
    # n = 3: a sum of 3 over 3 is never a tie, so OpenCV's rounding is Pillow's
    out = cv2.boxFilter(src, -1, (n, 1) if axis == 1 else (1, n), anchor=(0, 0), normalize=True,
                        borderType=cv2.BORDER_REPLICATE)
    return out[:, :src.shape[1] - n + 1] if axis == 1 else out[:src.shape[0] - n + 1]


def _pixelate(img: np.ndarray, factor: float, rng: np.random.Generator) -> np.ndarray:
    """Pillow's BOX down-sampling and NEAREST up-sampling, as the reference, bit for bit.

    OpenCV's own resizes are not equivalent: INTER_AREA weights the pixels a fractional box
    cuts by area (Pillow takes the pixels whose centres fall in the box) and its nearest grids
    differ from Pillow's at some sizes (4-5 grey levels on average at 0.6, 0.4, 0.3). Three
    routes, all giving Pillow's pixels (tests/unit: every square side up to 79 and more):

    * square images whose boxes hold at most 3 pixels (factors 0.6, 0.5, 0.4 at 224 px): the
      box means per length along x (rounded half up, as each of Pillow's two passes rounds),
      picked per output column with one nearest remap; the same along y, fused with the
      nearest up-sampling into a second remap (Pillow runs x first on square images);
    * square images divided exactly by 2 or 4 (0.25 at 224 px): Pillow's reduce() along x,
      then along y (its BOX passes, bit for bit, about twice as fast);
    * otherwise Pillow's resize itself (on oblong images it sometimes runs y first).
    """
    h, w, c = img.shape
    src = _plane(img)
    plan = _pixelate_plan(w, factor) if h == w else None
    if plan is not None:
        lengths, (hmap, _), (vmap, _) = plan
        means = [_box_means(src, n, 1) for n in lengths]
        across = _cv.remap(means[0] if len(means) == 1 else cv2.hconcat(means), hmap, None,
                           cv2.INTER_NEAREST)
        means = [_box_means(across, n, 0) for n in lengths]
        return _cv.remap(means[0] if len(means) == 1 else cv2.vconcat(means), vmap, None,
                         cv2.INTER_NEAREST)
    sw, sh = max(1, int(w * factor)), max(1, int(h * factor))
    pil = Image.fromarray(src)
    n = w // sw
    if h == w and n * sw == w and n in (2, 4):
        # x n exactly: Pillow's NEAREST repeats each pixel n times, as OpenCV's does
        small = np.asarray(pil.reduce((n, 1)).reduce((1, n)))
        return cv2.resize(small, (w, h), interpolation=cv2.INTER_NEAREST)
    small_pil = pil.resize((sw, sh), Image.Resampling.BOX)
    return np.asarray(small_pil.resize((w, h), Image.Resampling.NEAREST))


def _jpeg(img: np.ndarray, quality: int, rng: np.random.Generator) -> np.ndarray:
    c = img.shape[2]
    src = img[:, :, 0] if c == 1 else cv2.cvtColor(img, cv2.COLOR_RGB2BGR)
    ok, buf = cv2.imencode(".jpg", src, [int(cv2.IMWRITE_JPEG_QUALITY), int(quality)])
    if not ok:  # pragma: no cover - OpenCV always encodes a valid uint8 image
        raise RuntimeError("JPEG encoding failed")
    if c == 1:
        out = cv2.imdecode(buf, cv2.IMREAD_GRAYSCALE)
    elif _IMREAD_RGB is not None:
        out = cv2.imdecode(buf, _IMREAD_RGB)
    else:                                                              # OpenCV < 4.10
        bgr = cv2.imdecode(buf, cv2.IMREAD_COLOR)
        out = None if bgr is None else cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    if out is None:  # pragma: no cover - OpenCV decodes what it encoded
        raise RuntimeError("JPEG decoding failed")
    return out


_IMREAD_RGB: int | None = getattr(cv2, "IMREAD_COLOR_RGB", None)


def _elastic_transform(x: np.ndarray, alpha: float, rng: np.random.Generator) -> np.ndarray:
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


# IEEE-A4 c) geometric: one 2x2 linear map about the centre plus a shift, black fill

def _warp(img: np.ndarray, a: np.ndarray, shift: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
    """Output pixel p shows the input at the point that the forward map x -> a (x - centre)
    + centre + shift sends to p; outside the image: 0."""
    h, w, _ = img.shape
    centre = np.array([(w - 1) / 2.0, (h - 1) / 2.0])
    m = np.hstack([a, (centre + np.asarray(shift) - a @ centre)[:, None]])
    return cv2.warpAffine(_plane(img), m, (w, h), flags=cv2.INTER_LINEAR,
                          borderMode=cv2.BORDER_CONSTANT, borderValue=(0, 0, 0, 0))


def _rotation_matrix(degrees: float) -> np.ndarray:
    t = math.radians(degrees)
    return np.array([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]])


def _rotation(img: np.ndarray, degrees: float, rng: np.random.Generator) -> np.ndarray:
    sign = float(rng.choice((-1.0, 1.0)))
    return _warp(img, _rotation_matrix(sign * degrees))


def _translation(img: np.ndarray, frac: float, rng: np.random.Generator) -> np.ndarray:
    h, w, _ = img.shape
    direction = rng.uniform(0.0, 2.0 * math.pi)
    return _warp(img, np.eye(2), (frac * w * math.cos(direction), frac * h * math.sin(direction)))


def _scale(img: np.ndarray, factor: float, rng: np.random.Generator) -> np.ndarray:
    zoom_in = bool(rng.integers(2))
    return _warp(img, np.eye(2) * (factor if zoom_in else 1.0 / factor))


def _shear(img: np.ndarray, degrees: float, rng: np.random.Generator) -> np.ndarray:
    sign = float(rng.choice((-1.0, 1.0)))
    horizontal = bool(rng.integers(2))
    k = math.tan(math.radians(sign * degrees))
    return _warp(img, np.array([[1.0, k], [0.0, 1.0]] if horizontal else [[1.0, 0.0], [k, 1.0]]))


def _affine(img: np.ndarray, params: tuple[float, float, float, float],
            rng: np.random.Generator) -> np.ndarray:
    rot, dscale, shear, trans = params
    h, w, _ = img.shape
    rot_sign, shear_sign, zoom_sign = rng.choice((-1.0, 1.0), size=3)
    direction = rng.uniform(0.0, 2.0 * math.pi)
    sh = np.array([[1.0, math.tan(math.radians(shear_sign * shear))], [0.0, 1.0]])
    a = _rotation_matrix(rot_sign * rot) @ sh * (1.0 + zoom_sign * dscale)
    return _warp(img, a, (trans * w * math.cos(direction), trans * h * math.sin(direction)))


# IEEE-A5 mask

def _occlusion(img: np.ndarray, frac: float, rng: np.random.Generator) -> np.ndarray:
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


_IMPLS: dict[str, Impl] = {
    "gaussian_noise": _gaussian_noise,
    "shot_noise": _shot_noise,
    "impulse_noise": _impulse_noise,
    "random_impulse_noise": _random_impulse_noise,
    "speckle_noise": _speckle_noise,
    "defocus_blur": _float(_defocus_blur),
    "glass_blur": _float(_glass_blur),
    "motion_blur": _float(_motion_blur),
    "zoom_blur": _zoom_blur,
    "gaussian_blur": _float(_gaussian_blur),
    "snow": _snow,
    "frost": _frost,
    "fog": _fog,
    "brightness": _brightness,
    "spatter": _float(_spatter),
    "contrast": _contrast,
    "saturate": _float(_saturate),
    "pixelate": _pixelate,
    "jpeg_compression": _jpeg,
    "elastic_transform": _float(_elastic_transform),
    "rotation": _rotation,
    "translation": _translation,
    "scale": _scale,
    "shear": _shear,
    "affine": _affine,
    "occlusion": _occlusion,
}
assert set(_IMPLS) == set(CORRUPTIONS)


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
    img = np.ascontiguousarray(image.reshape(shape[0], shape[1], -1))
    out = _IMPLS[corruption_id](img, param, rng)
    if out.dtype != np.uint8 or out.size != image.size:  # pragma: no cover - a bug here
        raise AssertionError(f"{corruption_id} returned {out.dtype} {out.shape} for {shape}")
    return np.ascontiguousarray(out).reshape(shape)


# ---------------------------------------------------------------------------------------------
# The registry's view (registry.py): one PerturbationSpec per corruption
# ---------------------------------------------------------------------------------------------

def _registry_apply(corruption_id: str) -> Callable[[np.ndarray, Any, np.random.Generator,
                                                     ApplyContext], np.ndarray]:
    def apply(image: np.ndarray, level: Any, rng: np.random.Generator,
              ctx: ApplyContext) -> np.ndarray:
        return apply_corruption(corruption_id, image, level, rng)
    apply.__name__ = f"apply_{corruption_id}"
    return apply


#: Every corruption as a catalogue entry (kind "corruption", severities 1..5, the severity
#: table as ``level_table``), in registry order.
SPECS: tuple[PerturbationSpec, ...] = tuple(
    PerturbationSpec(
        id=c.id, kind="corruption", family=c.family, refs=(c.ieee_ref,),
        description=c.description, level_kind="severity", levels=(1, 2, 3, 4, 5),
        level_table=c.severity_params, level_table_doc=c.table_doc,
        characterisation=c.characterisation, apply=_registry_apply(c.id))
    for c in CORRUPTIONS.values())
