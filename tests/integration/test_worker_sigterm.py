"""A worker told to stop mid-shard (SIGTERM: a worker pod killed mid-shard leaves its items to
be claimed again, with no double-counted queries; CAN-9 resumable work items, IEEE-M6 queries
counted per image at the proxy).

The evaluation service runs with ``--executor processes``: two ``fortis worker`` processes,
each with ``JOB_COMPLETION_INDEX`` as an Indexed Job's pod has it, and a failed index
restarted as the Job's backoff restarts a pod. While the workers run the corruption items,
one worker gets SIGTERM, what the kubelet sends a pod it deletes or evicts. The worker:

- exits 143 within seconds, at an item boundary: the items it has in flight (held at the
  target when the signal comes) run to their end and are committed, and the leases of its
  other items are given back;
- leaves its unfinished items to be claimed again (by the other worker or the restarted
  index) at once: the lease is 60 s, and the evaluation ends long before it would run out;
- sends no query twice: every image of the clean pass, of each corruption setting and of the
  transfer attack reaches the target once (48 ledger rows per origin, each image once), no
  row is left in flight, and the ledger's rows equal the images the counting target received.

Everything is real: the stack (SQLite, the embedded default), the worker processes, gRPC,
and a target served here that records every image it receives (tests/e2e/_crash_target.py).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from fortis.client import FortisClient, progress_of

from tests.conftest import API_KEY
from tests.e2e._crash_target import start_target
from tests.integration.test_worker_fanout import PLAN, _owners, _start

IMAGES = 48                    # the plan's dataset limit
QUERY_ATTACK = "square"        # its rows per image vary with the attack (Q_m)


class HoldAll:
    """Once the clean pass has reached the target, the target holds every call it receives
    (after recording its images) until released: the corruption items of both workers wait
    there, in flight. Released within 20 s at most (the proxy gives a target 30 s)."""

    def __init__(self) -> None:
        self.armed = True
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.held = 0

    def __call__(self, count: int) -> None:
        if not self.armed or count <= IMAGES:
            return
        with self._lock:
            self.held += 1          # calls held now
        self.release.wait(20)
        with self._lock:
            self.held -= 1


@pytest.fixture()
def recording(fmnist_target) -> Iterator:
    server, address, target = start_target(fmnist_target)
    yield address, target
    server.stop(0)


def _rows(state: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(state / "ledger.sqlite") as conn:
        return [(str(o), str(i), str(s)) for o, i, s in conn.execute(
            "SELECT origin, image_id, status FROM queries")]


def _running_items(state: Path, evaluation_id: str) -> dict[str, int]:
    """Unfinished items claimed now, by worker name."""
    with sqlite3.connect(state / "evaluations.sqlite") as conn:
        return {str(o): int(n) for o, n in conn.execute(
            "SELECT lease_owner, COUNT(*) FROM items WHERE evaluation_id=? AND done=0 AND "
            "lease_owner != '' GROUP BY lease_owner", (evaluation_id,))}


@pytest.mark.slow
def test_a_worker_sigtermed_mid_shard_stops_at_an_item_boundary(tmp_path, recording, capfd):
    address, target = recording
    hold = HoldAll()
    target.on_call = hold
    stack = _start(tmp_path, address, executor="processes", worker_processes=2,
                   worker_lease_s=60.0)
    try:
        with FortisClient(stack.address, api_key=API_KEY) as fc:
            fc.submit(PLAN, evaluation_id="ev-term")
            # each worker runs at most 2 items at once: 3 calls held at the target are items
            # of both workers in flight, mid-shard
            deadline = time.monotonic() + 300
            while hold.held < 3:
                assert time.monotonic() < deadline, "the items never reached the target"
                time.sleep(0.01)
            executor = stack.manager.executor
            pids = executor.pids()
            assert len(pids) == 2, pids
            # the worker to stop: one holding an unfinished item now (its name has its pid)
            running = _running_items(tmp_path / "state", "ev-term")
            victim = next(p for p in pids if any(f"-{p}-i" in o for o in running))
            signalled_at = time.time()
            os.kill(victim, signal.SIGTERM)
            received_at_signal = target.count()
            time.sleep(0.5)             # the signal is handled while its items are in flight
            hold.armed = False
            hold.release.set()
            final = fc.wait("ev-term", timeout_s=300)
            finished_at = time.time()
            assert progress_of(final).state == "SUCCEEDED", progress_of(final)
            exits = list(executor.exits)
    finally:
        hold.release.set()
        stack.stop(0)
    out = capfd.readouterr().out
    results = [json.loads(line) for line in out.splitlines() if line.startswith('{"state"')]
    print(json.dumps({"exits": [(e.index, e.code, round(e.at - signalled_at, 2)) for e in exits],
                      "worker_results": results, "received": target.count(),
                      "seconds_after_sigterm": round(finished_at - signalled_at, 2)}))

    stopped = [e for e in exits if e.code != 0]
    assert len(stopped) == 1 and stopped[0].code == 143, exits     # SIGTERM: 143, no crash
    assert stopped[0].at - signalled_at < 10, "the worker did not stop at an item boundary"
    stopped_result, = [r for r in results if r["state"] == "stopped"]
    assert stopped_result["ran"] >= 1, results     # its items in flight were committed
    assert received_at_signal < target.count()         # and the evaluation went on after
    # its items were given back, not waited out (the lease is 60 s)
    assert finished_at - signalled_at < 50
    assert len([o for o in _owners(tmp_path / "state", "ev-term") if o]) >= 2

    rows = _rows(tmp_path / "state")
    assert {s for _, _, s in rows} == {"OK"}, Counter(s for _, _, s in rows)   # none in flight
    per_origin = Counter(o for o, _, _ in rows if o != QUERY_ATTACK)
    assert set(per_origin.values()) == {IMAGES}, per_origin     # no image sent twice
    for origin in per_origin:
        assert len({i for o, i, _ in rows if o == origin}) == IMAGES, origin
    assert len(rows) == target.count()         # IEEE-M6: ledger rows = images received
