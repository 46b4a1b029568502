"""``fortis serve`` drains on SIGTERM and exits 0 in bounded time, even with an evaluation
running; the next start on the same state resumes that evaluation (CAN-9)."""

from __future__ import annotations

import signal
import subprocess
import time

from fortis.client import FortisClient, progress_of

from tests.conftest import API_KEY
from tests.e2e.test_evaluation import _serve

PLAN = """
name: shutdown
seed: 7
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 1000}
correctness: {mode: top1}
corruptions:
  - {id: gaussian_noise, severities: [1, 3, 5]}
  - {id: contrast, severities: [1, 5]}
execution: {batch_size: 50}
"""


def test_sigterm_drains_exits_and_resumes(tmp_path, fmnist_target):
    state = tmp_path / "state"
    proc, address = _serve(state)
    try:
        with FortisClient(address, api_key=API_KEY) as fc:
            fc.submit(PLAN, evaluation_id="ev-term")
            deadline = time.time() + 120
            while time.time() < deadline:
                p = progress_of(fc.get("ev-term"))
                if p.state == "RUNNING" and p.items_done >= 1:
                    break
                time.sleep(0.05)
            assert p.state == "RUNNING", f"not running when signalled: {p.state}"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(15)
        assert rc == 0 and time.monotonic() - t0 < 15
    except subprocess.TimeoutExpired:
        raise AssertionError("SIGTERM did not stop the server in 15 s") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)

    proc, address = _serve(state)          # restart on the same state: resumes by itself
    try:
        with FortisClient(address, api_key=API_KEY) as fc:
            final = fc.wait("ev-term")
            assert progress_of(final).state == "SUCCEEDED", final.error.message
            assert final.resumed_count == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def test_a_shutdown_mid_item_sends_nothing_twice_after_the_resume(tmp_path, fmnist_target):
    """The embedded default (one process, SQLite): a shutdown (what SIGTERM runs) while two
    corruption items are at the target commits those items when they end, and the next start
    resumes the evaluation without sending their images again: every image of the clean pass,
    of each corruption setting and of the transfer attack reaches the target once, and the
    ledger equals what the (counting) target received (IEEE-M6, CAN-9)."""
    import threading
    from collections import Counter

    from tests.e2e._crash_target import start_target
    from tests.integration.test_worker_fanout import PLAN, _start
    from tests.integration.test_worker_sigterm import IMAGES, QUERY_ATTACK, HoldAll, _rows

    server, address, target = start_target(fmnist_target)
    hold = HoldAll()
    target.on_call = hold
    try:
        stack = _start(tmp_path, address)
        stopper = None
        try:
            with FortisClient(stack.address, api_key=API_KEY) as fc:
                fc.submit(PLAN, evaluation_id="ev-held")
                deadline = time.monotonic() + 300
                while hold.held < 2:          # both items in flight are at the target
                    assert time.monotonic() < deadline, "the items never reached the target"
                    time.sleep(0.01)
            stopper = threading.Thread(target=stack.stop, kwargs={"grace": 10.0})
            stopper.start()
            time.sleep(0.5)                   # the shutdown has begun while they are held
            hold.armed = False
            hold.release.set()
            stopper.join(30)
            assert not stopper.is_alive(), "the stack did not stop"
        finally:
            hold.release.set()
            if stopper is None:
                stack.stop(0)
        stack = _start(tmp_path, address)     # the same state: resumes by itself
        try:
            with FortisClient(stack.address, api_key=API_KEY) as fc:
                final = fc.wait("ev-held", timeout_s=300)
                assert progress_of(final).state == "SUCCEEDED", progress_of(final)
                assert final.resumed_count == 1
        finally:
            stack.stop(0)
    finally:
        server.stop(0)
    rows = _rows(tmp_path / "state")
    assert {s for _, _, s in rows} == {"OK"}, Counter(s for _, _, s in rows)
    per_origin = Counter(o for o, _, _ in rows if o != QUERY_ATTACK)
    assert set(per_origin.values()) == {IMAGES}, per_origin      # no image sent twice
    assert len(rows) == target.count()        # IEEE-M6: ledger rows = images received
