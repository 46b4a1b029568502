"""The classification threat criteria (PER-2, seed 004 Table I) of ``criteria.py``:
misclassification, confident or top-k misclassification, the original class's probability,
a target class's probability boost, targeted misclassification.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.criteria_base import (
    Criterion,
    Reference,
    _check_prob,
    _class_view,
    margins,
    signed_margins,
)


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


