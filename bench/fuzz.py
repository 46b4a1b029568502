#!/usr/bin/env python3
"""Fuzz every Fortis RPC that takes user data with >= 10,000 hostile requests: bad
input must get INVALID_ARGUMENT naming the field, never INTERNAL.

The requests come from ``tests/fuzz/strategies.py`` (hypothesis; boundary numbers, NaN/Inf,
huge/unicode/control-character strings, tensors with bad shapes, PNG/JPEG bombs, plans nested
100k deep, YAML aliases, Struct params nested 90+ deep, forged page tokens, unknown enum
values; valid requests whose images decode large -- PNG/JPEG headers declaring 6000x6000,
16-bit, up to 64 of them, tensors whose data match a large shape -- for the decoded-size
budget; surrogates, ensembles and tenant surrogate definitions of RunAttack/ValidateAttack)
and go over real loopback gRPC to ``fortis serve`` in a subprocess (``--serve``, the default:
a crash is a dead process) or to a stack in this process (``--in-process``), as tenant
"tenant-a". The server also accepts OpenID Connect bearer tokens of a real JWKS endpoint on
loopback (``tests/fuzz/idp.py``, keys made at start; ``--no-oidc`` leaves it out): the
``Auth.*`` cases send valid requests with fuzzed credentials (valid tokens, expired, wrong
audience/issuer/key, ``alg: none``, HS256 keyed with the public key, malformed JWTs, hostile
claims signed by the issuer, garbage, 9-20 KB values, other schemes, unknown API keys, a forged
x-fortis-tenant). gRPC health and reflection, which every server carries beside the
contracts, are fuzzed too. Each answer is judged by ``tests/fuzz/harness.py`` (never
INTERNAL/UNKNOWN, no transport-made status but gRPC's own size limits, message <= 1 KB without
echoing the input or any piece of a credential, INVALID_ARGUMENT with a BadRequest field,
RESOURCE_EXHAUSTED with a QuotaFailure subject). The built-in TargetService adapter is fuzzed
on its own loopback port.

Prints JSON: cases, per-RPC counts, the status-code histogram, INTERNAL answers and other rule
breaks (first examples), crashes, the server's peak RSS, seconds, and whether the server
answered health and a normal call afterwards. Exit status 1 when INTERNAL > 0, a rule was
broken or the server crashed. Never part of the test run.

    python bench/fuzz.py [--cases 10000] [--in-process] [--seed 0] [--no-oidc]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from _proc import rss_kb, tree  # noqa: E402 - bench/ beside this script

API_KEY = "fuzz-key-tenant-a"
MD = (("x-api-key", API_KEY),)
TARGETS = ("fmnist-cnn=builtin:fmnist-cnn", "fmnist-cnn-label=builtin:fmnist-cnn?output=label_only")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``fortis serve`` in a subprocess (or a stack in this process), accepting the API key
    of tenant-a and, with ``issuer`` (an OpenID Connect issuer URL), its bearer tokens."""

    def __init__(self, state: Path, in_process: bool, issuer: str = "") -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.stack: Any = None
        self.log = state / "serve.log"
        if in_process:
            from fortis.infra.serving.identity import parse_issuer_spec
            from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

            from tests.fuzz.idp import AUDIENCE, TENANT_CLAIM
            self.stack = start_stack(StackSettings(
                state_dir=state / "state", api_keys={API_KEY: "tenant-a"},
                targets=[TargetConfig.parse(t) for t in TARGETS],
                oidc_issuers=[parse_issuer_spec(issuer, audiences=[AUDIENCE],
                                                tenant_claim=TENANT_CLAIM,
                                                tenants=["tenant-a"])] if issuer else [],
                max_message_bytes=8 * 1024 * 1024))
            self.address = self.stack.address
            self.pid = os.getpid()
            return
        port = _free_port()
        self.address = f"127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "fortis.server.cli", "serve", "--address", self.address,
               "--state-dir", str(state / "state"), "--api-key", f"{API_KEY}=tenant-a",
               "--no-default-targets", "--log-level", "error", "--shutdown-grace", "2"]
        for t in TARGETS:
            cmd += ["--target", t]
        if issuer:
            from tests.fuzz.idp import AUDIENCE, TENANT_CLAIM
            cmd += ["--oidc-issuer", issuer, "--oidc-audience", AUDIENCE,
                    "--oidc-tenant-claim", TENANT_CLAIM, "--oidc-tenants", "tenant-a"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                     stderr=self.log.open("wb"), cwd=ROOT)
        self.pid = self.proc.pid

    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None

    def stop(self) -> int | None:
        if self.stack is not None:
            self.stack.stop(0)
            return None
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _wait_ready(channel: Any, server: Server, timeout: float = 120.0) -> None:
    from tests.fuzz.harness import healthy
    t0 = time.time()
    while time.time() - t0 < timeout:
        if not server.alive():
            raise SystemExit(f"fortis serve exited: {server.log.read_text()[-2000:]}")
        if healthy(channel, timeout=2.0):
            return
        time.sleep(0.5)
    raise SystemExit("fortis serve did not become healthy")


def _normal_call_ok(channel: Any) -> bool:
    """A plain ListTargets and GetTargetInfo answer as usual."""
    import grpc
    from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
    try:
        stub = proxy_pb2_grpc.TargetProxyServiceStub(channel)
        names = [t.name for t in stub.ListTargets(proxy_pb2.ListTargetsRequest(), metadata=MD,
                                                  timeout=10).targets]
        info = stub.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target="fmnist-cnn"),
                                  metadata=MD, timeout=10).info
    except grpc.RpcError:
        return False
    return "fmnist-cnn" in names and len(info.labels) == 10


def _prepare(channel: Any) -> None:
    from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc

    from tests.fuzz.strategies import FUZZ_SESSION, FUZZ_TARGET
    proxy_pb2_grpc.TargetProxyServiceStub(channel).CreateSession(
        proxy_pb2.CreateSessionRequest(target=FUZZ_TARGET, session_id=FUZZ_SESSION,
                                       query_budget=0), metadata=MD, timeout=30)


def run_cases(channel: Any, rpcs: dict[str, Any], per_rpc: int, seed: int,
              record: Callable[[str, Any, Any], None], md: tuple[tuple[str, str], ...] = MD,
              after: Callable[[], None] | None = None) -> None:
    """``per_rpc`` generated requests for each RPC of ``rpcs`` (hypothesis, generation only,
    seeded), each sent and judged; ``record(name, request, outcome)`` sees every one."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as seeded
    from hypothesis import strategies as st

    from tests.fuzz.harness import call
    def runner(name: str, case: Any) -> Callable[[], None]:
        @seeded(seed)
        @settings(max_examples=per_rpc, derandomize=False, database=None, deadline=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(st.data())
        def one(data: Any) -> None:
            req = data.draw(case.requests)
            meta = data.draw(case.metadata) if case.metadata is not None else md
            out = call(channel, case, req, metadata=meta, timeout=60.0)
            record(name, req, out)
            if after is not None:
                after()
        return one

    for name, case in rpcs.items():
        runner(name, case)()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10_000, help="total cases (spread over RPCs)")
    ap.add_argument("--in-process", action="store_true", help="stack in this process")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-oidc", action="store_true",
                    help="no identity provider: API keys only, no bearer-token cases")
    ns = ap.parse_args()
    with contextlib.redirect_stdout(sys.stderr):      # server log lines are not the JSON
        out, rc = fuzz(ns)
    print(json.dumps(out, indent=2))
    return rc


def fuzz(ns: argparse.Namespace) -> tuple[dict[str, Any], int]:

    import grpc

    from tests.fuzz.harness import healthy
    from tests.fuzz.strategies import RPCS, SERVED_RPCS, TARGET_RPCS, auth_cases
    tmp = Path(tempfile.mkdtemp(prefix="fortis-fuzz-"))
    idp = None
    if not ns.no_oidc:
        from tests.fuzz.idp import FuzzIdp
        idp = FuzzIdp()        # a real JWKS endpoint on loopback, keys made here
    server = Server(tmp, ns.in_process, idp.issuer if idp is not None else "")
    channel = grpc.insecure_channel(server.address, options=[
        ("grpc.max_send_message_length", 16 * 1024 * 1024),
        ("grpc.max_receive_message_length", 16 * 1024 * 1024)])
    _wait_ready(channel, server)
    _prepare(channel)

    per_rpc: Counter[str] = Counter()
    codes: Counter[str] = Counter()
    by_rpc_code: dict[str, Counter[str]] = {}
    problems: list[dict[str, Any]] = []
    internal = 0
    crashes = 0
    peak_rss = rss_kb(tree([server.pid]))
    slowest: dict[str, float] = {}
    t0 = time.perf_counter()

    def record(name: str, req: Any, out: Any) -> None:
        nonlocal internal, peak_rss
        per_rpc[name] += 1
        codes[out.code.name] += 1
        by_rpc_code.setdefault(name, Counter())[out.code.name] += 1
        slowest[name] = max(slowest.get(name, 0.0), out.seconds)
        if any("INTERNAL" in p or "UNKNOWN" in p for p in out.problems):
            internal += 1
        if out.problems and len(problems) < 40:
            text = str(req)
            problems.append({"rpc": name, "code": out.code.name, "problems": out.problems[:3],
                             "request": text[:300] + ("..." if len(text) > 300 else "")})
        if per_rpc.total() % 25 == 0:
            peak_rss = max(peak_rss, rss_kb(tree([server.pid])))

    def check_alive() -> None:
        nonlocal crashes
        if not server.alive():
            crashes += 1
            raise SystemExit("server died")

    served = {**RPCS, **SERVED_RPCS, **(auth_cases(idp, API_KEY) if idp is not None else {})}
    # RPCs whose request has no field (TargetService.GetTargetInfo, the proxy's
    # GetBuiltinTargets) make one case each; the others share the rest.
    fixed = 1 + sum(1 for k in served if k.endswith("TargetProxyService.GetBuiltinTargets"))
    n_rpcs = len(served) + len(TARGET_RPCS) - fixed
    each = max(1, -(-(ns.cases - fixed) // n_rpcs))
    died = False
    try:
        run_cases(channel, served, each, ns.seed, record, after=check_alive)
        # The built-in TargetService adapter, served on its own port for this run.
        from fortis.server.app.stack import TargetConfig, start_target_server
        target_server = start_target_server(TargetConfig.parse("t=builtin:fmnist-cnn"),
                                            max_message_bytes=8 * 1024 * 1024)
        tch = grpc.insecure_channel(target_server.address)
        run_cases(tch, TARGET_RPCS, each, ns.seed, record, md=())
        target_ok = healthy(tch) and _target_predict_ok(tch)
        tch.close()
        target_server.stop(0)
    except SystemExit:
        died = True
        target_ok = False
    seconds = time.perf_counter() - t0
    peak_rss = max(peak_rss, rss_kb(tree([server.pid])))
    health_after = (not died) and healthy(channel)
    normal_after = (not died) and _normal_call_ok(channel)
    channel.close()
    rc = server.stop()
    idp_hits = idp.hits if idp is not None else 0
    if idp is not None:
        idp.close()
    out = {
        "cases": per_rpc.total(), "rpcs": len(per_rpc), "per_rpc": dict(per_rpc),
        "status_codes": dict(codes.most_common()),
        "per_rpc_codes": {k: dict(v) for k, v in by_rpc_code.items()},
        "internal": internal, "rule_breaks": sum(1 for _ in problems),
        "examples": problems[:10], "crashes": crashes + (1 if died else 0),
        "server": "in-process stack" if ns.in_process else "fortis serve (subprocess)",
        "oidc": None if idp is None else {
            "issuer": "a JWKS server on loopback (tests/fuzz/idp.py), keys made at start",
            "auth_cases": sum(v for k, v in per_rpc.items() if k.startswith("Auth.")),
            "auth_codes": dict(sum((by_rpc_code[k] for k in by_rpc_code
                                    if k.startswith("Auth.")), Counter()).most_common()),
            "jwks_fetches": idp_hits},
        "not_in_contracts": sorted(SERVED_RPCS),
        "server_exit_code": rc, "peak_rss_mb": round(peak_rss / 1024, 1),
        "slowest_call_s": {k: round(v, 2) for k, v in sorted(slowest.items(),
                                                            key=lambda kv: -kv[1])[:6]},
        "health_after": health_after, "normal_call_after": normal_after,
        "target_adapter_after": target_ok, "seconds": round(seconds, 1),
    }
    bad = internal or problems or out["crashes"] or not (health_after and normal_after)
    return out, 1 if bad else 0


def _target_predict_ok(channel: Any) -> bool:
    from fortis.target.v1 import target_pb2, target_pb2_grpc

    from tests.fuzz.strategies import _valid_image_tensor
    resp = target_pb2_grpc.TargetServiceStub(channel).Predict(target_pb2.PredictRequest(
        images=[{"image_id": "ok", "tensor": _valid_image_tensor(1)}]), timeout=30)
    return len(resp.predictions) == 1


if __name__ == "__main__":
    raise SystemExit(main())
