"""The perturbation service's catalogues in one import: the image perturbations of
``registry.py`` (corruptions IEEE-A1..A5, styles IEEE-A6, degradation operators DEG-1, safety
properties PER-1; listed by ``ListPerturbations`` / ``fortis perturbations``) and the attacks of
``attacks/registry.py`` (IEEE-A7 transfer, IEEE-A8 query, PER-3; listed by ``ListAttacks`` /
``fortis attacks``). Both registries are defined where their entries live; this module only
re-exports them so callers (the evaluation service's plan validation among them) have one
stable place to import from. Domain code: no gRPC.
"""

from __future__ import annotations

from typing import Any

from fortis.services.common.params import Param, validate_params
from fortis.services.perturbation.attacks.base import AttackSpec
from fortis.services.perturbation.attacks.registry import ATTACKS, attack_spec, list_attacks
from fortis.services.perturbation.corruptions import CORRUPTIONS
from fortis.services.perturbation.registry import PERTURBATIONS, describe


def list_catalogue(kind: str | None = None) -> list[dict[str, Any]]:
    """Every image perturbation (or those of one kind) as plain data, attacks excluded (they
    are ``list_attacks``)."""
    return [describe(spec) for spec in PERTURBATIONS.values() if not kind or spec.kind == kind]


__all__ = ["ATTACKS", "CORRUPTIONS", "PERTURBATIONS", "AttackSpec", "Param", "attack_spec",
           "list_attacks", "list_catalogue", "validate_params"]
