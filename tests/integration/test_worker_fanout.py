"""Work fan-out: an evaluation's work items run in several worker processes
(``fortis worker``, each with ``JOB_COMPLETION_INDEX`` as an Indexed Job pod has it) that
share them through exclusive leased claims in the store, and the evaluation service scores
what they computed. SPEC: CAN-9 (resumable, deterministic work items), IEEE-M6 (queries
counted per image at the proxy; Q_m).

Everything is real: the stack (SQLite files, the embedded default), two worker processes
started by the evaluation service's ``--executor processes``, and a gRPC target served here
that records every image it receives.

- Two workers give the same metrics as the single-process run, both workers run items, and
  the ledger's answered queries equal the images the target received.
- A worker SIGKILLed during the query attacks: its lease runs out, its items are claimed
  again (by the restarted index: the executor's backoff, as a Job's), the evaluation
  finishes, the ledger still equals what the target received, and every measurement but the
  interrupted query attack equals the single-process run's.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fortis.client import FortisClient, progress_of

from tests.conftest import API_KEY
from tests.e2e._crash_target import start_target

PLAN = """
name: fan-out
seed: 7
target: {name: own, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 48}
correctness: {mode: top1}
corruptions:
  - {id: gaussian_noise, severities: [1, 4]}
  - {id: contrast, severities: [3]}
attacks:
  - {id: fgsm, surrogate: fmnist-surrogate, params: {epsilon: 0.15}}
  - {id: square, params: {epsilon: 0.1, max_queries: 30}}
execution: {batch_size: 8}
"""


def _start(tmp: Path, target_address: str, **kw) -> object:
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    return start_stack(StackSettings(
        state_dir=tmp / "state", api_keys={API_KEY: "tenant-a"},
        targets=[TargetConfig.parse(f"own=grpc://{target_address}")],
        internal_key="internal-test-key", **kw))


@pytest.fixture()
def recording(fmnist_target) -> Iterator:
    server, address, target = start_target(fmnist_target)
    yield address, target
    server.stop(0)


def _run(stack, evaluation_id: str) -> dict:
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        fc.submit(PLAN, evaluation_id=evaluation_id)
        final = fc.wait(evaluation_id, timeout_s=600)
        assert progress_of(final).state == "SUCCEEDED", progress_of(final)
        return fc.report(evaluation_id)


def _owners(state: Path, evaluation_id: str) -> dict[str, int]:
    with sqlite3.connect(state / "evaluations.sqlite") as conn:
        rows = conn.execute("SELECT lease_owner, COUNT(*) FROM items WHERE evaluation_id=? AND"
                            " done=1 GROUP BY lease_owner", (evaluation_id,)).fetchall()
    return {str(o): int(n) for o, n in rows}


def _answered(report: dict) -> int:
    return sum(int(v) for v in report["ledger"]["sessions"].values())


@pytest.fixture(scope="module")
def single(tmp_path_factory, fmnist_target, fmnist_surrogate) -> tuple[dict, int]:
    """The plan run by one process (the reference), and the images its target received."""
    server, address, target = start_target(fmnist_target)
    stack = _start(tmp_path_factory.mktemp("single"), address)
    try:
        report = _run(stack, "ev-fan")
        return report, target.count()
    finally:
        stack.stop(0)
        server.stop(0)


@pytest.mark.slow
def test_two_worker_processes_equal_the_single_process_run(tmp_path, recording, single):
    address, target = recording
    ref, ref_received = single
    stack = _start(tmp_path, address, executor="processes", worker_processes=2)
    try:
        t0 = time.monotonic()
        report = _run(stack, "ev-fan")
        seconds = time.monotonic() - t0
    finally:
        stack.stop(0)
    owners = _owners(tmp_path / "state", "ev-fan")
    print(json.dumps({"items_by_worker": owners, "seconds": round(seconds, 2),
                      "received": target.count(), "single_received": ref_received}))
    assert report["metrics"] == ref["metrics"]
    assert len([o for o in owners if o]) == 2, owners       # both workers ran items
    # the ledger is what the target saw, and the same as the single run's
    assert _answered(report) == target.count() == ref_received


@pytest.mark.slow
def test_a_killed_worker_s_items_are_claimed_again(tmp_path, recording, single):
    address, target = recording
    ref, _ = single
    stack = _start(tmp_path, address, executor="processes", worker_processes=2,
                   worker_lease_s=3.0)
    killed = False
    try:
        with FortisClient(stack.address, api_key=API_KEY) as fc:
            fc.submit(PLAN, evaluation_id="ev-fan")
            # clean 48 + corruptions 3 x 48 + fgsm 48 = 240 images before the query attack
            deadline = time.time() + 300
            while time.time() < deadline and target.count() < 260:
                time.sleep(0.02)
            pids = stack.manager.executor.pids()
            assert len(pids) == 2, pids
            os.killpg(pids[0], signal.SIGKILL)
            killed = True
            final = fc.wait("ev-fan", timeout_s=600)
            assert progress_of(final).state == "SUCCEEDED", progress_of(final)
            report = fc.report("ev-fan")
    finally:
        stack.stop(0)
    assert killed
    owners = _owners(tmp_path / "state", "ev-fan")
    print(json.dumps({"items_by_worker": owners, "received": target.count()}))
    assert len(owners) >= 2, owners
    assert _answered(report) == target.count()
    m, r = report["metrics"], ref["metrics"]
    # the query attack's interrupted chunk was rerun from its recorded queries; everything
    # else is computed from items no kill touched, or rerun deterministically
    for key in ("accuracy", "m", "corruptions", "average_robustness_corr",
                "average_robustness_corr_by_severity", "worstcase_robustness_corr",
                "worstcase_robustness_corr_by_severity", "ranking"):
        assert m[key] == r[key], key
    assert m["attacks"]["fgsm"] == r["attacks"]["fgsm"]     # the transfer attack


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fortis.server.cli", *args], capture_output=True,
                          text=True, timeout=120,
                          env={k: v for k, v in {**os.environ, **(env or {})}.items()
                               if v is not None})


def test_worker_and_executor_settings_are_refused_naming_the_setting(tmp_path):
    clean = {"FORTIS_EVALUATION_ID": None, "FORTIS_TENANT": None, "POD_NAMESPACE": None,
             "FORTIS_INTERNAL_KEY": None, "FORTIS_PROXY_ADDRESS": None}
    r = _cli("worker", env=clean)
    assert r.returncode == 2 and "evaluation_id" in r.stderr, r.stderr
    r = _cli("worker", "--evaluation-id", "ev", "--tenant", "t", "--index", "x", env=clean)
    assert r.returncode == 2 and "index" in r.stderr and "JOB_COMPLETION_INDEX" in r.stderr
    r = _cli("worker", "--evaluation-id", "ev", "--tenant", "t", "--proxy-address", "a:1",
             "--perturbation-address", "a:1", "--state-dir", str(tmp_path),
             env={**clean, "FORTIS_INTERNAL_KEY": "k"})
    assert r.returncode == 2 and "state_dir" in r.stderr, r.stderr      # no store there
    r = _cli("serve", "--address", "127.0.0.1:0", "--state-dir", str(tmp_path),
             "--executor", "kubernetes", "--job-namespace", "team-a", env=clean)
    assert r.returncode == 2 and "job_image" in r.stderr, r.stderr
    r = _cli("serve", "--address", "127.0.0.1:0", "--state-dir", str(tmp_path),
             "--executor", "kubernetes", "--job-namespace", "Team_A", "--job-image", "i:1",
             env=clean)
    assert r.returncode == 2 and "namespace" in r.stderr, r.stderr
