"""Adversarial attacks (IEEE-A7 transfer, IEEE-A8 query-based), pure numpy/torch domain code.

* :func:`fgsm`, :func:`pgd` -- white-box on a local surrogate, sent to the target later.
* :func:`square_attack` -- score-based, L-inf (Square Attack).
* :func:`hop_skip_jump` -- decision-based, L2 (HopSkipJumpAttack).

All take and return uint8 ``N x H x W x C`` images; query attacks count every image they pass
to the query function and never exceed ``max_queries`` per image (IEEE-M6). Bounds are fixed
before the attack (IEEE-A9). See :mod:`.common` for the conventions.
"""

from .common import STOP_REASONS, AttackResult, LabelQuery, ScoreQuery
from .hsja import hop_skip_jump
from .square import square_attack
from .transfer import fgsm, pgd

__all__ = [
    "STOP_REASONS",
    "AttackResult",
    "LabelQuery",
    "ScoreQuery",
    "fgsm",
    "hop_skip_jump",
    "pgd",
    "square_attack",
]
