#!/usr/bin/env python3
"""ScoreEvaluation's domain function on arrays against the plain per-record loop, at the
standard's recommended M (IEEE-M8): M = 10,000 images x 75 corruption settings (15 corruptions
x 5 severities) plus the clean pass, classification top-1, top-k and threshold (IEEE-C1/C2).

Array path: ``evaluation_scoring.score_evaluation`` on (M, k) label / score matrices, one
vectorised verdict per setting, then the IEEE-M1..M8 tree. Reference, in the same run on the
same answers: ``ieee.is_correct`` on every recorded ``ClassPrediction`` (the straightforward
implementation) and the same tree from the resulting booleans. The records are built before
the clock starts (they are the reference's input, as the arrays are the array path's). The two
must agree exactly; the goal is a ratio >= 5. Prints JSON; never part of the test run.

    python bench/scoring.py [--m 10000] [--settings 75] [--k 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from fortis.services.scoring.evaluation_data import (
    ClassificationAnswers,
    ClassificationTruth,
    EvaluationSetup,
    SettingData,
)
from fortis.services.scoring.evaluation_scoring import score_evaluation
from fortis.services.scoring.ieee import (
    ClassPrediction,
    CorrectnessRule,
    compute_ieee_metrics,
    is_correct,
)


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _answers(rng: np.random.Generator, m: int, k: int, c: int) -> ClassificationAnswers:
    order = np.argsort(rng.random((m, c)), axis=1)[:, :k].astype(np.int64)
    scores = np.sort(rng.dirichlet(np.ones(c), m).astype(np.float32), axis=1)[:, ::-1][:, :k]
    return ClassificationAnswers(labels=order, scores=np.ascontiguousarray(scores))


def _records(a: ClassificationAnswers) -> list[ClassPrediction]:
    assert a.scores is not None
    return [ClassPrediction(labels=tuple(lab), scores=tuple(sc))
            for lab, sc in zip(a.labels.tolist(), a.scores.astype(np.float64).tolist(),
                               strict=True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--m", type=int, default=10_000)
    ap.add_argument("--settings", type=int, default=75)
    ap.add_argument("--k", type=int, default=5)
    ns = ap.parse_args()
    m, n_settings, k, c = ns.m, ns.settings, ns.k, 10
    rng = np.random.default_rng(0)
    ids = tuple(f"img{i}" for i in range(m))
    truth = rng.integers(0, c, m).astype(np.int64)
    settings = [SettingData(kind="clean", answers=_answers(rng, m, k, c), field="setting[0]")]
    settings += [SettingData(kind="corruption", name=f"c{j // 5}", level=j % 5 + 1,
                             answers=_answers(rng, m, k, c), field=f"setting[{j + 1}]")
                 for j in range(n_settings)]
    records = [_records(s.answers) for s in settings]  # type: ignore[arg-type]
    label_sets = [[int(t)] for t in truth]
    n_records = m * len(settings)
    out: dict[str, Any] = {"benchmark": "score_evaluation_arrays_vs_record_loop", "m": m,
                           "settings": len(settings), "records": n_records, "k": k,
                           "python": platform.python_version(), "machine": platform.machine()}
    for mode in ("top1", "topk", "threshold"):
        rule = CorrectnessRule(mode=mode, k=3, threshold=0.3)
        setup = EvaluationSetup(image_ids=ids, truth=ClassificationTruth(labels=truth[:, None]),
                                criterion=rule)
        res, arr_s = _timed(lambda: score_evaluation(setup, settings))  # noqa: B023 - runs now

        def loop(rule: CorrectnessRule = rule) -> dict[str, Any]:
            verdicts = [np.array([is_correct(p, t, rule) for p, t in zip(recs, label_sets,
                                                                         strict=True)])
                        for recs in records]
            corr: dict[str, dict[int, np.ndarray]] = {}
            for s, v in zip(settings[1:], verdicts[1:], strict=True):
                corr.setdefault(s.name, {})[s.level] = v
            return compute_ieee_metrics(clean=verdicts[0], corruptions=corr, attacks={},
                                        attack_budgets={}, image_ids=ids)

        ref, loop_s = _timed(loop)
        assert res["ieee"] == ref, f"{mode}: array and record paths disagree"
        out[mode] = {"array_seconds": round(arr_s, 3), "loop_seconds": round(loop_s, 3),
                     "ratio": round(loop_s / arr_s, 1),
                     "array_records_per_s": round(n_records / arr_s),
                     "accuracy": res["ieee"]["accuracy"]["value"],
                     "average_robustness_corr": res["ieee"]["average_robustness_corr"]["value"]}
    out["min_ratio"] = min(out[mode]["ratio"] for mode in ("top1", "topk", "threshold"))
    out["goal_ratio"] = 5
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
