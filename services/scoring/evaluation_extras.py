"""The parts of an evaluation's scoring beyond IEEE-M1..M8, on answers held as arrays: ranking
metrics per setting (RANK-1..3), degradation profiles per operator (DEG-2..4), the failed
queries per setting, and per query attack its success-vs-queries curve (IEEE-M6, from the
ledger's per-image counts) and PER-4 fooling rate. Domain code: no gRPC.

They reproduce what the evaluation runner computed through the catalogue before answers
travelled as arrays (``Compute("ndcg")``, ``Compute("drr")``, ``Compute("degradation_profile")``
on dense M x C score matrices, NaN for classes not returned and for failed queries), by calling
the same catalogue entries in-process, so the numbers are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np
from fortis.core.task import Task
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.catalogue import compute
from fortis.services.scoring.evaluation_data import (
    ClassificationAnswers,
    ClassificationTruth,
    EvaluationSetup,
    SettingData,
)
from fortis.services.scoring.pertknob import SearchRecord, property_robustness

__all__ = ["DRR_K", "GAMMA_A", "GAMMA_B", "MAX_CURVE_POINTS", "check_class_answers",
           "degradation", "dense_scores", "fooling", "query_errors", "ranking",
           "success_by_queries"]

#: RANK-1 probability floors and the DRR cut-off used for every evaluation.
GAMMA_B: Final = 0.01
GAMMA_A: Final = 0.001
DRR_K: Final = 5
#: Examples listed per setting with failed queries; characters kept of each message.
MAX_EXAMPLES: Final = 20
MAX_MESSAGE: Final = 300
LABELS_ONLY: Final = "the target returns labels only; NDCG and DRR need scores (RANK-3)"
#: Most points of one attack's success-vs-queries curve (a report chart, not a raw dump).
MAX_CURVE_POINTS: Final = 100


def dense_scores(a: ClassificationAnswers, rows: np.ndarray, num_classes: int,
                 field: str) -> np.ndarray:
    """len(rows) x C scores of the answers in ``rows``; NaN for classes not returned (and for
    answers without scores)."""
    out = np.full((rows.size, num_classes), np.nan)
    if a.scores is None or rows.size == 0:
        return out
    lab = a.labels[rows]
    sc = a.scores[rows]
    if (lab >= num_classes).any():
        raise InvalidArgument(f"{field}.labels", f"label {int(lab.max())} is outside the "
                                                 f"target's {num_classes} classes")
    r, c = np.nonzero(lab >= 0)
    out[r, lab[r, c]] = sc[r, c]
    return out


def _scored(a: ClassificationAnswers | None, failed: np.ndarray) -> np.ndarray:
    """(n,) bool: answered, with at least one score."""
    if a is None or a.scores is None:
        return np.zeros(failed.size, dtype=bool)
    return ~failed & ((a.labels >= 0) & ~np.isnan(a.scores)).any(axis=1)


def check_class_answers(a: ClassificationAnswers, n: int,
                        field: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Validated (n, k) labels (int64, >= -1) and scores (float64, same shape) or None."""
    lab = a.labels
    if lab.ndim != 2 or lab.shape[0] != n:
        raise InvalidArgument(f"{field}.labels", f"must be [{n}, k] (one row per covered "
                                                 f"image), got {list(lab.shape)}")
    if not np.issubdtype(lab.dtype, np.integer):
        raise InvalidArgument(f"{field}.labels", f"labels must be integers, got {lab.dtype}")
    if (lab < -1).any():
        raise InvalidArgument(f"{field}.labels", "labels must be >= 0 (-1 = padding)")
    if a.scores is None:
        return lab, None
    sc = a.scores
    if sc.shape != lab.shape:
        raise InvalidArgument(f"{field}.scores", f"shape {list(sc.shape)} does not match "
                                                 f"labels {list(lab.shape)}")
    if not np.issubdtype(sc.dtype, np.floating):
        raise InvalidArgument(f"{field}.scores", f"scores must be floats, got {sc.dtype}")
    return lab, sc


def _class_answers(s: SettingData) -> ClassificationAnswers:
    assert isinstance(s.answers, ClassificationAnswers)
    return s.answers


def ranking(setup: EvaluationSetup, settings: Sequence[SettingData]) -> dict[str, Any]:
    """NDCG@1..10 and DRR@5 of each corruption and transfer-attack setting against the clean
    answers (RANK-1, RANK-2), on the images whose clean and perturbed answers both carry
    scores. Not applicable (never 0) for detection/segmentation, for a labels-only target
    (RANK-3) or when the caller says so."""
    if setup.task != Task.CLASSIFICATION:
        return {"applicable": False, "settings": {},
                "reason": f"NDCG and DRR rank classes; not defined for {setup.task}"}
    if not setup.ranking_enabled:
        return {"applicable": False, "reason": setup.ranking_reason or LABELS_ONLY,
                "settings": {}}
    c = setup.num_classes
    if c < 1:
        raise InvalidArgument(f"{setup.field}.ranking.num_classes", "the target's number of "
                                                                   "classes (>= 1) is needed")
    m = len(setup.image_ids)
    clean = next(s for s in settings if s.kind == "clean")
    ca = _class_answers(clean)
    clean_ok = _scored(ca, clean.failed(m))
    if not clean_ok.any():
        return {"applicable": False, "reason": "no scored clean answers", "settings": {}}
    out: dict[str, Any] = {}
    order = [s for s in settings if s.kind == "corruption"] + \
        [s for s in settings if s.kind == "transfer_attack"]
    for s in order:
        a = _class_answers(s)
        idx = s.covered(m)
        ok = _scored(a, s.failed(int(idx.size)))
        row_of = np.full(m, -1)
        row_of[idx[ok]] = np.flatnonzero(ok)
        keep = np.flatnonzero(clean_ok & (row_of >= 0))        # image order, as before
        if keep.size == 0:
            continue
        benign = dense_scores(ca, keep, c, f"{clean.field}.classification")
        pert = dense_scores(a, row_of[keep], c, f"{s.field}.classification")
        nd = compute("ndcg", {"perturbed_probs": pert, "benign_probs": benign})
        dr = compute("drr", {"perturbed_probs": pert,
                             "benign_class": np.nanargmax(benign, axis=1)})
        out[s.label] = {"kind": s.kind, "m": int(keep.size),
                        "ndcg_1": nd.get("mean", {}).get("ndcg_1"),
                        "ndcg_at": nd.get("mean", {}).get("ndcg_at"),
                        "drr_5": (dr.get("mean") or {}).get("drr"),
                        "drr_n": dr.get("m_applicable"),
                        "applicable": bool(nd.get("applicable", True))}
    return {"applicable": True, "gamma_b": GAMMA_B, "gamma_a": GAMMA_A, "drr_k": DRR_K,
            "settings": out}


def degradation(setup: EvaluationSetup, settings: Sequence[SettingData]) -> dict[str, Any]:
    """Degradation profiles and failure points per operator (DEG-2..4), on the images right
    at level 0 (the clean answers, DEG-3), each level's change being its mean fraction of
    pixels changed (DEG-4). Probabilities only when the clean answers carry scores."""
    ops: dict[str, list[SettingData]] = {}
    for s in settings:
        if s.kind == "degradation":
            ops.setdefault(s.name, []).append(s)
    if not ops:
        return {}
    assert isinstance(setup.truth, ClassificationTruth)
    ids = list(setup.image_ids)
    m = len(ids)
    clean = next(s for s in settings if s.kind == "clean")
    scored = _class_answers(clean).scores is not None
    c = setup.num_classes
    if scored and c < 1:
        raise InvalidArgument(f"{setup.field}.ranking.num_classes", "the target's number of "
                                                                   "classes (>= 1) is needed by "
                                                                   "the degradation profiles")
    every = np.arange(m)

    def level_arrays(s: SettingData, lv: int, arrays: dict[str, np.ndarray]) -> None:
        a = _class_answers(s)
        labels, _ = check_class_answers(a, m, f"{s.field}.classification")
        failed = s.failed(m)
        lab = np.where(failed[:, None], -1, labels).astype(np.int64)
        arrays[f"labels@{lv}"] = lab
        if scored:
            dense = dense_scores(a, every, c, f"{s.field}.classification")
            dense[failed] = np.nan
            arrays[f"probs@{lv}"] = dense

    result: dict[str, Any] = {}
    for op, levels in ops.items():
        arrays: dict[str, np.ndarray] = {"true_labels": setup.truth.labels[:, 0].copy()}
        level_arrays(clean, 0, arrays)
        changes: dict[str, Any] = {}
        for s in sorted(levels, key=lambda x: x.level):
            level_arrays(s, s.level, arrays)
            if s.fraction_changed is not None:
                changes[str(s.level)] = {"fraction_of_pixels_changed":
                                         round(float(s.fraction_changed), 6)}
        params: dict[str, Any] = {"image_ids": ids, "changes": changes}
        if c >= 1:
            params["num_classes"] = c
        result[op] = compute("degradation_profile", arrays, params)
    return result


def query_errors(setup: EvaluationSetup, settings: Sequence[SettingData]) -> dict[str, Any]:
    """Per setting, the queries the target failed (each scored as incorrect), with at most
    20 examples: clean first, then corruptions, attacks and degradation levels, each in the
    order given (the order of the evaluation report)."""
    ids = setup.image_ids
    rank = {"clean": 0, "corruption": 1, "transfer_attack": 2, "query_attack": 2,
            "degradation": 3}
    out: dict[str, Any] = {}
    for s in sorted(settings, key=lambda x: rank[x.kind]):
        if not s.errors:
            continue
        idx = s.covered(len(ids))
        bad = [(ids[i], e) for i, e in zip(idx.tolist(), s.errors, strict=True) if e]
        if bad:
            out[s.label] = {"errors": len(bad), "of": len(s.errors),
                            "examples": [{"image_id": i, "error": e[:MAX_MESSAGE]}
                                         for i, e in bad[:MAX_EXAMPLES]]}
    return {"total": sum(v["errors"] for v in out.values()), "settings": out}


def success_by_queries(success: np.ndarray, queries: np.ndarray, attacked: np.ndarray,
                       budget: int) -> list[list[float]]:
    """A query attack's success rate against queries (IEEE-M6): ``[[q, rate], ...]`` with
    ``rate`` the share of the attacked images (``attacked``: initially right and answered,
    the success rate's denominator) misled within ``q`` queries, ``queries`` being the
    ledger's per-image counts. A point at each count where the rate changes, and the budget
    Q_m (when above them): the last point is the success rate at the budget. At most
    :data:`MAX_CURVE_POINTS`, evenly spaced over the change points, the last one kept
    (deterministic). Empty when no image was attacked."""
    n0 = int(attacked.sum())
    if n0 == 0:
        return []
    q = queries[attacked & success].astype(np.int64)
    steps, counts = np.unique(q, return_counts=True)
    rates = np.cumsum(counts) / n0
    points = [[int(a), float(b)] for a, b in zip(steps.tolist(), rates.tolist(), strict=True)]
    end = float(q.size / n0)
    if budget > 0 and (not points or budget > points[-1][0]):
        points.append([int(budget), end])
    elif not points:                         # no budget and no success: the largest count
        points.append([int(queries[attacked].max(initial=0)), 0.0])
    if len(points) > MAX_CURVE_POINTS:
        keep = np.unique(np.round(np.linspace(0, len(points) - 1, MAX_CURVE_POINTS))
                         .astype(np.int64))
        points = [points[i] for i in keep.tolist()]
    return points


def fooling(success: np.ndarray, l2: np.ndarray, queries: np.ndarray | None,
            attacked: np.ndarray, threshold: float | None = None) -> dict[str, Any]:
    """PER-4 over an attack's attacked images (initially right, answered): each is "found"
    when the attack misled the target (its L2 the smallest perturbation the search found:
    the minimal ||delta||_2 for PertKnob, PER-3) and "never fooled" otherwise (not misled
    within the search's budget or range). ``fooling_rate`` at T (``threshold``; default the
    mean L2 of the found images, as ``pertknob.property_robustness``, whose definition it
    reuses: fooled at T when L2 < T), ``never_fooled`` the share never misled; None when
    nothing was attacked (or, for the rate, nothing was found)."""
    idx = np.flatnonzero(attacked)
    if idx.size == 0:
        return {"fooling_rate": None, "fooling_threshold": None, "never_fooled": None}
    qs = queries[idx].tolist() if queries is not None else [0] * idx.size
    stats = property_robustness(
        [SearchRecord(status="found" if success[i] else "never_fooled", l2=float(l2[i]),
                      queries=int(q)) for i, q in zip(idx.tolist(), qs, strict=True)],
        threshold=threshold)
    return {"fooling_rate": stats.fooling_rate, "fooling_threshold": stats.threshold,
            "never_fooled": stats.never_fooled_share}
