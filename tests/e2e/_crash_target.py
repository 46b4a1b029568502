"""A target of the SIGKILL crash test's own (``test_crash_resume.py``).

A real ``fortis.target.v1.TargetService`` gRPC server on loopback, in the test process, that
wraps the Fashion-MNIST CNN and records every image it receives: the SHA-256 of the bytes it
got (the same bytes the proxy hashes into a ledger row's ``input_sha256``), the image id and
the arrival time, in a thread-safe list. It can SIGKILL a process from inside ``Predict``,
while the images of that call are with the target and their ledger rows are in flight.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from fortis.adapters.torch_target import ClassifierTarget, TargetServicer
from fortis.common.v1 import common_pb2
from fortis.target.v1 import target_pb2, target_pb2_grpc


@dataclass(frozen=True)
class Arrival:
    image_id: str
    sha256: str
    at: float          # time.time() when the call reached the target
    call: int          # arrival order of the call that carried it


class RecordingTarget:
    """``info()``/``predict()`` of a ClassifierTarget, recording each image that arrives."""

    def __init__(self, classifier: Any) -> None:
        self.inner = ClassifierTarget(classifier)
        self._lock = threading.Lock()
        self._arrivals: list[Arrival] = []
        self._calls = 0
        #: Called with the arrival count after each call is recorded, before it is answered.
        self.on_call: Callable[[int], None] | None = None

    def info(self) -> target_pb2.TargetInfo:
        return self.inner.info()

    def predict(self, images: Sequence[common_pb2.Image]) -> list[common_pb2.Prediction]:
        now = time.time()
        with self._lock:
            self._calls += 1
            for img in images:
                data = img.tensor.data if img.WhichOneof("content") == "tensor" else img.encoded
                self._arrivals.append(Arrival(img.image_id, hashlib.sha256(data).hexdigest(),
                                              now, self._calls))
            count = len(self._arrivals)
        hook = self.on_call
        if hook is not None:
            hook(count)
        return self.inner.predict(images)

    def arrivals(self) -> list[Arrival]:
        with self._lock:
            return list(self._arrivals)

    def count(self) -> int:
        with self._lock:
            return len(self._arrivals)


class KillSwitch:
    """SIGKILLs ``pid`` from inside the target's ``Predict`` once the arrival count reaches
    the armed threshold: the call's images reached the target, its answer never leaves."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._at = 0
        self.fired = threading.Event()
        self.count_at_kill = 0

    def arm(self, pid: int, at_count: int) -> None:
        with self._lock:
            self._pid, self._at = pid, at_count
            self.fired.clear()

    def disarm(self) -> None:
        with self._lock:
            self._pid = 0

    def __call__(self, count: int) -> None:
        with self._lock:
            if not self._pid or count < self._at:
                return
            pid, self._pid = self._pid, 0
            self.count_at_kill = count
        os.kill(pid, signal.SIGKILL)
        self.fired.set()
        time.sleep(0.2)         # keep the call open while the process dies


def start_target(classifier: Any) -> tuple[grpc.Server, str, RecordingTarget]:
    """Serve a RecordingTarget on 127.0.0.1 (a free port); returns (server, address, target)."""
    target = RecordingTarget(classifier)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    target_pb2_grpc.add_TargetServiceServicer_to_server(TargetServicer(target), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}", target
