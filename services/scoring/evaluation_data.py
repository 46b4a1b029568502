"""What ScoreEvaluation scores, as domain objects: one evaluation's setup and its test settings,
answers held as numpy arrays. Domain code: no gRPC, no protobuf.

``fortis.services.scoring.convert`` builds these from the ``fortis.scoring.v1`` messages (and
is the only module that knows the messages); ``fortis.services.scoring.evaluation_scoring``
scores them. The answers are the domain kernel's (:mod:`fortis.core.answers`, the types the
evaluation service records; here their ``errors`` stay empty: a setting's errors travel in
:class:`SettingData`). They are plain frozen records so that tests and in-process callers
can build an evaluation without a server. Every record carries ``field``, the request path it came from
(``setting[3]``), so that a problem found while scoring names the field the caller sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeAlias

import numpy as np
from fortis.core.answers import (
    Answers,
    ClassificationAnswers,
    DetectionAnswers,
    SegmentationAnswers,
)
from fortis.core.criteria import CorrectnessRule
from fortis.core.task import Task
from fortis.services.scoring.correctness import (
    DetectionCriterion,
    Detections,
    SegmentationCriterion,
)

__all__ = [
    "ATTACK_KINDS",
    "SETTING_KINDS",
    "Answers",
    "ClassificationAnswers",
    "ClassificationTruth",
    "Criterion",
    "DetectionAnswers",
    "DetectionTruth",
    "EvaluationSetup",
    "QueryOutcomes",
    "SegmentationAnswers",
    "SegmentationTruth",
    "SettingData",
    "Truth",
]

#: The kinds of a test setting (the SettingKind enum without UNSPECIFIED).
SETTING_KINDS: Final = ("clean", "corruption", "transfer_attack", "query_attack", "degradation")
#: The attack kinds among them (IEEE-M3, M5, M6).
ATTACK_KINDS: Final = ("transfer_attack", "query_attack")


@dataclass(frozen=True, kw_only=True, eq=False)
class ClassificationTruth:
    """One acceptable-label set per image: ``labels`` (M, A) int64, padded with -1."""

    labels: np.ndarray


@dataclass(frozen=True, kw_only=True, eq=False)
class DetectionTruth:
    """Ground-truth boxes, one :class:`Detections` per image (each in its own box format)."""

    images: tuple[Detections, ...]


@dataclass(frozen=True, kw_only=True, eq=False)
class SegmentationTruth:
    """Ground-truth class maps (M, H, W), integer."""

    class_maps: np.ndarray


Truth: TypeAlias = ClassificationTruth | DetectionTruth | SegmentationTruth
Criterion: TypeAlias = CorrectnessRule | DetectionCriterion | SegmentationCriterion




@dataclass(frozen=True, kw_only=True, eq=False)
class QueryOutcomes:
    """A query attack's outcome per covered image (IEEE-M6): ``success`` (n,) bool,
    ``queries`` (n,) int64 from the ledger (``None``: not given), ``budget`` Q_m (0: none)."""

    success: np.ndarray
    queries: np.ndarray | None
    budget: int


@dataclass(frozen=True, kw_only=True, eq=False)
class SettingData:
    """One test setting. ``image_index``: the images it covers (indices into the setup's
    image ids; ``None`` = all, in order); ``errors``: per covered image, why its query failed
    ("" = answered; an empty tuple = none failed); ``linf``/``l2``: attack perturbation sizes
    per covered image; ``fraction_changed``: degradation only (DEG-4)."""

    kind: str
    name: str = ""
    level: int = 0
    image_index: np.ndarray | None = None
    errors: tuple[str, ...] = ()
    answers: Answers | None = None
    query: QueryOutcomes | None = None
    linf: np.ndarray | None = None
    l2: np.ndarray | None = None
    fraction_changed: float | None = None
    #: Attacks: per covered image, left out by the plan's success criterion before any
    #: attack (a targeted attack's image already of the target class); None: none.
    excluded: np.ndarray | None = None
    excluded_reason: str = ""
    field: str = "setting"

    @property
    def label(self) -> str:
        """The setting's name in metric trees: ``clean``, ``fog@3``, ``fgsm``,
        ``blur@level4`` (the names the evaluation report has always used)."""
        if self.kind == "clean":
            return "clean"
        if self.kind == "corruption":
            return f"{self.name}@{self.level}"
        if self.kind == "degradation":
            return f"{self.name}@level{self.level}"
        return self.name

    def covered(self, m: int) -> np.ndarray:
        """The images it covers as indices into the setup's M image ids (all by default)."""
        return np.arange(m) if self.image_index is None else self.image_index

    def left_out(self, n: int) -> np.ndarray:
        """(n,) bool: the covered images the plan's criterion excluded before the attack."""
        return np.zeros(n, dtype=bool) if self.excluded is None else self.excluded

    def failed(self, n: int) -> np.ndarray:
        """(n,) bool: the covered images whose query failed."""
        if not self.errors:
            return np.zeros(n, dtype=bool)
        return np.fromiter((bool(e) for e in self.errors), dtype=bool, count=n)


@dataclass(frozen=True, kw_only=True, eq=False)
class EvaluationSetup:
    """The evaluation: its M image ids (every array follows their order), ground truth and
    criterion of one task type, and the ranking options (RANK-1..3). ``num_classes`` is the
    target's number of classes (ranking and degradation probabilities need it; 0 = unknown)."""

    image_ids: tuple[str, ...]
    truth: Truth
    criterion: Criterion
    ranking_enabled: bool = False
    ranking_reason: str = ""
    num_classes: int = 0
    field: str = "setup"

    @property
    def task(self) -> Task:
        if isinstance(self.truth, ClassificationTruth):
            return Task.CLASSIFICATION
        return Task.DETECTION if isinstance(self.truth, DetectionTruth) else Task.SEGMENTATION
