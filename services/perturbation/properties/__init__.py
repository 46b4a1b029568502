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

Layout: ``tables`` (the epsilon = 1 parameters, ``EPSILON_ONE``), ``knobs`` (shared helpers),
``transforms`` (luminance, spatial, blur, noise), ``weather`` (fog, snow, frost), ``specs`` (the
catalogue entries and ``apply_property``). Every function is named after its property id
(``per_fog``, ``per_motion_blur``, ...; the frost texture ``dendritic_frost_texture``), so no name
is shared with the ImageNet-C corruptions of the same phenomena (``imagenet_c_fog``, ...), which
are different algorithms. The diamond-square map is the one of ``corruptions/plasma.py``.
"""

from __future__ import annotations

from fortis.services.perturbation.properties.specs import (
    PROPERTIES,
    SPECS,
    PropertyFn,
    apply_property,
    check_epsilon,
)
from fortis.services.perturbation.properties.tables import (
    BLENDED_NOISE_MAX,
    BRIGHTNESS_MAX_DELTA,
    CONTRAST_MAX,
    CONTRAST_TARGET,
    EPSILON_ONE,
    FOG_DECAY,
    FOG_MAX_STRENGTH,
    FROST_BRANCHES,
    FROST_CANVAS,
    FROST_DEPTH,
    FROST_HAZE_DECAY,
    FROST_IMAGE_WEIGHT,
    FROST_NEEDLE,
    FROST_SEEDS,
    FROST_TEXTURE_MAX,
    FROST_TINT,
    GAUSSIAN_BLUR_MAX_SIGMA_FRAC,
    GAUSSIAN_NOISE_MAX_STD,
    MOTION_BLUR_ANGLE_DEG,
    MOTION_BLUR_MAX_FRAC,
    ROT_TRANS_MAX_DEG,
    ROT_TRANS_MAX_SHIFT_FRAC,
    ROTATION_MAX_DEG,
    SALT_PEPPER_MAX,
    SNOW_ANGLE_DEG,
    SNOW_MAX_FLAKES,
    SNOW_RADIUS2_FRAC,
    SNOW_SIDE_FRAC,
    SNOW_STREAK_FRAC,
    TRANSLATION_MAX_FRAC,
    UNIFORM_NOISE_MAX,
)

__all__ = [
    "BLENDED_NOISE_MAX",
    "BRIGHTNESS_MAX_DELTA",
    "CONTRAST_MAX",
    "CONTRAST_TARGET",
    "EPSILON_ONE",
    "FOG_DECAY",
    "FOG_MAX_STRENGTH",
    "FROST_BRANCHES",
    "FROST_CANVAS",
    "FROST_DEPTH",
    "FROST_HAZE_DECAY",
    "FROST_IMAGE_WEIGHT",
    "FROST_NEEDLE",
    "FROST_SEEDS",
    "FROST_TEXTURE_MAX",
    "FROST_TINT",
    "GAUSSIAN_BLUR_MAX_SIGMA_FRAC",
    "GAUSSIAN_NOISE_MAX_STD",
    "MOTION_BLUR_ANGLE_DEG",
    "MOTION_BLUR_MAX_FRAC",
    "PROPERTIES",
    "PropertyFn",
    "ROTATION_MAX_DEG",
    "ROT_TRANS_MAX_DEG",
    "ROT_TRANS_MAX_SHIFT_FRAC",
    "SALT_PEPPER_MAX",
    "SNOW_ANGLE_DEG",
    "SNOW_MAX_FLAKES",
    "SNOW_RADIUS2_FRAC",
    "SNOW_SIDE_FRAC",
    "SNOW_STREAK_FRAC",
    "SPECS",
    "TRANSLATION_MAX_FRAC",
    "UNIFORM_NOISE_MAX",
    "apply_property",
    "check_epsilon",
]
