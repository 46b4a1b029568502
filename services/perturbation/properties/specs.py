"""The PER-1 catalogue: ``check_epsilon``, ``apply_property`` and one ``PerturbationSpec`` per
safety property (``SPECS``, ``PROPERTIES``), each with its epsilon = 1 table (``EPSILON_ONE``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.properties import transforms, weather
from fortis.services.perturbation.properties.knobs import Params
from fortis.services.perturbation.properties.tables import (
    EPSILON_ONE,
    MOTION_BLUR_ANGLE_DEG,
    SNOW_ANGLE_DEG,
)
from fortis.services.perturbation.spec import (
    ApplyContext,
    ApplyFn,
    Characterisation,
    Param,
    PerturbationSpec,
    characterisation,
    check_image,
)

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
    apply.__name__ = f"apply_{fn.__name__}"
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


#: DEG-5 characterisation, short for the table below
_char = characterisation


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
    _spec("per_brightness", "luminance", transforms.per_brightness, _G_DET_COL,
          "add direction * epsilon to every value (paper Eq. 1); eps = 1: all white (or black)",
          (_DIRECTION,)),
    _spec("per_contrast_reduction", "luminance", transforms.per_contrast_reduction, _G_DET_COL,
          "blend toward mid-grey: (1 - eps) x + eps * 0.5 (paper Eq. 2)"),
    # spatial
    _spec("per_rotation", "spatial", transforms.per_rotation, _G_DET_PIX,
          "rotate about the centre by direction * eps * 180 degrees, black fill (paper Eq. 3)",
          (_DIRECTION,)),
    _spec("per_horizontal_translation", "spatial", transforms.per_horizontal_translation,
          _G_DET_PIX,
          "shift right (direction +1) or left by round(eps * width) px, black fill",
          (_DIRECTION,)),
    _spec("per_vertical_translation", "spatial", transforms.per_vertical_translation, _G_DET_PIX,
          "shift down (direction +1) or up by round(eps * height) px, black fill",
          (_DIRECTION,)),
    _spec("per_rotation_translation", "spatial", transforms.per_rotation_translation, _G_DET_PIX,
          "rotate by eps * 180 degrees and shift by eps * 5/224 of the size, one warp",
          (_DIRECTION,)),
    # blur
    _spec("per_motion_blur", "blur", transforms.per_motion_blur, _G_DET_PIX,
          "line kernel of length eps * min(H, W) at a fixed angle (paper Eq. 4)",
          (Param(name="angle_deg", type="float", default=MOTION_BLUR_ANGLE_DEG, minimum=0.0,
                 maximum=180.0, description="motion direction in degrees (90 = vertical, "
                 "the paper's; 0 = horizontal, the code's default)"),)),
    _spec("per_gaussian_blur", "blur", transforms.per_gaussian_blur, _G_DET_PIX,
          "Gaussian blur, sigma = eps * 0.2 * max(H, W) (paper Eq. 5)"),
    # corruption
    _spec("per_uniform_noise", "corruption", transforms.per_uniform_noise, _G_STO_PIX,
          "x + eps * U(-eps, eps) per value: one U(-1, 1) field scaled by eps^2 (paper Eq. 6)"),
    _spec("per_gaussian_noise", "corruption", transforms.per_gaussian_noise, _G_STO_PIX,
          "x + eps * N(0, eps/sqrt 3) per value: one N(0, 1) field scaled (paper Eq. 7)"),
    _spec("per_blended_uniform_noise", "corruption", transforms.per_blended_uniform_noise,
          _G_STO_PIX,
          "(1 - eps) x + eps * a uniform random image (paper Eq. 8)"),
    _spec("per_salt_and_pepper", "corruption", transforms.per_salt_and_pepper,
          _char("local", "stochastic", "pixel"),
          "a fraction eps of the pixels set to black or white, half each (paper Eq. 9)"),
    # weather
    _spec("per_fog", "weather", weather.per_fog, _char("global", "stochastic", "colour"),
          "diamond-square fog, strength 3.5 eps, wibble decay 2.3 -> 1.0 (paper Eq. 10)"),
    _spec("per_snow", "weather", weather.per_snow, _char("local", "stochastic", "pixel"),
          "ceil(eps * 100) motion-blurred snow flakes of 1/100 of the image (paper II-B-5b)",
          (Param(name="angle_deg", type="float", default=SNOW_ANGLE_DEG, minimum=0.0,
                 maximum=180.0, description="direction of the flakes' motion blur, degrees"),)),
    _spec("per_frost", "weather", weather.per_frost, _char("global", "stochastic", "colour"),
          "(1 - eps/2) x + 0.8 eps * a procedural frost texture drawn from the rng"),
)

#: id -> spec, in PER-1 order.
PROPERTIES: Mapping[str, PerturbationSpec] = MappingProxyType({s.id: s for s in SPECS})
assert len(PROPERTIES) == 15 and set(PROPERTIES) == set(EPSILON_ONE)
