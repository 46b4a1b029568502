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

**One prediction never matches two objects.** Matching is greedy and one-to-one, as in COCO's
evaluation, but ordered by IoU (IoU replaces confidence in IEEE-C4): all candidate (object,
prediction) pairs of an image are visited by decreasing IoU (ties: higher score, then lower
prediction index, then lower object index). A pair whose object is already matched, or whose
prediction is already taken, is skipped. Otherwise the prediction is the object's next-ranked
available prediction: if it has the object's class and its rank is within 1 (top1), k (topk)
or unlimited (threshold), the two are matched and the prediction is taken; a wrong-class
prediction is not taken (it may still match another object of its own class), but it uses up
one of the object's ranks. A prediction already taken by an object it overlaps more is
therefore not the next object's top-1.

An image with no ground-truth object is correct iff no prediction survives the confidence
threshold (it correctly reports nothing). When Q (at least Q of s) exceeds an image's number
of objects s, Q is capped at s: that image needs all its objects. A failed query makes the
image incorrect.

Labels: without a label mapping a ground-truth label g and a predicted label p agree iff
g - base_gt == p - base_pred (see :mod:`~fortis.services.scoring.correctness.boxes`). With a
label mapping (IEEE-P6) the keys are the ground truth's labels as written and the values the
service's labels as written, so only the mapping decides.

The matching runs over every image of a batch at once: all (object, prediction) pairs of a
chunk of images are built flat, sorted once and resolved in lockstep (one step per pair rank,
every image advancing together), so N images cost a handful of numpy calls, not N.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from fortis.services.common.arrays import iou_xyxy
from fortis.services.common.criteria import DetectionCriterion
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

#: (object, prediction) pairs per matching chunk (bounds memory on large batches).
_PAIR_CHUNK = 1 << 21


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
    """Vectorised greedy one-to-one matching (module docstring). Returns image verdicts (N,),
    object verdicts (G,), matched prediction row per object (G,; -1 none, rows of ``p``)
    and the kept-prediction mask (P,)."""
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
        keep &= p.scores >= conf
    kept_rows = np.flatnonzero(keep)
    pc = np.bincount(img_p[kept_rows], minlength=n).astype(np.int64)
    p_off = np.concatenate([[0], np.cumsum(pc)]).astype(np.int64)
    k_boxes = p.boxes[kept_rows]
    k_lab = pred_lab[kept_rows]
    k_score = p.scores[kept_rows] if p.scores is not None else np.zeros(len(kept_rows))
    k_score = np.where(np.isnan(k_score), -np.inf, k_score)

    gc = t.counts
    n_g = int(t.offsets[-1])
    img_g = t.image_of_row()
    g_matched = np.zeros(n_g, bool)
    g_rank = np.zeros(n_g, np.int64)
    g_pred = np.full(n_g, -1, np.int64)
    p_used = np.zeros(len(kept_rows), bool)
    limit = crit.rank_limit

    pairs_per_image = gc * pc
    cum = np.cumsum(pairs_per_image)
    start_img = 0
    while start_img < n:
        base = cum[start_img - 1] if start_img else 0
        end_img = int(np.searchsorted(cum, base + _PAIR_CHUNK, side="right"))
        end_img = max(end_img, start_img + 1)
        g_lo, g_hi = int(t.offsets[start_img]), int(t.offsets[end_img])
        if g_hi > g_lo and p_off[end_img] > p_off[start_img]:
            _match_chunk(np.arange(g_lo, g_hi), img_g, t.boxes, acc, pc, p_off, k_boxes,
                         k_lab, k_score, crit.iou_threshold, limit, g_matched, g_rank, g_pred,
                         p_used)
        start_img = end_img

    # IEEE-C3 over the objects of each image
    ok_count = np.bincount(img_g, weights=g_matched, minlength=n)
    agg = crit.aggregate
    if agg.mode == "all":
        image_ok = ok_count >= gc
    else:
        image_ok = ok_count >= np.minimum(agg.q, gc)
    image_ok = np.where(gc == 0, pc == 0, image_ok) & ~p.failed
    matched_rows = np.full(n_g, -1, np.int64)
    matched_rows[g_pred >= 0] = kept_rows[g_pred[g_pred >= 0]]
    return np.asarray(image_ok, bool), g_matched, matched_rows, keep


def _match_chunk(g_rows: np.ndarray, img_g: np.ndarray, g_boxes: np.ndarray, acc: np.ndarray,
                 pc: np.ndarray, p_off: np.ndarray, k_boxes: np.ndarray, k_lab: np.ndarray,
                 k_score: np.ndarray, iou_thr: float, limit: int | None, g_matched: np.ndarray,
                 g_rank: np.ndarray, g_pred: np.ndarray, p_used: np.ndarray) -> None:
    # every (object, prediction) pair of the same image, flat
    per_g = pc[img_g[g_rows]]
    total = int(per_g.sum())
    if total == 0:
        return
    gi = np.repeat(g_rows, per_g)
    first = np.repeat(np.cumsum(per_g) - per_g, per_g)
    pj = np.repeat(p_off[img_g[g_rows]], per_g) + (np.arange(total) - first)
    iou = _pair_iou(g_boxes[gi], k_boxes[pj])
    cand = iou > iou_thr
    agree = (acc[gi] == k_lab[pj][:, None]).any(axis=1)
    if limit is None:           # threshold mode: wrong-class pairs can never matter
        cand &= agree
    gi, pj, iou, agree = gi[cand], pj[cand], iou[cand], agree[cand]
    if len(gi) == 0:
        return
    img = img_g[gi]
    order = np.lexsort((gi, pj, -k_score[pj], -iou, img))
    gi, pj, agree, img = gi[order], pj[order], agree[order], img[order]
    # position of each pair within its image's IoU-descending list
    idx = np.arange(len(gi))
    run_start = np.maximum.accumulate(np.where(np.r_[True, img[1:] != img[:-1]], idx, 0))
    pos = idx - run_start
    by_pos = np.argsort(pos, kind="stable")
    bounds = np.r_[0, np.cumsum(np.bincount(pos))]
    # lockstep greedy: step s handles the s-th pair of every image at once (an image has at
    # most one pair per step, so the fancy-indexed updates never collide)
    for step in range(len(bounds) - 1):
        b = by_pos[bounds[step]:bounds[step + 1]]
        g, q = gi[b], pj[b]
        avail = ~g_matched[g] & ~p_used[q]
        ok = avail & agree[b]
        if limit is not None:
            ok &= g_rank[g] < limit
            g_rank[g[avail]] += 1
        g_matched[g[ok]] = True
        p_used[q[ok]] = True
        g_pred[g[ok]] = q[ok]


def _pair_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise IoU of pixel xyxy boxes ``a[i]`` and ``b[i]`` (both ``(n, 4)``, validated:
    positive areas). The matching needs the IoU of the flat list of same-image (object,
    prediction) pairs only; the pairwise ``iou_xyxy`` would build the ``(n, n)`` matrix."""
    iw = np.clip(np.minimum(a[:, 2], b[:, 2]) - np.maximum(a[:, 0], b[:, 0]), 0.0, None)
    ih = np.clip(np.minimum(a[:, 3], b[:, 3]) - np.maximum(a[:, 1], b[:, 1]), 0.0, None)
    inter = iw * ih
    union = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1]) + (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return np.asarray(inter / (union - inter))
