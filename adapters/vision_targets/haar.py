"""``haar-face``: OpenCV's Haar frontal-face cascade (shipped by opencv-python-headless 4.x)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
from fortis.adapters.vision_targets.base import (
    DEFAULT_MAX_BATCH,
    _Detector,
    detection_message,
)
from fortis.common.v1 import common_pb2
from fortis.services.common import errors

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
