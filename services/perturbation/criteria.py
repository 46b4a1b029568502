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

Query attacks on detectors and segmenters (IEEE-A8 with the IEEE-C4 / IEEE-C5 rules of the
plan, judged batch-wise by ``judges.py``; the matching is the one the scoring service
applies, ``fortis.core.matching``):

- :class:`ObjectMissed` (IEEE-C4, untargeted): an object of interest "disappears or changes
  label": no box of its class with IoU *strictly above* ``iou_threshold`` (the scoring rule)
  and score >= ``score_threshold`` (the plan's ``confidence_threshold``; None: every box
  counts), boxes matched to objects one-to-one in the plan's ``mode`` exactly as scoring
  matches them (``common.matching.match_objects``, the batched rule on one image); with
  IEEE-C3 ``min_objects`` (at least Q of the s objects; 0 = all) the image is
  incorrect once fewer than Q objects are found. An image with no object of interest is
  incorrect once some box is kept (as scoring judges it). Margin per object: the best
  ``min(score - score_threshold, IoU - iou_threshold)`` over the boxes of its class (the
  matched boxes' scores drive it, a box sliding off the object too); the image's margin is
  the Q-th largest object margin.
- :class:`ObjectRelabelled` (IEEE-C4, targeted): every object of interest is found as class
  ``target`` (a box of that class with IoU > ``iou_threshold`` and score >= ``threshold``);
  margin ``-min_j max_k min(score_k - threshold, IoU_jk - iou_threshold)``.
- :class:`MIoUBelow` (IEEE-C5): the mIoU over ``classes`` against the reference mask is at or
  below ``miou_threshold`` (the image is no longer correct: scoring needs mIoU strictly
  above). Margin ``mIoU - miou_threshold``; where the target returns per-pixel probabilities
  (``Segmentation.probabilities``) the soft mIoU of those probabilities against the reference
  (probabilities in place of the 0/1 mask in each class's intersection and union: a per-pixel
  probability loss) is added while the image is still correct, so progress below a pixel
  flip is seen. An undefined mIoU (no class of interest anywhere) is judged by
  ``all_absent_incorrect``.

Every margin is < 0 exactly when its criterion is met (:func:`signed_margins` enforces it at
the boundaries, e.g. a score equal to the threshold).

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
from fortis.core.boxes import iou_xyxy
from fortis.core.task import Task
from fortis.services.common.criteria import ATTACK_CRITERIA, TARGETED_CRITERIA, TARGETED_DEFAULT
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.matching import match_objects

__all__ = [
    "CRITERION_KINDS",
    "ConfidentMisclassification",
    "Criterion",
    "Detection",
    "DetectionTargetClassProbBoost",
    "MIoUBelow",
    "Misclassification",
    "ObjectMissed",
    "ObjectRelabelled",
    "OriginalClassProbability",
    "RankedPrediction",
    "Reference",
    "TargetClassProbBoost",
    "TargetObjectMiss",
    "TargetedMisclassification",
    "TopKMisclassification",
    "criterion_from_spec",
    "margins",
    "signed_margins",
]

Box = tuple[float, float, float, float]

#: The smallest margin magnitude used where a criterion's boundary is met exactly (a score
#: equal to its threshold): margins are < 0 exactly when the criterion holds.
TINY = 1e-12


def signed_margins(values: np.ndarray, met: np.ndarray) -> np.ndarray:
    """``values`` with their sign forced to agree with ``met``: < 0 where met, >= 0 where not
    (NaN -> -1 where met, +1 where not)."""
    v = np.asarray(values, dtype=np.float64)
    m = np.asarray(met, dtype=bool)
    v = np.where(np.isnan(v), np.where(m, -1.0, 1.0), v)
    return np.where(m, np.minimum(v, -TINY), np.maximum(v, 0.0))


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

    task: Task = Task.CLASSIFICATION
    #: Aims at a chosen class (an attack needs ``AttackSpec.targeted`` to take it).
    targeted: bool = False
    #: Its vectorised margin needs the clean answer's scores (``margins(..., clean=...)``).
    needs_clean: bool = False
    #: Decidable from the top-1 label alone (``adversarial_labels``): decision-based attacks
    #: then work on label-only targets; the other criteria decide on scores.
    label_decidable: bool = False

    def describe(self) -> str:
        """The criterion in words, as reports print it."""
        return self.name

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

    def margins(self, scores: np.ndarray, true_labels: np.ndarray, *,
                clean: np.ndarray | None = None) -> np.ndarray:
        """A margin per row of dense scores n x classes, < 0 exactly when the criterion is met
        (score-based attacks minimise it). ``clean``: the clean answers' dense scores, for
        the criteria that compare with them (``needs_clean``)."""
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

    label_decidable: bool = field(default=True, init=False, repr=False)

    def describe(self) -> str:
        return "untargeted misclassification (top-1 label != true label)"

    def is_met(self, prediction: Any, ref: Reference) -> bool:
        return _class_view(prediction).top1() != self._label(ref)

    def adversarial_labels(self, labels: np.ndarray, true_labels: np.ndarray) -> np.ndarray:
        return np.asarray(labels).astype(np.int64) != np.asarray(true_labels).astype(np.int64)

    def margins(self, scores: np.ndarray, true_labels: np.ndarray, *,
                clean: np.ndarray | None = None) -> np.ndarray:
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

    def describe(self) -> str:
        return f"confident misclassification (another class with probability >= {self.threshold:g})"

    def is_met(self, prediction: Any, ref: Reference) -> bool:
        return _class_view(prediction).max_other(self._label(ref), self.name) >= self.threshold

    def margins(self, scores: np.ndarray, true_labels: np.ndarray, *,
                clean: np.ndarray | None = None) -> np.ndarray:
        s = np.asarray(scores, dtype=np.float64)
        other = s.copy()
        other[np.arange(len(s)), np.asarray(true_labels, dtype=np.int64)] = -np.inf
        best = other.max(axis=1) if s.shape[1] > 1 else np.full(len(s), -np.inf)
        return signed_margins(self.threshold - best, best >= self.threshold)


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

    needs_clean: bool = field(default=True, init=False, repr=False)

    @property
    def name(self) -> str:
        return f"Top{self.k}Misclassification"

    def describe(self) -> str:
        if self.variant == "perceptron":
            return f"top-{self.k} misclassification (the true label leaves the top {self.k})"
        return f"top-{self.k} misclassification (top-1 leaves the clean answer's top {self.k})"

    def margins(self, scores: np.ndarray, true_labels: np.ndarray, *,
                clean: np.ndarray | None = None) -> np.ndarray:
        s = np.asarray(scores, dtype=np.float64)
        rows = np.arange(len(s))
        if self.variant == "perceptron":
            other = s.copy()
            other[rows, np.asarray(true_labels, dtype=np.int64)] = -np.inf
            k = min(self.k, s.shape[1] - 1)
            if k < 1:
                return np.full(len(s), np.inf)
            kth = -np.partition(-other, k - 1, axis=1)[:, k - 1]
            true = s[rows, np.asarray(true_labels, dtype=np.int64)]
            return signed_margins(true - kth, true < kth)
        if clean is None:
            raise InvalidArgument("reference.original", f"{self.name} needs the clean answer")
        c = np.asarray(clean, dtype=np.float64)
        k = min(self.k, c.shape[1])
        top = np.argsort(-c, axis=1, kind="stable")[:, :k]
        inside = np.zeros(s.shape, dtype=bool)
        inside[rows[:, None], top] = True
        best_in = np.where(inside, s, -np.inf).max(axis=1)
        best_out = np.where(inside, -np.inf, s).max(axis=1) if k < s.shape[1] else \
            np.full(len(s), -np.inf)
        met = best_out > best_in
        return signed_margins(best_in - best_out, met)

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

    def describe(self) -> str:
        return f"original-class probability below {self.threshold:g}"

    def is_met(self, prediction: Any, ref: Reference) -> bool:
        return _class_view(prediction).prob(self._label(ref), self.name) < self.threshold

    def margins(self, scores: np.ndarray, true_labels: np.ndarray, *,
                clean: np.ndarray | None = None) -> np.ndarray:
        s = np.asarray(scores, dtype=np.float64)
        p = s[np.arange(len(s)), np.asarray(true_labels, dtype=np.int64)]
        return signed_margins(p - self.threshold, p < self.threshold)


@dataclass(frozen=True)
class TargetClassProbBoost(Criterion):
    """P_target(x + delta) > ``threshold`` (seed 004 Table I; Perceptron TargetClassProbability)."""

    target: int
    threshold: float = 0.5

    def __post_init__(self) -> None:
        _check_prob(self.threshold, "criterion.threshold")

    targeted: bool = field(default=True, init=False, repr=False)

    @property
    def name(self) -> str:
        return f"TargetClassProbBoost-{self.target}-{self.threshold:.4f}"

    def describe(self) -> str:
        return f"target-class probability boost (class {self.target} above {self.threshold:g})"

    def is_met(self, prediction: Any, ref: Reference) -> bool:
        return _class_view(prediction).prob(int(self.target), self.name) > self.threshold

    def margins(self, scores: np.ndarray, true_labels: np.ndarray, *,
                clean: np.ndarray | None = None) -> np.ndarray:
        s = np.asarray(scores, dtype=np.float64)
        p = s[:, int(self.target)] if int(self.target) < s.shape[1] else np.zeros(len(s))
        return signed_margins(self.threshold - p, p > self.threshold)


@dataclass(frozen=True)
class TargetedMisclassification(Criterion):
    """C(x + delta) == ``target`` (seed 004 Table I)."""

    target: int
    targeted: bool = field(default=True, init=False, repr=False)
    label_decidable: bool = field(default=True, init=False, repr=False)

    @property
    def name(self) -> str:
        return f"TargetedMisclassification-{self.target}"

    def describe(self) -> str:
        return f"targeted misclassification as class {self.target}"

    def is_met(self, prediction: Any, ref: Reference) -> bool:
        return _class_view(prediction).top1() == int(self.target)

    def adversarial_labels(self, labels: np.ndarray, true_labels: np.ndarray) -> np.ndarray:
        return np.asarray(labels).astype(np.int64) == int(self.target)

    def margins(self, scores: np.ndarray, true_labels: np.ndarray, *,
                clean: np.ndarray | None = None) -> np.ndarray:
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
    task: Task = field(default=Task.DETECTION, init=False)

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
    task: Task = field(default=Task.DETECTION, init=False)

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




# --------------------------------------------------------------------------------------------
# Query attacks on detectors and segmenters (IEEE-A8 with IEEE-C4 / IEEE-C5)
# --------------------------------------------------------------------------------------------


def _check_iou_open(value: float, field_name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or not 0.0 <= value < 1.0:
        raise InvalidArgument(field_name, f"must be a number in [0, 1), got {value!r}")


def _pair_presence(iou: np.ndarray, scores: np.ndarray, usable: np.ndarray,
                   iou_threshold: float, score_threshold: float
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Objects x boxes: (found per object, presence margin per object). A box counts for an
    object when ``usable`` (class agreeing), IoU > ``iou_threshold`` (IEEE-C4, strict) and
    score >= ``score_threshold``; the margin is the best ``min(score - threshold, IoU -
    iou_threshold)`` over the usable boxes (-1 when there is none)."""
    s = np.where(np.isnan(scores), -np.inf, scores)[None, :]
    hit = usable & (iou > iou_threshold) & (s >= score_threshold)
    value = np.where(usable, np.minimum(s - score_threshold, iou - iou_threshold), -np.inf)
    best = value.max(axis=1) if value.shape[1] else np.full(value.shape[0], -np.inf)
    best = np.where(np.isfinite(best), best, -1.0)
    return np.asarray(hit.any(axis=1), dtype=bool), best


@dataclass(frozen=True)
class ObjectMissed(Criterion):
    """IEEE-C4, untargeted: the image's objects of interest are no longer all found (fewer
    than ``min_objects`` of them, 0 = all): an object is found while a box of its class
    overlaps it with IoU > ``iou_threshold`` and score >= ``score_threshold`` (None: every
    box). No object of interest: met once a box is kept (scoring's verdict)."""

    iou_threshold: float = 0.5
    score_threshold: float | None = None
    min_objects: int = 0
    #: The plan's IEEE-C4 matching mode (``top1`` / ``topk`` / ``threshold``) and its k.
    mode: str = "threshold"
    k: int = 5
    task: Task = field(default=Task.DETECTION, init=False)

    def __post_init__(self) -> None:
        _check_iou_open(self.iou_threshold, "criterion.iou_threshold")
        if self.mode not in ("top1", "topk", "threshold"):
            raise InvalidArgument("criterion.mode", f"must be top1, topk or threshold, got "
                                  f"{self.mode!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise InvalidArgument("criterion.k", f"must be an integer >= 1, got {self.k!r}")
        if self.score_threshold is not None:
            _check_prob(self.score_threshold, "criterion.score_threshold")
        if isinstance(self.min_objects, bool) or not isinstance(self.min_objects, int) \
                or self.min_objects < 0:
            raise InvalidArgument("criterion.min_objects", f"must be an integer >= 0, got "
                                  f"{self.min_objects!r}")

    def describe(self) -> str:
        conf = "" if self.score_threshold is None else f", score >= {self.score_threshold:g}"
        need = "an object of interest" if self.min_objects == 0 else \
            f"objects until fewer than {self.min_objects} are"
        how = "" if self.mode == "threshold" else \
            f", {self.mode}{self.k if self.mode == 'topk' else ''} matching"
        return (f"IEEE-C4 object missed: {need} no longer found as its class "
                f"(IoU > {self.iou_threshold:g}{conf}{how})")

    def object_margin(self, boxes: np.ndarray, labels: np.ndarray, scores: np.ndarray,
                      ref_boxes: np.ndarray, ref_labels: np.ndarray) -> float:
        """The margin of one answer (pixel xyxy ``boxes``, ``labels``, ``scores``) against the
        objects of interest (``ref_boxes``, ``ref_labels``): < 0 exactly when met."""
        thr = 0.0 if self.score_threshold is None else float(self.score_threshold)
        sc = np.asarray(scores, dtype=np.float64).reshape(-1)
        s = len(ref_boxes)
        if s == 0:                       # correct iff no box is kept
            kept = sc >= thr if self.score_threshold is not None else np.ones(len(sc), bool)
            if not len(sc):
                return 1.0
            return float(signed_margins(np.array([thr - sc.max()]), np.array([kept.any()]))[0])
        iou = iou_xyxy(ref_boxes, boxes)
        lab = np.asarray(labels).reshape(-1)
        usable = np.asarray(ref_labels).reshape(-1, 1) == lab.reshape(1, -1)
        _, presence = _pair_presence(iou, sc, usable, self.iou_threshold, thr)
        # found: the IEEE-C4 matching scoring applies (greedy, one-to-one, the plan's mode)
        found = match_objects(ref_boxes, np.asarray(ref_labels).reshape(-1), boxes, lab, sc,
                              iou_threshold=self.iou_threshold,
                              score_threshold=self.score_threshold, mode=self.mode, k=self.k)
        presence = signed_margins(presence, ~found)        # < 0 where the object is missed
        q = s if self.min_objects == 0 else min(self.min_objects, s)
        qth = float(np.sort(presence)[::-1][q - 1])         # the image holds while >= 0
        met = int(found.sum()) < q
        return float(signed_margins(np.array([qth]), np.array([met]))[0])


@dataclass(frozen=True)
class ObjectRelabelled(Criterion):
    """IEEE-C4, targeted: every object of interest is found as class ``target``: a box of that
    class overlaps it with IoU > ``iou_threshold`` and score >= ``threshold``."""

    target: int
    threshold: float = 0.5
    iou_threshold: float = 0.5
    task: Task = field(default=Task.DETECTION, init=False)
    targeted: bool = field(default=True, init=False, repr=False)

    def __post_init__(self) -> None:
        _check_iou_open(self.iou_threshold, "criterion.iou_threshold")
        _check_prob(self.threshold, "criterion.threshold")

    def describe(self) -> str:
        return (f"IEEE-C4 object relabelled: every object of interest found as class "
                f"{self.target} (IoU > {self.iou_threshold:g}, score >= {self.threshold:g})")

    def object_margin(self, boxes: np.ndarray, labels: np.ndarray, scores: np.ndarray,
                      ref_boxes: np.ndarray, ref_labels: np.ndarray) -> float:
        if len(ref_boxes) == 0:
            return 1.0                   # nothing to relabel: never met
        sc = np.asarray(scores, dtype=np.float64).reshape(-1)
        iou = iou_xyxy(ref_boxes, boxes)
        usable = np.broadcast_to(np.asarray(labels).reshape(1, -1) == int(self.target),
                                 iou.shape)
        _, presence = _pair_presence(iou, sc, usable, self.iou_threshold, self.threshold)
        lab = np.asarray(labels).reshape(-1)
        found = match_objects(ref_boxes, np.full(len(ref_boxes), int(self.target)), boxes, lab,
                              sc, iou_threshold=self.iou_threshold,
                              score_threshold=self.threshold)
        return float(signed_margins(np.array([-presence.min()]), np.array([found.all()]))[0])


@dataclass(frozen=True)
class MIoUBelow(Criterion):
    """IEEE-C5: the mIoU over ``classes`` between the answer and the reference mask is at or
    below ``miou_threshold`` (the image is no longer correct); reference pixels equal to
    ``ignore_label`` are left out; an undefined mIoU is met iff ``all_absent_incorrect``."""

    classes: tuple[int, ...]
    miou_threshold: float = 0.5
    ignore_label: int | None = 255
    all_absent_incorrect: bool = False
    task: Task = field(default=Task.SEGMENTATION, init=False)

    def __post_init__(self) -> None:
        cl = tuple(self.classes)
        if not cl or not all(isinstance(c, int | np.integer) and not isinstance(c, bool)
                             and c >= 0 for c in cl) or len(set(cl)) != len(cl):
            raise InvalidArgument("criterion.classes", "must be distinct class ids >= 0 (at "
                                  "least one)")
        object.__setattr__(self, "classes", tuple(int(c) for c in cl))
        _check_iou_open(self.miou_threshold, "criterion.miou_threshold")

    def describe(self) -> str:
        return (f"IEEE-C5 mIoU over classes {list(self.classes)} at or below "
                f"{self.miou_threshold:g}")

    def mask_margins(self, maps: np.ndarray, refs: np.ndarray,
                     probabilities: np.ndarray | None = None) -> np.ndarray:
        """(n, H, W) answers against (n, H, W) references -> (n,) margins, < 0 exactly when
        met. ``probabilities`` (n, H, W, C) adds the soft mIoU (module docstring)."""
        from fortis.core.matching import iou_per_class, mean_iou, miou_correct
        classes = np.array(self.classes, dtype=np.int64)
        order = np.argsort(classes)
        iou = iou_per_class(np.asarray(maps), np.asarray(refs), classes[order],
                            self.ignore_label)
        miou = mean_iou(iou)
        met = ~miou_correct(miou, self.miou_threshold, not self.all_absent_incorrect)
        value = np.where(np.isnan(miou), 1.0, miou) - self.miou_threshold
        if probabilities is not None:
            value = value + np.nan_to_num(self.soft_miou(probabilities, refs), nan=0.0)
        return signed_margins(value, met)

    def soft_miou(self, probabilities: np.ndarray, refs: np.ndarray) -> np.ndarray:
        """(n, H, W, C) per-pixel probabilities against (n, H, W) references -> (n,) mean
        over the classes of interest of sum(p r) / sum(p + r - p r) (NaN where no class has
        mass in either)."""
        p = np.asarray(probabilities, dtype=np.float32)
        r = np.asarray(refs)
        valid = np.ones(r.shape, bool) if self.ignore_label is None else r != self.ignore_label
        n = p.shape[0]
        out = np.zeros((n, len(self.classes)))
        vf = valid.reshape(n, -1).astype(np.float32)
        for j, c in enumerate(self.classes):
            pc = p[..., c].reshape(n, -1) * vf if c < p.shape[-1] else np.zeros_like(vf)
            rc = (r == c).reshape(n, -1).astype(np.float32) * vf
            inter = (pc * rc).sum(axis=1, dtype=np.float64)
            union = (pc + rc).sum(axis=1, dtype=np.float64) - inter
            with np.errstate(invalid="ignore", divide="ignore"):
                out[:, j] = np.where(union > 1e-9, inter / np.maximum(union, 1e-9), np.nan)
        with np.errstate(invalid="ignore"):
            return np.asarray(np.nanmean(np.where(np.isnan(out), np.nan, out), axis=1)
                              if out.size else np.full(n, np.nan))


# --------------------------------------------------------------------------------------------
# A criterion from a plan / request (kind + parameters)
# --------------------------------------------------------------------------------------------

#: Criterion kinds a plan or RunAttackRequest may name (PER-2 and the task criteria), per
#: task: the shared table of ``services/common/criteria.py`` (plans are validated with it).
_TASK_KINDS = ATTACK_CRITERIA
CRITERION_KINDS = tuple(k for kinds in ATTACK_CRITERIA.values() for k in kinds)
_DEFAULT_KIND = {task: kinds[0] for task, kinds in ATTACK_CRITERIA.items()}


def criterion_from_spec(task: str, spec: Mapping[str, Any] | None) -> Criterion:
    """The criterion of an attack on a ``task`` target from plain data: ``kind`` (one of
    :data:`CRITERION_KINDS`; empty: the task's default, or ``targeted_misclassification`` /
    ``object_relabelled`` when ``target_label`` is given), ``target_label``, ``threshold``,
    ``k`` and the task's parameters (``detection``: iou_threshold, score_threshold,
    min_objects; ``segmentation``: classes, miou_threshold, ignore_label,
    all_absent_incorrect). Errors name ``criterion.<field>``."""
    d = dict(spec or {})
    if task not in _TASK_KINDS:
        raise InvalidArgument("task", f"unknown task {task!r}")
    target = d.get("target_label")
    kind = d.get("kind") or ""
    if not kind:
        kind = TARGETED_DEFAULT.get(task, "") if target is not None else ""
        kind = kind or _DEFAULT_KIND[task]
    if kind not in _TASK_KINDS[task]:
        raise InvalidArgument("criterion.kind", f"'{kind}' does not apply to a {task} target; "
                              f"use one of {', '.join(_TASK_KINDS[task])}")
    needs_target = kind in TARGETED_CRITERIA
    if needs_target and target is None:
        raise InvalidArgument("criterion.target_label", f"{kind} needs the target class")
    if target is not None and not needs_target:
        raise InvalidArgument("criterion.target_label", f"{kind} takes no target class")
    if target is not None and (isinstance(target, bool) or not isinstance(target, int)
                               or target < 0):
        raise InvalidArgument("criterion.target_label", f"must be a class id >= 0, got "
                              f"{target!r}")
    thr = d.get("threshold")
    tgt = int(target) if target is not None else -1
    det = dict(d.get("detection") or {})
    seg = dict(d.get("segmentation") or {})
    if kind == "misclassification":
        return Misclassification()
    if kind == "targeted_misclassification":
        return TargetedMisclassification(tgt)
    if kind == "confident_misclassification":
        return ConfidentMisclassification(0.5 if thr is None else float(thr))
    if kind == "top_k_misclassification":
        return TopKMisclassification(k=int(d.get("k") or 5))
    if kind == "original_class_probability":
        return OriginalClassProbability(0.5 if thr is None else float(thr))
    if kind == "target_class_prob_boost":
        return TargetClassProbBoost(tgt, 0.5 if thr is None else float(thr))
    iou = float(det.get("iou_threshold", 0.5))
    score = det.get("score_threshold")
    if kind == "object_missed":
        return ObjectMissed(iou_threshold=iou,
                            score_threshold=None if score is None else float(score),
                            min_objects=int(det.get("min_objects", 0)),
                            mode=str(det.get("mode") or "threshold"), k=int(det.get("k", 5)))
    if kind == "object_relabelled":
        cut = thr if thr is not None else score if score is not None else 0.5
        return ObjectRelabelled(tgt, threshold=float(cut), iou_threshold=iou)
    if "classes" not in seg:
        raise InvalidArgument("criterion.segmentation.classes", "the classes of interest are "
                              "required")
    ign = seg.get("ignore_label", 255)
    return MIoUBelow(classes=tuple(seg["classes"]),
                     miou_threshold=float(seg.get("miou_threshold", 0.5)),
                     ignore_label=None if ign is None else int(ign),
                     all_absent_incorrect=bool(seg.get("all_absent_incorrect", False)))
