"""Prometheus metrics labelled by tenant, bound to a configurable address (audit and
observability).

Scraped over real HTTP from a real stack (and from a real ``fortis serve`` subprocess): the
proxy's query/call/refusal/latency counters and every service's RPC counters carry a
``tenant`` label whose values come only from the configured key table (``-`` for a call without
a tenant, ``other`` for any other name), so a caller cannot grow the label set. The counts are
checked against the ledger each tenant reads (the ledger stays the source of truth, IEEE-M6).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from fortis.infra.serving.metrics import TenantLabels, parse_metrics_address
from fortis.infra.serving.server import call_metadata
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common.codec import image_msg

from tests.conftest import MD, OTHER_MD

PREDICT = "/fortis.proxy.v1.TargetProxyService/Predict"
LIST_TARGETS = "/fortis.proxy.v1.TargetProxyService/ListTargets"


def _scrape(host: str, port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _tenant_values(m: dict[str, float]) -> set[str]:
    out = set()
    for key in m:
        if 'tenant="' in key:
            out.add(key.split('tenant="', 1)[1].split('"', 1)[0])
    return out


def _listening_hosts(port: int) -> set[str]:
    """Local addresses of the TCP sockets listening on ``port`` (from /proc/net/tcp{,6})."""
    hosts = set()
    for path, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        if not os.path.exists(path):
            continue
        with open(path) as f:
            next(f)
            for line in f:
                cols = line.split()
                addr, hexport = cols[1].split(":")
                if int(hexport, 16) == port and cols[3] == "0A":        # LISTEN
                    if width == 8:
                        hosts.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
                    else:
                        hosts.add(addr)
    return hosts


def test_tenant_labels_are_bounded():
    labels = TenantLabels({"tenant-a", "tenant-b"})
    assert [labels(t) for t in ("tenant-a", "tenant-b", "", "x" * 10_000, "tenant-c")] == \
        ["tenant-a", "tenant-b", "-", "other", "other"]
    # from a live key table: a tenant given a key at run time (rotation) gets its own label
    from fortis.infra.serving.api_keys import KeyTable
    table = KeyTable.from_plain({"k-a": "tenant-a"})
    live = TenantLabels(table.tenants)
    assert (live("tenant-a"), live("tenant-c")) == ("tenant-a", "other")
    table.add_key("later", "k-c", "tenant-c")
    assert live("tenant-c") == "tenant-c"


@pytest.mark.parametrize(("text", "want"), [("127.0.0.1:9464", ("127.0.0.1", 9464)),
                                            ("0.0.0.0:0", ("0.0.0.0", 0)),
                                            ("[::1]:9100", ("::1", 9100)),
                                            (":9100", ("127.0.0.1", 9100))])
def test_metrics_address_parses(text, want):
    assert parse_metrics_address(text) == want


@pytest.mark.parametrize("bad", ["9100", "host:", "host:port", "h:70000", "[::1:9", "x" * 5000])
def test_a_bad_metrics_address_is_refused_bounded(bad):
    with pytest.raises(ValueError) as ei:
        parse_metrics_address(bad)
    assert len(str(ei.value)) < 300


def test_proxy_and_rpc_metrics_by_tenant_over_http(stack, channel, fmnist_test_images):
    """Two tenants query the same target; each tenant's counters equal its own ledger."""
    images, _ = fmnist_test_images
    px = proxy_pb2_grpc.TargetProxyServiceStub(channel)
    # the stack's /metrics listens on loopback only
    assert _listening_hosts(stack.metrics_port) == {"127.0.0.1"}
    sessions = {}
    for md, n_ok, budget in ((MD, 3, 0), (OTHER_MD, 2, 2)):
        sid = px.CreateSession(proxy_pb2.CreateSessionRequest(
            target="fmnist-cnn", query_budget=budget), metadata=md).session.session_id
        px.Predict(proxy_pb2.PredictRequest(session_id=sid, images=[
            image_msg(f"m{k}", images[k]) for k in range(n_ok)]), metadata=md)
        sessions[md] = sid
    # B's exhausted budget: refused, counted for B only
    with pytest.raises(grpc.RpcError) as ei:
        px.Predict(proxy_pb2.PredictRequest(session_id=sessions[OTHER_MD], images=[
            image_msg("m9", images[9])]), metadata=OTHER_MD)
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # unauthenticated, and the internal key acting for tenants outside the key table
    with pytest.raises(grpc.RpcError):
        px.ListTargets(proxy_pb2.ListTargetsRequest())
    for _ in range(3):
        px.ListTargets(proxy_pb2.ListTargetsRequest(),
                       metadata=call_metadata(stack.internal_key, f"made-up-{uuid.uuid4().hex}"))
    px.ListTargets(proxy_pb2.ListTargetsRequest(),
                   metadata=call_metadata(stack.internal_key, "tenant-b"))

    m = _scrape("127.0.0.1", stack.metrics_port)
    for md, tenant in ((MD, "tenant-a"), (OTHER_MD, "tenant-b")):
        st = px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id=sessions[md]),
                                metadata=md)
        key = f'target="fmnist-cnn",tenant="{tenant}"'
        assert m[f'fortis_proxy_queries_total{{status="OK",{key}}}'] == st.queries_ok
        assert m.get(f'fortis_proxy_refused_calls_total{{{key}}}', 0) == st.calls_refused
        assert m[f'fortis_proxy_target_calls_total{{status="OK",{key}}}'] == 1
        assert m[f'fortis_proxy_target_latency_seconds_count{{{key}}}'] == 1
        assert m[f'fortis_rpc_requests_total{{code="OK",method="{PREDICT}",tenant="{tenant}"}}'] == 1
    assert m[f'fortis_rpc_requests_total{{code="RESOURCE_EXHAUSTED",method="{PREDICT}",'
             f'tenant="tenant-b"}}'] == 1
    assert f'fortis_rpc_requests_total{{code="RESOURCE_EXHAUSTED",method="{PREDICT}",' \
           f'tenant="tenant-a"}}' not in m
    assert m[f'fortis_rpc_requests_total{{code="UNAUTHENTICATED",method="{LIST_TARGETS}",'
             f'tenant="-"}}'] == 1
    assert m[f'fortis_rpc_requests_total{{code="OK",method="{LIST_TARGETS}",tenant="other"}}'] == 3
    # the internal key acting for a configured tenant counts as that tenant
    assert m[f'fortis_rpc_requests_total{{code="OK",method="{LIST_TARGETS}",'
             f'tenant="tenant-b"}}'] == 1
    # bounded: three made-up names added one value, "other"
    assert _tenant_values(m) == {"tenant-a", "tenant-b", "-", "other"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def serve(tmp_path: Path, fmnist_target) -> Iterator:
    """Start ``fortis serve`` with extra arguments; yields a starter returning (info, process)."""
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> tuple[dict, subprocess.Popen]:
        env = {**os.environ, "FORTIS_API_KEYS": "ka=tenant-a,kb=tenant-b"}
        p = subprocess.Popen([sys.executable, "-m", "fortis.server.cli", "serve", "--address",
                              f"127.0.0.1:{_free_port()}", "--state-dir",
                              str(tmp_path / f"s{len(procs)}"), "--log-level", "warning",
                              "--target", "a-only=builtin:fmnist-cnn?tenants=tenant-a",
                              "--target", "open=builtin:fmnist-cnn?output=label_only", *args],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout is not None and p.stderr is not None
        line = p.stdout.readline()
        assert line, p.stderr.read()[-3000:]
        return json.loads(line), p

    yield start
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def test_fortis_serve_metrics_address(serve):
    """``--metrics-address HOST:PORT`` binds there; ``--metrics-port`` alone binds loopback;
    the CLI's ``--target ...?tenants=`` allow-list holds over the wire."""
    port = _free_port()
    info, _ = serve("--metrics-address", f"127.0.0.1:{port}")
    assert (info["metrics_port"], info["metrics_address"]) == (port, f"127.0.0.1:{port}")
    assert _listening_hosts(port) == {"127.0.0.1"}
    with grpc.insecure_channel(info["address"]) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        seen = {md: {t.name for t in px.ListTargets(proxy_pb2.ListTargetsRequest(),
                                                    metadata=(("x-api-key", key),),
                                                    timeout=30).targets}
                for md, key in (("a", "ka"), ("b", "kb"))}
    assert seen == {"a": {"a-only", "open"}, "b": {"open"}}
    m = _scrape("127.0.0.1", port)
    assert m[f'fortis_rpc_requests_total{{code="OK",method="{LIST_TARGETS}",tenant="tenant-a"}}'] == 1
    assert m[f'fortis_rpc_requests_total{{code="OK",method="{LIST_TARGETS}",tenant="tenant-b"}}'] == 1

    port2 = _free_port()
    info2, _ = serve("--metrics-port", str(port2))
    assert info2["metrics_address"] == f"127.0.0.1:{port2}"
    assert _listening_hosts(port2) == {"127.0.0.1"}
    with grpc.insecure_channel(info2["address"]) as ch:
        with pytest.raises(grpc.RpcError):
            proxy_pb2_grpc.TargetProxyServiceStub(ch).ListTargets(
                proxy_pb2.ListTargetsRequest(), metadata=(("x-api-key", "wrong"),), timeout=30)
    m2 = _scrape("127.0.0.1", port2)
    assert m2[f'fortis_rpc_requests_total{{code="UNAUTHENTICATED",method="{LIST_TARGETS}",'
              f'tenant="-"}}'] == 1


@pytest.mark.parametrize("args", [("--metrics-address", "nonsense"),
                                  ("--metrics-address", "127.0.0.1:1", "--metrics-port", "2")])
def test_fortis_serve_refuses_a_bad_metrics_address(tmp_path, args):
    r = subprocess.run([sys.executable, "-m", "fortis.server.cli", "serve", "--address",
                        f"127.0.0.1:{_free_port()}", "--state-dir", str(tmp_path / "s"),
                        "--no-default-targets", *args], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "metrics_address" in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""
