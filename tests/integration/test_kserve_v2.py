"""The Open Inference Protocol (KServe v2) target adapter (fortis.adapters.kserve_v2).

Three layers:
- the pure encoding/decoding helpers, without any server;
- error handling through the Fortis proxy against a small OIP server of this test's own
  (stdlib ``http.server`` on 127.0.0.1): 429 + Retry-After then 200, 500 always, malformed
  JSON, wrong output shape / datatype, missing output, a timeout, a closed port -- each ends
  as the right ledger status and gRPC code, and the proxy keeps serving;
- a real Seldon MLServer 1.7.1 (its own venv, .venv-mlserver, made by
  scripts/setup_mlserver.sh on first use) serving torchvision's ImageNet MobileNetV2 through
  a custom runtime (tests/fixtures/mlserver/), reached over REST and gRPC through the proxy:
  top-5 correctness on the offline photos agrees with Fortis's in-process MobileNetV2 and
  the ledger counts every image. Skipped, with the reason, when MLServer cannot be installed
  or started on this machine.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from fortis.adapters import kserve_v2 as k
from fortis.adapters.kserve_v2_protos import grpc_predict_v2_pb2 as pb
from fortis.common.v1 import common_pb2
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common import errors
from fortis.services.common.codec import encode_png, image_msg

from tests.conftest import API_KEY, MD

ROOT = Path(__file__).resolve().parents[2]
MLSERVER_MODELS = ROOT / "tests" / "fixtures" / "mlserver"
MLSERVER_VENV = ROOT / os.environ.get("MLSERVER_VENV", ".venv-mlserver")   # as setup_mlserver.sh
SETUP_SCRIPT = ROOT / "scripts" / "setup_mlserver.sh"
NORM = "mean=0.485,0.456,0.406&std=0.229,0.224,0.225"


# =============================================================================================
# Pure helpers
# =============================================================================================
def test_parse_url_reads_every_option():
    o = k.parse_url("kserve+grpc://10.0.0.7:8081/resnet?version=3&input_name=x&output_name=y"
                    "&layout=NHWC&dtype=fp16&channels=1&resize=32x48&scale=1/255&mean=0.5&std=0.25"
                    "&output=logits&raw=1&batch=4&timeout=2.5&token_env=TOK&host=m.example&tls=1"
                    "&rate=10")
    assert (o.transport, o.host, o.port, o.model, o.version) == ("grpc", "10.0.0.7", 8081, "resnet", "3")
    assert (o.input_name, o.output_name, o.layout, o.dtype, o.channels) == ("x", "y", "nhwc", "FP16", 1)
    assert o.resize == (32, 48) and o.scale == pytest.approx(1 / 255)
    assert (o.mean, o.std, o.output, o.raw, o.batch, o.timeout_s) == ((0.5,), (0.25,), "logits", True, 4, 2.5)
    assert (o.token_env, o.host_header, o.tls) == ("TOK", "m.example", True)
    h = k.parse_url("kserve+https://models.example/m")
    assert (h.transport, h.port, h.input_kind, h.output, h.raw) == ("https", 443, "tensor", "probabilities", False)
    assert k.parse_url("kserve+http://h:1/m?resize=224").resize == (224, 224)
    assert k.parse_url("kserve+http://h:1/m?input=bytes").input_kind == "bytes"


@pytest.mark.parametrize("url, words", [
    ("kserve+http://h:1/", "must name one model"),
    ("kserve+http://h:1/a/b", "must name one model"),
    ("kserve+grpc://h/m", "no port"),
    ("kserve+http://h:1/m?colour=1", "'colour': unknown option"),
    ("kserve+http://h:1/m?layout=chw", "'layout'"),
    ("kserve+http://h:1/m?dtype=INT8", "'dtype'"),
    ("kserve+http://h:1/m?output=scores", "output_name"),
    ("kserve+http://h:1/m?resize=0x3", "'resize'"),
    ("kserve+http://h:1/m?mean=1,2", "1 or 3 values"),
    ("kserve+http://h:1/m?std=0", "must not be 0"),
    ("kserve+http://h:1/m?scale=1/0", "'scale'"),
    ("kserve+http://h:1/m?dtype=UINT8&mean=0.5", "UINT8"),
    ("kserve+http://h:1/m?input=bytes&layout=nchw", "input=bytes"),
    ("kserve+http://h:1/m?raw=maybe", "'raw'"),
    ("kserve+http://h:1/m?labels=/no/such/labels.txt", "cannot read"),
])
def test_bad_urls_name_what_is_wrong(url, words):
    with pytest.raises(errors.InvalidArgument) as ei:
        k.backend_from_url(url)
    assert ei.value.violations[0].field == "target" and words in str(ei.value)


def test_input_resolved_from_metadata_and_options():
    meta = k.ModelMeta(name="m", inputs=(
        k.TensorMeta(name="pixels", datatype="UINT8", shape=(8, 64, 48, 3)),))
    spec = k.resolve_input(k.parse_url("kserve+http://h:1/m"), meta)
    assert (spec.name, spec.datatype, spec.layout, spec.channels, spec.height, spec.width,
            spec.batch, spec.scale) == ("pixels", "UINT8", "nhwc", 3, 64, 48, 8, 1.0)
    nchw = k.ModelMeta(name="m", inputs=(k.TensorMeta(name="x", datatype="FP32", shape=(-1, 1, 28, 28)),))
    spec = k.resolve_input(k.parse_url("kserve+http://h:1/m?mean=0.5&std=0.5"), nchw)
    assert (spec.layout, spec.channels, spec.height, spec.batch, spec.datatype) == ("nchw", 1, 28, 32, "FP32")
    assert spec.scale == pytest.approx(1 / 255)
    # options win; no metadata at all gives the documented defaults
    spec = k.resolve_input(k.parse_url("kserve+http://h:1/m?input_name=y&resize=10x12&layout=nhwc"), nchw)
    assert (spec.name, spec.height, spec.width, spec.layout) == ("y", 10, 12, "nhwc")
    spec = k.resolve_input(k.parse_url("kserve+http://h:1/m"), None)
    assert (spec.name, spec.layout, spec.datatype, spec.channels, spec.height) == ("input", "nchw", "FP32", 3, 0)
    with pytest.raises(errors.InvalidArgument, match="3 values for a 1-channel"):
        k.resolve_input(k.parse_url(f"kserve+http://h:1/m?{NORM}"), nchw)


def test_image_tensor_layout_dtype_and_normalisation():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (6, 4, 3), dtype=np.uint8)
    base = dict(name="x", kind="tensor", channels=3, height=0, width=0, batch=8)
    nhwc = k.ResolvedInput(**base, datatype="UINT8", layout="nhwc", scale=1.0, mean=(), std=())
    x = k.image_tensor([img, img], nhwc)
    assert x.shape == (2, 6, 4, 3) and x.dtype == np.uint8 and np.array_equal(x[1], img)
    nchw = k.ResolvedInput(**base, datatype="FP32", layout="nchw", scale=1 / 255,
                           mean=(0.5, 0.4, 0.3), std=(0.2, 0.2, 0.1))
    x = k.image_tensor([img], nchw)
    want = (img.astype(np.float32) / 255 - np.array([0.5, 0.4, 0.3])) / np.array([0.2, 0.2, 0.1])
    assert x.shape == (1, 3, 6, 4) and x.dtype == np.float32
    np.testing.assert_allclose(x[0], want.transpose(2, 0, 1), rtol=1e-5, atol=1e-6)
    half = k.ResolvedInput(**{**base, "channels": 1, "height": 3, "width": 2}, datatype="FP16",
                           layout="nchw", scale=1.0, mean=(), std=())
    assert k.image_tensor([img], half).shape == (1, 1, 3, 2)
    assert k.image_tensor([img], half).dtype == np.float16
    grey = np.full((5, 5, 1), 7, np.uint8)
    assert k.fit_image(grey, 0, 0, 3).shape == (5, 5, 3)                  # grey -> RGB
    assert k.fit_image(np.zeros((9, 9, 4), np.uint8), 3, 3, 3).shape == (3, 3, 3)   # alpha dropped


def test_requests_json_binary_and_proto():
    arr = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    t = k.InTensor("x", "FP32", (1, 2, 3), arr)
    body, hl = k.infer_request_json(t, output_name="y")
    doc = json.loads(body)
    assert hl is None and doc["inputs"][0] == {"name": "x", "shape": [1, 2, 3], "datatype": "FP32",
                                               "data": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]}
    assert doc["outputs"] == [{"name": "y", "parameters": {"binary_data": False}}]
    body, hl = k.infer_request_json(t, binary=True)
    assert hl is not None and json.loads(body[:hl])["inputs"][0]["parameters"] == {"binary_data_size": 24}
    assert np.array_equal(np.frombuffer(body[hl:], "<f4"), arr.ravel())
    items = (b"\x89PNG one", b"two")
    body, _ = k.infer_request_json(k.InTensor("img", "BYTES", (2,), items))
    inp = json.loads(body)["inputs"][0]
    assert [base64.b64decode(s) for s in inp["data"]] == list(items)
    assert inp["parameters"] == {"content_type": "base64"}
    req = k.infer_request_proto(t, model="m", version="2", output_name="y")
    assert (req.model_name, req.model_version, req.outputs[0].name) == ("m", "2", "y")
    assert list(req.inputs[0].contents.fp32_contents) == [0, 1, 2, 3, 4, 5] and not req.raw_input_contents
    raw = k.infer_request_proto(t, model="m", raw=True)
    assert not raw.inputs[0].HasField("contents") and raw.raw_input_contents[0] == arr.tobytes()
    u8 = k.infer_request_proto(k.InTensor("x", "UINT8", (3,), np.array([1, 2, 255], np.uint8)), model="m")
    assert list(u8.inputs[0].contents.uint_contents) == [1, 2, 255]
    f16 = k.infer_request_proto(k.InTensor("x", "FP16", (2,), np.array([1, 2], np.float16)), model="m")
    assert f16.raw_input_contents[0] == np.array([1, 2], "<f2").tobytes()   # FP16: raw only
    b = k.infer_request_proto(k.InTensor("img", "BYTES", (2,), items), model="m")
    assert list(b.inputs[0].contents.bytes_contents) == list(items)
    rb = k.infer_request_proto(k.InTensor("img", "BYTES", (2,), items), model="m", raw=True)
    assert k.split_raw_bytes_elements(rb.raw_input_contents[0]) == list(items)
    assert rb.raw_input_contents[0][:4] == struct.pack("<I", len(items[0]))


def test_answers_typed_raw_json_and_binary():
    probs = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]], np.float32)
    typed = pb.ModelInferResponse(outputs=[pb.ModelInferResponse.InferOutputTensor(
        name="p", datatype="FP32", shape=[2, 3],
        contents=pb.InferTensorContents(fp32_contents=probs.ravel().tolist()))])
    raw = pb.ModelInferResponse(outputs=[pb.ModelInferResponse.InferOutputTensor(
        name="p", datatype="FP64", shape=[2, 3])], raw_output_contents=[probs.astype("<f8").tobytes()])
    for resp in (typed, raw):
        (out,) = k.outputs_from_proto(resp)
        np.testing.assert_allclose(k.scores_of(out, 2), probs, rtol=1e-6)
    doc = {"outputs": [{"name": "p", "datatype": "FP32", "shape": [2, 3], "data": probs.tolist()}]}
    (out,) = k.outputs_from_json(json.dumps(doc).encode())            # nested data is accepted
    np.testing.assert_allclose(k.scores_of(out, 2), probs, rtol=1e-6)
    head = json.dumps({"outputs": [
        {"name": "q", "datatype": "INT64", "shape": [2], "data": [1, 2]},
        {"name": "p", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}}]}).encode()
    outs = k.outputs_from_json(head + probs.tobytes(), len(head))
    assert [o.name for o in outs] == ["q", "p"]
    np.testing.assert_allclose(k.scores_of(k.pick_output(outs, "p"), 2), probs)
    with pytest.raises(k.TargetResponseError, match="2 outputs"):
        k.pick_output(outs, "")
    assert k.pick_output(outs, "", fallback="p").name == "p"


@pytest.mark.parametrize("body, words", [
    (b"{\"outputs\": [", "malformed JSON"),
    (b"[]", "no 'outputs' list"),
    (b'{"outputs": [{"datatype": "FP32"}]}', "has no 'name'"),
    (b'{"outputs": [{"name": "p", "datatype": "FP32", "shape": [1, 3]}]}', "has no 'data'"),
    (b'{"outputs": [{"name": "p", "datatype": "FP32", "shape": [1, 3], "data": [1, 2]}]}',
     "2 values do not match shape [1, 3]"),
    (b'{"outputs": [{"name": "p", "datatype": "FP32", "shape": [1, 2], "data": ["a", "b"]}]}',
     "not a list of numbers"),
    (b'{"outputs": [{"name": "p", "datatype": "BYTES", "shape": [1], "data": ["x"]}]}',
     "datatype BYTES"),
    (b'{"outputs": [{"name": "p", "datatype": "FP8", "shape": [1], "data": [1]}]}',
     "unknown datatype"),
    (b'{"outputs": [{"name": "p", "datatype": "FP32", "shape": "1x3", "data": [1]}]}',
     "not a list of non-negative integers"),
])
def test_malformed_answers_are_named(body, words):
    with pytest.raises(k.TargetResponseError) as ei:
        k.outputs_from_json(body)
    assert words in str(ei.value)


def test_scores_checks_and_softmax():
    out = k.OutTensor("p", "FP32", (3, 4), np.zeros(12, np.float32))
    with pytest.raises(k.TargetResponseError, match=r"shape \[3, 4\] for 2 image\(s\)"):
        k.scores_of(out, 2)
    nan = k.OutTensor("p", "FP32", (1, 2), np.array([np.nan, 1], np.float32))
    with pytest.raises(k.TargetResponseError, match="NaN"):
        k.scores_of(nan, 1)
    assert k.scores_of(k.OutTensor("p", "FP32", (3,), np.ones(3)), 1).shape == (1, 3)
    logits = np.array([[2.0, 1.0, -1.0]])
    p = k.to_probabilities(logits, "logits")
    np.testing.assert_allclose(p, np.exp(logits) / np.exp(logits).sum(), rtol=1e-12)
    with pytest.raises(k.TargetResponseError, match="output=logits"):
        k.to_probabilities(logits, "probabilities", "p")
    with pytest.raises(k.TargetResponseError, match="3 scores but the model metadata lists 2"):
        k.class_names(("a", "b"), 3, "the model metadata")
    assert list(k.class_names((), 3, "x")) == ["0", "1", "2"]
    with pytest.raises(k.TargetResponseError, match="raw bytes do not match"):
        k.outputs_from_proto(pb.ModelInferResponse(
            outputs=[pb.ModelInferResponse.InferOutputTensor(name="p", datatype="FP32", shape=[1, 3])],
            raw_output_contents=[b"\0" * 8]))
    with pytest.raises(k.TargetResponseError, match="no fp32_contents"):
        k.outputs_from_proto(pb.ModelInferResponse(
            outputs=[pb.ModelInferResponse.InferOutputTensor(name="p", datatype="FP32", shape=[1, 3])]))


def test_retry_after_labels_and_error_text():
    assert k.parse_retry_after("3") == 3.0 and k.parse_retry_after(" 0.5 ") == 0.5
    assert k.parse_retry_after("Thu, 01 Jan 1970 00:01:40 GMT", now=90.0) == pytest.approx(10.0)
    assert k.parse_retry_after("later") is None and k.parse_retry_after(None) is None
    assert k.parse_labels('["cat", "dog"]') == ("cat", "dog") == k.parse_labels("cat\ndog\n")
    assert k.parse_labels(["a", 1]) == ("a", "1")
    meta = k.ModelMeta(name="m", outputs=(k.TensorMeta(name="a", datatype="FP32", shape=(-1, 2)),
                                          k.TensorMeta(name="b", datatype="FP32", shape=(-1, 2),
                                                       parameters={"labels": "x\ny"})))
    assert meta.labels("b") == ("x", "y") == meta.labels("a")       # any output's, as a last resort
    assert k.error_text(b'{"error": "Model m not found"}') == "Model m not found"
    assert k.error_text(b"<html>Bad Gateway</html>") == "<html>Bad Gateway</html>"
    msg = pb.ModelMetadataResponse(name="m", versions=["1"], platform="onnx", inputs=[
        pb.ModelMetadataResponse.TensorMetadata(name="x", datatype="UINT8", shape=[-1, 8, 8, 3])],
        outputs=[pb.ModelMetadataResponse.TensorMetadata(
            name="y", datatype="FP32", shape=[-1, 2],
            parameters={"labels": pb.InferParameter(string_param='["u", "v"]')})])
    m = k.meta_from_proto(msg)
    assert (m.platform, m.inputs[0].shape, m.labels()) == ("onnx", (-1, 8, 8, 3), ("u", "v"))


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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def stub() -> Iterator[_StubServer]:
    srv = _StubServer()
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _start_stack(state_dir: Path, targets: dict[str, str]) -> Any:
    from fortis.services.app import StackSettings, TargetConfig, start_stack
    return start_stack(StackSettings(
        state_dir=state_dir, api_keys={API_KEY: "tenant-a"},
        targets=[TargetConfig.parse(f"{name}={url}") for name, url in targets.items()]))


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
    targets["stub-closed"] = f"kserve+http://127.0.0.1:{_free_port()}/m?timeout=2"
    targets["grpc-closed"] = f"kserve+grpc://127.0.0.1:{_free_port()}/m?timeout=2"
    s = _start_stack(tmp_path_factory.mktemp("stub-stack"), targets)
    yield s
    s.stop(0)


def _images(n: int, size: int = 12) -> list[common_pb2.Image]:
    rng = np.random.default_rng(n)
    return [image_msg(f"img-{i}", rng.integers(0, 256, (size, size + 2, 3), dtype=np.uint8))
            for i in range(n)]


def _session(px: Any, target: str) -> str:
    return px.CreateSession(proxy_pb2.CreateSessionRequest(target=target), metadata=MD).session.session_id


def _ledger(px: Any, session_id: str) -> list[Any]:
    return list(px.ListLedgerEntries(proxy_pb2.ListLedgerEntriesRequest(session_id=session_id),
                                     metadata=MD).entries)


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
            sid = _session(px, target)
            resp = px.Predict(proxy_pb2.PredictRequest(session_id=sid, origin="clean", images=[
                image_msg("red", red), *_images(2)]), metadata=MD)
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
    ("stub-broken", grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE", 4, "HTTP 500: model crashed"),
    ("stub-slow", grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE", 4, "no answer within 0.25 s"),
    ("stub-closed", grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE", 4, "ConnectionRefusedError"),
    ("grpc-closed", grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE", 4, "ModelMetadata: UNAVAILABLE"),
    ("stub-garbled", grpc.StatusCode.INTERNAL, "TargetResponseError", 1, "malformed JSON"),
    ("stub-badshape", grpc.StatusCode.INTERNAL, "TargetResponseError", 1,
     "output 'scores' has shape [3, 4] for 2 image(s)"),
    ("stub-nooutput", grpc.StatusCode.INTERNAL, "TargetResponseError", 1,
     "no output 'scores' in the answer (outputs: ['other'])"),
    ("stub-bytesout", grpc.StatusCode.INTERNAL, "TargetResponseError", 1, "datatype BYTES"),
    ("stub-logits", grpc.StatusCode.INTERNAL, "TargetResponseError", 1, "add output=logits"),
])
def test_target_failures_become_ledger_rows(stub_stack, target, code, status, attempts, words):
    with grpc.insecure_channel(stub_stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        sid = _session(px, target)
        with pytest.raises(grpc.RpcError) as ei:
            px.Predict(proxy_pb2.PredictRequest(session_id=sid, origin="clean", images=_images(2)),
                       metadata=MD)
        assert ei.value.code() == code and words in ei.value.details()
        rows = _ledger(px, sid)
        assert [r.image_id for r in rows] == ["img-0", "img-1"]
        assert {(r.status, r.attempts) for r in rows} == {(status, attempts)}
        assert words in rows[0].error
        st = px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id=sid), metadata=MD)
        assert (st.queries_ok, st.queries_failed, st.session.queries_used) == (0, 2, 0)
        # ... and the proxy keeps serving
        ok = _session(px, "stub-ok")
        assert len(px.Predict(proxy_pb2.PredictRequest(session_id=ok, origin="x", images=_images(1)),
                              metadata=MD).predictions) == 1


def test_retry_after_is_honoured(stub_stack):
    with grpc.insecure_channel(stub_stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        sid = _session(px, "stub-busy")
        t0 = time.monotonic()
        resp = px.Predict(proxy_pb2.PredictRequest(session_id=sid, origin="clean", images=_images(2)),
                          metadata=MD)
        assert len(resp.predictions) == 2 and time.monotonic() - t0 >= 0.9   # waited Retry-After: 1
        rows = _ledger(px, sid)
        assert {(r.status, r.attempts) for r in rows} == {("OK", 2)}


def test_bad_image_is_refused_per_image(stub_stack):
    with grpc.insecure_channel(stub_stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        sid = _session(px, "stub-ok")
        with pytest.raises(grpc.RpcError) as ei:
            px.Predict(proxy_pb2.PredictRequest(session_id=sid, origin="x", images=[
                *_images(1), common_pb2.Image(image_id="junk", encoded=b"\x89PNG not really")]),
                metadata=MD)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "images[1].encoded" in ei.value.details()
        assert {r.status for r in _ledger(px, sid)} == {"INVALID_ARGUMENT"}


# =============================================================================================
# A real MLServer 1.7.1 serving ImageNet MobileNetV2
# =============================================================================================
def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


@pytest.fixture(scope="module")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """MLServer on two free loopback ports (REST, gRPC), one per test module."""
    setup = subprocess.run(["bash", str(SETUP_SCRIPT)], cwd=ROOT, capture_output=True, text=True,
                           timeout=1500)
    if setup.returncode != 0 or not (MLSERVER_VENV / "bin" / "mlserver").exists():
        tail = [ln for ln in (setup.stderr + setup.stdout).splitlines()
                if not ln.startswith("WARNING: Location")][-8:]
        pytest.skip(f"MLServer 1.7.1 could not be installed by {SETUP_SCRIPT.name} "
                    f"(exit {setup.returncode}): " + " | ".join(tail))
    http_port, grpc_port = _free_port(), _free_port()
    while grpc_port == http_port:
        grpc_port = _free_port()
    env = {key: v for key, v in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(MLSERVER_HOST="127.0.0.1", MLSERVER_HTTP_PORT=str(http_port),
               MLSERVER_GRPC_PORT=str(grpc_port), MLSERVER_METRICS_ENDPOINT="",
               MLSERVER_PARALLEL_WORKERS="0", MLSERVER_LOAD_MODELS_AT_STARTUP="true",
               PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="2")
    workdir = tmp_path_factory.mktemp("mlserver")
    log_path = workdir / "mlserver.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(MLSERVER_VENV / "bin" / "mlserver"), "start", str(MLSERVER_MODELS)],
                                cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        ready_url = f"http://127.0.0.1:{http_port}/v2/models/mobilenet/ready"
        deadline = time.monotonic() + 120
        while _http_status(ready_url) != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace").splitlines()[-12:]
                pytest.skip(f"MLServer did not start (exit {proc.poll()}): " + " | ".join(tail))
            time.sleep(0.25)
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
            grpc.channel_ready_future(ch).result(timeout=30)
        yield http_port, grpc_port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _mlserver_targets(http_port: int, grpc_port: int, labels_file: Path) -> dict[str, str]:
    rest, grpc_ = f"kserve+http://127.0.0.1:{http_port}/mobilenet", f"kserve+grpc://127.0.0.1:{grpc_port}/mobilenet"
    return {
        # input name, layout, dtype, 224x224 and the class names from the model metadata
        "mlserver-rest": f"{rest}?{NORM}&output_name=probabilities",
        # typed fp32_contents; 8 images exceed MLServer's 4 MiB gRPC default: the adapter splits
        "mlserver-grpc": f"{grpc_}?{NORM}&output_name=probabilities",
        # raw_input_contents in, raw_output_contents back
        "mlserver-grpc-raw": f"{grpc_}?{NORM}&output_name=probabilities&raw=1",
        # everything explicit; logits turned into softmax here; labels from a file
        "mlserver-grpc-logits": (f"{grpc_}?layout=nchw&dtype=FP32&resize=224x224&channels=3&{NORM}"
                                 f"&input_name=input&output_name=logits&output=logits"
                                 f"&labels={labels_file}&batch=4"),
        # uint8 pixels, NHWC
        "mlserver-rest-uint8": f"{rest}?dtype=UINT8&layout=nhwc&resize=224x224&output_name=probabilities",
        # the encoded image as a BYTES tensor (gRPC bytes_contents; REST base64)
        "mlserver-grpc-bytes": f"{grpc_}?input=bytes&output_name=probabilities",
        "mlserver-rest-bytes": f"{rest}?input=bytes&output_name=probabilities",
        # the model refuses UINT8 in NCHW: a 400 from the real server
        "mlserver-bad-layout": f"{rest}?dtype=UINT8&layout=nchw&resize=224x224",
        "mlserver-no-model": f"kserve+http://127.0.0.1:{http_port}/no-such-model",
        "mobilenet-builtin": "builtin:mobilenet-v2",
    }


@pytest.fixture(scope="module")
def mlserver_stack(mlserver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from fortis.adapters.torch_models.mobilenet import IMAGENET_CLASSES
    work = tmp_path_factory.mktemp("mlserver-stack")
    labels_file = work / "imagenet-labels.txt"
    labels_file.write_text("\n".join(IMAGENET_CLASSES) + "\n", encoding="utf-8")
    s = _start_stack(work / "state", _mlserver_targets(*mlserver, labels_file))
    yield s
    s.stop(0)


@pytest.fixture(scope="module")
def photos() -> list[Any]:
    from fortis.adapters.torch_models.datasets import load_imagenet_photos
    ps = load_imagenet_photos()
    if len(ps) < 4:
        pytest.skip(f"only {len(ps)} offline ImageNet photos on this machine")
    return ps


def _scores(pred: common_pb2.Prediction) -> np.ndarray:
    out = np.zeros(1000)
    for c in pred.classification.classes:
        out[c.label] = c.score
    return out


MLSERVER_TENSOR_TARGETS = ["mlserver-rest", "mlserver-grpc", "mlserver-grpc-raw",
                           "mlserver-grpc-logits", "mlserver-rest-uint8"]
MLSERVER_BYTES_TARGETS = ["mlserver-grpc-bytes", "mlserver-rest-bytes"]


@pytest.fixture(scope="module")
def builtin_answers(mlserver_stack, photos) -> dict[str, np.ndarray]:
    with grpc.insecure_channel(mlserver_stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        sid = _session(px, "mobilenet-builtin")
        resp = px.Predict(proxy_pb2.PredictRequest(session_id=sid, origin="clean", images=[
            image_msg(p.image_id, p.image) for p in photos]), metadata=MD)
    return {p.image_id: _scores(p) for p in resp.predictions}


def _top5_correct(scores: np.ndarray, labels: tuple[int, ...]) -> bool:
    return bool(set(np.argsort(-scores, kind="stable")[:5].tolist()) & set(labels))


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("target", MLSERVER_TENSOR_TARGETS + MLSERVER_BYTES_TARGETS)
def test_mlserver_mobilenet_through_the_proxy(mlserver_stack, photos, builtin_answers, target):
    from fortis.adapters.torch_models.mobilenet import IMAGENET_CLASSES
    with grpc.insecure_channel(mlserver_stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        info = px.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target=target), metadata=MD).info
        assert list(info.labels) == IMAGENET_CLASSES
        assert info.name == "mobilenet" and info.version == "pytorch mobilenet_v2-b0353104"
        assert info.output_kind == common_pb2.OUTPUT_KIND_FULL_SCORES
        if target in MLSERVER_TENSOR_TARGETS:
            assert (info.input.height, info.input.width, info.input.channels) == (224, 224, 3)
        sid = _session(px, target)
        resp = px.Predict(proxy_pb2.PredictRequest(session_id=sid, origin="clean", images=[
            image_msg(p.image_id, p.image) for p in photos]), metadata=MD)
        assert [p.image_id for p in resp.predictions] == [p.image_id for p in photos]
        for photo, pred in zip(photos, resp.predictions, strict=True):
            assert len(pred.classification.classes) == 1000
            assert pred.classification.classes[0].name == IMAGENET_CLASSES[pred.classification.classes[0].label]
            got, ref = _scores(pred), builtin_answers[photo.image_id]
            assert _top5_correct(got, photo.labels) == _top5_correct(ref, photo.labels), photo.image_id
            if target in MLSERVER_TENSOR_TARGETS:
                # same pixels, same network: the same answer up to float rounding
                assert int(got.argmax()) == int(ref.argmax()), photo.image_id
                assert float(np.abs(got - ref).max()) < 1e-3, photo.image_id
        n_correct = sum(_top5_correct(_scores(p), ph.labels) for ph, p in zip(photos, resp.predictions, strict=True))
        assert n_correct >= len(photos) - 2          # MobileNetV2 gets most of these photos
        st = px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id=sid), metadata=MD)
        assert (st.queries_ok, st.queries_failed, st.session.queries_used) == (len(photos), 0, len(photos))
        assert {i.image_id for i in st.images} == {p.image_id for p in photos}
        rows = _ledger(px, sid)
        assert len(rows) == len(photos) and {r.status for r in rows} == {"OK"}


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_mlserver_raw_answers_and_server_errors(mlserver, mlserver_stack, photos):
    http_port, grpc_port = mlserver
    # MLServer answers raw_output_contents to a raw request: the adapter's raw path was real
    from fortis.adapters.kserve_v2_protos import grpc_predict_v2_pb2_grpc as pb_grpc
    x = np.zeros((1, 3, 224, 224), np.float32)
    req = k.infer_request_proto(k.InTensor("input", "FP32", x.shape, x), model="mobilenet",
                                output_name="probabilities", raw=True)
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
        resp = pb_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=30)
    assert len(resp.raw_output_contents) == 1 and not resp.outputs[0].contents.fp32_contents
    (out,) = k.outputs_from_proto(resp)
    assert out.shape == (1, 1000) and abs(float(out.data.sum()) - 1.0) < 1e-4
    # typed answers to typed requests; 8 FP32 images (4.8 MB) exceed MLServer's default 4 MiB
    # gRPC message limit: the adapter halves the call and keeps the smaller batch
    typed = k.backend_from_url(f"kserve+grpc://127.0.0.1:{grpc_port}/mobilenet?{NORM}")
    try:
        preds = typed.predict([image_msg(f"p{i}", photos[i % len(photos)].image) for i in range(8)])
        assert len(preds) == 8 and typed.learnt_batch_limit == 4
        meta = typed.metadata()
        assert meta is not None and meta.labels("probabilities")[1] == "goldfish"
    finally:
        typed.close()
    with grpc.insecure_channel(mlserver_stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        # the real server refuses the request (HTTP 400): a failed row naming its reason
        sid = _session(px, "mlserver-bad-layout")
        with pytest.raises(grpc.RpcError) as ei:
            px.Predict(proxy_pb2.PredictRequest(session_id=sid, origin="x", images=[
                image_msg(p.image_id, p.image) for p in photos[:2]]), metadata=MD)
        assert ei.value.code() == grpc.StatusCode.INTERNAL
        assert "HTTP 400" in ei.value.details() and "UINT8 input must be [N, H, W, 3]" in ei.value.details()
        assert {r.status for r in _ledger(px, sid)} == {"TargetResponseError"}
        # an unknown model: GetTargetInfo and Predict both say so
        with pytest.raises(grpc.RpcError) as ei:
            px.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target="mlserver-no-model"), metadata=MD)
        assert "404" in ei.value.details() and "no-such-model" in ei.value.details()
        sid = _session(px, "mlserver-no-model")
        with pytest.raises(grpc.RpcError):
            px.Predict(proxy_pb2.PredictRequest(session_id=sid, origin="x", images=_images(1)), metadata=MD)
        st = px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id=sid), metadata=MD)
        assert (st.queries_ok, st.queries_failed) == (0, 1)
        # ... and MLServer and the proxy keep serving
        sid = _session(px, "mlserver-grpc-raw")
        ok = px.Predict(proxy_pb2.PredictRequest(session_id=sid, origin="x", images=[
            image_msg("again", photos[1].image), common_pb2.Image(
                image_id="again-png", encoded=encode_png(photos[1].image))]), metadata=MD)
        assert len(ok.predictions) == 2
