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
                          [--mode processes|inprocess] [--rate 0] [--redis-url URL|auto]
                          [--database-url URL|auto]

``--redis-url`` adds a second proxy whose rate limits, session budget and daily quota live in
Redis (``fortis serve --redis-url``), measured in the same interleaved rounds, so its p50
overhead can be compared with the in-process limiter's in one run; ``auto`` starts a throw-away
``redis-server`` on a free loopback port. Both proxies' sessions then have a query budget and
their target a rate limit (``--rate``, or 100000/s when 0: far above what is measured), so every
call goes through the budget check and the limiter.

``--database-url`` (PostgreSQL+Redis mode) adds a third proxy as deployed with replicas: its
ledger in PostgreSQL (``fortis serve --database-url``; durable: the server's
``synchronous_commit``, on by default) and its limits and budgets in Redis (``--redis-url``,
``auto`` when not given); ``auto`` starts a throw-away PostgreSQL with fsync on
(``bench/storage.py``), migrated to head. Measured in the same interleaved rounds against the
bare gRPC round trip.
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
from fortis.infra.serving.server import ServerSettings, build_server
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.server.app.stack import StackSettings, TargetConfig, start_stack
from fortis.services.common.codec import add_images
from fortis.target.v1 import target_pb2, target_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import command_line, goal, machine  # noqa: E402 - bench/_report.py

KEY = "bench-key"
#: ``fortis serve`` paces each tenant's calls (50 started per second by default,
#: docs/limits.md): one-image calls back to back would measure that pace, not the proxy.
UNPACED = ["--max-call-rate-per-tenant", "0"]


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
from fortis.infra.serving.server import ServerSettings, build_server
from fortis.target.v1 import target_pb2, target_pb2_grpc
class Echo(target_pb2_grpc.TargetServiceServicer):
    def Predict(self, request, context):
        return target_pb2.PredictResponse()
s = build_server(ServerSettings(), [(target_pb2_grpc.add_TargetServiceServicer_to_server, Echo(),
                                     "fortis.target.v1.TargetService")])
print("ADDRESS", s.address, flush=True)
sys.stdin.read()
"""

#: The floor: a pass-through TargetProxyService with no bookkeeping at all (no auth, budget,
#: limiter or ledger), forwarding each request to the target over one more gRPC hop. What it
#: adds over the direct call is what any proxy process in front of the target costs here.
_RELAY_SERVER = """
import sys
from concurrent import futures
import grpc
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.target.v1 import target_pb2, target_pb2_grpc
big = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
stub = target_pb2_grpc.TargetServiceStub(grpc.insecure_channel(sys.argv[1], options=big))
class Relay(proxy_pb2_grpc.TargetProxyServiceServicer):
    def Predict(self, request, context):
        req = target_pb2.PredictRequest()
        for image in request.images:
            req.images.add().CopyFrom(image)
        out = proxy_pb2.PredictResponse()
        for p in stub.Predict(req, timeout=30).predictions:
            out.predictions.add().CopyFrom(p)
        return out
s = grpc.server(futures.ThreadPoolExecutor(8), options=big)
proxy_pb2_grpc.add_TargetProxyServiceServicer_to_server(Relay(), s)
port = s.add_insecure_port("127.0.0.1:0")
s.start()
print("ADDRESS", f"127.0.0.1:{port}", flush=True)
sys.stdin.read()
"""

#: The target adapter alone, in its own process. ``fortis serve`` calls built-in targets in
#: process (no port to bypass the proxy), so the bench exposes one itself.
_TARGET_SERVER = """
import sys, tempfile
from fortis.server.app.stack import StackSettings, TargetConfig, start_stack
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
             rate: float = 0.0) -> Iterator[tuple[str, str, str, str]]:
    """(direct target address, proxy address, bare echo address, relay address or "" in
    process); proxy target name "t"."""
    query = f"?rate={rate:g}" if rate else ""
    if mode == "inprocess":
        stack = start_stack(StackSettings(state_dir=tmp, api_keys={KEY: "bench"},
                                          targets=[TargetConfig.parse(f"t=builtin:{target}{query}")],
                                          ledger_synchronous=sync, expose_builtin_targets=True))
        echo = build_server(ServerSettings(), [(target_pb2_grpc.add_TargetServiceServicer_to_server,
                                                _Echo(), "fortis.target.v1.TargetService")])
        try:
            yield stack.target_servers["t"].address, stack.address, echo.address, ""
        finally:
            echo.stop(0)
            stack.stop(0)
        return
    fortis = [sys.executable, "-m", "fortis.server.cli"]
    env = {**os.environ, "FORTIS_API_KEYS": f"{KEY}=bench"}
    with contextlib.ExitStack() as es:
        # The target adapter alone (its process also hosts an unused proxy).
        direct = es.enter_context(_process([sys.executable, "-c", _TARGET_SERVER, target], env))
        # The proxy in its own process, reaching the target over gRPC.
        p = json.loads(es.enter_context(_process(
            fortis + ["serve", "--service", "proxy", "--log-level", "warning", "--address", "127.0.0.1:0",
                      "--ledger-sync", sync, *UNPACED, "--state-dir", str(tmp / "proxy"),
                      "--target", f"t=grpc://{direct}{query}"], env)))
        echo = es.enter_context(_process([sys.executable, "-c", _ECHO_SERVER], env))
        relay = es.enter_context(_process([sys.executable, "-c", _RELAY_SERVER, direct], env))
        yield direct, p["address"], echo, relay


@contextlib.contextmanager
def _redis(url: str) -> Iterator[str]:
    """``url``, or with ``auto`` a redis-server of our own on a free loopback port."""
    if url != "auto":
        yield url
        return
    import shutil
    import socket
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed: run scripts/setup.sh as root")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        for _ in range(200):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def _redis_proxy(mode: str, target: str, direct: str, tmp: Path, sync: str, query: str,
                 url: str, database_url: str = "", name: str = "redis-proxy"
                 ) -> Iterator[str]:
    """A second proxy like the first, its limits and budgets in Redis at ``url`` (and its
    ledger in PostgreSQL at ``database_url``, when given)."""
    if mode == "inprocess":
        stack = start_stack(StackSettings(state_dir=tmp / name, api_keys={KEY: "bench"},
                                          targets=[TargetConfig.parse(f"t=builtin:{target}{query}")],
                                          ledger_synchronous=sync, redis_url=url,
                                          redis_namespace=name, database_url=database_url or None))
        try:
            yield stack.address
        finally:
            stack.stop(0)
        return
    env = {**os.environ, "FORTIS_API_KEYS": f"{KEY}=bench", "FORTIS_REDIS_URL": url,
           **({"FORTIS_DATABASE_URL": database_url} if database_url else {})}
    with _process([sys.executable, "-m", "fortis.server.cli", "serve", "--service", "proxy",
                   "--log-level", "warning", "--address", "127.0.0.1:0", "--ledger-sync", sync,
                   *UNPACED, "--state-dir", str(tmp / name), "--redis-namespace", name,
                   "--target", f"t=grpc://{direct}{query}"], env) as line:
        yield json.loads(line)["address"]


def _ratio_block(name: str, lat: dict, rate: dict, conc: dict, threads: int) -> dict:
    """p50/p90, the overhead over the direct call and its ratio to the bare round trip."""
    over = _p(lat[name], 50) - _p(lat["direct"], 50)
    return {f"{name}_p50_ms": round(_p(lat[name], 50), 3),
            f"{name}_p90_ms": round(_p(lat[name], 90), 3),
            f"{name}_overhead_p50_ms": round(over, 3),
            f"{name}_overhead_over_bare_p50_ratio": round(over / _p(lat["bare"], 50), 3),
            f"{name}_per_s": round(statistics.median(rate[name]), 1),
            f"{name}_per_s_{threads}_threads": round(conc[name], 1)}


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
    ap.add_argument("--redis-url", help="also measure a proxy whose limits and budgets are in "
                    "this Redis; 'auto': start a redis-server for the run")
    ap.add_argument("--database-url", help="also measure a proxy with its ledger in this "
                    "PostgreSQL and its limits in Redis; 'auto': start a durable "
                    "PostgreSQL for the run")
    ns = ap.parse_args()
    if ns.database_url and not ns.redis_url:
        ns.redis_url = "auto"
    if ns.redis_url and not ns.rate:
        ns.rate = 100000.0      # the limiter on every call, never binding
    img = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)

    with contextlib.ExitStack() as es:
        tmp = es.enter_context(tempfile.TemporaryDirectory())
        direct_addr, proxy_addr, echo_addr, relay_addr = es.enter_context(
            _servers(ns.mode, ns.target, Path(tmp), ns.ledger_sync, ns.rate))
        redis_addr = pg_addr = pg_durability = ""
        if ns.redis_url:
            redis_url = es.enter_context(_redis(ns.redis_url))
            redis_addr = es.enter_context(_redis_proxy(
                ns.mode, ns.target, direct_addr, Path(tmp), ns.ledger_sync,
                f"?rate={ns.rate:g}", redis_url))
        if ns.database_url:
            from storage import postgres  # bench/storage.py
            db_url, pg_durability = es.enter_context(postgres(ns.database_url))
            pg_addr = es.enter_context(_redis_proxy(
                ns.mode, ns.target, direct_addr, Path(tmp), ns.ledger_sync,
                f"?rate={ns.rate:g}", redis_url, database_url=db_url, name="pg-redis-proxy"))
        direct_ch = grpc.insecure_channel(direct_addr)
        proxy_ch = grpc.insecure_channel(proxy_addr)
        echo_ch = grpc.insecure_channel(echo_addr)
        direct = target_pb2_grpc.TargetServiceStub(direct_ch)
        bare = target_pb2_grpc.TargetServiceStub(echo_ch)
        proxy = proxy_pb2_grpc.TargetProxyServiceStub(proxy_ch)
        md = (("x-api-key", KEY),)
        budget = 10**9 if ns.redis_url else 0       # with Redis: every call checks a budget
        sid = proxy.CreateSession(proxy_pb2.CreateSessionRequest(target="t", query_budget=budget),
                                  metadata=md).session.session_id
        proxies = {"proxy": (proxy, sid)}
        if relay_addr:
            proxies["relay"] = (proxy_pb2_grpc.TargetProxyServiceStub(es.enter_context(
                grpc.insecure_channel(relay_addr))), sid)
        if redis_addr:
            rstub = proxy_pb2_grpc.TargetProxyServiceStub(es.enter_context(
                grpc.insecure_channel(redis_addr)))
            proxies["proxy_redis"] = (rstub, rstub.CreateSession(proxy_pb2.CreateSessionRequest(
                target="t", query_budget=budget), metadata=md).session.session_id)
        if pg_addr:
            pstub = proxy_pb2_grpc.TargetProxyServiceStub(es.enter_context(
                grpc.insecure_channel(pg_addr)))
            proxies["proxy_pg_redis"] = (pstub, pstub.CreateSession(
                proxy_pb2.CreateSessionRequest(target="t", query_budget=budget),
                metadata=md).session.session_id)
        counter = iter(range(10**9))
        dreq = target_pb2.PredictRequest()
        add_images(dreq.images, [("x", img)])

        def call_direct():
            direct.Predict(dreq)

        def call_bare():
            bare.Predict(dreq)

        def caller(name):
            stub, session = proxies[name]
            # Built before the clock starts, as the bare and direct requests are: building a
            # 150 KB request costs the client too (one more image id per call would change
            # nothing the proxy does: a session without a per-image budget).
            reqs = []
            for k in range(64):
                req = proxy_pb2.PredictRequest(session_id=session, origin="bench")
                add_images(req.images, [(f"x{k}", img)])
                reqs.append(req)

            def call():
                stub.Predict(reqs[next(counter) % len(reqs)], metadata=md)
            return call

        call_proxy = caller("proxy")
        calls = [("bare", call_bare), ("direct", call_direct), ("proxy", call_proxy)]
        calls += [(name, caller(name)) for name in proxies if name != "proxy"]
        # Interleave them so machine noise hits them alike.
        lat = {name: [] for name, _ in calls}
        rate = {name: [] for name, _ in calls}
        rounds = 3
        for _ in range(rounds):
            for name, fn in calls:
                la, r = _measure(fn, ns.n // rounds)
                lat[name] += la
                rate[name].append(r)
        conc = {name: _concurrent(fn, ns.n, ns.threads) for name, fn in calls if name != "bare"}
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
            **({"redis": "limits, session budget and daily quota in Redis (fortis serve "
                         "--redis-url); the other proxy keeps them in process",
                "proxy_redis_p50_ms": round(_p(lat["proxy_redis"], 50), 3),
                "proxy_redis_p90_ms": round(_p(lat["proxy_redis"], 90), 3),
                "proxy_redis_overhead_p50_ms": round(
                    _p(lat["proxy_redis"], 50) - _p(lat["direct"], 50), 3),
                "proxy_redis_overhead_over_bare_p50_ratio": round(
                    (_p(lat["proxy_redis"], 50) - _p(lat["direct"], 50)) / _p(lat["bare"], 50), 3),
                "proxy_overhead_over_bare_p50_ratio": round(
                    (_p(lat["proxy"], 50) - _p(lat["direct"], 50)) / _p(lat["bare"], 50), 3),
                "redis_minus_inprocess_p50_ms": round(
                    _p(lat["proxy_redis"], 50) - _p(lat["proxy"], 50), 3),
                "proxy_redis_per_s": round(statistics.median(rate["proxy_redis"]), 1),
                f"proxy_redis_per_s_{ns.threads}_threads": round(conc["proxy_redis"], 1)}
               if "proxy_redis" in lat else {}),
            **({"pg_redis": "ledger in PostgreSQL (" + pg_durability + "), limits, session "
                            "budget and daily quota in Redis: the replicas' mode",
                **_ratio_block("proxy_pg_redis", lat, rate, conc, ns.threads),
                "proxy_overhead_over_bare_p50_ratio": round(
                    (_p(lat["proxy"], 50) - _p(lat["direct"], 50)) / _p(lat["bare"], 50), 3)}
               if "proxy_pg_redis" in lat else {}),
            "python": platform.python_version(), "grpcio": grpc.__version__,
        }
        if "relay" in lat:
            out.update({"relay": "a pass-through proxy process with no bookkeeping: the floor "
                                 "of one more gRPC hop",
                        **_ratio_block("relay", lat, rate, conc, ns.threads)})
        out["proxy_overhead_over_bare_p50_ratio"] = round(
            (_p(lat["proxy"], 50) - _p(lat["direct"], 50)) / _p(lat["bare"], 50), 3)
        out["goals"] = _goals(out, ns.threads)
        out["machine"] = machine()
        out["command"] = command_line()
        print(json.dumps(out, indent=2))


def _goals(out: dict, threads: int) -> list[dict]:
    """The proxy's goals as ratios measured in this run: its added p50 latency over the bare
    round trip (<= 2x embedded, <= 3x with PostgreSQL + Redis), and its throughput at
    ``threads`` threads over the direct path's (>= 0.8)."""
    goals = [goal("proxy added p50 latency / bare gRPC round trip (SQLite, durable)",
                  out["proxy_overhead_over_bare_p50_ratio"], 2.0, "<="),
             goal(f"proxy / direct throughput, {threads} threads",
                  out[f"proxy_per_s_{threads}_threads"]
                  / out[f"direct_per_s_{threads}_threads"], 0.8, ">=")]
    if "proxy_pg_redis_overhead_over_bare_p50_ratio" in out:
        goals.append(goal("proxy added p50 latency / bare round trip (PostgreSQL + Redis)",
                          out["proxy_pg_redis_overhead_over_bare_p50_ratio"], 3.0, "<="))
    return goals


if __name__ == "__main__":
    main()
