"""The IEEE-C4 object matching and the IEEE-C5 per-class IoU, defined once for every service
that judges answers (the scoring service's verdicts, the perturbation service's attack
criteria). Pure numpy.

IEEE-C4 (:func:`match_batch`): the objects of each image are matched to the boxes of its
answer by IoU, with the class agreeing. A box is a candidate for an object when IoU >
``iou_threshold`` and, with a ``score_threshold``, its score is >= it (a box below it takes no
part at all). Matching is greedy and one-to-one, as in COCO's evaluation but ordered by IoU
(IoU replaces confidence in IEEE-C4): all candidate (object, box) pairs of an image are
visited by decreasing IoU (ties: higher score, then lower box index, then lower object
index). A pair whose object is already matched, or whose box is already taken, is skipped.
Otherwise the box is the object's next-ranked available box: if it has one of the object's
classes and its rank is within the rank limit (1 for top1, k for topk, unlimited for
threshold), the two are matched and the box is taken; a box of another class is not taken
(it may still match another object of its own class) but uses up one of the object's ranks.

The matching runs over every image of a batch at once: all (object, box) pairs of a chunk of
images are built flat, sorted once and resolved in lockstep (one step per pair rank, every
image advancing together), so N images cost a handful of numpy calls, not N. One image is a
batch of one.

IEEE-C5: :func:`iou_per_class` gives the per-image IoU of each class of interest between label
maps (NaN where a class is absent from both), :func:`mean_iou` their mean over the classes
present (NaN: none), and :func:`miou_correct` the verdict (mIoU strictly above the
threshold; ``all_absent_correct`` decides a NaN).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from fortis.core.boxes import pair_iou

__all__ = ["MATCH_MODES", "BatchMatch", "class_slots", "iou_per_class", "match_batch",
           "mean_iou", "miou_correct", "rank_limit"]

#: The IEEE-C4 matching modes (IEEE-C2's alternatives with IoU in place of confidence).
MATCH_MODES = ("top1", "topk", "threshold")

#: (object, box) pairs per matching chunk (bounds memory on large batches).
_PAIR_CHUNK = 1 << 21


def rank_limit(mode: str, k: int) -> int | None:
    """How many of an object's ranked candidate boxes may match it (None: unlimited)."""
    return {"top1": 1, "topk": int(k)}.get(mode)


@dataclass(frozen=True, eq=False)
class BatchMatch:
    """The outcome of :func:`match_batch`: ``found`` (G,) per object; ``matched`` (G,) the
    row of the box matched to it (-1: none); ``kept`` (P,) the boxes that took part (the
    ``keep`` mask and the score threshold)."""

    found: np.ndarray
    matched: np.ndarray
    kept: np.ndarray


def match_batch(object_boxes: npt.ArrayLike, object_labels: npt.ArrayLike,
                object_counts: npt.ArrayLike, boxes: npt.ArrayLike, labels: npt.ArrayLike,
                scores: npt.ArrayLike | None, counts: npt.ArrayLike, *, iou_threshold: float,
                rank_limit: int | None = None, score_threshold: float | None = None,
                keep: npt.ArrayLike | None = None) -> BatchMatch:
    """IEEE-C4 matching of N images at once (module docstring).

    Objects: ``object_boxes`` (G, 4) pixel xyxy, ``object_labels`` (G,) or (G, A) the
    acceptable classes of each object (-1 padded; a box's label must then be >= 0), image n
    owning ``object_counts[n]`` consecutive rows. Answers: ``boxes`` (P, 4) pixel xyxy,
    ``labels`` (P,), ``scores`` (P,) or None (NaN or None: no score, ranked last among
    ties), image n owning ``counts[n]`` consecutive rows. ``rank_limit``: 1 (top1), k (topk)
    or None (threshold); ``score_threshold``: a box scoring below it (or without a score)
    takes no part; ``keep`` (P,): the boxes allowed to take part at all (e.g. not those of a
    failed query)."""
    g_boxes = np.asarray(object_boxes, dtype=np.float64).reshape(-1, 4)
    acc = np.asarray(object_labels)
    acc = acc.reshape(-1, 1) if acc.ndim == 1 else acc
    gc = np.asarray(object_counts, dtype=np.int64).reshape(-1)
    p_boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    p_lab = np.asarray(labels).reshape(-1)
    cnt = np.asarray(counts, dtype=np.int64).reshape(-1)
    n = len(gc)
    n_p = len(p_boxes)
    sc = np.zeros(n_p) if scores is None else np.asarray(scores, dtype=np.float64).reshape(-1)
    sc = np.where(np.isnan(sc), -np.inf, sc)
    kept = np.ones(n_p, bool) if keep is None else np.asarray(keep, dtype=bool).reshape(-1).copy()
    if score_threshold is not None:
        kept &= sc >= score_threshold
    img_p = np.repeat(np.arange(n), cnt)
    kept_rows = np.flatnonzero(kept)
    pc = np.bincount(img_p[kept_rows], minlength=n).astype(np.int64)
    p_off = np.concatenate([[0], np.cumsum(pc)]).astype(np.int64)
    k_boxes = p_boxes[kept_rows]
    k_lab = p_lab[kept_rows]
    k_score = sc[kept_rows]

    g_off = np.concatenate([[0], np.cumsum(gc)]).astype(np.int64)
    n_g = int(g_off[-1])
    img_g = np.repeat(np.arange(n), gc)
    found = np.zeros(n_g, bool)
    g_rank = np.zeros(n_g, np.int64)
    g_pred = np.full(n_g, -1, np.int64)
    p_used = np.zeros(len(kept_rows), bool)

    cum = np.cumsum(gc * pc)
    start_img = 0
    while start_img < n:
        base = cum[start_img - 1] if start_img else 0
        end_img = int(np.searchsorted(cum, base + _PAIR_CHUNK, side="right"))
        end_img = max(end_img, start_img + 1)
        g_lo, g_hi = int(g_off[start_img]), int(g_off[end_img])
        if g_hi > g_lo and p_off[end_img] > p_off[start_img]:
            _match_chunk(np.arange(g_lo, g_hi), img_g, g_boxes, acc, pc, p_off, k_boxes,
                         k_lab, k_score, float(iou_threshold), rank_limit, found, g_rank,
                         g_pred, p_used)
        start_img = end_img
    matched = np.full(n_g, -1, np.int64)
    matched[g_pred >= 0] = kept_rows[g_pred[g_pred >= 0]]
    return BatchMatch(found, matched, kept)


def _match_chunk(g_rows: np.ndarray, img_g: np.ndarray, g_boxes: np.ndarray, acc: np.ndarray,
                 pc: np.ndarray, p_off: np.ndarray, k_boxes: np.ndarray, k_lab: np.ndarray,
                 k_score: np.ndarray, iou_thr: float, limit: int | None, found: np.ndarray,
                 g_rank: np.ndarray, g_pred: np.ndarray, p_used: np.ndarray) -> None:
    # every (object, box) pair of the same image, flat
    per_g = pc[img_g[g_rows]]
    total = int(per_g.sum())
    if total == 0:
        return
    gi = np.repeat(g_rows, per_g)
    first = np.repeat(np.cumsum(per_g) - per_g, per_g)
    pj = np.repeat(p_off[img_g[g_rows]], per_g) + (np.arange(total) - first)
    iou = pair_iou(g_boxes[gi], k_boxes[pj])
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
        avail = ~found[g] & ~p_used[q]
        ok = avail & agree[b]
        if limit is not None:
            ok &= g_rank[g] < limit
            g_rank[g[avail]] += 1
        found[g[ok]] = True
        p_used[q[ok]] = True
        g_pred[g[ok]] = q[ok]


# -- IEEE-C5 ------------------------------------------------------------------------------------

def class_slots(x: np.ndarray, classes_sorted: np.ndarray) -> np.ndarray:
    """Label map -> slot of each pixel's class among the classes of interest (Y: any other).
    A lookup table when the labels are small non-negative integers (one gather per pixel),
    else a binary search."""
    y = len(classes_sorted)
    dtype = np.uint8 if y < 250 else np.int64       # slots 0..Y+1 (see iou_per_class)
    if x.size == 0:
        return np.zeros(x.shape, dtype)
    lo, hi = int(x.min()), int(x.max())
    if lo >= 0 and hi < (1 << 16):
        lut = np.full(hi + 1, y, dtype=dtype)
        inside = classes_sorted[classes_sorted <= hi]
        lut[inside] = np.searchsorted(classes_sorted, inside)
        return np.asarray(lut[x])
    pos = np.minimum(np.searchsorted(classes_sorted, x), y - 1)
    return np.where(classes_sorted[pos] == x, pos, y).astype(dtype)


def iou_per_class(pred: np.ndarray, truth: np.ndarray, cs: np.ndarray,
                  ignore: int | None) -> np.ndarray:
    """(n, H, W) label maps -> (n, Y) IoU per class of interest (NaN: absent from both).

    Each pixel gets a slot: its class's index among the Y classes, Y for "any other label",
    Y + 1 for "ignored". Few classes: one bincount of (image, truth slot, prediction slot)
    gives per-image confusion matrices. Many classes: three bincounts (truth count,
    prediction count, intersection), O(pixels + n * Y). No loop over classes or images."""
    n = len(pred)
    y = len(cs)
    w = y + 2
    t = truth.reshape(n, -1)
    gi = class_slots(t, cs)
    pi = class_slots(pred.reshape(n, -1), cs)
    if ignore is not None and t.size and int(t.min()) <= ignore <= int(t.max()):
        skip = t == ignore
        gi[skip] = y + 1
        pi[skip] = y + 1
    if w * w <= 256:
        code = gi.astype(np.uint16)
        code *= w
        code += pi
        flat = np.add(code, (np.arange(n, dtype=np.int64) * (w * w))[:, None], dtype=np.int64)
        conf = np.bincount(flat.ravel(), minlength=n * w * w).reshape(n, w, w)
        inter = np.diagonal(conf, axis1=1, axis2=2)[:, :y].astype(np.float64)
        gt_count = conf[:, :y, :].sum(axis=2)
        pred_count = conf[:, :, :y].sum(axis=1)
    else:
        base = (np.arange(n, dtype=np.int64) * w)[:, None]
        code_g = np.add(gi, base, dtype=np.int64).ravel()
        code_p = np.add(pi, base, dtype=np.int64).ravel()
        size = n * w
        gt_count = np.bincount(code_g, minlength=size).reshape(n, w)[:, :y]
        pred_count = np.bincount(code_p, minlength=size).reshape(n, w)[:, :y]
        same = (gi == pi).ravel()
        inter = np.bincount(code_g[same], minlength=size).reshape(n, w)[:, :y].astype(np.float64)
    union = gt_count + pred_count - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / np.maximum(union, 1), np.nan)


def mean_iou(iou: np.ndarray) -> np.ndarray:
    """(n, Y) per-class IoU (NaN: class absent from both) -> (n,) mean over the classes
    present; NaN when none is (IEEE-C5)."""
    present = ~np.isnan(iou)
    count = present.sum(axis=1)
    total = np.where(present, iou, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(np.where(count > 0, total / np.maximum(count, 1), np.nan))


def miou_correct(miou: np.ndarray, threshold: float, all_absent_correct: bool) -> np.ndarray:
    """IEEE-C5 verdicts: mIoU strictly above ``threshold``; an undefined (NaN) mIoU is
    ``all_absent_correct``."""
    m = np.asarray(miou, dtype=np.float64)
    return np.asarray(np.where(np.isnan(m), all_absent_correct, m > threshold), dtype=bool)
