"""What the outsider tests share: a real ``fortis serve`` subprocess on loopback, and small
helpers for a client written from the protos alone (generated stubs, gRPC metadata and status
details; no Fortis SDK, no server code).

The server's log goes to a file (a pipe nobody reads would stall it), quoted when it fails to
start; it is stopped with SIGTERM (its drain), then killed if it does not end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
from fortis.common.v1 import common_pb2
from fortis.evaluation.v1 import evaluation_pb2 as pb
from fortis.target.v1 import target_pb2, target_pb2_grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

FINAL = (pb.EVALUATION_STATE_SUCCEEDED, pb.EVALUATION_STATE_FAILED,
         pb.EVALUATION_STATE_CANCELLED)


@contextlib.contextmanager
def fortis_serve(args: Sequence[str], tmp: Path, *, env: Mapping[str, str] | None = None,
                 start_timeout_s: float = 180.0) -> Iterator[str]:
    """``fortis serve --address 127.0.0.1:0 --state-dir <tmp>/state ARGS``; yields the address
    it printed once it listens."""
    log = tmp / "serve.log"
    cmd = [sys.executable, "-m", "fortis.server.cli", "serve", "--address", "127.0.0.1:0",
           "--state-dir", str(tmp / "state"), "--log-level", "warning", *args]
    with log.open("w") as err:
        p = subprocess.Popen(cmd, cwd=tmp, env={**os.environ, **(env or {})},
                             stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert p.stdout is not None
        deadline = time.monotonic() + start_timeout_s
        line = ""
        while not line.startswith("{"):
            line = p.stdout.readline()
            assert line or p.poll() is None, f"fortis serve exited {p.poll()}: " \
                                             f"{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "fortis serve did not start"
        yield json.loads(line)["address"]
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def refused(call: Any) -> grpc.RpcError:
    """The RpcError ``call()`` raises (it must raise one)."""
    try:
        call()
    except grpc.RpcError as exc:
        return exc
    raise AssertionError("the call was not refused")


def quota_violations(exc: grpc.RpcError) -> list[tuple[str, str]]:
    """(subject, description) of the QuotaFailure of a RESOURCE_EXHAUSTED status, read from
    the google.rpc status details in the trailers."""
    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (exc.code(), exc.details())
    status = rpc_status.from_call(exc)
    assert status is not None, exc.details()
    out = []
    for d in status.details:
        if d.Is(error_details_pb2.QuotaFailure.DESCRIPTOR):
            qf = error_details_pb2.QuotaFailure()
            d.Unpack(qf)
            out += [(v.subject, v.description) for v in qf.violations]
    return out


def wait_final(ev: Any, evaluation_id: str, md: Sequence[tuple[str, str]] = (),
               timeout_s: float = 300.0) -> Any:
    """Poll GetEvaluation until the evaluation is final; returns it."""
    deadline = time.monotonic() + timeout_s
    while True:
        e = ev.GetEvaluation(pb.GetEvaluationRequest(evaluation_id=evaluation_id),
                             metadata=md, timeout=30).evaluation
        if e.state in FINAL:
            return e
        assert time.monotonic() < deadline, f"{evaluation_id} still {e.state}"
        time.sleep(0.3)


def ten_class_answer(request: Any) -> Any:
    """The same 10-class full-score answer for every image of a target's PredictRequest."""
    classes = [common_pb2.ClassScore(label=i, name=f"c{i}", score=(i + 1) / 55.0)
               for i in range(10)]
    return target_pb2.PredictResponse(predictions=[common_pb2.Prediction(
        image_id=img.image_id, classification=common_pb2.Classification(classes=classes))
        for img in request.images])


@contextlib.contextmanager
def serving_target(servicer: Any) -> Iterator[str]:
    """``servicer`` as a TargetService on a loopback port: yields its address."""
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    target_pb2_grpc.add_TargetServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)
