#!/usr/bin/env python3
"""One plan with every query attack of the registry (IEEE-A8 and PertKnob) at its default
parameters, on the first N Fashion-MNIST test images (default 30), at the plan's default
batch size, through the real services and the proxy (``start_stack``): the plan a new user
writes when they try everything. What a parameter is required and has no default gets the
catalogue matrix's rule (tests/matrix/catalogue.py ``required_params``); attacks that take a
surrogate prior get ``fmnist-surrogate``.

Prints JSON: the evaluation's state and wall time, failed settings (there should be none),
and per attack its success rate with its standard error, mean queries and the ledger's
largest per-image count against Q_m.

    python bench/query_plan.py [--n 30] [--target fmnist-cnn] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--target", default="fmnist-cnn")
    ap.add_argument("--out")
    ns = ap.parse_args()
    from fortis.client import FortisClient
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack
    from fortis.services.perturbation.attacks.registry import ATTACKS

    from tests.matrix.catalogue import required_params

    attacks = []
    for spec in ATTACKS.values():
        if not spec.is_query_attack or not spec.supports_task("classification"):
            continue
        item = {"id": spec.id, "params": required_params(spec, (28, 28, 1)) or {}}
        if spec.uses_surrogate:
            item["surrogate"] = "fmnist-surrogate"
        attacks.append(item)
    plan = "\n".join([
        "name: every-query-attack", "seed: 20261128",
        f"target: {{name: {ns.target}, task: classification}}",
        f"dataset: {{source: fashion-mnist, split: test, limit: {ns.n}}}", "attacks:",
        *[f"  - {json.dumps(a)}" for a in attacks]]) + "\n"
    root = Path(tempfile.mkdtemp(prefix="fortis-query-plan-"))
    stack = start_stack(StackSettings(
        state_dir=root / "state", api_keys={"k": "bench"},
        targets=[TargetConfig.parse(f"{ns.target}=builtin:{ns.target}")],
        metrics_port=0, metrics_host="127.0.0.1"))
    try:
        with FortisClient(stack.address, api_key="k") as fc:
            t0 = time.monotonic()
            ev = fc.wait(fc.submit(plan).evaluation_id, timeout_s=4 * 3600)
            seconds = time.monotonic() - t0
            doc: dict = {"attacks": len(attacks), "images": ns.n, "state": ev.state.value,
                         "seconds": round(seconds, 1), "error": str(ev.error or "")}
            if ev.state.value == "SUCCEEDED":
                report = fc.report(ev.evaluation_id)
                doc["failed_settings"] = report["failed_settings"]
                rows = {}
                for name, a in report["metrics"]["attacks"].items():
                    n, p = a["success_rate_n"], a["success_rate"]
                    worst = 0
                    for sid in report["ledger"]["sessions"]:
                        if sid.startswith(f"{ev.evaluation_id}/attack/{name}/"):
                            worst = max([worst, *(max(i.attempts, i.queries) for i in
                                                  fc.session_stats(sid).raw.images)])
                    rows[name] = {"success_rate": p, "se": math.sqrt(p * (1 - p) / n)
                                  if n and p is not None else None, "n": n,
                                  "mean_queries": a["mean_queries"],
                                  "max_queries_per_image": worst,
                                  "q_m": a["query_budget"]}
                doc["per_attack"] = rows
    finally:
        stack.stop(0)
    text = json.dumps(doc, indent=2)
    print(text)
    if ns.out:
        Path(ns.out).write_text(text + "\n")
    ok = doc["state"] == "SUCCEEDED" and not doc.get("failed_settings") and all(
        r["max_queries_per_image"] <= r["q_m"] for r in doc.get("per_attack", {}).values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
