"""What every built-in detection/segmentation target shares: the decode -> answer -> encode
loop of ``predict`` (batched, thread-safe), and the encoders of boxes and class maps, so each
model family's module only says how its model answers one image or a batch.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import cv2
import numpy as np
from fortis.common.v1 import common_pb2
from fortis.core.tensors import fill_tensor
from fortis.services.common import errors
from fortis.services.common.codec import decode_images
from fortis.target.v1 import target_pb2

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
                         threshold: float, *, probabilities: bool = True
                         ) -> common_pb2.Segmentation:
    """Foreground confidence map (any size) -> int32 class map at the input size and, with
    ``probabilities``, the per-pixel probabilities [background, foreground] as float16
    ``[height, width, 2]`` (``Segmentation.probabilities``: what score-based attacks use as a
    per-pixel loss; float16 keeps the answer compact)."""
    conf: np.ndarray = np.asarray(confidence, dtype=np.float32)
    if conf.shape != (height, width):
        conf = cv2.resize(conf, (width, height), interpolation=cv2.INTER_LINEAR)
    conf = np.clip(conf, 0.0, 1.0)
    class_map = (conf > threshold).astype(np.int32)
    seg = common_pb2.Segmentation()
    fill_tensor(seg.class_map, class_map)       # in place: fast under upb (see codec)
    if probabilities:
        fg = conf.astype(np.float16)
        fill_tensor(seg.probabilities, np.stack([np.float16(1.0) - fg, fg], axis=-1))
    return seg


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
            pred = common_pb2.Prediction(image_id=img.image_id)
            # CopyFrom, not a constructor argument: a class map is large (see codec)
            (pred.detection if isinstance(ans, common_pb2.Detection)
             else pred.segmentation).CopyFrom(ans)
            out.append(pred)
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
    #: Whether answers carry the per-pixel probabilities with the class map (``False``:
    #: class maps only, as a segmentation API that returns masks alone: ``output=masks``).
    probabilities: bool = True

    def __init__(self, *, threshold: float = 0.5, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        super().__init__(max_batch=max_batch)
        self.threshold = _check_threshold(threshold, "target.threshold")

    def _answer(self, image: np.ndarray) -> common_pb2.Segmentation:
        h, w = image.shape[:2]
        return segmentation_message(self._confidence(image), h, w, self.threshold,
                                    probabilities=self.probabilities)

    def _confidence(self, image: np.ndarray) -> np.ndarray:
        raise NotImplementedError
