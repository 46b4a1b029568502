"""Issue 9: ``fortis serve`` drains on SIGTERM and exits 0 in bounded time, even with an
evaluation running; the next start on the same state resumes that evaluation (CAN-9)."""

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
