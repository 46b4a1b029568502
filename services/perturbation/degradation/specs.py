"""The DEG-1/DEG-5 catalogue entries: one ``_Operator`` per operator (step, characterisation,
level table), the one loop behind ``apply`` and ``iterate``, and ``SPECS``,
``apply_degradation``, ``iterate_degradation``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.degradation.gradient import (
    check_model_context,
    model_gradient_descent,
)
from fortis.services.perturbation.degradation.operators import (
    BOX_SIDE,
    FADE_TO_BLACK_FACTOR,
    FADE_TO_GREY_SATURATION_FACTOR,
    FADE_TO_WHITE_FACTOR,
    FOG_INCREMENT,
    GLOBAL_BLUR_FILTERS_PER_LEVEL,
    GLOBAL_BLUR_KERNEL,
    GRADIENT_STEP,
    JPEG_QUALITY,
    LEVELS,
    LINE_COLOURS,
    LINE_THICKNESS,
    LINES_PER_LEVEL,
    LOCAL_BLUR_SIDE,
    MAX_LEVEL,
    OPERATOR_IDS,
    POSTERISE_BINS,
    StepFn,
    adjacent_pixel_exchange,
    check_level,
    check_rng,
    fade,
    fade_to_grey,
    global_blur,
    jpeg_recompress,
    lines,
    local_blur,
    posterise,
    random_boxes,
    random_noise,
    random_pixel_exchange,
    white_fog,
)
from fortis.services.perturbation.spec import (
    ApplyContext,
    Characterisation,
    PerturbationSpec,
    check_image,
)


@dataclass(frozen=True, kw_only=True)
class _Operator:
    id: str
    description: str
    scope: str
    randomness: str
    domain: str
    step: StepFn
    level_table: tuple[Mapping[str, Any], ...]
    level_table_doc: str
    needs_model: bool = False


def _same(**entry: Any) -> tuple[Mapping[str, Any], ...]:
    """The same per-level parameter at every level."""
    m = MappingProxyType(dict(entry))
    return (m,) * MAX_LEVEL


_COUNT_DOC = ("the same at every level; counts use the image's own w and h (integer division, "
              "at least 1)")

_OPERATORS: tuple[_Operator, ...] = (
    _Operator(
        id="black_lines", scope="local", randomness="stochastic", domain="pixel",
        description="Random Lines (black): one anti-aliased 1-px black line per level from a "
                    "random point on the left/top edge to one on the right/bottom edge",
        step=lines(LINE_COLOURS["black_lines"]),
        level_table=_same(lines=LINES_PER_LEVEL, thickness_px=LINE_THICKNESS, colour=0),
        level_table_doc="lines added at the level, their thickness (px) and grey value"),
    _Operator(
        id="white_lines", scope="local", randomness="stochastic", domain="pixel",
        description="Random Lines (white): one anti-aliased 1-px white line per level from a "
                    "random point on the left/top edge to one on the right/bottom edge",
        step=lines(LINE_COLOURS["white_lines"]),
        level_table=_same(lines=LINES_PER_LEVEL, thickness_px=LINE_THICKNESS, colour=255),
        level_table_doc="lines added at the level, their thickness (px) and grey value"),
    _Operator(
        id="random_boxes", scope="local", randomness="stochastic", domain="pixel",
        description="Random Boxes: (h+w)/10 small black rectangles per level, sides uniform in "
                    "2..5 px, uniform positions",
        step=random_boxes,
        level_table=_same(boxes="(h+w)//10", side_px=BOX_SIDE),
        level_table_doc="boxes added at the level and their side range (px); " + _COUNT_DOC),
    _Operator(
        id="global_blur", scope="global", randomness="deterministic", domain="pixel",
        description="Global Blur: one 5x5 uniform (mean) filter per level, each channel",
        step=global_blur,
        level_table=_same(filters=GLOBAL_BLUR_FILTERS_PER_LEVEL, kernel_px=GLOBAL_BLUR_KERNEL),
        level_table_doc="uniform filters applied at the level and their size (px)"),
    _Operator(
        id="local_blur", scope="local", randomness="stochastic", domain="pixel",
        description="Local Blur: (h+w) random rectangles per level, sides uniform in 2..10 px, "
                    "each replaced by its per-channel mean",
        step=local_blur,
        level_table=_same(rectangles="h+w", side_px=LOCAL_BLUR_SIDE),
        level_table_doc="rectangles averaged at the level and their side range (px); "
                        + _COUNT_DOC),
    _Operator(
        id="random_noise", scope="local", randomness="stochastic", domain="pixel",
        description="Random Noise: wh/50 distinct random pixels per level set to a random colour",
        step=random_noise,
        level_table=_same(pixels="w*h//50"),
        level_table_doc="pixels set to a uniform random colour at the level; " + _COUNT_DOC),
    _Operator(
        id="random_pixel_exchange", scope="local", randomness="stochastic", domain="pixel",
        description="Random Pixel Exchange: wh/20 random (disjoint) pixel pairs swapped per level",
        step=random_pixel_exchange,
        level_table=_same(pairs="w*h//20"),
        level_table_doc="pixel pairs swapped at the level; " + _COUNT_DOC),
    _Operator(
        id="adjacent_pixel_exchange", scope="local", randomness="stochastic", domain="pixel",
        description="Random Adjacent Pixel Exchange: wh/20 random pixels per level, each "
                    "swapped with one of its 8 neighbours",
        step=adjacent_pixel_exchange,
        level_table=_same(pixels="w*h//20", neighbourhood=8),
        level_table_doc="pixels swapped with a random 8-neighbour at the level; " + _COUNT_DOC),
    _Operator(
        id="white_fog", scope="local", randomness="stochastic", domain="pixel",
        description="White Fog: wh/5 distinct random pixels per level get +20 on every channel "
                    "(clipped at 255)",
        step=white_fog,
        level_table=_same(pixels="w*h//5", add=FOG_INCREMENT),
        level_table_doc="pixels faded toward white at the level and the value added per "
                        "channel; " + _COUNT_DOC),
    _Operator(
        id="fade_to_black", scope="global", randomness="deterministic", domain="colour",
        description="Fade to Black: every channel value x0.9 per level (rounded)",
        step=fade(FADE_TO_BLACK_FACTOR),
        level_table=_same(factor=FADE_TO_BLACK_FACTOR),
        level_table_doc="multiplier applied to every channel value at the level"),
    _Operator(
        id="fade_to_white", scope="global", randomness="deterministic", domain="colour",
        description="Fade to White: every channel value x1.1 per level (rounded, clipped at 255)",
        step=fade(FADE_TO_WHITE_FACTOR),
        level_table=_same(factor=FADE_TO_WHITE_FACTOR),
        level_table_doc="multiplier applied to every channel value at the level"),
    _Operator(
        id="fade_to_grey", scope="global", randomness="deterministic", domain="colour",
        description="Fade to Greyscale: HSV saturation x0.9 per level (grey images unchanged)",
        step=fade_to_grey,
        level_table=_same(saturation_factor=FADE_TO_GREY_SATURATION_FACTOR),
        level_table_doc="multiplier applied to the HSV saturation at the level"),
    _Operator(
        id="posterise", scope="global", randomness="deterministic", domain="colour",
        description="Posterize: each channel quantised to b bins, bin i -> (i+1)*255/b, with "
                    "b = 32 - level (31 at level 1 .. 2 at level 30)",
        step=posterise,
        level_table=tuple(MappingProxyType({"bins": b}) for b in POSTERISE_BINS),
        level_table_doc="bins per channel b used at the level (32 - level)"),
    _Operator(
        id="jpeg_recompress", scope="global", randomness="deterministic", domain="colour",
        description="JPEG Compress: OpenCV JPEG encode/decode of the previous level, quality "
                    "32 - level (31 at level 1 .. 2 at level 30)",
        step=jpeg_recompress,
        level_table=tuple(MappingProxyType({"quality": q}) for q in JPEG_QUALITY),
        level_table_doc="JPEG quality used at the level (32 - level)"),
    _Operator(
        id="model_gradient_descent", scope="local", randomness="deterministic", domain="pixel",
        description="Model Gradient Descent (white-box, after Szegedy et al. 2013): one step per "
                    "level of GRADIENT_STEP grey levels against the sign of the surrogate's "
                    "gradient of log p(true class); needs ApplyContext.model and .label",
        step=model_gradient_descent,
        level_table=_same(step_grey_levels=GRADIENT_STEP, direction="-sign(grad log p_true)"),
        level_table_doc="grey levels every pixel moves at the level (uint8 scale) and the "
                        "direction of the move",
        needs_model=True),
)
assert tuple(op.id for op in _OPERATORS) == OPERATOR_IDS
_BY_ID: dict[str, _Operator] = {op.id: op for op in _OPERATORS}


def _run(op: _Operator, image: np.ndarray, max_level: int, rng: np.random.Generator,
         ctx: ApplyContext) -> Iterator[np.ndarray]:
    """The one loop behind ``apply`` and ``iterate``: yields the working image of each level
    (the caller copies what it keeps)."""
    work = np.array(image[:, :, None] if image.ndim == 2 else image, dtype=np.uint8, order="C",
                    copy=True)
    for level in range(1, max_level + 1):
        work = np.ascontiguousarray(op.step(work, level, rng, ctx))
        yield work


def _validate(op: _Operator, image: object, level: object, rng: object,
              ctx: ApplyContext | None, level_field: str) -> tuple[np.ndarray, int, ApplyContext]:
    img = check_image(image)
    lv = check_level(level, level_field)
    check_rng(rng)
    context = ctx if ctx is not None else ApplyContext()
    if op.needs_model:
        check_model_context(context)
    return img, lv, context


def _make_apply(op: _Operator) -> Callable[..., np.ndarray]:
    def apply(image: np.ndarray, level: int, rng: np.random.Generator,
              ctx: ApplyContext | None = None) -> np.ndarray:
        img, lv, context = _validate(op, image, level, rng, ctx, "level")
        out = np.array(img[:, :, None] if img.ndim == 2 else img, copy=True)
        for out in _run(op, img, lv, rng, context):  # noqa: B007 - the last level is kept
            pass
        return np.array(out.reshape(img.shape), copy=True)
    apply.__doc__ = f"DEG-1 {op.id}: the image at ``level`` (0..30; 0 = a copy of the original)."
    return apply


def _make_iterate(op: _Operator) -> Callable[..., Iterator[np.ndarray]]:
    def iterate(image: np.ndarray, max_level: int, rng: np.random.Generator,
                ctx: ApplyContext | None = None) -> Iterator[np.ndarray]:
        img, lv, context = _validate(op, image, max_level, rng, ctx, "max_level")

        def gen() -> Iterator[np.ndarray]:
            for out in _run(op, img, lv, rng, context):
                yield np.array(out.reshape(img.shape), copy=True)
        return gen()
    iterate.__doc__ = (f"DEG-1 {op.id}: the images of levels 1..max_level, in one pass (the "
                       "same images as ``apply`` for the same generator state).")
    return iterate


def _spec(op: _Operator) -> PerturbationSpec:
    return PerturbationSpec(
        id=op.id, kind="degradation", family="degradation", refs=("DEG-1", "DEG-5"),
        description=op.description, level_kind="level", levels=LEVELS,
        level_table=op.level_table, level_table_doc=op.level_table_doc,
        characterisation=Characterisation(scope=op.scope,  # type: ignore[arg-type]
                                          randomness=op.randomness,  # type: ignore[arg-type]
                                          domain=op.domain),  # type: ignore[arg-type]
        apply=_make_apply(op), iterate=_make_iterate(op), needs_model=op.needs_model)


#: The catalogue entries, in the paper's order (DEG-1, DEG-5).
SPECS: tuple[PerturbationSpec, ...] = tuple(_spec(op) for op in _OPERATORS)
_SPEC_BY_ID: dict[str, PerturbationSpec] = {s.id: s for s in SPECS}


def spec_for(operator_id: str) -> PerturbationSpec:
    spec = _SPEC_BY_ID.get(operator_id) if isinstance(operator_id, str) else None
    if spec is None:
        raise InvalidArgument("perturbation_id", f"unknown degradation operator "
                              f"'{operator_id}'; known: {', '.join(OPERATOR_IDS)}")
    return spec


def apply_degradation(operator_id: str, image: np.ndarray, level: int,
                      rng: np.random.Generator, ctx: ApplyContext | None = None) -> np.ndarray:
    """DEG-1: ``operator_id`` applied incrementally to ``image`` up to ``level`` (0..30)."""
    return spec_for(operator_id).apply(image, level, rng, ctx or ApplyContext())


def iterate_degradation(operator_id: str, image: np.ndarray, max_level: int,
                        rng: np.random.Generator,
                        ctx: ApplyContext | None = None) -> Iterator[np.ndarray]:
    """DEG-1: the images of levels 1..max_level of ``operator_id``, in one pass."""
    iterate = spec_for(operator_id).iterate
    assert iterate is not None
    return iterate(image, max_level, rng, ctx or ApplyContext())
