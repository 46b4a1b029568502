"""Per-tenant quotas with three tenants at once, from outside: a real ``fortis serve``
subprocess (all services, SQLite state) with the server-wide quotas of its flags

    --max-running-per-tenant 1 --max-queued-per-tenant 1
    --max-queries-per-day-per-tenant 50 --evaluation-workers 3

and one target, a real gRPC ``fortis.target.v1.TargetService`` started here on loopback
(reached through the proxy as ``grpc://``), whose Predict waits behind a gate the test opens,
so evaluations stay RUNNING exactly as long as the test says, and which counts every image it
receives by id. The clients are written from the protos alone (generated stubs, ``x-api-key``
metadata, google.rpc status details).

Tenants ``alpha`` and ``beta`` work normally; ``greedy`` goes past every quota:

- running and queued: greedy's first evaluation runs, its second waits (running quota 1), its
  third is RESOURCE_EXHAUSTED with a QuotaFailure on ``tenant:greedy`` naming the queued
  quota, nothing stored; alpha's and beta's evaluations, submitted after greedy's, start at
  once on the free workers and all complete;
- queries per UTC day: greedy's calls are refused whole once the next would cross 50 (a call
  that still fits is sent; the target never receives more than 50 of greedy's images, each
  query counted per image at the proxy as DESIGN says), its next evaluation FAILS with
  RESOURCE_EXHAUSTED with nothing of it reaching the target, while alpha and beta, sending at
  the same time from their own threads, get every image answered and their evaluations
  complete.

SPEC section 0 (a rate-limited proxy that records each call; one deployment shared by
tenants) and IEEE-M6 (queries counted at the proxy, per image).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from fortis.common.v1 import common_pb2
from fortis.evaluation.v1 import evaluation_pb2 as pb
from fortis.evaluation.v1 import evaluation_pb2_grpc
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.target.v1 import target_pb2, target_pb2_grpc

from tests.integration._outsider_support import (
    fortis_serve,
    quota_violations,
    refused,
    serving_target,
    ten_class_answer,
    wait_final,
)

KEYS = {"alpha": "outsider-key-alpha-0123456789", "beta": "outsider-key-beta-0123456789",
        "greedy": "outsider-key-greedy-012345678"}
MD = {t: (("x-api-key", k),) for t, k in KEYS.items()}
PER_DAY = 50
#: dataset offsets: the images each tenant's evaluations send carry ids only it uses
OFFSET = {"alpha": 0, "beta": 1000, "greedy": 2000}
PLAN = """
name: quota-{tenant}-{n}
seed: 3
target: {{name: gated, task: classification}}
dataset: {{source: fashion-mnist, split: test, limit: 4, offset: {offset}}}
corruptions: [{{id: contrast, severities: [1]}}]
"""        # 4 clean + 4 corrupted = 8 queries


def plan(tenant: str, n: int) -> str:
    return PLAN.format(tenant=tenant, n=n, offset=OFFSET[tenant] + 10 * n)


class GatedTarget(target_pb2_grpc.TargetServiceServicer):
    """A 28x28 grey classifier whose Predict waits until ``gate`` is open; counts images by
    the tenant their id belongs to (direct calls: ``<tenant>-...``; evaluations: dataset ids
    ``fmnist-test-NNNNN`` in each tenant's offset range)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.images: Counter[str] = Counter()
        self._lock = threading.Lock()

    @staticmethod
    def owner(image_id: str) -> str:
        for tenant in KEYS:
            if image_id.startswith(f"{tenant}-"):
                return tenant
        number = int(image_id.rsplit("-", 1)[-1].split("/")[0].split(":")[0])
        return max((t for t, o in OFFSET.items() if number >= o), key=OFFSET.__getitem__)

    def GetTargetInfo(self, request: Any, context: Any) -> target_pb2.GetTargetInfoResponse:  # noqa: N802
        return target_pb2.GetTargetInfoResponse(info=target_pb2.TargetInfo(
            name="gated", task_type=common_pb2.TASK_TYPE_CLASSIFICATION,
            labels=[f"c{i}" for i in range(10)],
            output_kind=common_pb2.OUTPUT_KIND_FULL_SCORES,
            input=target_pb2.InputSpec(height=28, width=28, channels=1, max_batch_size=64)))

    def Predict(self, request: Any, context: Any) -> target_pb2.PredictResponse:  # noqa: N802
        self.gate.wait(120)
        with self._lock:
            self.images.update(self.owner(img.image_id) for img in request.images)
        return ten_class_answer(request)


@pytest.fixture()
def target() -> Iterator[tuple[GatedTarget, str]]:
    servicer = GatedTarget()
    with serving_target(servicer) as address:
        yield servicer, address
        servicer.gate.set()


def _image(image_id: str) -> common_pb2.Image:
    return common_pb2.Image(image_id=image_id, tensor=common_pb2.Tensor(
        dtype=common_pb2.D_TYPE_UINT8, shape=[28, 28, 1], data=bytes(28 * 28)))


def _state(ev: Any, tenant: str, eid: str) -> int:
    return int(ev.GetEvaluation(pb.GetEvaluationRequest(evaluation_id=eid), metadata=MD[tenant],
                                timeout=30).evaluation.state)


def _until(check: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_three_tenants_one_past_its_quotas(tmp_path: Path, target, fmnist_target) -> None:
    servicer, address = target
    env = {"FORTIS_API_KEYS": ",".join(f"{k}={t}" for t, k in KEYS.items())}
    args = ["--no-default-targets", "--target", f"gated=grpc://{address}",
            "--max-running-per-tenant", "1", "--max-queued-per-tenant", "1",
            "--max-queries-per-day-per-tenant", str(PER_DAY), "--evaluation-workers", "3"]
    with fortis_serve(args, tmp_path, env=env) as served, grpc.insecure_channel(served) as ch:
        ev = evaluation_pb2_grpc.EvaluationServiceStub(ch)
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)

        def create(tenant: str, eid: str, n: int) -> Any:
            return ev.CreateEvaluation(pb.CreateEvaluationRequest(
                plan=plan(tenant, n), evaluation_id=eid), metadata=MD[tenant], timeout=60)

        # -- running and queued quotas, the target holding every evaluation ----------------
        create("greedy", "g1", 1)
        _until(lambda: _state(ev, "greedy", "g1") == pb.EVALUATION_STATE_RUNNING, "g1 runs")
        create("greedy", "g2", 2)
        exc = refused(lambda: create("greedy", "g3", 3))
        (subject, description), = quota_violations(exc)
        assert subject == "tenant:greedy" and "queued evaluations" in description, description
        assert refused(lambda: _state(ev, "greedy", "g3")).code() == grpc.StatusCode.NOT_FOUND
        create("alpha", "a1", 1)
        create("beta", "b1", 1)
        # alpha and beta start on the free workers although greedy's g2 was queued first
        _until(lambda: _state(ev, "alpha", "a1") == pb.EVALUATION_STATE_RUNNING and
               _state(ev, "beta", "b1") == pb.EVALUATION_STATE_RUNNING, "a1 and b1 run")
        assert _state(ev, "greedy", "g2") == pb.EVALUATION_STATE_PENDING
        servicer.gate.set()
        for tenant, eid in (("alpha", "a1"), ("beta", "b1"), ("greedy", "g1"),
                            ("greedy", "g2")):
            final = wait_final(ev, eid, MD[tenant])
            assert final.state == pb.EVALUATION_STATE_SUCCEEDED, (eid, final.error.message)
        assert servicer.images == {"alpha": 8, "beta": 8, "greedy": 16}

        # -- queries per day: the three tenants send at once ------------------------------
        sessions = {t: px.CreateSession(proxy_pb2.CreateSessionRequest(target="gated"),
                                        metadata=MD[t], timeout=30).session.session_id
                    for t in KEYS}
        outcomes: dict[str, list[Any]] = {t: [] for t in KEYS}

        def send(tenant: str, sizes: list[int]) -> None:
            for k, n in enumerate(sizes):
                req = proxy_pb2.PredictRequest(session_id=sessions[tenant], origin="outsider")
                for i in range(n):
                    req.images.add().CopyFrom(_image(f"{tenant}-{k}-{i}"))
                try:
                    px.Predict(req, metadata=MD[tenant], timeout=60)
                    outcomes[tenant].append(n)
                except grpc.RpcError as e:
                    outcomes[tenant].append(e)

        # greedy: 16 used; 6 x 5 fit (46), the 7th crosses 50 and is refused whole, 4 still
        # fit (50), then nothing does; alpha and beta: 8 used, 5 x 5 more (33)
        plans = {"greedy": [5] * 7 + [4, 1, 5], "alpha": [5] * 5, "beta": [5] * 5}
        threads = [threading.Thread(target=send, args=(t, s)) for t, s in plans.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        for tenant in ("alpha", "beta"):
            assert outcomes[tenant] == [5] * 5, outcomes[tenant]
        got = outcomes["greedy"]
        assert got[:6] == [5] * 6 and got[7] == 4, got
        for e in (got[6], got[8], got[9]):
            assert isinstance(e, grpc.RpcError), got
            (subject, description), = quota_violations(e)
            assert subject == "tenant:greedy" and "queries per day" in description, description
        assert servicer.images == {"alpha": 33, "beta": 33, "greedy": PER_DAY}
        for tenant, used in (("alpha", 33), ("beta", 33), ("greedy", PER_DAY)):
            st = px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(
                session_id=sessions[tenant]), metadata=MD[tenant], timeout=30)
            assert (st.tenant_queries_today, st.tenant_queries_per_day) == (used, PER_DAY)

        # -- greedy's next evaluation is refused before it starts (its 8 fixed queries do
        # not fit what is left of the day); alpha's and beta's complete -------------------
        exc = refused(lambda: create("greedy", "g4", 4))
        (subject, description), = quota_violations(exc)
        assert subject == "tenant:greedy" and "queries per day" in description, description
        assert f"used today {PER_DAY}" in exc.details(), exc.details()
        assert refused(lambda: _state(ev, "greedy", "g4")).code() == grpc.StatusCode.NOT_FOUND
        create("alpha", "a2", 2)
        create("beta", "b2", 2)
        for tenant, eid in (("alpha", "a2"), ("beta", "b2")):
            final = wait_final(ev, eid, MD[tenant])
            assert final.state == pb.EVALUATION_STATE_SUCCEEDED, (eid, final.error.message)
        assert servicer.images == {"alpha": 41, "beta": 41, "greedy": PER_DAY}
