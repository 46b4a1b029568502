"""The shape every perturbation in Fortis's catalogue shares (one registry, ``registry.py``).

A perturbation is a pure function of (image, level, generator, context): corruptions
(IEEE-A1..A5, severities 1..5), style changes (IEEE-A6, severities 1..5), incremental
degradation operators (DEG-1, levels 0..30, level L = the operator applied L times) and
real-world safety properties (PER-1, one knob epsilon in [0, 1]). Each module that defines
perturbations exports ``SPECS: tuple[PerturbationSpec, ...]``; ``registry.py`` assembles them.

Domain code: no gRPC. Images are uint8 HxW, HxWx1 or HxWx3 (RGB), any size; every
perturbation returns a new uint8 array of the same shape and never modifies its input.
All randomness comes from the ``numpy.random.Generator`` passed in (docs/architecture.md,
Determinism).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.params import Param
from fortis.services.perturbation.style_models import StyleModels

__all__ = ["ApplyContext", "ApplyFn", "Characterisation", "IterateFn", "LevelKind", "Param",
           "PerturbationKind", "PerturbationSpec", "characterisation", "check_image", "hwc"]

#: What ``level`` means for a perturbation.
#:   "severity": an integer 1..5 (IEEE-M7)
#:   "level":    an integer 0..30, applied incrementally (DEG-1; 0 = the original image)
#:   "epsilon":  a float in [0, 1] (PER-1; 0 = the original image)
LevelKind = Literal["severity", "level", "epsilon"]

#: Kinds of perturbation in the catalogue (attacks are listed beside them by ``catalogue.py``).
PerturbationKind = Literal["corruption", "style", "degradation", "property"]


@dataclass(frozen=True, kw_only=True)
class Characterisation:
    """DEG-5, after Swingler (seed 001, section 3): every pixel altered (global) or only some
    (local); same effect on repeated application (deterministic) or drawn at random
    (stochastic); the colour palette altered (colour) or individual pixels/positions (pixel)."""

    scope: Literal["global", "local"]
    randomness: Literal["deterministic", "stochastic"]
    domain: Literal["colour", "pixel"]

    def as_dict(self) -> dict[str, str]:
        return {"scope": self.scope, "randomness": self.randomness, "domain": self.domain}


def characterisation(scope: Literal["global", "local"],
                     randomness: Literal["deterministic", "stochastic"],
                     domain: Literal["colour", "pixel"]) -> Characterisation:
    """DEG-5 characterisation, positionally: the catalogue tables list dozens of them, and
    ``characterisation("global", "stochastic", "pixel")`` keeps each entry on one line."""
    return Characterisation(scope=scope, randomness=randomness, domain=domain)


@dataclass(frozen=True, kw_only=True)
class ApplyContext:
    """What a perturbation may need beyond the image.

    ``params``: validated parameter values (the spec's ``params`` with defaults filled in).
    ``model``: a white-box surrogate (``TorchClassifier``-like: ``.model`` a torch module taking
    the classifier's input, ``.to_model_input(uint8 NHWC) -> torch.Tensor``, ``.input_spec``),
    only for perturbations with ``needs_model`` (DEG-1's model gradient descent).
    ``label``: the image's true label, for the same.
    ``style_models``: where ``neural_style`` may read a model (the operator's root, the calling
    tenant's uploaded models); None: no uploaded models, the root from ``$FORTIS_MODEL_ROOT``.
    """

    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    model: Any = None
    label: int | None = None
    style_models: StyleModels | None = None


#: ``apply(image, level, rng, ctx) -> image``; level as described by ``LevelKind``.
ApplyFn = Callable[[np.ndarray, Any, np.random.Generator, ApplyContext], np.ndarray]
#: ``iterate(image, max_level, rng, ctx)`` yields the images of levels 1..max_level in order,
#: for incremental operators (cheaper than ``apply`` at each level: O(L) instead of O(L^2)).
IterateFn = Callable[[np.ndarray, int, np.random.Generator, ApplyContext], Iterator[np.ndarray]]


@dataclass(frozen=True, kw_only=True)
class PerturbationSpec:
    """One entry of the catalogue."""

    id: str                           # unique across the catalogue, snake_case
    kind: PerturbationKind
    family: str                       # e.g. "noise", "blur", "weather", "digital", "geometric",
                                      # "mask", "style", "degradation", "luminance", "spatial", ...
    refs: tuple[str, ...]             # SPEC requirement ids, e.g. ("IEEE-A1",) or ("DEG-1", "DEG-5")
    description: str
    level_kind: LevelKind
    levels: tuple[int, ...]           # the discrete levels ((1..5), (1..30)); () for epsilon
    level_table: tuple[Any, ...]      # visible per-level parameters (index 0 = first level);
                                      # for epsilon: the parameter at epsilon = 1 (or a mapping)
    characterisation: Characterisation
    apply: ApplyFn
    params: tuple[Param, ...] = ()
    needs_model: bool = False
    iterate: IterateFn | None = None
    level_table_doc: str = ""         # what the entries of level_table mean (prose)
    level_fields: tuple[str, ...] = ()  # a snake_case name per component of a scalar or tuple
                                      # level_table entry, e.g. ("disk_radius_px",
                                      # "alias_sigma_px"); () when the entries are mappings
                                      # (their keys are the names)

    def __post_init__(self) -> None:
        """A level table whose entries cannot be named is a catalogue bug: fail at import, as a
        duplicate id does, rather than list unnamed tuples in reports (registry
        ``named_level_table``)."""
        for index, entry in enumerate(self.level_table):
            names = tuple(entry) if isinstance(entry, Mapping) else self.level_fields
            width = None if isinstance(entry, Mapping) else \
                len(entry) if isinstance(entry, tuple | list) else 1
            if isinstance(entry, Mapping) and self.level_fields:
                raise ValueError(f"{self.id}: level_fields given for a table of mappings")
            if width is not None and width != len(names):
                raise ValueError(f"{self.id}: level {index + 1} has {width} component(s), "
                                 f"level_fields names {len(names)}")
            bad = [n for n in names if not isinstance(n, str) or not _SNAKE.fullmatch(n)]
            if bad or len(set(names)) != len(names):
                raise ValueError(f"{self.id}: level names must be unique snake_case, got {names}")

    @property
    def stochastic(self) -> bool:
        return self.characterisation.randomness == "stochastic"


#: A level-table field name: lower-case snake_case, starting with a letter.
_SNAKE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")


def hwc(x: np.ndarray, channels: int) -> np.ndarray:
    """OpenCV drops a trailing 1-channel axis: put it back (HxW -> HxWx1; HxWxC unchanged)."""
    return x.reshape(x.shape[0], x.shape[1], channels)


def check_image(image: object, field_name: str = "image") -> np.ndarray:
    """A perturbation's input: uint8 HxW, HxWx1 or HxWx3, at least 1x1 (else InvalidArgument)."""
    if not isinstance(image, np.ndarray):
        raise InvalidArgument(field_name, f"must be a numpy array, got {type(image).__name__}")
    if image.dtype != np.uint8:
        raise InvalidArgument(field_name, f"must be uint8, got {image.dtype}")
    if not (image.ndim == 2 or (image.ndim == 3 and image.shape[2] in (1, 3))):
        raise InvalidArgument(field_name, f"must be HxW, HxWx1 or HxWx3, got shape {image.shape}")
    if image.shape[0] < 1 or image.shape[1] < 1:
        raise InvalidArgument(field_name, f"must be at least 1x1, got shape {image.shape}")
    return image
