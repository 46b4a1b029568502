#!/usr/bin/env python3
"""Scoring speed on a large M: M = 10,000 images x 75 corruption settings (15 corruptions x 5
severities) plus the clean pass, the standard's recommended M (IEEE-M8).

Classification (IEEE-C2 top-1, top-K, threshold), detection (IEEE-C4: 3 objects and 10
predicted boxes per image) and segmentation (IEEE-C5: 32x32 label maps, 5 settings) through
``fortis.services.scoring.outcomes``. For classification the same records are also scored by
a plain per-record loop over ``ieee.is_correct`` (the straightforward implementation), in the
same run, as the reference for the speed ratio. Synthetic recorded answers from a seeded
generator. Prints JSON; never part of the test run.

    python bench/scoring.py [--m 10000] [--settings 75] [--skip-detseg]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np
from fortis.services.scoring.correctness import (
    DetectionCriterion,
    Detections,
    SegmentationCriterion,
    SegmentationPrediction,
)
from fortis.services.scoring.ieee import ClassPrediction, CorrectnessRule, is_correct
from fortis.services.scoring.outcomes import (
    TestRecord,
    score_classification,
    score_detection,
    score_segmentation,
)


def _timed(fn):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=10_000)
    ap.add_argument("--settings", type=int, default=75)
    ap.add_argument("--skip-detseg", action="store_true")
    ns = ap.parse_args()
    rng = np.random.default_rng(0)
    m, s = ns.m, ns.settings
    ids = [f"img{i}" for i in range(m)]
    labels = {i: [int(rng.integers(0, 10))] for i in ids}
    scores = (0.5, 0.2, 0.1, 0.1, 0.1)

    def cls_test(kind: str, pid: str = "", sev: int = 0) -> TestRecord:
        perm = np.argsort(rng.random((m, 10)), axis=1)[:, :5]
        return TestRecord(kind=kind, perturbation_id=pid, severity=sev, predictions={
            i: ClassPrediction(labels=tuple(int(x) for x in perm[n]), scores=scores)
            for n, i in enumerate(ids)})

    tests = [cls_test("clean")] + [cls_test("corruption", f"c{j // 5}", j % 5 + 1) for j in range(s)]
    records = m * (s + 1)
    out: dict = {"benchmark": "scoring_large_m", "m": m, "settings": s, "records": records}
    cls: dict = {}
    for mode in ("top1", "topk", "threshold"):
        rule = CorrectnessRule(mode=mode, k=3, threshold=0.3)
        res, sec = _timed(lambda rule=rule: score_classification(rule, labels, tests))
        cls[mode] = {"seconds": round(sec, 3), "records_per_s": round(records / sec),
                     "accuracy": res["accuracy"]["value"]}
    # reference: a plain loop judging every record with is_correct
    rule = CorrectnessRule(mode="top1")
    judged, ref_sec = _timed(lambda: [[is_correct(t.predictions[i], labels[i], rule) for i in ids]
                                      for t in tests])
    cls["reference_loop_top1_seconds"] = round(ref_sec, 3)
    cls["speedup_vs_loop_top1"] = round(ref_sec / cls["top1"]["seconds"], 2)
    assert abs(np.mean(judged[0]) - cls["top1"]["accuracy"]) < 1e-12
    out["classification"] = cls
    out["seconds"] = cls["top1"]["seconds"]

    if not ns.skip_detseg:
        truths = {}
        for i in ids:
            xy = rng.random((3, 2)) * 400
            wh = rng.random((3, 2)) * 80 + 5
            truths[i] = Detections(boxes=np.c_[xy, xy + wh], labels=rng.integers(0, 5, 3),
                                   image_size=(500, 500))

        def det_test(kind: str, pid: str = "", sev: int = 0) -> TestRecord:
            preds = {}
            for i in ids:
                g = np.asarray(truths[i].boxes)
                b = np.r_[g + rng.normal(0, 5, g.shape), rng.random((7, 2)).repeat(2, 1) * 400 + [0, 0, 30, 30]]
                b[:, 2:] = np.maximum(b[:, 2:], b[:, :2] + 1)
                preds[i] = Detections(boxes=b, labels=rng.integers(0, 5, 10), scores=rng.random(10))
            return TestRecord(kind=kind, perturbation_id=pid, severity=sev, predictions=preds)

        dtests = [det_test("clean")] + [det_test("corruption", f"c{j // 5}", j % 5 + 1) for j in range(s)]
        crit = DetectionCriterion(mode="threshold", iou_threshold=0.3, confidence_threshold=0.1)
        res, sec = _timed(lambda: score_detection(crit, truths, dtests))
        out["detection"] = {"records": records, "seconds": round(sec, 3),
                            "records_per_s": round(records / sec), "accuracy": res["accuracy"]["value"]}
        gts = {i: rng.integers(0, 6, (32, 32)) for i in ids}
        stests = [TestRecord(kind=k, perturbation_id="c" if k != "clean" else "", severity=sv,
                             predictions={i: SegmentationPrediction(
                                 mask=np.where(rng.random((32, 32)) < 0.8, gts[i], 0)) for i in ids})
                  for k, sv in [("clean", 0)] + [("corruption", v) for v in range(1, 6)]]
        scrit = SegmentationCriterion(classes=(1, 2, 3), miou_threshold=0.6)
        res, sec = _timed(lambda: score_segmentation(scrit, gts, stests))
        n = m * len(stests)
        out["segmentation"] = {"records": n, "mask": "32x32", "seconds": round(sec, 3),
                               "records_per_s": round(n / sec), "accuracy": res["accuracy"]["value"]}
    out["python"] = platform.python_version()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
