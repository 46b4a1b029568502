"""Shared pieces of the ranking metrics (RANK-1..RANK-3): input checks, the position of a class
in a score row under the tie rule, :func:`rank_of_class` (also used by the DEG-2 rank profile),
:func:`prediction_arrays` and the per-image "not applicable" reasons. Domain code: no gRPC.

Ranking and ties: classes are ranked by descending score; equal scores are ordered by class
index (lower index first), i.e. a stable sort; NaN (a class the target did not return) ranks
after every returned class. Rows are processed in blocks of at most ``_BLOCK_ELEMENTS`` values
so memory stays bounded for large M x C.

These names are internal to ``fortis.services.scoring.ranking`` (which re-exports the public
ones).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from fortis.services.common.arrays import chunk_slices
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.ieee import ClassPrediction

__all__ = [
    "NO_SCORES",
    "OK_CODE",
    "REASONS",
    "as_classes",
    "as_column",
    "as_gamma",
    "as_matrix",
    "as_pos_int",
    "block_rows",
    "float_or_none",
    "positions_in_rows",
    "prediction_arrays",
    "rank_of_class",
]

#: Bound on the elements of one (rows x C) working block.
_BLOCK_ELEMENTS = 2_000_000
#: Positions of K classes in rows of C are found by counting comparisons (O(K*C)) while
#: K * C is at most this, otherwise by sorting each row and binary search (O(C log C)).
#: All strategies give the same positions.
_COMPARE_MAX_WORK = 4096
#: Beyond this many classes per row, a stable argsort of the whole row is cheaper than K binary
#: searches.
_SEARCH_MAX_K = 32

NO_SCORES = "the target returns no scores (labels only): the metric needs score vectors (RANK-3)"

# Per-image reason codes -> text.
OK_CODE = 0
REASONS = {
    1: "benign scores incomplete (a class was not returned): the rescaling over all classes "
       "needs every class's benign output (RANK-1)",
    2: "benign probabilities contain 0 and no benign_logits were given: the pre-softmax "
       "outputs cannot be recovered (RANK-1)",
    3: "all benign pre-softmax outputs are equal: the rescaling to [0, 1] is undefined",
    4: "no benign class has probability >= gamma_b (k1 = 0): the benign relevance is all zero",
    5: "the target returned no scores for this image (RANK-3)",
    6: "the benign class was not returned and fewer than k classes were: its rank is unknown",
}


def as_matrix(x: Any, field: str, *, probs: bool, ndim: int = 2) -> np.ndarray:
    """``x`` as a float64 array of ``ndim`` dimensions; NaN allowed (= not returned)."""
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(field, f"must be a numeric array: {exc}") from None
    if a.ndim != ndim:
        shape = "(M, C)" if ndim == 2 else "(C,)"
        raise InvalidArgument(field, f"must have shape {shape}; got shape {a.shape}")
    if a.shape[-1] < 1 or (ndim == 2 and a.shape[0] < 1):
        raise InvalidArgument(field, f"must not be empty; got shape {a.shape}")
    if np.isinf(a).any():
        raise InvalidArgument(field, "must not contain infinite values (NaN = not returned)")
    if probs:
        with np.errstate(invalid="ignore"):
            bad = (a < 0.0) | (a > 1.0)
        if bad.any():
            raise InvalidArgument(field, "probabilities must lie in [0, 1] (NaN = not returned)")
    return a


def as_gamma(value: Any, field: str) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or not 0.0 <= value <= 1.0):
        raise InvalidArgument(field, f"must be a threshold in [0, 1]; got {value!r}")
    return float(value)


def as_pos_int(value: Any, field: str, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise InvalidArgument(field, f"must be an integer >= 1; got {value!r}")
    return int(value)


def as_classes(x: Any, field: str, m: int, c: int) -> np.ndarray:
    try:
        a = np.asarray(x)
    except (TypeError, ValueError) as exc:  # pragma: no cover - numpy accepts nearly anything
        raise InvalidArgument(field, f"must be an integer array: {exc}") from None
    if a.ndim != 1 or a.shape[0] != m:
        raise InvalidArgument(field, f"must have shape ({m},); got shape {a.shape}")
    if a.dtype.kind not in "iu":
        if a.dtype.kind == "f" and np.all(np.isfinite(a)) and np.all(a == np.round(a)):
            a = a.astype(np.int64)
        else:
            raise InvalidArgument(field, f"must hold integer class indices; got dtype {a.dtype}")
    a = a.astype(np.int64)
    if ((a < 0) | (a >= c)).any():
        raise InvalidArgument(field, f"class indices must lie in [0, {c - 1}]")
    return a


def block_rows(c: int) -> int:
    return max(1, _BLOCK_ELEMENTS // max(c, 1))


def float_or_none(x: float) -> float | None:
    """Python float, or None for NaN."""
    return None if math.isnan(x) else float(x)


def as_column(a: np.ndarray) -> list[Any]:
    """A 1-D or 2-D float array as (nested) lists with NaN -> None."""
    if a.ndim == 1:
        return [float_or_none(v) for v in a.tolist()]
    return [[float_or_none(v) for v in row] for row in a.tolist()]


def positions_in_rows(values: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """0-based position of ``classes[i, j]`` in row i of ``values`` sorted descending, ties by
    class index (= the position in a stable descending sort); NaN (not returned) sorts last, and
    a class whose own value is NaN gets the number of returned classes. ``values`` (m, C),
    ``classes`` (m, K) valid indices.

    Position = #(returned values > v) + #(values == v with a lower class index). Computed by
    counting comparisons when K * C is small; for moderate K from a (fast, unstable) sort of
    each row and binary search, with ties resolved by direct comparison for the few tied
    entries; for large K as the inverse of a stable descending argsort. All three are exact and
    give identical results."""
    m, c = values.shape
    k = classes.shape[1]
    out = np.empty((m, k), dtype=np.int64)
    if k == 0 or m == 0:
        return out
    cols = np.arange(c)
    q_all = np.take_along_axis(values, classes, axis=1)
    n_ret = (~np.isnan(values)).sum(axis=1)
    if k * c <= _COMPARE_MAX_WORK:
        step = max(1, _BLOCK_ELEMENTS // (c * k))
        for sl in chunk_slices(m, step):
            s, e = sl.start, sl.stop
            blk, cb, v = values[s:e][:, None, :], classes[s:e], q_all[s:e][:, :, None]
            greater = (blk > v).sum(axis=2)
            ties_before = ((blk == v) & (cols[None, None, :] < cb[:, :, None])).sum(axis=2)
            out[s:e] = greater + ties_before
    elif k > _SEARCH_MAX_K:
        step = block_rows(c)
        for sl in chunk_slices(m, step):
            s, e = sl.start, sl.stop
            order = np.argsort(-values[s:e], axis=1, kind="stable")  # NaN last
            inv = np.empty_like(order)
            np.put_along_axis(inv, order, np.broadcast_to(cols, order.shape), axis=1)
            out[s:e] = np.take_along_axis(inv, classes[s:e], axis=1)
    else:
        tied = np.zeros((m, k), dtype=bool)
        step = block_rows(c)
        for sl in chunk_slices(m, step):
            s, e = sl.start, sl.stop
            srt = np.sort(values[s:e], axis=1)  # ascending, NaN last
            for i in range(e - s):
                right = np.searchsorted(srt[i], q_all[s + i], side="right")
                left = np.searchsorted(srt[i], q_all[s + i], side="left")
                out[s + i] = n_ret[s + i] - right
                tied[s + i] = right - left > 1
        r_idx, k_idx = np.nonzero(tied & ~np.isnan(q_all))
        for sl in chunk_slices(r_idx.size, step):
            ri, ki = r_idx[sl], k_idx[sl]
            same = values[ri] == q_all[ri, ki][:, None]
            out[ri, ki] += (same & (cols[None, :] < classes[ri, ki][:, None])).sum(axis=1)
    return np.where(np.isnan(q_all), n_ret[:, None], out)


def rank_of_class(scores: Any, classes: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """0-based rank of ``classes[i]`` in row i of ``scores`` ((M, C), NaN = not returned).

    Rank = number of returned classes with a higher score + number with an equal score and a
    lower class index (stable sort, ties by class index). Returns ``(rank, found, n_returned)``;
    where the class was not returned (``found`` False) ``rank`` is ``n_returned``, a lower bound
    (the class ranks after every returned class). Used by DRR (RANK-2, which adds 1 for the
    seed's 1-based rank) and the rank degradation profile (DEG-2, 0 = top).
    """
    p = as_matrix(scores, "scores", probs=False)
    m, c = p.shape
    cls = as_classes(classes, "classes", m, c)
    n_ret = (~np.isnan(p)).sum(axis=1)
    found = ~np.isnan(p[np.arange(m), cls])
    rank = positions_in_rows(p, cls[:, None])[:, 0]
    return np.where(found, rank, n_ret), found, n_ret


def prediction_arrays(predictions: Sequence[ClassPrediction],
                      num_classes: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Arrays for M recorded answers of a classification target.

    Returns ``(labels, scores)``: ``labels`` is ``(M, K)`` int64, each row the returned labels
    best first, padded with -1 (K = the longest answer); ``scores`` is ``(M, num_classes)``
    float64 with each returned label's score in its class's column and NaN elsewhere, or
    ``None`` when no answer carries scores (a labels-only target: RANK-3 metrics are then not
    applicable, never 0). A failed query (``error`` set) gives an all -1 / all NaN row.
    """
    c = as_pos_int(num_classes, "num_classes")
    assert c is not None
    m = len(predictions)
    if m == 0:
        raise InvalidArgument("predictions", "at least one prediction is needed")
    for i, p in enumerate(predictions):
        if not isinstance(p, ClassPrediction):
            raise InvalidArgument(f"predictions[{i}]", "must be a ClassPrediction")
    k = max((len(p.labels) for p in predictions if p.error is None), default=0)
    labels = np.full((m, max(k, 1)), -1, dtype=np.int64)
    any_scores = any(p.scores is not None and p.error is None for p in predictions)
    scores = np.full((m, c), np.nan) if any_scores else None
    for i, p in enumerate(predictions):
        if p.error is not None:
            continue
        row = [int(x) for x in p.labels]
        if any(x < 0 or x >= c for x in row):
            raise InvalidArgument(f"predictions[{i}].labels", f"labels must lie in [0, {c - 1}]")
        if len(set(row)) != len(row):
            raise InvalidArgument(f"predictions[{i}].labels", "a label is returned twice")
        labels[i, :len(row)] = row
        if p.scores is not None and scores is not None:
            if len(p.scores) != len(row):
                raise InvalidArgument(f"predictions[{i}].scores",
                                      f"{len(p.scores)} scores for {len(row)} labels")
            scores[i, row] = np.asarray(p.scores, dtype=np.float64)
    return labels, scores
