"""``QueryClient`` over the target-proxy service: how query attacks reach the target.

Transport. Every query is a proxy ``Predict``: counted per image, rate-limited, budgeted and
recorded in the ledger. A RESOURCE_EXHAUSTED answer becomes ``BudgetExhausted``.
``predictions`` decodes the raw answers of any task (class scores, boxes, class maps with the
optional per-pixel probabilities) into the judges' domain forms (``judges.py``), which turn
them into an attack's margins and decisions; ``task`` and ``signal`` (what the target gives)
come from its TargetInfo.
``lost`` reads the session's per-image counts (GetSessionStats) so an attack resumed after a
crash starts from the queries a killed attempt left charged without an answer, so resumed
attempts never push an image past Q_m (IEEE-M6).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import numpy as np
from fortis.common.v1 import common_pb2
from fortis.core.task import Task
from fortis.core.tensors import tensor_to_array
from fortis.infra.serving.server import error_from_rpc
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common import errors
from fortis.services.common.codec import add_images, dense_scores
from fortis.services.common.limits import request_batches
from fortis.services.perturbation.judges import (
    Answer,
    BoxAnswer,
    ClassAnswer,
    MaskAnswer,
    signal_of_output,
)


def decode_answer(pred: common_pb2.Prediction, task: str, k: int) -> Answer:
    """One Prediction as the judges' answer for a ``task`` target; a wrong or malformed
    answer is InvalidArgument naming ``predictions[k]``."""
    kind = pred.WhichOneof("result")
    where = f"predictions[{k}]"
    if kind != task:
        raise errors.InvalidArgument(where, f"expected a {task} answer, got {kind or 'nothing'}")
    if kind == Task.CLASSIFICATION:
        cls = pred.classification.classes
        labels = tuple(int(c.label) for c in cls)
        scored = bool(cls) and all(c.HasField("score") for c in cls)
        return ClassAnswer(labels=labels,
                           scores=tuple(float(c.score) for c in cls) if scored else None)
    if kind == Task.DETECTION:
        bs = pred.detection.boxes
        return BoxAnswer(
            boxes=np.array([[b.x_min, b.y_min, b.x_max, b.y_max] for b in bs],
                           dtype=np.float64).reshape(-1, 4),
            labels=np.array([b.label for b in bs], dtype=np.int64),
            scores=np.array([b.score for b in bs], dtype=np.float64))
    seg = pred.segmentation
    cmap = tensor_to_array(seg.class_map, f"{where}.segmentation.class_map")
    if cmap.ndim != 2 or cmap.dtype.kind not in "iu":
        raise errors.InvalidArgument(f"{where}.segmentation.class_map",
                                     f"must be an integer [height, width] map, got "
                                     f"{cmap.dtype} {list(cmap.shape)}")
    probs = None
    if seg.HasField("probabilities"):
        p = tensor_to_array(seg.probabilities, f"{where}.segmentation.probabilities")
        if p.ndim != 3 or p.shape[:2] != cmap.shape or p.dtype.kind != "f":
            raise errors.InvalidArgument(f"{where}.segmentation.probabilities",
                                         f"must be float [height, width, classes] of the class "
                                         f"map's size, got {p.dtype} {list(p.shape)}")
        probs = p.astype(np.float32)
    return MaskAnswer(class_map=cmap.astype(np.int64), probabilities=probs)


class ProxyQueryClient:
    def __init__(self, stub: proxy_pb2_grpc.TargetProxyServiceStub, *, session_id: str,
                 origin: str, num_classes: int, metadata: Sequence[tuple[str, str]] = (),
                 timeout_s: float = 120.0, task: str = Task.CLASSIFICATION,
                 output_kind: str = "full_scores") -> None:
        self.stub = stub
        self.session_id = session_id
        self.origin = origin
        self.num_classes = num_classes
        self.metadata = tuple(metadata)
        self.timeout_s = timeout_s
        #: The target's task type and what it gives (``AttackContext.task`` / ``.signal``).
        self.task = task
        self.signal = signal_of_output(output_kind)

    def _predict(self, images: np.ndarray, image_ids: Sequence[str]) -> list:
        """Predict calls for one query of an attack: split where the rows would pass a
        request's image count or size, or a segmentation batch's answers the message limit
        (``limits.request_batches``: an attack asking for images x rows per image beyond
        them still runs); a refusal of a later call stops the whole batch, the earlier
        answers stay in the ledger as answered."""
        out: list = []
        for s, e in request_batches([im.shape for im in images], task=self.task):
            req = proxy_pb2.PredictRequest(session_id=self.session_id, origin=self.origin)
            add_images(req.images, zip(image_ids[s:e], images[s:e], strict=True))  # in place
            try:
                out += self.stub.Predict(req, timeout=self.timeout_s,
                                         metadata=self.metadata).predictions
            except grpc.RpcError as exc:
                raise error_from_rpc(exc) from None
        return out

    def lost(self, image_ids: Sequence[str]) -> list[int]:
        """Per image id, rows of this session charged against its per-image budget without
        an answer the attack could use: interrupted by a crash, or failed. The proxy replays
        a resumed attempt's answered queries; these it cannot."""
        req = proxy_pb2.GetSessionStatsRequest(session_id=self.session_id)
        try:
            st = self.stub.GetSessionStats(req, timeout=self.timeout_s, metadata=self.metadata)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        counts = {c.image_id: max(0, int(c.attempts) - int(c.queries)) for c in st.images}
        return [counts.get(i, 0) for i in image_ids]

    def predictions(self, images: np.ndarray, image_ids: Sequence[str]) -> list[Answer]:
        """The raw answers, decoded for the target's task (one per image, in order)."""
        preds = self._predict(images, image_ids)
        if len(preds) != len(image_ids):
            raise errors.InvalidArgument("predictions", f"the target answered {len(preds)} of "
                                         f"{len(image_ids)} images")
        return [decode_answer(p, self.task, k) for k, p in enumerate(preds)]

    def scores(self, images: np.ndarray, image_ids: Sequence[str]) -> np.ndarray:
        preds = self._predict(images, image_ids)
        return np.stack([dense_scores(p, self.num_classes) for p in preds])

    def labels(self, images: np.ndarray, image_ids: Sequence[str]) -> np.ndarray:
        preds = self._predict(images, image_ids)
        return np.array([p.classification.classes[0].label if p.classification.classes else -1
                         for p in preds], dtype=np.int64)
