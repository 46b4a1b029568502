"""``blazeface`` and ``selfie-seg``: MediaPipe models, run in ``fortis.adapters.mediapipe_worker``
under the MediaPipe venv's python (MediaPipe needs protobuf < 5, so it cannot share Fortis's
process), over a framed stdin/stdout protocol. A worker that dies, hangs past its deadline or
garbles its output makes that call ``errors.Unavailable`` and is discarded; the next call
starts a new one.
"""

from __future__ import annotations

import collections
import json
import os
import selectors
import struct
import subprocess
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np
from fortis.adapters.vision_targets.base import (
    DEFAULT_MAX_BATCH,
    SETUP_HINT,
    _check_threshold,
    _Detector,
    _Segmenter,
    detection_message,
)
from fortis.common.v1 import common_pb2
from fortis.services.common import errors

# --------------------------------------------------------------------------------------------
# MediaPipe worker client
# --------------------------------------------------------------------------------------------

_FRAME = struct.Struct(">II")
WORKER_SCRIPT = Path(__file__).resolve().parents[1] / "mediapipe_worker.py"


def mediapipe_python() -> Path:
    """The MediaPipe venv's python: ``$FORTIS_MEDIAPIPE_PYTHON``, else ``.venv-mediapipe``
    next to the source tree, else in the working directory."""
    env = os.environ.get("FORTIS_MEDIAPIPE_PYTHON")
    if env:
        return Path(env)
    candidates = [Path(__file__).resolve().parents[2] / ".venv-mediapipe" / "bin" / "python",
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
                # A worker that died mid-call: say how (a broken pipe may come before its
                # exit code is visible); a hung one is not waited for.
                code = None
                if not isinstance(exc, TimeoutError):
                    try:
                        code = proc.wait(timeout=0.5)
                    except subprocess.TimeoutExpired:
                        code = None
                cause = (f"exited with code {code}" if code is not None
                         else f"{type(exc).__name__}: {exc}")
                self._discard()
                raise errors.Unavailable(
                    f"MediaPipe worker ({self.role}) failed during '{header.get('op')}': "
                    f"{cause}; a new one starts on the next call"
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
            raise errors.Unavailable(f"cannot start MediaPipe worker ({self.role}): {exc}"
                                     ) from None
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
