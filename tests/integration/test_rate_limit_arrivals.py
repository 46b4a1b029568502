"""Rate limits as the target sees them: arrivals counted at a gRPC target of our own.

A tiny ``fortis.target.v1.TargetService`` on loopback records the monotonic time at which
every image reaches it. A real ``TargetProxy`` (domain classes, a SQLite ledger on a tmp
file, ``GrpcTargetBackend``) sits in front, and several client threads call
``TargetProxy.predict`` with batches of 1 and 5. No half-open one-second window of arrivals
may hold more than the limit: per target (20/s), and per tenant (8/s across two targets)
while another tenant hammers the same target.

The per-tenant case builds what the proxy does per call -- a ``CompositeLimiter`` of the
target's limiter and the tenant's (``TenantLimits.limiter_for``) -- as one ``TargetEntry``
per (target, tenant), all entries of a target sharing its one limiter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fortis.common.v1 import common_pb2
from fortis.infra.serving.server import RunningServer, ServerSettings, build_server
from fortis.services.common.codec import image_msg
from fortis.services.proxy.backends import GrpcTargetBackend
from fortis.services.proxy.ledger import Ledger, max_in_window
from fortis.services.proxy.proxy import TargetEntry, TargetProxy
from fortis.services.proxy.ratelimit import (
    DEFAULT_JITTER_S,
    CompositeLimiter,
    RateLimiter,
    TenantLimits,
)
from fortis.target.v1 import target_pb2, target_pb2_grpc


class RecordingTarget(target_pb2_grpc.TargetServiceServicer):
    """Answers label 0 for every image and records (image_id, arrival time)."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[str, float]] = []
        self._lock = threading.Lock()

    def GetTargetInfo(self, request: Any, context: Any) -> target_pb2.GetTargetInfoResponse:  # noqa: N802
        return target_pb2.GetTargetInfoResponse(info=target_pb2.TargetInfo(
            name="recorder", task_type=common_pb2.TASK_TYPE_CLASSIFICATION, labels=["a", "b"],
            output_kind=common_pb2.OUTPUT_KIND_LABEL_ONLY,
            input=target_pb2.InputSpec(height=4, width=4, channels=1, max_batch_size=64),
            version="1"))

    def Predict(self, request: Any, context: Any) -> target_pb2.PredictResponse:  # noqa: N802
        now = time.monotonic()
        with self._lock:
            self.arrivals += [(img.image_id, now) for img in request.images]
        return target_pb2.PredictResponse(predictions=[
            common_pb2.Prediction(image_id=img.image_id, classification=common_pb2.Classification(
                classes=[common_pb2.ClassScore(label=0, name="a")]))
            for img in request.images])

    def times(self, prefix: str = "") -> list[float]:
        with self._lock:
            return [t for i, t in self.arrivals if i.startswith(prefix)]


@pytest.fixture
def target() -> Iterator[tuple[RecordingTarget, RunningServer]]:
    servicer = RecordingTarget()
    server = build_server(ServerSettings(address="127.0.0.1:0"), [
        (target_pb2_grpc.add_TargetServiceServicer_to_server, servicer,
         "fortis.target.v1.TargetService")])
    try:
        yield servicer, server
    finally:
        server.stop(None)


IMAGE = np.zeros((4, 4), dtype=np.uint8)


class GrantLog:
    """A limiter wrapper that remembers each thread's grant times, to explain a failure:
    the guarantee holds while the grant-to-arrival delay varies by at most ``jitter_s``."""

    def __init__(self, inner: RateLimiter | CompositeLimiter) -> None:
        self.inner = inner
        self.grants: dict[tuple[int, ...], list[float]] = {}
        self.limit, self.unlimited = inner.limit, inner.unlimited

    def max_chunk(self) -> int:
        return self.inner.max_chunk()

    def acquire(self, n: int, tenant: str = "", should_stop: Any = None,
                idle: Any = None) -> float:
        t = self.inner.acquire(n, tenant, idle=idle) if should_stop is None else \
            self.inner.acquire(n, tenant, should_stop, idle=idle)
        self.grants.setdefault((threading.get_ident(),), []).append(t)
        return t


def delay_spread(servicer: RecordingTarget, logs: list[GrantLog],
                 threads: dict[int, str]) -> str:
    """Min and max grant-to-arrival delay (image ids are ``{prefix}{k}-{call}-{i}``)."""
    grants = {}
    for log in logs:
        for (ident,), ts in log.grants.items():
            for c, t in enumerate(ts):
                grants[f"{threads[ident]}-{c}-"] = t
    delays = [t - grants[i.rsplit("-", 1)[0] + "-"] for i, t in servicer.arrivals
              if i.rsplit("-", 1)[0] + "-" in grants]
    if not delays:
        return "no delays measured"
    return f"grant-to-arrival delay {min(delays):.3f}..{max(delays):.3f} s"


def hammer(proxy: TargetProxy, clients: list[tuple[str, str, str, int, int]],
           threads_out: dict[int, str] | None = None) -> float:
    """Run one thread per ``(tenant, target, prefix, batch, calls)``; return the seconds.

    ``calls=0`` keeps a client sending until every client with a count has finished.

    The channel is connected first (``target_info``, as the runner does before it sends):
    the guarantee assumes the grant-to-arrival delay varies by at most ``jitter_s``, and a
    first call that also has to open the connection is late by far more than that.
    """
    for name in {spec[1] for spec in clients}:
        proxy.target_info(name)
    failures: list[BaseException] = []
    stop = threading.Event()

    def run(k: int, tenant: str, target: str, prefix: str, batch: int, calls: int) -> None:
        if threads_out is not None:
            threads_out[threading.get_ident()] = f"{prefix}{k}"
        try:
            sid = proxy.create_session(tenant=tenant, target=target).session_id
            c = 0
            while (c < calls) if calls else not stop.is_set():
                proxy.predict(tenant=tenant, session_id=sid, origin="rate-test", images=[
                    image_msg(f"{prefix}{k}-{c}-{i}", IMAGE, raw=True) for i in range(batch)])
                c += 1
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(k, *spec)) for k, spec in enumerate(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t, spec in zip(threads, clients, strict=True):
        if spec[4]:
            t.join(timeout=60)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not failures, failures
    return time.monotonic() - t0


@pytest.mark.parametrize("batch, calls", [(1, 16), (5, 3)])
def test_per_target_limit_holds_at_the_target(tmp_path, target, batch, calls):
    servicer, server = target
    backend = GrpcTargetBackend(server.address)
    log = GrantLog(RateLimiter(20))
    proxy = TargetProxy(Ledger(tmp_path / "ledger.sqlite"), [
        TargetEntry(name="t", backend=backend, limiter=log)])  # type: ignore[arg-type]
    threads: dict[int, str] = {}
    try:
        elapsed = hammer(proxy, [("alice", "t", "x", batch, calls)] * 4, threads)
    finally:
        backend.close()
    times = servicer.times()
    assert len(times) == 4 * batch * calls
    assert max_in_window(times, 1.0) <= 20, delay_spread(servicer, [log], threads)
    # the limit is used, not just respected: 60-64 images at ~19/s take about 3 s
    assert elapsed < 2.0 * len(times) / 20


@pytest.mark.parametrize("batch", [1, 5])
def test_per_tenant_limit_holds_across_targets_while_another_tenant_hammers(
        tmp_path, target, batch):
    servicer, server = target
    backend = GrpcTargetBackend(server.address)
    tenants = TenantLimits.parse(["alice=8"])
    t1, t2 = RateLimiter(20), RateLimiter(20)
    logs = {"t1-alice": GrantLog(CompositeLimiter(t1, tenants.limiter_for("alice"))),
            "t2-alice": GrantLog(CompositeLimiter(t2, tenants.limiter_for("alice"))),
            "t1-bob": GrantLog(CompositeLimiter(t1, tenants.limiter_for("bob")))}
    entries = [TargetEntry(name=name, backend=backend, limiter=log)  # type: ignore[arg-type]
               for name, log in logs.items()]
    proxy = TargetProxy(Ledger(tmp_path / "ledger.sqlite"), entries)
    threads: dict[int, str] = {}
    calls = 16 if batch == 1 else 3
    try:
        hammer(proxy, [("alice", "t1-alice", "a1-", batch, calls),
                       ("alice", "t2-alice", "a2-", batch, calls),
                       ("bob", "t1-bob", "b-", batch, 0),        # bob sends all along
                       ("bob", "t1-bob", "b-", batch, 0)], threads)
    finally:
        backend.close()
    why = delay_spread(servicer, list(logs.values()), threads)
    alice = servicer.times("a")
    assert len(alice) == 2 * batch * calls
    assert max_in_window(alice, 1.0) <= 8, why                 # the tenant's limit
    on_t1 = servicer.times("a1-") + servicer.times("b-")
    assert max_in_window(on_t1, 1.0) <= 20, why                # and target 1's limit
    assert max_in_window(servicer.times(), 1.0) <= 40, why     # both targets together


def test_the_proxy_applies_tenant_limits_it_is_given(tmp_path, target):
    """The production path: ``TargetProxy(tenant_limits=...)`` (``fortis serve --tenant-rate``)
    combines each target's limiter with the calling tenant's on every send."""
    servicer, server = target
    backend = GrpcTargetBackend(server.address)
    entries = [TargetEntry(name=name, backend=backend, limiter=RateLimiter(20))
               for name in ("t1", "t2")]
    proxy = TargetProxy(Ledger(tmp_path / "ledger.sqlite"), entries,
                        tenant_limits=TenantLimits.parse(["alice=8"]))
    try:
        hammer(proxy, [("alice", "t1", "a1-", 1, 12), ("alice", "t2", "a2-", 1, 12),
                       ("bob", "t1", "b-", 1, 0)])
    finally:
        backend.close()
    alice = servicer.times("a")
    assert len(alice) == 24
    assert max_in_window(alice, 1.0) <= 8                      # alice's share, across targets
    assert max_in_window(servicer.times("a1-") + servicer.times("b-"), 1.0) <= 20
    assert len(servicer.times("b-")) > 12                      # bob was never held to alice's rate


# -- fair shares between tenants at a shared target ------------------------------------------
def shares_while(servicer: RecordingTarget, prefix: str) -> tuple[dict[str, int], float]:
    """Images per prefix (first letter) that arrived while ``prefix``'s calls were arriving,
    and the length of that span (s)."""
    mine = servicer.times(prefix)
    lo, hi = min(mine), max(mine)
    counts: dict[str, int] = {}
    for image_id, t in servicer.arrivals:
        if lo <= t <= hi:
            counts[image_id[0]] = counts.get(image_id[0], 0) + 1
    return counts, hi - lo


def test_batches_of_five_get_an_equal_share_against_single_images_from_many_threads(
        tmp_path, target):
    """Without a tenant rate, bob's single images from several threads took
    every slot freed at a 40/s target while alice's batches of five waited for five at once
    (her 40 images took 246 s). Fair turns (``FairQueue``) split the target in images."""
    servicer, server = target
    backend = GrpcTargetBackend(server.address)
    proxy = TargetProxy(Ledger(tmp_path / "ledger.sqlite"), [
        TargetEntry(name="t", backend=backend, limiter=RateLimiter(40))])
    try:
        hammer(proxy, [("bob", "t", "b-", 1, 0)] * 6 + [("alice", "t", "a-", 5, 8)])
    finally:
        backend.close()
    assert len(servicer.times("a")) == 40
    assert max_in_window(servicer.times(), 1.0) <= 40           # the limit still holds
    counts, _ = shares_while(servicer, "a")
    share = counts["a"] / sum(counts.values())
    assert share >= 0.4, counts     # an equal share is 0.5; unfair turns gave ~0.005


def test_three_tenants_with_different_batches_and_threads_share_equally(tmp_path, target):
    servicer, server = target
    backend = GrpcTargetBackend(server.address)
    proxy = TargetProxy(Ledger(tmp_path / "ledger.sqlite"), [
        TargetEntry(name="t", backend=backend, limiter=RateLimiter(30))])
    try:
        hammer(proxy, [("bob", "t", "b-", 1, 0)] * 3 + [("carol", "t", "c-", 2, 0)] * 2
               + [("alice", "t", "a-", 5, 8)])
    finally:
        backend.close()
    assert max_in_window(servicer.times(), 1.0) <= 30
    counts, _ = shares_while(servicer, "a")
    total = sum(counts.values())
    for who in "abc":
        assert counts.get(who, 0) / total >= 0.25, counts       # a third each


def test_a_tenant_held_by_its_own_limit_does_not_hold_the_others_back(tmp_path, target):
    """Bob's calls wait for bob's 10/s; meanwhile alice gets the rest of the target's 40/s
    (the queue sets a call held by its tenant's limit aside instead of blocking the line)."""
    servicer, server = target
    backend = GrpcTargetBackend(server.address)
    proxy = TargetProxy(Ledger(tmp_path / "ledger.sqlite"), [
        TargetEntry(name="t", backend=backend, limiter=RateLimiter(40))],
        tenant_limits=TenantLimits.parse(["bob=10"]))
    try:
        hammer(proxy, [("bob", "t", "b-", 1, 0)] * 3 + [("alice", "t", "a-", 5, 16)])
    finally:
        backend.close()
    assert max_in_window(servicer.times("b"), 1.0) <= 10
    assert max_in_window(servicer.times(), 1.0) <= 40
    counts, span = shares_while(servicer, "a")
    # the target stays busy: ~40/1.1 = 36 images/s in all, about 26 of them alice's
    assert sum(counts.values()) / span >= 0.75 * 40 / (1 + DEFAULT_JITTER_S), (counts, span)
    assert counts["a"] / span >= 0.6 * (40 / (1 + DEFAULT_JITTER_S) - 10), (counts, span)


def test_a_call_whose_deadline_passes_while_it_waits_is_never_sent(tmp_path, target):
    """A caller gone (deadline or cancel) stops waiting for the rate limit: its images never
    reach the target, the budget gets them back, and the ledger says "not sent" (long
    waits check the caller's deadline; the ledger is what the target saw)."""
    import grpc
    from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    servicer, server = target
    stack = start_stack(StackSettings(
        state_dir=tmp_path / "state", api_keys={"key-of-alice-0001": "alice"},
        targets=[TargetConfig.parse(f"t=grpc://{server.address}?rate=1")]))
    md = (("x-api-key", "key-of-alice-0001"),)
    try:
        with grpc.insecure_channel(stack.address) as ch:
            px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
            sid = px.CreateSession(proxy_pb2.CreateSessionRequest(target="t", query_budget=5),
                                   metadata=md, timeout=10).session.session_id

            def predict(image_id: str, timeout: float) -> proxy_pb2.PredictResponse:
                return px.Predict(proxy_pb2.PredictRequest(
                    session_id=sid, origin="test", images=[image_msg(image_id, IMAGE, raw=True)]),
                    metadata=md, timeout=timeout)

            assert predict("first", 10).queries_left == 4
            with pytest.raises(grpc.RpcError) as err:
                predict("late", 0.3)        # the next slot is ~1.1 s away
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            time.sleep(1.5)                 # past the slot it was waiting for
            assert servicer.times("late") == []
            st = px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id=sid),
                                    metadata=md, timeout=10)
            assert (st.queries_ok, st.queries_attempted, st.queries_in_flight) == (1, 1, 0)
            assert predict("next", 10).queries_left == 3     # the budget got "late" back
            rows = px.ListLedgerEntries(proxy_pb2.ListLedgerEntriesRequest(session_id=sid),
                                        metadata=md, timeout=10).entries
            late = [r for r in rows if r.image_id == "late"]
            assert len(late) == 1 and "not sent" in late[0].error, late
    finally:
        stack.stop(0)
