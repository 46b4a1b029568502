#!/usr/bin/env python3
"""What the target proxy costs per query, measured against the direct call in one run.

Predict of one 224x224 RGB image (raw uint8 tensor) -- straight to the target adapter, and
through the proxy (API-key auth, session budget, rate limiter, ledger on and durable:
SQLite WAL with synchronous=FULL). A bare gRPC round trip (a TargetService that answers at
once, no model) is measured too, so the proxy's own cost can be told from the model's.
Prints JSON. Never part of the test run.

Modes: ``processes`` (default, as deployed): the target adapter, the proxy and the bare echo
server each run in their own process (`fortis serve`), the client in this one, so no two of
them share a GIL. ``inprocess``: everything in this process (client, proxy and target then
compete for one GIL, which inflates every number).

    python bench/proxy.py [--n 300] [--target fmnist-cnn|mobilenet-v2] [--threads 4]
                          [--mode processes|inprocess] [--rate 0]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.app import StackSettings, TargetConfig, start_stack
from fortis.services.common.codec import image_msg
from fortis.services.common.server import ServerSettings, build_server
from fortis.target.v1 import target_pb2, target_pb2_grpc

KEY = "bench-key"


class _Echo(target_pb2_grpc.TargetServiceServicer):
    def Predict(self, request, context):  # noqa: N802 - gRPC method name
        return target_pb2.PredictResponse()


def _measure(call, n: int, warmup: int = 20) -> tuple[list[float], float]:
    for _ in range(warmup):
        call()
    lat = []
    t0 = time.perf_counter()
    for _ in range(n):
        s = time.perf_counter()
        call()
        lat.append((time.perf_counter() - s) * 1000)
    return lat, n / (time.perf_counter() - t0)


def _concurrent(call, n: int, threads: int) -> float:
    per = n // threads

    def work():
        for _ in range(per):
            call()

    ts = [threading.Thread(target=work) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return per * threads / (time.perf_counter() - t0)


def _p(lat: list[float], q: float) -> float:
    return float(np.percentile(lat, q))


_ECHO_SERVER = """
import sys, threading
from fortis.services.common.server import ServerSettings, build_server
from fortis.target.v1 import target_pb2, target_pb2_grpc
class Echo(target_pb2_grpc.TargetServiceServicer):
    def Predict(self, request, context):
        return target_pb2.PredictResponse()
s = build_server(ServerSettings(), [(target_pb2_grpc.add_TargetServiceServicer_to_server, Echo(),
                                     "fortis.target.v1.TargetService")])
print("ADDRESS", s.address, flush=True)
sys.stdin.read()
"""

#: The target adapter alone, in its own process. ``fortis serve`` calls built-in targets in
#: process (no port to bypass the proxy), so the bench exposes one itself.
_TARGET_SERVER = """
import sys, tempfile
from fortis.services.app import StackSettings, TargetConfig, start_stack
stack = start_stack(StackSettings(state_dir=tempfile.mkdtemp(), expose_builtin_targets=True,
                                  targets=[TargetConfig.parse("t=builtin:" + sys.argv[1])]))
print("ADDRESS", stack.target_servers["t"].address, flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def _process(args: list[str], env: dict[str, str]) -> Iterator[str]:
    """Start a server process; yield the first line it prints (its address or JSON)."""
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        line = "x"
        while line and not line.startswith(("{", "ADDRESS ")):   # skip log lines
            line = proc.stdout.readline() if proc.stdout else ""
        if not line:
            raise RuntimeError(f"server did not start: {args}")
        yield line.removeprefix("ADDRESS ").strip()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def _servers(mode: str, target: str, tmp: Path, sync: str = "FULL",
             rate: float = 0.0) -> Iterator[tuple[str, str, str]]:
    """(direct target address, proxy address, bare echo address); proxy target name "t"."""
    query = f"?rate={rate:g}" if rate else ""
    if mode == "inprocess":
        stack = start_stack(StackSettings(state_dir=tmp, api_keys={KEY: "bench"},
                                          targets=[TargetConfig.parse(f"t=builtin:{target}{query}")],
                                          ledger_synchronous=sync, expose_builtin_targets=True))
        echo = build_server(ServerSettings(), [(target_pb2_grpc.add_TargetServiceServicer_to_server,
                                                _Echo(), "fortis.target.v1.TargetService")])
        try:
            yield stack.target_servers["t"].address, stack.address, echo.address
        finally:
            echo.stop(0)
            stack.stop(0)
        return
    fortis = [sys.executable, "-m", "fortis.cli"]
    env = {**os.environ, "FORTIS_API_KEYS": f"{KEY}=bench"}
    with contextlib.ExitStack() as es:
        # The target adapter alone (its process also hosts an unused proxy).
        direct = es.enter_context(_process([sys.executable, "-c", _TARGET_SERVER, target], env))
        # The proxy in its own process, reaching the target over gRPC.
        p = json.loads(es.enter_context(_process(
            fortis + ["serve", "--service", "proxy", "--log-level", "warning", "--address", "127.0.0.1:0",
                      "--ledger-sync", sync, "--state-dir", str(tmp / "proxy"),
                      "--target", f"t=grpc://{direct}{query}"], env)))
        echo = es.enter_context(_process([sys.executable, "-c", _ECHO_SERVER], env))
        yield direct, p["address"], echo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--target", default="fmnist-cnn")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--mode", choices=["processes", "inprocess"], default="processes")
    ap.add_argument("--rate", type=float, default=0.0,
                    help="the proxied target's rate limit (images/s; 0 = none): a limit far "
                         "above the measured rate shows what the limiter and its fair queue cost")
    ap.add_argument("--ledger-sync", choices=["FULL", "NORMAL"], default="FULL",
                    help="the proxy's ledger durability (FULL: fsync before every answer)")
    ns = ap.parse_args()
    img = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)

    with tempfile.TemporaryDirectory() as tmp, _servers(ns.mode, ns.target, Path(tmp), ns.ledger_sync, ns.rate) as addrs:
        direct_addr, proxy_addr, echo_addr = addrs
        direct_ch = grpc.insecure_channel(direct_addr)
        proxy_ch = grpc.insecure_channel(proxy_addr)
        echo_ch = grpc.insecure_channel(echo_addr)
        direct = target_pb2_grpc.TargetServiceStub(direct_ch)
        bare = target_pb2_grpc.TargetServiceStub(echo_ch)
        proxy = proxy_pb2_grpc.TargetProxyServiceStub(proxy_ch)
        md = (("x-api-key", KEY),)
        sid = proxy.CreateSession(proxy_pb2.CreateSessionRequest(target="t"), metadata=md).session.session_id
        counter = iter(range(10**9))
        dreq = target_pb2.PredictRequest(images=[image_msg("x", img, raw=True)])

        def call_direct():
            direct.Predict(dreq)

        def call_bare():
            bare.Predict(dreq)

        def call_proxy():
            proxy.Predict(proxy_pb2.PredictRequest(
                session_id=sid, origin="bench",
                images=[image_msg(f"x{next(counter)}", img, raw=True)]), metadata=md)

        # Interleave the three so machine noise hits them alike.
        lat = {"bare": [], "direct": [], "proxy": []}
        rate = {"bare": [], "direct": [], "proxy": []}
        rounds = 3
        for _ in range(rounds):
            for name, fn in (("bare", call_bare), ("direct", call_direct), ("proxy", call_proxy)):
                la, r = _measure(fn, ns.n // rounds)
                lat[name] += la
                rate[name].append(r)
        conc = {name: _concurrent(fn, ns.n, ns.threads)
                for name, fn in (("direct", call_direct), ("proxy", call_proxy))}
        st = proxy.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id=sid), metadata=md)
        out = {
            "benchmark": "proxy_predict_one_224x224",
            "target_model": ns.target, "n": ns.n, "mode": ns.mode,
            "ledger": f"sqlite WAL, synchronous={ns.ledger_sync}",
            "target_rate_limit": ns.rate or None,
            "bare_grpc_p50_ms": round(_p(lat["bare"], 50), 3),
            "direct_p50_ms": round(_p(lat["direct"], 50), 3),
            "direct_p90_ms": round(_p(lat["direct"], 90), 3),
            "proxy_p50_ms": round(_p(lat["proxy"], 50), 3),
            "proxy_p90_ms": round(_p(lat["proxy"], 90), 3),
            "proxy_overhead_p50_ms": round(_p(lat["proxy"], 50) - _p(lat["direct"], 50), 3),
            "proxy_over_direct_p50_ratio": round(_p(lat["proxy"], 50) / _p(lat["direct"], 50), 3),
            "direct_per_s": round(statistics.median(rate["direct"]), 1),
            "proxy_per_s": round(statistics.median(rate["proxy"]), 1),
            f"direct_per_s_{ns.threads}_threads": round(conc["direct"], 1),
            f"proxy_per_s_{ns.threads}_threads": round(conc["proxy"], 1),
            "ledger_rows": st.queries_ok,
            "python": platform.python_version(), "grpcio": grpc.__version__,
        }
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
