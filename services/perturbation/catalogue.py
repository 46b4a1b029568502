"""One catalogue of everything Fortis does to an image: the perturbations of ``registry.py``
(corruptions IEEE-A1..A5, styles IEEE-A6, degradation operators DEG-1, safety properties
PER-1) and the attacks (IEEE-A7 transfer, IEEE-A8 query) defined here.

Each entry has an id, a kind, a family, the requirements it implements, its parameter schema
and its level table. ``ListPerturbations`` and ``fortis perturbations`` read this.
Domain code: no gRPC.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.corruptions import CORRUPTIONS
from fortis.services.perturbation.registry import PERTURBATIONS, describe
from fortis.services.perturbation.registry import validate_params as validate_perturbation_params
from fortis.services.perturbation.spec import Param


@dataclass(frozen=True, kw_only=True)
class AttackSpec:
    id: str
    kind: str              # "transfer" | "score" | "decision"
    family: str
    ieee_ref: str
    description: str
    params: tuple[Param, ...] = field(default_factory=tuple)
    stochastic: bool = True
    norm: str = "linf"      # the norm epsilon bounds (IEEE-A9)

    @property
    def is_query_attack(self) -> bool:
        return self.kind in ("score", "decision")


_EPS_LINF = Param(name="epsilon", type="float", description="L-inf bound in [0,1] pixel scale (IEEE-A9)",
                  minimum=0.0, maximum=1.0)
_BUDGET = Param(name="max_queries", type="int", default=1000,
                description="query budget Q_m per image (IEEE-M6)", minimum=1, maximum=1_000_000)

ATTACKS: dict[str, AttackSpec] = {a.id: a for a in (
    AttackSpec(id="fgsm", kind="transfer", family="gradient", ieee_ref="IEEE-A7",
               description="Fast Gradient Sign Method on the local surrogate, then sent to the target",
               params=(_EPS_LINF,), stochastic=False),
    AttackSpec(id="pgd", kind="transfer", family="gradient", ieee_ref="IEEE-A7",
               description="Projected Gradient Descent (L-inf) on the local surrogate, then sent to the target",
               params=(_EPS_LINF,
                       Param(name="steps", type="int", default=10, description="iterations", minimum=1, maximum=1000),
                       Param(name="step_size", type="float", default=0.0,
                             description="step in [0,1] scale; 0 = 2.5*epsilon/steps", minimum=0.0, maximum=1.0),
                       Param(name="random_start", type="bool", default=True, description="start at a random point in the ball"))),
    AttackSpec(id="square", kind="score", family="score-based", ieee_ref="IEEE-A8",
               description="Square Attack (L-inf, score-based); every query through the proxy",
               params=(_EPS_LINF, _BUDGET,
                       Param(name="p_init", type="float", default=0.05,
                             description="initial fraction of pixels changed per square", minimum=0.0, maximum=1.0))),
    AttackSpec(id="hsja", kind="decision", family="decision-based", ieee_ref="IEEE-A8",
               description="HopSkipJumpAttack (L2, decision-based); success = misclassified within L2 <= epsilon",
               params=(Param(name="epsilon", type="float", description="L2 bound in [0,1] pixel scale (IEEE-A9)",
                             minimum=0.0, maximum=1e4), _BUDGET), norm="l2"),
    AttackSpec(id="pertknob", kind="decision", family="minimal-perturbation", ieee_ref="PER-3",
               description="PertKnob (Zhong et al.): the smallest epsilon of a real-world safety "
                           "property (PER-1) that misleads the target, searched over [0,1] in k "
                           "cells by bisection or linear scan within Q_m queries; reports the "
                           "minimal L2 (PER-4); every query through the proxy",
               params=(Param(name="property", type="string", description="a PER-1 property id, e.g. per_brightness"),
                       Param(name="mode", type="string", default="bisection",
                             description="bisection (assumes the criterion is monotone in epsilon) or linear"),
                       Param(name="cells", type="int", default=1000, description="k: epsilon grid cells",
                             minimum=1, maximum=1_000_000),
                       Param(name="max_queries", type="int", default=64,
                             description="query budget Q_m per image, clean query included",
                             minimum=2, maximum=1_000_000)),
               norm="l2"),
)}


def attack_spec(attack_id: str, field_name: str = "attack_id") -> AttackSpec:
    spec = ATTACKS.get(attack_id)
    if spec is None:
        raise InvalidArgument(field_name, f"unknown attack '{attack_id}'; known: {', '.join(ATTACKS)}")
    return spec


def validate_params(spec: AttackSpec, params: Mapping[str, Any], field_prefix: str = "params"
                    ) -> dict[str, Any]:
    """Check and complete attack parameters; all problems reported at once (the same rules as
    every perturbation's parameters, ``registry.validate_params``)."""
    return validate_perturbation_params(spec, params, field_prefix)


def list_catalogue() -> list[dict[str, Any]]:
    """Every perturbation and attack as plain data (for ListPerturbations and the CLI)."""
    items: list[dict[str, Any]] = [describe(spec) for spec in PERTURBATIONS.values()]
    for a in ATTACKS.values():
        items.append({"id": a.id, "kind": f"{a.kind}_attack" if a.kind != "transfer" else "transfer_attack",
                      "family": a.family, "refs": [a.ieee_ref], "ieee_ref": a.ieee_ref,
                      "description": a.description, "stochastic": a.stochastic,
                      "characterisation": None, "level_kind": None, "levels": [],
                      "level_range": None, "severities": [], "level_table": [],
                      "level_table_doc": "", "needs_model": a.kind == "transfer",
                      "norm": a.norm,
                      "parameters": [{"name": p.name, "type": p.type, "default": p.default,
                                      "description": p.description, "minimum": p.minimum,
                                      "maximum": p.maximum} for p in a.params]})
    return items


__all__ = ["ATTACKS", "CORRUPTIONS", "PERTURBATIONS", "AttackSpec", "Param", "attack_spec",
           "list_catalogue", "validate_params"]
