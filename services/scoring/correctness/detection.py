"""Object-detection correctness (IEEE Std 3129-2023 IEEE-C4, with IEEE-C3 over the objects and
the IEEE-P3 thresholds). Domain code: no gRPC.

Ground-truth boxes are matched to predicted boxes by IoU with the class label agreeing. IoU
takes the place of confidence in IEEE-C2 (:class:`DetectionCriterion`):

- ``top1``: the object's highest-IoU *available* prediction has the object's class;
- ``topk``: the object's class is among its ``k`` highest-IoU available predictions;
- ``threshold``: some available prediction of the object's class has IoU > threshold.

In every mode a prediction is a candidate for an object only when IoU > ``iou_threshold``
(the plan's IoU threshold, IEEE-P3; 0 gives the literal "any overlap" reading of top-1/K),
and, when the plan sets ``confidence_threshold``, only when its score is >= that threshold (a
minimum confidence, IEEE-P3). Then IEEE-C3 over the s objects of the image.

**One prediction never matches two objects.** Matching is greedy and one-to-one, ordered by
IoU, every image of a batch at once: the rule is :func:`fortis.core.matching.match_batch`
(defined there once; the perturbation service's attack criteria apply the same function). A
prediction already taken by an object it overlaps more is therefore not the next object's
top-1.

An image with no ground-truth object is correct iff no prediction survives the confidence
threshold (it correctly reports nothing). When Q (at least Q of s) exceeds an image's number
of objects s, Q is capped at s: that image needs all its objects. A failed query makes the
image incorrect.

Labels: without a label mapping a ground-truth label g and a predicted label p agree iff
g - base_gt == p - base_pred (see :mod:`~fortis.services.scoring.correctness.boxes`). With a
label mapping (IEEE-P6) the keys are the ground truth's labels as written and the values the
service's labels as written, so only the mapping decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from fortis.core.boxes import iou_xyxy
from fortis.core.criteria import DetectionCriterion
from fortis.core.matching import match_batch
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.correctness.boxes import DetectionBatch, Detections
from fortis.services.scoring.correctness.common import (
    LabelMapping,
)

__all__ = [
    "DetectionCriterion",
    "DetectionMatch",
    "detection_correct",
    "match_detections",
]

@dataclass(frozen=True, eq=False)
class DetectionMatch:
    """One image's IEEE-C4 outcome: ``object_correct[i]`` per ground-truth object,
    ``matched[i]`` the index of the prediction matched to it (-1: none), ``iou`` the
    ``(objects, predictions)`` IoU matrix, ``kept`` which predictions survived the confidence
    threshold, ``correct`` the image's verdict after IEEE-C3."""

    correct: bool
    object_correct: np.ndarray
    matched: np.ndarray
    iou: np.ndarray
    kept: np.ndarray


def _as_batch(x: DetectionBatch | Sequence[Detections], field: str,
              image_ids: Sequence[str] | None,
              sizes: Sequence[tuple[int, int] | None] | None = None) -> DetectionBatch:
    if isinstance(x, DetectionBatch):
        return x
    return DetectionBatch.from_images(x, field=field, image_ids=image_ids, image_sizes=sizes)


def _sizes_of(truths: Sequence[Detections] | DetectionBatch) -> list[tuple[int, int] | None] | None:
    if isinstance(truths, DetectionBatch):
        return None
    return [t.image_size if isinstance(t, Detections) else None for t in truths]


def detection_correct(
    truths: DetectionBatch | Sequence[Detections],
    predictions: DetectionBatch | Sequence[Detections],
    criterion: DetectionCriterion,
    *,
    label_mapping: LabelMapping | None = None,
    image_ids: Sequence[str] | None = None,
) -> np.ndarray:
    """IEEE-C4 (+ C3 over objects) for N images at once -> (N,) bool: image n of
    ``predictions`` is judged against image n of ``truths`` (every image, not only the
    first). ``label_mapping`` maps ground-truth labels to service labels (IEEE-P6)."""
    t = _as_batch(truths, "truths", image_ids)
    p = _as_batch(predictions, "predictions", image_ids, _sizes_of(truths))
    return _match_batches(t, p, criterion, label_mapping)[0]


def match_detections(truth: Detections, prediction: Detections, criterion: DetectionCriterion,
                     *, label_mapping: LabelMapping | None = None) -> DetectionMatch:
    """IEEE-C4 for one image, with the per-object details (see :class:`DetectionMatch`)."""
    t = DetectionBatch.from_images([truth], field="truth", image_ids=["0"])
    p = DetectionBatch.from_images([prediction], field="prediction", image_ids=["0"],
                                   image_sizes=[truth.image_size])
    image_ok, obj_ok, matched, kept = _match_batches(t, p, criterion, label_mapping)
    iou = iou_xyxy(t.boxes, p.boxes)
    return DetectionMatch(bool(image_ok[0]), obj_ok, matched, iou, kept)


def _canonical_labels(t: DetectionBatch, p: DetectionBatch,
                      mapping: LabelMapping | None) -> tuple[np.ndarray, np.ndarray]:
    """Ground truth -> (G, A) acceptable 0-based service labels (-1 padded); predictions ->
    (P,) 0-based service labels. Checks labels against their base."""
    img_p = p.image_of_row()
    pred = p.labels - p.label_base[img_p]
    below = np.flatnonzero(pred < 0)
    if len(below):
        r = int(below[0])
        raise InvalidArgument(p.where(r, "labels"), f"label {int(p.labels[r])} is below "
                              f"label_base {int(p.label_base[img_p[r]])} (are the labels "
                              "0-indexed?)")
    img_g = t.image_of_row()
    if mapping is None:
        acc = (t.labels - t.label_base[img_g])[:, None]
        below = np.flatnonzero(acc[:, 0] < 0)
        if len(below):
            r = int(below[0])
            raise InvalidArgument(t.where(r, "labels"), f"label {int(t.labels[r])} is below "
                                  f"label_base {int(t.label_base[img_g[r]])} (are the labels "
                                  "0-indexed?)")
        return acc, pred
    mapped = mapping.map_array(t.labels, where=f"{t.field} labels")
    base = p.label_base[img_g][:, None]
    acc = np.where(mapped >= 0, mapped - base, -1)
    bad = np.argwhere((mapped >= 0) & (acc < 0))
    if len(bad):
        r = int(bad[0][0])
        raise InvalidArgument(mapping.field, f"dataset label {int(t.labels[r])} maps to service "
                              f"label {int(mapped[r, bad[0][1]])}, below the predictions' "
                              f"label_base {int(base[r, 0])}")
    return acc, pred


def _match_batches(t: DetectionBatch, p: DetectionBatch, crit: DetectionCriterion,
                   mapping: LabelMapping | None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The batched IEEE-C4 matching (module docstring), then IEEE-C3 over each image's
    objects. Returns image verdicts (N,), object verdicts (G,), matched prediction row per
    object (G,; -1 none, rows of ``p``) and the kept-prediction mask (P,)."""
    n = t.n_images
    if p.n_images != n:
        raise InvalidArgument(p.field, f"{p.n_images} images of predictions for {n} images of "
                                       "ground truth")
    acc, pred_lab = _canonical_labels(t, p, mapping)
    img_p = p.image_of_row()
    keep = ~p.failed[img_p]
    conf = crit.confidence_threshold
    if conf is not None and len(img_p):
        if p.scores is None or np.isnan(p.scores[keep]).any():
            r = int(np.flatnonzero(keep & (np.isnan(p.scores) if p.scores is not None
                                           else np.ones(len(keep), bool)))[0])
            raise InvalidArgument(p.where(r, "scores"), "detection.confidence_threshold needs "
                                                        "a score for every predicted box")
    m = match_batch(t.boxes, acc, t.counts, p.boxes, pred_lab, p.scores, p.counts,
                    iou_threshold=crit.iou_threshold, rank_limit=crit.rank_limit,
                    score_threshold=conf, keep=keep)
    pc = np.bincount(img_p[m.kept], minlength=n).astype(np.int64)
    gc = t.counts
    # IEEE-C3 over the objects of each image
    ok_count = np.bincount(t.image_of_row(), weights=m.found, minlength=n)
    agg = crit.aggregate
    if agg.mode == "all":
        image_ok = ok_count >= gc
    else:
        image_ok = ok_count >= np.minimum(agg.q, gc)
    image_ok = np.where(gc == 0, pc == 0, image_ok) & ~p.failed
    return np.asarray(image_ok, bool), m.found, m.matched, m.kept
