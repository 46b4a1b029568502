"""``mtcnn``: facenet-pytorch's MTCNN (P-, R-, O-Net) with its bundled weights, loaded without
torchvision (a small stand-in for its ``batched_nms``)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

import numpy as np
from fortis.adapters.stand_ins import package, temporary_modules
from fortis.adapters.vision_targets.base import (
    DEFAULT_MAX_BATCH,
    SETUP_HINT,
    _Detector,
    _dist_version,
    detection_message,
)
from fortis.common.v1 import common_pb2
from fortis.services.common import errors

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
        boxes = types.ModuleType("torchvision.ops.boxes")
        boxes.batched_nms = batched_nms  # type: ignore[attr-defined]
        stand_ins = {m.__name__: m for m in (
            package("torchvision"), package("torchvision.ops"), boxes,
            package("torchvision.transforms"),
            types.ModuleType("torchvision.transforms.functional"))}
    pkg = types.ModuleType("facenet_pytorch")
    pkg.__path__ = list(spec.submodule_search_locations)
    prefixes = ("facenet_pytorch", "torchvision") if stand_ins else ("facenet_pytorch",)
    with temporary_modules({"facenet_pytorch": pkg, **stand_ins}, prefixes):
        return importlib.import_module("facenet_pytorch.models.mtcnn")


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
