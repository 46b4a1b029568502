"""The corruption catalogue (IEEE-A1..A5): one ``CorruptionSpec`` per corruption with its family,
requirement, severity table, the name of each component of a table entry (``level_fields``) and
its DEG-5 characterisation; ``apply_corruption``, the single entry point; and ``SPECS``, the
same corruptions as ``PerturbationSpec`` entries of the one registry (``registry.py``).

The algorithms live in one module per family (``noise``, ``blur``, ``weather``, ``frost``,
``digital``, ``geometric``), each with its severity tables at the top; this module only wires
them to ids, so adding a corruption is one function plus one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.corruptions import (
    blur,
    digital,
    frost,
    geometric,
    noise,
    weather,
)
from fortis.services.perturbation.corruptions.blur import (
    DEFOCUS_BLUR_PARAMS,
    GAUSSIAN_BLUR_SIGMA,
    GLASS_BLUR_PARAMS,
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
from fortis.services.perturbation.corruptions.frost import FROST_BLEND
from fortis.services.perturbation.corruptions.geometric import (
    AFFINE_PARAMS,
    OCCLUSION_AREA,
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
from fortis.services.perturbation.corruptions.pixels import Impl, float_impl
from fortis.services.perturbation.corruptions.weather import (
    BRIGHTNESS_DELTA,
    FOG_PARAMS,
    SNOW_PARAMS,
    SPATTER_PARAMS,
)
from fortis.services.perturbation.spec import (
    ApplyContext,
    Characterisation,
    PerturbationSpec,
    characterisation,
    check_image,
)


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
    table_doc: str = ""     # what an entry of severity_params means (prose)
    level_fields: tuple[str, ...] = ()   # a snake_case name per component of an entry


def _c(cid: str, family: str, ref: str, description: str, table: tuple, table_doc: str,
       char: Characterisation, fields: tuple[str, ...]) -> CorruptionSpec:
    return CorruptionSpec(id=cid, family=family, ieee_ref=ref,
                          stochastic=char.randomness == "stochastic", description=description,
                          severity_params=table, characterisation=char, table_doc=table_doc,
                          level_fields=fields)


#: DEG-5 characterisation, short for the table below
_char = characterisation

# DEG-5 (Swingler, seed 001): global = every pixel altered, local = only some; colour = the
# palette is remapped (a function of the pixel's own value, or a blend toward a colour), pixel
# = pixels are moved, mixed with their neighbours or replaced one by one.
CORRUPTIONS: dict[str, CorruptionSpec] = {c.id: c for c in (
    # IEEE-A1 noise
    _c("gaussian_noise", "noise", "IEEE-A1", "additive Gaussian noise", GAUSSIAN_NOISE_SIGMA,
       "std of the noise, [0,1] scale", _char("global", "stochastic", "pixel"),
       ("noise_std",)),
    _c("shot_noise", "noise", "IEEE-A1", "Poisson (shot) noise", SHOT_NOISE_PHOTONS,
       "photons per unit intensity (lower = noisier)", _char("global", "stochastic", "pixel"),
       ("photons_per_unit_intensity",)),
    _c("impulse_noise", "noise", "IEEE-A1", "salt-and-pepper impulse noise",
       IMPULSE_NOISE_AMOUNT, "fraction of values set to 0 or 255",
       _char("local", "stochastic", "pixel"),
       ("replaced_fraction",)),
    _c("random_impulse_noise", "noise", "IEEE-A1",
       "random-valued impulse noise: values replaced by a uniform random value",
       RANDOM_IMPULSE_AMOUNT, "fraction of values replaced", _char("local", "stochastic", "pixel"),
       ("replaced_fraction",)),
    _c("speckle_noise", "noise", "IEEE-A1", "multiplicative Gaussian noise", SPECKLE_NOISE_SIGMA,
       "std of the multiplicative noise", _char("global", "stochastic", "pixel"),
       ("multiplicative_noise_std",)),
    # IEEE-A2 blur
    _c("defocus_blur", "blur", "IEEE-A2", "filter with a Gaussian-aliased disk",
       DEFOCUS_BLUR_PARAMS, "(disk radius px, alias sigma px)",
       _char("global", "deterministic", "pixel"),
       ("disk_radius_px", "alias_sigma_px")),
    _c("glass_blur", "blur", "IEEE-A2", "frosted glass: blur, random local pixel swaps, blur",
       GLASS_BLUR_PARAMS, "(sigma px, max swap distance px, iterations)",
       _char("global", "stochastic", "pixel"),
       ("sigma_px", "max_swap_distance_px", "iterations")),
    _c("motion_blur", "blur", "IEEE-A2", "line kernel at a random angle in [-45,45) deg",
       MOTION_BLUR_PARAMS, "(radius px, tap sigma px)", _char("global", "stochastic", "pixel"),
       ("radius_px", "tap_sigma_px")),
    _c("zoom_blur", "blur", "IEEE-A2", "mean of the image and centre-zoomed copies",
       ZOOM_BLUR_RANGES, "zoom factors numpy.arange(start, stop, step)",
       _char("global", "deterministic", "pixel"),
       ("zoom_start", "zoom_stop", "zoom_step")),
    _c("gaussian_blur", "blur", "IEEE-A2", "Gaussian smoothing", GAUSSIAN_BLUR_SIGMA,
       "sigma px", _char("global", "deterministic", "pixel"),
       ("sigma_px",)),
    # IEEE-A3 weather
    _c("snow", "weather", "IEEE-A3",
       "random snow flakes streaked by motion blur over a brightened image", SNOW_PARAMS,
       "(flake mean, flake std, flake zoom, threshold, streak radius px, streak sigma px, "
       "image blend)", _char("global", "stochastic", "pixel"),
       ("flake_mean", "flake_std", "flake_zoom", "threshold", "streak_radius_px",
        "streak_sigma_px", "image_blend")),
    _c("frost", "weather", "IEEE-A3",
       "blend with a procedural frost-on-glass texture (one of five styles, calibrated to the "
       "ImageNet-C frost photographs, see FROST_TEXTURES)", FROST_BLEND,
       "(image weight c0, frost weight c1): x' = c0 x + c1 frost",
       _char("global", "stochastic", "pixel"),
       ("image_weight", "frost_weight")),
    _c("fog", "weather", "IEEE-A3", "diamond-square plasma fog", FOG_PARAMS,
       "(fog strength, plasma wibble decay)", _char("global", "stochastic", "colour"),
       ("fog_strength", "plasma_wibble_decay")),
    _c("brightness", "weather", "IEEE-A3", "add c to the HSV value channel (also IEEE-A4 a))",
       BRIGHTNESS_DELTA, "c added to V, [0,1] scale", _char("global", "deterministic", "colour"),
       ("value_added",)),
    _c("spatter", "weather", "IEEE-A3",
       "liquid (severities 1-3: water drops) or mud (4-5: brown blobs) splashed on the lens",
       SPATTER_PARAMS, "(liquid mean, liquid std, blur sigma px, threshold, intensity, "
       "mode 0 = liquid / 1 = mud)", _char("local", "stochastic", "pixel"),
       ("liquid_mean", "liquid_std", "blur_sigma_px", "threshold", "intensity", "mode")),
    # IEEE-A4 digital
    _c("contrast", "digital", "IEEE-A4", "blend toward the per-channel mean", CONTRAST_FACTOR,
       "fraction of the deviation from the mean kept", _char("global", "deterministic", "colour"),
       ("deviation_kept",)),
    _c("saturate", "digital", "IEEE-A4",
       "scale and shift HSV saturation (grey images unchanged)", SATURATE_PARAMS,
       "(multiplier, offset) of S", _char("global", "deterministic", "colour"),
       ("saturation_multiplier", "saturation_offset")),
    _c("pixelate", "digital", "IEEE-A4", "box down-sample then nearest up-sample",
       PIXELATE_FACTOR, "down-sampling factor", _char("global", "deterministic", "pixel"),
       ("downsampling_factor",)),
    _c("jpeg_compression", "digital", "IEEE-A4", "JPEG encode/decode", JPEG_QUALITY,
       "JPEG quality", _char("global", "deterministic", "colour"),
       ("jpeg_quality",)),
    _c("elastic_transform", "digital", "IEEE-A4", "smoothed random displacement field",
       ELASTIC_ALPHA, "alpha (displacement gain)", _char("global", "stochastic", "pixel"),
       ("alpha",)),
    # IEEE-A4 c) geometric
    _c("rotation", "geometric", "IEEE-A4", "rotation about the centre, random sense, black fill",
       ROTATION_DEGREES, "angle in degrees", _char("global", "stochastic", "pixel"),
       ("angle_deg",)),
    _c("translation", "geometric", "IEEE-A4", "shift in a random direction, black fill",
       TRANSLATION_FRACTION, "shift as a fraction of (width, height)",
       _char("global", "stochastic", "pixel"),
       ("shift_fraction",)),
    _c("scale", "geometric", "IEEE-A4", "zoom in or out about the centre, black fill",
       SCALE_FACTOR, "zoom factor s (x s or x 1/s)", _char("global", "stochastic", "pixel"),
       ("zoom_factor",)),
    _c("shear", "geometric", "IEEE-A4",
       "horizontal or vertical shear about the centre, random sign, black fill", SHEAR_DEGREES,
       "shear angle in degrees", _char("global", "stochastic", "pixel"),
       ("shear_deg",)),
    _c("affine", "geometric", "IEEE-A4",
       "rotation+scale+shear+translation at once, black fill", AFFINE_PARAMS,
       "(rotation deg, scale change, shear deg, translation fraction)",
       _char("global", "stochastic", "pixel"),
       ("rotation_deg", "scale_change", "shear_deg", "translation_fraction")),
    # IEEE-A5 mask
    _c("occlusion", "mask", "IEEE-A5", "one random rectangle of random solid colour",
       OCCLUSION_AREA, "fraction of the image area covered", _char("local", "stochastic", "pixel"),
       ("area_fraction",)),
)}


def list_corruptions() -> list[CorruptionSpec]:
    """Every corruption, in registry order (IEEE-A1 .. IEEE-A5)."""
    return list(CORRUPTIONS.values())


#: id -> implementation (uint8 HxWxC, the severity's table entry, rng) -> uint8 values.
_IMPLS: dict[str, Impl] = {
    "gaussian_noise": noise.gaussian_noise,
    "shot_noise": noise.shot_noise,
    "impulse_noise": noise.impulse_noise,
    "random_impulse_noise": noise.random_impulse_noise,
    "speckle_noise": noise.speckle_noise,
    "defocus_blur": float_impl(blur.defocus_blur),
    "glass_blur": float_impl(blur.glass_blur),
    "motion_blur": float_impl(blur.imagenet_c_motion_blur),
    "zoom_blur": blur.zoom_blur,
    "gaussian_blur": float_impl(blur.gaussian_blur),
    "snow": weather.imagenet_c_snow,
    "frost": frost.calibrated_frost,
    "fog": weather.imagenet_c_fog,
    "brightness": weather.brightness,
    "spatter": float_impl(weather.spatter),
    "contrast": digital.contrast,
    "saturate": float_impl(digital.saturate),
    "pixelate": digital.pixelate,
    "jpeg_compression": digital.jpeg_compression,
    "elastic_transform": float_impl(digital.elastic_transform),
    "rotation": geometric.rotation,
    "translation": geometric.translation,
    "scale": geometric.scale,
    "shear": geometric.shear,
    "affine": geometric.affine,
    "occlusion": geometric.occlusion,
}
assert set(_IMPLS) == set(CORRUPTIONS)


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
                              f"unknown corruption '{corruption_id}'; "
                              f"known: {', '.join(CORRUPTIONS)}")
    if isinstance(severity, bool) or not isinstance(severity, int | np.integer) \
            or not 1 <= int(severity) <= 5:
        raise InvalidArgument("severity", f"must be an integer in 1..5, got {severity!r}")
    check_image(image)
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
        level_table=c.severity_params, level_table_doc=c.table_doc, level_fields=c.level_fields,
        characterisation=c.characterisation, apply=_registry_apply(c.id))
    for c in CORRUPTIONS.values())
