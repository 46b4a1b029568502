"""NDCG per rank position (RANK-1, RANK-3) of Brama, Dery and Grinshpoun, "Evaluation of Neural
Networks defenses and attacks using NDCG and reciprocal rank metrics" (seed 002). Domain code:
no gRPC; vectorised over M images in row blocks.

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
"""

from __future__ import annotations

from typing import Any

import numpy as np
from fortis.services.common.arrays import chunk_slices
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.ranking.ranks import (
    NO_SCORES,
    OK_CODE,
    REASONS,
    as_column,
    as_gamma,
    as_matrix,
    as_pos_int,
    block_rows,
    float_or_none,
    positions_in_rows,
)

__all__ = [
    "GAMMA_A",
    "GAMMA_B",
    "NDCG_DEFINITION",
    "NDCG_POSITIONS",
    "ndcg",
    "ndcg_batch",
]

#: Seed 002 defaults (RANK-1).
GAMMA_B = 0.01
GAMMA_A = 0.001
#: Rank positions reported by default (the seed's Fig. 2 plots @1..@10; Table I lists @1..@12).
NDCG_POSITIONS = 10

NDCG_DEFINITION = (
    "NDCG@i = DCG@i(perturbed)/DCG@i(benign), DCG@i = sum_{j<=i} (2^R_j - 1)/log2(1+j); benign "
    "relevance = benign pre-softmax outputs rescaled to [0,1], kept for the top k1 classes with "
    "p >= gamma_b and normalised to sum 1; perturbed top k2 classes with p >= gamma_a carry the "
    "benign relevance of the same class (Brama et al., eqs. (3)-(6); RANK-1)")


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
    rank_b = positions_in_rows(pb, cand)
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
    pos_a = positions_in_rows(pa, cand)
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
    bad = code != OK_CODE
    for arr in (ndcg_at, ndcg_k2, dcg_a_at, dcg_b_at, rel_a_at, rel_b_at):
        arr[bad] = np.nan
    return {"ndcg_at": ndcg_at, "ndcg_k2": ndcg_k2, "k1": np.where(bad, -1, k1),
            "k2": np.where(bad, -1, k2), "code": code, "dcg_at": dcg_a_at,
            "benign_dcg_at": dcg_b_at, "relevance_at": rel_a_at,
            "benign_relevance_at": rel_b_at}


def _ndcg_arrays(perturbed_probs: Any, benign_logits: Any, benign_probs: Any, *, ndim: int,
                 gamma_b: Any, gamma_a: Any, positions: Any, max_k1: Any,
                 max_k2: Any) -> tuple[dict[str, np.ndarray] | None, dict[str, Any], str | None]:
    gb, ga = as_gamma(gamma_b, "gamma_b"), as_gamma(gamma_a, "gamma_a")
    npos = as_pos_int(positions, "positions")
    mk1 = as_pos_int(max_k1, "max_k1", optional=True)
    mk2 = as_pos_int(max_k2, "max_k2", optional=True)
    assert npos is not None
    params: dict[str, Any] = {"gamma_b": gb, "gamma_a": ga, "positions": npos,
                              "max_k1": mk1, "max_k2": mk2}
    if perturbed_probs is None:
        return None, params, NO_SCORES
    pa = as_matrix(perturbed_probs, "perturbed_probs", probs=True, ndim=ndim)
    if benign_logits is None and benign_probs is None:
        return None, params, ("no benign scores were given: the benign relevance needs the "
                              "benign pre-softmax outputs or probabilities (RANK-1, RANK-3)")
    lb = None if benign_logits is None else as_matrix(benign_logits, "benign_logits", probs=False,
                                                    ndim=ndim)
    pb = None if benign_probs is None else as_matrix(benign_probs, "benign_probs", probs=True,
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
    step = block_rows(c)
    for sl in chunk_slices(m, step):
        s, e = sl.start, sl.stop
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
    ok = code == OK_CODE
    n_ok = int(ok.sum())
    n_at = (~np.isnan(at)).sum(axis=0)
    with np.errstate(invalid="ignore"):
        mean_at = [float(np.nanmean(at[:, j])) if n_at[j] else None for j in range(at.shape[1])]
    n_k2 = int((~np.isnan(k2v)).sum())
    mean = {"ndcg_1": mean_at[0], "ndcg_at": mean_at,
            "ndcg_k2": float(np.nanmean(k2v)) if n_k2 else None,
            "n_at": [int(n) for n in n_at], "n_k2": n_k2}
    reasons = [None if r == OK_CODE else REASONS[int(r)] for r in code.tolist()]
    return {
        **base,
        "applicable": n_ok > 0,
        "reason": None if n_ok else "no image has an applicable NDCG (see per_image.reason)",
        "m": int(at.shape[0]), "m_applicable": n_ok, "mean": mean,
        "per_image": {"ndcg_1": as_column(at[:, 0]), "ndcg_at": as_column(at), "ndcg_k2": as_column(k2v),
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
    if code != OK_CODE:
        return {**base, "applicable": False, "reason": REASONS[code], "ndcg_1": None,
                "ndcg_k2": None, "k1": None, "k2": None, **{key: None for key in keys}}
    return {**base, "applicable": True, "reason": None,
            "ndcg_1": float_or_none(float(arrays["ndcg_at"][0, 0])),
            "ndcg_k2": float_or_none(float(arrays["ndcg_k2"][0])),
            "k1": int(arrays["k1"][0]), "k2": int(arrays["k2"][0]),
            **{key: as_column(arrays[key][0]) for key in keys}}
