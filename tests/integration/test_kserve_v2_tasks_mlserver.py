"""Detection and segmentation answers of the Open Inference Protocol adapter against a real
Seldon MLServer 1.7.1 (.venv-mlserver, scripts/setup_mlserver.sh) serving a colour-blob
detector and segmenter (tests/fixtures/mlserver/blobs/) in the output conventions real OIP
models use -- TF Object Detection API / Triton NMS tensors (normalised yxyx, 1-based float
classes, num_detections), -1-padded pixel xywh rows, [N, C, H, W] logits and a stride-2 class
map -- reached over REST and gRPC through the proxy. The right answer comes from how the test
drew each image (coloured rectangles on a grey background), not from the server. Skipped,
with the reason, when MLServer cannot be installed or started on this machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from fortis.common.v1 import common_pb2
from fortis.core.answers import DetectionAnswers, SegmentationAnswers
from fortis.core.boxes import pair_iou
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common.codec import image_msg
from google.rpc import code_pb2

from tests.conftest import MD
from tests.integration._kserve_support import ledger, run_mlserver, session, start_stack_with

COLOURS = {0: (230, 20, 20), 1: (20, 230, 20), 2: (20, 20, 230)}  # red, green, blue
NAMES = ("red", "green", "blue")


def _scene(
    rng: np.random.Generator, h: int, w: int
) -> tuple[np.ndarray, list[tuple[int, tuple[int, int, int, int]]]]:
    """A grey noisy image with one rectangle of each of 1-3 colours, in separate thirds of
    the width; and the truth: (class, pixel xyxy) of each."""
    img = rng.integers(80, 170, (h, w, 3), dtype=np.uint8)
    truth = []
    classes = rng.permutation(3)[: int(rng.integers(1, 4))]
    third = w // 3
    for slot, c in enumerate(classes.tolist()):
        bw, bh = int(rng.integers(6, third - 2)), int(rng.integers(6, h - 4))
        x0 = slot * third + int(rng.integers(0, third - bw))
        y0 = int(rng.integers(0, h - bh))
        img[y0 : y0 + bh, x0 : x0 + bw] = COLOURS[c]
        truth.append((c, (x0, y0, x0 + bw, y0 + bh)))
    return img, truth


@pytest.fixture(scope="module")
def scenes() -> list[tuple[str, np.ndarray, list[tuple[int, tuple[int, int, int, int]]]]]:
    rng = np.random.default_rng(2027)
    sizes = [(48, 72), (48, 72), (60, 90), (48, 72), (40, 96)]  # several sizes: several calls
    return [(f"scene-{i}", *_scene(rng, h, w)) for i, (h, w) in enumerate(sizes)]


def _targets(http: int, grpc_: int) -> dict[str, str]:
    rest, g = f"kserve+http://127.0.0.1:{http}", f"kserve+grpc://127.0.0.1:{grpc_}"
    tf = "task=detection&box_format=yxyx&box_coords=normalised&label_offset=1"
    return {
        "det-tf-rest": f"{rest}/blobs?{tf}",
        "det-tf-grpc": f"{g}/blobs?{tf}",
        "det-tf-grpc-raw": f"{g}/blobs?{tf}&raw=1&min_score=0.5",
        # pixel xywh in the 48x64 frame the adapter resized to: scaled back to each image
        "det-padded-grpc": f"{g}/blobs-padded?task=detection&box_format=xywh&resize=48x64",
        "det-padded-rest": f"{rest}/blobs-padded?task=detection&box_format=xywh",
        "seg-logits-rest": f"{rest}/blobs-seg?task=segmentation",
        "seg-logits-grpc": f"{g}/blobs-seg?task=segmentation&raw=1",
        "seg-half-grpc": f"{g}/blobs-seg-half?task=segmentation",
        # hostile: 1-based classes read as 0-based (blue = 3 is outside red/green/blue)
        "det-no-offset": f"{rest}/blobs?task=detection&box_format=yxyx&box_coords=normalised",
        # hostile: a detector read as a segmenter (the metadata's first output, the boxes)
        "seg-of-detector": f"{g}/blobs?task=segmentation",
    }


@pytest.fixture(scope="module")
def mlserver_ports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    yield from run_mlserver(tmp_path_factory.mktemp("mlserver-tasks"))


@pytest.fixture(scope="module")
def stack(mlserver_ports, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    s = start_stack_with(
        tmp_path_factory.mktemp("tasks-stack") / "state", _targets(*mlserver_ports)
    )
    yield s
    s.stop(0)


def _predict(stack: Any, target: str, scenes: list[Any]) -> tuple[Any, str, Any]:
    ch = grpc.insecure_channel(stack.address)
    px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
    sid = session(px, target)
    resp = px.Predict(
        proxy_pb2.PredictRequest(
            session_id=sid, origin="clean", images=[image_msg(name, img) for name, img, _ in scenes]
        ),
        metadata=MD,
    )
    return px, sid, resp


# Least IoU with the drawn box: exact up to float32 rounding, except through a resize (the
# rectangle's edges blur when 48x72 and 60x90 images are shrunk to 48x64 and the box is scaled back).
DETECTORS = {
    "det-tf-rest": 0.999,
    "det-tf-grpc": 0.999,
    "det-tf-grpc-raw": 0.999,
    "det-padded-rest": 0.999,
    "det-padded-grpc": 0.75,
}


@pytest.mark.slow
@pytest.mark.parametrize("target", list(DETECTORS))
def test_detections_through_the_proxy(stack, scenes, target):
    px, sid, resp = _predict(stack, target, scenes)
    info = px.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target=target), metadata=MD).info
    assert info.task_type == common_pb2.TASK_TYPE_DETECTION
    assert info.output_kind == common_pb2.OUTPUT_KIND_BOXES and list(info.labels) == list(NAMES)
    assert [p.image_id for p in resp.predictions] == [s[0] for s in scenes]
    answers = DetectionAnswers.from_proto(resp.predictions)
    assert answers.errors == ("",) * len(scenes)
    ends = np.cumsum(answers.counts)
    for i, (name, img, truth) in enumerate(scenes):
        rows = range(int(ends[i] - answers.counts[i]), int(ends[i]))
        got = {int(answers.labels[r]): answers.boxes[r] for r in rows}
        assert sorted(got) == sorted(c for c, _ in truth), name
        for c, box in truth:
            iou = float(
                pair_iou(np.asarray([box], np.float64), got[c].astype(np.float64)[None, :])[0]
            )
            assert iou >= DETECTORS[target], (name, c, iou)
        for b in resp.predictions[i].detection.boxes:
            assert b.name == NAMES[b.label] and 0.0 < b.score <= 1.0
            assert 0 <= b.x_min < b.x_max <= img.shape[1] and 0 <= b.y_min < b.y_max <= img.shape[0]
    st = px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id=sid), metadata=MD)
    assert (st.queries_ok, st.queries_failed) == (len(scenes), 0)
    assert {r.status for r in ledger(px, sid)} == {code_pb2.OK}


@pytest.mark.slow
@pytest.mark.parametrize("target", ["seg-logits-rest", "seg-logits-grpc", "seg-half-grpc"])
def test_class_maps_through_the_proxy(stack, scenes, target):
    px, sid, resp = _predict(stack, target, scenes)
    info = px.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target=target), metadata=MD).info
    assert info.task_type == common_pb2.TASK_TYPE_SEGMENTATION
    assert info.output_kind == common_pb2.OUTPUT_KIND_MASKS
    assert list(info.labels) == ["background", *NAMES]
    for (name, img, truth), pred in zip(scenes, resp.predictions, strict=True):
        (got,) = SegmentationAnswers.from_proto([pred]).class_maps
        want = np.zeros(img.shape[:2], np.int64)
        for c, (x0, y0, x1, y1) in truth:
            want[y0:y1, x0:x1] = c + 1
        assert got.shape == want.shape, name
        if target == "seg-half-grpc":
            # a stride-2 map resized by nearest neighbour: each 2x2 cell takes its top-left
            assert np.array_equal(got, want[::2, ::2].repeat(2, 0).repeat(2, 1)), name
            assert float((got == want).mean()) > 0.9, name
        else:
            assert np.array_equal(got, want), name
    st = px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id=sid), metadata=MD)
    assert (st.queries_ok, st.queries_failed) == (len(scenes), 0)


@pytest.mark.slow
def test_unusable_answers_name_the_output_tensor(stack, scenes):
    for target, words in (
        ("det-no-offset", ("detection_classes", "class 3", "label set")),
        ("seg-of-detector", ("detection_boxes", "not whole class ids")),
    ):
        ch = grpc.insecure_channel(stack.address)
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        sid = session(px, target)
        with pytest.raises(grpc.RpcError) as ei:
            px.Predict(
                proxy_pb2.PredictRequest(
                    session_id=sid,
                    origin="x",
                    images=[image_msg(name, img) for name, img, _ in scenes[:2]],
                ),
                metadata=MD,
            )
        assert ei.value.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
        for w in words:
            assert w in ei.value.details(), (target, ei.value.details())
        rows = ledger(px, sid)
        assert rows and code_pb2.OK not in {r.status for r in rows}
    # ... and the proxy and the server keep serving
    _, _, resp = _predict(stack, "det-tf-grpc", scenes[:1])
    assert len(resp.predictions[0].detection.boxes) == len(scenes[0][2])


@pytest.mark.slow
def test_detection_and_segmentation_plans_against_the_oip_models(mlserver_ports, tmp_path):
    """Plans with a manifest of drawn scenes, through the services and the proxy: the clean
    answers are all correct (IEEE-C4 at IoU 0.9 / IEEE-C5 at mIoU 0.99, truth known by
    construction) and contrast at severity 5 washes the pure colours out, so the models fail."""
    import cv2
    from fortis.client import FortisClient, progress_of
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(99)
    det_rows, seg_rows = [], []
    for i in range(6):
        img, truth = _scene(rng, 48, 72)
        cv2.imwrite(str(data / f"s{i}.png"), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
        mask = np.zeros(img.shape[:2], np.uint8)
        for c, (x0, y0, x1, y1) in truth:
            mask[y0:y1, x0:x1] = c + 1
        cv2.imwrite(str(data / f"s{i}-mask.png"), mask)
        det_rows.append(
            {
                "id": f"s{i}",
                "image": f"s{i}.png",
                "box_format": "xyxy",
                "boxes": [list(b) for _, b in truth],
                "labels": [c for c, _ in truth],
            }
        )
        seg_rows.append({"id": f"s{i}", "image": f"s{i}.png", "mask": f"s{i}-mask.png"})
    for name, rows in (("det", det_rows), ("seg", seg_rows)):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    urls = _targets(*mlserver_ports)
    key = "test-key-oip-plans"
    st = start_stack(
        StackSettings(
            state_dir=tmp_path / "state",
            api_keys={key: "tenant-a"},
            data_root=data,
            targets=[
                TargetConfig.parse(f"{t}={urls[t]}") for t in ("det-tf-grpc", "seg-logits-rest")
            ],
            metrics_port=0,
            metrics_host="127.0.0.1",
        )
    )
    sections = {
        "det-tf-grpc": (
            "detection",
            "det.jsonl",
            "detection: {mode: threshold, iou_threshold: 0.9, "
            "confidence_threshold: 0.5, aggregate: all}",
        ),
        "seg-logits-rest": (
            "segmentation",
            "seg.jsonl",
            "segmentation: {classes: [1, 2, 3], miou_threshold: 0.99}",
        ),
    }
    try:
        with FortisClient(st.address, api_key=key) as fc:
            for target, (task, manifest, section) in sections.items():
                plan = (
                    f"name: oip-{task}\nseed: 5\n"
                    "roles: {tester: {name: pytest, organisation: Fortis CI}}\n"
                    f"target: {{name: {target}, task: {task}}}\n"
                    f"dataset: {{source: manifest, path: {manifest}}}\n{section}\n"
                    "corruptions: [{id: contrast, severities: [5]}]\n"
                )
                ev = fc.submit(plan)
                final = fc.wait(ev.evaluation_id)
                assert progress_of(final).state == "SUCCEEDED", final.error.message
                report = json.loads(
                    fc.write_report(ev.evaluation_id, tmp_path / task)[0].read_text()
                )
                m = report["metrics"]
                assert m["accuracy"]["m"] == 6 and m["accuracy"]["value"] == 1.0, (
                    task,
                    m["accuracy"],
                )
                assert m["corruptions"]["contrast"]["5"]["robustness"] < 1.0, task
                sessions = report["ledger"]["sessions"]
                assert sessions[f"{ev.evaluation_id}/clean"] == 6, sessions
                assert sessions[f"{ev.evaluation_id}/corruptions"] == 6, sessions
    finally:
        st.stop(0)
