"""gRPC address lists balanced per call (headless Service + round_robin): an ``ipv4:``/``ipv6:``
target naming several servers (``ipv4:127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3``) is the loopback
analogue of a headless Service. Internal channels to one get ``round_robin`` as ``dns:`` ones
do, and a worker given one keeps it whole (``fortis.server.app.worker.pick``), so every worker reaches every
replica.

Real gRPC: three servers on loopback ports; the calls of one channel made by
``server.channel`` spread over all three, while the control (the same list with gRPC's
default ``pick_first``) sends every call to one server.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from fortis.infra.serving import grpc_options
from fortis.infra.serving.server import RunningServer, ServerSettings, build_server, channel
from fortis.server.app.worker import pick

SERVICE = "fortis.test.v1.Which"
CALLS = 30


def _register(name: str, hits: Counter[str]) -> tuple[Any, None, str]:
    def which(request: bytes, context: grpc.ServicerContext) -> bytes:
        hits[name] += 1
        return name.encode()

    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "Which": grpc.unary_unary_rpc_method_handler(which)})
    return (lambda _servicer, server: server.add_generic_rpc_handlers((handler,)), None, SERVICE)


@pytest.fixture
def three_servers() -> Iterator[tuple[list[RunningServer], Counter[str]]]:
    hits: Counter[str] = Counter()
    servers = [build_server(ServerSettings(address="127.0.0.1:0"), [_register(f"s{i}", hits)])
               for i in range(3)]
    try:
        yield servers, hits
    finally:
        for s in servers:
            s.stop(None)


def _list(servers: list[RunningServer]) -> str:
    return "ipv4:" + ",".join(f"127.0.0.1:{s.port}" for s in servers)


def _call_all(ch: grpc.Channel) -> list[str]:
    which = ch.unary_unary(f"/{SERVICE}/Which")
    grpc.channel_ready_future(ch).result(timeout=10)
    return [which(b"", timeout=10, wait_for_ready=True).decode() for _ in range(CALLS)]


def test_address_lists_get_round_robin_like_dns_names():
    dns_config = dict(grpc_options.client_options("dns:///a.svc.cluster.local:50051"))[
        "grpc.service_config"]
    for target in ("ipv4:127.0.0.1:7001,127.0.0.1:7002", "ipv6:[::1]:7001,[::1]:7002",
                   "ipv4:10.0.0.5:50051", "dns:///fortis-proxy.team-a.svc.cluster.local:50051"):
        opts = dict(grpc_options.client_options(target))
        config = json.loads(str(opts["grpc.service_config"]))
        assert config["loadBalancingConfig"] == [{"round_robin": {}}], target
        assert opts["grpc.service_config"] == dns_config, target    # the same as a dns: name's
        assert grpc_options.is_multi_address(target)
    # only a DNS name is re-resolved after a GOAWAY; a fixed list has nothing to resolve
    assert "grpc.dns_min_time_between_resolutions_ms" in dict(
        grpc_options.client_options("dns:///a:1"))
    assert "grpc.dns_min_time_between_resolutions_ms" not in dict(
        grpc_options.client_options("ipv4:127.0.0.1:1,127.0.0.1:2"))
    for one in ("127.0.0.1:50051", "localhost:50051", "[::1]:50051", "unix:/tmp/s.sock"):
        assert grpc_options.client_options(one) == [], one       # one server: pick_first
        assert not grpc_options.is_multi_address(one)


def test_pick_keeps_address_lists_and_dns_names_whole():
    lst = "ipv4:127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"
    assert [pick(lst, i) for i in range(4)] == [lst] * 4
    assert pick(f"  {lst} ", 1) == lst
    v6 = "ipv6:[::1]:7001,[::1]:7002"
    assert pick(v6, 3) == v6
    dns = "dns:///fortis-proxy.team-a.svc.cluster.local:50051"
    assert [pick(dns, i) for i in range(3)] == [dns] * 3
    # a plain comma-separated list is still shared out among local workers (i mod K)
    assert [pick("a:1, b:2", i) for i in range(4)] == ["a:1", "b:2", "a:1", "b:2"]
    assert pick("", 0) == ""


def test_an_ipv4_list_spreads_the_calls_of_one_channel_over_every_server(three_servers):
    servers, hits = three_servers
    ch = channel(_list(servers))           # what a worker given the list opens
    try:
        answered = _call_all(ch)
    finally:
        ch.close()
    print(dict(hits))
    assert len(answered) == CALLS and sum(hits.values()) == CALLS
    assert set(hits) == {"s0", "s1", "s2"}, hits
    # round_robin over READY subchannels: even, give or take the first calls made while
    # some connections were still opening
    assert min(hits.values()) >= CALLS // 3 - 3, hits


def test_the_control_without_round_robin_sends_every_call_to_one_server(three_servers):
    servers, hits = three_servers
    ch = grpc.insecure_channel(_list(servers))      # gRPC's default policy: pick_first
    try:
        _call_all(ch)
    finally:
        ch.close()
    assert len(hits) == 1 and sum(hits.values()) == CALLS, hits
