"""The Open Inference Protocol (KServe v2) adapter's pure parts (``fortis.adapters.kserve_v2``),
without any server: URL options, input resolution from metadata, the tensor codec (JSON,
binary extension, gRPC typed and raw contents), answer checks, Retry-After, labels, error text.
"""

from __future__ import annotations

import base64
import json
import struct

import numpy as np
import pytest
from fortis.adapters import kserve_v2 as k
from fortis.adapters.kserve_v2_protos import grpc_predict_v2_pb2 as pb
from fortis.services.common import errors

from tests.integration._kserve_support import (
    NORM,
)


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
