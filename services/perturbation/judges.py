"""Task judges: how a query attack's success criterion is read off the target's answers, for
classifiers, detectors and segmenters alike (IEEE-A8 with IEEE-C2 / IEEE-C4 / IEEE-C5).

An attack asks :meth:`~.attacks.base.AttackContext.margin_query` (score-based: a float per
image, < 0 exactly when the criterion holds) or :meth:`~.attacks.base.AttackContext.
decision_query` (decision-based: a bool per image); both are a judge's :meth:`Judge.margins`
/ :meth:`Judge.decisions` over the query client (in production the target proxy: every image
one counted query). The attack never reads scores, boxes or masks itself, so it runs
unchanged on any task and on any signal the target gives.

- :class:`ClassificationJudge`: the criterion's vectorised forms (``criteria.py``) over the
  dense class scores (full scores, or top-k scores where the classes not returned score 0)
  or over the top-1 labels (decisions for Misclassification / TargetedMisclassification;
  label-only targets).
- :class:`DetectionJudge`: :class:`~.criteria.ObjectMissed` / :class:`~.criteria.
  ObjectRelabelled` on each answer's boxes against the image's objects of interest (the
  plan's ground-truth boxes with their classes; else the clean answer's highest-scoring kept
  detection).
- :class:`SegmentationJudge`: :class:`~.criteria.MIoUBelow` on the class maps (and the
  per-pixel probabilities where the target returns them) against the reference mask (the
  ground truth; else the clean answer's class map).

**The clean answer as the reference.** Where a reference is missing (no ground truth, or a
criterion that compares with the clean answer, e.g. Top-k misclassification), the judge takes
it from the first answer it sees for that image, which every attack must make the clean image
(the IEEE-M6 rule of ``attacks/base.py``: the clean image is the first query and is counted):
no extra query is ever sent. A first query that is not the clean image is a bug of the attack
and raises.

Pure domain code: no gRPC.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

import numpy as np
from fortis.core.strategy import STRATEGIES
from fortis.core.task import Task
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.criteria import (
    Criterion,
    MIoUBelow,
    ObjectMissed,
    ObjectRelabelled,
    RankedPrediction,
)

__all__ = ["SIGNALS", "Answer", "BoxAnswer", "BoxReference", "ClassAnswer",
           "ClassificationJudge", "DetectionJudge", "Judge", "MaskAnswer", "PredictionClient",
           "SegmentationJudge", "make_judge", "signal_of_output"]

#: What a target gives (``AttackContext.signal``) and what an attack read (reports).
SIGNALS = ("scores", "top_k", "labels", "boxes", "masks", "probabilities")

#: Every task's output kinds -> signals, from the task strategies (``core/strategy.py``).
_OUTPUT_SIGNAL = {kind: signal for st in STRATEGIES.values() for kind, signal in st.outputs.items()}


def signal_of_output(output_kind: str) -> str:
    """The signal of a target's output kind (TargetInfo: full_scores, top_k, label_only,
    boxes, masks)."""
    return _OUTPUT_SIGNAL.get(output_kind, "scores")


# --------------------------------------------------------------------------------------------
# Answers and references (domain forms of the target's predictions)
# --------------------------------------------------------------------------------------------


#: A classifier's answer: ``labels`` best first, ``scores`` aligned (None: labels only); the
#: criteria's per-image classification answer, one type for both.
ClassAnswer: TypeAlias = RankedPrediction


@dataclass(frozen=True, eq=False)
class BoxAnswer:
    """A detector's answer: ``boxes`` (k, 4) pixel xyxy, ``labels`` (k,), ``scores`` (k,)."""

    boxes: np.ndarray
    labels: np.ndarray
    scores: np.ndarray


@dataclass(frozen=True, eq=False)
class MaskAnswer:
    """A segmenter's answer: ``class_map`` (H, W) int, ``probabilities`` (H, W, C) or None."""

    class_map: np.ndarray
    probabilities: np.ndarray | None = None


Answer: TypeAlias = ClassAnswer | BoxAnswer | MaskAnswer


@dataclass(frozen=True, eq=False)
class BoxReference:
    """The objects of interest of one image: ``boxes`` (k, 4) pixel xyxy, ``labels`` (k,)."""

    boxes: np.ndarray
    labels: np.ndarray

    @classmethod
    def of(cls, boxes: Any, labels: Any, *, field: str = "objects") -> BoxReference:
        """Checked: finite pixel xyxy boxes of positive area, one label each."""
        b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        lab = np.asarray(labels, dtype=np.int64).reshape(-1)
        if len(lab) != len(b):
            raise InvalidArgument(field, f"{len(b)} boxes with {len(lab)} labels")
        if len(b) and (not np.isfinite(b).all() or not ((b[:, 2] > b[:, 0])
                                                        & (b[:, 3] > b[:, 1])).all()):
            raise InvalidArgument(field, "boxes must be finite pixel xyxy with x_max > x_min "
                                  "and y_max > y_min")
        return cls(boxes=b, labels=lab)


class PredictionClient(Protocol):
    """What the judges need of a query client: the raw answers, one per image, each row
    charged to its image id (``proxy_client.ProxyQueryClient``)."""

    def predictions(self, images: np.ndarray, image_ids: Sequence[str]) -> list[Answer]: ...


class Judge(Protocol):
    """Margins (score-based) and decisions (decision-based) of one attack call."""

    def margins(self, images: np.ndarray, idx: np.ndarray) -> np.ndarray: ...

    def decisions(self, images: np.ndarray, idx: np.ndarray) -> np.ndarray: ...

    def signal(self) -> str: ...


class _Base:
    """Shared: the images' ids, the clean images (references taken from their answers) and
    what was read."""

    def __init__(self, client: Any, criterion: Criterion, images: np.ndarray,
                 image_ids: Sequence[str]) -> None:
        self.client = client
        self.criterion = criterion
        self.clean = images
        self.ids = tuple(image_ids)
        self._read: set[str] = set()

    def _ids(self, idx: np.ndarray) -> list[str]:
        return [self.ids[int(i)] for i in idx]

    def _check_clean(self, images: np.ndarray, k: int, i: int) -> None:
        if not np.array_equal(images[k], self.clean[i]):
            raise RuntimeError(f"the first query for image '{self.ids[i]}' must be the clean "
                               "image (IEEE-M6): the judge takes the reference from its answer")

    def _predictions(self, images: np.ndarray, idx: np.ndarray) -> list[Answer]:
        fn = getattr(self.client, "predictions", None)
        if fn is None:
            raise InvalidArgument("query", "this query client gives no raw predictions "
                                  "(detection and segmentation targets need them)")
        answers = list(fn(images, self._ids(idx)))
        if len(answers) != len(idx):
            raise InvalidArgument("predictions", f"the target answered {len(answers)} of "
                                  f"{len(idx)} images")
        return answers

    def signal(self) -> str:
        """What this judge read from the target so far (the weakest, if several)."""
        for s in ("labels", "top_k", "masks", "probabilities", "boxes", "scores"):
            if s in self._read:
                return s
        return ""

    def decisions(self, images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        return np.asarray(self.margins(images, idx) < 0, dtype=bool)

    def margins(self, images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        raise NotImplementedError


# --------------------------------------------------------------------------------------------
# Classification (IEEE-C2 top-1; PER-2)
# --------------------------------------------------------------------------------------------


class ClassificationJudge(_Base):
    """The criterion on dense class scores (``client.scores``) or top-1 labels
    (``client.labels``); the clean scores kept for the criteria that need them."""

    def __init__(self, client: Any, criterion: Criterion, images: np.ndarray,
                 image_ids: Sequence[str], labels: np.ndarray) -> None:
        super().__init__(client, criterion, images, image_ids)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.given = str(getattr(client, "signal", "scores"))
        self._clean_scores: dict[int, np.ndarray] = {}

    def _scores(self, images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        if self.given == "labels":
            raise InvalidArgument("criterion", f"{self.criterion.name} is judged on class "
                                  "scores; the target returns labels only")
        scores = np.asarray(self.client.scores(images, self._ids(idx)))
        if scores.ndim != 2 or scores.shape[0] != len(idx):
            raise InvalidArgument("scores", f"query returned shape {scores.shape} for "
                                  f"{len(idx)} images")
        if len(idx) and int(self.labels[idx].max()) >= scores.shape[1]:
            raise InvalidArgument("labels", f"label {int(self.labels[idx].max())} out of range "
                                  f"for {scores.shape[1]} scores")
        self._read.add(self.given)
        return scores

    def margins(self, images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        scores = self._scores(images, idx)
        clean = None
        if self.criterion.needs_clean:
            for k, i in enumerate(idx.tolist()):
                if i not in self._clean_scores:
                    self._check_clean(images, k, i)
                    self._clean_scores[i] = scores[k].copy()
            clean = np.stack([self._clean_scores[i] for i in idx.tolist()]) if len(idx) else \
                scores[:0]
        return np.asarray(self.criterion.margins(scores, self.labels[idx], clean=clean),
                          dtype=np.float64)

    def decisions(self, images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        if not self.criterion.label_decidable:
            return np.asarray(self.margins(images, idx) < 0, dtype=bool)
        top1 = np.asarray(self.client.labels(images, self._ids(idx)))
        if top1.shape != (len(idx),):
            raise InvalidArgument("labels", f"query returned shape {top1.shape} for "
                                  f"{len(idx)} images")
        self._read.add("labels")
        return np.asarray(self.criterion.adversarial_labels(top1, self.labels[idx]), dtype=bool)


# --------------------------------------------------------------------------------------------
# Detection (IEEE-C4)
# --------------------------------------------------------------------------------------------


class DetectionJudge(_Base):
    """:class:`ObjectMissed` / :class:`ObjectRelabelled` per answer against each image's
    objects of interest."""

    def __init__(self, client: Any, criterion: Criterion, images: np.ndarray,
                 image_ids: Sequence[str], references: Sequence[BoxReference | None]) -> None:
        if not isinstance(criterion, ObjectMissed | ObjectRelabelled):
            raise InvalidArgument("criterion", f"{criterion.name} does not apply to a "
                                  "detection target")
        super().__init__(client, criterion, images, image_ids)
        self.refs: list[BoxReference | None] = list(references) or [None] * len(images)
        self.crit = criterion

    def _reference_of(self, answer: BoxAnswer) -> BoxReference:
        """The clean answer's highest-scoring kept detection (none: no object)."""
        sc = np.asarray(answer.scores, dtype=np.float64)
        thr = getattr(self.crit, "score_threshold", None)
        keep = np.ones(len(sc), bool) if thr is None else sc >= float(thr)
        if not keep.any():
            return BoxReference.of(np.zeros((0, 4)), np.zeros(0, np.int64))
        best = int(np.flatnonzero(keep)[np.argmax(sc[keep])])
        return BoxReference.of(answer.boxes[best:best + 1], answer.labels[best:best + 1])

    def margins(self, images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        answers = self._predictions(images, idx)
        out = np.empty(len(idx))
        for k, (i, a) in enumerate(zip(idx.tolist(), answers, strict=True)):
            if not isinstance(a, BoxAnswer):
                raise InvalidArgument("predictions", f"expected a detection answer for image "
                                      f"'{self.ids[i]}', got {type(a).__name__}")
            ref = self.refs[i]
            if ref is None:
                self._check_clean(images, k, i)
                ref = self.refs[i] = self._reference_of(a)
            out[k] = self.crit.object_margin(a.boxes, a.labels, a.scores, ref.boxes, ref.labels)
        self._read.add("boxes")
        return out


# --------------------------------------------------------------------------------------------
# Segmentation (IEEE-C5)
# --------------------------------------------------------------------------------------------


class SegmentationJudge(_Base):
    """:class:`MIoUBelow` on the answers' class maps (and per-pixel probabilities) against
    each image's reference mask."""

    def __init__(self, client: Any, criterion: Criterion, images: np.ndarray,
                 image_ids: Sequence[str], references: Sequence[np.ndarray | None]) -> None:
        if not isinstance(criterion, MIoUBelow):
            raise InvalidArgument("criterion", f"{criterion.name} does not apply to a "
                                  "segmentation target")
        super().__init__(client, criterion, images, image_ids)
        self.refs: list[np.ndarray | None] = list(references) or [None] * len(images)
        self.crit = criterion

    def margins(self, images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        answers = self._predictions(images, idx)
        for k, (i, a) in enumerate(zip(idx.tolist(), answers, strict=True)):
            if not isinstance(a, MaskAnswer):
                raise InvalidArgument("predictions", f"expected a segmentation answer for "
                                      f"image '{self.ids[i]}', got {type(a).__name__}")
            if self.refs[i] is None:
                self._check_clean(images, k, i)
                self.refs[i] = np.asarray(a.class_map, dtype=np.int64)
        out = np.empty(len(idx))
        groups: dict[tuple[int, ...], list[int]] = {}
        for k, i in enumerate(idx.tolist()):
            ref = self.refs[i]
            assert ref is not None
            groups.setdefault(ref.shape, []).append(k)
        for shape, ks in groups.items():            # same-size images as one stack
            refs = np.stack([np.asarray(self.refs[int(idx[k])]) for k in ks])
            # an answer of another size scores as no pixel right (as scoring does)
            maps = np.stack([np.asarray(answers[k].class_map, dtype=np.int64)  # type: ignore[union-attr]
                             if np.shape(answers[k].class_map) == shape  # type: ignore[union-attr]
                             else np.full(shape, -1, np.int64) for k in ks])
            probs = [answers[k].probabilities for k in ks]  # type: ignore[union-attr]
            usable = all(p is not None and p.ndim == 3 and p.shape[:2] == shape
                         and p.shape[2] == probs[0].shape[2] for p in probs)  # type: ignore[union-attr]
            stacked = np.stack(probs) if usable else None  # type: ignore[arg-type]
            out[ks] = self.crit.mask_margins(maps, refs, stacked)
            self._read.add("probabilities" if usable else "masks")
        return out


def make_judge(task: str, criterion: Criterion, client: Any, images: np.ndarray,
               image_ids: Sequence[str], labels: np.ndarray,
               references: Sequence[Any] = ()) -> Judge:
    """The judge of ``criterion`` on a ``task`` target (criterion and task must agree)."""
    if criterion.task != task:
        raise InvalidArgument("criterion", f"{criterion.name} is a {criterion.task} criterion; "
                              f"the target is a {task} target")
    return _JUDGES[Task(task)](client, criterion, images, image_ids, labels, references)


#: The judge of each task: this service's side of the task strategy (core names no service).
#: A classifier is judged against the images' labels, detectors and segmenters against their
#: references (ground truth, else the clean answer).
_JUDGES: Mapping[Task, Callable[..., Judge]] = {
    Task.CLASSIFICATION: lambda client, crit, images, ids, labels, refs:
        ClassificationJudge(client, crit, images, ids, labels),
    Task.DETECTION: lambda client, crit, images, ids, labels, refs:
        DetectionJudge(client, crit, images, ids, refs),
    Task.SEGMENTATION: lambda client, crit, images, ids, labels, refs:
        SegmentationJudge(client, crit, images, ids, refs),
}
