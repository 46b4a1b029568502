"""Memory as a budget (infra/serving/memory.py), over real servers on loopback with real
PNGs made here, called through the generated stubs alone (no fortis.client SDK).

- sixteen 6000x6000 grey PNGs (a ~0.5 MiB request) to ApplyPerturbation and to a proxy
  Predict of the built-in ``fmnist-cnn`` target, on a ``fortis serve`` subprocess with the
  default limits: RESOURCE_EXHAUSTED with a QuotaFailure on ``images``, refused before
  anything is decoded (the server's RSS, read from /proc, grows < 100 MiB; before, it grew by
  3 GiB and the work was refused only once done);
- with small limits on an in-process stack: a request just under the per-request limit
  works, one more image is refused naming ``images``, one image alone past it names
  ``images[k]``; an answer past the message limit (RunAttack's adversarials, a segmenter's
  per-pixel answers through the proxy) is refused before the work, naming the field; Compute arrays and report examples are sized the same;
  a bidirectional stream answers a refusal in band and goes on;
- a tenant's second large call is refused while its first one holds the budget (blocked at a
  gated target), another tenant's call of the same size goes through; a request of 1 MiB or
  more that does not fit the tenant's budget is refused before it is parsed (garbage bytes:
  RESOURCE_EXHAUSTED for that tenant, INVALID_ARGUMENT for the other, UNAUTHENTICATED without
  a key);
- refused, failed and cancelled calls give their bytes back: after many of them a call of
  the whole budget succeeds and nothing is held.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import cv2
import grpc
import numpy as np
import pytest
from fortis.common.v1 import common_pb2
from fortis.perturbation.v1 import perturbation_pb2 as pt
from fortis.perturbation.v1 import perturbation_pb2_grpc
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.report.v1 import report_pb2, report_pb2_grpc
from fortis.scoring.v1 import scoring_pb2, scoring_pb2_grpc
from fortis.target.v1 import target_pb2, target_pb2_grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from tests.conftest import API_KEY, MD, OTHER_KEY, OTHER_MD

MiB = 1024 * 1024


def _png(h: int, w: int, channels: int = 1, value: int = 7) -> bytes:
    """A real PNG of one flat colour (compresses to a few KB whatever its size)."""
    arr = np.full((h, w) if channels == 1 else (h, w, channels), value, dtype=np.uint8)
    ok, buf = cv2.imencode(".png", arr, [cv2.IMWRITE_PNG_COMPRESSION, 9])
    assert ok
    return buf.tobytes()


def _images(data: bytes, n: int) -> list[common_pb2.Image]:
    return [common_pb2.Image(image_id=f"img-{i}", encoded=data) for i in range(n)]


def _quota_failure(exc: grpc.RpcError) -> list[tuple[str, str]]:
    """(subject, description) of the QuotaFailure a refused call carries."""
    status = rpc_status.from_call(exc)
    assert status is not None, exc
    out = []
    for d in status.details:
        if d.Is(error_details_pb2.QuotaFailure.DESCRIPTOR):
            qf = error_details_pb2.QuotaFailure()
            d.Unpack(qf)
            out += [(v.subject, v.description) for v in qf.violations]
    return out


def _refused(call: Any, subject: str) -> str:
    with pytest.raises(grpc.RpcError) as ei:
        call()
    exc = ei.value
    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (exc.code(), exc.details())
    violations = _quota_failure(exc)
    assert [s for s, _ in violations] == [subject], violations
    return violations[0][1]


# -- fortis serve with the default limits: the reported request -----------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """``fortis serve`` (all services, the built-in fmnist-cnn target, two tenants) in a
    subprocess with the default memory limits: (address, pid)."""
    tmp = tmp_path_factory.mktemp("served")
    env = {**os.environ, "FORTIS_API_KEYS": f"{API_KEY}=tenant-a,{OTHER_KEY}=tenant-b"}
    p = subprocess.Popen(
        [sys.executable, "-m", "fortis.server.cli", "serve", "--address", f"127.0.0.1:{_free_port()}",
         "--state-dir", str(tmp / "s"), "--log-level", "warning", "--no-default-targets",
         "--target", "fmnist-cnn=builtin:fmnist-cnn", "--evaluation-workers", "1"],
        cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stderr is not None
        line = p.stdout.readline()
        assert line, p.stderr.read()[-3000:]
        yield json.loads(line)["address"], p.pid
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


def test_sixteen_large_pngs_are_refused_before_decoding(served: tuple[str, int]) -> None:
    address, pid = served
    big = _png(6000, 6000)
    assert len(big) < 100_000                   # a small message declaring 576 MB of pixels
    with grpc.insecure_channel(address) as ch:
        pert = perturbation_pb2_grpc.PerturbationServiceStub(ch)
        proxy = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        proxy.CreateSession(proxy_pb2.CreateSessionRequest(target="fmnist-cnn", session_id="s"),
                            metadata=MD, timeout=60)
        # warm the paths once (lazy imports, first-call allocations) before measuring
        small = _images(_png(28, 28), 2)
        pert.ApplyPerturbation(pt.ApplyPerturbationRequest(
            perturbation_id="gaussian_noise", severity=1, seed=1, images=small),
            metadata=MD, timeout=120)
        proxy.Predict(proxy_pb2.PredictRequest(session_id="s", images=small), metadata=MD,
                      timeout=60)
        before = _rss_mib(pid)
        t0 = time.perf_counter()
        why = _refused(lambda: pert.ApplyPerturbation(pt.ApplyPerturbationRequest(
            perturbation_id="gaussian_noise", severity=1, seed=1, images=_images(big, 16)),
            metadata=MD, timeout=60), "images")
        assert "576,000,000 bytes" in why and "--max-request-decoded-bytes" in why
        _refused(lambda: proxy.Predict(proxy_pb2.PredictRequest(
            session_id="s", images=_images(big, 16)), metadata=MD, timeout=60), "images")
        took = time.perf_counter() - t0
        grown = _rss_mib(pid) - before
        print(f"RSS {before:.0f} MiB -> {before + grown:.0f} MiB (+{grown:.1f}) in {took:.2f} s")
        assert grown < 100, f"the server grew by {grown:.0f} MiB"
        # nothing was sent for the refused Predict; the session and the service go on
        stats = proxy.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id="s"),
                                      metadata=MD, timeout=30)
        assert stats.queries_attempted == 2
        out = pert.ApplyPerturbation(pt.ApplyPerturbationRequest(
            perturbation_id="gaussian_noise", severity=1, seed=1, images=small),
            metadata=OTHER_MD, timeout=120)
        assert len(out.images) == 2


# -- an in-process stack with small limits ---------------------------------------------------

#: 500x500 grey: 250,000 bytes decoded each.
SIDE = 500
EACH = SIDE * SIDE
REQUEST_LIMIT = 4 * EACH                    # four such images per request
TENANT_LIMIT = 5 * EACH                     # three in flight with two: refused
MESSAGE_LIMIT = 2 * MiB


class GatedTarget(target_pb2_grpc.TargetServiceServicer):
    """A classifier whose Predict waits until ``gate`` is open (the call holds its budget)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Semaphore(0)

    def GetTargetInfo(self, request: Any, context: Any) -> target_pb2.GetTargetInfoResponse:
        return target_pb2.GetTargetInfoResponse(info=target_pb2.TargetInfo(
            name="gated", task_type=common_pb2.TASK_TYPE_CLASSIFICATION,
            labels=[f"c{i}" for i in range(10)], output_kind=common_pb2.OUTPUT_KIND_FULL_SCORES,
            input=target_pb2.InputSpec(height=SIDE, width=SIDE, channels=1, max_batch_size=64)))

    def Predict(self, request: Any, context: Any) -> target_pb2.PredictResponse:
        self.entered.release()
        self.gate.wait(60)
        return target_pb2.PredictResponse(predictions=[common_pb2.Prediction(
            image_id=img.image_id, classification=common_pb2.Classification(
                classes=[common_pb2.ClassScore(label=1, name="c1", score=0.9)]))
            for img in request.images])


@pytest.fixture(scope="module")
def gated() -> Iterator[tuple[GatedTarget, str]]:
    servicer = GatedTarget()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    target_pb2_grpc.add_TargetServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    servicer.gate.set()
    server.stop(0)


class SegmentationTarget(target_pb2_grpc.TargetServiceServicer):
    """A segmenter (its answers are per pixel) that counts the calls it receives."""

    def __init__(self) -> None:
        self.calls = 0

    def GetTargetInfo(self, request: Any, context: Any) -> target_pb2.GetTargetInfoResponse:
        return target_pb2.GetTargetInfoResponse(info=target_pb2.TargetInfo(
            name="seg", task_type=common_pb2.TASK_TYPE_SEGMENTATION, labels=["bg", "fg"],
            output_kind=common_pb2.OUTPUT_KIND_FULL_SCORES,
            input=target_pb2.InputSpec(height=SIDE, width=SIDE, channels=1, max_batch_size=64)))

    def Predict(self, request: Any, context: Any) -> target_pb2.PredictResponse:
        self.calls += 1
        context.abort(grpc.StatusCode.UNAVAILABLE, "not expected in this test")


@pytest.fixture(scope="module")
def seg() -> Iterator[tuple[SegmentationTarget, str]]:
    servicer = SegmentationTarget()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    target_pb2_grpc.add_TargetServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, gated: tuple[GatedTarget, str],
          seg: tuple[SegmentationTarget, str]) -> Iterator[Any]:
    from fortis.infra.serving.memory import MemoryLimits
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack
    s = start_stack(StackSettings(
        state_dir=tmp_path_factory.mktemp("small") / "state",
        api_keys={API_KEY: "tenant-a", OTHER_KEY: "tenant-b"},
        targets=[TargetConfig.parse(f"gated=grpc://{gated[1]}"),
                 TargetConfig.parse(f"seg=grpc://{seg[1]}")],
        max_message_bytes=MESSAGE_LIMIT, evaluation_workers=1,
        memory=MemoryLimits(max_request_bytes=REQUEST_LIMIT, max_tenant_bytes=TENANT_LIMIT)))
    yield s
    gated[0].gate.set()
    s.stop(0)


@pytest.fixture(scope="module")
def ch(small: Any) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(small.address) as c:
        yield c


def _held(stack: Any, tenant: str) -> int:
    """Bytes the stack's server holds for ``tenant``."""
    return int(stack.server.memory.held(tenant))


def _apply(n: int, side: int = SIDE, **extra: Any) -> pt.ApplyPerturbationRequest:
    fields = {"perturbation_id": "gaussian_noise", "severity": 1, "seed": 1, **extra}
    return pt.ApplyPerturbationRequest(images=_images(_png(side, side), n), **fields)


def test_just_under_the_limits_works_and_past_them_names_the_field(ch: grpc.Channel) -> None:
    pert = perturbation_pb2_grpc.PerturbationServiceStub(ch)
    out = pert.ApplyPerturbation(_apply(4), metadata=MD, timeout=120)     # exactly the limit
    assert len(out.images) == 4
    _refused(lambda: pert.ApplyPerturbation(_apply(5), metadata=MD, timeout=60), "images")
    req = _apply(2)
    req.images[1].encoded = _png(SIDE * 2 + 10, SIDE * 2)    # one image alone past the limit
    why = _refused(lambda: pert.ApplyPerturbation(req, metadata=MD, timeout=60), "images[1]")
    assert "per request" in why
    # a raw tensor is sized from its shape, RGB counts three channels
    rgb = common_pb2.Image(image_id="t", tensor=common_pb2.Tensor(
        dtype=common_pb2.D_TYPE_UINT8, shape=[700, 700, 3], data=bytes(700 * 700 * 3)))
    _refused(lambda: pert.ApplyPerturbation(pt.ApplyPerturbationRequest(
        perturbation_id="gaussian_noise", severity=1, images=[rgb]), metadata=MD, timeout=60),
        "images[0]")


def test_an_answer_past_the_message_limit_is_refused_before_the_work(ch: grpc.Channel) -> None:
    """RunAttack answers each image as uint8 and float32 (5 bytes a sample): 700x700 grey is
    2.45 MB, past the 2 MiB message limit, though its request is under every limit."""
    pert = perturbation_pb2_grpc.PerturbationServiceStub(ch)
    req = pt.RunAttackRequest(attack_id="fgsm", surrogate="fmnist-surrogate", images=[
        pt.LabeledImage(image=common_pb2.Image(image_id="a", encoded=_png(700, 700)),
                        labels=[1])])
    t0 = time.perf_counter()
    why = _refused(lambda: list(pert.RunAttack(req, metadata=MD, timeout=60)),
                   "images[0].image")
    assert "largest message" in why and time.perf_counter() - t0 < 10


def test_a_segmenters_answer_past_the_message_limit_is_refused_before_it_is_asked(
        ch: grpc.Channel, seg: tuple[SegmentationTarget, str]) -> None:
    """A segmentation answer is about 8 bytes a pixel (class map and probabilities): one
    600x600 image would answer 2.9 MB, past the 2 MiB message limit though its request
    (360 KB decoded) is under every limit. Refused with nothing sent or charged."""
    proxy = proxy_pb2_grpc.TargetProxyServiceStub(ch)
    proxy.CreateSession(proxy_pb2.CreateSessionRequest(target="seg", session_id="seg"),
                        metadata=MD, timeout=30)
    why = _refused(lambda: proxy.Predict(proxy_pb2.PredictRequest(
        session_id="seg", images=_images(_png(600, 600), 1)), metadata=MD, timeout=60),
        "images")
    assert "largest message" in why
    stream = list(proxy.PredictStream(iter([proxy_pb2.PredictStreamRequest(
        request_id="r", session_id="seg", images=_images(_png(600, 600), 1))]),
        metadata=MD, timeout=60))
    assert stream[0].error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    stats = proxy.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id="seg"),
                                  metadata=MD, timeout=30)
    assert seg[0].calls == 0 and stats.queries_attempted == 0


def test_compute_arrays_and_report_examples_are_sized_too(ch: grpc.Channel) -> None:
    scoring = scoring_pb2_grpc.ScoringServiceStub(ch)
    n = REQUEST_LIMIT // 8 + 1                  # float64 elements just past the limit
    req = scoring_pb2.ComputeRequest(metric="attack_success_rate")
    req.arrays["success"].CopyFrom(common_pb2.Tensor(
        dtype=common_pb2.D_TYPE_FLOAT64, shape=[n], data=bytes(8 * n)))
    _refused(lambda: scoring.Compute(req, metadata=MD, timeout=60), "arrays.success")
    report = report_pb2_grpc.ReportServiceStub(ch)
    parts = report_pb2.ReportParts()
    example = _png(1000, 1000, 3)               # 3 MB decoded, past the 1 MB limit alone
    for i in range(2):
        parts.examples.add(setting=f"s{i}", image_id=f"i{i}", original_png=example,
                           perturbed_png=example)
    _refused(lambda: report.RenderReport(report_pb2.RenderReportRequest(parts=parts),
                                         metadata=MD, timeout=60),
             "parts.examples[0].original_png")


def test_a_stream_answers_a_refusal_in_band_and_goes_on(ch: grpc.Channel) -> None:
    pert = perturbation_pb2_grpc.PerturbationServiceStub(ch)
    msgs = [pt.ApplyPerturbationStreamRequest(
        request_id=f"r{n}", perturbation_id="gaussian_noise", severity=1,
        images=_images(_png(SIDE, SIDE), n)) for n in (5, 1)]
    out = list(pert.ApplyPerturbationStream(iter(msgs), metadata=MD, timeout=120))
    assert [r.request_id for r in out] == ["r5", "r1"]
    assert out[0].error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert not out[0].images and len(out[1].images) == 1 and not out[1].HasField("error")


def test_a_tenants_second_large_call_waits_for_none_and_the_other_tenant_goes_on(
        ch: grpc.Channel, small: Any, gated: tuple[GatedTarget, str]) -> None:
    target, _ = gated
    target.gate.clear()
    proxy = proxy_pb2_grpc.TargetProxyServiceStub(ch)
    pert = perturbation_pb2_grpc.PerturbationServiceStub(ch)
    for md in (MD, OTHER_MD):
        proxy.CreateSession(proxy_pb2.CreateSessionRequest(target="gated", session_id="conc"),
                            metadata=md, timeout=30)
    four = _images(_png(SIDE, SIDE), 4)         # the whole per-request limit
    first = proxy.Predict.future(proxy_pb2.PredictRequest(session_id="conc", images=four),
                                 metadata=MD, timeout=60)
    try:
        assert target.entered.acquire(timeout=30)   # the first call holds its bytes
        assert _held(small, "tenant-a") == 4 * EACH
        why = _refused(lambda: pert.ApplyPerturbation(_apply(2), metadata=MD, timeout=60),
                       "images")
        assert "in flight per tenant" in why and "--max-tenant-decoded-bytes" in why
        # the same tenant's small call still fits; the other tenant is not affected
        assert len(pert.ApplyPerturbation(_apply(1), metadata=MD, timeout=120).images) == 1
        assert len(pert.ApplyPerturbation(_apply(4), metadata=OTHER_MD,
                                          timeout=120).images) == 4
        assert not first.done()
        # Bytes the tenant could not hold are refused before they are parsed: a 1.2 MiB
        # request that is not even a message is RESOURCE_EXHAUSTED for the tenant whose
        # call holds its budget, INVALID_ARGUMENT (parsed, and failed) for the other one,
        # and an unauthenticated one is refused for that alone.
        garbage = b"\xff" * (1200 * 1024)
        raw = ch.unary_unary("/fortis.perturbation.v1.PerturbationService/ApplyPerturbation")
        why = _refused(lambda: raw(garbage, metadata=MD, timeout=60), "request")
        assert "carries 1,228,800 bytes" in why and "in flight per tenant" in why
        with pytest.raises(grpc.RpcError) as ei:
            raw(garbage, metadata=OTHER_MD, timeout=60)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value.details()
        with pytest.raises(grpc.RpcError) as ei:
            raw(garbage, timeout=60)
        assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED, ei.value.details()
    finally:
        target.gate.set()
    assert len(first.result(timeout=60).predictions) == 4
    assert _held(small, "tenant-a") == 0


def test_refused_failed_and_cancelled_calls_give_their_bytes_back(
        ch: grpc.Channel, small: Any, gated: tuple[GatedTarget, str]) -> None:
    target, _ = gated
    proxy = proxy_pb2_grpc.TargetProxyServiceStub(ch)
    pert = perturbation_pb2_grpc.PerturbationServiceStub(ch)
    proxy.CreateSession(proxy_pb2.CreateSessionRequest(target="gated", session_id="leak"),
                        metadata=MD, timeout=30)
    four = _images(_png(SIDE, SIDE), 4)
    for _ in range(20):                         # refused: past the per-request limit
        _refused(lambda: pert.ApplyPerturbation(_apply(5), metadata=MD, timeout=60), "images")
    for _ in range(20):                         # admitted, then failed in the servicer
        with pytest.raises(grpc.RpcError) as ei:
            pert.ApplyPerturbation(_apply(4, perturbation_id="no-such"), metadata=MD,
                                   timeout=60)
        assert ei.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)
    target.gate.clear()
    try:
        for _ in range(8):                      # admitted, then cancelled while at the target
            f = proxy.Predict.future(proxy_pb2.PredictRequest(session_id="leak", images=four),
                                     metadata=MD, timeout=60)
            assert target.entered.acquire(timeout=30)
            f.cancel()
            deadline = time.monotonic() + 10
            while _held(small, "tenant-a") and time.monotonic() < deadline:
                time.sleep(0.02)
            assert _held(small, "tenant-a") == 0
        # a stream cancelled mid-message gives its message's bytes back too
        stream = pert.ApplyPerturbationStream(iter([pt.ApplyPerturbationStreamRequest(
            request_id="x", perturbation_id="gaussian_noise", severity=1, images=four)]),
            metadata=MD, timeout=60)
        stream.cancel()
    finally:
        target.gate.set()
    deadline = time.monotonic() + 10
    while _held(small, "tenant-a") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _held(small, "tenant-a") == 0
    # the whole budget is there: two calls of the per-request limit at once is over it, one is
    # not, and each succeeds
    out = proxy.Predict(proxy_pb2.PredictRequest(session_id="leak", images=four), metadata=MD,
                        timeout=60)
    assert len(out.predictions) == 4
    assert len(pert.ApplyPerturbation(_apply(4), metadata=MD, timeout=120).images) == 4
