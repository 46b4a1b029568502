"""The health service never freezes a server (infra/serving/health.py).

grpcio-health-checking's stock servicer deadlocks the server's event thread when ``Watch``
streams close while statuses change (it sends under its lock; the close callback, run on the
event thread, waits for that lock): every call then hangs, ``Check`` included, and a stop
never ends. Reproduced here with real gRPC on loopback, four clients opening and cancelling
``Watch`` streams while the status flips; each case runs in its own process (a frozen server
cannot be stopped). The stock servicer is run too, so the test shows the replacement is what
removes the freeze.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STORM = """
import os, sys, threading, time, grpc
from concurrent import futures
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
if sys.argv[1] == "fortis":
    from fortis.infra.serving.health import HealthServicer
else:
    HealthServicer = health.HealthServicer
server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
servicer = HealthServicer()
health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
stop = threading.Event()
def flip():
    k = 0
    while not stop.is_set():
        servicer.set("", health_pb2.HealthCheckResponse.SERVING if k % 2
                     else health_pb2.HealthCheckResponse.NOT_SERVING)
        k += 1
def watch():
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    while not stop.is_set():
        stream = stub.Watch(health_pb2.HealthCheckRequest(service=""))
        try:
            next(stream)
        except grpc.RpcError:
            pass
        stream.cancel()
for target in [flip] + [watch] * 4:
    threading.Thread(target=target, daemon=True).start()
time.sleep(2)
stop.set()
stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
try:
    stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
    check = "answered"
except grpc.RpcError as exc:
    check = exc.code().name
done = threading.Event()
threading.Thread(target=lambda: (servicer.enter_graceful_shutdown(), done.set()),
                 daemon=True).start()
print(check, "shutdown" if done.wait(3) else "frozen", flush=True)
os._exit(0)
"""


def _storm(which: str) -> str:
    out = subprocess.run([sys.executable, "-c", STORM, which], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    return out.stdout.strip()


def test_the_stock_servicer_freezes_under_watch_churn():
    assert _storm("stock") == "DEADLINE_EXCEEDED frozen"


def test_fortis_servicer_keeps_answering():
    assert _storm("fortis") == "answered shutdown"
