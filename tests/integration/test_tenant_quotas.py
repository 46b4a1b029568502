"""Per-tenant quotas and fair scheduling over a real loopback stack (bounded work:
per-tenant quotas on concurrent and queued evaluations, images/s across targets and queries
per day; fair scheduling so one tenant's queue cannot starve another's; SPEC CAN-9 for resumed
evaluations).

The target is a real gRPC ``fortis.target.v1.TargetService`` started by the test on loopback
(reached as ``grpc://`` through the proxy), whose Predict waits behind a gate the test opens,
so an evaluation holds its worker exactly as long as the test says (no timers decide the
order). Start order is read from the stored ``started_at`` of each evaluation (real SQLite).

- tenant A queues several evaluations on a one-worker server, tenant B submits one later:
  B's starts as soon as A's running one ends, before A's remaining ones;
- a tenant at its running quota waits while another tenant uses the free worker;
- CreateEvaluation beyond the queued quota: RESOURCE_EXHAUSTED, QuotaFailure on
  ``tenant:<t>``, an audit line, nothing stored; idempotent re-create still answers; a
  cancelled queued evaluation leaves the queue (never starts, frees its place);
- evaluations left by a previous process re-enter the same fair queue;
- queries per day in the proxy: the call that would cross the limit is refused whole (nothing
  sent), retries count, the count survives a restart (same state dir), the other tenant is
  not affected; metric and audit line for each refusal; an evaluation whose clean pass would
  cross the day fails with RESOURCE_EXHAUSTED and nothing of it reaches the target;
- calls in progress: a tenant's calls beyond ``calls`` are RESOURCE_EXHAUSTED at once, so
  its calls blocked at a slow target cannot hold every worker thread of the server (before,
  tenant B's 40 calls waiting at a 1/s target made tenant A's call on another target take
  25 s); finished and cancelled calls (unary and streams) give their slot back; calls of an
  evaluation between Fortis's services are not counted;
- ``fortis serve`` takes the quota flags (subprocess) and refuses malformed ones (exit 2).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from fortis.common.v1 import common_pb2
from fortis.evaluation.v1 import evaluation_pb2 as pb
from fortis.evaluation.v1 import evaluation_pb2_grpc
from fortis.infra.serving.quotas import QuotaSettings, TenantQuota
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.target.v1 import target_pb2, target_pb2_grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from tests.conftest import API_KEY, MD, OTHER_KEY, OTHER_MD

N_LABELS = 10
PLAN = """
name: quota-{name}
seed: 3
target: {{name: gated, task: classification}}
dataset: {{source: fashion-mnist, split: test, limit: 4}}
corruptions: [{{id: contrast, severities: [1]}}]
"""
FINAL = (pb.EVALUATION_STATE_SUCCEEDED, pb.EVALUATION_STATE_FAILED,
         pb.EVALUATION_STATE_CANCELLED)


class GatedTarget(target_pb2_grpc.TargetServiceServicer):
    """A classifier whose Predict waits until ``gate`` is open (``fail_next`` calls answer
    UNAVAILABLE first); counts the images it receives."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.fail_next = 0
        self.calls = 0
        self.images = 0
        self._lock = threading.Lock()

    def GetTargetInfo(self, request: Any, context: Any) -> target_pb2.GetTargetInfoResponse:
        return target_pb2.GetTargetInfoResponse(info=target_pb2.TargetInfo(
            name="gated", task_type=common_pb2.TASK_TYPE_CLASSIFICATION,
            labels=[f"c{i}" for i in range(N_LABELS)],
            output_kind=common_pb2.OUTPUT_KIND_FULL_SCORES,
            input=target_pb2.InputSpec(height=28, width=28, channels=1, max_batch_size=64)))

    def Predict(self, request: Any, context: grpc.ServicerContext) -> target_pb2.PredictResponse:
        with self._lock:
            self.calls += 1
            self.images += len(request.images)
            fail = self.fail_next > 0
            self.fail_next -= int(fail)
        if fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
        self.gate.wait(120)
        classes = [common_pb2.ClassScore(label=i, name=f"c{i}", score=(i + 1) / 55.0)
                   for i in range(N_LABELS)]
        return target_pb2.PredictResponse(predictions=[common_pb2.Prediction(
            image_id=img.image_id, classification=common_pb2.Classification(classes=classes))
            for img in request.images])


@pytest.fixture()
def target() -> Iterator[tuple[GatedTarget, str]]:
    from concurrent import futures
    servicer = GatedTarget()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    target_pb2_grpc.add_TargetServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    servicer.gate.set()
    server.stop(0)


@pytest.fixture()
def make_stack(tmp_path: Path, target: tuple[GatedTarget, str]
               ) -> Iterator[Callable[..., Any]]:
    """Start a stack on ``tmp_path/state`` (the same folder each time: a restart) with the
    gated target, two tenants and the given quotas; every stack is stopped at the end."""
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack
    stacks: list[Any] = []

    def make(quotas: QuotaSettings, *, workers: int = 1, **extra: Any) -> Any:
        s = start_stack(StackSettings(
            state_dir=tmp_path / "state", api_keys={API_KEY: "tenant-a", OTHER_KEY: "tenant-b"},
            targets=[TargetConfig.parse(f"gated=grpc://{target[1]}")], quotas=quotas,
            evaluation_workers=workers, **extra))
        stacks.append(s)
        return s

    yield make
    target[0].gate.set()
    for s in stacks:
        s.stop(0, worker_wait=5.0)




def _create(stub: Any, eid: str, md: Any = MD) -> pb.Evaluation:
    return stub.CreateEvaluation(pb.CreateEvaluationRequest(
        plan=PLAN.format(name=eid), evaluation_id=eid), metadata=md, timeout=30).evaluation


def _until(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _row(stack: Any, tenant: str, eid: str) -> Any:
    row = stack.manager.store.for_tenant(tenant).get(eid)
    assert row is not None
    return row


def _wait_final(stack: Any, pairs: list[tuple[str, str]]) -> None:
    _until(lambda: all(_row(stack, t, e).state in ("SUCCEEDED", "FAILED", "CANCELLED")
                       for t, e in pairs), "the evaluations to end", timeout=240)


def _start_order(stack: Any, pairs: list[tuple[str, str]]) -> list[str]:
    rows = [_row(stack, t, e) for t, e in pairs]
    assert all(r.started_at > 0 for r in rows), [(r.evaluation_id, r.state) for r in rows]
    return [r.evaluation_id for r in sorted(rows, key=lambda r: r.started_at)]


def _quota_failure(exc: grpc.RpcError) -> tuple[list[tuple[str, str]], str]:
    st = rpc_status.from_call(exc)
    assert st is not None
    violations, reason = [], ""
    for d in st.details:
        qf, info = error_details_pb2.QuotaFailure(), error_details_pb2.ErrorInfo()
        if d.Unpack(qf):
            violations += [(v.subject, v.description) for v in qf.violations]
        elif d.Unpack(info):
            reason = info.reason
    return violations, reason


def test_a_later_tenant_starts_before_the_earlier_tenants_queue(make_stack, target) -> None:
    """One worker, running quota 1: A queues four, B submits one after them; B's starts
    second (FIFO would start it fifth)."""
    gated, _ = target
    stack = make_stack(QuotaSettings(max_running=1), workers=1)
    with grpc.insecure_channel(stack.address) as ch:
        stub = evaluation_pb2_grpc.EvaluationServiceStub(ch)
        _create(stub, "a1")
        _until(lambda: gated.calls >= 1, "a1 to reach the target")     # a1 holds the worker
        for eid in ("a2", "a3", "a4"):
            assert _create(stub, eid).state == pb.EVALUATION_STATE_PENDING
        assert _create(stub, "b1", OTHER_MD).state == pb.EVALUATION_STATE_PENDING
        assert stack.manager.queue_counts("tenant-a") == (1, 3)
        gated.gate.set()
        pairs = [("tenant-a", e) for e in ("a1", "a2", "a3", "a4")] + [("tenant-b", "b1")]
        _wait_final(stack, pairs)
    assert {_row(stack, t, e).state for t, e in pairs} == {"SUCCEEDED"}
    assert _start_order(stack, pairs) == ["a1", "b1", "a2", "a3", "a4"]


def test_a_tenant_at_its_running_quota_waits_while_another_uses_the_free_worker(
        make_stack, target) -> None:
    gated, _ = target
    stack = make_stack(QuotaSettings(tenants={"tenant-a": TenantQuota(running=1)}), workers=2)
    with grpc.insecure_channel(stack.address) as ch:
        stub = evaluation_pb2_grpc.EvaluationServiceStub(ch)
        _create(stub, "a1")
        _until(lambda: _row(stack, "tenant-a", "a1").state == "RUNNING", "a1 to run")
        _create(stub, "a2")                      # a worker is free, but A is at its quota
        _create(stub, "b1", OTHER_MD)
        _until(lambda: _row(stack, "tenant-b", "b1").state == "RUNNING", "b1 to run")
        assert _row(stack, "tenant-a", "a2").state == "PENDING"
        assert stack.manager.queue_counts("tenant-a") == (1, 1)
        gated.gate.set()
        pairs = [("tenant-a", "a1"), ("tenant-a", "a2"), ("tenant-b", "b1")]
        _wait_final(stack, pairs)
    a1, a2 = _row(stack, "tenant-a", "a1"), _row(stack, "tenant-a", "a2")
    assert a2.started_at >= a1.finished_at > 0       # a2 started only once a1 had ended
    assert {_row(stack, t, e).state for t, e in pairs} == {"SUCCEEDED"}


def test_over_the_queued_quota_is_resource_exhausted_and_nothing_is_stored(
        make_stack, target, captured) -> None:
    gated, _ = target
    stack = make_stack(QuotaSettings(tenants={"tenant-a": TenantQuota(queued=2)}), workers=1)
    with grpc.insecure_channel(stack.address) as ch:
        stub = evaluation_pb2_grpc.EvaluationServiceStub(ch)
        _create(stub, "a1")
        _until(lambda: gated.calls >= 1, "a1 to reach the target")
        _create(stub, "a2")
        _create(stub, "a3")                      # two waiting: the quota
        with pytest.raises(grpc.RpcError) as info:
            _create(stub, "a4")
        exc = info.value
        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        violations, reason = _quota_failure(exc)
        assert reason == "QUOTA_EXCEEDED"
        assert [s for s, _ in violations] == ["tenant:tenant-a"]
        assert "2 of 2" in violations[0][1] and "queued" in violations[0][1]
        assert len(exc.details()) < 1024
        # nothing stored for the refused one
        with pytest.raises(grpc.RpcError) as nf:
            stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id="a4"), metadata=MD)
        assert nf.value.code() == grpc.StatusCode.NOT_FOUND
        listed = stub.ListEvaluations(pb.ListEvaluationsRequest(), metadata=MD).evaluations
        assert sorted(e.evaluation_id for e in listed) == ["a1", "a2", "a3"]
        (line,) = [ln for ln in captured if ln.get("event") == "evaluation_refused"]
        assert line["tenant"] == "tenant-a" and line["quota"] == "queued_evaluations"
        assert line["limit"] == 2 and line["target"] == "gated"
        # idempotent re-create of a queued one still answers, at the quota
        assert _create(stub, "a2").evaluation_id == "a2"
        # the other tenant is not affected
        for eid in ("b1", "b2", "b3"):
            _create(stub, eid, OTHER_MD)
        # a cancelled queued evaluation leaves the queue: its place is free, it never starts
        stub.CancelEvaluation(pb.CancelEvaluationRequest(evaluation_id="a2"), metadata=MD)
        assert _create(stub, "a4").state == pb.EVALUATION_STATE_PENDING
        gated.gate.set()
        pairs = [("tenant-a", e) for e in ("a1", "a2", "a3", "a4")] + \
            [("tenant-b", e) for e in ("b1", "b2", "b3")]
        _wait_final(stack, pairs)
    a2 = _row(stack, "tenant-a", "a2")
    assert a2.state == "CANCELLED" and a2.started_at == 0
    assert {_row(stack, t, e).state for t, e in pairs if e != "a2"} == {"SUCCEEDED"}


def test_evaluations_left_by_a_previous_process_reenter_the_fair_queue(
        make_stack, target, tmp_path) -> None:
    """A previous process left a1 running and a2, a3 (tenant A) and b1 (tenant B, created
    last) pending; the next start resumes them in the fair order: a1, b1, a2, a3."""
    from fortis.services.evaluation.store import EvaluationStore
    gated, _ = target
    gated.gate.set()
    store = EvaluationStore(tmp_path / "state" / "evaluations.sqlite")
    pairs = [("tenant-a", "a1"), ("tenant-a", "a2"), ("tenant-a", "a3"), ("tenant-b", "b1")]
    for tenant, eid in pairs:
        store.insert(evaluation_id=eid, tenant=tenant, plan_text=PLAN.format(name=eid),
                     plan_name=f"quota-{eid}")
        time.sleep(0.005)                        # distinct created_at, in this order
    store.for_tenant("tenant-a").update("a1", state="RUNNING", started_at=time.time())
    store.close()
    stack = make_stack(QuotaSettings(max_running=1), workers=1)
    _wait_final(stack, pairs)
    assert _start_order(stack, pairs) == ["a1", "b1", "a2", "a3"]
    assert {_row(stack, t, e).resumed_count for t, e in pairs} == {1}
    assert {_row(stack, t, e).state for t, e in pairs} == {"SUCCEEDED"}


# -- queries per day (target proxy) -------------------------------------------------------
def _images(n: int, start: int = 0) -> list[common_pb2.Image]:
    return [common_pb2.Image(image_id=f"i{k}", tensor=common_pb2.Tensor(
        dtype=common_pb2.D_TYPE_UINT8, shape=[28, 28, 1], data=bytes([k % 256]) * 784))
        for k in range(start, start + n)]


def _predict(stub: Any, n: int, md: Any = MD, session: str = "s") -> grpc.RpcError | None:
    try:
        stub.Predict(proxy_pb2.PredictRequest(session_id=session, origin="t", images=_images(n)),
                     metadata=md, timeout=60)
    except grpc.RpcError as exc:
        return exc
    return None


def _refused_metric(stack: Any) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics_port}/metrics",
                                  timeout=10).read().decode()
    for line in body.splitlines():
        if line.startswith("fortis_proxy_quota_refused_calls_total{") and \
                'tenant="tenant-a"' in line and 'quota="queries_per_day"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_queries_per_day_refuse_the_crossing_call_count_retries_and_survive_a_restart(
        make_stack, target, captured) -> None:
    if 86400 - time.time() % 86400 < 120:
        pytest.skip("too close to midnight UTC: the day's count would start again mid-test")
    gated, _ = target
    gated.gate.set()
    quotas = QuotaSettings(tenants={"tenant-a": TenantQuota(queries_per_day=12)})
    stack = make_stack(quotas, only="proxy", metrics_port=0)
    with grpc.insecure_channel(stack.address) as ch:
        stub = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        for md in (MD, OTHER_MD):
            stub.CreateSession(proxy_pb2.CreateSessionRequest(target="gated", session_id="s"),
                               metadata=md)
        gated.fail_next = 1
        assert _predict(stub, 3) is None                 # 3 UNAVAILABLE + 3 retried: 6
        assert gated.images == 6
        exc = _predict(stub, 7)                          # 6 + 7 > 12: refused whole
        assert exc is not None and exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        violations, reason = _quota_failure(exc)
        assert reason == "QUOTA_EXCEEDED" and [s for s, _ in violations] == ["tenant:tenant-a"]
        assert "6 of 12" in violations[0][1] and "per day" in violations[0][1]
        assert gated.images == 6                         # nothing sent
        assert _predict(stub, 4) is None                 # 10
        gated.fail_next = 1
        exc = _predict(stub, 2)                          # sent (12); its retry would be 14
        assert exc is not None and exc.code() == grpc.StatusCode.UNAVAILABLE
        assert gated.images == 12
        exc = _predict(stub, 1)
        assert exc is not None and exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert gated.images == 12
        # the other tenant is not affected
        assert _predict(stub, 20, OTHER_MD) is None
        stats = stub.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id="s"),
                                     metadata=MD)
        assert (stats.tenant_queries_today, stats.tenant_queries_per_day) == (12, 12)
        assert stats.queries_attempted == 12 and stats.calls_refused == 2
        assert _refused_metric(stack) == 2.0
    refusals = [ln for ln in captured if ln.get("event") == "query_refused"
                and ln.get("reason") == "quota"]
    assert [(ln["tenant"], ln["quota"], ln["images"]) for ln in refusals] == \
        [("tenant-a", "queries_per_day", 7), ("tenant-a", "queries_per_day", 1)]
    stack.stop(0)

    # restart on the same state dir: the ledger's rows of today are the count
    again = make_stack(quotas, only="proxy")
    with grpc.insecure_channel(again.address) as ch:
        stub = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        stats = stub.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id="s"),
                                     metadata=MD)
        assert stats.tenant_queries_today == 12
        exc = _predict(stub, 1)
        assert exc is not None and exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _predict(stub, 20, OTHER_MD) is None
        other = stub.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id="s"),
                                     metadata=OTHER_MD)
        assert (other.tenant_queries_today, other.tenant_queries_per_day) == (40, 0)
    assert gated.images == 12 + 40



def test_an_evaluation_past_its_tenants_daily_queries_fails_with_nothing_sent(
        make_stack, target) -> None:
    """The evaluation service's calls are the tenant's queries too. CreateEvaluation refuses
    a plan whose fixed queries exceed what is left of the day (tests/integration/
    test_estimate.py); one accepted while the day had room still meets the proxy's quota when
    an evaluation queued before it spends the rest first: its clean pass fails the evaluation
    with RESOURCE_EXHAUSTED (the QuotaFailure kept in ``error``), the target receives nothing
    of it, tenant-b's evaluation runs."""
    gated, _ = target
    planned = 4 + 4                       # the plan's clean pass and its one corruption
    stack = make_stack(QuotaSettings(tenants={"tenant-a": TenantQuota(
        queries_per_day=planned + 3)}))   # room for one evaluation, not for two
    with grpc.insecure_channel(stack.address) as ch:
        stub = evaluation_pb2_grpc.EvaluationServiceStub(ch)
        _create(stub, "b1", OTHER_MD)     # holds the one worker at the closed gate
        _until(lambda: gated.calls >= 1, "tenant-b's first call at the target")
        _create(stub, "a0")               # both fit the day as it stands: accepted
        _create(stub, "a1")
        gated.gate.set()
        _wait_final(stack, [("tenant-a", "a0"), ("tenant-a", "a1"), ("tenant-b", "b1")])
        ev = stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id="a1"),
                                metadata=MD).evaluation
    assert _row(stack, "tenant-a", "a0").state == "SUCCEEDED"
    assert ev.state == pb.EVALUATION_STATE_FAILED
    assert ev.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    subjects = []
    for d in ev.error.details:
        qf = error_details_pb2.QuotaFailure()
        if d.Unpack(qf):
            subjects += [v.subject for v in qf.violations]
    assert subjects == ["tenant:tenant-a"]
    assert _row(stack, "tenant-b", "b1").state == "SUCCEEDED"
    from fortis.services.proxy.ledger import Ledger
    ledger = Ledger(Path(stack.settings.state_dir) / "ledger.sqlite")
    try:
        rows = ledger.attempts_since(0.0)
    finally:
        ledger.close()
    assert rows["tenant-a"] == planned           # a0's; nothing of a1 reached the target
    assert gated.images == rows["tenant-a"] + rows["tenant-b"]


def test_create_refuses_a_plan_past_what_is_left_of_the_day(make_stack, target) -> None:
    """CreateEvaluation compares the plan's fixed queries with what is left of the tenant's
    day before anything is stored or sent: RESOURCE_EXHAUSTED naming ``tenant:<name>`` with
    the numbers; the other tenant is not concerned."""
    gated, _ = target
    gated.gate.set()
    stack = make_stack(QuotaSettings(tenants={"tenant-a": TenantQuota(queries_per_day=3)}))
    with grpc.insecure_channel(stack.address) as ch:
        stub = evaluation_pb2_grpc.EvaluationServiceStub(ch)
        with pytest.raises(grpc.RpcError) as exc:
            _create(stub, "a1")
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        violations, _ = _quota_failure(exc.value)
        assert [s for s, _ in violations] == ["tenant:tenant-a"]
        assert "planned 8" in violations[0][1] and "quota 3" in violations[0][1]
        _create(stub, "b1", OTHER_MD)
        _wait_final(stack, [("tenant-b", "b1")])
    assert stack.manager.store.for_tenant("tenant-a").get("a1") is None
    assert gated.images == 8                     # b1's only


# -- fortis serve flags -----------------------------------------------------------------------
def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_fortis_serve_takes_the_quota_flags(tmp_path, fmnist_target) -> None:
    """``fortis serve --max-queries-per-day-per-tenant/--tenant-quota/...`` reach the proxy:
    tenant-a's own 3 per day, tenant-b the server-wide default of 5."""
    import json
    import os
    import signal
    import subprocess
    import sys
    env = {**os.environ, "FORTIS_API_KEYS": "ka=tenant-a,kb=tenant-b"}
    p = subprocess.Popen(
        [sys.executable, "-m", "fortis.server.cli", "serve", "--address", f"127.0.0.1:{_free_port()}",
         "--state-dir", str(tmp_path / "s"), "--log-level", "warning",
         "--target", "m=builtin:fmnist-cnn", "--evaluation-workers", "1",
         "--max-running-per-tenant", "1", "--max-queued-per-tenant", "4",
         "--max-queries-per-day-per-tenant", "5",
         "--tenant-quota", "tenant-a=queries_per_day:3,queued:1"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stderr is not None
        line = p.stdout.readline()
        assert line, p.stderr.read()[-3000:]
        address = json.loads(line)["address"]
        with grpc.insecure_channel(address) as ch:
            stub = proxy_pb2_grpc.TargetProxyServiceStub(ch)
            for key, n_ok in (("ka", 3), ("kb", 5)):
                md = (("x-api-key", key),)
                stub.CreateSession(proxy_pb2.CreateSessionRequest(target="m", session_id="s"),
                                   metadata=md, timeout=30)
                assert _predict(stub, n_ok, md) is None
                exc = _predict(stub, 1, md)
                assert exc is not None and exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                stats = stub.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id="s"),
                                             metadata=md, timeout=30)
                assert (stats.tenant_queries_today, stats.tenant_queries_per_day) == (n_ok, n_ok)
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


@pytest.mark.parametrize("args,field", [
    (("--tenant-quota", "tenant-a=speed:3"), "tenant_quota"),
    (("--tenant-quota", "tenant-a=running:1", "--tenant-quota", "tenant-a=queued:2"),
     "tenant_quota"),
    (("--max-queued-per-tenant", "-1"), "max_queued_per_tenant"),
    (("--max-calls-per-tenant", "-2"), "max_calls_per_tenant"),
    (("--server-workers", "1"), "server_workers"),
    (("--max-call-rate-per-tenant", "-1"), "max_call_rate_per_tenant"),
    (("--work-slots", "-1"), "work_slots"),
    (("--tenant-quota", "tenant-a=calls_per_second:-5"), "tenant_quota"),
    (("--tenant-quota", "tenant-a=calls:x"), "tenant_quota"),
    (("--evaluation-workers", "0"), "evaluation_workers")])
def test_fortis_serve_refuses_a_malformed_quota(tmp_path, args, field) -> None:
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "fortis.server.cli", "serve", "--address",
                        f"127.0.0.1:{_free_port()}", "--state-dir", str(tmp_path / "s"),
                        "--no-default-targets", *args], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert field in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""


# -- calls in progress per tenant (the server's worker threads) -----------------------------
def _session(px: Any, md: Any, sid: str) -> None:
    px.CreateSession(proxy_pb2.CreateSessionRequest(target="gated", session_id=sid),
                     metadata=md, timeout=30)


def test_a_tenants_calls_in_progress_are_capped_so_the_other_is_not_stalled(
        make_stack, target) -> None:
    """Eight worker threads, four calls per tenant: B's twelve calls blocked at the gated
    target take four threads; the other eight are refused at once, and A is answered."""
    servicer, _ = target
    stack = make_stack(QuotaSettings(max_calls=4), server_workers=8)
    with grpc.insecure_channel(stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        _session(px, OTHER_MD, "b")
        futures = [px.Predict.future(proxy_pb2.PredictRequest(
            session_id="b", origin="t", images=_images(1, k)), metadata=OTHER_MD, timeout=60)
            for k in range(12)]
        _until(lambda: servicer.calls == 4, "four of B's calls at the target")
        _until(lambda: sum(f.done() for f in futures) == 8, "eight of B's calls refused")
        refused = [f for f in futures if f.done()]
        for f in refused:
            exc = f.exception()
            assert exc is not None and exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            violations, reason = _quota_failure(exc)
            assert violations[0][0] == "tenant:tenant-b" and "4 calls" in violations[0][1]
            assert reason == "QUOTA_EXCEEDED"
        # A is not stalled: its calls get threads (a deadline, not a stopwatch, says so)
        assert px.ListTargets(proxy_pb2.ListTargetsRequest(), metadata=MD, timeout=5).targets
        _session(px, MD, "a")
        assert px.GetSession(proxy_pb2.GetSessionRequest(session_id="a"), metadata=MD,
                             timeout=5).session.session_id == "a"
        assert servicer.calls == 4      # nothing refused reached the target
        servicer.gate.set()
        for f in futures:
            if f not in refused:
                assert len(f.result(timeout=30).predictions) == 1
        # the slots came back: B has four again
        again = [px.Predict.future(proxy_pb2.PredictRequest(
            session_id="b", origin="t", images=_images(1, 100 + k)), metadata=OTHER_MD,
            timeout=60) for k in range(4)]
        assert all(len(f.result(timeout=30).predictions) == 1 for f in again)


def test_cancelled_streams_give_their_slots_back(make_stack, target) -> None:
    servicer, _ = target
    stack = make_stack(QuotaSettings(tenants={"tenant-b": TenantQuota(calls=2)}))
    with grpc.insecure_channel(stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        _session(px, OTHER_MD, "b")
        gates = [threading.Event() for _ in range(2)]

        def requests(gate: threading.Event) -> Iterator[proxy_pb2.PredictStreamRequest]:
            gate.wait(60)
            return
            yield   # pragma: no cover - an empty stream held open until the gate

        streams = [px.PredictStream(requests(g), metadata=OTHER_MD, timeout=60) for g in gates]
        exc = None

        def third_refused() -> bool:
            nonlocal exc
            try:
                px.GetSession(proxy_pb2.GetSessionRequest(session_id="b"), metadata=OTHER_MD,
                              timeout=5)
                return False
            except grpc.RpcError as e:
                exc = e
                return e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        _until(third_refused, "both streams holding B's two slots")
        assert exc is not None and _quota_failure(exc)[0][0][0] == "tenant:tenant-b"
        # tenant A has the default (no limit): B's quota is B's alone
        assert px.ListTargets(proxy_pb2.ListTargetsRequest(), metadata=MD, timeout=5).targets
        for st in streams:
            st.cancel()
        for g in gates:
            g.set()
        # cancelled: the slots come back without the streams' handlers ever resuming
        _until(lambda: _get_ok(px, "b", OTHER_MD), "B's slots back after the cancel", 10)
        assert servicer.calls == 0


def _get_ok(px: Any, sid: str, md: Any) -> bool:
    try:
        px.GetSession(proxy_pb2.GetSessionRequest(session_id=sid), metadata=md, timeout=5)
        return True
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise
        return False


def test_an_evaluations_internal_calls_do_not_count_against_its_tenant(
        make_stack, target) -> None:
    """Tenant A may have one call in progress; its evaluation (many calls between Fortis's
    services on A's behalf) still runs to the end, while A polls with its one call."""
    servicer, _ = target
    servicer.gate.set()
    stack = make_stack(QuotaSettings(tenants={"tenant-a": TenantQuota(calls=1)}), workers=1)
    with grpc.insecure_channel(stack.address) as ch:
        stub = evaluation_pb2_grpc.EvaluationServiceStub(ch)
        _create(stub, "solo")
        _until(lambda: stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id="solo"),
                                          metadata=MD, timeout=30).evaluation.state in FINAL,
               "the evaluation to end", timeout=240)
        ev = stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id="solo"), metadata=MD,
                                timeout=30).evaluation
        assert ev.state == pb.EVALUATION_STATE_SUCCEEDED, ev.error
        assert servicer.images > 0
