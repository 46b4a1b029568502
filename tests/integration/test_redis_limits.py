"""Three proxy replicas sharing one Redis hold the limits and budgets in total (a global rate
limit and budgets across proxy replicas; SPEC: queries counted per image at the proxy, the
exact rate limit at the target, session budgets and Q_m).

Real parts only: a real ``redis-server`` (tests/infra), three ``fortis serve --service proxy
--redis-url ...`` processes, each with its own state dir and SQLite ledger, in front of one
gRPC target of the test's own that records the arrival time of every image
(``RecordingTarget``), and gRPC clients hammering all three replicas at once.

Bounds, derived (``ratelimit.py``): a limit of L images/s with the default margin
``jitter_s`` = 0.1 s sustains at most ``n * floor(L / n) / (1 + jitter_s)`` images/s for
batches of n (18.2/s for L = 20 and n = 1 or 5): no 1-second window at the target may hold
more than L, and the replicas together must reach most of that ceiling.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from fortis.infra.serving.server import RunningServer, ServerSettings, build_server
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common.codec import image_msg
from fortis.services.proxy.ledger import max_in_window
from fortis.services.proxy.ratelimit import DEFAULT_JITTER_S
from fortis.target.v1 import target_pb2_grpc

from tests.integration.test_rate_limit_arrivals import RecordingTarget

KEYS = {"alice": "key-of-alice-0001", "bob": "key-of-bob-00001", "carol": "key-of-carol-001"}
LIMIT, ALICE_LIMIT, CAROL_PER_DAY = 20, 8, 10
IMAGE = np.zeros((4, 4), dtype=np.uint8)


def ceiling(limit: int, batch: int) -> float:
    """The most an exact limit allows, sustained (ratelimit.py's docstring)."""
    return batch * (limit // batch) / (1.0 + DEFAULT_JITTER_S)


class Replica:
    """One ``fortis serve --service proxy`` process; stdout goes to a file (read for the
    ready line), so its log lines never fill a pipe and stall it."""

    def __init__(self, tmp: Path, target: str, redis_url: str, namespace: str) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.out = tmp / "stdout.log"
        self.err = tmp / "stderr.log"
        env = {**os.environ, "FORTIS_API_KEYS": ",".join(f"{k}={t}" for t, k in KEYS.items()),
               "FORTIS_REDIS_URL": redis_url}     # the URL from the environment, as deployed
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fortis.server.cli", "serve", "--service", "proxy",
                 "--address", "127.0.0.1:0", "--state-dir", str(tmp / "state"),
                 "--log-level", "warning", "--no-default-targets", "--ledger-sync", "NORMAL",
                 "--target", f"t=grpc://{target}?rate={LIMIT}",
                 "--tenant-rate", f"alice={ALICE_LIMIT}", "--redis-namespace", namespace,
                 "--tenant-quota", f"carol=queries_per_day:{CAROL_PER_DAY}"],
                cwd=tmp, env=env, stdout=out, stderr=err)
        self.address = ""

    def wait_ready(self, timeout_s: float = 90.0) -> Replica:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.out.read_text().splitlines():
                if line.startswith("{") and '"services"' in line and '"targets"' in line:
                    self.address = json.loads(line)["address"]
                    return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"proxy replica did not start: {self.err.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_replicas(tmp: Path, target: str, redis_url: str, n: int = 3) -> list[Replica]:
    ns = f"it-{uuid.uuid4().hex[:8]}"
    replicas = [Replica(tmp / f"replica{k}", target, redis_url, ns) for k in range(n)]
    try:
        for r in replicas:
            r.wait_ready()
            with grpc.insecure_channel(r.address) as ch:     # open the proxy's channel to
                proxy_pb2_grpc.TargetProxyServiceStub(ch).GetTargetInfo(   # the target first
                    proxy_pb2.GetTargetInfoRequest(target="t"),
                    metadata=(("x-api-key", KEYS["bob"]),), timeout=30)
    except BaseException:
        for r in replicas:
            r.stop()
        raise
    return replicas


@pytest.fixture(scope="module")
def recording_target() -> Iterator[tuple[RecordingTarget, RunningServer]]:
    servicer = RecordingTarget()
    server = build_server(ServerSettings(address="127.0.0.1:0"), [
        (target_pb2_grpc.add_TargetServiceServicer_to_server, servicer,
         "fortis.target.v1.TargetService")])
    try:
        yield servicer, server
    finally:
        server.stop(None)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, recording_target, redis_server) -> Iterator[list[Replica]]:
    _, server = recording_target
    started = start_replicas(tmp_path_factory.mktemp("replicas"), server.address,
                             redis_server.url)
    try:
        yield started
    finally:
        for r in started:
            r.stop()


def md(tenant: str) -> tuple[tuple[str, str], ...]:
    return (("x-api-key", KEYS[tenant]),)


def predict(stub: Any, tenant: str, sid: str, ids: list[str]) -> Any:
    return stub.Predict(proxy_pb2.PredictRequest(
        session_id=sid, origin="redis-test",
        images=[image_msg(i, IMAGE, raw=True) for i in ids]), metadata=md(tenant), timeout=60)


def run_clients(clients: list[tuple[str, Callable[[Any], None]]]) -> list[BaseException]:
    """One thread per (replica address, body(stub)); the failures they raised."""
    failures: list[BaseException] = []

    def run(address: str, body: Callable[[Any], None]) -> None:
        try:
            with grpc.insecure_channel(address) as ch:
                body(proxy_pb2_grpc.TargetProxyServiceStub(ch))
        except BaseException as exc:  # pragma: no cover - reported by the caller
            failures.append(exc)

    threads = [threading.Thread(target=run, args=c) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return failures


def hammer(replicas: list[Replica], tenant: str, prefix: str, batch: int, calls: int
           ) -> list[tuple[str, Callable[[Any], None]]]:
    """Two client threads per replica, each sending ``calls`` batches in its own session."""
    def body_for(k: int) -> Callable[[Any], None]:
        def body(stub: Any) -> None:
            sid = f"{prefix}{k}"
            stub.CreateSession(proxy_pb2.CreateSessionRequest(target="t", session_id=sid),
                               metadata=md(tenant), timeout=30)
            for c in range(calls):
                predict(stub, tenant, sid, [f"{prefix}{k}-{c}-{i}" for i in range(batch)])
        return body
    return [(r.address, body_for(2 * j + m)) for j, r in enumerate(replicas) for m in range(2)]


@pytest.mark.parametrize("batch, calls", [(1, 12), (5, 3)])
def test_three_replicas_keep_the_target_limit_in_total(recording_target, replicas, batch,
                                                       calls):
    servicer, _ = recording_target
    prefix = f"T{batch}-"
    t0 = time.monotonic()
    failures = run_clients(hammer(replicas, "bob", prefix, batch, calls))
    elapsed = time.monotonic() - t0
    assert not failures, failures
    times = servicer.times(prefix)
    assert len(times) == 6 * batch * calls               # 72 or 90 images, every one sent
    assert max_in_window(times, 1.0) <= LIMIT            # one replica alone would allow 3x
    # the limit is used, not just respected: the derived ceiling, less scheduling slack on
    # a busy 2-core machine (three proxies, six clients and Redis share it)
    rate = (len(times) - 1) / (max(times) - min(times))
    print(f"batch {batch}: {len(times)} images, {rate:.2f}/s (ceiling "
          f"{ceiling(LIMIT, batch):.2f}), busiest second {max_in_window(times, 1.0)}")
    assert rate >= 0.8 * ceiling(LIMIT, batch), (rate, elapsed)


@pytest.mark.parametrize("batch", [1, 5])
def test_a_tenant_limit_holds_across_replicas_while_another_tenant_hammers(
        recording_target, replicas, batch):
    servicer, _ = recording_target
    a, b = f"A{batch}-", f"B{batch}-"
    calls = 8 if batch == 1 else 2      # 48 or 60 images of alice at her 8/s
    clients = hammer(replicas, "alice", a, batch, calls) + \
        hammer(replicas, "bob", b, batch, calls * 2)
    failures = run_clients(clients)
    assert not failures, failures
    alice = servicer.times(a)
    assert len(alice) == 6 * batch * calls
    assert max_in_window(alice, 1.0) <= ALICE_LIMIT                  # the tenant's limit
    assert max_in_window(alice + servicer.times(b), 1.0) <= LIMIT    # the target's
    alice_rate = (len(alice) - 1) / (max(alice) - min(alice))
    print(f"batch {batch}: alice {alice_rate:.2f}/s (ceiling {ceiling(ALICE_LIMIT, batch):.2f}),"
          f" busiest second alice {max_in_window(alice, 1.0)}, target "
          f"{max_in_window(alice + servicer.times(b), 1.0)}")
    assert alice_rate >= 0.7 * ceiling(ALICE_LIMIT, batch), alice_rate


def test_a_session_budget_is_shared_by_the_replicas(recording_target, replicas):
    """The same session on three replicas (their own ledgers, one Redis): the target gets
    exactly the query budget (25), and exactly Q_m = 3 of each image id; the rest is
    RESOURCE_EXHAUSTED, nothing more sent."""
    servicer, _ = recording_target
    sid_total, sid_per_image = f"budget-{uuid.uuid4().hex[:6]}", f"qm-{uuid.uuid4().hex[:6]}"
    refused: list[int] = []
    lock = threading.Lock()

    def until_refused(stub: Any, sid: str, ids: Callable[[int], list[str]]) -> None:
        c = 0
        while True:
            try:
                predict(stub, "alice", sid, ids(c))
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                with lock:
                    refused.append(1)
                return
            c += 1

    def body_for(k: int) -> Callable[[Any], None]:
        def body(stub: Any) -> None:
            stub.CreateSession(proxy_pb2.CreateSessionRequest(
                target="t", session_id=sid_total, query_budget=25), metadata=md("alice"),
                timeout=30)
            stub.CreateSession(proxy_pb2.CreateSessionRequest(
                target="t", session_id=sid_per_image, per_image_budget=3),
                metadata=md("alice"), timeout=30)
            until_refused(stub, sid_total, lambda c: [f"Q{k}-{c}-{i}" for i in range(1 + k % 2)])
            until_refused(stub, sid_total, lambda c: [f"Q{k}-last-{c}"])    # fill the rest
            until_refused(stub, sid_per_image, lambda c: [f"M{(k + c) % 4}"])
        return body

    failures = run_clients([(r.address, body_for(2 * j + m))
                            for j, r in enumerate(replicas) for m in range(2)])
    assert not failures, failures
    assert len(servicer.times("Q")) == 25
    per_image = [sum(1 for i, _ in servicer.arrivals if i == f"M{m}") for m in range(4)]
    assert per_image == [3, 3, 3, 3]
    assert len(refused) == 6 * 3


def test_a_tenants_queries_per_day_hold_across_replicas(recording_target, replicas):
    """Carol may send 10 images a day: six clients on three replicas get exactly 10 to the
    target between them, then RESOURCE_EXHAUSTED naming the tenant's quota."""
    servicer, _ = recording_target
    quota_errors: list[grpc.RpcError] = []

    def body_for(k: int) -> Callable[[Any], None]:
        def body(stub: Any) -> None:
            sid = f"carol-{k}"
            stub.CreateSession(proxy_pb2.CreateSessionRequest(target="t", session_id=sid),
                               metadata=md("carol"), timeout=30)
            for c in range(10):
                try:
                    predict(stub, "carol", sid, [f"C{k}-{c}"])
                except grpc.RpcError as exc:
                    quota_errors.append(exc)
                    return
        return body

    failures = run_clients([(r.address, body_for(2 * j + m))
                            for j, r in enumerate(replicas) for m in range(2)])
    assert not failures, failures
    assert len(servicer.times("C")) == CAROL_PER_DAY
    assert len(quota_errors) == 6
    assert all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "queries per day" in
               e.details() for e in quota_errors), quota_errors


def test_fortis_serve_refuses_a_malformed_redis_url_without_repeating_it(tmp_path):
    r = subprocess.run([sys.executable, "-m", "fortis.server.cli", "serve", "--service", "proxy",
                        "--address", "127.0.0.1:0", "--state-dir", str(tmp_path / "s"),
                        "--no-default-targets", "--redis-url", "http://user:hunter2-pw@h:1"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "redis_url" in r.stderr and "hunter2" not in r.stderr + r.stdout
    assert "Traceback" not in r.stderr


def test_redis_killed_mid_run_fails_closed_then_recovers(tmp_path, recording_target,
                                                         redis_factory):
    """Redis killed while clients send: every call is UNAVAILABLE with the message, nothing
    more reaches the target, the refusals are recorded; Redis back: calls succeed again."""
    servicer, server = recording_target
    redis = redis_factory().start()
    (replica, other) = start_replicas(tmp_path, server.address, redis.url, n=2)
    try:
        with grpc.insecure_channel(replica.address) as ch:
            stub = proxy_pb2_grpc.TargetProxyServiceStub(ch)
            stub.CreateSession(proxy_pb2.CreateSessionRequest(
                target="t", session_id="k", query_budget=1000), metadata=md("bob"), timeout=30)
            stub.CreateSession(proxy_pb2.CreateSessionRequest(target="t", session_id="free"),
                               metadata=md("bob"), timeout=30)
            predict(stub, "bob", "k", ["K-before"])
            redis.stop()
            sent_at_kill = len(servicer.times("K-"))
            errors = []
            for c in range(6):      # a budgeted session (budget check) and a free one (limiter)
                for sid in ("k", "free"):
                    with pytest.raises(grpc.RpcError) as e:
                        predict(stub, "bob", sid, [f"K-down-{sid}-{c}"])
                    errors.append(e.value)
            assert all(e.code() == grpc.StatusCode.UNAVAILABLE for e in errors), errors
            assert all("rate limiter store unavailable" in e.details() for e in errors)
            time.sleep(0.2)
            assert len(servicer.times("K-")) == sent_at_kill     # nothing reached the target
            stats = stub.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id="k"),
                                         metadata=md("bob"), timeout=30)
            assert stats.calls_refused == 6 and stats.queries_attempted == 1
            rows = stub.ListLedgerEntries(proxy_pb2.ListLedgerEntriesRequest(
                session_id="free"), metadata=md("bob"), timeout=30).entries
            assert len(rows) == 6 and all("not sent" in r.error for r in rows), rows
            redis.start()                                        # same port, empty
            predict(stub, "bob", "k", ["K-after"])
            predict(stub, "bob", "free", ["K-after-free"])
            assert servicer.times("K-after") and len(servicer.times("K-")) == sent_at_kill + 2
        with grpc.insecure_channel(other.address) as ch:         # the other replica too
            stub = proxy_pb2_grpc.TargetProxyServiceStub(ch)
            stub.CreateSession(proxy_pb2.CreateSessionRequest(target="t", session_id="free"),
                               metadata=md("bob"), timeout=30)
            predict(stub, "bob", "free", ["K-other"])
            assert servicer.times("K-other")
    finally:
        replica.stop()
        other.stop()
