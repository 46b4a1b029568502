"""The Open Inference Protocol adapter against a real Seldon MLServer 1.7.1 (its own venv,
.venv-mlserver, made by scripts/setup_mlserver.sh on first use) serving torchvision's ImageNet
MobileNetV2 through a custom runtime (tests/fixtures/mlserver/), reached over REST and gRPC
through the proxy: top-5 correctness on the offline photos agrees with Fortis's in-process
MobileNetV2 and the ledger counts every image. Skipped, with the reason, when MLServer cannot
be installed or started on this machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from fortis.adapters import kserve_v2 as k
from fortis.common.v1 import common_pb2
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common.codec import encode_png, image_msg
from google.rpc import code_pb2

from tests.conftest import MD
from tests.integration._kserve_support import (
    NORM,
    images,
    ledger,
    run_mlserver,
    session,
    start_stack_with,
)


# =============================================================================================
# A real MLServer 1.7.1 serving ImageNet MobileNetV2
# =============================================================================================
@pytest.fixture(scope="module")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """MLServer on two free loopback ports (REST, gRPC), one per test module."""
    yield from run_mlserver(tmp_path_factory.mktemp("mlserver"))


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
    s = start_stack_with(work / "state", _mlserver_targets(*mlserver, labels_file))
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
        sid = session(px, "mobilenet-builtin")
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
        sid = session(px, target)
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
        rows = ledger(px, sid)
        assert len(rows) == len(photos) and {r.status for r in rows} == {code_pb2.OK}


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
        # the real server refuses the request (HTTP 400): the target's permanent failure
        # (FAILED_PRECONDITION TARGET_FAILED, not retried), a failed row naming its reason
        sid = session(px, "mlserver-bad-layout")
        with pytest.raises(grpc.RpcError) as ei:
            px.Predict(proxy_pb2.PredictRequest(session_id=sid, origin="x", images=[
                image_msg(p.image_id, p.image) for p in photos[:2]]), metadata=MD)
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "HTTP 400" in ei.value.details() and "UINT8 input must be [N, H, W, 3]" in ei.value.details()
        assert {r.status for r in ledger(px, sid)} == {code_pb2.FAILED_PRECONDITION}
        # an unknown model: GetTargetInfo and Predict both say so
        with pytest.raises(grpc.RpcError) as ei:
            px.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target="mlserver-no-model"), metadata=MD)
        assert "404" in ei.value.details() and "no-such-model" in ei.value.details()
        sid = session(px, "mlserver-no-model")
        with pytest.raises(grpc.RpcError):
            px.Predict(proxy_pb2.PredictRequest(session_id=sid, origin="x", images=images(1)), metadata=MD)
        st = px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id=sid), metadata=MD)
        assert (st.queries_ok, st.queries_failed) == (0, 1)
        # ... and MLServer and the proxy keep serving
        sid = session(px, "mlserver-grpc-raw")
        ok = px.Predict(proxy_pb2.PredictRequest(session_id=sid, origin="x", images=[
            image_msg("again", photos[1].image), common_pb2.Image(
                image_id="again-png", encoded=encode_png(photos[1].image))]), metadata=MD)
        assert len(ok.predictions) == 2
