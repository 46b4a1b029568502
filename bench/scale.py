#!/usr/bin/env python3
"""Scale-out of an evaluation's work items (issue 10, "Performance": ``bench/scale.py``).

One plan of corruptions over Fashion-MNIST is run end to end (clean pass, every corruption
at every severity, scoring, report) by:

- ``embedded``: one process, the evaluation service's own worker threads (the default);
- ``processes-K``: the evaluation service with ``--executor processes`` and K local
  ``fortis worker`` processes sharing the items through claims in the store, with K
  perturbation replicas (``fortis serve --service perturbation``): worker i corrupts on
  replica i mod K, so the corruption compute is spread over processes as Kubernetes spreads it
  over perturbation pods. The store is SQLite files (one machine) or, with
  ``--database-url``, PostgreSQL.

For each mode: the wall time of the whole evaluation, images/s through the proxy (every
image sent to the target and recorded in the ledger), and whether the metrics equal the
embedded run's (they must: workers compute the same items). Prints JSON; never part of the
test run. The machine has 2 cores, so K > 2 measures overhead, not speed-up.

    python bench/scale.py [--images 1000] [--corruptions all|gaussian_noise,contrast,...]
                          [--severities 1,2,3,4,5] [--workers 1,2,4] [--batch 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KEY = "bench-key"
INTERNAL = "bench-internal-key"


def _plan(n: int, corruptions: list[str], severities: list[int], batch: int) -> str:
    corr = ", ".join(f"{{id: {c}, severities: [{', '.join(map(str, severities))}]}}"
                     for c in corruptions)
    return (f"name: scale\nseed: 3\ntarget: {{name: fmnist-cnn, task: classification}}\n"
            f"dataset: {{source: fashion-mnist, split: test, limit: {n}}}\n"
            f"correctness: {{mode: top1}}\ncorruptions: [{corr}]\n"
            f"execution: {{batch_size: {batch}}}\n")


def _replica(state: Path) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, FORTIS_INTERNAL_KEY=INTERNAL, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "fortis.cli", "serve", "--address",
                             "127.0.0.1:0", "--service", "perturbation", "--state-dir",
                             str(state), "--no-auth", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line:
        raise SystemExit("a perturbation replica did not start")
    return proc, json.loads(line)["address"]


def run(mode: str, workers: int, plan: str, database_url: str | None) -> dict:
    from fortis.client import FortisClient, progress_of
    from fortis.services.app import StackSettings, TargetConfig, start_stack

    with tempfile.TemporaryDirectory() as tmp:
        replicas: list[tuple[subprocess.Popen, str]] = []
        extra: dict = {}
        if workers:
            replicas = [_replica(Path(tmp) / f"pt{i}") for i in range(workers)]
            extra = {"executor": "processes", "worker_processes": workers,
                     "worker_perturbation_addresses": [a for _, a in replicas]}
        if database_url:
            extra["database_url"] = database_url
        stack = start_stack(StackSettings(
            state_dir=Path(tmp) / "state", api_keys={KEY: "bench"}, internal_key=INTERNAL,
            targets=[TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn")], **extra))
        try:
            with FortisClient(stack.address, api_key=KEY, timeout_s=600) as fc:
                t0 = time.perf_counter()
                ev = fc.submit(plan)
                final = fc.wait(ev.evaluation_id, timeout_s=7200)
                seconds = time.perf_counter() - t0
                state = progress_of(final).state
                report = fc.report(ev.evaluation_id) if state == "SUCCEEDED" else {}
        finally:
            stack.stop(0)
            for proc, _ in replicas:
                proc.terminate()
                proc.wait(30)
    sent = sum(int(v) for v in report.get("ledger", {}).get("sessions", {}).values())
    return {"mode": mode, "workers": workers, "state": state, "seconds": round(seconds, 2),
            "images_sent": sent, "images_per_s": round(sent / seconds, 1) if seconds else 0.0,
            "metrics": report.get("metrics")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--corruptions", default="gaussian_noise,contrast,brightness,"
                    "defocus_blur,jpeg_compression")
    ap.add_argument("--severities", default="1,3,5")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--database-url", default=os.environ.get("FORTIS_DATABASE_URL") or None)
    ns = ap.parse_args()
    from fortis.cli.logs import configure

    configure("error")
    corruptions = ns.corruptions.split(",")
    if corruptions == ["all"]:
        from fortis.services.app import local_catalogue
        corruptions = sorted(k for k, e in local_catalogue().perturbations.items()
                             if e.kind == "corruption")     # every corruption listed
    plan = _plan(ns.images, corruptions, [int(s) for s in ns.severities.split(",")], ns.batch)
    rows = [run("embedded", 0, plan, ns.database_url)]
    for k in (int(w) for w in ns.workers.split(",") if w):
        rows.append(run(f"processes-{k}", k, plan, ns.database_url))
    ref = rows[0]["metrics"]
    for r in rows:
        r["metrics_equal_embedded"] = r.pop("metrics") == ref
        r["speedup_vs_embedded"] = round(rows[0]["seconds"] / r["seconds"], 3) \
            if r["seconds"] else 0.0
    print(json.dumps({"benchmark": "work fan-out (issue 10)", "images": ns.images,
                      "corruptions": corruptions, "severities": ns.severities,
                      "store": "postgresql" if ns.database_url else "sqlite",
                      "cpus": os.cpu_count(), "rows": rows,
                      "python": platform.python_version()}, indent=2))


if __name__ == "__main__":
    main()
