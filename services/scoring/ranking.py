"""Ranking metrics of Brama, Dery and Grinshpoun, "Evaluation of Neural Networks defenses and
attacks using NDCG and reciprocal rank metrics" (seed 002): NDCG per rank position (RANK-1) and
the defense reciprocal rank DRR_k (RANK-2), with "not applicable" for targets that return no
scores (RANK-3).

Pure domain code (no gRPC), vectorised with numpy over M images (rows processed in blocks so
that memory stays bounded for large M x C). Results are plain JSON-able dicts.

Score matrices
--------------
Every score input is an ``(M, C)`` float array indexed by *class* (column j = class j), one row
per image; the single-image functions take a length-C vector. A class the target did not return
(a top-k target) is ``NaN``; the target is assumed to return its *best* classes, so every
missing class scores at most the smallest returned one. :func:`prediction_arrays` builds such
matrices from :class:`~fortis.services.scoring.ieee.ClassPrediction` lists. A labels-only target
has no score matrix at all: pass ``None`` and the metric is reported as not applicable (RANK-3),
never as 0.

Ranking and ties. Classes are ranked by descending probability; equal probabilities are ordered
by class index (lower index first), i.e. a stable sort. The same rule gives the rank of a class
(:func:`rank_of_class`) and the order of the NDCG lists.

NDCG (RANK-1; seed section IV, eqs. (3)-(6), Table I)
------------------------------------------------------
* Benign relevance: the benign pre-softmax outputs ``l`` are rescaled to [0, 1] over *all* C
  classes, ``(l - min l) / (max l - min l)``; the k1 classes of highest benign post-softmax
  probability with probability >= gamma_b keep their rescaled value, normalised to sum to 1;
  every other class has relevance 0 (eq. (3); the seed's toy-poodle example: logits 20.328,
  19.829, ..., -6.023 -> 1, 0.98 -> relevances 0.505, 0.495).
* Perturbed list: ranked by the perturbed probabilities; the top k2 classes with probability
  >= gamma_a carry the benign relevance of the same class, positions after k2 carry 0 (eq. (4)).
* DCG@i = sum_{j<=i} (2^{R_j} - 1) / log2(1 + j) (eq. (5); base 2, which Table I's numbers
  confirm: 0.419 = 2^0.505 - 1). NDCG@i = DCG@i(perturbed) / DCG@i(benign), reported for
  i = 1..``positions`` (Table I lists @1..@12, the seed's Fig. 2 @1..@10; default 10) and as
  NDCG@1, the value the seed's experiments use. ``ndcg_k2`` is eq. (6): DCG over the whole
  perturbed list (k2 positions) over DCG of the whole benign list (k1 positions).
* k1 and k2 have no fixed default in the seed: they are set per image by the thresholds
  (k1 = number of benign classes with p >= gamma_b, k2 = number of perturbed classes with
  p >= gamma_a; Table I: k1 = 2, k2 = 613 for the CW example). ``max_k1`` / ``max_k2`` optionally
  cap them (default: no cap, as in the seed). Defaults gamma_b = 0.01, gamma_a = 0.001.
* Only the benign *pre-softmax* outputs need the full vector (the rescaling uses the minimum over
  all classes). Without ``benign_logits``, log(benign_probs) is used: the rescaling is invariant
  under l -> a*l + b (a > 0), and log softmax(l / T) = l / T - const, so this is *exact* for any
  softmax (with any temperature) -- provided every benign probability is present and > 0.
  A benign row with a missing or zero probability (top-k target, underflow) and no logits is
  not applicable for that image, with the reason.
* Perturbed rows may be top-k: NDCG@i is exact for i <= number of returned classes, and for all
  i when the smallest returned probability is already < gamma_a (every missing class is then
  past k2 and carries relevance 0); otherwise the positions past the returned list are ``None``.
* ``benign_probs`` should be the softmax of ``benign_logits`` (derived from them when omitted);
  the benign list, in its own order, is the ideal list the seed normalises by.

DRR (RANK-2; seed section V, eq. (7))
--------------------------------------
DRR_k = P / (R + 1) + 1 / (R + 1) where R is the 1-based rank of the benign class in the
perturbed ranking and P its perturbed probability, when R <= k; 0 otherwise. The seed's worked
example fixes the convention: 'toy poodle' at rank 2 with p = 0.428 gives 0.428/3 + 1/3 = 0.476,
and DRR_k then lies in [1/(R+1), 1/R] for p <= 1/R. Eq. (7) prints the condition as "i < k", but
its text ("only if the true category is predicted within the top-k predictions") and DRR_5 as a
top-5 analogue mean R <= k, which is what is implemented. Default k = 5. The benign class is the
class the model predicts for the benign input (the seed keeps only correctly classified images,
so it is also the true label). A top-k' target: if the benign class was returned, DRR is exact;
if it was not and k' >= k, its rank is > k' >= k and DRR = 0 exactly; if k' < k it is not
applicable for that image.

Result trees
------------
Batch functions return ``{metric, definition, applicable, reason, params, m, m_applicable,
mean, per_image}``; ``per_image`` holds one list per quantity (columnar, index = image),
``None`` for an image where the value is not applicable and ``per_image.reason[i]`` says why.
Means are taken over the applicable images (per position over the images where that position is
known); with none, the mean is ``None`` and ``reason`` is set -- never 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.ieee import ClassPrediction

__all__ = [
    "DRR_K",
    "GAMMA_A",
    "GAMMA_B",
    "NDCG_POSITIONS",
    "drr",
    "drr_batch",
    "ndcg",
    "ndcg_batch",
    "prediction_arrays",
    "rank_of_class",
]

#: Seed 002 defaults (RANK-1, RANK-2).
GAMMA_B = 0.01
GAMMA_A = 0.001
DRR_K = 5
#: Rank positions reported by default (the seed's Fig. 2 plots @1..@10; Table I lists @1..@12).
NDCG_POSITIONS = 10

#: Bound on the elements of one (rows x C) working block.
_BLOCK_ELEMENTS = 2_000_000
#: Positions of K classes in rows of C are found by counting comparisons (O(K*C)) while
#: K * C is at most this, otherwise by sorting each row and binary search (O(C log C)).
#: All strategies give the same positions.
_COMPARE_MAX_WORK = 4096
#: Beyond this many classes per row, a stable argsort of the whole row is cheaper than K binary
#: searches.
_SEARCH_MAX_K = 32

NDCG_DEFINITION = (
    "NDCG@i = DCG@i(perturbed)/DCG@i(benign), DCG@i = sum_{j<=i} (2^R_j - 1)/log2(1+j); benign "
    "relevance = benign pre-softmax outputs rescaled to [0,1], kept for the top k1 classes with "
    "p >= gamma_b and normalised to sum 1; perturbed top k2 classes with p >= gamma_a carry the "
    "benign relevance of the same class (Brama et al., eqs. (3)-(6); RANK-1)")
DRR_DEFINITION = (
    "DRR_k = P/(R+1) + 1/(R+1) if the benign class's 1-based rank R in the perturbed output is "
    "<= k, else 0; P = its perturbed probability (Brama et al., eq. (7); RANK-2)")

NO_SCORES = "the target returns no scores (labels only): the metric needs score vectors (RANK-3)"

# Per-image reason codes -> text.
_OK = 0
_REASONS = {
    1: "benign scores incomplete (a class was not returned): the rescaling over all classes "
       "needs every class's benign output (RANK-1)",
    2: "benign probabilities contain 0 and no benign_logits were given: the pre-softmax "
       "outputs cannot be recovered (RANK-1)",
    3: "all benign pre-softmax outputs are equal: the rescaling to [0, 1] is undefined",
    4: "no benign class has probability >= gamma_b (k1 = 0): the benign relevance is all zero",
    5: "the target returned no scores for this image (RANK-3)",
    6: "the benign class was not returned and fewer than k classes were: its rank is unknown",
}


# --------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------


def _matrix(x: Any, field: str, *, probs: bool, ndim: int = 2) -> np.ndarray:
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


def _gamma(value: Any, field: str) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or not 0.0 <= value <= 1.0):
        raise InvalidArgument(field, f"must be a threshold in [0, 1]; got {value!r}")
    return float(value)


def _pos_int(value: Any, field: str, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise InvalidArgument(field, f"must be an integer >= 1; got {value!r}")
    return int(value)


def _classes(x: Any, field: str, m: int, c: int) -> np.ndarray:
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


def _block_rows(c: int) -> int:
    return max(1, _BLOCK_ELEMENTS // max(c, 1))


def _f(x: float) -> float | None:
    """Python float, or None for NaN."""
    return None if math.isnan(x) else float(x)


def _col(a: np.ndarray) -> list[Any]:
    """A 1-D or 2-D float array as (nested) lists with NaN -> None."""
    if a.ndim == 1:
        return [_f(v) for v in a.tolist()]
    return [[_f(v) for v in row] for row in a.tolist()]


# --------------------------------------------------------------------------------------------
# Ranks and prediction arrays
# --------------------------------------------------------------------------------------------


def _positions(values: np.ndarray, classes: np.ndarray) -> np.ndarray:
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
        for s in range(0, m, step):
            e = min(m, s + step)
            blk, cb, v = values[s:e][:, None, :], classes[s:e], q_all[s:e][:, :, None]
            greater = (blk > v).sum(axis=2)
            ties_before = ((blk == v) & (cols[None, None, :] < cb[:, :, None])).sum(axis=2)
            out[s:e] = greater + ties_before
    elif k > _SEARCH_MAX_K:
        step = _block_rows(c)
        for s in range(0, m, step):
            e = min(m, s + step)
            order = np.argsort(-values[s:e], axis=1, kind="stable")  # NaN last
            inv = np.empty_like(order)
            np.put_along_axis(inv, order, np.broadcast_to(cols, order.shape), axis=1)
            out[s:e] = np.take_along_axis(inv, classes[s:e], axis=1)
    else:
        tied = np.zeros((m, k), dtype=bool)
        step = _block_rows(c)
        for s in range(0, m, step):
            e = min(m, s + step)
            srt = np.sort(values[s:e], axis=1)  # ascending, NaN last
            for i in range(e - s):
                right = np.searchsorted(srt[i], q_all[s + i], side="right")
                left = np.searchsorted(srt[i], q_all[s + i], side="left")
                out[s + i] = n_ret[s + i] - right
                tied[s + i] = right - left > 1
        r_idx, k_idx = np.nonzero(tied & ~np.isnan(q_all))
        for s in range(0, r_idx.size, step):
            ri, ki = r_idx[s:s + step], k_idx[s:s + step]
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
    p = _matrix(scores, "scores", probs=False)
    m, c = p.shape
    cls = _classes(classes, "classes", m, c)
    n_ret = (~np.isnan(p)).sum(axis=1)
    found = ~np.isnan(p[np.arange(m), cls])
    rank = _positions(p, cls[:, None])[:, 0]
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
    c = _pos_int(num_classes, "num_classes")
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


# --------------------------------------------------------------------------------------------
# NDCG (RANK-1)
# --------------------------------------------------------------------------------------------


def _by_position(pos: np.ndarray, values: np.ndarray, positions: int) -> np.ndarray:
    """(m, positions) array: entry [i, j] = sum of ``values[i, k]`` with ``pos[i, k] == j``
    (positions >= ``positions`` are dropped). Memory O(m * K), not O(m * K * positions)."""
    m = pos.shape[0]
    col = np.minimum(pos, positions)
    idx = (np.arange(m)[:, None] * (positions + 1) + col).ravel()
    out = np.bincount(idx, weights=values.ravel(), minlength=m * (positions + 1)).astype(
        np.float64, copy=False)  # (bincount of nothing is int)
    return out.reshape(m, positions + 1)[:, :positions]


def _ndcg_block(lb: np.ndarray | None, pb: np.ndarray | None, pa: np.ndarray, *,
                gamma_b: float, gamma_a: float, positions: int, max_k1: int | None,
                max_k2: int | None) -> dict[str, np.ndarray]:
    """NDCG for one block of rows; every output row that is not applicable is NaN.

    Only the (at most k1) classes with non-zero benign relevance contribute to either DCG, so
    the work is their positions in the benign and perturbed rankings, not whole-row sorts."""
    m, c = pa.shape
    code = np.zeros(m, dtype=np.int64)
    if lb is None:
        assert pb is not None
        missing = np.isnan(pb).any(axis=1)
        zero = (pb == 0.0).any(axis=1) & ~missing
        lb = np.log(np.where(pb > 0.0, pb, 1.0))
        code[zero] = 2
        code[missing] = 1
    else:
        code[np.isnan(lb).any(axis=1)] = 1
        lb = np.where(np.isnan(lb), 0.0, lb)
    if pb is None:
        ez = np.exp(lb - lb.max(axis=1, keepdims=True))
        pb = ez / ez.sum(axis=1, keepdims=True)
    else:
        code[(code == 0) & np.isnan(pb).any(axis=1)] = 1
        pb = np.where(np.isnan(pb), 0.0, pb)
    lmax, lmin = lb.max(axis=1), lb.min(axis=1)
    span = lmax - lmin
    code[(code == 0) & (span <= 0.0)] = 3
    span = np.where(span > 0.0, span, 1.0)

    # Benign: the classes with p >= gamma_b are exactly the top k1 (uncapped) of the ranking.
    above = pb >= gamma_b
    n_above = above.sum(axis=1)
    kmax = int(n_above.max()) if m else 0
    slot = np.arange(kmax)[None, :]
    valid = slot < n_above[:, None]
    cand = np.zeros((m, kmax), dtype=np.int64)
    rows, cols = np.nonzero(above)  # row by row, classes in increasing index
    starts = np.cumsum(n_above) - n_above
    cand[rows, np.arange(rows.size) - starts[rows]] = cols
    rank_b = _positions(pb, cand)
    k1 = n_above if max_k1 is None else np.minimum(n_above, max_k1)
    kept = valid & (rank_b < k1[:, None])
    resc = (np.take_along_axis(lb, cand, axis=1) - lmin[:, None]) / span[:, None]
    rel = np.where(kept, resc, 0.0)
    total = rel.sum(axis=1)
    code[(code == 0) & (total <= 0.0)] = 4
    rel = rel / np.where(total > 0.0, total, 1.0)[:, None]
    gain = np.exp2(rel) - 1.0  # 0 where not kept

    g_b = gain / np.log2(rank_b + 2.0)
    rel_b_at = _by_position(rank_b, np.where(kept, rel, 0.0), positions)
    dcg_b_at = np.cumsum(_by_position(rank_b, g_b, positions), axis=1)
    dcg_b_all = g_b.sum(axis=1)

    # Perturbed: positions of the same classes; only those within the top k2 count.
    returned = ~np.isnan(pa)
    n_ret = returned.sum(axis=1)
    code[(code == 0) & (n_ret == 0)] = 5
    over = (np.where(returned, pa, -1.0) >= gamma_a).sum(axis=1)
    k2 = over if max_k2 is None else np.minimum(over, max_k2)
    pos_a = _positions(pa, cand)
    in_a = kept & ~np.isnan(np.take_along_axis(pa, cand, axis=1)) & (pos_a < k2[:, None])
    g_a = np.where(in_a, gain / np.log2(pos_a + 2.0), 0.0)
    rel_a_at = _by_position(pos_a, np.where(in_a, rel, 0.0), positions)
    dcg_a_at = np.cumsum(_by_position(pos_a, g_a, positions), axis=1)
    dcg_a_all = g_a.sum(axis=1)

    # Which perturbed positions are known (top-k targets): all of them when the whole vector
    # was returned or the classes past the returned list are surely past k2.
    known_all = (n_ret == c) | (over < n_ret)
    if max_k2 is not None:
        known_all |= max_k2 <= n_ret
    known_upto = np.where(known_all, c, n_ret)
    unknown_pos = np.arange(positions)[None, :] >= known_upto[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        ndcg_at = np.where(~unknown_pos & (dcg_b_at > 0.0),
                           dcg_a_at / np.where(dcg_b_at > 0.0, dcg_b_at, 1.0), np.nan)
        ndcg_k2 = np.where(known_all & (dcg_b_all > 0.0),
                           dcg_a_all / np.where(dcg_b_all > 0.0, dcg_b_all, 1.0), np.nan)
    dcg_a_at = np.where(unknown_pos, np.nan, dcg_a_at)
    rel_a_at = np.where(unknown_pos, np.nan, rel_a_at)
    bad = code != _OK
    for arr in (ndcg_at, ndcg_k2, dcg_a_at, dcg_b_at, rel_a_at, rel_b_at):
        arr[bad] = np.nan
    return {"ndcg_at": ndcg_at, "ndcg_k2": ndcg_k2, "k1": np.where(bad, -1, k1),
            "k2": np.where(bad, -1, k2), "code": code, "dcg_at": dcg_a_at,
            "benign_dcg_at": dcg_b_at, "relevance_at": rel_a_at,
            "benign_relevance_at": rel_b_at}


def _ndcg_arrays(perturbed_probs: Any, benign_logits: Any, benign_probs: Any, *, ndim: int,
                 gamma_b: Any, gamma_a: Any, positions: Any, max_k1: Any,
                 max_k2: Any) -> tuple[dict[str, np.ndarray] | None, dict[str, Any], str | None]:
    gb, ga = _gamma(gamma_b, "gamma_b"), _gamma(gamma_a, "gamma_a")
    npos = _pos_int(positions, "positions")
    mk1 = _pos_int(max_k1, "max_k1", optional=True)
    mk2 = _pos_int(max_k2, "max_k2", optional=True)
    assert npos is not None
    params: dict[str, Any] = {"gamma_b": gb, "gamma_a": ga, "positions": npos,
                              "max_k1": mk1, "max_k2": mk2}
    if perturbed_probs is None:
        return None, params, NO_SCORES
    pa = _matrix(perturbed_probs, "perturbed_probs", probs=True, ndim=ndim)
    if benign_logits is None and benign_probs is None:
        return None, params, ("no benign scores were given: the benign relevance needs the "
                              "benign pre-softmax outputs or probabilities (RANK-1, RANK-3)")
    lb = None if benign_logits is None else _matrix(benign_logits, "benign_logits", probs=False,
                                                    ndim=ndim)
    pb = None if benign_probs is None else _matrix(benign_probs, "benign_probs", probs=True,
                                                   ndim=ndim)
    if ndim == 1:
        pa = pa[None, :]
        lb = None if lb is None else lb[None, :]
        pb = None if pb is None else pb[None, :]
    for name, other in (("benign_logits", lb), ("benign_probs", pb)):
        if other is not None and other.shape != pa.shape:
            raise InvalidArgument(name, f"shape {other.shape if ndim == 2 else other.shape[1:]} "
                                        f"differs from perturbed_probs "
                                        f"{pa.shape if ndim == 2 else pa.shape[1:]}")
    m, c = pa.shape
    npos = min(npos, c)
    params["positions"] = npos
    parts: list[dict[str, np.ndarray]] = []
    step = _block_rows(c)
    for s in range(0, m, step):
        e = min(m, s + step)
        parts.append(_ndcg_block(None if lb is None else lb[s:e], None if pb is None else pb[s:e],
                                 pa[s:e], gamma_b=gb, gamma_a=ga, positions=npos,
                                 max_k1=mk1, max_k2=mk2))
    out = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    return out, params, None


def ndcg_batch(perturbed_probs: Any, *, benign_logits: Any = None, benign_probs: Any = None,
               gamma_b: float = GAMMA_B, gamma_a: float = GAMMA_A,
               positions: int = NDCG_POSITIONS, max_k1: int | None = None,
               max_k2: int | None = None) -> dict[str, Any]:
    """NDCG@1..@positions, NDCG@1 and eq. (6) NDCG for M images (RANK-1, RANK-3).

    ``perturbed_probs``: (M, C) post-softmax probabilities of the perturbed (attacked, degraded
    or defended) inputs, NaN = class not returned; ``None`` for a labels-only target.
    ``benign_logits``: (M, C) benign pre-softmax outputs; ``benign_probs``: (M, C) benign
    post-softmax probabilities (k1 is chosen on these). At least one of the two is needed; see
    the module docstring for how the missing one is derived. Returns the batch tree described
    there with ``per_image`` = {ndcg_1, ndcg_at, ndcg_k2, k1, k2, reason} and ``mean`` =
    {ndcg_1, ndcg_at, ndcg_k2, n_at}. ``positions`` is clamped to C.
    """
    arrays, params, reason = _ndcg_arrays(perturbed_probs, benign_logits, benign_probs, ndim=2,
                                          gamma_b=gamma_b, gamma_a=gamma_a, positions=positions,
                                          max_k1=max_k1, max_k2=max_k2)
    base: dict[str, Any] = {"metric": "ndcg", "definition": NDCG_DEFINITION, "params": params}
    if arrays is None:
        m = None if perturbed_probs is None else int(np.asarray(perturbed_probs).shape[0])
        return {**base, "applicable": False, "reason": reason, "m": m, "m_applicable": 0,
                "mean": {"ndcg_1": None, "ndcg_at": None, "ndcg_k2": None, "n_at": None},
                "per_image": None}
    at, k2v, code = arrays["ndcg_at"], arrays["ndcg_k2"], arrays["code"]
    ok = code == _OK
    n_ok = int(ok.sum())
    n_at = (~np.isnan(at)).sum(axis=0)
    with np.errstate(invalid="ignore"):
        mean_at = [float(np.nanmean(at[:, j])) if n_at[j] else None for j in range(at.shape[1])]
    n_k2 = int((~np.isnan(k2v)).sum())
    mean = {"ndcg_1": mean_at[0], "ndcg_at": mean_at,
            "ndcg_k2": float(np.nanmean(k2v)) if n_k2 else None,
            "n_at": [int(n) for n in n_at], "n_k2": n_k2}
    reasons = [None if r == _OK else _REASONS[int(r)] for r in code.tolist()]
    return {
        **base,
        "applicable": n_ok > 0,
        "reason": None if n_ok else "no image has an applicable NDCG (see per_image.reason)",
        "m": int(at.shape[0]), "m_applicable": n_ok, "mean": mean,
        "per_image": {"ndcg_1": _col(at[:, 0]), "ndcg_at": _col(at), "ndcg_k2": _col(k2v),
                      "k1": [None if v < 0 else int(v) for v in arrays["k1"].tolist()],
                      "k2": [None if v < 0 else int(v) for v in arrays["k2"].tolist()],
                      "reason": reasons},
    }


def ndcg(perturbed_probs: Any, *, benign_logits: Any = None, benign_probs: Any = None,
         gamma_b: float = GAMMA_B, gamma_a: float = GAMMA_A, positions: int = NDCG_POSITIONS,
         max_k1: int | None = None, max_k2: int | None = None) -> dict[str, Any]:
    """NDCG for one image (RANK-1, RANK-3): length-C vectors, as :func:`ndcg_batch`.

    Returns {metric, definition, params, applicable, reason, ndcg_1, ndcg_at, ndcg_k2, k1, k2,
    dcg_at, benign_dcg_at, relevance_at, benign_relevance_at}: the last four are Table I's
    "DCG scores" and "relevance scores" rows (perturbed list, benign list) at 1..positions.
    """
    arrays, params, reason = _ndcg_arrays(perturbed_probs, benign_logits, benign_probs, ndim=1,
                                          gamma_b=gamma_b, gamma_a=gamma_a, positions=positions,
                                          max_k1=max_k1, max_k2=max_k2)
    base: dict[str, Any] = {"metric": "ndcg", "definition": NDCG_DEFINITION, "params": params}
    keys = ("ndcg_at", "dcg_at", "benign_dcg_at", "relevance_at", "benign_relevance_at")
    if arrays is None:
        return {**base, "applicable": False, "reason": reason, "ndcg_1": None, "ndcg_k2": None,
                "k1": None, "k2": None, **{key: None for key in keys}}
    code = int(arrays["code"][0])
    if code != _OK:
        return {**base, "applicable": False, "reason": _REASONS[code], "ndcg_1": None,
                "ndcg_k2": None, "k1": None, "k2": None, **{key: None for key in keys}}
    return {**base, "applicable": True, "reason": None,
            "ndcg_1": _f(float(arrays["ndcg_at"][0, 0])),
            "ndcg_k2": _f(float(arrays["ndcg_k2"][0])),
            "k1": int(arrays["k1"][0]), "k2": int(arrays["k2"][0]),
            **{key: _col(arrays[key][0]) for key in keys}}


# --------------------------------------------------------------------------------------------
# DRR (RANK-2)
# --------------------------------------------------------------------------------------------


def _drr_arrays(perturbed_probs: Any, benign_class: Any, k: Any, ndim: int) -> tuple[
        np.ndarray | None, np.ndarray | None, np.ndarray | None, np.ndarray | None, int]:
    kk = _pos_int(k, "k")
    assert kk is not None
    if perturbed_probs is None:
        return None, None, None, None, kk
    p = _matrix(perturbed_probs, "perturbed_probs", probs=True, ndim=ndim)
    if ndim == 1:
        p = p[None, :]
        if np.ndim(benign_class) != 0:
            raise InvalidArgument("benign_class", "must be one class index")
        benign_class = [benign_class]
    m, c = p.shape
    cls = _classes(benign_class, "benign_class", m, c)
    rank0, found, n_ret = rank_of_class(p, cls)
    rank = rank0 + 1  # the seed's 1-based rank
    pc = p[np.arange(m), cls]
    value = np.where(found & (rank <= kk), (np.where(found, pc, 0.0) + 1.0) / (rank + 1.0), 0.0)
    code = np.zeros(m, dtype=np.int64)
    code[~found & (n_ret < kk)] = 6
    code[n_ret == 0] = 5
    value = np.where(code == _OK, value, np.nan)
    return value, np.where(found, rank, -1), code, np.where(found, pc, np.nan), kk


def drr_batch(perturbed_probs: Any, benign_class: Any, *, k: int = DRR_K) -> dict[str, Any]:
    """DRR_k for M images (RANK-2, RANK-3).

    ``perturbed_probs``: (M, C) perturbed probabilities, NaN = not returned, ``None`` for a
    labels-only target (not applicable). ``benign_class``: (M,) int class indices (the benign
    prediction). Returns the batch tree with ``per_image`` = {drr, rank (1-based, None when the
    class was not returned), probability, reason} and ``mean`` = {drr, n}.
    """
    value, rank, code, pc, kk = _drr_arrays(perturbed_probs, benign_class, k, 2)
    base: dict[str, Any] = {"metric": "drr", "definition": DRR_DEFINITION, "params": {"k": kk}}
    if value is None or rank is None or code is None or pc is None:
        return {**base, "applicable": False, "reason": NO_SCORES, "m": None, "m_applicable": 0,
                "mean": {"drr": None, "n": 0}, "per_image": None}
    ok = code == _OK
    n = int(ok.sum())
    return {
        **base,
        "applicable": n > 0,
        "reason": None if n else "no image has an applicable DRR (see per_image.reason)",
        "m": int(value.shape[0]), "m_applicable": n,
        "mean": {"drr": float(value[ok].mean()) if n else None, "n": n},
        "per_image": {"drr": _col(value),
                      "rank": [None if r < 0 else int(r) for r in rank.tolist()],
                      "probability": _col(pc),
                      "reason": [None if r == _OK else _REASONS[int(r)] for r in code.tolist()]},
    }


def drr(perturbed_probs: Any, benign_class: int, *, k: int = DRR_K) -> dict[str, Any]:
    """DRR_k for one image (RANK-2, RANK-3): a length-C probability vector (NaN = not
    returned, ``None`` = labels-only target) and the benign class index. Returns {metric,
    definition, params, applicable, reason, drr, rank (1-based or None), probability}."""
    value, rank, code, pc, kk = _drr_arrays(perturbed_probs, benign_class, k, 1)
    base: dict[str, Any] = {"metric": "drr", "definition": DRR_DEFINITION, "params": {"k": kk}}
    if value is None or rank is None or code is None or pc is None:
        return {**base, "applicable": False, "reason": NO_SCORES, "drr": None, "rank": None,
                "probability": None}
    c0 = int(code[0])
    return {**base, "applicable": c0 == _OK, "reason": None if c0 == _OK else _REASONS[c0],
            "drr": _f(float(value[0])), "rank": None if rank[0] < 0 else int(rank[0]),
            "probability": _f(float(pc[0]))}
