"""In-process target adapter: serves ``fortis.target.v1.TargetService`` for a PyTorch model.

The output mode lets one model stand in for the different APIs real services expose:
``full_scores`` (every class with a probability), ``top_k`` (the k best with scores) or
``label_only`` (top-1 label, no score: decision-based attacks only).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from fortis.adapters.torch_models.classifier import TorchClassifier
from fortis.common.v1 import common_pb2
from fortis.core.strategy import OUTPUT_KINDS, strategy
from fortis.core.task import Task
from fortis.infra.serving.memory import holding
from fortis.infra.serving.status import status_for
from fortis.services.common import errors, limits
from fortis.services.common.codec import add_messages, decode_image, fill_classification
from fortis.target.v1 import target_pb2, target_pb2_grpc

#: The output modes of a classifier target: its task's output kinds.
OUTPUT_MODES = {k: OUTPUT_KINDS[k] for k in strategy(Task.CLASSIFICATION).outputs}
SERVICE_NAME = target_pb2.DESCRIPTOR.services_by_name["TargetService"].full_name


class ClassifierTarget:
    """A classifier answering in one output mode. No gRPC here."""

    def __init__(self, classifier: TorchClassifier, *, output: str = "full_scores",
                 top_k: int = 5, max_batch: int = 256) -> None:
        if output not in OUTPUT_MODES:
            raise errors.InvalidArgument("target.output", f"unknown output mode '{output}'; use one of {sorted(OUTPUT_MODES)}")
        if output == "top_k" and not 1 <= top_k <= len(classifier.class_names):
            raise errors.InvalidArgument("target.top_k", f"must be in 1..{len(classifier.class_names)}")
        self.classifier = classifier
        self.output = output
        self.top_k = top_k
        self.max_batch = max_batch

    def info(self) -> target_pb2.TargetInfo:
        spec = self.classifier.input_spec
        return target_pb2.TargetInfo(
            name=self.classifier.name, task_type=common_pb2.TASK_TYPE_CLASSIFICATION,
            labels=list(self.classifier.class_names), output_kind=OUTPUT_MODES[self.output],
            top_k=self.top_k if self.output == "top_k" else 0,
            input=target_pb2.InputSpec(height=spec.height, width=spec.width,
                                       channels=spec.channels, max_batch_size=self.max_batch),
            version=self.classifier.version)

    def predict(self, images: Sequence[common_pb2.Image]) -> list[common_pb2.Prediction]:
        if not images:
            raise errors.InvalidArgument("images", "at least one image is required")
        if len(images) > self.max_batch:
            raise errors.InvalidArgument("images", f"{len(images)} images exceed max_batch_size {self.max_batch}")
        # each image fitted to the model's input as it is decoded: one forward pass for all
        fit = self.classifier.fit_input
        proba = self.classifier.predict_proba(np.stack(
            [fit(decode_image(m, f"images[{i}]")) for i, m in enumerate(images)]))
        names = self.classifier.class_names
        orders = np.argsort(-proba, axis=1, kind="stable")     # one sort for the batch
        out = []
        for img, p, order in zip(images, proba, orders, strict=True):
            pred = common_pb2.Prediction(image_id=img.image_id)
            fill_classification(pred.classification, p, output=self.output, top_k=self.top_k,
                                names=names, order=order)
            out.append(pred)
        return out


class TargetServicer(target_pb2_grpc.TargetServiceServicer):
    """Transport: decode, call ``ClassifierTarget``, encode."""

    def __init__(self, target: Any) -> None:  # ClassifierTarget or any info()/predict() target
        self.target = target

    def GetTargetInfo(self, request: Any, context: Any) -> target_pb2.GetTargetInfoResponse:
        return target_pb2.GetTargetInfoResponse(info=self.target.info())

    def Predict(self, request: Any, context: Any) -> target_pb2.PredictResponse:
        resp = target_pb2.PredictResponse()
        add_messages(resp.predictions, self.target.predict(request.images))   # codec: fast
        return resp

    def PredictStream(self, request_iterator: Any, context: Any
                      ) -> Iterator[target_pb2.PredictStreamResponse]:
        for req in request_iterator:
            try:
                limits.check_message(req)   # in band, like the proxy's limits
                resp = target_pb2.PredictStreamResponse(request_id=req.request_id)
                with holding(req):          # its decoded size, held while it is answered
                    add_messages(resp.predictions, self.target.predict(req.images))
                yield resp
            except errors.FortisError as exc:
                yield target_pb2.PredictStreamResponse(request_id=limits.echoed_id(req.request_id),
                                                       error=status_for(exc))
