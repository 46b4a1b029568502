"""``QueryClient`` over the target-proxy service: how query attacks reach the target.

Transport. Every query is a proxy ``Predict``: counted per image, rate-limited, budgeted and
recorded in the ledger. A RESOURCE_EXHAUSTED answer becomes ``BudgetExhausted``.
``lost`` reads the session's per-image counts (GetSessionStats) so an attack resumed after a
crash starts from the queries a killed attempt left charged without an answer (issue 9:
resumed attempts never push an image past Q_m, IEEE-M6).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import numpy as np
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common.codec import add_images, dense_scores
from fortis.services.common.server import error_from_rpc


class ProxyQueryClient:
    def __init__(self, stub: proxy_pb2_grpc.TargetProxyServiceStub, *, session_id: str,
                 origin: str, num_classes: int, metadata: Sequence[tuple[str, str]] = (),
                 timeout_s: float = 120.0) -> None:
        self.stub = stub
        self.session_id = session_id
        self.origin = origin
        self.num_classes = num_classes
        self.metadata = tuple(metadata)
        self.timeout_s = timeout_s

    def _predict(self, images: np.ndarray, image_ids: Sequence[str]) -> list:
        req = proxy_pb2.PredictRequest(session_id=self.session_id, origin=self.origin)
        add_images(req.images, zip(image_ids, images, strict=True))   # in place (codec)
        try:
            return list(self.stub.Predict(req, timeout=self.timeout_s, metadata=self.metadata).predictions)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

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

    def scores(self, images: np.ndarray, image_ids: Sequence[str]) -> np.ndarray:
        preds = self._predict(images, image_ids)
        return np.stack([dense_scores(p, self.num_classes) for p in preds])

    def labels(self, images: np.ndarray, image_ids: Sequence[str]) -> np.ndarray:
        preds = self._predict(images, image_ids)
        return np.array([p.classification.classes[0].label if p.classification.classes else -1
                         for p in preds], dtype=np.int64)
