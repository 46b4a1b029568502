"""Multi-target plans (CANARY benchmarks, CAN-7) fanned out to ``fortis worker`` processes, as
single-target plans are: the evaluation service's ``--executor processes`` starts
real worker processes that run every model's work items (each model's keys under ``m<k>/``,
its proxy sessions under ``<evaluation>.m<k>``, the transfer examples shared by name) under
leased claims in the store; the service then scores and reports.

- Two workers give the same metrics and the same benchmark section (matrix, two-way squeeze,
  IRT) as the single-process run, both run items, and the transfer examples are crafted once
  (one artifact per shared setting).
- A worker SIGKILLed while it holds an item of the second model: its lease runs out, the item
  is claimed again and rerun (a second attempt, finished by another worker), the evaluation
  finishes, and every number equals the single-process run's (the plan has no query attack:
  a transfer item rerun from its stored examples gives the same answers).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from fortis.client import FortisClient, progress_of

from tests.conftest import API_KEY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PLAN = """
name: bench-fan-out
seed: 5
targets:
  - {name: fmnist-cnn, surrogate: fmnist-cnn}
  - {name: fmnist-mlp, surrogate: fmnist-mlp}
dataset: {source: fashion-mnist, split: test, limit: 64}
correctness: {mode: top1}
corruptions: [{id: gaussian_noise, severities: [1, 4]}]
attacks:
  - {id: pgd, params: {epsilon: 0.1, steps: 20}}
  - {id: square, params: {epsilon: 0.1, max_queries: 30}, limit: 16}
execution: {batch_size: 8}
"""
#: The kill test's plan: no query attack, so a rerun item gives exactly the same numbers.
PLAN_NO_QUERY = PLAN.replace(
    "  - {id: square, params: {epsilon: 0.1, max_queries: 30}, limit: 16}\n", "")


def _start(tmp: Path, **kw: Any) -> Any:
    from fortis.server.app.stack import DEFAULT_TARGETS, StackSettings, TargetConfig, start_stack

    return start_stack(StackSettings(
        state_dir=tmp / "state", api_keys={API_KEY: "tenant-a"},
        targets=[TargetConfig.parse(t) for t in DEFAULT_TARGETS],
        whitebox_grants={"tenant-a": frozenset({"*"})},  # twins: granted
        internal_key="internal-test-key", **kw))


def _run(stack: Any, plan: str, evaluation_id: str) -> dict[str, Any]:
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        fc.submit(plan, evaluation_id=evaluation_id)
        final = fc.wait(evaluation_id, timeout_s=800)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
        return fc.report(evaluation_id)


def _items(state: Path, evaluation_id: str) -> list[tuple[str, int, int, str]]:
    with sqlite3.connect(state / "evaluations.sqlite") as conn:
        return [(str(k), int(a), int(d), str(o)) for k, a, d, o in conn.execute(
            "SELECT item_key, attempts, done, lease_owner FROM items WHERE evaluation_id=?",
            (evaluation_id,)).fetchall()]


def _same_numbers(report: dict[str, Any], ref: dict[str, Any], *, skip: tuple[str, ...] = ()
                  ) -> None:
    m, r = report["metrics"], ref["metrics"]
    for key in ("accuracy", "m", "corruptions", "average_robustness_corr",
                "worstcase_robustness_corr"):
        assert m[key] == r[key], key
    for name, a in r["attacks"].items():
        if name not in skip:
            assert m["attacks"][name] == a, name
    b, rb = report["benchmark"], ref["benchmark"]
    for key in ("model_names", "sources", "attacks", "models", "matrix", "matrix_square",
                "twoway", "irt"):
        if key == "models" and skip:
            continue
        assert b[key] == rb[key], key


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory, fmnist_target: Any,
           fmnist_surrogate: Any) -> dict[str, dict[str, Any]]:
    """Both plans run by one process (the references)."""
    stack = _start(tmp_path_factory.mktemp("bench-single"))
    try:
        return {"plan": _run(stack, PLAN, "ev-bfan"),
                "no_query": _run(stack, PLAN_NO_QUERY, "ev-bkill")}
    finally:
        stack.stop(0)


def test_benchmark_on_two_worker_processes_equals_the_single_process_run(tmp_path, single):
    ref = single["plan"]
    stack = _start(tmp_path, executor="processes", worker_processes=2)
    try:
        t0 = time.monotonic()
        report = _run(stack, PLAN, "ev-bfan")
        seconds = time.monotonic() - t0
        exits = [(e.index, e.code) for e in stack.manager.executor.exits]
    finally:
        stack.stop(0)
    rows = _items(tmp_path / "state", "ev-bfan")
    owners: dict[str, int] = {}
    for _, _, done, owner in rows:
        if done:
            owners[owner] = owners.get(owner, 0) + 1
    print(json.dumps({"items_by_worker": owners, "seconds": round(seconds, 2),
                      "items": len(rows), "exits": exits,
                      "matrix": report["benchmark"]["matrix"]}))
    assert all(done for _, _, done, _ in rows)
    assert any(k.startswith("m1/") for k, _, _, _ in rows)       # the second model's items
    assert len([o for o in owners if o]) == 2, owners            # both workers ran items
    assert sorted(exits) == [(0, 0), (1, 0)], exits
    _same_numbers(report, ref)
    # the primary's proxy sessions answered what the single run's did
    assert report["ledger"]["sessions"] == ref["ledger"]["sessions"]


def test_a_killed_worker_s_item_of_the_second_model_is_rerun(tmp_path, single):
    ref = single["no_query"]
    stack = _start(tmp_path, executor="processes", worker_processes=2, worker_lease_s=3.0)
    state = tmp_path / "state"
    victim_item = victim = ""
    try:
        with FortisClient(stack.address, api_key=API_KEY) as fc:
            fc.submit(PLAN_NO_QUERY, evaluation_id="ev-bkill")
            deadline = time.time() + 600
            while time.time() < deadline and not victim_item:
                pids = stack.manager.executor.pids()
                for key, attempts, done, owner in _items(state, "ev-bkill"):
                    pid = next((p for p in pids if f"-{p}-i" in owner), None)
                    # an item of the second model the worker has started (not only claimed)
                    if key.startswith("m1/") and not done and attempts and pid is not None:
                        os.killpg(pid, signal.SIGKILL)
                        victim_item, victim = key, owner
                        break
                else:
                    time.sleep(0.01)
            assert victim_item, "no item of the second model was seen leased"
            final = fc.wait("ev-bkill", timeout_s=800)
            assert progress_of(final).state == "SUCCEEDED", final.error.message
            report = fc.report("ev-bkill")
            exits = [(e.index, e.code) for e in stack.manager.executor.exits]
    finally:
        stack.stop(0)
    rows = {k: (a, d, o) for k, a, d, o in _items(state, "ev-bkill")}
    attempts, done, owner = rows[victim_item]
    print(json.dumps({"killed_item": victim_item, "killed_worker": victim,
                      "attempts": attempts, "finished_by": owner, "exits": exits}))
    # claimed again after the lease and rerun (a second attempt) by another worker
    assert done and attempts >= 2 and owner != victim, (rows[victim_item], victim)
    assert any(code == -signal.SIGKILL for _, code in exits), exits
    _same_numbers(report, ref)
