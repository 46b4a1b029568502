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

Frost: see ``frost.py`` (a procedural texture calibrated to the reference's photographs).

Layout: one module per family, each with its severity tables at the top (``noise``, ``blur``,
``weather``, ``frost``, ``digital``, ``geometric``); shared pixel helpers (``pixels``), the fast
samplers (``sampling``), the diamond-square map (``plasma``, shared with the PER-1 properties);
``specs`` wires them to ids (``CORRUPTIONS``, ``SPECS``, ``apply_corruption``). Everything
importable from this package before the split still is.

Names. Where the catalogue holds two algorithms for one phenomenon, the names say which: the
ImageNet-C ``imagenet_c_fog``, ``imagenet_c_snow``, ``imagenet_c_motion_blur`` and
``calibrated_frost`` here, the PER-1 ``per_fog``, ``per_snow``, ``per_motion_blur`` and
``per_frost`` in ``properties``.

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
* the diamond-square plasma map of fog (``plasma.py``) draws its uniforms one level at a time (the same values
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

from fortis.services.perturbation.corruptions.blur import (
    DEFOCUS_BLUR_PARAMS,
    GAUSSIAN_BLUR_SIGMA,
    GLASS_BLUR_PARAMS,
    MOTION_BLUR_ANGLE_RANGE,
    MOTION_BLUR_PARAMS,
    ZOOM_BLUR_RANGES,
)
from fortis.services.perturbation.corruptions.digital import (
    CONTRAST_FACTOR,
    ELASTIC_ALPHA,
    JPEG_QUALITY,
    PIXELATE_FACTOR,
    SATURATE_PARAMS,
)
from fortis.services.perturbation.corruptions.frost import (
    FROST_BEND,
    FROST_BLEND,
    FROST_MAX_SIDE,
    FROST_NEEDLES,
    FROST_TEXTURES,
    LUMA,
    FrostTexture,
)
from fortis.services.perturbation.corruptions.geometric import (
    AFFINE_PARAMS,
    OCCLUSION_AREA,
    OCCLUSION_ASPECT_RANGE,
    ROTATION_DEGREES,
    SCALE_FACTOR,
    SHEAR_DEGREES,
    TRANSLATION_FRACTION,
)
from fortis.services.perturbation.corruptions.noise import (
    GAUSSIAN_NOISE_SIGMA,
    IMPULSE_NOISE_AMOUNT,
    RANDOM_IMPULSE_AMOUNT,
    SHOT_NOISE_PHOTONS,
    SPECKLE_NOISE_SIGMA,
)
from fortis.services.perturbation.corruptions.specs import (
    CORRUPTIONS,
    SPECS,
    CorruptionSpec,
    apply_corruption,
    list_corruptions,
)
from fortis.services.perturbation.corruptions.weather import (
    BRIGHTNESS_DELTA,
    FOG_PARAMS,
    SNOW_ANGLE_RANGE,
    SNOW_PARAMS,
    SPATTER_EMBOSS,
    SPATTER_GREY,
    SPATTER_MUD_RGB,
    SPATTER_PARAMS,
    SPATTER_WATER_RGB,
)

__all__ = [
    "AFFINE_PARAMS",
    "BRIGHTNESS_DELTA",
    "CONTRAST_FACTOR",
    "CORRUPTIONS",
    "CorruptionSpec",
    "DEFOCUS_BLUR_PARAMS",
    "ELASTIC_ALPHA",
    "FOG_PARAMS",
    "FROST_BEND",
    "FROST_BLEND",
    "FROST_MAX_SIDE",
    "FROST_NEEDLES",
    "FROST_TEXTURES",
    "FrostTexture",
    "GAUSSIAN_BLUR_SIGMA",
    "GAUSSIAN_NOISE_SIGMA",
    "GLASS_BLUR_PARAMS",
    "IMPULSE_NOISE_AMOUNT",
    "JPEG_QUALITY",
    "LUMA",
    "MOTION_BLUR_ANGLE_RANGE",
    "MOTION_BLUR_PARAMS",
    "OCCLUSION_AREA",
    "OCCLUSION_ASPECT_RANGE",
    "PIXELATE_FACTOR",
    "RANDOM_IMPULSE_AMOUNT",
    "ROTATION_DEGREES",
    "SATURATE_PARAMS",
    "SCALE_FACTOR",
    "SHEAR_DEGREES",
    "SHOT_NOISE_PHOTONS",
    "SNOW_ANGLE_RANGE",
    "SNOW_PARAMS",
    "SPATTER_EMBOSS",
    "SPATTER_GREY",
    "SPATTER_MUD_RGB",
    "SPATTER_PARAMS",
    "SPATTER_WATER_RGB",
    "SPECKLE_NOISE_SIGMA",
    "SPECS",
    "TRANSLATION_FRACTION",
    "ZOOM_BLUR_RANGES",
    "apply_corruption",
    "list_corruptions",
]
