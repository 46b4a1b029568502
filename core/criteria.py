"""Correctness criteria of a test plan (IEEE Std 3129-2023 4.7.6): shared pure contract data.

The plan's service-type parameters (IEEE-P3) say how an answer is judged: a classification
:class:`CorrectnessRule` (IEEE-C1/C2), an :class:`AggregationRule` over label sets or objects
(IEEE-C3), a :class:`DetectionCriterion` (IEEE-C4) and a :class:`SegmentationCriterion`
(IEEE-C5), and which success criteria an attack may be judged by (:data:`ATTACK_CRITERIA`,
IEEE-A8 / PER-2). They live in the domain kernel, not in a service, because three services
need them: the evaluation service validates a plan's criteria before anything runs (and must
not import scoring: docs/architecture.md, section 4), the scoring service judges answers with
them and the perturbation service judges attacks by them. Validation only: plain Python, no
numpy at import (``AggregationRule.combine`` imports it when called), every problem named by
its field (``correctness.k``, ``detection.iou_threshold``...); errors are the one error model
of ``fortis.client.errors`` (protobuf only, no gRPC), the classes the services raise.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import TYPE_CHECKING, Any, Final

from fortis.client.errors import FieldViolation, InvalidArgument
from fortis.core.task import BOX_FORMATS, Task

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "AGGREGATE_MODES",
    "ALL_ABSENT_POLICIES",
    "ATTACK_CRITERIA",
    "PROBABILITY_CRITERIA",
    "TARGETED_CRITERIA",
    "TARGETED_DEFAULT",
    "BOX_FORMATS",
    "CORRECTNESS_MODES",
    "MAX_LISTED",
    "AggregationRule",
    "CorrectnessRule",
    "DetectionCriterion",
    "SegmentationCriterion",
    "aggregation_violations",
    "is_int",
    "is_number",
    "raise_violations",
]

#: 4.7.6.2.1: Alternative 1 (top-1, also IEEE-C1 single prediction), 2 (top-K), 3 (> sigma).
CORRECTNESS_MODES: Final = ("top1", "topk", "threshold")
#: IEEE-C3 (4.7.6.2.2): Alternative 2 "all" label sets / objects, Alternative 1 "at_least" Q.
AGGREGATE_MODES: Final = ("all", "at_least")
#: IEEE-C5: how an image is judged when no class of interest is in prediction or truth.
ALL_ABSENT_POLICIES: Final = ("correct", "incorrect")
#: At most this many field violations are listed in one error (the rest are counted).
MAX_LISTED: Final = 10


def is_int(v: Any) -> bool:
    """An integer that is not a bool (plans are JSON/YAML: ``true`` is no class id)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    """A real number that is not a bool."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def raise_violations(violations: list[FieldViolation]) -> None:
    """Raise one :class:`InvalidArgument` listing the first ``MAX_LISTED`` violations (and
    how many more there were); no-op when there is none."""
    if violations:
        more = len(violations) - MAX_LISTED
        listed = violations[:MAX_LISTED]
        if more > 0:
            listed.append(FieldViolation(listed[-1].field, f"... and {more} more"))
        raise InvalidArgument.from_violations(listed)


# --------------------------------------------------------------------------------------------
# IEEE-C1/C2: classification
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CorrectnessRule:
    """How a prediction is judged correct (IEEE 3129 4.7.6.2.1; IEEE-C1/C2), from the plan.

    - ``top1``: the best-ranked label is one of the image's labels (C2 Alternative 1; for a
      service that returns a single label this is C1).
    - ``topk``: one of the ``k`` best-ranked labels matches (C2 Alternative 2). A target that
      returns fewer than ``k`` labels is judged on the labels it returned.
    - ``threshold``: a label whose confidence is *strictly greater* than ``threshold``
      (sigma) matches (C2 Alternative 3). Needs a score-returning target.
    """

    mode: str = "top1"
    k: int = 5
    threshold: float = 0.5

    def __post_init__(self) -> None:
        violations = _rule_violations(self.mode, self.k, self.threshold, "correctness")
        if violations:
            raise InvalidArgument.from_violations(violations)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, *,
                  prefix: str = "correctness") -> CorrectnessRule:
        """Build from the plan's ``correctness`` section; unknown keys and bad values raise
        :class:`InvalidArgument` naming ``<prefix>.<key>``."""
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise InvalidArgument(prefix, "must be a mapping with mode, k, threshold")
        violations = [FieldViolation(f"{prefix}.{key}", "unknown key (allowed: mode, k, "
                                     "threshold)") for key in d if key not in ("mode", "k",
                                                                               "threshold")]
        mode = d.get("mode", "top1")
        k = d.get("k", 5)
        threshold = d.get("threshold", 0.5)
        violations += _rule_violations(mode, k, threshold, prefix)
        if violations:
            raise InvalidArgument.from_violations(violations)
        return cls(mode=mode, k=int(k), threshold=float(threshold))

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "k": self.k, "threshold": self.threshold}


def _rule_violations(mode: Any, k: Any, threshold: Any, prefix: str) -> list[FieldViolation]:
    out: list[FieldViolation] = []
    if not isinstance(mode, str) or mode not in CORRECTNESS_MODES:
        out.append(FieldViolation(f"{prefix}.mode",
                                  f"must be one of {', '.join(CORRECTNESS_MODES)}; got {mode!r}"))
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        out.append(FieldViolation(f"{prefix}.k", f"must be an integer >= 1; got {k!r}"))
    if (isinstance(threshold, bool) or not isinstance(threshold, int | float)
            or not math.isfinite(threshold) or not 0.0 <= threshold <= 1.0):
        out.append(FieldViolation(f"{prefix}.threshold",
                                  f"must be a confidence in [0, 1]; got {threshold!r}"))
    return out


# --------------------------------------------------------------------------------------------
# IEEE-C3: from label sets / objects to the image
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AggregationRule:
    """How the s per-label-set (or per-object) verdicts make the image's (IEEE-C3, 4.7.6.2.2).

    - ``all`` (Alternative 2): every label set / object must be correct.
    - ``at_least`` (Alternative 1): at least ``q`` of the s must be correct (1 <= Q <= s).
    """

    mode: str = "all"
    q: int = 1

    def __post_init__(self) -> None:
        raise_violations(aggregation_violations(self.mode, self.q, "aggregate", "q"))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, *,
                  prefix: str = "correctness") -> AggregationRule:
        """Read the ``aggregate`` and ``q`` keys of a plan section (other keys are the
        caller's); errors name ``<prefix>.aggregate`` / ``<prefix>.q``."""
        if d is None:
            return cls()
        mode = d.get("aggregate", "all")
        q = d.get("q", 1)
        raise_violations(aggregation_violations(mode, q, f"{prefix}.aggregate", f"{prefix}.q"))
        return cls(mode=mode, q=int(q))

    def to_dict(self) -> dict[str, Any]:
        return {"aggregate": self.mode, "q": self.q}

    def combine(self, correct: npt.ArrayLike, *, field: str = "correctness.q") -> np.ndarray:
        """(N, S) per-set verdicts -> (N,) image verdicts. ``q > S`` is an error naming
        ``field`` (IEEE-C3 needs 1 <= Q <= s)."""
        import numpy as np  # only the judging side needs numpy; plan validation does not

        c = np.asarray(correct, dtype=bool)
        if c.ndim != 2:
            raise InvalidArgument(field, f"per-set verdicts must be (N, S), got shape {c.shape}")
        if self.mode == "all":
            return np.asarray(c.all(axis=1))
        if self.q > c.shape[1]:
            raise InvalidArgument(field, f"Q = {self.q} exceeds the s = {c.shape[1]} label sets "
                                         "(IEEE-C3 needs 1 <= Q <= s)")
        return np.asarray(c.sum(axis=1) >= self.q)


def aggregation_violations(mode: Any, q: Any, mode_field: str,
                           q_field: str) -> list[FieldViolation]:
    out: list[FieldViolation] = []
    if not isinstance(mode, str) or mode not in AGGREGATE_MODES:
        out.append(FieldViolation(mode_field, f"must be one of {', '.join(AGGREGATE_MODES)}; "
                                              f"got {mode!r}"))
    if not is_int(q) or q < 1:
        out.append(FieldViolation(q_field, f"must be an integer >= 1; got {q!r}"))
    return out


# --------------------------------------------------------------------------------------------
# IEEE-C4: detection
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DetectionCriterion:
    """IEEE-C4 correctness of a detection answer, from the plan (service-type parameters,
    IEEE-P3); the matching rule is documented in ``fortis.services.scoring.correctness``.

    ``mode``: ``top1`` / ``topk`` / ``threshold`` (C2's alternatives with IoU in place of
    confidence); ``k`` for ``topk``; ``iou_threshold``: a prediction is a candidate for an
    object only when IoU > it (in [0, 1)); ``confidence_threshold``: predictions with a
    score below it are dropped first (``None``: keep all); ``aggregate``: IEEE-C3 over the
    image's objects.
    """

    mode: str = "threshold"
    k: int = 5
    iou_threshold: float = 0.5
    confidence_threshold: float | None = None
    aggregate: AggregationRule = dc_field(default_factory=AggregationRule)

    def __post_init__(self) -> None:
        raise_violations(_detection_violations(self.mode, self.k, self.iou_threshold,
                                               self.confidence_threshold, "detection"))
        if not isinstance(self.aggregate, AggregationRule):
            raise InvalidArgument("detection.aggregate", "must be an AggregationRule")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, *,
                  prefix: str = "detection") -> DetectionCriterion:
        """Plan section -> criterion; unknown keys and bad values name ``<prefix>.<key>``."""
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise InvalidArgument(prefix, "must be a mapping")
        allowed = ("mode", "k", "iou_threshold", "confidence_threshold", "aggregate", "q")
        violations = [FieldViolation(f"{prefix}.{key}", f"unknown key (allowed: "
                                                        f"{', '.join(allowed)})")
                      for key in d if key not in allowed]
        mode, k = d.get("mode", "threshold"), d.get("k", 5)
        iou, conf = d.get("iou_threshold", 0.5), d.get("confidence_threshold")
        violations += _detection_violations(mode, k, iou, conf, prefix)
        violations += aggregation_violations(d.get("aggregate", "all"), d.get("q", 1),
                                             f"{prefix}.aggregate", f"{prefix}.q")
        raise_violations(violations)
        return cls(mode=mode, k=int(k), iou_threshold=float(iou),
                   confidence_threshold=None if conf is None else float(conf),
                   aggregate=AggregationRule.from_dict(d, prefix=prefix))

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "k": self.k, "iou_threshold": self.iou_threshold,
                "confidence_threshold": self.confidence_threshold, **self.aggregate.to_dict()}

    @property
    def rank_limit(self) -> int | None:
        """How many of an object's ranked candidates may match it (None: unlimited)."""
        from fortis.core.matching import rank_limit  # numpy: only once matching
        return rank_limit(self.mode, self.k)


def _detection_violations(mode: Any, k: Any, iou: Any, conf: Any,
                          prefix: str) -> list[FieldViolation]:
    out: list[FieldViolation] = []
    if not isinstance(mode, str) or mode not in CORRECTNESS_MODES:
        out.append(FieldViolation(f"{prefix}.mode", f"must be one of "
                                                    f"{', '.join(CORRECTNESS_MODES)}; got {mode!r}"))
    if not is_int(k) or k < 1:
        out.append(FieldViolation(f"{prefix}.k", f"must be an integer >= 1; got {k!r}"))
    if not is_number(iou) or not 0.0 <= iou < 1.0:
        out.append(FieldViolation(f"{prefix}.iou_threshold", f"must be a number in [0, 1); "
                                                             f"got {iou!r}"))
    if conf is not None and (not is_number(conf) or not math.isfinite(conf)):
        out.append(FieldViolation(f"{prefix}.confidence_threshold",
                                  f"must be a finite number or null; got {conf!r}"))
    return out


# --------------------------------------------------------------------------------------------
# IEEE-C5: segmentation
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SegmentationCriterion:
    """IEEE-C5 correctness of a segmentation answer, from the plan (IEEE-P3).

    ``classes``: the Y classes of interest (service label ids); ``miou_threshold``: the image
    is correct iff their mIoU exceeds it (strictly); ``ignore_label``: ground-truth pixels
    with this value are left out (``None``: none); ``all_absent``: the verdict when no class
    of interest is in the prediction or the ground truth.
    """

    classes: tuple[int, ...]
    miou_threshold: float = 0.5
    ignore_label: int | None = 255
    all_absent: str = "correct"

    def __post_init__(self) -> None:
        raise_violations(_segmentation_violations(self.classes, self.miou_threshold,
                                                  self.ignore_label, self.all_absent,
                                                  "segmentation"))
        object.__setattr__(self, "classes", tuple(int(c) for c in self.classes))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *,
                  prefix: str = "segmentation") -> SegmentationCriterion:
        if not isinstance(d, Mapping):
            raise InvalidArgument(prefix, "must be a mapping with classes and miou_threshold")
        allowed = ("classes", "miou_threshold", "ignore_label", "all_absent")
        violations = [FieldViolation(f"{prefix}.{key}", f"unknown key (allowed: "
                                                        f"{', '.join(allowed)})")
                      for key in d if key not in allowed]
        if "classes" not in d:
            violations.append(FieldViolation(f"{prefix}.classes", "is required (the Y classes "
                                                                  "of interest)"))
        classes = d.get("classes", [0])
        th, ign = d.get("miou_threshold", 0.5), d.get("ignore_label", 255)
        absent = d.get("all_absent", "correct")
        violations += _segmentation_violations(classes, th, ign, absent, prefix)
        raise_violations(violations)
        return cls(classes=tuple(classes), miou_threshold=float(th), ignore_label=ign,
                   all_absent=absent)

    def to_dict(self) -> dict[str, Any]:
        return {"classes": list(self.classes), "miou_threshold": self.miou_threshold,
                "ignore_label": self.ignore_label, "all_absent": self.all_absent}


def _segmentation_violations(classes: Any, th: Any, ign: Any, absent: Any,
                             prefix: str) -> list[FieldViolation]:
    out: list[FieldViolation] = []
    if isinstance(classes, str | bytes) or not isinstance(classes, Sequence) or not classes \
            or not all(is_int(c) and c >= 0 for c in classes):
        out.append(FieldViolation(f"{prefix}.classes", f"must be a non-empty list of class ids "
                                                       f">= 0; got {classes!r}"))
    elif len(set(classes)) != len(classes):
        out.append(FieldViolation(f"{prefix}.classes", "lists a class twice"))
    elif ign is not None and is_int(ign) and ign in classes:
        out.append(FieldViolation(f"{prefix}.ignore_label", f"{ign} is also a class of interest"))
    if not is_number(th) or not 0.0 <= th < 1.0:
        out.append(FieldViolation(f"{prefix}.miou_threshold", f"must be a number in [0, 1); "
                                                              f"got {th!r}"))
    if ign is not None and not is_int(ign):
        out.append(FieldViolation(f"{prefix}.ignore_label", f"must be an integer or null; "
                                                            f"got {ign!r}"))
    if absent not in ALL_ABSENT_POLICIES:
        out.append(FieldViolation(f"{prefix}.all_absent", f"must be one of "
                                                          f"{', '.join(ALL_ABSENT_POLICIES)}; "
                                                          f"got {absent!r}"))
    return out


# --------------------------------------------------------------------------------------------
# Success criteria of the attacks (IEEE-A8, PER-2): which a plan may name, per task
# --------------------------------------------------------------------------------------------

#: Criterion kinds an attack may be judged by, per task type (the perturbation service's
#: ``criteria.criterion_from_spec`` builds them; the evaluation service validates plans with
#: this table). The first of each task is its default.
ATTACK_CRITERIA: Final[Mapping[str, tuple[str, ...]]] = {
    Task.CLASSIFICATION: ("misclassification", "targeted_misclassification",
                       "confident_misclassification", "top_k_misclassification",
                       "original_class_probability", "target_class_prob_boost"),
    Task.DETECTION: ("object_missed", "object_relabelled"),
    Task.SEGMENTATION: ("miou_below",),
}
#: Kinds that aim at a class (need ``targeted: {label: N}`` in the plan).
TARGETED_CRITERIA: Final = frozenset({"targeted_misclassification", "target_class_prob_boost",
                                      "object_relabelled"})
#: Kinds judged on class probabilities (refused for a label-only target).
PROBABILITY_CRITERIA: Final = frozenset({"confident_misclassification",
                                         "top_k_misclassification",
                                         "original_class_probability",
                                         "target_class_prob_boost"})
#: The targeted kind a plan's ``targeted: {label: N}`` means when it names no kind.
TARGETED_DEFAULT: Final[Mapping[str, str]] = {Task.CLASSIFICATION: "targeted_misclassification",
                                              Task.DETECTION: "object_relabelled"}
