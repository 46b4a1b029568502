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

Result trees
------------
Batch functions return ``{metric, definition, applicable, reason, params, m, m_applicable,
mean, per_image}``; ``per_image`` holds one list per quantity (columnar, index = image),
``None`` for an image where the value is not applicable and ``per_image.reason[i]`` says why.
Means are taken over the applicable images (per position over the images where that position is
known); with none, the mean is ``None`` and ``reason`` is set -- never 0.

Modules
-------
``ranks``       input checks, class positions under the tie rule, :func:`rank_of_class`,
                :func:`prediction_arrays` and the per-image reasons shared by both metrics.
``dcg``         NDCG (RANK-1): :func:`ndcg_batch`, :func:`ndcg`.
``reciprocal``  DRR (RANK-2): :func:`drr_batch`, :func:`drr`.

Every public name is re-exported here: import from ``fortis.services.scoring.ranking``.
"""

from __future__ import annotations

from fortis.services.scoring.ranking.dcg import (
    GAMMA_A,
    GAMMA_B,
    NDCG_DEFINITION,
    NDCG_POSITIONS,
    ndcg,
    ndcg_batch,
)
from fortis.services.scoring.ranking.ranks import NO_SCORES, prediction_arrays, rank_of_class
from fortis.services.scoring.ranking.reciprocal import DRR_DEFINITION, DRR_K, drr, drr_batch

__all__ = [
    "DRR_DEFINITION",
    "DRR_K",
    "GAMMA_A",
    "GAMMA_B",
    "NDCG_DEFINITION",
    "NDCG_POSITIONS",
    "NO_SCORES",
    "drr",
    "drr_batch",
    "ndcg",
    "ndcg_batch",
    "prediction_arrays",
    "rank_of_class",
]
