"""Adversarial attacks (IEEE-A7 transfer, IEEE-A8 query-based, PER-3), pure numpy/torch domain
code: one module per attack, a shared base (``base.py``) and the registry (``registry.py``).

* :func:`fgsm`, :func:`pgd` -- white-box on a local surrogate, sent to the target later.
* :func:`square_attack` -- score-based, L-inf (Square Attack).
* :func:`hop_skip_jump` -- decision-based, L2 (HopSkipJumpAttack).
* ``pertknob`` -- the PER-3 minimal-perturbation search over a safety property.

All take and return uint8 ``N x H x W x C`` images; query attacks count every image they pass
to the query function and never exceed ``max_queries`` per image (IEEE-M6). Bounds are fixed
before the attack (IEEE-A9). See :mod:`.base` for the conventions.
"""

from .base import STOP_REASONS, AttackContext, AttackResult, AttackSpec, LabelQuery, ScoreQuery
from .fgsm import fgsm
from .hsja import hop_skip_jump
from .pgd import pgd
from .registry import ATTACKS, attack_spec, list_attacks
from .square import square_attack

__all__ = [
    "ATTACKS",
    "STOP_REASONS",
    "AttackContext",
    "AttackResult",
    "AttackSpec",
    "LabelQuery",
    "ScoreQuery",
    "attack_spec",
    "fgsm",
    "hop_skip_jump",
    "list_attacks",
    "pgd",
    "square_attack",
]
