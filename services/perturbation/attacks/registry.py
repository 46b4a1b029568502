"""The one registry of Fortis's adversarial attacks (IEEE-A7 transfer, IEEE-A8 query, PER-3).

One module per attack under ``attacks/``, each exporting ``SPEC`` (an ``AttackSpec``: id,
kind, family, norms, targeted/untargeted, parameter schema with bounds, SPEC refs,
description, needs_surrogate, stochastic and its ``run(ctx)``). **Adding an attack is one new
module plus one import of its ``SPEC`` and one entry in the tuple below**
(the package re-exports attack *functions* under the modules' names, so import ``SPEC``s,
not modules); ``ListAttacks``, ``fortis attacks [--json]``, the
engine's dispatch and the plan validation all read this mapping. Domain code: no gRPC.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from fortis.services.common.errors import InvalidArgument

from .bandits import SPEC as BANDITS
from .bandits import SPEC_L2 as BANDITS_L2
from .base import AttackSpec
from .bim import SPEC as BIM
from .boundary import SPEC as BOUNDARY
from .cw import SPEC as CW
from .ddn import SPEC as DDN
from .dispersion import SPEC as DISPERSION
from .ead import SPEC as EAD
from .fab import SPEC as FAB
from .fast_feature import SPEC as FAST_FEATURE
from .fgsm import SPEC as FGSM
from .generative import SPEC as ADVGAN
from .geoda import SPEC as GEODA
from .geoda import SPEC_LINF as GEODA_LINF
from .hsja import SPEC as HSJA
from .local_search import SPEC as LOCAL_SEARCH
from .lowfreq_dct import SPEC as LOWFREQ_DCT
from .mifgsm import SPEC as MI_FGSM
from .nes import SPEC as NES
from .nes import SPEC_L2 as NES_L2
from .ngd import SPEC as NGD
from .ngd import SPEC_L2 as NGD_L2
from .ods import SPEC as ODS
from .pertknob import SPEC as PERTKNOB
from .pgd import SPEC as PGD
from .qeba import SPEC as QEBA
from .qfool import SPEC as QFOOL
from .rgf import SPEC as RGF
from .rgf import SPEC_LINF as RGF_LINF
from .rgf import SPEC_PRIOR as PRGF
from .rgf import SPEC_PRIOR_LINF as PRGF_LINF
from .signhunter import SPEC as SIGNHUNTER
from .signhunter import SPEC_L2 as SIGNHUNTER_L2
from .simba import SPEC as SIMBA
from .single_pixel import SPEC as SINGLE_PIXEL
from .sparse_l1 import SPEC as SPARSE_L1
from .spatial import SPEC as SPATIAL
from .square import SPEC as SQUARE
from .square_l2 import SPEC as SQUARE_L2
from .surfree import SPEC as SURFREE
from .whitebox import BOOSTERS
from .zoo import SPEC as ZOO

__all__ = ["ATTACKS", "attack_boosters", "attack_spec", "build", "describe_attack",
           "list_attacks", "list_boosters"]


def build(specs: tuple[AttackSpec, ...]) -> dict[str, AttackSpec]:
    """id -> spec in the given order; a duplicate id is an import-time error."""
    out: dict[str, AttackSpec] = {}
    for s in specs:
        if s.id in out:
            raise RuntimeError(f"attack id '{s.id}' registered twice")
        out[s.id] = s
    return out


#: id -> spec, in listing order.
ATTACKS: Mapping[str, AttackSpec] = MappingProxyType(build(
    (FGSM, BIM, PGD, MI_FGSM,
     SPATIAL, SPARSE_L1, DISPERSION, FAST_FEATURE, ADVGAN,
     CW, EAD, DDN, FAB,
     SQUARE, HSJA, PERTKNOB,
     BOUNDARY, QEBA, QFOOL, GEODA, GEODA_LINF, SURFREE,
     SIMBA, SQUARE_L2, LOWFREQ_DCT, ODS, LOCAL_SEARCH, SINGLE_PIXEL,
     NES, NES_L2, BANDITS, BANDITS_L2, SIGNHUNTER, SIGNHUNTER_L2,
     RGF, RGF_LINF, PRGF, PRGF_LINF, ZOO, NGD, NGD_L2)))


def attack_spec(attack_id: str, field_name: str = "attack_id") -> AttackSpec:
    """The entry of ``attack_id``, or InvalidArgument naming ``field_name`` and the known ids."""
    spec = ATTACKS.get(attack_id) if isinstance(attack_id, str) else None
    if spec is None:
        raise InvalidArgument(field_name, f"unknown attack '{attack_id}'; known: {', '.join(ATTACKS)}")
    return spec


def attack_boosters(spec: AttackSpec) -> list[str]:
    """The boosters (``whitebox.BOOSTERS``: DI, TI, SI, NI, VMI, ensemble) a transfer attack
    composes with: those whose parameters it declares."""
    names = {p.name for p in spec.params}
    return [b for b, (_paper, _what, params) in BOOSTERS.items() if names & set(params)]


def list_boosters() -> list[dict[str, Any]]:
    """The boosters as plain data (``fortis attacks``): id, paper, what it does, parameters,
    and the attacks that take it."""
    return [{"id": b, "paper": paper, "description": what, "parameters": list(params),
             "attacks": [s.id for s in ATTACKS.values() if b in attack_boosters(s)]}
            for b, (paper, what, params) in BOOSTERS.items()]


def describe_attack(spec: AttackSpec) -> dict[str, Any]:
    """An entry as plain JSON-able data (``ListAttacks``, ``fortis attacks --json``)."""
    return {
        "id": spec.id, "kind": spec.kind, "family": spec.family, "norms": list(spec.norms),
        "targeted": spec.targeted, "untargeted": spec.untargeted, "refs": list(spec.refs),
        "description": spec.description, "needs_surrogate": spec.needs_surrogate,
        "stochastic": spec.stochastic, "tasks": list(spec.tasks or ()),
        "uses_surrogate": spec.uses_surrogate, "minimal_norm": spec.minimal_norm,
        "boosters": attack_boosters(spec),
        "parameters": [{"name": p.name, "type": p.type, "default": p.default,
                        "description": p.description, "minimum": p.minimum,
                        "maximum": p.maximum, "choices": list(p.choices),
                        "required": p.required} for p in spec.params],
    }


def list_attacks(kind: str | None = None) -> list[dict[str, Any]]:
    """Every attack (or those of one kind: transfer, score, decision) as plain data."""
    return [describe_attack(s) for s in ATTACKS.values() if not kind or s.kind == kind]
