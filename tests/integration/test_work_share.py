"""The tenant-fair share of CPU-heavy work through a real stack (infra/serving/workshare.py):
a tenant's costly calls -- scoring Compute, ApplyPerturbation, white-box RunAttack, Predict on
a built-in target -- and the work Fortis does for its evaluations take turns with another
tenant's, instead of queueing behind all of them.

One work slot, so the order is the policy's and not the machine's speed: every step waits
until the share's own state shows the calls where they should be (running or waiting)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from fortis.common.v1 import common_pb2
from fortis.evaluation.v1 import evaluation_pb2 as ev
from fortis.evaluation.v1 import evaluation_pb2_grpc
from fortis.perturbation.v1 import perturbation_pb2 as pt
from fortis.perturbation.v1 import perturbation_pb2_grpc
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.scoring.v1 import scoring_pb2, scoring_pb2_grpc
from google.protobuf import json_format, struct_pb2

KEYS = {"work-share-key-alice-0123456789": "alice",
        "work-share-key-mallory-0123456789": "mallory"}
ALICE = (("x-api-key", "work-share-key-alice-0123456789"),)
MALLORY = (("x-api-key", "work-share-key-mallory-0123456789"),)

PLAN = """
name: share
seed: 4
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 8}
correctness: {mode: top1}
corruptions:
  - {id: contrast, severities: [1, 3]}
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory, fmnist_target) -> Iterator[Any]:
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    s = start_stack(StackSettings(
        state_dir=tmp_path_factory.mktemp("share") / "state", api_keys=dict(KEYS),
        targets=[TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn")], work_slots=1))
    yield s
    s.stop(0)


@pytest.fixture(scope="module")
def channel(stack) -> Iterator[grpc.Channel]:
    ch = grpc.insecure_channel(stack.address)
    yield ch
    ch.close()


def _irt(chain: int) -> scoring_pb2.ComputeRequest:
    """An IRT fit of 50 subjects x 50 metrics: about a second of one core per 6,000 steps."""
    rng = np.random.default_rng(0)
    n = 50
    params = {"subjects": [f"s{i}" for i in range(n)],
              "metrics": [{"name": f"m{j}", "category": "c",
                           "values": [float(v) for v in rng.random(n)],
                           "higher_is_better": True} for j in range(n)],
              "chain_length": chain, "burn_in": chain // 2}
    s = struct_pb2.Struct()
    json_format.ParseDict(params, s)
    return scoring_pb2.ComputeRequest(metric="irt", params=s)


def _until(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _state(stack: Any, tenant: str, key: str) -> int:
    return int(stack.work.snapshot().get(tenant, {}).get(key, 0))


class Calls:
    """Calls in threads; ``done`` lists their names in the order they ended."""

    def __init__(self) -> None:
        self.done: list[str] = []
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()

    def start(self, name: str, fn: Callable[[], Any]) -> None:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported by join
                self.errors.append(exc)
            with self.lock:
                self.done.append(name)
        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.threads.append(t)

    def join(self) -> None:
        for t in self.threads:
            t.join(300)
        assert not self.errors, self.errors


def _session(channel: grpc.Channel, md: Any) -> str:
    px = proxy_pb2_grpc.TargetProxyServiceStub(channel)
    return px.CreateSession(proxy_pb2.CreateSessionRequest(target="fmnist-cnn"), metadata=md,
                            timeout=30).session.session_id


def _images(n: int) -> list[common_pb2.Image]:
    rng = np.random.default_rng(1)
    return [common_pb2.Image(image_id=f"i{i}", tensor=common_pb2.Tensor(
        dtype=common_pb2.D_TYPE_UINT8, shape=[28, 28, 1],
        data=rng.integers(0, 256, 784, dtype=np.uint8).tobytes())) for i in range(n)]


def test_one_call_is_served_between_a_flood_of_anothers(stack, channel) -> None:
    """Mallory's five Compute calls are in (one running, four waiting) when alice's one
    comes: hers is the next to run, not the sixth."""
    sc = scoring_pb2_grpc.ScoringServiceStub(channel)
    heavy = _irt(8000)
    calls = Calls()
    for i in range(5):
        calls.start(f"m{i}", lambda: sc.Compute(heavy, metadata=MALLORY, timeout=300))
    _until(lambda: _state(stack, "mallory", "running") == 1
           and _state(stack, "mallory", "waiting") == 4, "mallory's calls queue")
    calls.start("alice", lambda: sc.Compute(heavy, metadata=ALICE, timeout=300))
    calls.join()
    assert calls.done.index("alice") == 1, calls.done


@pytest.mark.parametrize("rpc", ["Predict", "ApplyPerturbation", "RunAttack"])
def test_each_costly_call_takes_the_callers_share(stack, channel, fmnist_surrogate,
                                                  rpc: str) -> None:
    """While mallory's call holds the only slot, alice's Predict on the built-in target,
    ApplyPerturbation and white-box RunAttack wait for it (and then run): each is counted as
    work, for alice. (Which of the two answers first after that is a race between
    mallory's answer being serialised and alice's small piece: not looked at.)"""
    sc = scoring_pb2_grpc.ScoringServiceStub(channel)
    pert = perturbation_pb2_grpc.PerturbationServiceStub(channel)
    px = proxy_pb2_grpc.TargetProxyServiceStub(channel)
    images = _images(4)
    if rpc == "Predict":
        sid = _session(channel, ALICE)
        call: Callable[[], Any] = lambda: px.Predict(  # noqa: E731
            proxy_pb2.PredictRequest(session_id=sid, origin="t", images=images),
            metadata=ALICE, timeout=120)
    elif rpc == "ApplyPerturbation":
        call = lambda: pert.ApplyPerturbation(pt.ApplyPerturbationRequest(  # noqa: E731
            perturbation_id="gaussian_noise", severity=3, seed=1, images=images),
            metadata=ALICE, timeout=120)
    else:
        # the built-in surrogate is no target's twin: no white-box grant is needed for it
        req = pt.RunAttackRequest(attack_id="fgsm", seed=1, surrogate="fmnist-surrogate",
                                  images=[pt.LabeledImage(image=m, labels=[0])
                                          for m in images])
        req.params.update({"epsilon": 0.05})
        call = lambda: list(pert.RunAttack(req, metadata=ALICE, timeout=120))  # noqa: E731
    call()                                    # warm: models loaded before the order matters
    calls = Calls()
    calls.start("mallory", lambda: sc.Compute(_irt(30000), metadata=MALLORY, timeout=300))
    _until(lambda: _state(stack, "mallory", "running") == 1, "mallory's call runs")
    calls.start("alice", call)
    _until(lambda: _state(stack, "alice", "waiting") == 1 or calls.done,
           f"alice's {rpc} waits for the slot")
    assert calls.done == [], "mallory's call ended before alice's could be seen waiting"
    assert _state(stack, "mallory", "running") == 1
    calls.join()                              # and then it ran
    assert sorted(calls.done) == ["alice", "mallory"]
    assert _state(stack, "alice", "waiting") == _state(stack, "alice", "running") == 0


def test_an_evaluations_work_is_counted_for_its_tenant(stack, channel) -> None:
    evs = evaluation_pb2_grpc.EvaluationServiceStub(channel)
    before = stack.work.snapshot().get("alice", {}).get("used_s", 0.0)
    e = evs.CreateEvaluation(ev.CreateEvaluationRequest(plan=PLAN), metadata=ALICE,
                             timeout=30).evaluation
    seen: set[str] = set()

    def progress() -> bool:
        seen.update(t for t, v in stack.work.snapshot().items() if v["running"])
        got = evs.GetEvaluation(ev.GetEvaluationRequest(evaluation_id=e.evaluation_id),
                                metadata=ALICE, timeout=30).evaluation
        return got.state in (ev.EVALUATION_STATE_SUCCEEDED, ev.EVALUATION_STATE_FAILED)

    _until(progress, "the evaluation ends", timeout=240)
    got = evs.GetEvaluation(ev.GetEvaluationRequest(evaluation_id=e.evaluation_id),
                            metadata=ALICE, timeout=30).evaluation
    assert got.state == ev.EVALUATION_STATE_SUCCEEDED, got.error
    assert seen <= {"alice"}, seen            # nothing counted for the service or "default"
    assert stack.work.snapshot()["alice"]["used_s"] > before


# -- the pace of a tenant's calls, and seats --------------------------------------------------

@pytest.fixture(scope="module")
def paced(tmp_path_factory, fmnist_target) -> Iterator[Any]:
    """Five calls per second per tenant; one seat and one work slot; a slow target (an
    evaluation that runs a few seconds, to watch)."""
    from fortis.infra.serving.quotas import QuotaSettings
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    s = start_stack(StackSettings(
        state_dir=tmp_path_factory.mktemp("paced") / "state", api_keys=dict(KEYS),
        targets=[TargetConfig.parse("fmnist-slow=builtin:fmnist-cnn?rate=4")], work_slots=1,
        quotas=QuotaSettings(max_call_rate=5)))
    yield s
    s.stop(0)


def test_a_flood_of_calls_waits_its_turn_or_is_refused_and_the_other_tenant_is_not(
        paced) -> None:
    """Thirty ListTargets of mallory at once: the burst (5) and two seconds of turns (10)
    are answered, the rest RESOURCE_EXHAUSTED naming her; alice's calls meanwhile are all
    answered (her own bucket)."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    with grpc.insecure_channel(paced.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        flood = [px.ListTargets.future(proxy_pb2.ListTargetsRequest(), metadata=MALLORY,
                                       timeout=30) for _ in range(30)]
        mine = [px.ListTargets(proxy_pb2.ListTargetsRequest(), metadata=ALICE, timeout=30)
                for _ in range(5)]
        assert len(mine) == 5
        codes = []
        for f in flood:
            exc = f.exception()
            codes.append(grpc.StatusCode.OK if exc is None else exc.code())
            if exc is not None:
                status = rpc_status.from_call(exc)
                assert status is not None
                qf = error_details_pb2.QuotaFailure()
                assert status.details[0].Unpack(qf)
                assert qf.violations[0].subject == "tenant:mallory"
                assert "calls of this tenant started per second" in exc.details()
        answered = codes.count(grpc.StatusCode.OK)
        assert 15 <= answered <= 17, codes      # 5 + 2 s x 5/s (+ what came back meanwhile)
        assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}


def test_a_watch_stream_gives_its_seat_back_after_its_first_message(paced) -> None:
    evs = evaluation_pb2_grpc.EvaluationServiceStub(grpc.insecure_channel(paced.address))
    e = evs.CreateEvaluation(ev.CreateEvaluationRequest(
        plan=PLAN.replace("fmnist-cnn", "fmnist-slow")), metadata=ALICE, timeout=30).evaluation
    stream = evs.WatchEvaluation(ev.WatchEvaluationRequest(evaluation_id=e.evaluation_id),
                                 metadata=ALICE, timeout=120)
    first = next(stream)
    assert first.evaluation.state in (ev.EVALUATION_STATE_PENDING, ev.EVALUATION_STATE_RUNNING)
    time.sleep(0.3)                           # the stream is open, waiting for changes
    assert paced.seats.snapshot().get("alice", {}).get("running", 0) == 0
    # with the only seat free, alice's (and anyone's) next call is not held behind it
    got = evs.GetEvaluation(ev.GetEvaluationRequest(evaluation_id=e.evaluation_id),
                            metadata=ALICE, timeout=30).evaluation
    assert got.evaluation_id == e.evaluation_id
    stream.cancel()
