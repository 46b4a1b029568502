#!/usr/bin/env python3
"""The query-attack stage of an evaluation against the bare target model, in one run.

Measured: an embedded Fortis (all five services and the built-in targets in this process,
loopback gRPC, ``--threads`` torch threads) running plans of one query attack each -- Square,
HSJA, SimBA, NES -- on the built-in Fashion-MNIST CNN (``fmnist-cnn``) and on ImageNet
MobileNetV2 at 224 x 224 (``mobilenet-v2``, the offline photos). Every query an attack sends
goes perturbation service -> proxy (budget, ledger row) -> target; the stage's throughput is
the ledger's rows of the attack's sessions divided by the time between the stage's first
progress update and the next stage's, read from WatchEvaluation (the attack's own
computation between queries included).

Reference: the same model object alone (``predict_proba`` on uint8 images, same torch
threads), fed exactly the sequence of batch sizes the attack sent (the ledger's rows grouped
by ``call_id``: the attack's natural batch, call by call; a seeded plan sends the same
calls every round, their order between chunks in flight aside), images/s at the machine's
best: the calls one after the other, and spread over one thread per core as the stage's
chunks in flight are, whichever is faster. The machine is shared, so each round brackets its stage run
with two bare replays (before: the sequence an earlier round's ledger gave, after: this
round's; their mean is the reference), rounds are interleaved, and the median of the rounds'
ratios is reported. A first unmeasured run of each plan gives the first round its sequence. Goal: the stage at >= 0.5x the bare model for each
attack and model.
Prints JSON (flat, stable top-level keys); never part of the test run.

    python bench/attack_stage.py [--models fmnist-cnn,mobilenet-v2]
        [--attacks square,hsja,simba,nes] [--rounds 3] [--threads 1]
        [--fmnist-images 32 --fmnist-batch 16 --fmnist-queries 100]
        [--mobilenet-images 8 --mobilenet-batch 4 --mobilenet-queries 20]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import best_images_per_s, command_line, machine  # noqa: E402 - bench/_report.py

GOAL = 0.5

#: Per attack: its plan entry (``{q}``: the per-image budget Q_m; ``{linf}``, ``{l2}``: the
#: model's bounds in [0, 1] pixel scale).
ATTACKS = {
    "square": "{{id: square, params: {{epsilon: {linf}, max_queries: {q}}}}}",
    "hsja": "{{id: hsja, params: {{epsilon: {l2}, max_queries: {q}}}}}",
    "simba": "{{id: simba, params: {{epsilon: {l2}, max_queries: {q}}}}}",
    "nes": "{{id: nes, params: {{epsilon: {linf}, max_queries: {q}, samples: 10}}}}",
}

#: Per model: the stack's target (as ``fortis serve`` serves it by default), the dataset and
#: the bounds (small enough that most images spend their whole budget: the stage is measured
#: on queries, not on early successes).
MODELS = {
    "fmnist-cnn": ("fmnist-cnn=builtin:fmnist-cnn",
                   "{source: fashion-mnist, split: test, limit: %d}", {"linf": 0.05, "l2": 1.0}),
    "mobilenet-v2": ("mobilenet-v2=builtin:mobilenet-v2?output=top_k&top_k=5",
                     "{source: imagenet-photos, split: test, limit: %d}",
                     {"linf": 0.004, "l2": 0.5}),
}



def plan_text(model: str, attack: str, images: int, batch: int, queries: int) -> str:
    _, dataset, bounds = MODELS[model]
    return (f"name: bench-{attack}\nseed: 1\ntarget: {{name: {model}}}\n"
            f"dataset: {dataset % images}\n"
            f"attacks: [{ATTACKS[attack].format(q=queries, **bounds)}]\n"
            f"execution: {{batch_size: {batch}}}\n")


def stage_run(fc: Any, ledger: Path, plan: str) -> dict[str, Any]:
    """Run ``plan``; the query-attack stage's duration and the batch size of each of its
    query calls, in order (from the ledger)."""
    ev = fc.submit(plan)
    marks: dict[str, float] = {}
    order: list[str] = []
    for e in fc.watch(ev.evaluation_id, timeout_s=1800):
        stage = e.progress.stage
        if stage not in marks:
            marks[stage] = time.perf_counter()
            order.append(stage)
    final = fc.get(ev.evaluation_id)
    state = final.state.name if hasattr(final.state, "name") else str(final.state)
    if state != "SUCCEEDED" or "query_attacks" not in marks:
        raise SystemExit(f"evaluation {ev.evaluation_id} ended {state}: {final}")
    i = order.index("query_attacks")
    end = marks[order[i + 1]] if i + 1 < len(order) else time.perf_counter()
    seconds = end - marks["query_attacks"]
    with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True) as db:
        calls = [n for (n,) in db.execute(
            "SELECT COUNT(*) FROM queries WHERE session_id LIKE ? GROUP BY call_id "
            "ORDER BY MIN(entry_id)", (f"{ev.evaluation_id}/attack/%",))]
    rows = sum(calls)
    return {"evaluation_id": ev.evaluation_id, "ledger_rows": rows, "calls": len(calls),
            "seconds": round(seconds, 3), "queries_per_s": round(rows / seconds, 1),
            "call_sizes": calls}


def bare_replay(model: Any, pool: np.ndarray, sizes: list[int]) -> float:
    """Images/s of the model alone fed batches of ``sizes`` images: in that order, or spread
    over the cores as the stage's chunks in flight are, whichever is faster
    (``best_images_per_s``)."""
    def piece(n: int):
        batch = pool[np.arange(n) % len(pool)]

        def run() -> int:
            return len(model.predict_proba(batch))
        return run

    return best_images_per_s([piece(n) for n in sizes])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="fmnist-cnn,mobilenet-v2")
    ap.add_argument("--attacks", default="square,hsja,simba,nes")
    ap.add_argument("--rounds", type=int, default=3, help="paired bare/stage measurements")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (model and stack)")
    ap.add_argument("--fmnist-images", type=int, default=32)
    ap.add_argument("--fmnist-batch", type=int, default=16, help="the plan's batch_size")
    ap.add_argument("--fmnist-queries", type=int, default=100, help="Q_m per image")
    ap.add_argument("--mobilenet-images", type=int, default=8, help="at most 8 photos")
    ap.add_argument("--mobilenet-batch", type=int, default=4, help="the plan's batch_size")
    ap.add_argument("--mobilenet-queries", type=int, default=20, help="Q_m per image")
    ns = ap.parse_args()
    models = [m for m in ns.models.split(",") if m]
    attacks = [a for a in ns.attacks.split(",") if a]
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r}; known: {', '.join(MODELS)}")
    for a in attacks:
        if a not in ATTACKS:
            ap.error(f"unknown attack {a!r}; known: {', '.join(ATTACKS)}")
    import torch
    from fortis.adapters.builtin import load_model
    from fortis.client import FortisClient
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack
    from fortis.server.cli.logs import configure

    configure("warning")            # logs to stderr: stdout is the JSON result
    torch.set_num_threads(ns.threads)
    size = {"fmnist-cnn": (ns.fmnist_images, ns.fmnist_batch, ns.fmnist_queries),
            "mobilenet-v2": (ns.mobilenet_images, ns.mobilenet_batch, ns.mobilenet_queries)}
    pools = {}
    for m in models:
        model = load_model(m)
        s = model.input_spec
        rng = np.random.default_rng(0)      # content does not change a model's cost
        pools[m] = rng.integers(0, 256, size=(64, s.height, s.width, s.channels), dtype=np.uint8)
        model.predict_proba(pools[m][:8])   # warm-up
    key = "bench-key"
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        stack = start_stack(StackSettings(
            state_dir=Path(tmp), api_keys={key: "bench"},
            targets=[TargetConfig.parse(MODELS[m][0]) for m in models]))
        try:
            with FortisClient(stack.address, api_key=key, timeout_s=600) as fc:
                ledger = Path(tmp) / "ledger.sqlite"
                known = {(m, a): stage_run(fc, ledger, plan_text(m, a, *size[m]))["call_sizes"]
                         for m in models for a in attacks}      # unmeasured: the sequences
                for _ in range(ns.rounds):      # interleaved: every pair in every round
                    for m in models:
                        for a in attacks:
                            before = bare_replay(load_model(m), pools[m], known[(m, a)])
                            st = stage_run(fc, ledger, plan_text(m, a, *size[m]))
                            sizes = st.pop("call_sizes")
                            # chunks run side by side: their calls interleave differently
                            # from run to run, the calls themselves are the same
                            st["same_calls_as_before"] = sorted(sizes) == sorted(known[(m, a)])
                            known[(m, a)] = sizes
                            after = bare_replay(load_model(m), pools[m], sizes)
                            bare = (before + after) / 2
                            st.update(bare_images_per_s=round(bare, 1),
                                      bare_before_after=[round(before, 1), round(after, 1)],
                                      mean_call_size=round(float(np.mean(sizes)), 2),
                                      ratio=round(st["queries_per_s"] / bare, 3))
                            runs.setdefault((m, a), []).append(st)
                            print(f"{m} {a}: {st}", file=sys.stderr, flush=True)
        finally:
            stack.stop(0)
    goals = []
    for (m, a), rs in runs.items():
        ratios = sorted(r["ratio"] for r in rs)
        med = ratios[len(ratios) // 2]
        goals.append({"name": f"{a} on {m}: stage queries/s vs bare model images/s at the "
                              "attack's call sizes", "ratio": med, "target": GOAL,
                      "met": med >= GOAL})
    print(json.dumps({
        "benchmark": "query-attack stage vs bare model",
        "command": command_line(),
        "machine": machine(),
        "goals": goals,
        "rounds": {f"{a} on {m}": rs for (m, a), rs in runs.items()},
        "settings": {"models": models, "attacks": attacks,
                     "images_batch_queries": size, "bounds": {m: MODELS[m][2] for m in models},
                     "plans": {a: ATTACKS[a] for a in attacks}},
    }, indent=2))


if __name__ == "__main__":
    main()
