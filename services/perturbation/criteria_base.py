"""What every criterion of ``criteria.py`` shares: the predictions and references it judges
(classification, detection), the :class:`Criterion` base with its vectorised forms, and the
margin helpers (< 0 exactly when a criterion is met).

Pure domain code of the perturbation service (no gRPC, nothing of another service).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from fortis.core.task import Task
from fortis.services.common.errors import InvalidArgument

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



def _check_iou_open(value: float, field_name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or not 0.0 <= value < 1.0:
        raise InvalidArgument(field_name, f"must be a number in [0, 1), got {value!r}")

def _check_prob(value: float, field_name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise InvalidArgument(field_name, f"must be a probability in [0, 1], got {value!r}")
