#!/usr/bin/env python3
"""Noisy neighbour: do two ordinary tenants keep their latency and evaluation time beside a
third that uses every limit it is allowed?

One real ``fortis serve`` (all five services in one process, a subprocess on loopback, the
built-in Fashion-MNIST target, an API key file with three tenants) is shared by:

- **alice** and **bob**, ordinary tenants: each runs one small evaluation (the built-in target,
  a few corruptions over ``--images`` test images) while a probe thread calls the control RPCs
  a client or dashboard makes -- GetEvaluation, ListEvaluations, ValidatePlan, health Check,
  ListTargets -- one every ``--probe-interval`` seconds, each call timed;
- **mallory**, the noisy neighbour, only in the *noisy* phases, from many threads at once:
  ApplyPerturbation with the largest images the memory budget lets through (PNGs whose headers
  declare just under the largest answer message, docs/limits.md), proxy Predict calls with a
  request as large as the per-request decoded limit allows, WatchEvaluation streams opened as
  fast as they end, scoring Compute calls (IRT, the heaviest metric), and UploadBlob of model
  blobs until its storage quota refuses, deleting them and starting again.

Phases run *solo, noisy, solo, noisy, solo* (``--rounds``: noisy+solo pairs): this 2-core
machine is shared with other work, so each noisy phase is compared with the mean of the solo
phases around it, and every solo figure is printed so the noise between two solo runs can be
seen. ``--actions`` runs the neighbour with some of its actions only (one at a time shows
which slows the others); ``--serve-arg`` tries an operator's setting (e.g. a tenant quota).

Printed (JSON): per ordinary tenant and phase the evaluation's wall time (submit to
SUCCEEDED, through Watch) and the control RPCs' p50/p99/max latency (per RPC too); the ratios
noisy / solo of p99 latency and of evaluation time with ``within_1_5``; mallory's calls by RPC
and status code (accepted and refused); the server's peak RSS and the load average. Exit 0
whatever the ratios (a benchmark, never part of the test run).

Mallory's client process runs at ``--neighbour-nice`` (19 by default: on this shared machine its
own work would otherwise come out of the server's cores, where a real neighbour's client runs
on its own machine; 0 charges it to the server too). ``--split`` runs one process per service,
as the Helm chart does, instead of one with all five.

    python bench/noisy_neighbour.py [--images 200] [--rounds 2] [--actions perturb,...]
                                    [--serve-arg=--tenant-quota=mallory=calls:1]
                                    [--split] [--neighbour-nice N] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import hashlib
import json
import os
import platform
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from fortis.common.v1 import common_pb2
from fortis.evaluation.v1 import evaluation_pb2 as ev
from fortis.evaluation.v1 import evaluation_pb2_grpc, uploads_pb2, uploads_pb2_grpc
from fortis.perturbation.v1 import perturbation_pb2 as pt
from fortis.perturbation.v1 import perturbation_pb2_grpc
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.scoring.v1 import scoring_pb2, scoring_pb2_grpc
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _proc import cpu_s, machine_cpu, rss_kb, tree  # noqa: E402 - bench/ beside this script

ROOT = Path(__file__).resolve().parents[1]
ORDINARY = ("alice", "bob")
HOSTILE = "mallory"
KEYS = {t: f"bench-noisy-key-{t}-0123456789" for t in (*ORDINARY, HOSTILE)}
TARGET = "fmnist-cnn"
#: The server's defaults (docs/limits.md): the largest answer message and decoded request.
MAX_MESSAGE = 64 * 1024 * 1024
MAX_REQUEST_DECODED = 128 * 1024 * 1024
ANSWER_OVERHEAD = 512           # infra/serving/memory.py: bytes of one answered image's framing
MIB = 1024 * 1024
MALLORY_SESSION = "mallory-session"
ACTIONS = ("perturb", "predict", "watch", "compute", "upload")


def _log(msg: str) -> None:
    print(f"[noisy {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the server --------------------------------------------------------------------------------


#: The services, each a process of its own with ``--split`` (as the Helm chart runs them).
SERVICES = ("proxy", "perturbation", "scoring", "report", "evaluation")
#: With ``--split``: the key Fortis's own services call each other with (FORTIS_INTERNAL_KEY).
INTERNAL_KEY = "bench-noisy-internal-key-0123456789"


@contextlib.contextmanager
def serve(state: Path, upload_quota: int, extra: list[str], split: bool = False
          ) -> Iterator[tuple[dict[str, str], list[int]]]:
    """``fortis serve`` with an API key file of three tenants (hashes only, as `fortis keys
    new` writes them) and the built-in Fashion-MNIST target: one process with every service,
    or with ``split`` one process per service (``--service NAME``, the other services'
    addresses, one internal key: the Helm chart's layout on one machine). Yields each
    service's address and the processes' pids."""
    keys = state / "api-keys.txt"
    keys.write_text("".join(f"{t} sha256:{hashlib.sha256(k.encode()).hexdigest()}\n"
                            for t, k in KEYS.items()))
    common = ["--api-keys-file", str(keys), "--log-level", "warning", "--shutdown-grace", "2"]
    target = ["--target", f"{TARGET}=builtin:fmnist-cnn"]
    procs: list[subprocess.Popen[str]] = []
    logs = []

    def start(name: str, args: list[str]) -> str:
        log = (state / f"serve-{name}.log").open("wb")
        logs.append(log)
        proc = subprocess.Popen(
            [sys.executable, "-m", "fortis.server.cli", "serve", "--address", "127.0.0.1:0",
             "--state-dir", str(state / "state" / name), *common, *args, *extra],
            stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT,
            env={**os.environ, "FORTIS_INTERNAL_KEY": INTERNAL_KEY})
        procs.append(proc)
        line = proc.stdout.readline() if proc.stdout else ""
        if not line:
            raise SystemExit(f"fortis serve ({name}) did not start: "
                             f"{(state / f'serve-{name}.log').read_text()[-2000:]}")
        return str(json.loads(line)["address"])

    try:
        if not split:
            address = start("all", ["--no-default-targets", *target,
                                    "--upload-quota-bytes", str(upload_quota)])
            yield {svc: address for svc in SERVICES}, [p.pid for p in procs]
            return
        addrs: dict[str, str] = {}
        for svc in SERVICES:     # each service after those it calls
            others = [f"--{o}-address={addrs[o]}" for o in SERVICES if o in addrs]
            args = [f"--service={svc}", *others, "--no-default-targets"]
            if svc == "proxy":
                args += target
            if svc == "evaluation":
                args += ["--upload-quota-bytes", str(upload_quota)]
            addrs[svc] = start(svc, args)
        yield addrs, [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()


class Stubs:
    """Generated stubs, each on a channel to its service's address, and a tenant's
    metadata."""

    def __init__(self, addrs: dict[str, str], tenant: str) -> None:
        self.md = (("x-api-key", KEYS[tenant]),)
        self._channels: dict[str, grpc.Channel] = {}

        def ch(svc: str) -> grpc.Channel:
            a = addrs[svc]
            if a not in self._channels:
                self._channels[a] = _channel(a)
            return self._channels[a]
        self.ev = evaluation_pb2_grpc.EvaluationServiceStub(ch("evaluation"))
        self.up = uploads_pb2_grpc.UploadServiceStub(ch("evaluation"))
        self.pt = perturbation_pb2_grpc.PerturbationServiceStub(ch("perturbation"))
        self.px = proxy_pb2_grpc.TargetProxyServiceStub(ch("proxy"))
        self.sc = scoring_pb2_grpc.ScoringServiceStub(ch("scoring"))
        # the control probes' health check: the service the tenant's client talks to
        self.health = health_pb2_grpc.HealthStub(ch("evaluation"))

    def close(self) -> None:
        for c in self._channels.values():
            c.close()


def _channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=[
        ("grpc.max_receive_message_length", MAX_MESSAGE + MIB),
        ("grpc.max_send_message_length", MAX_MESSAGE + MIB)])


# -- the ordinary tenants ------------------------------------------------------------------------


def plan_text(tenant: str, images: int, corruptions: list[str], severities: list[int],
              batch: int) -> str:
    corr = ", ".join(f"{{id: {c}, severities: [{', '.join(map(str, severities))}]}}"
                     for c in corruptions)
    return (f"name: noisy-{tenant}\nseed: 7\ntarget: {{name: {TARGET}, task: classification}}\n"
            f"dataset: {{source: fashion-mnist, split: test, limit: {images}}}\n"
            f"correctness: {{mode: top1}}\ncorruptions: [{corr}]\n"
            f"execution: {{batch_size: {batch}}}\n")


def _percentile(xs: list[float], q: float) -> float:
    """The q-quantile (nearest rank, as latency SLOs read it) of ``xs``."""
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(np.ceil(q * len(s))) - 1))]


def _latency(xs: list[float]) -> dict[str, Any]:
    return {"calls": len(xs), "p50_ms": round(1000 * _percentile(xs, 0.50), 1),
            "p99_ms": round(1000 * _percentile(xs, 0.99), 1),
            "max_ms": round(1000 * max(xs, default=0.0), 1)}


def ordinary_run(addrs: dict[str, str], tenant: str, plan: str, probe_interval: float,
                 tag: str, start: threading.Barrier) -> dict[str, Any]:
    """One ordinary tenant's phase: submit its evaluation, probe the control RPCs until it
    has ended, and time both."""
    from fortis.client import FortisClient

    stubs = Stubs(addrs, tenant)
    latencies: dict[str, list[float]] = {}
    probe_errors: Counter[str] = Counter()
    done = threading.Event()
    eid = f"{tag}-{tenant}"
    probes: list[tuple[str, Callable[[float], Any]]] = [
        ("GetEvaluation", lambda t: stubs.ev.GetEvaluation(
            ev.GetEvaluationRequest(evaluation_id=eid), metadata=stubs.md, timeout=t)),
        ("ListEvaluations", lambda t: stubs.ev.ListEvaluations(
            ev.ListEvaluationsRequest(page_size=20), metadata=stubs.md, timeout=t)),
        ("ValidatePlan", lambda t: stubs.ev.ValidatePlan(
            ev.ValidatePlanRequest(plan=plan), metadata=stubs.md, timeout=t)),
        ("Health.Check", lambda t: stubs.health.Check(
            health_pb2.HealthCheckRequest(), timeout=t)),
        ("ListTargets", lambda t: stubs.px.ListTargets(
            proxy_pb2.ListTargetsRequest(), metadata=stubs.md, timeout=t)),
    ]

    def probe() -> None:
        i = 0
        while not done.is_set():
            name, fn = probes[i % len(probes)]
            i += 1
            t0 = time.perf_counter()
            try:
                fn(30.0)
                latencies.setdefault(name, []).append(time.perf_counter() - t0)
            except grpc.RpcError as exc:
                # a refused probe counts as an error and at its full latency
                latencies.setdefault(name, []).append(time.perf_counter() - t0)
                probe_errors[f"{name}:{exc.code().name}"] += 1
            done.wait(probe_interval)

    with FortisClient(addrs["evaluation"], api_key=KEYS[tenant], timeout_s=120) as fc:
        start.wait()
        prober = threading.Thread(target=probe, name=f"probe-{tenant}", daemon=True)
        t0 = time.perf_counter()
        try:
            fc.submit(plan, evaluation_id=eid)
            prober.start()          # from here on its own evaluation exists to be read
            final = fc.wait(eid, timeout_s=1800)
            state = final.state.value
        except Exception as exc:      # noqa: BLE001 - reported, the other tenant goes on
            state = f"error: {type(exc).__name__}: {str(exc)[:200]}"
        seconds = time.perf_counter() - t0
        done.set()
        if prober.is_alive():
            prober.join(60)
    stubs.close()
    every = [x for xs in latencies.values() for x in xs]
    return {"evaluation_id": eid, "state": state, "evaluation_s": round(seconds, 2),
            "control_rpcs": _latency(every), "_latencies_s": every,
            "per_rpc": {k: _latency(v) for k, v in sorted(latencies.items())},
            "probe_errors": dict(probe_errors)}


# -- the noisy neighbour -----------------------------------------------------------------------


def _png(width: int, height: int, channels: int, seed: int) -> bytes:
    """A PNG of a smooth gradient (a few KB on the wire, ``width x height x channels`` bytes
    once decoded): the shape of request the memory budget exists for."""
    colour = {1: 0, 3: 2, 4: 6}[channels]
    x = (np.arange(width, dtype=np.uint32) * 255 // max(1, width - 1)).astype(np.uint8)
    row = (np.repeat(x, channels).astype(np.int32) + seed) % 256
    line = b"\x00" + row.astype(np.uint8).tobytes()
    raw = line * height

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + \
            struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 6))
            + chunk(b"IEND", b""))


def largest_perturbation_images(count: int) -> list[common_pb2.Image]:
    """``count`` RGB squares whose decoded bytes, with each answered image's framing, fill
    the largest answer message (ApplyPerturbation's answer carries every image back)."""
    per_image = (MAX_MESSAGE - 64 * 1024) // count - ANSWER_OVERHEAD
    side = int((per_image / 3) ** 0.5)
    return [common_pb2.Image(image_id=f"big-{i}", encoded=_png(side, side, 3, i))
            for i in range(count)]


def largest_predict_images() -> list[common_pb2.Image]:
    """Grey squares (the target's channel count) filling the per-request decoded limit."""
    side = 4096
    n = (MAX_REQUEST_DECODED - 64 * 1024) // (side * side)
    return [common_pb2.Image(image_id=f"huge-{i}", encoded=_png(side, side, 1, i))
            for i in range(n)]


class Hostile:
    """Mallory's threads; every call's outcome counted by RPC and status code."""

    def __init__(self, addrs: dict[str, str], ns: argparse.Namespace, watch_id: str) -> None:
        self.addrs = addrs
        self.ns = ns
        self.watch_id = watch_id
        self.stop = threading.Event()
        self.counts: dict[str, Counter[str]] = {}
        self.refusals: dict[str, str] = {}
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.session = MALLORY_SESSION
        self.big_images = largest_perturbation_images(ns.perturb_images)
        self.predict_images = largest_predict_images()
        self.uploaded_bytes = 0
        self.compute = self._compute_request()

    def _count(self, rpc: str, code: str, message: str = "") -> None:
        with self.lock:
            self.counts.setdefault(rpc, Counter())[code] += 1
            if code != "OK" and f"{rpc}:{code}" not in self.refusals:
                self.refusals[f"{rpc}:{code}"] = message[:240]

    def _call(self, rpc: str, fn: Callable[[], Any]) -> tuple[Any, str]:
        """(the answer or None, the status message when refused)"""
        try:
            out = fn()
        except grpc.RpcError as exc:
            self._count(rpc, exc.code().name, exc.details() or "")
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                self.stop.wait(0.05)        # a refused client retries at once, all but
            return None, exc.details() or ""
        self._count(rpc, "OK")
        return out, ""

    def _compute_request(self) -> scoring_pb2.ComputeRequest:
        rng = np.random.default_rng(0)
        n = self.ns.compute_subjects
        req = scoring_pb2.ComputeRequest(metric="irt")
        params = {"subjects": [f"s{i}" for i in range(n)],
                  "metrics": [{"name": f"m{j}", "category": "c",
                               "values": [float(v) for v in rng.random(n)],
                               "higher_is_better": True} for j in range(n)],
                  "chain_length": self.ns.compute_chain,
                  "burn_in": self.ns.compute_chain // 2}
        req.params.CopyFrom(_struct(params))
        return req

    def start(self) -> None:
        ns = self.ns
        plan = {"perturb": (self.perturb, ns.perturb_threads),
                "predict": (self.predict, ns.predict_threads),
                "watch": (self.watch, ns.watch_threads),
                "compute": (self.computes, ns.compute_threads),
                "upload": (self.uploads, ns.upload_threads)}
        for fn, n in (plan[a] for a in ns.actions):
            for k in range(n):
                t = threading.Thread(target=fn, args=(k,), name=f"mallory-{fn.__name__}-{k}",
                                     daemon=True)
                self.threads.append(t)
                t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)
        self.threads = []

    def _stubs(self) -> tuple[Stubs, Stubs]:
        s = Stubs(self.addrs, HOSTILE)
        return s, s         # (what to close, the stubs)

    def perturb(self, k: int) -> None:
        ch, s = self._stubs()
        req = pt.ApplyPerturbationRequest(perturbation_id="gaussian_noise", severity=5, seed=k,
                                          images=self.big_images)
        while not self.stop.is_set():
            self._call("ApplyPerturbation",
                       lambda: s.pt.ApplyPerturbation(req, metadata=s.md, timeout=120))
        ch.close()

    def predict(self, k: int) -> None:
        ch, s = self._stubs()
        req = proxy_pb2.PredictRequest(session_id=self.session, origin="mallory",
                                       images=self.predict_images)
        small = proxy_pb2.PredictRequest(session_id=self.session, origin="mallory", images=[
            common_pb2.Image(image_id=f"s{i}", tensor=common_pb2.Tensor(
                dtype=common_pb2.D_TYPE_UINT8, shape=[28, 28, 1], data=bytes(784)))
            for i in range(1024)])          # the most images one request may carry
        i = 0
        while not self.stop.is_set():
            r = req if i % 2 == 0 else small
            i += 1
            self._call("Predict", functools.partial(s.px.Predict, r, metadata=s.md,
                                                    timeout=120))
        ch.close()

    def watch(self, k: int) -> None:
        ch, s = self._stubs()
        ids = [self.watch_id, f"alice-not-mine-{k}"]
        i = 0
        while not self.stop.is_set():
            eid = ids[i % 2] if k % 2 else self.watch_id
            i += 1

            def one(eid: str = eid) -> int:
                n = 0
                for _ in s.ev.WatchEvaluation(ev.WatchEvaluationRequest(evaluation_id=eid),
                                              metadata=s.md, timeout=30):
                    n += 1
                return n
            self._call("WatchEvaluation", one)
        ch.close()

    def computes(self, k: int) -> None:
        ch, s = self._stubs()
        while not self.stop.is_set():
            self._call("Compute", lambda: s.sc.Compute(self.compute, metadata=s.md, timeout=120))
        ch.close()

    def uploads(self, k: int) -> None:
        """Model blobs (a zip signature, random bytes) until the quota refuses one; then
        every blob is deleted and it starts again."""
        ch, s = self._stubs()
        size = self.ns.upload_blob_mib * MIB
        # random bytes made once (making them is the client's work, not the server's); each
        # upload differs in its first block, so none is stored as a copy of another
        body = bytearray(b"PK\x03\x04" + np.random.default_rng(100 + k).bytes(size - 4))
        mine: list[str] = []
        n = 0
        while not self.stop.is_set():
            n += 1
            body[4:12] = struct.pack(">Q", n)

            def requests() -> Iterator[uploads_pb2.UploadBlobRequest]:
                yield uploads_pb2.UploadBlobRequest(header=uploads_pb2.UploadHeader(
                    kind=uploads_pb2.BLOB_KIND_MODEL, size=size))
                for off in range(0, size, MIB):
                    yield uploads_pb2.UploadBlobRequest(chunk=bytes(body[off:off + MIB]))
            resp, why = self._call("UploadBlob", lambda: s.up.UploadBlob(
                requests(), metadata=s.md, timeout=300))
            if resp is not None:
                mine.append(resp.blob.blob_id)
                with self.lock:
                    self.uploaded_bytes += size
            elif "upload storage" in why and not self.stop.is_set():
                # refused by the storage quota: make room and go on
                for blob_id in mine:
                    delete = uploads_pb2.DeleteBlobRequest(blob_id=blob_id)
                    self._call("DeleteBlob", functools.partial(
                        s.up.DeleteBlob, delete, metadata=s.md, timeout=60))
                mine = []
        for blob_id in mine:
            with contextlib.suppress(grpc.RpcError):
                s.up.DeleteBlob(uploads_pb2.DeleteBlobRequest(blob_id=blob_id), metadata=s.md,
                                timeout=60)
        ch.close()

    def report(self) -> dict[str, Any]:
        with self.lock:
            by_rpc = {k: dict(v.most_common()) for k, v in sorted(self.counts.items())}
            total: Counter[str] = Counter()
            for v in self.counts.values():
                total.update(v)
            return {"calls_by_rpc_and_code": by_rpc, "calls_by_code": dict(total.most_common()),
                    "accepted": total.get("OK", 0),
                    "refused": sum(v for c, v in total.items() if c != "OK"),
                    "uploaded_mib": round(self.uploaded_bytes / MIB, 1),
                    "first_refusal_messages": dict(sorted(self.refusals.items()))}


def _hostile_process(addrs: dict[str, str], options: dict[str, Any], watch_id: str,
                     conn: Any) -> None:
    """Mallory in a process of its own (as a real neighbour is: its client's threads never
    take the interpreter lock the ordinary tenants' clients need): "ready" once its requests
    are built and its threads run, then its report when told to stop."""
    if options.get("neighbour_nice"):
        # a real neighbour's client runs on its own machine: here its own work (building
        # requests, reading 64 MiB answers) is kept from taking the server's cores
        os.nice(options["neighbour_nice"])
    hostile = Hostile(addrs, argparse.Namespace(**options), watch_id)
    hostile.start()
    cpu0 = time.process_time()
    conn.send("ready")
    conn.recv()
    hostile.finish()
    # the neighbour's own client work (this machine's cores are the server's too)
    conn.send({**hostile.report(), "client_cpu_s": round(time.process_time() - cpu0, 1)})
    conn.close()


@contextlib.contextmanager
def neighbour(addrs: dict[str, str], ns: argparse.Namespace, watch_id: str
              ) -> Iterator[Callable[[], Any]]:
    """Mallory's process running at full noise; yields a function that stops it and
    returns its report."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_hostile_process, args=(addrs, vars(ns), watch_id, child),
                       daemon=True)
    proc.start()
    if not parent.poll(300) or parent.recv() != "ready":
        proc.kill()
        raise SystemExit("the noisy neighbour did not start")
    report: list[Any] = []

    def stop() -> Any:
        if not report:
            parent.send("stop")
            report.append(parent.recv() if parent.poll(300) else {"error": "no report"})
        return report[0]

    try:
        yield stop
    finally:
        stop()
        proc.join(30)
        if proc.is_alive():
            proc.kill()


def _retried(fn: Callable[[], Any]) -> Any:
    """A setup call, retried while the tenant's calls in progress are at its quota (the Watch
    stream just ended may not have given its slot back yet, e.g. with calls:1)."""
    for _ in range(50):
        try:
            return fn()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            time.sleep(0.2)
    return fn()


def _struct(d: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(d)
    return s


# -- phases ------------------------------------------------------------------------------------


def run_phase(addrs: dict[str, str], pids: list[int], name: str, plans: dict[str, str],
              ns: argparse.Namespace, noisy: bool) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        stop_neighbour = stack.enter_context(neighbour(addrs, ns, "mallory-eval")) \
            if noisy else None
        if noisy:
            time.sleep(ns.warmup)      # the neighbour at full noise before anyone is timed
        out = _ordinary_phase(addrs, pids, name, plans, ns, stop_neighbour)
    return out


def _ordinary_phase(addrs: dict[str, str], pids: list[int], name: str, plans: dict[str, str],
                    ns: argparse.Namespace, stop_neighbour: Callable[[], Any] | None
                    ) -> dict[str, Any]:
    load0 = os.getloadavg()[0]
    # the server's worker processes (metrics run there) are part of its CPU
    cpu0 = cpu_s(tree(pids))
    machine0 = machine_cpu()
    peak = [rss_kb(pids), 0]
    watching = threading.Event()

    def rss() -> None:
        while not watching.wait(0.5):
            peak[0] = max(peak[0], rss_kb(pids))
            peak[1] = max(peak[1], rss_kb(p for p in tree(pids) if p not in pids))

    threading.Thread(target=rss, daemon=True).start()
    barrier = threading.Barrier(len(ORDINARY))
    results: dict[str, Any] = {}

    def run(t: str) -> None:
        results[t] = ordinary_run(addrs, t, plans[t], ns.probe_interval, name, barrier)

    threads = [threading.Thread(target=run, args=(t,)) for t in ORDINARY]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    hostile_out = stop_neighbour() if stop_neighbour is not None else None
    watching.set()
    out = {"phase": name, "noisy": stop_neighbour is not None, "seconds": round(seconds, 1),
           "load_avg_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],
           "server_peak_rss_mib": round(peak[0] / 1024, 1),
           # summed over the processes: the libraries they map counted in each
           "server_worker_processes_peak_rss_mib": round(peak[1] / 1024, 1),
           "server_cpu_s": round(cpu_s(tree(pids)) - cpu0, 1),
           "machine_cpu_s": {k: round(v - machine0.get(k, 0.0), 1)
                             for k, v in machine_cpu().items()},
           "tenants": {t: results[t] for t in ORDINARY}}
    if hostile_out is not None:
        out["hostile"] = hostile_out
    _log(f"{name}: " + ", ".join(
        f"{t} {results[t]['state']} {results[t]['evaluation_s']} s, p99 "
        f"{results[t]['control_rpcs']['p99_ms']} ms" for t in ORDINARY))
    return out


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b > 0 else None


def ratios(phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each noisy phase against the mean of the solo phases just before and after it."""
    out = []
    for i, p in enumerate(phases):
        if not p["noisy"]:
            continue
        solos = [q for q in (phases[i - 1] if i else None,
                             phases[i + 1] if i + 1 < len(phases) else None)
                 if q is not None and not q["noisy"]]
        row: dict[str, Any] = {"noisy_phase": p["phase"], "against": [q["phase"] for q in solos],
                               "tenants": {}}
        for t in ORDINARY:
            solo_p99 = statistics.mean(q["tenants"][t]["control_rpcs"]["p99_ms"] for q in solos)
            solo_ev = statistics.mean(q["tenants"][t]["evaluation_s"] for q in solos)
            p99 = _ratio(p["tenants"][t]["control_rpcs"]["p99_ms"], solo_p99)
            evr = _ratio(p["tenants"][t]["evaluation_s"], solo_ev)
            row["tenants"][t] = {
                "p99_latency_ratio": p99, "evaluation_time_ratio": evr,
                "p99_within_1_5": p99 is not None and p99 <= 1.5,
                "evaluation_within_1_5": evr is not None and evr <= 1.5,
                "solo_p99_ms": [q["tenants"][t]["control_rpcs"]["p99_ms"] for q in solos],
                "noisy_p99_ms": p["tenants"][t]["control_rpcs"]["p99_ms"],
                "solo_evaluation_s": [q["tenants"][t]["evaluation_s"] for q in solos],
                "noisy_evaluation_s": p["tenants"][t]["evaluation_s"],
                "solo_to_solo_evaluation_ratio": _ratio(
                    max(q["tenants"][t]["evaluation_s"] for q in solos),
                    min(q["tenants"][t]["evaluation_s"] for q in solos)),
            }
        out.append(row)
    return out


def pooled(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """Per tenant, every noisy phase's probes against every solo phase's (one p99 over each
    set, several hundred calls more than a single phase has: a phase's p99 is its 4th
    slowest call, and moves by half between two solo phases alone), and the mean evaluation
    time of each."""
    out: dict[str, Any] = {}
    for t in ORDINARY:
        sets = {kind: [p["tenants"][t] for p in phases if p["noisy"] == noisy]
                for kind, noisy in (("solo", False), ("noisy", True))}
        if not sets["noisy"] or not sets["solo"]:
            return {}
        lat = {k: [x for r in v for x in r["_latencies_s"]] for k, v in sets.items()}
        ev_s = {k: statistics.mean(r["evaluation_s"] for r in v) for k, v in sets.items()}
        p99 = {k: 1000 * _percentile(v, 0.99) for k, v in lat.items()}
        out[t] = {"solo_calls": len(lat["solo"]), "noisy_calls": len(lat["noisy"]),
                  "solo_p99_ms": round(p99["solo"], 1), "noisy_p99_ms": round(p99["noisy"], 1),
                  "p99_latency_ratio": _ratio(p99["noisy"], p99["solo"]),
                  "solo_evaluation_s": round(ev_s["solo"], 2),
                  "noisy_evaluation_s": round(ev_s["noisy"], 2),
                  "evaluation_time_ratio": _ratio(ev_s["noisy"], ev_s["solo"])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--images", type=int, default=200, help="images of each ordinary tenant's "
                    "evaluation (default 200)")
    ap.add_argument("--corruptions", default="gaussian_noise,contrast,defocus_blur,"
                    "jpeg_compression")
    ap.add_argument("--severities", default="1,2,3,4,5")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2, help="noisy+solo pairs after the first "
                    "solo phase (default 2: solo, noisy, solo, noisy, solo)")
    ap.add_argument("--probe-interval", type=float, default=0.03, metavar="S",
                    help="pause between two probes of a tenant (default 0.03: ~300 calls a "
                    "phase, enough for a p99 that is not just the slowest call; 33 calls a "
                    "second, under the default per-tenant call rate)")
    ap.add_argument("--warmup", type=float, default=5.0, metavar="S",
                    help="seconds the neighbour is at full noise before a noisy phase starts")
    g = ap.add_argument_group("the noisy neighbour")
    g.add_argument("--perturb-threads", type=int, default=4)
    g.add_argument("--perturb-images", type=int, default=4,
                   help="images per ApplyPerturbation (together the largest answer)")
    g.add_argument("--predict-threads", type=int, default=2)
    g.add_argument("--watch-threads", type=int, default=6)
    g.add_argument("--compute-threads", type=int, default=3)
    g.add_argument("--compute-subjects", type=int, default=50,
                   help="IRT subjects = metrics of each Compute call")
    g.add_argument("--compute-chain", type=int, default=2000, help="IRT chain length")
    g.add_argument("--upload-threads", type=int, default=1)
    g.add_argument("--upload-blob-mib", type=int, default=64)
    g.add_argument("--upload-quota-mib", type=int, default=256,
                   help="every tenant's storage quota on this server (--upload-quota-bytes)")
    g.add_argument("--neighbour-nice", type=int, default=19, metavar="N",
                   help="the neighbour's client process runs at this nice value (default 19: "
                   "its own CPU, which a real neighbour spends on its own machine, is not "
                   "taken from the server on this shared machine; 0: same priority)")
    g.add_argument("--actions", default=",".join(ACTIONS),
                   help=f"what the neighbour does (default all: {','.join(ACTIONS)}); one "
                   "at a time shows which of them slows the others")
    ap.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                    help="one more argument of fortis serve (repeatable), e.g. "
                    "--serve-arg=--tenant-quota=mallory=calls:2 to try an operator's setting")
    ap.add_argument("--split", action="store_true", help="one process per service (fortis "
                    "serve --service NAME, as the Helm chart runs them) instead of one with "
                    "all five")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 8 images, one "
                    "corruption at one severity, a lighter neighbour")
    ap.add_argument("--out", help="also write the JSON here")
    ns = ap.parse_args()
    if ns.quick:
        ns.images, ns.corruptions, ns.severities, ns.warmup = 8, "contrast", "1", 2.0
        ns.compute_chain, ns.compute_subjects, ns.upload_blob_mib = 200, 10, 16
    ns.actions = [a for a in ns.actions.split(",") if a]
    unknown = sorted(set(ns.actions) - set(ACTIONS))
    if unknown:
        raise SystemExit(f"unknown --actions: {', '.join(unknown)}")
    corruptions = ns.corruptions.split(",")
    severities = [int(s) for s in ns.severities.split(",")]
    plans = {t: plan_text(t, ns.images, corruptions, severities, ns.batch) for t in ORDINARY}
    started = datetime.datetime.now(datetime.UTC)
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fortis-noisy-") as tmp, \
            serve(Path(tmp), ns.upload_quota_mib * MIB, ns.serve_arg, ns.split) as (addrs, pids):
        _log(f"fortis serve at {addrs} (pids {pids})")
        m = Stubs(addrs, HOSTILE)
        # Mallory's own small evaluation, finished before anything is timed: what its Watch
        # streams follow (each ends after the final state, and is opened again at once).
        m.ev.CreateEvaluation(ev.CreateEvaluationRequest(
            plan=plan_text(HOSTILE, 4, ["contrast"], [1], 4), evaluation_id="mallory-eval"),
            metadata=m.md, timeout=60)
        from fortis.client import FortisClient
        with FortisClient(addrs["evaluation"], api_key=KEYS[HOSTILE]) as fc:
            fc.wait("mallory-eval", timeout_s=600)
        _retried(lambda: m.px.CreateSession(proxy_pb2.CreateSessionRequest(
            target=TARGET, session_id=MALLORY_SESSION), metadata=m.md, timeout=60))
        # warm up: models loaded, the target answered, for every tenant's first timed call
        for t in ORDINARY:
            s = Stubs(addrs, t)
            s.ev.ValidatePlan(ev.ValidatePlanRequest(plan=plans[t]), metadata=s.md, timeout=60)
            s.close()
        phases = [run_phase(addrs, pids, "solo-1", plans, ns, False)]
        for r in range(1, ns.rounds + 1):
            phases.append(run_phase(addrs, pids, f"noisy-{r}", plans, ns, True))
            phases.append(run_phase(addrs, pids, f"solo-{r + 1}", plans, ns, False))
        m.close()
    rows = ratios(phases)
    pool = pooled(phases)
    for p in phases:
        for r in p["tenants"].values():
            r.pop("_latencies_s", None)
    out = {
        "benchmark": "noisy_neighbour", "started_utc": started.isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - t_all, 1),
        "server": ("fortis serve, one process per service (--split)" if ns.split else
                   "fortis serve (subprocess, all services)") + ", loopback, API key file of 3 "
                  "tenants, server default limits, --upload-quota-bytes "
                  f"{ns.upload_quota_mib * MIB}" + "".join(f" {a}" for a in ns.serve_arg),
        "ordinary_workload": {"tenants": list(ORDINARY), "images": ns.images,
                              "corruptions": corruptions, "severities": severities,
                              "batch": ns.batch, "probe_interval_s": ns.probe_interval,
                              "probes": ["GetEvaluation", "ListEvaluations", "ValidatePlan",
                                         "Health.Check", "ListTargets"]},
        "hostile_workload": {
            "tenant": HOSTILE, "actions": ns.actions, "client_nice": ns.neighbour_nice,
            "apply_perturbation": f"{ns.perturb_threads} threads, {ns.perturb_images} RGB "
                                  "PNGs per call declaring together just under the largest "
                                  "answer (64 MiB), gaussian_noise severity 5",
            "predict": f"{ns.predict_threads} threads, alternately grey PNGs declaring just "
                       "under the per-request decoded limit (128 MiB) and 1024 28x28 images",
            "watch": f"{ns.watch_threads} threads reopening WatchEvaluation (own finished "
                     "evaluation; half the threads also another tenant's id)",
            "compute": f"{ns.compute_threads} threads, irt {ns.compute_subjects} subjects x "
                       f"{ns.compute_subjects} metrics, chain {ns.compute_chain}",
            "upload": f"{ns.upload_threads} thread(s), {ns.upload_blob_mib} MiB model blobs "
                      f"up to the {ns.upload_quota_mib} MiB quota, then delete and repeat"},
        "method": "phases solo, noisy, solo (x rounds); each noisy phase compared with the "
                  "mean of the solo phases around it (ratios, worst), and every noisy phase's "
                  "probes pooled against every solo phase's (pooled); this 2-core machine "
                  "runs the server and all three tenants' clients, so the solo-to-solo ratio "
                  "shows the noise of the machine alone",
        "ratios": rows,
        "worst": {t: {"p99_latency_ratio": max((r["tenants"][t]["p99_latency_ratio"] or 0.0)
                                               for r in rows),
                      "evaluation_time_ratio": max((r["tenants"][t]["evaluation_time_ratio"]
                                                    or 0.0) for r in rows)}
                  for t in ORDINARY} if rows else {},
        "all_within_1_5": bool(rows) and all(v["p99_within_1_5"] and v["evaluation_within_1_5"]
                              for r in rows for v in r["tenants"].values()),
        "pooled": pool,
        "pooled_within_1_5": bool(pool) and all(
            (v["p99_latency_ratio"] or 9) <= 1.5 and (v["evaluation_time_ratio"] or 9) <= 1.5
            for v in pool.values()),
        "phases": phases,
        "cpus": os.cpu_count(), "python": platform.python_version(), "grpcio": grpc.__version__,
    }
    text = json.dumps(out, indent=2)
    if ns.out:
        Path(ns.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
