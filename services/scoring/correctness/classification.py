"""Classification correctness (IEEE Std 3129-2023 IEEE-C1..C3, IEEE-P6). Domain code: no gRPC.

Each image has ``s`` label sets (s = 1 for an ordinary classifier). The prediction for set ``i``
is judged by the plan's :class:`~fortis.services.scoring.ieee.CorrectnessRule` (IEEE-C2
Alternative 1 top-1, 2 top-K, 3 confidence > sigma); the image is correct when at least Q of
the s sets are (IEEE-C3 Alternative 1) or all of them are (Alternative 2), see
:class:`~fortis.services.scoring.correctness.common.AggregationRule`. A
:class:`~fortis.services.scoring.correctness.common.LabelMapping` (IEEE-P6) maps each dataset
label to one or more service labels; a dataset label it does not list is an error naming the
mapping's field, never a silent miss. Inputs: ranked labels ``(N, T)`` / ``(N, S, T)`` padded
with -1 (:func:`classification_correct`), full score vectors ``(N, C)`` / ``(N, S, C)``
(:func:`classification_correct_from_scores`) or recorded answers
(:func:`class_predictions_correct`).

Every function works on a whole batch with numpy, in chunks of bounded size (no per-image
Python work in the inner loops). A failed query (``error`` set on the prediction) makes that
image incorrect.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from fortis.services.common.arrays import chunk_slices
from fortis.services.common.errors import FieldViolation, InvalidArgument
from fortis.services.scoring.correctness.common import (
    AggregationRule,
    LabelMapping,
    image_name,
    is_int,
    raise_violations,
    rows_per_chunk,
)
from fortis.services.scoring.ieee import ClassPrediction, CorrectnessRule

__all__ = [
    "class_predictions_correct",
    "class_truth_array",
    "classification_correct",
    "classification_correct_from_scores",
]


def _as_truth(truth: npt.ArrayLike, n: int, s: int, field: str) -> np.ndarray:
    tr = np.asarray(truth)
    if tr.size and not np.issubdtype(tr.dtype, np.integer):
        raise InvalidArgument(field, f"labels must be integers, got dtype {tr.dtype}")
    tr = tr.astype(np.int64, copy=False)
    if tr.ndim == 1:
        tr = tr[:, None, None]
    elif tr.ndim == 2:
        tr = tr[:, :, None]
    elif tr.ndim != 3:
        raise InvalidArgument(field, "must be (N,) one label per image, (N, S) one per label set "
                                     f"or (N, S, A) acceptable labels padded with -1; got "
                                     f"shape {tr.shape}")
    if tr.shape[:2] != (n, s):
        raise InvalidArgument(field, f"shape {tr.shape} does not match the predictions' "
                                     f"(N, S) = ({n}, {s}); several acceptable labels per set "
                                     "are given as (N, S, A)")
    empty = ~(tr >= 0).any(axis=2)
    if empty.any():
        i, j = (int(x) for x in np.argwhere(empty)[0])
        raise InvalidArgument(field, f"image {i}, label set {j} has no acceptable label "
                                     f"(every set needs at least one)")
    return tr


def classification_correct(
    ranked_labels: npt.ArrayLike,
    truth: npt.ArrayLike,
    rule: CorrectnessRule,
    *,
    ranked_scores: npt.ArrayLike | None = None,
    aggregate: AggregationRule | None = None,
    failed: npt.ArrayLike | None = None,
) -> np.ndarray:
    """IEEE-C1/C2/C3 for N images at once -> (N,) bool.

    ``ranked_labels``: integer ``(N, T)`` (one label set) or ``(N, S, T)``, the service's
    labels best first, padded with -1 when fewer than T were returned. ``ranked_scores``:
    the matching confidences (same shape), needed by ``threshold`` (C2 Alternative 3; a score
    must be strictly greater than sigma). ``truth``: ``(N,)``, ``(N, S)`` or ``(N, S, A)``
    acceptable service labels padded with -1 (any of them counts; see
    :func:`class_truth_array` to build it from dataset labels and a :class:`LabelMapping`).
    ``aggregate``: IEEE-C3 over the S sets (default ``all``). ``failed``: ``(N,)`` or
    ``(N, S)`` bool, failed queries, judged incorrect. Agrees exactly with
    :func:`~fortis.services.scoring.ieee.is_correct` on every single prediction.
    """
    lab = np.asarray(ranked_labels)
    if lab.ndim == 2:
        lab = lab[:, None, :]
    if lab.ndim != 3:
        raise InvalidArgument("ranked_labels", f"must be (N, T) or (N, S, T), got shape {lab.shape}")
    if lab.size and not np.issubdtype(lab.dtype, np.integer):
        raise InvalidArgument("ranked_labels", f"labels must be integers, got dtype {lab.dtype}")
    n, s, t = lab.shape
    tr = _as_truth(truth, n, s, "truth")
    sc: np.ndarray | None = None
    if rule.mode == "threshold":
        if ranked_scores is None:
            raise InvalidArgument("correctness.mode", "threshold needs a score-returning target")
        sc = np.asarray(ranked_scores, dtype=np.float64)
        if sc.ndim == 2:
            sc = sc[:, None, :]
        if sc.shape != lab.shape:
            raise InvalidArgument("ranked_scores", f"shape {np.shape(ranked_scores)} does not "
                                                   f"match ranked_labels {np.shape(ranked_labels)}")
    width = {"top1": 1, "topk": rule.k}.get(rule.mode, t)
    width = min(width, t)
    per_set = np.zeros((n, s), dtype=bool)
    a = tr.shape[2]
    for ch in chunk_slices(n, rows_per_chunk(s * max(width, 1) * a)):
        lc = lab[ch, :, :width]
        valid = lc >= 0
        if sc is not None:
            valid &= sc[ch, :, :width] > rule.threshold
        hit = (lc[..., None] == tr[ch, :, None, :]) & valid[..., None]
        per_set[ch] = hit.any(axis=(2, 3))
    return _finish_classification(per_set, aggregate, failed)


def classification_correct_from_scores(
    scores: npt.ArrayLike,
    truth: npt.ArrayLike,
    rule: CorrectnessRule,
    *,
    aggregate: AggregationRule | None = None,
    failed: npt.ArrayLike | None = None,
) -> np.ndarray:
    """IEEE-C1/C2/C3 from full score vectors: ``scores`` ``(N, C)`` or ``(N, S, C)`` (one
    confidence per service label, index = label) -> (N,) bool. ``truth`` as in
    :func:`classification_correct`. Ranks follow a stable descending sort: equal scores rank
    the lower label first (as ``numpy.argmax`` does for top-1). Scores must be finite.
    """
    sc = np.asarray(scores, dtype=np.float64)
    if sc.ndim == 2:
        sc = sc[:, None, :]
    if sc.ndim != 3 or sc.shape[2] == 0:
        raise InvalidArgument("scores", f"must be (N, C) or (N, S, C) with C >= 1, got shape "
                                        f"{np.shape(scores)}")
    if not np.isfinite(sc).all():
        raise InvalidArgument("scores", "scores must be finite (NaN or inf found)")
    n, s, c = sc.shape
    tr = _as_truth(truth, n, s, "truth")
    if (tr >= c).any():
        raise InvalidArgument("truth", f"label {int(tr.max())} is outside the C = {c} scores "
                                       "(labels index the score vector)")
    a = tr.shape[2]
    per_set = np.zeros((n, s), dtype=bool)
    cls_idx = np.arange(c)
    for ch in chunk_slices(n, rows_per_chunk(s * a * (1 if rule.mode == "threshold" else c))):
        t = tr[ch]
        valid = t >= 0
        st = np.take_along_axis(sc[ch], np.where(valid, t, 0), axis=2)      # (n, S, A)
        if rule.mode == "threshold":
            hit = st > rule.threshold
        else:
            k = 1 if rule.mode == "top1" else rule.k
            block = sc[ch][:, :, None, :]                                    # (n, S, 1, C)
            rank = ((block > st[..., None]).sum(axis=3)
                    + ((block == st[..., None]) & (cls_idx < t[..., None])).sum(axis=3))
            hit = rank < k
        per_set[ch] = (hit & valid).any(axis=2)
    return _finish_classification(per_set, aggregate, failed)


def _finish_classification(per_set: np.ndarray, aggregate: AggregationRule | None,
                           failed: npt.ArrayLike | None) -> np.ndarray:
    n, s = per_set.shape
    if failed is not None:
        f = np.asarray(failed, dtype=bool)
        if f.shape == (n,):
            per_set &= ~f[:, None]
        elif f.shape == (n, s):
            per_set &= ~f
        else:
            raise InvalidArgument("failed", f"must be (N,) or (N, S) = ({n}, {s}), got {f.shape}")
    return (aggregate or AggregationRule()).combine(per_set)


def class_truth_array(
    labels: Sequence[Sequence[int] | Sequence[Sequence[int]] | int],
    *,
    label_mapping: LabelMapping | Sequence[LabelMapping | None] | None = None,
    image_ids: Sequence[str] | None = None,
    field: str = "labels",
) -> np.ndarray:
    """Per-image dataset labels -> the ``(N, S, A)`` truth array of service labels.

    ``labels[n]`` is an int, a sequence of acceptable labels (one label set, s = 1), or a
    sequence of s label sets each a sequence of acceptable labels (IEEE-C3). Every image
    must have the same s. ``label_mapping`` (IEEE-P6) is one mapping for every set or one per
    set (``None`` = identity); one-to-many entries widen the acceptable labels.
    """
    sets_per_image: list[list[tuple[int, ...]]] = []
    s_common: int | None = None
    violations: list[FieldViolation] = []
    for n, lab in enumerate(labels):
        where = f"{field}[{image_name(image_ids, n)}]"
        sets = _label_sets(lab)
        if sets is None:
            violations.append(FieldViolation(where, "must be a label, a list of acceptable labels "
                                                    "or a list of label sets, all integers"))
            continue
        if any(not st for st in sets) or not sets:
            violations.append(FieldViolation(where, "every label set needs at least one label"))
            continue
        if s_common is None:
            s_common = len(sets)
        elif len(sets) != s_common:
            violations.append(FieldViolation(where, f"has {len(sets)} label sets, the images "
                                                    f"before it have {s_common}"))
            continue
        sets_per_image.append(sets)
    raise_violations(violations)
    s = s_common or 1
    maps: list[LabelMapping | None]
    if label_mapping is None or isinstance(label_mapping, LabelMapping):
        maps = [label_mapping] * s
    else:
        maps = list(label_mapping)
        if len(maps) != s:
            raise InvalidArgument("label_mapping", f"{len(maps)} mappings for {s} label sets")
    mapped: list[list[tuple[int, ...]]] = []
    for n, sets in enumerate(sets_per_image):
        row = []
        for j, st in enumerate(sets):
            mp = maps[j]
            if mp is None:
                row.append(st)
            else:
                where = f"{field}[{image_name(image_ids, n)}]" + (f"[{j}]" if s > 1 else "")
                row.append(tuple(dict.fromkeys(x for lab in st
                                               for x in mp.map_label(lab, where=where))))
        mapped.append(row)
    a = max((len(st) for row in mapped for st in row), default=1)
    out = np.full((len(mapped), s, a), -1, dtype=np.int64)
    for n, row in enumerate(mapped):
        for j, st in enumerate(row):
            out[n, j, : len(st)] = st
    return out


def _label_sets(lab: Any) -> list[tuple[int, ...]] | None:
    if is_int(lab):
        return [(int(lab),)] if lab >= 0 else None
    if isinstance(lab, np.ndarray):
        lab = lab.tolist()
    if not isinstance(lab, Sequence) or isinstance(lab, str):
        return None
    if all(is_int(x) for x in lab):
        return [tuple(int(x) for x in lab)] if all(x >= 0 for x in lab) else None
    sets: list[tuple[int, ...]] = []
    for st in lab:
        if isinstance(st, np.ndarray):
            st = st.tolist()
        if is_int(st):
            st = [st]
        if not isinstance(st, Sequence) or isinstance(st, str) \
                or not all(is_int(x) and x >= 0 for x in st):
            return None
        sets.append(tuple(int(x) for x in st))
    return sets


def class_predictions_correct(
    predictions: Sequence[ClassPrediction | Sequence[ClassPrediction]],
    truth: npt.ArrayLike,
    rule: CorrectnessRule,
    *,
    aggregate: AggregationRule | None = None,
    image_ids: Sequence[str] | None = None,
    field: str = "predictions",
) -> np.ndarray:
    """IEEE-C1/C2/C3 on recorded answers -> (N,) bool.

    ``predictions[n]`` is a :class:`ClassPrediction` (one label set) or a sequence of s of them
    (one per label set, IEEE-C3); ``truth`` is the ``(N, S, A)`` array of
    :func:`class_truth_array`. A prediction with ``error`` is incorrect. The answers are
    padded into arrays once, then judged by :func:`classification_correct`.
    """
    tr = np.asarray(truth)
    n = len(predictions)
    if tr.ndim != 3 or tr.shape[0] != n:
        raise InvalidArgument("truth", f"must be (N, S, A) with N = {n}, got shape {tr.shape}")
    s = tr.shape[1]
    need_scores = rule.mode == "threshold"
    sets_list: list[Sequence[ClassPrediction]] = []
    for i, p in enumerate(predictions):
        sets = (p,) if isinstance(p, ClassPrediction) else p
        if len(sets) != s or not all(isinstance(x, ClassPrediction) for x in sets):
            raise InvalidArgument(f"{field}[{image_name(image_ids, i)}]",
                                  f"needs {s} ClassPrediction(s), one per label set")
        sets_list.append(sets)
    flat = [x for sets in sets_list for x in sets]
    if need_scores:
        width = max((len(x.labels) for x in flat), default=0)
    else:
        width = 1 if rule.mode == "top1" else rule.k
    width = max(width, 1)
    pad_l = (-1,) * width
    pad_s = (math.nan,) * width
    lab_rows: list[int] = []
    score_rows: list[float] = []
    failed = np.zeros(len(flat), dtype=bool)
    for r, x in enumerate(flat):
        if x.error is not None:
            failed[r] = True
            lab_rows.extend(pad_l)
            if need_scores:
                score_rows.extend(pad_s)
            continue
        if x.scores is not None and len(x.scores) != len(x.labels):
            raise InvalidArgument(f"{field}[{image_name(image_ids, r // s)}].scores",
                                  f"{len(x.scores)} scores for {len(x.labels)} labels")
        lb = x.labels[:width]
        lab_rows.extend(lb)
        lab_rows.extend(pad_l[: width - len(lb)])
        if need_scores:
            if x.scores is None:
                raise InvalidArgument("correctness.mode", "threshold needs a score-returning "
                                      f"target ({field}[{image_name(image_ids, r // s)}] has "
                                      "no scores)")
            sc = x.scores[:width]
            score_rows.extend(sc)
            score_rows.extend(pad_s[: width - len(sc)])
    labels_arr = np.array(lab_rows, dtype=np.int64).reshape(n, s, width)
    scores_arr = np.array(score_rows, dtype=np.float64).reshape(n, s, width) if need_scores \
        else None
    return classification_correct(labels_arr, tr, rule, ranked_scores=scores_arr,
                                  aggregate=aggregate, failed=failed.reshape(n, s))
