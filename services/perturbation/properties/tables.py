"""PER-1 parameter tables: the value of every property's parameter at epsilon = 1 and where it
comes from (seed 004 and the authors' Perceptron benchmark), as visible data. ``EPSILON_ONE`` is
what the catalogue lists as each property's level table."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

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
