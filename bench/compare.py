#!/usr/bin/env python3
"""How often ``fortis compare``'s rules flag a change that is not there, and how often they
find one that is: the unpaired z-test against the paired McNemar test, with and without
family control (Holm, Benjamini-Hochberg).

The family is what a comparison of two evaluations of the same plan tests: accuracy, each
noise corruption (gaussian_noise, shot_noise, impulse_noise: the corruptions that draw random
numbers) at each severity (default 1, 3, 5) and the worst case over them; 11 p-values. The
rules, each run by ``fortis.server.cli.compare.compare_reports`` itself on two report
documents whose metrics and ``outcomes`` come from the same per-image outcomes:

- ``z``: the two-proportion z-test per metric at alpha 0.05 (the reports without outcomes,
  ``--family none``); ``z+holm``: the same p-values adjusted by Holm;
- ``mcnemar``: McNemar's exact test per metric at alpha 0.05 (``--family none``);
  ``mcnemar+holm`` (the default of ``fortis compare``), ``mcnemar+bh``.

(a) False flags: ``--pairs`` K pairs of runs of the SAME model (``fmnist-cnn``) with two
different plan seeds on the same ``--n`` images (the first of the Fashion-MNIST test split);
only the noise differs, so every flag is false. Reported per rule: the share of pairs with
any significant change, and with any significant regression (B worse).

(b) Power: ``fmnist-cnn-at`` (A, adversarially trained) against ``fmnist-cnn`` (B) on a
population of ``--population`` test images at one seed; the true differences are those of
the population. For each subsample size (default 100, 200, 500) ``--draws`` subsamples are
drawn without replacement; reported per rule the share in which it flags the metric with the
largest true difference (in its true direction), and the one with the smallest |difference|
above 0.03.

The outcomes are computed on the evaluation's own path without the services around it: the
perturbation service's ``engine.perturb`` (the plan seed, the corruption, the severity and the
image id key each image's generator, ``services/common/seeding.py``) and the built-in model's
``predict`` (top-1 against the label: the plan's default rule, IEEE-C1). That this is the
evaluation's path is checked in the run: one real evaluation (``fortis run``, embedded, the
first 64 images, the same corruptions and severities) must give exactly the same outcome
strings in its report.json (``fast_path_matches_evaluation``).

Prints JSON (goals: the fast path matches the evaluation; McNemar + Holm's false-flag rate
<= 0.10, alpha 0.05 plus the slack of K = 20 pairs; McNemar + Holm at least as powerful as
z + Holm on the smallest true difference above 0.03 at the largest size). Never part of the test run. About 2-3 minutes on 2 cores.

    python bench/compare.py [--pairs 20] [--n 500] [--population 2000] [--draws 200]
                            [--sizes 100,200,500] [--severities 1,3,5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import command_line, goal, machine  # noqa: E402 - bench/_report.py
from fortis.server.cli.compare import compare_reports  # noqa: E402

CORRUPTIONS = ("gaussian_noise", "shot_noise", "impulse_noise")
RULES = {"z": (False, "none"), "z+holm": (False, "holm"), "mcnemar": (True, "none"),
         "mcnemar+holm": (True, "holm"), "mcnemar+bh": (True, "bh")}
ALPHA = 0.05
CHECK_IMAGES = 64


def image_ids(n: int) -> list[str]:
    """The ids the built-in Fashion-MNIST source gives the first ``n`` test images."""
    return [f"fmnist-test-{i:05d}" for i in range(n)]


def outcomes(model: Any, images: np.ndarray, labels: np.ndarray, ids: list[str], seed: int,
             severities: list[int]) -> dict[tuple[str, str, int], np.ndarray]:
    """Per-image right/wrong of ``model`` on the clean images and on each noise corruption at
    each severity, perturbed as the perturbation service does for a plan of ``seed``."""
    from fortis.services.perturbation.engine import perturb

    def right(batch: np.ndarray) -> np.ndarray:
        pred = np.concatenate([model.predict(batch[i:i + 256])
                               for i in range(0, len(batch), 256)])
        return pred == labels

    out = {("clean", "", 0): right(images)}
    items = list(zip(ids, images, strict=True))
    for c in CORRUPTIONS:
        for s in severities:
            out[("corruption", c, s)] = right(np.stack(perturb(c, s, seed, items)))
    return out


def _s(v: np.ndarray) -> str:
    return "".join("1" if x else "0" for x in v.tolist())


def report(name: str, ids: list[str], res: dict[tuple[str, str, int], np.ndarray],
           with_outcomes: bool) -> dict[str, Any]:
    """A report document with the metrics these outcomes give (and the outcomes)."""
    m = len(ids)

    def rate(v: np.ndarray) -> dict[str, Any]:
        k = int(v.sum())
        return {"value": k / m, "robustness": k / m, "ci95": None, "correct": k, "m": m}

    corr = [v for (kind, _, _), v in res.items() if kind == "corruption"]
    metrics: dict[str, Any] = {"accuracy": rate(res[("clean", "", 0)]),
                               "worstcase_robustness_corr": rate(np.logical_and.reduce(corr)),
                               "corruptions": {}}
    for (kind, c, s), v in res.items():
        if kind == "corruption":
            metrics["corruptions"].setdefault(c, {})[str(s)] = rate(v)
    doc: dict[str, Any] = {"plan": {"name": "bench"}, "target": {"name": name},
                           "evaluation": {"id": name, "images": m}, "metrics": metrics}
    if with_outcomes:
        doc["outcomes"] = {"image_ids": ids, "settings": [
            {"kind": k, "name": c, "level": s, "outcomes": _s(v)}
            for (k, c, s), v in res.items()]}
    return doc


def flags(a: dict, b: dict, rule: str) -> list[dict[str, Any]]:
    """The rows ``rule`` finds significant, comparing B against A."""
    paired, family = RULES[rule]
    if not paired:
        a, b = ({k: v for k, v in d.items() if k != "outcomes"} for d in (a, b))
    result = compare_reports(a, b, alpha=ALPHA, family=family)
    return [r for r in result["rows"] if r["significant"]]


def check_fast_path(model_name: str, seed: int, severities: list[int],
                    images: np.ndarray, labels: np.ndarray, model: Any) -> bool:
    """One real evaluation of the first images: its report's outcomes are the fast path's."""
    from fortis.server.cli import main as fortis

    ids = image_ids(CHECK_IMAGES)
    plan = (f"name: bench-compare\nseed: {seed}\n"
            f"target: {{name: {model_name}, task: classification}}\n"
            f"dataset: {{source: fashion-mnist, split: test, limit: {CHECK_IMAGES}}}\n"
            "corruptions:\n" + "".join(f"  - {{id: {c}, severities: {severities}}}\n"
                                       for c in CORRUPTIONS))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "plan.yaml").write_text(plan)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = fortis(["run", str(Path(tmp) / "plan.yaml"), "--out", str(Path(tmp) / "out"),
                           "--quiet", "--state-dir", str(Path(tmp) / "state")])
        if code != 0:
            return False
        doc = json.loads((Path(tmp) / "out" / "report.json").read_text())
    got = {(s["kind"], s["name"], s["level"]): s["outcomes"] for s in doc["outcomes"]["settings"]}
    fast = outcomes(model, images[:CHECK_IMAGES], labels[:CHECK_IMAGES], ids, seed, severities)
    return doc["outcomes"]["image_ids"] == ids and got == {k: _s(v) for k, v in fast.items()}


def false_flags(model: Any, images: np.ndarray, labels: np.ndarray, pairs: int,
                severities: list[int]) -> dict[str, Any]:
    ids = image_ids(len(images))
    any_change = dict.fromkeys(RULES, 0)
    any_regression = dict.fromkeys(RULES, 0)
    for k in range(pairs):
        docs = [report(f"seed-{s}", ids, outcomes(model, images, labels, ids, s, severities),
                       True) for s in (1000 + 2 * k, 1001 + 2 * k)]
        for rule in RULES:
            found = flags(docs[0], docs[1], rule)
            any_change[rule] += bool(found)
            any_regression[rule] += any(r["change"] == "worse" for r in found)
    return {"pairs": pairs, "images": len(images),
            "any_significant_change_rate": {r: v / pairs for r, v in any_change.items()},
            "any_regression_rate": {r: v / pairs for r, v in any_regression.items()}}


def power(at: Any, cnn: Any, images: np.ndarray, labels: np.ndarray, seed: int,
          severities: list[int], sizes: list[int], draws: int) -> dict[str, Any]:
    ids = image_ids(len(images))
    ra = outcomes(at, images, labels, ids, seed, severities)
    rb = outcomes(cnn, images, labels, ids, seed, severities)
    full_a, full_b = report("at", ids, ra, True), report("cnn", ids, rb, True)
    true = {r["metric"]: r["difference"] for r in compare_reports(full_a, full_b)["rows"]
            if r["difference"] is not None}
    largest = max(true, key=lambda k: abs(true[k]))
    small = [k for k in true if abs(true[k]) > 0.03]
    smallest = min(small, key=lambda k: abs(true[k])) if small else largest
    rng = np.random.default_rng(29)
    out: dict[str, Any] = {"population": len(images), "seed": seed, "draws": draws,
                           "true_difference_b_minus_a": {k: round(v, 4) for k, v in
                                                         sorted(true.items())},
                           "metrics": {"largest": largest, "smallest_above_0.03": smallest},
                           "detection_rate": {}}
    for n in sizes:
        hits = {m: dict.fromkeys(RULES, 0) for m in (largest, smallest)}
        for _ in range(draws):
            pick = np.sort(rng.choice(len(images), size=n, replace=False))
            sub_ids = [ids[i] for i in pick]
            da = report("at", sub_ids, {k: v[pick] for k, v in ra.items()}, True)
            db = report("cnn", sub_ids, {k: v[pick] for k, v in rb.items()}, True)
            for rule in RULES:
                found = {r["metric"]: r for r in flags(da, db, rule)}
                for m in hits:
                    r = found.get(m)
                    if r is not None and np.sign(r["difference"]) == np.sign(true[m]):
                        hits[m][rule] += 1
        out["detection_rate"][str(n)] = {m: {r: v / draws for r, v in h.items()}
                                         for m, h in hits.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--population", type=int, default=2000)
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--sizes", default="100,200,500")
    ap.add_argument("--severities", default="1,3,5")
    ap.add_argument("--seed", type=int, default=7)
    ns = ap.parse_args()
    severities = [int(s) for s in ns.severities.split(",")]
    sizes = [int(s) for s in ns.sizes.split(",")]
    torch.set_num_threads(1)     # small batches of a small CNN: one thread is fastest here
    from fortis.adapters.builtin import load_model
    from fortis.adapters.torch_models.datasets import load_fashion_mnist

    images, labels = load_fashion_mnist("test", limit=max(ns.n, ns.population, CHECK_IMAGES))
    labels = np.asarray(labels)
    cnn, at = load_model("fmnist-cnn"), load_model("fmnist-cnn-at")
    t0 = time.perf_counter()
    matches = check_fast_path("fmnist-cnn", ns.seed, severities, images, labels, cnn)
    t1 = time.perf_counter()
    ff = false_flags(cnn, images[:ns.n], labels[:ns.n], ns.pairs, severities)
    t2 = time.perf_counter()
    pw = power(at, cnn, images[:ns.population], labels[:ns.population], ns.seed, severities,
               sizes, ns.draws)
    t3 = time.perf_counter()
    hard = pw["metrics"]["smallest_above_0.03"]
    top = pw["detection_rate"][str(max(sizes))][hard]
    print(json.dumps({
        "benchmark": "compare",
        "command": command_line(),
        "machine": machine(),
        "family": "accuracy, worst case and " + ", ".join(CORRUPTIONS) + f" at severities "
                  f"{severities}: {1 + 1 + len(CORRUPTIONS) * len(severities)} tests",
        "alpha": ALPHA,
        "fast_path_matches_evaluation": matches,
        "false_flags": ff,
        "power": pw,
        "seconds": {"check": round(t1 - t0, 1), "false_flags": round(t2 - t1, 1),
                    "power": round(t3 - t2, 1)},
        "goals": [
            goal("fast path = evaluation's outcomes", float(matches), 1, ">="),
            goal("McNemar + Holm false-flag rate", ff["any_significant_change_rate"]
                 ["mcnemar+holm"], 0.10, "<="),
            goal(f"power gain McNemar+Holm - z+Holm, {hard}, n={max(sizes)}",
                 top["mcnemar+holm"] - top["z+holm"], 0, ">="),
        ],
    }, indent=2))


if __name__ == "__main__":
    main()
