"""The stages of an evaluation, each an object with its work items and its run:
clean, corruptions/styles, degradation, transfer attacks, query attacks (IEEE-P2 order)."""

from fortis.services.evaluation.stages.attacks import (
    QueryAttackStage,
    TransferAttackStage,
    attack_tests,
)
from fortis.services.evaluation.stages.base import (
    Cancelled,
    LabeledImage,
    Progress,
    RunContext,
    Stage,
)
from fortis.services.evaluation.stages.measure import CleanStage, CorruptionStage, DegradationStage

__all__ = ["Cancelled", "CleanStage", "CorruptionStage", "DegradationStage", "LabeledImage",
           "Progress", "QueryAttackStage", "RunContext", "Stage", "TransferAttackStage",
           "attack_tests"]
