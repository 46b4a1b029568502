#!/usr/bin/env python3
"""The corruption stage of an evaluation against the bare target model, in one run.

Reference: the project's Fashion-MNIST CNN alone (``predict_proba`` on uint8 batches of the
plan's batch size, one torch thread), images/s. Measured: an embedded Fortis (all five
services and the built-in target in this process, one torch thread, loopback gRPC) running a
plan of corruptions only; the corruption stage's throughput is the images it sent to the
target (through the perturbation service and the proxy, every query recorded in the ledger)
divided by the time between the stage's first and last progress update, read from
WatchEvaluation. The machine is shared and noisy, so each round pairs a bare pass (best of
two) with one stage run and the median of the rounds' ratios is reported. The goal of the
architecture issue: the stage at >= 50% of the bare model.
Prints JSON; never part of the test run.

    python bench/evaluation.py [--images 2000] [--corruption brightness] [--batch 64]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path


def bare_model(images, batch: int, repeats: int) -> float:
    """Images/s of the target model alone (best of ``repeats`` passes)."""
    from fortis.adapters.builtin import load_model

    model = load_model("fmnist-cnn")
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        for s in range(0, len(images), batch):
            model.predict_proba(images[s:s + batch])
        best = max(best, len(images) / (time.perf_counter() - t0))
    return best


def _one_stage(n: int, corruption: str, batch: int) -> dict:
    from fortis.client import FortisClient
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    key = "bench-key"
    plan = (f"name: bench\nseed: 1\ntarget: {{name: fmnist-cnn}}\n"
            f"dataset: {{source: fashion-mnist, split: test, limit: {n}}}\n"
            f"corruptions: [{{id: {corruption}, severities: [1, 2, 3, 4, 5]}}]\n"
            f"execution: {{batch_size: {batch}}}\n")
    with tempfile.TemporaryDirectory() as tmp:
        stack = start_stack(StackSettings(state_dir=Path(tmp), api_keys={key: "bench"},
                                          targets=[TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn")]))
        try:
            with FortisClient(stack.address, api_key=key, timeout_s=600) as fc:
                ev = fc.submit(plan)
                marks: dict[str, list[float]] = {}
                for e in fc.watch(ev.evaluation_id, timeout_s=1800):
                    marks.setdefault(e.progress.stage, []).append(time.perf_counter())
                final = fc.get(ev.evaluation_id)
        finally:
            stack.stop(0)
    stages = list(marks)
    i = stages.index("corruptions")
    start = marks["corruptions"][0]
    end = marks[stages[i + 1]][0] if i + 1 < len(stages) else marks["corruptions"][-1]
    sent = n * 5
    return {"state": final.state.name if hasattr(final.state, "name") else str(final.state),
            "images_sent": sent, "seconds": round(end - start, 3),
            "images_per_s": round(sent / (end - start), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--corruption", default="brightness")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="paired bare/stage measurements")
    ns = ap.parse_args()
    import torch
    from fortis.adapters.torch_models.datasets import load_fashion_mnist
    from fortis.server.cli.logs import configure

    configure("warning")            # logs to stderr: stdout is the JSON result

    torch.set_num_threads(1)
    images, _ = load_fashion_mnist("test", limit=ns.images)
    rounds = []
    for _ in range(ns.rounds):      # the machine is shared: pair each stage with a bare pass
        bare = bare_model(images, ns.batch, repeats=2)
        stage = _one_stage(ns.images, ns.corruption, ns.batch)
        rounds.append({"bare_model_images_per_s": round(bare, 1), "corruption_stage": stage,
                       "ratio": round(stage["images_per_s"] / bare, 3)})
    ratios = sorted(r["ratio"] for r in rounds)
    print(json.dumps({
        "benchmark": "corruption stage vs bare model", "corruption": ns.corruption,
        "images": ns.images, "batch_size": ns.batch, "torch_threads": 1, "rounds": rounds,
        "ratio_stage_to_bare_median": ratios[len(ratios) // 2], "goal_ratio": 0.5,
        "python": platform.python_version(), "machine": platform.machine()}, indent=2))


if __name__ == "__main__":
    main()
