"""A target's failures told apart, through a real TargetProxy (one error mapping). The
proxy used to give INTERNAL to the client for a target answering one prediction too few, and
to retry an oversized target error 4x as if transient.

The target is a real gRPC ``fortis.target.v1.TargetService`` started by the test on loopback
(the interface of adapters/torch_target.py), misbehaving as each test asks; the proxy reaches
it as ``grpc://`` like any remote target, inside a full stack (tests/conftest.py style).

- transient (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED from the target): retried with
  backoff, every attempt a ledger row; UNAVAILABLE to the caller when the retries run out, the
  answer when a retry succeeds;
- permanent (INVALID_ARGUMENT from the target, one prediction too few, the target's INTERNAL,
  an error message too large for gRPC's trailers): sent once, never retried; INVALID_ARGUMENT
  keeps the target's field, the rest is FAILED_PRECONDITION naming the target, message <= 1 KB;
  never INTERNAL.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from fortis.common.v1 import common_pb2
from fortis.infra.serving.status import status_for
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common.errors import FieldViolation, InvalidArgument
from fortis.target.v1 import target_pb2, target_pb2_grpc
from google.rpc import code_pb2, error_details_pb2
from grpc_status import rpc_status

from tests.conftest import API_KEY, MD

N_LABELS = 10
MAX_ATTEMPTS = 4          # the proxy's RetryPolicy default


class MisbehavingTarget(target_pb2_grpc.TargetServiceServicer):
    """A classifier target whose Predict does what ``mode`` says; counts what it receives."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.fail_first = 0           # "flaky": this many calls fail before answers come
        self.calls = 0
        self.images = 0
        self._lock = threading.Lock()

    def GetTargetInfo(self, request: Any, context: Any) -> target_pb2.GetTargetInfoResponse:
        return target_pb2.GetTargetInfoResponse(info=target_pb2.TargetInfo(
            name="misbehaving", task_type=common_pb2.TASK_TYPE_CLASSIFICATION,
            labels=[f"c{i}" for i in range(N_LABELS)],
            output_kind=common_pb2.OUTPUT_KIND_FULL_SCORES,
            input=target_pb2.InputSpec(height=28, width=28, channels=1, max_batch_size=64)))

    def _answer(self, images: Any) -> target_pb2.PredictResponse:
        classes = [common_pb2.ClassScore(label=i, name=f"c{i}", score=1.0 / N_LABELS)
                   for i in range(N_LABELS)]
        return target_pb2.PredictResponse(predictions=[common_pb2.Prediction(
            image_id=img.image_id, classification=common_pb2.Classification(classes=classes))
            for img in images])

    def Predict(self, request: Any, context: grpc.ServicerContext) -> target_pb2.PredictResponse:
        with self._lock:
            self.calls += 1
            self.images += len(request.images)
            call = self.calls
        mode = self.mode
        if mode == "flaky":
            if call <= self.fail_first:
                context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
            return self._answer(request.images)
        if mode in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "INTERNAL"):
            context.abort(getattr(grpc.StatusCode, mode), f"target says {mode.lower()}")
        if mode == "invalid":
            exc = InvalidArgument("images[0].encoded", "not an image this model takes",
                                  [FieldViolation("images[0].tensor", "wrong size")])
            context.abort_with_status(rpc_status.to_status(status_for(exc)))
        if mode == "huge_error":
            context.abort(grpc.StatusCode.INTERNAL, "E" * 1_000_000)
        if mode == "one_short":
            return self._answer(request.images[:-1])
        return self._answer(request.images)


@pytest.fixture()
def target() -> Iterator[tuple[MisbehavingTarget, str]]:
    from concurrent import futures
    servicer = MisbehavingTarget()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    target_pb2_grpc.add_TargetServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


@pytest.fixture()
def proxy(tmp_path: Path, target: tuple[MisbehavingTarget, str]
          ) -> Iterator[proxy_pb2_grpc.TargetProxyServiceStub]:
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack
    _, address = target
    stack = start_stack(StackSettings(
        state_dir=tmp_path / "state", api_keys={API_KEY: "tenant-a"}, only="proxy",
        targets=[TargetConfig.parse(f"remote=grpc://{address}")]))
    ch = grpc.insecure_channel(stack.address)
    stub = proxy_pb2_grpc.TargetProxyServiceStub(ch)
    stub.CreateSession(proxy_pb2.CreateSessionRequest(target="remote", session_id="s"),
                       metadata=MD)
    yield stub
    ch.close()
    stack.stop(0)


def _images(n: int) -> list[common_pb2.Image]:
    return [common_pb2.Image(image_id=f"i{k}", tensor=common_pb2.Tensor(
        dtype=common_pb2.D_TYPE_UINT8, shape=[28, 28, 1], data=bytes([k % 256]) * 784))
        for k in range(n)]


def _predict(stub: proxy_pb2_grpc.TargetProxyServiceStub, n: int = 3) -> grpc.RpcError | None:
    try:
        stub.Predict(proxy_pb2.PredictRequest(session_id="s", origin="t", images=_images(n)),
                     metadata=MD, timeout=60)
    except grpc.RpcError as exc:
        return exc
    return None


def _ledger(stub: proxy_pb2_grpc.TargetProxyServiceStub) -> list[proxy_pb2.LedgerEntry]:
    return list(stub.ListLedgerEntries(proxy_pb2.ListLedgerEntriesRequest(
        session_id="s", page_size=1000), metadata=MD).entries)


@pytest.mark.parametrize("mode", ["UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"])
def test_transient_target_errors_are_retried_then_unavailable(target, proxy, mode):
    servicer, _ = target
    servicer.mode = mode
    err = _predict(proxy, 3)
    assert err is not None and err.code() == grpc.StatusCode.UNAVAILABLE, err
    assert servicer.calls == MAX_ATTEMPTS                    # retried with backoff
    assert servicer.images == 3 * MAX_ATTEMPTS
    rows = _ledger(proxy)
    assert len(rows) == servicer.images                      # every attempt the target saw
    assert {r.status for r in rows} == {code_pb2.UNAVAILABLE}
    assert sorted({r.attempts for r in rows}) == list(range(1, MAX_ATTEMPTS + 1))
    assert len(err.details().encode()) <= 1024


def test_a_transient_error_then_an_answer_succeeds(target, proxy):
    servicer, _ = target
    servicer.mode, servicer.fail_first = "flaky", 2
    resp = proxy.Predict(proxy_pb2.PredictRequest(session_id="s", origin="t", images=_images(2)),
                         metadata=MD, timeout=60)
    assert [p.image_id for p in resp.predictions] == ["i0", "i1"]
    assert servicer.calls == 3
    statuses = sorted((r.attempts, r.status) for r in _ledger(proxy))
    assert statuses == [(1, code_pb2.UNAVAILABLE)] * 2 + [(2, code_pb2.UNAVAILABLE)] * 2 + \
        [(3, code_pb2.OK)] * 2


def test_the_targets_invalid_argument_is_not_retried_and_keeps_its_field(target, proxy):
    servicer, _ = target
    servicer.mode = "invalid"
    err = _predict(proxy, 2)
    assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert servicer.calls == 1
    status = rpc_status.from_call(err)
    assert status is not None
    fields = []
    for d in status.details:
        br = error_details_pb2.BadRequest()
        if d.Unpack(br):
            fields += [v.field for v in br.field_violations]
    assert fields == ["images[0].encoded", "images[0].tensor"]
    assert {r.status for r in _ledger(proxy)} == {code_pb2.INVALID_ARGUMENT}


@pytest.mark.parametrize(("mode", "needle"), [
    ("one_short", "answered 2 predictions for 3 images"),
    # the target's own words stay in the operator's log (test_target_errors_scrubbed.py)
    ("INTERNAL", "correlation id"),
    ("huge_error", "correlation id"),
])
def test_permanent_target_errors_are_failed_precondition_naming_the_target(
        target, proxy, mode, needle):
    servicer, _ = target
    servicer.mode = mode
    err = _predict(proxy, 3)
    assert err is not None and err.code() == grpc.StatusCode.FAILED_PRECONDITION, err
    assert "target 'remote'" in err.details() and needle in err.details()
    assert "target says" not in err.details()
    assert len(err.details().encode()) <= 1024 and "EEEEEEEEEE" * 20 not in err.details()
    assert servicer.calls == 1                               # not retried
    rows = _ledger(proxy)
    assert len(rows) == 3 and {r.status for r in rows} == {code_pb2.FAILED_PRECONDITION}
    assert all(len(r.error) <= 500 for r in rows)
    # the proxy keeps serving: the same target answers once it behaves
    servicer.mode = "ok"
    assert _predict(proxy, 1) is None
