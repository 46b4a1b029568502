"""The detection criteria of ``criteria.py``: the threat criteria marked with a dagger in
Table I (the target object missed, a target class boosted on it) and the query-attack
criteria judged like scoring judges a detector (IEEE-C4: an object missed or relabelled).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fortis.core.boxes import iou_xyxy
from fortis.core.task import Task
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.matching import match_objects
from fortis.services.perturbation.criteria_base import (
    Box,
    Criterion,
    Reference,
    _check_iou_open,
    _check_prob,
    _detections,
    signed_margins,
)


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

