"""The one registry of every image perturbation Fortis applies (attacks are in ``catalogue.py``).

Assembled from the modules that define perturbations, each exporting ``SPECS``:

    corruptions/     IEEE-A1..A5  common corruptions and geometric/mask, severities 1..5
    styles.py        IEEE-A6      style changes, severities 1..5 (+ a user-supplied neural slot)
    degradation/     DEG-1, DEG-5 incremental degradation operators, levels 1..30
    properties/      PER-1        real-world safety properties, epsilon in [0, 1]

Every id is registered once (a duplicate is an import-time error). ``apply_perturbation`` is
the single entry point: it validates the id, the level for that kind, the parameters and the
image, and returns a new uint8 image of the same shape. ``describe`` lists an entry as JSON-able
data, its level table with every component named (``named_level_table``). Domain code: no gRPC.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.params import validate_params
from fortis.services.perturbation import corruptions, degradation, properties, styles
from fortis.services.perturbation.spec import ApplyContext, PerturbationSpec, check_image
from fortis.services.perturbation.style_models import StyleModels

_MODULES = (corruptions, styles, degradation, properties)


def _build() -> dict[str, PerturbationSpec]:
    out: dict[str, PerturbationSpec] = {}
    for mod in _MODULES:
        for spec in mod.SPECS:
            if spec.id in out:
                raise RuntimeError(f"perturbation id '{spec.id}' registered twice")
            out[spec.id] = spec
    return out


#: id -> spec, in registry order (corruptions, styles, degradation operators, properties).
PERTURBATIONS: Mapping[str, PerturbationSpec] = MappingProxyType(_build())

#: Level ranges per level kind, for validation and listing.
LEVEL_RANGE = {"severity": (1, 5), "level": (0, 30), "epsilon": (0.0, 1.0)}


def perturbation_spec(perturbation_id: str, field_name: str = "perturbation_id") -> PerturbationSpec:
    spec = PERTURBATIONS.get(perturbation_id) if isinstance(perturbation_id, str) else None
    if spec is None:
        raise InvalidArgument(field_name, f"unknown perturbation '{perturbation_id}'; "
                              "see ListPerturbations or `fortis perturbations`")
    return spec


def check_level(spec: PerturbationSpec, level: Any, field_name: str | None = None) -> int | float:
    """The level as the spec's kind needs it: severity 1..5, level 0..30, epsilon in [0, 1]."""
    f = field_name or spec.level_kind
    lo, hi = LEVEL_RANGE[spec.level_kind]
    if spec.level_kind == "epsilon":
        if isinstance(level, bool) or not isinstance(level, int | float | np.integer | np.floating) \
                or not math.isfinite(float(level)) or not lo <= float(level) <= hi:
            raise InvalidArgument(f, f"{spec.id} takes epsilon in [0, 1], got {level!r}")
        return float(level)
    if isinstance(level, bool) or not isinstance(level, int | np.integer | float | np.floating) \
            or float(level) != int(level) or not lo <= int(level) <= hi:
        raise InvalidArgument(f, f"{spec.id} takes an integer {spec.level_kind} in {lo}..{hi}, "
                              f"got {level!r}")
    return int(level)


def make_context(spec: PerturbationSpec, params: Mapping[str, Any] | None = None, *,
                 model: Any = None, label: int | None = None,
                 style_models: StyleModels | None = None) -> ApplyContext:
    """Validated context; white-box operators need a model and the image's label;
    ``style_models``: where ``neural_style`` reads its model (None: see ``ApplyContext``)."""
    p = validate_params(spec, params)
    if spec.needs_model:
        if model is None:
            raise InvalidArgument("surrogate", f"{spec.id} is white-box: name a surrogate model")
    return ApplyContext(params=MappingProxyType(p), model=model, label=label,
                        style_models=style_models)


def apply_perturbation(perturbation_id: str, image: np.ndarray, level: Any,
                       rng: np.random.Generator, ctx: ApplyContext | None = None) -> np.ndarray:
    """Apply one perturbation at one level to one image (IEEE-P5: one perturbation per image).

    ``level``: severity 1..5 (corruptions, styles), level 0..30 (degradation operators;
    0 = the original) or epsilon in [0, 1] (properties). Returns a new uint8 array of the
    image's shape. Raises ``InvalidArgument`` naming the field at fault.
    """
    spec = perturbation_spec(perturbation_id)
    lv = check_level(spec, level)
    check_image(image)
    if ctx is None:
        ctx = make_context(spec)
    if spec.needs_model and ctx.label is None:
        raise InvalidArgument("labels", f"{spec.id} needs each image's true label")
    if spec.level_kind == "level" and lv == 0:
        return image.copy()
    out = spec.apply(image, lv, rng, ctx)
    if out.shape != image.shape or out.dtype != np.uint8:
        raise AssertionError(f"{spec.id} returned {out.dtype} {out.shape} for {image.shape}")
    return out


def iterate_levels(perturbation_id: str, image: np.ndarray, max_level: int,
                   rng: np.random.Generator, ctx: ApplyContext | None = None) -> Iterator[np.ndarray]:
    """Levels 1..max_level of an incremental operator in one pass (DEG-1)."""
    spec = perturbation_spec(perturbation_id)
    if spec.level_kind != "level" or spec.iterate is None:
        raise InvalidArgument("perturbation_id", f"{spec.id} is not an incremental operator")
    check_level(spec, max_level, "max_level")
    check_image(image)
    if ctx is None:
        ctx = make_context(spec)
    if spec.needs_model and ctx.label is None:
        raise InvalidArgument("labels", f"{spec.id} needs each image's true label")
    return spec.iterate(image, int(max_level), rng, ctx)


def describe(spec: PerturbationSpec) -> dict[str, Any]:
    """A catalogue entry as plain JSON-able data (ListPerturbations, `fortis perturbations`)."""
    lo, hi = LEVEL_RANGE[spec.level_kind]
    return {
        "id": spec.id, "kind": spec.kind, "family": spec.family, "refs": list(spec.refs),
        "ieee_ref": ", ".join(spec.refs), "description": spec.description,
        "stochastic": spec.stochastic, "characterisation": spec.characterisation.as_dict(),
        "level_kind": spec.level_kind, "levels": list(spec.levels), "level_range": [lo, hi],
        "severities": list(spec.levels) if spec.level_kind == "severity" else [],
        "level_table": named_level_table(spec),
        "level_table_doc": spec.level_table_doc, "needs_model": spec.needs_model,
        "parameters": [{"name": p.name, "type": p.type, "default": p.default,
                        "description": p.description, "minimum": p.minimum,
                        "maximum": p.maximum} for p in spec.params],
    }


def named_level_table(spec: PerturbationSpec) -> list[dict[str, Any]]:
    """The spec's level table with every component named, one dict per level (index 0 = the
    first level): scalar and tuple entries get the spec's ``level_fields`` as keys (e.g.
    affine at severity 1: ``{"rotation_deg": 5.0, "scale_change": 0.05, "shear_deg": 3.0,
    "translation_fraction": 0.02}``), mapping entries keep their keys. Values are JSON-able:
    int, float, str or bool, or a list of those (a range such as ``side_px``), so reports and
    ``ListPerturbations`` show what each number means instead of an unnamed tuple (IEEE-P4:
    the report lets anyone repeat the evaluation)."""
    out: list[dict[str, Any]] = []
    for index, entry in enumerate(spec.level_table):
        if isinstance(entry, Mapping):
            pairs = [(str(k), v) for k, v in entry.items()]
        else:
            values = list(entry) if isinstance(entry, tuple | list) else [entry]
            if len(values) != len(spec.level_fields):
                raise ValueError(f"{spec.id}: level {index + 1} has {len(values)} component(s), "
                                 f"level_fields names {len(spec.level_fields)}")
            pairs = list(zip(spec.level_fields, values, strict=True))
        out.append({name: _json_value(spec.id, name, v) for name, v in pairs})
    return out


def _json_value(spec_id: str, name: str, x: Any) -> Any:
    """A level-table value as JSON data: numpy scalars unwrapped, tuples as lists."""
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, bool | int | float | str):
        return x
    if isinstance(x, tuple | list) and all(
            isinstance(v, bool | int | float | np.generic) for v in x):
        return [v.item() if isinstance(v, np.generic) else v for v in x]
    raise TypeError(f"{spec_id}: level-table value {name}={x!r} is not a number, string, bool "
                    "or list of numbers")
