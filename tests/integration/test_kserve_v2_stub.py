"""Error handling of the Open Inference Protocol adapter through the Fortis proxy, against a
small OIP server of this test's own (stdlib ``http.server`` on 127.0.0.1): 429 + Retry-After
then 200, 500 always, malformed JSON, wrong output shape / datatype, missing output, a timeout,
a closed port -- each ends as the right ledger status and gRPC code, and the proxy keeps
serving.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import numpy as np
import pytest
from fortis.common.v1 import common_pb2
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common.codec import image_msg
from google.rpc import code_pb2

from tests.conftest import MD
from tests.integration._kserve_support import (
    free_port,
    images,
    ledger,
    session,
    start_stack_with,
)

# =============================================================================================
# A small OIP server of the test's own, for the error paths
# =============================================================================================
STUB_LABELS = ["red", "green", "blue", "none"]


class _StubHandler(BaseHTTPRequestHandler):
    """REST OIP for models named after their behaviour (see ``_answer``)."""

    server: _StubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {"Content-Type": "application/json"}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        parts = self.path.strip("/").split("/")        # v2 models NAME [ready]
        if parts[-1] == "ready":
            self._send(200, b"")
            return
        self._send(200, json.dumps({
            "name": parts[2], "versions": ["7"], "platform": "stub",
            "inputs": [{"name": "pixels", "datatype": "UINT8", "shape": [-1, 8, 8, 3]}],
            "outputs": [{"name": "scores", "datatype": "FP32", "shape": [-1, 4],
                         "parameters": {"labels": "\n".join(STUB_LABELS)}}]}).encode())

    def do_POST(self) -> None:
        model = self.path.strip("/").split("/")[2]
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.server.lock:
            self.server.calls[model] = self.server.calls.get(model, 0) + 1
            n_calls = self.server.calls[model]
        hl = self.headers.get("Inference-Header-Content-Length")
        doc = json.loads(body[:int(hl)] if hl else body)
        inp = doc["inputs"][0]
        if hl:
            x = np.frombuffer(body[int(hl):], np.uint8).reshape(inp["shape"])
        else:
            x = np.asarray(inp["data"], np.uint8).reshape(inp["shape"])
        self.server.requests.append((model, inp["name"], inp["datatype"], list(inp["shape"])))
        # Deterministic "probabilities" from the pixels: the share of each channel's mean.
        means = x.reshape(len(x), -1, 3).mean(axis=1) + 1.0
        probs = np.concatenate([means, np.ones((len(x), 1))], axis=1)
        probs = (probs / probs.sum(axis=1, keepdims=True)).astype(np.float32)
        self._answer(model, n_calls, probs, binary=bool(hl))

    def _answer(self, model: str, n_calls: int, probs: np.ndarray, *, binary: bool) -> None:
        n = len(probs)
        out: dict[str, Any] = {"name": "scores", "datatype": "FP32", "shape": [n, 4]}
        if model == "busy" and n_calls == 1:
            self._send(429, b'{"error": "slow down"}', {"Retry-After": "1"})
            return
        if model == "broken":
            self._send(500, b'{"error": "model crashed"}')
            return
        if model == "garbled":
            self._send(200, b'{"model_name": "garbled", "outputs": [{"name": ')
            return
        if model == "slow":
            time.sleep(1.0)
        if model == "badshape":
            out["shape"], probs = [n + 1, 4], np.vstack([probs, probs[:1]])
        if model == "nooutput":
            out["name"] = "other"
        if model == "bytesout":
            out.update(datatype="BYTES", shape=[n], data=["a"] * n)
        if model == "logits":
            probs = probs * 40 - 3
        if binary and "data" not in out:
            head = json.dumps({"model_name": model, "outputs": [
                {**out, "parameters": {"binary_data_size": probs.nbytes}}]}).encode()
            self._send(200, head + probs.astype("<f4").tobytes(),
                       {"Content-Type": "application/octet-stream",
                        "Inference-Header-Content-Length": str(len(head))})
            return
        out.setdefault("data", probs.ravel().tolist())
        self._send(200, json.dumps({"model_name": model, "outputs": [out]}).encode())


class _StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _StubHandler)
        self.lock = threading.Lock()
        self.calls: dict[str, int] = {}
        self.requests: list[tuple[str, str, str, list[int]]] = []

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass    # a client that timed out (stub-slow) closed the socket: nothing to report


@pytest.fixture(scope="module")
def stub() -> Iterator[_StubServer]:
    srv = _StubServer()
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def stub_stack(stub: _StubServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    port = stub.server_address[1]
    base = f"kserve+http://127.0.0.1:{port}"
    targets = {f"stub-{m}": f"{base}/{m}" for m in
               ("ok", "busy", "broken", "garbled", "badshape", "bytesout", "logits")}
    targets["stub-nooutput"] = f"{base}/nooutput?output_name=scores"
    targets["stub-logits-ok"] = f"{base}/logits?output=logits"
    targets["stub-binary"] = f"{base}/ok?raw=1&output_name=scores"
    targets["stub-slow"] = f"{base}/slow?timeout=0.25"
    targets["stub-closed"] = f"kserve+http://127.0.0.1:{free_port()}/m?timeout=2"
    targets["grpc-closed"] = f"kserve+grpc://127.0.0.1:{free_port()}/m?timeout=2"
    s = start_stack_with(tmp_path_factory.mktemp("stub-stack"), targets)
    yield s
    s.stop(0)


def test_stub_target_through_the_proxy(stub_stack, stub):
    with grpc.insecure_channel(stub_stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        info = px.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target="stub-ok"), metadata=MD).info
        assert list(info.labels) == STUB_LABELS and info.version == "stub 7"
        assert (info.input.height, info.input.width, info.input.channels) == (8, 8, 3)
        assert info.output_kind == common_pb2.OUTPUT_KIND_FULL_SCORES
        assert info.task_type == common_pb2.TASK_TYPE_CLASSIFICATION
        red = np.zeros((20, 30, 3), np.uint8)
        red[..., 0] = 255
        for target in ("stub-ok", "stub-binary", "stub-logits-ok"):
            sid = session(px, target)
            resp = px.Predict(proxy_pb2.PredictRequest(session_id=sid, origin="clean", images=[
                image_msg("red", red), *images(2)]), metadata=MD)
            assert [p.image_id for p in resp.predictions] == ["red", "img-0", "img-1"]
            top = resp.predictions[0].classification.classes[0]
            assert (top.label, top.name) == (0, "red") and len(resp.predictions[0].classification.classes) == 4
            st = px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id=sid), metadata=MD)
            assert (st.queries_ok, st.queries_failed) == (3, 0)
        # layout, dtype, size and input name all came from the model metadata; raw=1 used the
        # binary data extension both ways
        assert ("ok", "pixels", "UINT8", [3, 8, 8, 3]) in stub.requests
        assert stub.calls["ok"] == 2


@pytest.mark.parametrize("target, code, status, attempts, words", [
    ("stub-broken", grpc.StatusCode.UNAVAILABLE, code_pb2.UNAVAILABLE, 4, "HTTP 500: model crashed"),
    ("stub-slow", grpc.StatusCode.UNAVAILABLE, code_pb2.UNAVAILABLE, 4, "no answer within 0.25 s"),
    ("stub-closed", grpc.StatusCode.UNAVAILABLE, code_pb2.UNAVAILABLE, 4, "ConnectionRefusedError"),
    ("grpc-closed", grpc.StatusCode.UNAVAILABLE, code_pb2.UNAVAILABLE, 4, "ModelMetadata: UNAVAILABLE"),
    # malformed answers: the target's permanent failure, FAILED_PRECONDITION, not retried
    # (one error mapping: INTERNAL is for Fortis's own bugs)
    ("stub-garbled", grpc.StatusCode.FAILED_PRECONDITION, code_pb2.FAILED_PRECONDITION, 1,
     "malformed JSON"),
    ("stub-badshape", grpc.StatusCode.FAILED_PRECONDITION, code_pb2.FAILED_PRECONDITION, 1,
     "output 'scores' has shape [3, 4] for 2 image(s)"),
    ("stub-nooutput", grpc.StatusCode.FAILED_PRECONDITION, code_pb2.FAILED_PRECONDITION, 1,
     "no output 'scores' in the answer (outputs: ['other'])"),
    ("stub-bytesout", grpc.StatusCode.FAILED_PRECONDITION, code_pb2.FAILED_PRECONDITION, 1,
     "datatype BYTES"),
    ("stub-logits", grpc.StatusCode.FAILED_PRECONDITION, code_pb2.FAILED_PRECONDITION, 1,
     "add output=logits"),
])
def test_target_failures_become_ledger_rows(stub_stack, target, code, status, attempts, words):
    with grpc.insecure_channel(stub_stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        sid = session(px, target)
        with pytest.raises(grpc.RpcError) as ei:
            px.Predict(proxy_pb2.PredictRequest(session_id=sid, origin="clean", images=images(2)),
                       metadata=MD)
        assert ei.value.code() == code and words in ei.value.details()
        rows = ledger(px, sid)
        # write-ahead ledger: each attempt the target received is its own rows
        assert [r.image_id for r in rows] == ["img-0", "img-1"] * attempts
        assert {(r.status, r.attempts) for r in rows} == {(status, a) for a in range(1, attempts + 1)}
        assert status == code.value[0]           # the ledger and the caller see one code
        assert words in rows[-1].error
        st = px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id=sid), metadata=MD)
        assert (st.queries_ok, st.queries_failed, st.session.queries_used) == (0, 2 * attempts, 0)
        # ... and the proxy keeps serving
        ok = session(px, "stub-ok")
        assert len(px.Predict(proxy_pb2.PredictRequest(session_id=ok, origin="x", images=images(1)),
                              metadata=MD).predictions) == 1


def test_retry_after_is_honoured(stub_stack):
    with grpc.insecure_channel(stub_stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        sid = session(px, "stub-busy")
        t0 = time.monotonic()
        resp = px.Predict(proxy_pb2.PredictRequest(session_id=sid, origin="clean", images=images(2)),
                          metadata=MD)
        assert len(resp.predictions) == 2 and time.monotonic() - t0 >= 0.9   # waited Retry-After: 1
        rows = ledger(px, sid)
        assert {(r.status, r.attempts) for r in rows} == {(code_pb2.UNAVAILABLE, 1), (code_pb2.OK, 2)}


def test_bad_image_is_refused_per_image(stub_stack):
    with grpc.insecure_channel(stub_stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        sid = session(px, "stub-ok")
        with pytest.raises(grpc.RpcError) as ei:
            px.Predict(proxy_pb2.PredictRequest(session_id=sid, origin="x", images=[
                *images(1), common_pb2.Image(image_id="junk", encoded=b"\x89PNG not really")]),
                metadata=MD)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "images[1].encoded" in ei.value.details()
        assert {r.status for r in ledger(px, sid)} == {code_pb2.INVALID_ARGUMENT}
