"""SIGTERM for each of the five services run alone, as the Helm chart runs them: every service
drains in-flight work and exits within the pod's grace period.

Each test starts ``fortis serve --service NAME`` as a process, with the other services'
addresses as the chart gives them, puts a slow call in flight, sends SIGTERM, and checks what
a pod's owner is promised:

- health answers ``NOT_SERVING`` while the server drains (its listener stays open until the
  calls in progress end: probes fail, round_robin clients watching health move away);
- a new call is refused with ``UNAVAILABLE`` ("shutting down") once the announce period
  (``server.ANNOUNCE_S``) has passed;
- the call in flight finishes (OK) or, when it outlasts ``--shutdown-grace``, ends with a clean
  ``UNAVAILABLE``/``CANCELLED``: never a crash, never a hang;
- the process exits 0 within ``--shutdown-grace`` + 3 s (``fortis serve --help``; the chart
  gives the pod ``terminationGracePeriodSeconds`` = grace + 8).

The proxy: no ledger row is left ``IN_FLIGHT``. Rows of a call answered during the drain are
completed; rows of a call cut at the end of the grace period are marked ``INTERRUPTED`` by
the next start, as README "Crashes (kill -9) and the ledger" promises; images the target
received = ledger rows (IEEE-M6: queries counted per image at the proxy). The evaluation
service: the running evaluation stays RUNNING, its WatchEvaluation stream ends
``UNAVAILABLE`` (the SDK reconnects), and the next start resumes it to SUCCEEDED (CAN-9).

Everything is real: the processes, gRPC on loopback, SQLite; the target is a gRPC server of
the test's own that records every image and can hold a call (tests/e2e/_crash_target.py).
"""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from fortis.client import FortisClient, progress_of
from fortis.evaluation.v1 import evaluation_pb2, evaluation_pb2_grpc
from fortis.infra.serving.server import ANNOUNCE_S
from fortis.perturbation.v1 import perturbation_pb2 as ppb
from fortis.perturbation.v1 import perturbation_pb2_grpc
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.report.v1 import report_pb2, report_pb2_grpc
from fortis.scoring.v1 import scoring_pb2, scoring_pb2_grpc
from fortis.services.common.codec import image_msg
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import API_KEY, MD
from tests.e2e._crash_target import RecordingTarget, start_target
from tests.integration.test_scoring_deadlines import _irt_params
from tests.unit.report_parts import make_parts

#: ``fortis serve`` ends within about --shutdown-grace plus this (its --help, deploy/README).
MARGIN_S = 3.0
INTERNAL_KEY = "internal-test-key"
OTHERS = ("proxy", "perturbation", "scoring", "report")
#: Where the chart's other services are, for services that never call them here.
NOWHERE = "127.0.0.1:9"


@dataclass
class Served:
    service: str
    proc: subprocess.Popen[str]
    address: str
    log: Path

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def _serve(service: str, state: Path, *, grace: float, others: str = NOWHERE,
           extra: tuple[str, ...] = ()) -> Served:
    """``fortis serve --service NAME`` with the arguments the chart renders for it (the other
    services' addresses, a state folder, --shutdown-grace), on a free loopback port."""
    state.mkdir(parents=True, exist_ok=True)
    log = state / f"{service}.log"
    args = [sys.executable, "-m", "fortis.server.cli", "serve", f"--service={service}",
            "--address=127.0.0.1:0", f"--state-dir={state}", f"--shutdown-grace={grace}",
            "--log-level=info", *(f"--{o}-address={others}" for o in OTHERS if o != service),
            *extra]
    env = {**os.environ, "FORTIS_API_KEYS": f"{API_KEY}=tenant-a",
           "FORTIS_INTERNAL_KEY": INTERNAL_KEY}
    with log.open("w") as err:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line:
        proc.kill()
        proc.wait(30)
        raise AssertionError(f"fortis serve --service {service} did not start:\n"
                             f"{log.read_text()[-3000:]}")
    return Served(service, proc, json.loads(line)["address"], log)


def _health(address: str) -> str:
    """The gRPC health status of the server (a fresh connection, as a probe makes), or the
    status code of the failed check."""
    with grpc.insecure_channel(address) as ch:
        try:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
        except grpc.RpcError as exc:
            return str(exc.code().name)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(r.status))


@dataclass
class Call:
    """A call in flight on its own thread: its outcome and when it ended."""

    fn: Callable[[], Any]
    result: Any = None
    error: grpc.RpcError | None = None
    ended_at: float = 0.0
    _thread: threading.Thread = field(init=False)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.result = self.fn()
        except grpc.RpcError as exc:
            self.error = exc
        self.ended_at = time.monotonic()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the call hangs"


@dataclass
class Drained:
    signalled_at: float
    health: str              # health seen after SIGTERM, the first call still in flight
    refused: grpc.RpcError | None
    rc: int
    seconds: float           # SIGTERM to exit


def _sigterm(served: Served, grace: float, busy: Callable[[], bool],
             new_call: Callable[[], Any]) -> Drained:
    """SIGTERM ``served`` while ``busy()`` (work in flight); read health until it is not
    SERVING (while still busy), try ``new_call`` after the announce period, wait for the
    exit."""
    assert busy(), "the work ended before SIGTERM: nothing to drain"
    t0 = time.monotonic()
    served.proc.send_signal(signal.SIGTERM)
    health = "SERVING"
    while health == "SERVING" and time.monotonic() - t0 < 5:
        health = _health(served.address)
        if not busy():
            health = f"{health} (read after the work ended)"
            break
    time.sleep(max(0.0, t0 + ANNOUNCE_S + 0.2 - time.monotonic()))
    refused = None
    try:
        new_call()
    except grpc.RpcError as exc:
        refused = exc
    try:
        rc = served.proc.wait(grace + MARGIN_S + 10)
    except subprocess.TimeoutExpired:
        served.proc.kill()
        raise AssertionError(f"{served.service} still running {grace + MARGIN_S + 10} s after "
                             f"SIGTERM:\n{served.log_tail()}") from None
    return Drained(t0, health, refused, rc, time.monotonic() - t0)


def _check_drained(served: Served, d: Drained, grace: float) -> None:
    """What every service promises on SIGTERM (the module docstring)."""
    assert d.health == "NOT_SERVING", (d.health, served.log_tail())
    assert d.refused is not None, "a new call was served while draining"
    assert d.refused.code() == grpc.StatusCode.UNAVAILABLE, d.refused
    assert "shutting down" in (d.refused.details() or ""), d.refused.details()
    assert d.rc == 0, (d.rc, served.log_tail())
    assert d.seconds <= grace + MARGIN_S, f"exit {d.seconds:.2f} s after SIGTERM (grace {grace})"
    assert "Traceback" not in served.log_tail(), served.log_tail()


def _finished_after(call: Call, d: Drained) -> None:
    """``call`` was in flight at SIGTERM and was let finish."""
    assert call.error is None, call.error
    assert call.ended_at > d.signalled_at


def _cut_cleanly(call: Call) -> None:
    assert call.error is not None, "the call outlasting the grace period was not cut"
    assert call.error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), \
        call.error


def _stop(served: Served) -> None:
    if served.proc.poll() is None:
        served.proc.kill()
        served.proc.wait(30)


# -- proxy ---------------------------------------------------------------------------------
class Holds:
    """The target holds the n-th call it receives for the n-th given number of seconds (or
    until released), after recording its images."""

    def __init__(self, *seconds: float) -> None:
        self._seconds = list(seconds)
        self._lock = threading.Lock()
        self.release = threading.Event()
        self.arrived = threading.Semaphore(0)
        self._held = 0

    def __call__(self, count: int) -> None:
        with self._lock:
            hold = self._seconds.pop(0) if self._seconds else 0.0
            self._held += 1 if hold else 0
        self.arrived.release()
        if hold:
            self.release.wait(hold)
            with self._lock:
                self._held -= 1

    def holding(self) -> bool:
        """A call is held at the target now."""
        with self._lock:
            return self._held > 0

    def wait_arrival(self, timeout: float = 60) -> None:
        assert self.arrived.acquire(timeout=timeout), "the call never reached the target"


@pytest.fixture()
def target(fmnist_target) -> Iterator[RecordingTarget]:
    server, address, recording = start_target(fmnist_target)
    recording.address = address  # type: ignore[attr-defined]
    yield recording
    recording.on_call = None
    server.stop(0)


def _images(n: int, start: int = 0) -> list[Any]:
    g = np.random.default_rng(start)
    return [image_msg(f"img{start + k}", g.integers(0, 256, (28, 28, 1), dtype=np.uint8))
            for k in range(n)]


def _ledger_rows(state: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(state / "ledger.sqlite") as conn:
        return [(str(s), str(o), str(st)) for s, o, st in conn.execute(
            "SELECT session_id, origin, status FROM queries ORDER BY entry_id")]


def test_proxy_drains_predicts_and_leaves_no_row_in_flight(tmp_path, target) -> None:
    """A Predict held 2 s at the target finishes; one held past --shutdown-grace is cut
    (UNAVAILABLE), its rows stay uncompleted and the next start marks them INTERRUPTED."""
    grace = 4.0
    holds = Holds(2.0, 30.0)
    target.on_call = holds
    state = tmp_path / "proxy"
    extra = ("--no-default-targets", f"--target=own=grpc://{target.address}")  # type: ignore[attr-defined]
    served = _serve("proxy", state, grace=grace, extra=extra)
    try:
        ch = grpc.insecure_channel(served.address)
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        for sid in ("s-short", "s-long", "s-new"):
            px.CreateSession(proxy_pb2.CreateSessionRequest(target="own", session_id=sid),
                             metadata=MD, timeout=10)

        def predict(sid: str, images: list[Any]) -> Callable[[], Any]:
            return lambda: px.Predict(proxy_pb2.PredictRequest(
                session_id=sid, origin="sigterm", images=images), metadata=MD, timeout=60)

        short = Call(predict("s-short", _images(2)))
        holds.wait_arrival()
        long = Call(predict("s-long", _images(3, 10)))
        holds.wait_arrival()
        d = _sigterm(served, grace, lambda: not short.done(), predict("s-new", _images(1, 20)))
        short.join(10)
        long.join(10)
        ch.close()
    finally:
        holds.release.set()
        _stop(served)
    _check_drained(served, d, grace)
    _finished_after(short, d)
    assert len(short.result.predictions) == 2
    _cut_cleanly(long)
    assert target.count() == 5          # the refused call never reached the target

    rows = _ledger_rows(state)
    statuses = {sid: sorted(st for s, _, st in rows if s == sid) for sid, _, _ in rows}
    assert statuses["s-short"] == ["OK", "OK"]
    assert "s-new" not in statuses                       # refused before any row
    assert statuses["s-long"] == ["IN_FLIGHT"] * 3, statuses    # cut: no answer recorded

    again = _serve("proxy", state, grace=grace, extra=extra)   # the next start
    try:
        again.proc.send_signal(signal.SIGTERM)
        assert again.proc.wait(grace + MARGIN_S) == 0, again.log_tail()
    finally:
        _stop(again)
    rows = _ledger_rows(state)
    assert sorted(st for _, _, st in rows) == ["INTERRUPTED"] * 3 + ["OK"] * 2
    assert len(rows) == target.count()   # every image the target received has its row


# -- perturbation -------------------------------------------------------------------------
def test_perturbation_drains_apply_perturbation(tmp_path) -> None:
    """ApplyPerturbation of a few large images finishes; one of many, longer than
    --shutdown-grace, ends UNAVAILABLE/CANCELLED at the end of the grace period."""
    grace = 4.0
    served = _serve("perturbation", tmp_path / "perturbation", grace=grace)
    rng = np.random.default_rng(0)
    try:
        # up to 40 224 x 224 images come back: above gRPC's default 4 MiB receive limit
        ch = grpc.insecure_channel(served.address,
                                   options=[("grpc.max_receive_message_length", 64 << 20)])
        pt = perturbation_pb2_grpc.PerturbationServiceStub(ch)

        def blur(n: int) -> Callable[[], Any]:
            images = [image_msg(f"h{i}", rng.integers(0, 256, (224, 224, 3), dtype=np.uint8))
                      for i in range(n)]
            req = ppb.ApplyPerturbationRequest(perturbation_id="local_blur", severity=30, seed=1,
                                               images=images)
            return lambda: pt.ApplyPerturbation(req, metadata=MD, timeout=120)

        # sized to this machine: "few" takes about 2 s (0.4 s an image on the 2-core CI VM,
        # much less on a faster one, where 6 images ended before the SIGTERM)
        t = time.monotonic()
        blur(1)()
        n_few = int(min(40, max(6, math.ceil(2.0 / max(time.monotonic() - t, 1e-3)))))
        few = blur(n_few)
        many = Call(blur(min(10 * n_few, 120)))
        few_call = Call(few)
        time.sleep(0.5)
        small = ppb.ApplyPerturbationRequest(perturbation_id="contrast", severity=1, seed=1,
                                             images=_images(1))
        d = _sigterm(served, grace, lambda: not few_call.done(),
                     lambda: pt.ApplyPerturbation(small, metadata=MD, timeout=10))
        few_call.join(10)
        many.join(10)
        ch.close()
    finally:
        _stop(served)
    _check_drained(served, d, grace)
    _finished_after(few_call, d)
    assert len(few_call.result.images) == n_few
    _cut_cleanly(many)


# -- scoring -------------------------------------------------------------------------------
def test_scoring_drains_compute(tmp_path) -> None:
    """Compute("irt") with a long chain (seconds) in flight finishes."""
    grace = 10.0
    served = _serve("scoring", tmp_path / "scoring", grace=grace)
    try:
        ch = grpc.insecure_channel(served.address)
        sc = scoring_pb2_grpc.ScoringServiceStub(ch)
        # a chain of a few seconds on this machine (2,500 on the 2-core CI VM; more on a
        # faster one, where 2,500 ended before the SIGTERM)
        # timed after a first call: the first one pays the service's warm-up, which made
        # the chain look slow and end before the SIGTERM's announce period
        sc.Compute(scoring_pb2.ComputeRequest(metric="irt", params=_irt_params(250)),
                   metadata=MD, timeout=60)
        t = time.monotonic()
        sc.Compute(scoring_pb2.ComputeRequest(metric="irt", params=_irt_params(2500)),
                   metadata=MD, timeout=60)
        chain = int(min(40_000, max(2500, 2500 * 4.0 / max(time.monotonic() - t, 1e-3))))
        irt = Call(lambda: sc.Compute(scoring_pb2.ComputeRequest(
            metric="irt", params=_irt_params(chain)), metadata=MD, timeout=120))
        time.sleep(0.5)
        d = _sigterm(served, grace, lambda: not irt.done(), lambda: sc.Compute(scoring_pb2.ComputeRequest(
            metric="irt", params=_irt_params(10)), metadata=MD, timeout=10))
        irt.join(10)
        ch.close()
    finally:
        _stop(served)
    _check_drained(served, d, grace)
    _finished_after(irt, d)
    assert irt.result.result.fields


# -- report --------------------------------------------------------------------------------
def test_report_drains_render_report(tmp_path) -> None:
    """RenderReport of a large report (20,000 ranked settings: a few seconds) finishes."""
    grace = 10.0
    served = _serve("report", tmp_path / "report", grace=grace)

    def ranked(count: int) -> Any:
        parts = make_parts()
        for n in range(count):
            parts.metrics.ranking.settings.add(name=f"c{n}@1", kind=1, m=6, ndcg_1=0.5,
                                               ndcg_at=[0.5] * 10, drr=0.3, drr_n=6,
                                               applicable=True)
        return parts

    try:
        ch = grpc.insecure_channel(served.address, options=[
            ("grpc.max_receive_message_length", 64 * 1024 * 1024)])    # the HTML: 10-30 MB
        rp = report_pb2_grpc.ReportServiceStub(ch)
        # sized to this machine: the big render takes about 3 s (20,000 settings took a few
        # seconds on the 2-core CI VM, ~1 s on a faster one: it ended before the SIGTERM)
        t = time.monotonic()
        rp.RenderReport(report_pb2.RenderReportRequest(parts=ranked(2_000)), metadata=MD,
                        timeout=60)
        count = int(min(60_000, max(20_000, math.ceil(2_000 * 3.0 /
                                                       max(time.monotonic() - t, 1e-3)))))
        parts = ranked(count)
        big = Call(lambda: rp.RenderReport(report_pb2.RenderReportRequest(parts=parts),
                                           metadata=MD, timeout=120))
        time.sleep(0.3)
        d = _sigterm(served, grace, lambda: not big.done(), lambda: rp.RenderReport(
            report_pb2.RenderReportRequest(parts=make_parts()), metadata=MD, timeout=10))
        big.join(10)
        ch.close()
    finally:
        _stop(served)
    _check_drained(served, d, grace)
    _finished_after(big, d)
    assert json.loads(big.result.report_json)["schema_version"] == "fortis.report/v1"


# -- evaluation ----------------------------------------------------------------------------
EVAL_PLAN = """
name: sigterm-split
seed: 7
target: {name: own, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 64}
correctness: {mode: top1}
corruptions:
  - {id: gaussian_noise, severities: [1, 3]}
  - {id: contrast, severities: [2]}
execution: {batch_size: 16}
"""


def test_evaluation_service_drains_and_the_next_start_resumes(tmp_path, target) -> None:
    """An evaluation running on the evaluation service alone (the other four services in
    this process, as other pods): SIGTERM while one of its items waits at the target. The
    item's call is let finish, the evaluation stays RUNNING, WatchEvaluation ends
    UNAVAILABLE; the next start resumes it to SUCCEEDED."""
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    grace = 10.0
    others = start_stack(StackSettings(
        state_dir=tmp_path / "others", api_keys={API_KEY: "tenant-a"},
        targets=[TargetConfig.parse(f"own=grpc://{target.address}")],  # type: ignore[attr-defined]
        internal_key=INTERNAL_KEY))
    state = tmp_path / "evaluation"
    served = _serve("evaluation", state, grace=grace, others=others.address)
    try:
        with FortisClient(served.address, api_key=API_KEY) as fc:
            fc.submit(EVAL_PLAN, evaluation_id="ev-term")
            deadline = time.monotonic() + 120
            while progress_of(fc.get("ev-term")).items_done < 2:
                assert time.monotonic() < deadline, "the evaluation does not progress"
                time.sleep(0.05)
        holds = Holds(2.0)
        target.on_call = holds
        holds.wait_arrival()       # an item of the evaluation waits at the target
        ch = grpc.insecure_channel(served.address)
        ev = evaluation_pb2_grpc.EvaluationServiceStub(ch)
        watch = Call(lambda: list(ev.WatchEvaluation(
            evaluation_pb2.WatchEvaluationRequest(evaluation_id="ev-term"), metadata=MD,
            timeout=120)))
        time.sleep(0.3)
        d = _sigterm(served, grace, holds.holding, lambda: ev.CreateEvaluation(
            evaluation_pb2.CreateEvaluationRequest(plan=EVAL_PLAN, evaluation_id="ev-new"),
            metadata=MD, timeout=10))
        watch.join(10)
        ch.close()
        target.on_call = None
        _check_drained(served, d, grace)
        assert watch.error is not None and watch.error.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in (watch.error.details() or "")
        with sqlite3.connect(state / "evaluations.sqlite") as conn:
            (row_state,), = conn.execute(
                "SELECT state FROM evaluations WHERE evaluation_id='ev-term'").fetchall()
            assert row_state == "RUNNING"           # left for the next start
            assert not conn.execute("SELECT 1 FROM evaluations WHERE evaluation_id='ev-new'"
                                    ).fetchall()

        served = _serve("evaluation", state, grace=grace, others=others.address)
        with FortisClient(served.address, api_key=API_KEY) as fc:
            final = fc.wait("ev-term", timeout_s=300)
            assert progress_of(final).state == "SUCCEEDED", final.error.message
            assert final.resumed_count == 1
            report = fc.report("ev-term")
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(grace + MARGIN_S) == 0, served.log_tail()
    finally:
        _stop(served)
        others.stop(0)
    rows = _ledger_rows(tmp_path / "others")
    assert rows and {st for _, _, st in rows} == {"OK"}
    assert len(rows) == target.count()                  # IEEE-M6: each received image, a row
    assert report["ledger"]["total_queries"] > 0
