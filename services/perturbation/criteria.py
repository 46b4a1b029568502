"""Threat criteria (PER-2, seed 004 Table I) and the success criteria of the attacks
(IEEE-A7/A8): when does the target's answer on a perturbed image "meet the threat"?

Pure domain code of the perturbation service (no gRPC, nothing of another service). One
definition serves two callers, which is why it lives here and not beside either of them:

* the PertKnob search (``pertknob_search.py``, PER-3) calls ``criterion(prediction, reference)``
  on one prediction at a time;
* the adversarial attacks (``attacks/``) judge whole batches through the vectorised forms
  :meth:`Criterion.adversarial_labels` (decision-based: top-1 labels only) and
  :meth:`Criterion.margins` (score-based: < 0 means the criterion is met), so a targeted
  variant of an attack is the same attack given :class:`TargetedMisclassification`.

A criterion decides given a :class:`Reference` (the clean image's ground-truth label G(x) and
the target's prediction on the clean image):

- :class:`Misclassification`: C(x + delta) != G(x).
- :class:`ConfidentMisclassification` (threshold): some class l != G(x) has P_l(x + delta) >=
  threshold (Table I; Perceptron's code also requires the top-1 to differ, which follows when
  threshold > 0.5).
- :class:`TopKMisclassification` (k): C(x + delta) is not in the top-k labels of the clean
  prediction, C_topK(x) (Table I: the label leaves the original top-K). With
  ``variant="perceptron"``: G(x) is not in the top-k of the perturbed prediction (Foolbox's and
  Perceptron's code).
- :class:`OriginalClassProbability` (threshold): P_G(x)(x + delta) < threshold.
- :class:`TargetClassProbBoost` (target, threshold): P_target(x + delta) > threshold.
- :class:`TargetedMisclassification` (target): C(x + delta) == target.
- Detection (the criteria marked with a dagger in Table I): :class:`TargetObjectMiss`: the target
  object is no longer detected as its class: no detection of the reference class with score >=
  ``score_threshold`` overlaps the target box with IoU >= ``iou_threshold``;
  :class:`DetectionTargetClassProbBoost`: a detection of class ``target`` with score >=
  ``threshold`` overlaps the target box with IoU >= ``iou_threshold``. The target box is
  ``Reference.box``, or, when not given, the highest-scoring detection of ``Reference.label``
  in the clean prediction.

Predictions (PER-5: classifiers, detectors and cloud APIs alike). Classification: a 1-D array of
class probabilities, or any object with ranked ``labels``, optional aligned ``scores`` and an
optional ``error`` (:class:`RankedPrediction`, or the scoring service's ``ClassPrediction``,
which has the same shape: what a remote API that returns its top-k labels gives; a label it
did not return has probability 0; criteria that need probabilities refuse a labels-only
prediction). Detection: a sequence of :class:`Detection` (or mappings with ``box``, ``label``,
``score``), boxes as (x1, y1, x2, y2) in any one unit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from fortis.services.common.arrays import iou_xyxy
from fortis.services.common.errors import InvalidArgument

__all__ = [
    "ConfidentMisclassification",
    "Criterion",
    "Detection",
    "DetectionTargetClassProbBoost",
    "Misclassification",
    "OriginalClassProbability",
    "RankedPrediction",
    "Reference",
    "TargetClassProbBoost",
    "TargetObjectMiss",
    "TargetedMisclassification",
    "TopKMisclassification",
    "margins",
]

Box = tuple[float, float, float, float]


@dataclass(frozen=True, kw_only=True)
class RankedPrediction:
    """One classification answer as a remote target gives it: ``labels`` ranked best first,
    ``scores`` aligned with them or None (labels-only API), ``error`` when the query failed."""

    labels: tuple[int, ...]
    scores: tuple[float, ...] | None = None
    error: str | None = None


def margins(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Untargeted margin: true-class score minus the best other score (< 0 = misclassified).

    Works with probabilities, logits and top-k scores where missing classes are 0.
    """
    scores = np.asarray(scores, dtype=np.float64)
    rows = np.arange(scores.shape[0])
    true = scores[rows, labels]
    if scores.shape[1] < 2:
        return np.full(scores.shape[0], np.inf)
    other = scores.copy()
    other[rows, labels] = -np.inf
    return true - other.max(axis=1)


# --------------------------------------------------------------------------------------------
# Predictions and references
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Detection:
    """One detected object: ``box`` = (x1, y1, x2, y2), ``label`` its class, ``score``."""

    box: Box
    label: int | str
    score: float


@dataclass(frozen=True, kw_only=True)
class Reference:
    """What a criterion compares against (PER-2).

    ``label``: G(x), the clean image's ground-truth class (classification; when None the clean
    prediction's top-1 is used), or the target object's class (detection). ``original``: the
    target's prediction on the clean image (the search fills it in with one counted query when
    None). ``box``: the target object's box (detection; None = taken from ``original``)."""

    label: int | str | None = None
    original: Any = None
    box: Box | None = None


@dataclass(frozen=True)
class _ClassView:
    ranked: np.ndarray             # labels, best first
    scores: np.ndarray | None      # aligned with ranked; None = labels only

    def top1(self) -> int:
        if self.ranked.size == 0:
            raise InvalidArgument("prediction", "an empty prediction has no top-1 label")
        return int(self.ranked[0])

    def topk(self, k: int) -> set[int]:
        return {int(x) for x in self.ranked[:k]}

    def prob(self, label: int, criterion: str) -> float:
        if self.scores is None:
            raise InvalidArgument("criterion", f"{criterion} needs class probabilities; the "
                                               "target returned labels only")
        hit = np.flatnonzero(self.ranked == label)
        return float(self.scores[hit[0]]) if hit.size else 0.0

    def max_other(self, label: int, criterion: str) -> float:
        if self.scores is None:
            raise InvalidArgument("criterion", f"{criterion} needs class probabilities; the "
                                               "target returned labels only")
        other = self.scores[self.ranked != label]
        return float(other.max()) if other.size else 0.0


def _class_view(pred: Any) -> _ClassView:
    if not isinstance(pred, np.ndarray) and hasattr(pred, "labels"):
        if getattr(pred, "error", None) is not None:
            raise InvalidArgument("prediction", f"the query failed: {pred.error}")
        ranked = np.asarray(pred.labels, dtype=np.int64)
        raw = getattr(pred, "scores", None)
        scores = None if raw is None else np.asarray(raw, dtype=np.float64)
        return _ClassView(ranked, scores)
    p = np.asarray(pred, dtype=np.float64)
    if p.ndim != 1 or p.size == 0:
        raise InvalidArgument("prediction", f"a classification prediction must be a 1-D "
                                            f"probability vector, got shape {p.shape}")
    order = np.argsort(-p, kind="stable")
    return _ClassView(order.astype(np.int64), p[order])


def _detections(pred: Any) -> list[Detection]:
    if pred is None:
        return []
    out: list[Detection] = []
    for d in pred:
        if isinstance(d, Detection):
            out.append(d)
        elif isinstance(d, Mapping):
            x1, y1, x2, y2 = (float(v) for v in d["box"])
            out.append(Detection(box=(x1, y1, x2, y2), label=d["label"], score=float(d["score"])))
        else:
            raise InvalidArgument("prediction", "a detection prediction is a sequence of "
                                                "Detection or {box, label, score} mappings")
    return out


# --------------------------------------------------------------------------------------------
# Threat criteria (PER-2)
# --------------------------------------------------------------------------------------------


class Criterion:
    """Base of the threat criteria: ``criterion(prediction, reference) -> bool`` (PER-2)."""

    task: Literal["classification", "detection"] = "classification"

    @property
    def name(self) -> str:
        return type(self).__name__

    def is_met(self, prediction: Any, ref: Reference) -> bool:
        raise NotImplementedError

    def __call__(self, prediction: Any, ref: Reference) -> bool:
        return bool(self.is_met(prediction, ref))

    # -- vectorised forms for the attacks (IEEE-A7/A8); a criterion that cannot be judged
    # -- from top-1 labels or dense scores alone refuses, naming itself
    def adversarial_labels(self, labels: np.ndarray, true_labels: np.ndarray) -> np.ndarray:
        """Whether each top-1 label meets the criterion (decision-based attacks)."""
        raise InvalidArgument("criterion", f"{self.name} cannot be judged from top-1 labels")

    def margins(self, scores: np.ndarray, true_labels: np.ndarray) -> np.ndarray:
        """A margin per row of dense scores n x classes, < 0 exactly when the criterion is met
        (score-based attacks minimise it)."""
        raise InvalidArgument("criterion", f"{self.name} has no score margin")

    # -- helpers
    def _label(self, ref: Reference) -> int:
        if ref.label is not None:
            return int(ref.label)
        if ref.original is None:
            raise InvalidArgument("reference.label", f"{self.name} needs the ground-truth label "
                                                     "or the clean prediction")
        return _class_view(ref.original).top1()


def _check_prob(value: float, field_name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise InvalidArgument(field_name, f"must be a probability in [0, 1], got {value!r}")


@dataclass(frozen=True)
class Misclassification(Criterion):
    """C(x + delta) != G(x) (seed 004 Table I)."""

    def is_met(self, prediction: Any, ref: Reference) -> bool:
        return _class_view(prediction).top1() != self._label(ref)

    def adversarial_labels(self, labels: np.ndarray, true_labels: np.ndarray) -> np.ndarray:
        return np.asarray(labels).astype(np.int64) != np.asarray(true_labels).astype(np.int64)

    def margins(self, scores: np.ndarray, true_labels: np.ndarray) -> np.ndarray:
        return margins(scores, true_labels)


@dataclass(frozen=True)
class ConfidentMisclassification(Criterion):
    """Some class other than G(x) has probability >= ``threshold`` (seed 004 Table I)."""

    threshold: float = 0.5

    def __post_init__(self) -> None:
        _check_prob(self.threshold, "criterion.threshold")

    @property
    def name(self) -> str:
        return f"ConfidentMisclassification-{self.threshold:.4f}"

    def is_met(self, prediction: Any, ref: Reference) -> bool:
        return _class_view(prediction).max_other(self._label(ref), self.name) >= self.threshold


@dataclass(frozen=True)
class TopKMisclassification(Criterion):
    """``variant="paper"`` (default): C(x + delta) is not among the clean prediction's top-k
    (seed 004 Table I); ``variant="perceptron"``: G(x) is not among the perturbed top-k."""

    k: int = 5
    variant: Literal["paper", "perceptron"] = "paper"

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise InvalidArgument("criterion.k", f"must be an integer >= 1, got {self.k!r}")
        if self.variant not in ("paper", "perceptron"):
            raise InvalidArgument("criterion.variant", "must be 'paper' or 'perceptron'")

    @property
    def name(self) -> str:
        return f"Top{self.k}Misclassification"

    def is_met(self, prediction: Any, ref: Reference) -> bool:
        view = _class_view(prediction)
        if self.variant == "perceptron":
            return self._label(ref) not in view.topk(self.k)
        if ref.original is None:
            raise InvalidArgument("reference.original", f"{self.name} needs the clean prediction")
        return view.top1() not in _class_view(ref.original).topk(self.k)


@dataclass(frozen=True)
class OriginalClassProbability(Criterion):
    """P_G(x)(x + delta) < ``threshold`` (seed 004 Table I, original-class confidence loss)."""

    threshold: float = 0.5

    def __post_init__(self) -> None:
        _check_prob(self.threshold, "criterion.threshold")

    @property
    def name(self) -> str:
        return f"OriginalClassProbability-{self.threshold:.4f}"

    def is_met(self, prediction: Any, ref: Reference) -> bool:
        return _class_view(prediction).prob(self._label(ref), self.name) < self.threshold


@dataclass(frozen=True)
class TargetClassProbBoost(Criterion):
    """P_target(x + delta) > ``threshold`` (seed 004 Table I; Perceptron TargetClassProbability)."""

    target: int
    threshold: float = 0.5

    def __post_init__(self) -> None:
        _check_prob(self.threshold, "criterion.threshold")

    @property
    def name(self) -> str:
        return f"TargetClassProbBoost-{self.target}-{self.threshold:.4f}"

    def is_met(self, prediction: Any, ref: Reference) -> bool:
        return _class_view(prediction).prob(int(self.target), self.name) > self.threshold


@dataclass(frozen=True)
class TargetedMisclassification(Criterion):
    """C(x + delta) == ``target`` (seed 004 Table I)."""

    target: int

    @property
    def name(self) -> str:
        return f"TargetedMisclassification-{self.target}"

    def is_met(self, prediction: Any, ref: Reference) -> bool:
        return _class_view(prediction).top1() == int(self.target)

    def adversarial_labels(self, labels: np.ndarray, true_labels: np.ndarray) -> np.ndarray:
        return np.asarray(labels).astype(np.int64) == int(self.target)

    def margins(self, scores: np.ndarray, true_labels: np.ndarray) -> np.ndarray:
        """Best non-target score minus the target's (< 0: the target is strictly on top)."""
        s = np.asarray(scores, dtype=np.float64)
        return -margins(s, np.full(s.shape[0], int(self.target), dtype=np.int64))


def _target_box(ref: Reference, name: str) -> Box:
    if ref.box is not None:
        return ref.box
    if ref.label is None or ref.original is None:
        raise InvalidArgument("reference.box", f"{name} needs the target box, or the target "
                                               "class and the clean prediction")
    own = [d for d in _detections(ref.original) if d.label == ref.label]
    if not own:
        raise InvalidArgument("reference.label", f"the clean prediction has no object of class "
                                                 f"{ref.label!r}")
    return max(own, key=lambda d: d.score).box


def _check_iou(value: float) -> None:
    if not (isinstance(value, int | float) and 0.0 < value <= 1.0):
        raise InvalidArgument("criterion.iou_threshold", f"must be in (0, 1], got {value!r}")


@dataclass(frozen=True)
class TargetObjectMiss(Criterion):
    """Detection (seed 004 Table I, dagger; III-A-2 "no longer predicted as bus"): no detection
    of class ``Reference.label`` with score >= ``score_threshold`` overlaps the target box with
    IoU >= ``iou_threshold``."""

    iou_threshold: float = 0.5
    score_threshold: float = 0.0
    task: Literal["classification", "detection"] = field(default="detection", init=False)

    def __post_init__(self) -> None:
        _check_iou(self.iou_threshold)
        _check_prob(self.score_threshold, "criterion.score_threshold")

    def is_met(self, prediction: Any, ref: Reference) -> bool:
        if ref.label is None:
            raise InvalidArgument("reference.label", "TargetObjectMiss needs the target class")
        box = _target_box(ref, self.name)
        dets = [d for d in _detections(prediction)
                if d.label == ref.label and d.score >= self.score_threshold]
        if not dets:
            return True
        ious = iou_xyxy([box], [d.box for d in dets])[0]
        return not bool((ious >= self.iou_threshold).any())


@dataclass(frozen=True)
class DetectionTargetClassProbBoost(Criterion):
    """Detection (seed 004 Table I, dagger): a detection of class ``target`` with score >=
    ``threshold`` overlaps the target box with IoU >= ``iou_threshold``."""

    target: int | str
    threshold: float = 0.5
    iou_threshold: float = 0.5
    task: Literal["classification", "detection"] = field(default="detection", init=False)

    def __post_init__(self) -> None:
        _check_iou(self.iou_threshold)
        _check_prob(self.threshold, "criterion.threshold")

    def is_met(self, prediction: Any, ref: Reference) -> bool:
        box = _target_box(ref, self.name)
        dets = [d for d in _detections(prediction)
                if d.label == self.target and d.score >= self.threshold]
        if not dets:
            return False
        ious = iou_xyxy([box], [d.box for d in dets])[0]
        return bool((ious >= self.iou_threshold).any())


