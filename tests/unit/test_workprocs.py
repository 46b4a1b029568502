"""Worker processes for the pieces that would hold a server's interpreter lock
(infra/serving/workprocs.py): answers and errors come back as they were, a caller's stop
kills the computation (the process, not a flag it may never look at), a dying worker fails
only its own call, and the pool never runs more processes than it was given. Real processes
(a fork server), real metric code from the scoring catalogue."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from fortis.infra.serving.workprocs import PieceProcesses
from fortis.infra.serving.workshare import WORK_NICE
from fortis.services.common import errors
from fortis.services.scoring.catalogue import compute


@pytest.fixture
def pieces():
    p = PieceProcesses(1, preload=["fortis.services.scoring.catalogue"])
    yield p
    p.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie not yet reaped still answers kill(0): look at its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_metric_computed_in_a_worker_is_the_metric_computed_here(pieces):
    rng = np.random.default_rng(0)
    params = {"subjects": ["a", "b", "c"], "chain_length": 300, "burn_in": 100, "seed": 3,
              "metrics": [{"name": f"m{j}", "category": "c", "higher_is_better": True,
                           "values": [float(v) for v in rng.random(3)]} for j in range(4)]}
    here = compute("irt", {}, params)
    there = pieces.call(compute, "irt", {}, params)
    assert there == here
    assert pieces.call(os.getpid) != os.getpid()


def test_an_error_comes_back_as_its_class_with_its_fields(pieces):
    with pytest.raises(errors.InvalidArgument) as exc:
        pieces.call(compute, "no-such-metric", {}, {})
    with pytest.raises(errors.InvalidArgument) as here:
        compute("no-such-metric", {}, {})
    assert str(exc.value) == str(here.value)
    assert exc.value.violations == here.value.violations
    with pytest.raises(ValueError, match="math domain error"):
        pieces.call(math.sqrt, -1.0)


def test_a_callers_stop_kills_the_computation_and_the_next_call_gets_a_new_worker(pieces):
    first = pieces.call(os.getpid)
    deadline = time.monotonic() + 0.3

    def stop() -> bool:
        if time.monotonic() > deadline:
            raise errors.DeadlineExceeded("the caller's deadline passed")
        return False

    with pytest.raises(errors.DeadlineExceeded):
        pieces.call(time.sleep, 600, should_stop=stop)
    assert not _alive(first)
    second = pieces.call(os.getpid)
    assert second != first and _alive(second)


def test_a_worker_that_dies_fails_its_own_call_only(pieces):
    pid = pieces.call(os.getpid)
    with pytest.raises(errors.Internal, match="signal 9"):
        pieces.call(os.kill, pid, 9)
    assert pieces.call(os.getpid) not in (pid, os.getpid())


def test_workers_run_at_a_lower_priority_than_the_server(pieces):
    mine = os.getpriority(os.PRIO_PROCESS, os.getpid())
    assert pieces.call(os.getpriority, os.PRIO_PROCESS, 0) == min(19, mine + WORK_NICE)


def test_no_more_processes_than_given_run_at_once():
    p = PieceProcesses(2)
    try:
        pids: list[int] = []
        lock = threading.Lock()

        def one() -> None:
            p.call(time.sleep, 0.2)
            pid = p.call(os.getpid)
            with lock:
                pids.append(pid)

        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(pids) == 6 and len(set(pids)) <= 2
    finally:
        p.close()


def test_a_closed_pool_refuses_calls_and_ends_its_workers():
    p = PieceProcesses(1)
    pid = p.call(os.getpid)
    p.close()
    with pytest.raises(errors.Unavailable):
        p.call(os.getpid)
    for _ in range(50):
        if not _alive(pid):
            break
        time.sleep(0.1)
    assert not _alive(pid)


def test_a_server_started_from_a_script_never_runs_that_script_again(tmp_path):
    """A script (or a notebook, or stdin) that starts a server has no main guard to rely on:
    the workers are fresh interpreters that import only what the pieces need."""
    marks = tmp_path / "runs.txt"
    script = tmp_path / "start.py"
    script.write_text(
        "import os, sys\n"
        f"open({str(marks)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        "from fortis.infra.serving.workprocs import PieceProcesses\n"
        "p = PieceProcesses(1)\n"
        "print(p.call(os.getpid) != os.getpid())\n"
        "p.close()\n")
    for how in (["python", str(script)], ["stdin"]):
        cmd = [sys.executable, str(script)] if how[0] == "python" else [sys.executable, "-"]
        out = subprocess.run(cmd, input=None if how[0] == "python" else script.read_text(),
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-2000:]
    assert len(marks.read_text().split()) == 2      # once per run, never in a worker
