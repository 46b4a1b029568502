"""Detection and segmentation targets on real models (``fortis.adapters.vision_targets``),
each served through ``TargetService`` by ``start_stack`` and queried through the real Fortis
proxy over gRPC: OpenCV Haar cascade, MTCNN (facenet-pytorch weights), MediaPipe BlazeFace
and selfie segmentation (in their own venv, through the worker process), U2-Net-p (ONNX).

Photos are offline ones: scikit-image's astronaut (Eileen Collins, one frontal face), the
astronaut beside its mirror image (two faces), Debian darknet's person.jpg (a person seen
from behind with a dog and a horse: no face) and scikit-image's coffee (no face; a cup on a
saucer as the salient object). Ground truth was drawn by hand on those photos: face boxes,
and rough person / object polygons. Recorded answers are then scored with the IEEE metrics
(IEEE-C4, IEEE-C5): accuracy 1.0 on the clean photos, lower robustness under a strong
corruption. ``scripts/setup_vision.sh`` (idempotent) installs the models on first use.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import grpc
import numpy as np
import pytest
from fortis.common.v1 import common_pb2
from fortis.core.tensors import array_to_tensor, tensor_to_array
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common import errors
from fortis.services.common.codec import image_msg
from fortis.services.perturbation.registry import apply_perturbation
from fortis.services.scoring.correctness import (
    DetectionCriterion,
    Detections,
    SegmentationCriterion,
    SegmentationPrediction,
)
from fortis.services.scoring.outcomes import TestRecord, score_detection, score_segmentation
from google.rpc import code_pb2

from tests.conftest import API_KEY, MD

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TARGET_NAMES = ("haar-face", "mtcnn", "blazeface", "selfie-seg", "u2netp")
DARKNET_PERSON = Path("/usr/share/darknet/data/person.jpg")

# -- hand-made ground truth (pixel coordinates of the photos) ----------------------------------
#: The astronaut's face: forehead (hairline) to chin, ear to ear.
ASTRONAUT_FACE = (175.0, 65.0, 275.0, 175.0)
#: The astronaut, her helmet included (it is held in front of her).
ASTRONAUT_POLYGON = [(225, 14), (270, 22), (296, 50), (300, 110), (290, 150), (305, 200),
                     (330, 262), (352, 300), (362, 345), (440, 343), (490, 372), (512, 420),
                     (512, 512), (22, 512), (18, 380), (30, 300), (52, 262), (110, 222),
                     (115, 185), (160, 150), (152, 100), (158, 50), (185, 22)]
#: The person of darknet's person.jpg: hat, blue jacket, trousers, boots.
PERSON_POLYGON = [(235, 100), (250, 110), (252, 130), (262, 160), (270, 225), (276, 268),
                  (265, 276), (258, 300), (255, 330), (262, 370), (242, 374), (215, 372),
                  (208, 325), (205, 250), (192, 205), (193, 150), (200, 122), (222, 116)]


def _polygon_mask(shape: tuple[int, ...], points: list[tuple[int, int]]) -> np.ndarray:
    m = np.zeros(shape[:2], np.uint8)
    cv2.fillPoly(m, [np.array(points, np.int32)], 1)
    return m.astype(np.int64)


def _coffee_mask(shape: tuple[int, ...]) -> np.ndarray:
    """Saucer (ellipse) and cup (rim ellipse joined to the saucer)."""
    m = np.zeros(shape[:2], np.uint8)
    cv2.ellipse(m, (280, 240), (202, 148), 0, 0, 360, 1, -1)
    cv2.ellipse(m, (290, 82), (118, 64), 0, 0, 360, 1, -1)
    cv2.rectangle(m, (172, 82), (408, 240), 1, -1)
    return m.astype(np.int64)


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def photos() -> dict[str, np.ndarray]:
    import skimage.data

    if not DARKNET_PERSON.is_file():
        pytest.fail(f"{DARKNET_PERSON} missing: apt-get install darknet (scripts/setup.sh does)")
    astronaut = skimage.data.astronaut()
    person = cv2.cvtColor(cv2.imread(str(DARKNET_PERSON)), cv2.COLOR_BGR2RGB)
    return {"astronaut": astronaut,
            "astronaut-pair": np.ascontiguousarray(np.concatenate([astronaut, astronaut[:, ::-1]], 1)),
            "person": person,
            "coffee": skimage.data.coffee()}


@pytest.fixture(scope="module")
def vision_stack(tmp_path_factory: pytest.TempPathFactory, vision_setup: None) -> Iterator[Any]:
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    s = start_stack(StackSettings(
        state_dir=tmp_path_factory.mktemp("vision") / "state", api_keys={API_KEY: "tenant-a"},
        targets=[TargetConfig.parse(f"{n}=builtin:{n}") for n in TARGET_NAMES]))
    yield s
    s.stop(0)


@pytest.fixture(scope="module")
def px(vision_stack: Any) -> Iterator[proxy_pb2_grpc.TargetProxyServiceStub]:
    ch = grpc.insecure_channel(vision_stack.address,
                               options=[("grpc.max_receive_message_length", 64 << 20),
                                        ("grpc.max_send_message_length", 64 << 20)])
    yield proxy_pb2_grpc.TargetProxyServiceStub(ch)
    ch.close()


# -- helpers -----------------------------------------------------------------------------------


def _session(px: Any, target: str, budget: int = 0) -> str:
    return px.CreateSession(proxy_pb2.CreateSessionRequest(target=target, query_budget=budget),
                            metadata=MD).session.session_id


def _predict(px: Any, session_id: str, origin: str,
             images: dict[str, np.ndarray]) -> dict[str, common_pb2.Prediction]:
    resp = px.Predict(proxy_pb2.PredictRequest(
        session_id=session_id, origin=origin,
        images=[image_msg(i, a) for i, a in images.items()]), metadata=MD)
    assert [p.image_id for p in resp.predictions] == list(images)     # one each, in order
    return {p.image_id: p for p in resp.predictions}


def _corrupt(images: dict[str, np.ndarray], corruption: str) -> dict[str, np.ndarray]:
    return {i: apply_perturbation(corruption, a, 5, np.random.default_rng(7))
            for i, a in images.items()}


def _box_iou(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _boxes(p: common_pb2.Prediction) -> list[tuple[float, float, float, float]]:
    return [(b.x_min, b.y_min, b.x_max, b.y_max) for b in p.detection.boxes]


def _faces_found(p: common_pb2.Prediction, truth: list[tuple[float, ...]]) -> int:
    return sum(any(_box_iou(t, b) > 0.5 for b in _boxes(p)) for t in truth)


def _as_detections(p: common_pb2.Prediction) -> Detections:
    bx = p.detection.boxes
    return Detections(boxes=np.array([[b.x_min, b.y_min, b.x_max, b.y_max] for b in bx],
                                     dtype=np.float64).reshape(-1, 4),
                      labels=np.array([b.label for b in bx], dtype=np.int64),
                      scores=np.array([b.score for b in bx], dtype=np.float64))


def _mask(p: common_pb2.Prediction) -> np.ndarray:
    assert p.WhichOneof("result") == "segmentation"
    return tensor_to_array(p.segmentation.class_map, "class_map")


def _mask_iou(pred: np.ndarray, truth: np.ndarray) -> float:
    a, b = pred == 1, truth == 1
    return float((a & b).sum() / max(1, (a | b).sum()))


def _check_ledger(px: Any, session_id: str, sent: dict[str, int], failed: int = 0) -> None:
    """The proxy counted exactly the images answered, per origin (``failed`` attempts apart)."""
    st = px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id=session_id), metadata=MD)
    assert st.queries_ok == sum(sent.values()) and st.queries_failed == failed
    assert {o.origin: o.queries for o in st.origins} == sent
    assert sum(i.queries for i in st.images) == sum(sent.values())


def _face_truth(photos: dict[str, np.ndarray]) -> dict[str, list[tuple[float, ...]]]:
    w = photos["astronaut"].shape[1]
    x0, y0, x1, y1 = ASTRONAUT_FACE
    return {"astronaut": [ASTRONAUT_FACE],
            "astronaut-pair": [ASTRONAUT_FACE, (2 * w - x1, y0, 2 * w - x0, y1)],
            "person": [], "coffee": []}


# -- tests -------------------------------------------------------------------------------------


def test_target_info_through_proxy(px: Any) -> None:
    want = {"haar-face": (common_pb2.TASK_TYPE_DETECTION, common_pb2.OUTPUT_KIND_BOXES, ["face"]),
            "mtcnn": (common_pb2.TASK_TYPE_DETECTION, common_pb2.OUTPUT_KIND_BOXES, ["face"]),
            "blazeface": (common_pb2.TASK_TYPE_DETECTION, common_pb2.OUTPUT_KIND_BOXES, ["face"]),
            "selfie-seg": (common_pb2.TASK_TYPE_SEGMENTATION, common_pb2.OUTPUT_KIND_MASKS,
                           ["background", "person"]),
            "u2netp": (common_pb2.TASK_TYPE_SEGMENTATION, common_pb2.OUTPUT_KIND_MASKS,
                       ["background", "salient"])}
    listed = {t.name for t in px.ListTargets(proxy_pb2.ListTargetsRequest(), metadata=MD).targets}
    assert set(want) <= listed
    for name, (task, kind, labels) in want.items():
        info = px.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target=name), metadata=MD).info
        assert (info.name, info.task_type, info.output_kind, list(info.labels)) == (name, task, kind, labels)
        assert info.version and info.input.channels == 3 and info.input.max_batch_size >= 1


@pytest.mark.parametrize("target", ["haar-face", "mtcnn", "blazeface"])
def test_face_detector_through_proxy(px: Any, photos: dict[str, np.ndarray], target: str) -> None:
    truth = _face_truth(photos)
    sid = _session(px, target, budget=2 * len(photos))
    clean = _predict(px, sid, "clean", photos)
    for image_id, p in clean.items():
        h, w = photos[image_id].shape[:2]
        assert p.WhichOneof("result") == "detection"
        for b in p.detection.boxes:
            assert (b.label, b.name) == (0, "face") and 0.0 <= b.score <= 1.0
            assert 0 <= b.x_min < b.x_max <= w and 0 <= b.y_min < b.y_max <= h
    # The face(s) found where they are, nothing on the face-less photos.
    assert _faces_found(clean["astronaut"], truth["astronaut"]) == 1
    assert _faces_found(clean["astronaut-pair"], truth["astronaut-pair"]) == 2
    assert not clean["person"].detection.boxes and not clean["coffee"].detection.boxes
    # A heavy corruption (contrast, severity 5): the faces are lost.
    corrupted = _predict(px, sid, "contrast@5", _corrupt(photos, "contrast"))
    found_clean = sum(_faces_found(clean[i], t) for i, t in truth.items())
    found_corr = sum(_faces_found(corrupted[i], t) for i, t in truth.items())
    assert found_corr < found_clean == 3
    assert sum(len(p.detection.boxes) for p in corrupted.values()) < \
        sum(len(p.detection.boxes) for p in clean.values())
    _check_ledger(px, sid, {"clean": len(photos), "contrast@5": len(photos)})

    # IEEE-C4 on the recorded answers against the hand-labelled boxes.
    truths = {i: Detections(boxes=np.array(t, dtype=np.float64).reshape(-1, 4),
                            labels=np.zeros(len(t), dtype=np.int64),
                            image_size=(photos[i].shape[1], photos[i].shape[0]))
              for i, t in truth.items()}
    metrics = score_detection(
        DetectionCriterion(mode="threshold", iou_threshold=0.5, confidence_threshold=0.5), truths,
        [TestRecord(kind="clean", predictions={i: _as_detections(p) for i, p in clean.items()}),
         TestRecord(kind="corruption", perturbation_id="contrast", severity=5,
                    predictions={i: _as_detections(p) for i, p in corrupted.items()})])
    assert metrics["accuracy"]["value"] == 1.0 and metrics["m"] == len(photos)
    assert metrics["corruptions"]["contrast"]["5"]["robustness"] < 1.0


SEGMENTATION_CASES = {
    # target: (photos, the hand-made region of each, corruption that should break it)
    "selfie-seg": (("astronaut", "person"), "contrast"),
    "u2netp": (("astronaut", "coffee"), "gaussian_noise"),
}


@pytest.mark.parametrize("target", sorted(SEGMENTATION_CASES))
def test_segmenter_through_proxy(px: Any, photos: dict[str, np.ndarray], target: str) -> None:
    names, corruption = SEGMENTATION_CASES[target]
    images = {n: photos[n] for n in names}
    regions = {"astronaut": _polygon_mask(photos["astronaut"].shape, ASTRONAUT_POLYGON),
               "person": _polygon_mask(photos["person"].shape, PERSON_POLYGON),
               "coffee": _coffee_mask(photos["coffee"].shape)}
    truths = {n: regions[n] for n in names}
    sid = _session(px, target, budget=2 * len(images))
    clean = _predict(px, sid, "clean", images)
    corrupted = _predict(px, sid, f"{corruption}@5", _corrupt(images, corruption))
    clean_iou, corr_iou = {}, {}
    for n in names:
        m = _mask(clean[n])
        assert m.shape == images[n].shape[:2] and m.dtype == np.int32
        assert set(np.unique(m).tolist()) <= {0, 1}
        clean_iou[n] = _mask_iou(m, truths[n])
        corr_iou[n] = _mask_iou(_mask(corrupted[n]), truths[n])
    assert min(clean_iou.values()) > 0.7, clean_iou           # covers the person / object
    assert min(corr_iou.values()) < 0.5, corr_iou             # and degrades under corruption
    assert sum(corr_iou.values()) < sum(clean_iou.values()) - 0.5
    _check_ledger(px, sid, {"clean": len(images), f"{corruption}@5": len(images)})

    # IEEE-C5 on the recorded answers: IoU of the foreground class > 0.6.
    metrics = score_segmentation(
        SegmentationCriterion(classes=(1,), miou_threshold=0.6, ignore_label=None), truths,
        [TestRecord(kind="clean",
                    predictions={n: SegmentationPrediction(mask=_mask(p)) for n, p in clean.items()}),
         TestRecord(kind="corruption", perturbation_id=corruption, severity=5,
                    predictions={n: SegmentationPrediction(mask=_mask(p))
                                 for n, p in corrupted.items()})])
    assert metrics["accuracy"]["value"] == 1.0
    assert metrics["corruptions"][corruption]["5"]["robustness"] < 1.0


@pytest.mark.parametrize("target", ["haar-face", "blazeface", "selfie-seg", "u2netp"])
def test_bad_images_are_invalid_argument_and_target_keeps_serving(
        px: Any, photos: dict[str, np.ndarray], target: str) -> None:
    sid = _session(px, target)
    bad = [common_pb2.Image(image_id="junk", encoded=b"definitely not a PNG"),
           common_pb2.Image(image_id="floats", tensor=array_to_tensor(np.zeros((8, 8, 3), np.float32))),
           common_pb2.Image(image_id="4ch", tensor=array_to_tensor(np.zeros((8, 8, 4), np.uint8)))]
    fields = ["images[0].encoded", "images[0].tensor.dtype", "images[0].tensor.shape"]
    for img, field in zip(bad, fields, strict=True):
        with pytest.raises(grpc.RpcError) as ei:
            px.Predict(proxy_pb2.PredictRequest(session_id=sid, origin="bad", images=[img]),
                       metadata=MD)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value.details()
        assert field in ei.value.details()
    # Grey and tiny images are valid: answered at their own size.
    grey = cv2.cvtColor(photos["astronaut"], cv2.COLOR_RGB2GRAY)[:, :, None]
    out = _predict(px, sid, "odd", {"grey": grey, "tiny": photos["astronaut"][:3, :2]})
    if out["grey"].WhichOneof("result") == "detection":
        assert _faces_found(out["grey"], [ASTRONAUT_FACE]) == 1
    else:
        assert _mask(out["grey"]).shape == (512, 512) and _mask(out["tiny"]).shape == (3, 2)


def test_target_batch_limits_are_invalid_argument(vision_setup: None,
                                                  photos: dict[str, np.ndarray]) -> None:
    from fortis.adapters.vision_targets import HaarFaceTarget

    t = HaarFaceTarget(max_batch=2)
    with pytest.raises(errors.InvalidArgument, match="at least one image"):
        t.predict([])
    with pytest.raises(errors.InvalidArgument, match="exceed max_batch_size 2"):
        t.predict([image_msg(str(k), photos["coffee"]) for k in range(3)])


def _worker_pids(role: str) -> list[int]:
    """This process's MediaPipe worker children of one role (from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and any(c.endswith(b"mediapipe_worker.py") for c in cmd) \
                and role.encode() in cmd:
            out.append(int(d.name))
    return out


def _wait_dead(pid: int) -> None:
    for _ in range(200):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return
        time.sleep(0.01)
    raise AssertionError(f"worker {pid} did not die")


def test_killed_worker_is_unavailable_then_restarted(vision_setup: None,
                                                     photos: dict[str, np.ndarray]) -> None:
    from fortis.adapters.vision_targets import MediaPipeWorker, SelfieSegTarget

    t = SelfieSegTarget(worker=MediaPipeWorker("selfie-direct"))
    try:
        img = [image_msg("a", photos["astronaut"])]
        first = _mask(t.predict(img)[0])
        pid = t.worker.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        _wait_dead(pid)
        with pytest.raises(errors.Unavailable, match="exited with code -9"):
            t.predict(img)
        again = _mask(t.predict(img)[0])              # a fresh worker answers the same
        assert t.worker.pid not in (None, pid) and t.worker.starts == 2
        assert np.array_equal(first, again)
        # A hung worker: its deadline passes, it is killed and replaced.
        hung = t.worker.pid
        assert hung is not None
        t.worker.call_timeout_s = 2.0
        os.kill(hung, signal.SIGSTOP)
        with pytest.raises(errors.Unavailable, match="in time"):
            t.predict(img)
        _wait_dead(hung)
        t.worker.call_timeout_s = 60.0
        assert np.array_equal(_mask(t.predict(img)[0]), first) and t.worker.starts == 3
    finally:
        t.close()
    assert t.worker.pid is None


def test_worker_killed_under_the_proxy_is_retried(px: Any, photos: dict[str, np.ndarray]) -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("needs /proc to find the worker process")
    sid = _session(px, "blazeface")
    _predict(px, sid, "warm", {"astronaut": photos["astronaut"]})
    pids = _worker_pids("face")
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    _wait_dead(pids[0])
    out = _predict(px, sid, "after-kill", {"astronaut": photos["astronaut"]})
    assert _faces_found(out["astronaut"], [ASTRONAUT_FACE]) == 1
    entries = px.ListLedgerEntries(proxy_pb2.ListLedgerEntriesRequest(session_id=sid),
                                   metadata=MD).entries
    last = [e for e in entries if e.origin == "after-kill"]
    # write-ahead ledger: the attempt that met the dead worker is its own row
    assert [(e.status, e.attempts) for e in last] == [(code_pb2.UNAVAILABLE, 1), (code_pb2.OK, 2)]
    new = _worker_pids("face")
    assert len(new) == 1 and new[0] != pids[0]
    _check_ledger(px, sid, {"warm": 1, "after-kill": 1}, failed=1)


def test_mtcnn_nms_stand_in_matches_greedy_reference(vision_stack: Any) -> None:
    """The torchvision stand-in MTCNN runs on: per-group greedy NMS, kept indices by score;
    and no stand-in module is left behind once MTCNN has loaded (the stack loaded it)."""
    import torch
    from fortis.adapters.vision_targets import batched_nms

    if importlib.util.find_spec("torchvision") is None:
        assert not any(m.split(".")[0] == "torchvision" for m in sys.modules)
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 100, (300, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(5, 40, (300, 2))], 1)
    scores, groups = rng.uniform(size=300), rng.integers(0, 3, 300)
    got = batched_nms(torch.tensor(boxes), torch.tensor(scores), torch.tensor(groups), 0.5)
    want: list[int] = []
    for i in np.argsort(-scores, kind="stable").tolist():
        if all(groups[j] != groups[i] or _box_iou(tuple(boxes[i]), tuple(boxes[j])) <= 0.5
               for j in want):
            want.append(i)
    assert got.tolist() == want
    assert batched_nms(torch.zeros((0, 4)), torch.zeros(0), torch.zeros(0, dtype=torch.int64),
                       0.5).tolist() == []
