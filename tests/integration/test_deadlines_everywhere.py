"""Long computations stop at the caller's deadline or cancellation, over real gRPC on loopback
(so one tenant cannot stall every tenant; bounded work: long computations check the caller's
deadline / cancellation and stop; IEEE-M6 query budgets keep being what the ledger counts).

- RunAttack (a query attack with the largest budget the test affords) with a 1 s deadline ends
  DEADLINE_EXCEEDED and the proxy ledger stops growing within a bounded time (measured); a
  cancelled RunAttack stream stops the attack: the ledger shows no further queries after the
  cancel settles.
- ApplyPerturbation of a heavy batch with a short deadline, on a server with two workers, ends
  DEADLINE_EXCEEDED and both workers are free again soon after: two small calls at once
  answer promptly.
- A transfer attack on the surrogate stops the same way (the surrogate's forward passes poll).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from fortis.infra.serving.server import RunningServer, ServerSettings, build_server
from fortis.perturbation.v1 import perturbation_pb2 as ppb
from fortis.perturbation.v1 import perturbation_pb2_grpc
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common.codec import image_msg
from google.protobuf import struct_pb2

from tests.conftest import API_KEY, MD

#: How long the server may take to stop after the deadline or cancel (a few query round trips).
SETTLE_S = 1.5


def _attack_request(attack_id: str, params: dict, session_id: str, images: np.ndarray,
                    labels: np.ndarray, n: int, surrogate: str = "") -> ppb.RunAttackRequest:
    s = struct_pb2.Struct()
    s.update(params)
    return ppb.RunAttackRequest(
        attack_id=attack_id, params=s, seed=3, proxy_session_id=session_id, surrogate=surrogate,
        images=[ppb.LabeledImage(image=image_msg(f"d{k}", images[k]), labels=[int(labels[k])])
                for k in range(n)])


def _attempted(px: proxy_pb2_grpc.TargetProxyServiceStub, session_id: str) -> int:
    st = px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id=session_id),
                            metadata=MD, timeout=10)
    return int(st.queries_attempted)


def _settled(px: proxy_pb2_grpc.TargetProxyServiceStub, session_id: str,
             since: float) -> tuple[int, float]:
    """Poll the ledger until it stops growing for 0.5 s; (final count, seconds after
    ``since`` the last growth was seen). Fails when it still grows after SETTLE_S."""
    last, last_change = _attempted(px, session_id), time.monotonic()
    while time.monotonic() - last_change < 0.5:
        time.sleep(0.05)
        now = _attempted(px, session_id)
        if now != last:
            last, last_change = now, time.monotonic()
        assert last_change - since < SETTLE_S, "the attack still queries the target"
    return last, last_change - since


@pytest.fixture()
def stubs(channel: grpc.Channel) -> tuple:
    return (perturbation_pb2_grpc.PerturbationServiceStub(channel),
            proxy_pb2_grpc.TargetProxyServiceStub(channel))


def _session(px: proxy_pb2_grpc.TargetProxyServiceStub) -> str:
    return str(px.CreateSession(proxy_pb2.CreateSessionRequest(target="fmnist-cnn"),
                                metadata=MD, timeout=10).session.session_id)


# A Square attack with a bound too small to succeed and a budget far past what 1 s can spend:
# without a stop it would query for minutes.
_HEAVY_SQUARE = {"epsilon": 0.01, "max_queries": 200_000}


def test_run_attack_stops_at_the_deadline(stubs, fmnist_test_images) -> None:
    pt, px = stubs
    images, labels = fmnist_test_images
    sid = _session(px)
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as ei:
        list(pt.RunAttack(_attack_request("square", _HEAVY_SQUARE, sid, images, labels, 16),
                          metadata=MD, timeout=1.0))
    assert ei.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = t0 + 1.0
    sent_before, settle = _settled(px, sid, deadline)
    assert sent_before > 16, "the attack never started: the test proves nothing"
    print(f"RunAttack: {sent_before} queries, ledger quiet {settle:.2f} s after the deadline")
    time.sleep(1.0)
    assert _attempted(px, sid) == sent_before           # nothing more reached the target
    # The worker is free: a small attack answers at once.
    t1 = time.monotonic()
    out = list(pt.RunAttack(_attack_request("square", {"epsilon": 0.3, "max_queries": 5},
                                            _session(px), images, labels, 2),
                            metadata=MD, timeout=10))
    assert len(out) == 2 and time.monotonic() - t1 < 5.0


def test_cancelling_run_attack_stops_the_queries(stubs, fmnist_test_images) -> None:
    pt, px = stubs
    images, labels = fmnist_test_images
    sid = _session(px)
    call = pt.RunAttack(_attack_request("square", _HEAVY_SQUARE, sid, images, labels, 16),
                        metadata=MD, timeout=60)
    errors: list[grpc.RpcError] = []

    def consume() -> None:
        try:
            list(call)
        except grpc.RpcError as exc:
            errors.append(exc)

    reader = threading.Thread(target=consume)
    reader.start()
    started = time.monotonic()
    while _attempted(px, sid) < 50:                     # the attack is under way
        assert time.monotonic() - started < 20, "the attack never started"
        time.sleep(0.05)
    cancelled_at = time.monotonic()
    call.cancel()
    reader.join(10)
    assert errors and errors[0].code() == grpc.StatusCode.CANCELLED
    count, settle = _settled(px, sid, cancelled_at)
    print(f"RunAttack cancel: ledger quiet {settle:.2f} s after the cancel ({count} queries)")
    time.sleep(1.0)
    assert _attempted(px, sid) == count


def test_transfer_attack_stops_at_the_deadline(stubs, fmnist_test_images) -> None:
    """PGD on the surrogate: no target queries, so the stop is seen as time and a free worker."""
    pt, _ = stubs
    images, labels = fmnist_test_images
    req = _attack_request("pgd", {"epsilon": 0.1, "steps": 1000}, "", images, labels, 256,
                          surrogate="fmnist-surrogate")
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as ei:
        list(pt.RunAttack(req, metadata=MD, timeout=0.5))
    assert ei.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # Stopped, the process goes quiet; still running, PGD would burn a core per second.
    time.sleep(SETTLE_S)
    cpu0, wall0 = time.process_time(), time.monotonic()
    time.sleep(1.0)
    cpu = time.process_time() - cpu0
    assert cpu < 0.5 * (time.monotonic() - wall0), f"still busy: {cpu:.2f} s CPU in 1 s"
    assert time.monotonic() - t0 < 10


@pytest.fixture()
def two_workers(fmnist_surrogate) -> Iterator[RunningServer]:
    """A perturbation service alone on a server with two worker threads."""
    from fortis.services.perturbation.servicer import SERVICE_NAME, PerturbationServicer

    servicer = PerturbationServicer(proxy_stub=None,
                                    surrogate_loader=lambda name, field: fmnist_surrogate)
    srv = build_server(ServerSettings(api_keys={API_KEY: "tenant-a"}, max_workers=2), [
        (perturbation_pb2_grpc.add_PerturbationServiceServicer_to_server, servicer,
         SERVICE_NAME)])
    yield srv
    srv.stop(0)


def test_apply_perturbation_stops_and_frees_the_workers(two_workers) -> None:
    rng = np.random.default_rng(0)
    heavy = [image_msg(f"h{i}", rng.integers(0, 256, (224, 224, 3), dtype=np.uint8))
             for i in range(64)]
    small = [image_msg("s0", rng.integers(0, 256, (28, 28, 1), dtype=np.uint8))]
    with grpc.insecure_channel(two_workers.address) as ch:
        pt = perturbation_pb2_grpc.PerturbationServiceStub(ch)
        heavy_req = ppb.ApplyPerturbationRequest(perturbation_id="local_blur", severity=30,
                                                 seed=1, images=heavy)
        t0 = time.monotonic()
        for _ in range(2):                              # occupy both workers
            with pytest.raises(grpc.RpcError) as ei:
                pt.ApplyPerturbation(heavy_req, metadata=MD, timeout=0.5)
            assert ei.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # Two small calls at once: each needs a free worker.
        answers: list[float] = []

        def small_call() -> None:
            t = time.monotonic()
            pt.ApplyPerturbation(ppb.ApplyPerturbationRequest(
                perturbation_id="local_blur", severity=1, seed=1, images=small),
                metadata=MD, timeout=10)
            answers.append(time.monotonic() - t)

        threads = [threading.Thread(target=small_call) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        assert len(answers) == 2
        print(f"ApplyPerturbation: two small calls answered in {max(answers):.2f} s, "
              f"{time.monotonic() - t0:.2f} s after the first heavy call")
        assert max(answers) < 3.0


def test_the_heavy_batch_is_heavy(two_workers) -> None:
    """The premise of the test above: without a deadline, the heavy batch takes longer than
    the deadline it was given (else stopping it proves nothing)."""
    rng = np.random.default_rng(0)
    heavy = [image_msg(f"h{i}", rng.integers(0, 256, (224, 224, 3), dtype=np.uint8))
             for i in range(8)]
    with grpc.insecure_channel(two_workers.address) as ch:
        pt = perturbation_pb2_grpc.PerturbationServiceStub(ch)
        t0 = time.monotonic()
        pt.ApplyPerturbation(ppb.ApplyPerturbationRequest(perturbation_id="local_blur",
                                                          severity=30, seed=1, images=heavy),
                             metadata=MD, timeout=120)
        per_image = (time.monotonic() - t0) / 8
    print(f"local_blur level 30 at 224x224: {per_image:.3f} s per image")
    assert per_image * 64 > 2 * 0.5
