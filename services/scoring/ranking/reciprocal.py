"""Defense reciprocal rank DRR_k (RANK-2, RANK-3) of Brama, Dery and Grinshpoun (seed 002).
Domain code: no gRPC; vectorised over M images.

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
"""

from __future__ import annotations

from typing import Any

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.ranking.ranks import (
    NO_SCORES,
    OK_CODE,
    REASONS,
    as_classes,
    as_column,
    as_matrix,
    as_pos_int,
    float_or_none,
    rank_of_class,
)

__all__ = ["DRR_DEFINITION", "DRR_K", "drr", "drr_batch"]

#: Seed 002 default (RANK-2).
DRR_K = 5

DRR_DEFINITION = (
    "DRR_k = P/(R+1) + 1/(R+1) if the benign class's 1-based rank R in the perturbed output is "
    "<= k, else 0; P = its perturbed probability (Brama et al., eq. (7); RANK-2)")


def _drr_arrays(perturbed_probs: Any, benign_class: Any, k: Any, ndim: int) -> tuple[
        np.ndarray | None, np.ndarray | None, np.ndarray | None, np.ndarray | None, int]:
    kk = as_pos_int(k, "k")
    assert kk is not None
    if perturbed_probs is None:
        return None, None, None, None, kk
    p = as_matrix(perturbed_probs, "perturbed_probs", probs=True, ndim=ndim)
    if ndim == 1:
        p = p[None, :]
        if np.ndim(benign_class) != 0:
            raise InvalidArgument("benign_class", "must be one class index")
        benign_class = [benign_class]
    m, c = p.shape
    cls = as_classes(benign_class, "benign_class", m, c)
    rank0, found, n_ret = rank_of_class(p, cls)
    rank = rank0 + 1  # the seed's 1-based rank
    pc = p[np.arange(m), cls]
    value = np.where(found & (rank <= kk), (np.where(found, pc, 0.0) + 1.0) / (rank + 1.0), 0.0)
    code = np.zeros(m, dtype=np.int64)
    code[~found & (n_ret < kk)] = 6
    code[n_ret == 0] = 5
    value = np.where(code == OK_CODE, value, np.nan)
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
    ok = code == OK_CODE
    n = int(ok.sum())
    return {
        **base,
        "applicable": n > 0,
        "reason": None if n else "no image has an applicable DRR (see per_image.reason)",
        "m": int(value.shape[0]), "m_applicable": n,
        "mean": {"drr": float(value[ok].mean()) if n else None, "n": n},
        "per_image": {"drr": as_column(value),
                      "rank": [None if r < 0 else int(r) for r in rank.tolist()],
                      "probability": as_column(pc),
                      "reason": [None if r == OK_CODE else REASONS[int(r)] for r in code.tolist()]},
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
    return {**base, "applicable": c0 == OK_CODE, "reason": None if c0 == OK_CODE else REASONS[c0],
            "drr": float_or_none(float(value[0])), "rank": None if rank[0] < 0 else int(rank[0]),
            "probability": float_or_none(float(pc[0]))}
