"""gRPC behind Kubernetes headless Services: servers close each connection after
``max_connection_age`` so clients re-resolve and reach new replicas, and internal channels to
``dns:///`` names spread calls with ``round_robin``.

Three servers behind one DNS name cannot be made with random loopback ports, so the channel
options are checked as built, and the connection ageing with real gRPC: a server built by
``build_server`` with a short age really closes connections (the peer port of later calls
changes), calls keep succeeding through one channel meanwhile, a server stream longer than the
age is not cut, and ``dns:///`` channels made by ``server.channel`` carry the round_robin
service config and work.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from fortis.infra.serving import grpc_options
from fortis.infra.serving.server import ANNOUNCE_S, ServerSettings, build_server, channel
from fortis.services.common.errors import InvalidArgument
from google.protobuf.wrappers_pb2 import Int32Value

SERVICE = "fortis.test.v1.Peer"


def _register(peers: list[str]) -> tuple[Any, None, str]:
    def who(request: bytes, context: grpc.ServicerContext) -> bytes:
        peers.append(context.peer())
        return context.peer().encode()

    def ticks(request: Int32Value, context: grpc.ServicerContext) -> Iterator[Int32Value]:
        for i in range(request.value):
            time.sleep(0.1)
            yield Int32Value(value=i)

    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "Who": grpc.unary_unary_rpc_method_handler(who),
        "Ticks": grpc.unary_stream_rpc_method_handler(
            ticks, Int32Value.FromString, Int32Value.SerializeToString)})
    return (lambda _servicer, server: server.add_generic_rpc_handlers((handler,)), None, SERVICE)


def test_options_builders():
    assert grpc_options.server_options(0) == []
    assert grpc_options.server_options(300) == [("grpc.max_connection_age_ms", 300_000)]
    assert ("grpc.max_connection_age_grace_ms", 5000) in grpc_options.server_options(1, 5)
    opts = dict(grpc_options.client_options("dns:///fortis-proxy.team-a.svc.cluster.local:50051"))
    assert json.loads(str(opts["grpc.service_config"])) == {
        "loadBalancingConfig": [{"round_robin": {}}],
        "healthCheckConfig": {"serviceName": ""}}      # a draining replica is skipped
    assert grpc_options.client_options("127.0.0.1:50051") == []     # one server: pick_first
    assert grpc_options.max_connection_age_s(None, {}) == 300.0
    assert grpc_options.max_connection_age_s(None, {"FORTIS_MAX_CONNECTION_AGE_S": "2.5"}) == 2.5
    assert grpc_options.max_connection_age_s(7, {"FORTIS_MAX_CONNECTION_AGE_S": "2.5"}) == 7.0
    for bad in ("soon", "-1", "nan"):
        with pytest.raises(InvalidArgument) as info:
            grpc_options.max_connection_age_s(None, {"FORTIS_MAX_CONNECTION_AGE_S": bad})
        assert "max_connection_age_s" in str(info.value)


@pytest.fixture
def aged_server() -> Iterator[tuple[Any, list[str]]]:
    peers: list[str] = []
    srv = build_server(ServerSettings(max_connection_age_s=0.3), [_register(peers)])
    yield srv, peers
    srv.stop(None)


def test_aged_connections_are_replaced_and_calls_keep_working(aged_server):
    srv, peers = aged_server
    port = srv.address.rsplit(":", 1)[1]
    ch = channel(f"dns:///localhost:{port}")       # what the chart gives: round_robin over DNS
    who = ch.unary_unary(f"/{SERVICE}/Who")
    try:
        t_end = time.monotonic() + 2.0
        n = 0
        while time.monotonic() < t_end:
            who(b"", timeout=5)            # raises on any failure: every call must succeed
            n += 1
            time.sleep(0.02)
    finally:
        ch.close()
    assert len(peers) == n and n >= 20
    # a fresh connection has a fresh client port: over 2 s with a 0.3 s age, several
    # (jitter: gRPC ages connections at 0.3 s +-10 %, so at least 2 s / 0.33 s - 1 > 4)
    assert len(set(peers)) >= 4, sorted(set(peers))


def test_without_an_age_one_connection_serves_every_call():
    """The control: the same calls with the age off all use one connection."""
    peers: list[str] = []
    srv = build_server(ServerSettings(max_connection_age_s=0), [_register(peers)])
    ch = channel(srv.address)
    try:
        who = ch.unary_unary(f"/{SERVICE}/Who")
        t_end = time.monotonic() + 1.0
        while time.monotonic() < t_end:
            who(b"", timeout=5)
            time.sleep(0.02)
    finally:
        ch.close()
        srv.stop(None)
    assert len(peers) >= 10 and len(set(peers)) == 1


def test_a_stream_longer_than_the_age_is_not_cut(aged_server):
    srv, _ = aged_server
    ch = channel(srv.address)
    try:
        ticks = ch.unary_stream(f"/{SERVICE}/Ticks", Int32Value.SerializeToString,
                                Int32Value.FromString)
        got = [m.value for m in ticks(Int32Value(value=15), timeout=10)]    # 1.5 s > 0.3 s age
    finally:
        ch.close()
    assert got == list(range(15))


def test_the_stack_takes_the_age_from_the_environment(monkeypatch, tmp_path):
    """fortis serve's servers read $FORTIS_MAX_CONNECTION_AGE_S (the chart's ConfigMap);
    a bad value stops the start naming the setting."""
    from fortis.infra.serving.startup import EXIT_CONFIG, StartupError
    from fortis.server.app.stack import StackSettings, start_stack

    monkeypatch.setenv("FORTIS_MAX_CONNECTION_AGE_S", "never")
    with pytest.raises(StartupError) as info:
        start_stack(StackSettings(state_dir=tmp_path, only="scoring", targets=[]))
    assert "max_connection_age_s" in info.value.detail
    assert info.value.exit_code == EXIT_CONFIG


def test_concurrent_clients_survive_ageing(aged_server):
    """Several threads calling through one channel while connections age: no call fails."""
    srv, peers = aged_server
    ch = channel(srv.address)
    who = ch.unary_unary(f"/{SERVICE}/Who")
    failures: list[BaseException] = []

    def run() -> None:
        t_end = time.monotonic() + 1.2
        while time.monotonic() < t_end:
            try:
                who(b"", timeout=5)
            except grpc.RpcError as exc:
                failures.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ch.close()
    assert not failures and len(set(peers)) >= 2


# -- SIGTERM with replicas: every service drains in-flight work ---------------------------

def _tagged(tag: bytes) -> tuple[Any, None, str]:
    def who(request: bytes, context: grpc.ServicerContext) -> bytes:
        return tag

    def slow(request: bytes, context: grpc.ServicerContext) -> bytes:
        time.sleep(1.5)
        return tag

    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "Who": grpc.unary_unary_rpc_method_handler(who),
        "Slow": grpc.unary_unary_rpc_method_handler(slow)})
    return (lambda _servicer, server: server.add_generic_rpc_handlers((handler,)), None, SERVICE)


def _drain_one_of_two(service_config: str) -> tuple[list[tuple[float, str]], float, bytes]:
    """Replicas A and B behind one round_robin channel with ``service_config``; a client
    calls all along while A drains as on SIGTERM with a slow call in flight. Returns the
    client's (time, answer or error code) after the drain began, the time the drain began,
    and what A's slow call got."""
    a = build_server(ServerSettings(), [_tagged(b"A")])
    b = build_server(ServerSettings(), [_tagged(b"B")])
    target = f"ipv4:{a.address},{b.address}"      # two replicas, as a headless Service's pods
    ch = grpc.insecure_channel(target, options=[("grpc.service_config", service_config)])
    direct = grpc.insecure_channel(a.address)
    seen: list[tuple[float, str]] = []
    stop = threading.Event()
    try:
        who = ch.unary_unary(f"/{SERVICE}/Who")
        deadline = time.monotonic() + 10
        while {who(b"", timeout=5) for _ in range(4)} != {b"A", b"B"}:    # both READY
            assert time.monotonic() < deadline, "round_robin never reached both replicas"

        def client() -> None:
            while not stop.is_set():
                try:
                    seen.append((time.monotonic(), who(b"", timeout=5).decode()))
                except grpc.RpcError as exc:
                    seen.append((time.monotonic(), exc.code().name))
                time.sleep(0.005)

        slow = direct.unary_unary(f"/{SERVICE}/Slow").future(b"", timeout=10)
        caller = threading.Thread(target=client)
        caller.start()
        time.sleep(0.3)
        began = time.monotonic()
        a.stop(5.0)               # NOT_SERVING, announce, refuse new calls, wait, stop
        time.sleep(0.2)
        stop.set()
        caller.join(10)
        return [s for s in seen if s[0] >= began], began, slow.result()
    finally:
        stop.set()
        ch.close()
        direct.close()
        a.stop(0)
        b.stop(0)


def test_a_draining_replica_gets_no_new_calls_from_the_internal_channels():
    """With the internal channels' service config (round_robin + healthCheckConfig,
    ``grpc_options``) a replica draining on SIGTERM gets no new call once it says
    NOT_SERVING: every call of a client calling all along succeeds, and the call in flight
    on the draining replica finishes (its answer arrives)."""
    seen, began, slow = _drain_one_of_two(grpc_options.ROUND_ROBIN_SERVICE_CONFIG)
    assert slow == b"A"
    assert seen and all(answer in ("A", "B") for _, answer in seen), \
        sorted({answer for _, answer in seen})
    late = [answer for t, answer in seen if t >= began + ANNOUNCE_S]   # A refuses by then
    assert late and set(late) == {"B"}


def test_without_health_checking_the_draining_replica_refuses_calls():
    """The control: round_robin alone keeps sending calls to the draining replica, which
    refuses them (UNAVAILABLE) until it stops: the health check is what spares them."""
    seen, _, slow = _drain_one_of_two(json.dumps({"loadBalancingConfig": [{"round_robin": {}}]}))
    assert slow == b"A"
    assert "UNAVAILABLE" in {answer for _, answer in seen}
