#!/usr/bin/env python3
"""Two tenants at one rate-limited target: does either slow the other down?

``fortis serve --service proxy`` runs in its own process with one target limited to
``--rate`` images/s and two API keys. Tenant **bob** sends single images from
``--bob-threads`` threads for as long as the run lasts; tenant **alice** sends
``--alice-images`` images in batches of ``--alice-batch`` from one thread. Both call
``TargetProxyService.Predict`` through the generated stubs only (as any gRPC client would).

Printed (JSON): how long alice's images took against the time an equal share would take
(``alice_images / (rate_sustained / 2)``, the sustained rate being ``rate / 1.1`` with the
limiter's default 0.1 s margin), and each tenant's share of the images that reached the
target while alice was sending. Run it before and after a change to the limiter: an equal
share is 0.5, and ``alice_over_fair_share_time`` near 1 means alice was not slowed by bob.

    python bench/proxy_fairness.py [--rate 40] [--bob-threads 6] [--alice-images 40]
                                   [--alice-batch 5] [--limit-s 120]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
from fortis.common.v1 import common_pb2
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc

KEYS = {"alice": "bench-key-alice-0123456789", "bob": "bench-key-bob-0123456789"}
MARGIN = 0.1        # the limiter's default jitter_s: sustained rate = rate / (1 + margin)


@contextlib.contextmanager
def _proxy(rate: float, state: str) -> Iterator[str]:
    env = {**os.environ, "FORTIS_API_KEYS": ",".join(f"{k}={t}" for t, k in KEYS.items())}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fortis.server.cli", "serve", "--service", "proxy", "--log-level",
         "warning", "--address", "127.0.0.1:0", "--state-dir", state,
         "--target", f"t=builtin:fmnist-cnn?rate={rate:g}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=env)
    try:
        line = "x"
        while line and not line.startswith("{"):
            line = proc.stdout.readline() if proc.stdout else ""
        if not line:
            raise RuntimeError("fortis serve did not start")
        yield json.loads(line)["address"]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _image(image_id: str) -> common_pb2.Image:
    pixels = np.random.default_rng(0).integers(0, 256, (28, 28, 1), dtype=np.uint8)
    return common_pb2.Image(image_id=image_id, tensor=common_pb2.Tensor(
        dtype=common_pb2.D_TYPE_UINT8, shape=[28, 28, 1], data=pixels.tobytes()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=40.0)
    ap.add_argument("--bob-threads", type=int, default=6)
    ap.add_argument("--alice-images", type=int, default=40)
    ap.add_argument("--alice-batch", type=int, default=5)
    ap.add_argument("--limit-s", type=float, default=120.0,
                    help="give up on alice after this long (the report says so)")
    ns = ap.parse_args()

    with tempfile.TemporaryDirectory() as state, _proxy(ns.rate, state) as address:
        channel = grpc.insecure_channel(address)
        stub = proxy_pb2_grpc.TargetProxyServiceStub(channel)
        md = {t: (("x-api-key", k),) for t, k in KEYS.items()}
        sessions = {t: stub.CreateSession(proxy_pb2.CreateSessionRequest(target="t"),
                                          metadata=md[t]).session.session_id for t in KEYS}
        # warm up: the model loaded and the connection open before anything is timed
        stub.Predict(proxy_pb2.PredictRequest(session_id=sessions["bob"], origin="bench",
                                              images=[_image("warm")]), metadata=md["bob"])
        stop = threading.Event()
        sent: dict[str, list[float]] = {"alice": [], "bob": []}     # answer times, per image
        lock = threading.Lock()

        def bob(k: int) -> None:
            c = 0
            while not stop.is_set():
                stub.Predict(proxy_pb2.PredictRequest(
                    session_id=sessions["bob"], origin="bench",
                    images=[_image(f"b{k}-{c}")]), metadata=md["bob"])
                with lock:
                    sent["bob"].append(time.monotonic())
                c += 1

        threads = [threading.Thread(target=bob, args=(k,), daemon=True)
                   for k in range(ns.bob_threads)]
        for t in threads:
            t.start()
        time.sleep(1.0)             # bob has the target to himself first
        t0 = time.monotonic()
        done = 0
        while done < ns.alice_images and time.monotonic() - t0 < ns.limit_s:
            n = min(ns.alice_batch, ns.alice_images - done)
            try:
                stub.Predict(proxy_pb2.PredictRequest(
                    session_id=sessions["alice"], origin="bench",
                    images=[_image(f"a-{done + i}") for i in range(n)]),
                    metadata=md["alice"], timeout=max(0.1, t0 + ns.limit_s - time.monotonic()))
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise
                break           # alice gave up: reported as not finished
            done += n
            with lock:
                sent["alice"] += [time.monotonic()] * n
        alice_s = time.monotonic() - t0
        stop.set()
        for t in threads:
            t.join(timeout=30)
        bob_during = sum(1 for t in sent["bob"] if t0 <= t <= t0 + alice_s)
        fair_s = ns.alice_images / (ns.rate / (1 + MARGIN) / 2)
        print(json.dumps({
            "benchmark": "proxy_fairness_two_tenants",
            "target_rate": ns.rate, "bob_threads": ns.bob_threads,
            "alice_images": ns.alice_images, "alice_batch": ns.alice_batch,
            "alice_images_done": done,
            "alice_finished": done == ns.alice_images,
            "alice_seconds": round(alice_s, 2),
            "fair_share_seconds": round(fair_s, 2),
            "alice_over_fair_share_time": round(alice_s / fair_s, 3),
            "alice_share_while_sending": round(done / max(1, done + bob_during), 3),
            "images_per_s_while_alice_sent": round((done + bob_during) / alice_s, 1),
            "python": platform.python_version(), "grpcio": grpc.__version__,
        }, indent=2))


if __name__ == "__main__":
    main()
