"""Threat criteria, the PertKnob minimal-perturbation search and per-property robustness
(seed 004, Zhong et al., DSN 2020; PER-2..PER-5).

Pure domain code (no gRPC), numpy only. The target is reached only through a
``query(images) -> predictions`` callable (in production it goes through Fortis's proxy, which
counts and limits queries too); this module counts every image it sends as one query and never
sends more than the budget.

Threat criteria (PER-2, seed 004 Table I). A criterion decides whether the prediction on a
perturbed image x + delta "meets the threat", given a :class:`Reference` (the clean image's
ground-truth label G(x) and the target's prediction on the clean image):

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
class probabilities, or an ``ieee.ClassPrediction`` (ranked labels, optional scores: what a
remote API that returns its top-k labels gives; a label it did not return has probability 0;
criteria that need probabilities refuse a labels-only prediction). Detection: a sequence of
:class:`Detection` (or mappings with ``box``, ``label``, ``score``), boxes as (x1, y1, x2, y2) in
any one unit.

PertKnob (PER-3, seed 004 II-E). epsilon in [0, 1] is divided into k equal cells (k = 1000 in
the seed); the candidate epsilons are i / k, i = 1..k; epsilon = 0 is the clean image. Before
any perturbation the clean image is queried once (counted) unless the clean prediction is given
in the reference; if it already meets the criterion the image is reported ``already_met``
(minimal epsilon 0) and not searched.

- ``linear`` (the seed's search): increase epsilon one cell at a time and stop at the first cell
  that meets the criterion (``found``) or when all k cells fail (``never_fooled``). Exact for
  any criterion on the k-cell grid; up to k + 1 queries per image. ``batch`` > 1 sends that
  many consecutive cells per round (fewer round trips, up to ``batch`` - 1 queries spent past
  the first hit).
- ``bisection``: assumes the criterion is *monotone* in epsilon (once met, met for every larger
  epsilon), which is what the safety properties are built for (a larger epsilon is a larger
  perturbation of the same kind: properties.py "Coherence along epsilon"). It queries
  epsilon = 1 (not met -> ``never_fooled``), then halves the bracket (lo not met, hi met) on
  the k-cell grid until hi - lo = 1 cell: 1 + 1 + ceil(log2 k) queries (12 for k = 1000) and
  the same answer as the linear scan when the criterion is monotone. Optionally
  ``coarse_cells`` = c first scans c evenly spaced cells linearly and bisects inside the first
  coarse cell that meets the criterion: for a criterion that is not monotone this finds the
  first *coarse* crossing instead of an arbitrary one, at c extra queries at most.

Both stop when the per-image ``budget`` (clean query included) is spent: ``budget_exhausted``,
with the bracket reached so far (``upper`` = the smallest epsilon seen to meet the criterion,
if any; it is then an upper bound on the minimal epsilon and ``epsilon`` / ``l2`` are reported
for it).

For every image the result records the minimal epsilon on the grid and ||delta||_2 of that
perturbation, delta = (x' - x) / 255 over all pixels and channels (the [0, 1] scale), measured
on the uint8 image the target received.

Stochastic properties: each image gets its own generator (derived from the ``rng`` given, or
given one per image), and every evaluation starts from a copy of that generator's state, so
the image sees one random pattern scaled by epsilon at every cell (what makes the noises
monotone).

Per-property robustness (PER-4, seed 004 III-A): over the images, the mean and median of the
minimal ||delta||_2 of the images that were fooled, the share never fooled, and the fooling
rate at a threshold T (an image counts as fooled at T when its minimal ||delta||_2 < T; the
seed takes T = the mean minimal L2 over all models for a property, so pass one common T when
comparing models; by default T = this set's mean). ``already_met`` and ``budget_exhausted``
images are counted but left out of the statistics.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from fortis.services.common.errors import FieldViolation, InvalidArgument
from fortis.services.perturbation.properties import PROPERTIES, apply_property
from fortis.services.scoring.ieee import ClassPrediction

__all__ = [
    "ConfidentMisclassification",
    "Criterion",
    "Detection",
    "DetectionTargetClassProbBoost",
    "KnobConfig",
    "KnobResult",
    "Misclassification",
    "OriginalClassProbability",
    "PropertyRobustness",
    "Reference",
    "TargetClassProbBoost",
    "TargetObjectMiss",
    "TargetedMisclassification",
    "TopKMisclassification",
    "box_iou",
    "l2_distance",
    "pertknob",
    "pertknob_search",
    "property_perturbation",
    "property_robustness",
]

Box = tuple[float, float, float, float]
#: ``perturb(image, epsilon, rng) -> image``: uint8 in, uint8 of the same shape out.
Perturb = Callable[[np.ndarray, float, np.random.Generator], np.ndarray]
#: ``query(images) -> predictions``: one prediction per image, in order.
QueryFn = Callable[[list[np.ndarray]], Sequence[Any]]
Status = Literal["found", "never_fooled", "already_met", "budget_exhausted"]


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
    if isinstance(pred, ClassPrediction):
        if pred.error is not None:
            raise InvalidArgument("prediction", f"the query failed: {pred.error}")
        ranked = np.asarray(pred.labels, dtype=np.int64)
        scores = None if pred.scores is None else np.asarray(pred.scores, dtype=np.float64)
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


def box_iou(box: Sequence[float], boxes: np.ndarray) -> np.ndarray:
    """IoU of one (x1, y1, x2, y2) box with each row of an n x 4 array (0 where disjoint)."""
    b = np.asarray(box, dtype=np.float64)
    bs = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    ix = np.clip(np.minimum(b[2], bs[:, 2]) - np.maximum(b[0], bs[:, 0]), 0.0, None)
    iy = np.clip(np.minimum(b[3], bs[:, 3]) - np.maximum(b[1], bs[:, 1]), 0.0, None)
    inter = ix * iy
    area = max(b[2] - b[0], 0.0) * max(b[3] - b[1], 0.0)
    areas = np.clip(bs[:, 2] - bs[:, 0], 0.0, None) * np.clip(bs[:, 3] - bs[:, 1], 0.0, None)
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


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
        ious = box_iou(box, np.array([d.box for d in dets], dtype=np.float64))
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
        ious = box_iou(box, np.array([d.box for d in dets], dtype=np.float64))
        return bool((ious >= self.iou_threshold).any())


# --------------------------------------------------------------------------------------------
# PertKnob (PER-3)
# --------------------------------------------------------------------------------------------


def property_perturbation(property_id: str, params: Mapping[str, Any] | None = None) -> Perturb:
    """``perturb(image, epsilon, rng)`` for one safety property of properties.py (PER-1)."""
    if property_id not in PROPERTIES:
        raise InvalidArgument("perturbation_id", f"unknown property '{property_id}'; known: "
                                                 f"{', '.join(PROPERTIES)}")
    fixed = dict(params or {})

    def perturb(image: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
        return apply_property(property_id, image, epsilon, rng, fixed)

    perturb.__name__ = f"perturb_{property_id}"
    return perturb


def l2_distance(original: np.ndarray, perturbed: np.ndarray) -> float:
    """||delta||_2 on the [0, 1] scale: delta = (perturbed - original) / 255, all values."""
    d = (perturbed.astype(np.float64) - original.astype(np.float64)) / 255.0
    return float(np.sqrt(np.sum(d * d)))


@dataclass(frozen=True, kw_only=True)
class KnobConfig:
    """PertKnob settings (PER-3). ``budget``: queries per image, clean query included (None =
    cells + 1, enough for a full linear scan). See the module docstring for the modes."""

    mode: Literal["linear", "bisection"] = "linear"
    cells: int = 1000
    budget: int | None = None
    coarse_cells: int = 0
    batch: int = 1

    def __post_init__(self) -> None:
        v: list[FieldViolation] = []
        if self.mode not in ("linear", "bisection"):
            v.append(FieldViolation("pertknob.mode", "must be 'linear' or 'bisection'"))
        if isinstance(self.cells, bool) or not isinstance(self.cells, int) or self.cells < 1:
            v.append(FieldViolation("pertknob.cells", f"must be an integer >= 1, got "
                                                      f"{self.cells!r}"))
        if self.budget is not None and (isinstance(self.budget, bool)
                                        or not isinstance(self.budget, int) or self.budget < 1):
            v.append(FieldViolation("pertknob.budget", f"must be an integer >= 1, got "
                                                       f"{self.budget!r}"))
        if not isinstance(self.coarse_cells, int) or self.coarse_cells < 0:
            v.append(FieldViolation("pertknob.coarse_cells", "must be an integer >= 0"))
        if not isinstance(self.batch, int) or self.batch < 1:
            v.append(FieldViolation("pertknob.batch", "must be an integer >= 1"))
        if v:
            raise InvalidArgument.from_violations(v)

    @property
    def query_budget(self) -> int:
        return self.budget if self.budget is not None else self.cells + 1


@dataclass(frozen=True, kw_only=True)
class KnobResult:
    """PertKnob's answer for one image (PER-3).

    ``epsilon``: the minimal epsilon on the grid (``found``), 0 (``already_met``), an upper
    bound (``budget_exhausted`` after a hit) or None; ``l2`` / ``linf``: ||delta||_2 and
    ||delta||_inf of the perturbation at ``epsilon`` ([0, 1] scale). ``lower``: the largest
    epsilon seen not to meet the criterion (for bisection, assumed for every smaller epsilon);
    ``upper``: the smallest seen to meet it. ``queries``: images sent for this image.
    ``perturbed``: the perturbed image at ``epsilon`` when the search keeps images."""

    status: Status
    epsilon: float | None
    l2: float | None
    linf: float | None
    queries: int
    lower: float
    upper: float | None
    mode: str
    cells: int
    criterion: str
    perturbed: np.ndarray | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "epsilon": self.epsilon, "l2": self.l2,
                "linf": self.linf, "queries": self.queries, "lower": self.lower,
                "upper": self.upper, "mode": self.mode, "cells": self.cells,
                "criterion": self.criterion}


class _Search:
    """State of one image's search; indices are grid cells (0 = the clean image)."""

    def __init__(self, image: np.ndarray, ref: Reference, rng: np.random.Generator,
                 cfg: KnobConfig, criterion: Criterion) -> None:
        self.image = image
        self.ref = ref
        self.rng = rng
        self.cfg = cfg
        self.criterion = criterion
        self.budget = cfg.query_budget
        self.used = 0
        self.lo = 0                       # largest index known not to meet
        self.hi: int | None = None        # smallest index known to meet
        self.best: tuple[float, float, np.ndarray] | None = None   # l2, linf, image at hi
        self.status: Status | None = None
        k = cfg.cells
        if cfg.mode == "linear":
            self.scan = list(range(1, k + 1))
        elif cfg.coarse_cells > 0:
            c = min(cfg.coarse_cells, k)
            self.scan = sorted({max(1, round(j * k / c)) for j in range(1, c + 1)} | {k})
        else:
            self.scan = [k]
        self.pos = 0                      # next position in self.scan
        self.phase = "clean" if ref.original is None else "start"
        if self.phase == "start":
            self._after_clean(ref.original)

    # -- protocol
    def requests(self) -> list[int]:
        left = self.budget - self.used
        if self.status is not None:
            return []
        if left <= 0:
            self.status = "budget_exhausted"
            return []
        if self.phase == "clean":
            return [0]
        if self.phase == "scan":
            n = self.cfg.batch if self.cfg.mode == "linear" else 1
            return self.scan[self.pos:self.pos + min(n, left)]
        assert self.hi is not None        # bisect
        return [(self.lo + self.hi) // 2]

    def receive(self, idx: list[int], preds: Sequence[Any], imgs: list[np.ndarray]) -> None:
        self.used += len(idx)
        if self.phase == "clean":
            self.ref = replace(self.ref, original=preds[0])
            self._after_clean(preds[0])
            return
        if self.phase == "scan":
            for i, pred, img in zip(idx, preds, imgs, strict=True):
                self.pos += 1
                if self.criterion(pred, self.ref):
                    self._hit(i, img)
                    prev = self.scan[self.pos - 2] if self.pos >= 2 else 0
                    self.lo = max(self.lo, prev)
                    self.phase = "bisect"
                    break
                self.lo = i
            else:
                if self.pos >= len(self.scan):
                    self.status = "never_fooled"
                    return
        else:
            i, pred, img = idx[0], preds[0], imgs[0]
            if self.criterion(pred, self.ref):
                self._hit(i, img)
            else:
                self.lo = i
        if self.phase == "bisect" and self.hi is not None and self.hi - self.lo <= 1:
            self.status = "found"

    def _after_clean(self, clean_pred: Any) -> None:
        if self.criterion(clean_pred, self.ref):
            self.status = "already_met"
            self.hi = 0
            self.best = (0.0, 0.0, self.image.copy())
        self.phase = "scan"

    def _hit(self, i: int, img: np.ndarray) -> None:
        if self.hi is None or i < self.hi:
            self.hi = i
            d = (img.astype(np.float64) - self.image.astype(np.float64)) / 255.0
            self.best = (float(np.sqrt(np.sum(d * d))), float(np.abs(d).max(initial=0.0)), img)

    def result(self, keep: bool) -> KnobResult:
        k = self.cfg.cells
        status: Status = self.status if self.status is not None else "budget_exhausted"
        have = self.best is not None and self.hi is not None
        return KnobResult(
            status=status,
            epsilon=(self.hi / k if have and self.hi is not None else None),
            l2=self.best[0] if self.best is not None else None,
            linf=self.best[1] if self.best is not None else None,
            queries=self.used, lower=self.lo / k,
            upper=(self.hi / k if self.hi is not None else None),
            mode=self.cfg.mode, cells=k, criterion=self.criterion.name,
            perturbed=(self.best[2] if keep and self.best is not None else None))


def _check_images(images: Sequence[np.ndarray] | np.ndarray) -> list[np.ndarray]:
    out = []
    for n, im in enumerate(images):
        if not isinstance(im, np.ndarray) or im.dtype != np.uint8:
            raise InvalidArgument(f"images[{n}]", "must be a uint8 numpy array")
        out.append(im)
    if not out:
        raise InvalidArgument("images", "at least one image is needed")
    return out


def pertknob_search(images: Sequence[np.ndarray] | np.ndarray, perturb: Perturb,
                    criterion: Criterion, query: QueryFn, *,
                    rng: np.random.Generator | Sequence[np.random.Generator],
                    references: Sequence[Reference] | None = None,
                    config: KnobConfig | None = None, max_batch: int = 256,
                    keep_images: bool = False) -> list[KnobResult]:
    """PertKnob (PER-3) over several images in lock-step: each round every unfinished image
    contributes its next cell(s), and the perturbed images go to ``query`` together (chunks of
    at most ``max_batch`` images). Every image sent counts as one query of that image; an image
    never sends more than ``config.query_budget``.

    ``rng``: one generator per image, or one generator from which each image's generator is
    derived (one 63-bit seed drawn per image, in order). ``references[n]``: image n's ground
    truth / clean prediction / target box (default: ``Reference()``, i.e. the clean top-1 is
    the label)."""
    cfg = config or KnobConfig()
    ims = _check_images(images)
    refs = list(references) if references is not None else [Reference() for _ in ims]
    if len(refs) != len(ims):
        raise InvalidArgument("references", f"{len(refs)} references for {len(ims)} images")
    if isinstance(rng, np.random.Generator):
        seeds = rng.integers(0, 2**63 - 1, size=len(ims))
        rngs = [np.random.default_rng(int(s)) for s in seeds]
    else:
        rngs = list(rng)
        if len(rngs) != len(ims) or not all(isinstance(g, np.random.Generator) for g in rngs):
            raise InvalidArgument("rng", "give one numpy Generator, or one per image")
    if max_batch < 1:
        raise InvalidArgument("max_batch", "must be >= 1")
    searches = [_Search(im, ref, g, cfg, criterion)
                for im, ref, g in zip(ims, refs, rngs, strict=True)]

    while True:
        plan: list[tuple[int, list[int]]] = []
        for s_idx, s in enumerate(searches):
            req = s.requests()
            if req:
                plan.append((s_idx, req))
        if not plan:
            break
        batch_imgs: list[np.ndarray] = []
        for s_idx, req in plan:
            s = searches[s_idx]
            for i in req:
                if i == 0:
                    batch_imgs.append(s.image)
                else:
                    # every evaluation starts from the image's generator state (coherence)
                    img = perturb(s.image, i / cfg.cells, copy.deepcopy(s.rng))
                    if not isinstance(img, np.ndarray) or img.shape != s.image.shape:
                        raise InvalidArgument("perturb", "must return an image of the input's "
                                                         "shape")
                    batch_imgs.append(img)
        preds: list[Any] = []
        for start in range(0, len(batch_imgs), max_batch):
            chunk = batch_imgs[start:start + max_batch]
            got = list(query(chunk))
            if len(got) != len(chunk):
                raise InvalidArgument("query", f"returned {len(got)} predictions for "
                                                f"{len(chunk)} images")
            preds.extend(got)
        pos = 0
        for s_idx, req in plan:
            n = len(req)
            searches[s_idx].receive(req, preds[pos:pos + n], batch_imgs[pos:pos + n])
            pos += n
    return [s.result(keep_images) for s in searches]


def pertknob(image: np.ndarray, perturb: Perturb, criterion: Criterion, query: QueryFn, *,
             rng: np.random.Generator, reference: Reference | None = None,
             config: KnobConfig | None = None, keep_images: bool = False) -> KnobResult:
    """PertKnob (PER-3) for one image; ``rng`` is used as the image's own generator."""
    return pertknob_search([image], perturb, criterion, query, rng=[rng],
                           references=[reference or Reference()], config=config,
                           keep_images=keep_images)[0]


# --------------------------------------------------------------------------------------------
# Per-property robustness (PER-4)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PropertyRobustness:
    """PER-4 statistics of one property over a set of images (see the module docstring)."""

    n_images: int
    n_found: int
    n_never_fooled: int
    n_already_met: int
    n_undetermined: int
    mean_l2: float | None
    median_l2: float | None
    never_fooled_share: float | None
    threshold: float | None
    threshold_source: str
    fooling_rate: float | None
    mean_queries: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def property_robustness(results: Sequence[KnobResult], *,
                        threshold: float | None = None) -> PropertyRobustness:
    """Mean and median minimal ||delta||_2 over the fooled images, the share never fooled and
    the fooling rate at ``threshold`` T (default: this set's mean minimal L2) (PER-4)."""
    if threshold is not None and not (math.isfinite(threshold) and threshold >= 0):
        raise InvalidArgument("threshold", f"must be a finite number >= 0, got {threshold!r}")
    found = [r.l2 for r in results if r.status == "found" and r.l2 is not None]
    never = sum(r.status == "never_fooled" for r in results)
    decided = len(found) + never
    mean = statistics.fmean(found) if found else None
    median = statistics.median(found) if found else None
    t, source = (threshold, "given") if threshold is not None else (mean, "mean_l2")
    rate = (sum(v < t for v in found) / decided) if (decided and t is not None) else None
    return PropertyRobustness(
        n_images=len(results), n_found=len(found), n_never_fooled=never,
        n_already_met=sum(r.status == "already_met" for r in results),
        n_undetermined=sum(r.status == "budget_exhausted" for r in results),
        mean_l2=mean, median_l2=median,
        never_fooled_share=(never / decided) if decided else None,
        threshold=t, threshold_source=source, fooling_rate=rate,
        mean_queries=statistics.fmean([r.queries for r in results]) if results else 0.0)
