#!/usr/bin/env python3
"""Target queries sequential acceptance saves on real plans, and whether it keeps the verdict.

Each plan runs three times through an embedded Fortis (the five services and the built-in
targets in this process, every query through the proxy and its ledger): whole (no
``sequential``), ``sequential: true`` (settings no criterion reads run on every image) and
``sequential: {unreferenced: skip}``. Printed per plan and variant: the ledger's total
queries, the ratio to the whole run's, the verdict and each criterion's outcome (the same as
the whole run's is the point), and the images each sequential criterion was decided on.

Plans: the demo plan (``server/cli/plans/demo.yaml``, the Fashion-MNIST CNN) and the same
plan against the adversarially trained ``fmnist-cnn-at``, with criteria fitting that model
(accuracy, the corruption average, FGSM's and Square's success rates). Reference: the whole
run of the same plan in the same process. Prints JSON; never part of the test run.

    python bench/sequential_plans.py [--plans demo,at] [--limit 500]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import command_line, machine  # noqa: E402 - bench/_report.py

ROOT = Path(__file__).resolve().parent.parent
DEMO = (ROOT / "server" / "cli" / "plans" / "demo.yaml").read_text()
#: The adversarially trained model's criteria: its clean accuracy is lower and its attacks'
#: success rates much lower than the plain CNN's.
AT_CRITERIA = {"accuracy": ">= 0.75", "average_robustness_corr": ">= 0.45",
               "attacks.fgsm.success_rate": "<= 0.4", "attacks.square.success_rate": "<= 0.6"}


def _with_acceptance(text: str, criteria: dict[str, str], sequential: str | None,
                     target: str | None, limit: int) -> str:
    head = text[:text.index("\nacceptance:")]
    if target:
        head = re.sub(r"(?m)^target:\n  name: fmnist-cnn\n", f"target:\n  name: {target}\n",
                      head)
        head = head.replace("endpoint: builtin:fmnist-cnn", f"endpoint: builtin:{target}")
    head = re.sub(r"(?m)^  limit: 500$", f"  limit: {limit}", head)
    lines = [f"  sequential: {sequential}"] if sequential else []
    lines += [f'  {k}: "{v}"' for k, v in criteria.items()]
    return head + "\nacceptance:\n" + "\n".join(lines) + "\n"


def _demo_criteria() -> dict[str, str]:
    block = DEMO[DEMO.index("\nacceptance:"):].splitlines()[1:]
    out = {}
    for line in block:
        m = re.match(r'\s+([\w.]+):\s+"([^"]+)"', line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def run_plan(fc: Any, text: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    ev = fc.submit(text)
    final = fc.wait(ev.evaluation_id, timeout_s=3600)
    state = final.state.name if hasattr(final.state, "name") else str(final.state)
    if state != "SUCCEEDED":
        raise SystemExit(f"{ev.evaluation_id} ended {state}: {final.error.message}")
    with tempfile.TemporaryDirectory() as out:
        js, _ = fc.write_report(ev.evaluation_id, Path(out))
        report = json.loads(js.read_text())
    v = report["verdict"]
    seq = report.get("sequential") or {}
    return {"queries": report["ledger"]["total_queries"], "seconds": round(
        time.perf_counter() - t0, 1), "verdict": v["status"],
        "criteria": {c["metric"]: c["outcome"] for c in v["criteria"]},
        "decided_on_images": {c["metric"]: f"{c['images']}/{c['population']}"
                              for c in seq.get("criteria") or ()},
        "queries_saved_estimate": seq.get("queries_saved_estimate")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", default="demo,at")
    ap.add_argument("--limit", type=int, default=500, help="images of each plan")
    args = ap.parse_args()
    from fortis.client import FortisClient
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    plans = {"demo": (_demo_criteria(), None), "at": (AT_CRITERIA, "fmnist-cnn-at")}
    key = "bench-key"
    out: dict[str, Any] = {"machine": machine(), "command": command_line(), "plans": {}}
    with tempfile.TemporaryDirectory() as tmp:
        stack = start_stack(StackSettings(
            state_dir=Path(tmp), api_keys={key: "bench"},
            targets=[TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn"),
                     TargetConfig.parse("fmnist-cnn-at=builtin:fmnist-cnn-at")]))
        try:
            with FortisClient(stack.address, api_key=key, timeout_s=600) as fc:
                for name in args.plans.split(","):
                    criteria, target = plans[name]
                    row = {}
                    for variant, seq in (("whole", None), ("sequential", "true"),
                                         ("sequential_skip", "{unreferenced: skip}")):
                        row[variant] = run_plan(fc, _with_acceptance(
                            DEMO, criteria, seq, target, args.limit))
                    whole = row["whole"]
                    for variant in ("sequential", "sequential_skip"):
                        r = row[variant]
                        r["queries_ratio"] = round(r["queries"] / whole["queries"], 4)
                        r["same_verdict"] = r["criteria"] == whole["criteria"]
                    out["plans"][name] = row
        finally:
            stack.stop(0)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
