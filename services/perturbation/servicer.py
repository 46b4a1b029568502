"""gRPC transport of the perturbation service: decode, call the engine, encode."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from fortis.perturbation.v1 import perturbation_pb2 as pb
from fortis.perturbation.v1 import perturbation_pb2_grpc
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common import errors
from fortis.services.common.codec import array_to_tensor, decode_image, decode_images, image_msg
from fortis.services.common.server import (
    call_metadata,
    current_api_key,
    current_tenant,
    error_from_rpc,
)
from fortis.services.common.status import status_for
from fortis.services.perturbation import engine
from fortis.services.perturbation.catalogue import attack_spec, list_catalogue
from fortis.services.perturbation.proxy_client import ProxyQueryClient
from fortis.services.perturbation.registry import perturbation_spec
from google.protobuf import json_format

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["PerturbationService"].full_name
_KINDS = {"corruption": pb.PERTURBATION_KIND_CORRUPTION,
          "style": pb.PERTURBATION_KIND_STYLE,
          "degradation": pb.PERTURBATION_KIND_DEGRADATION,
          "property": pb.PERTURBATION_KIND_PROPERTY,
          "transfer_attack": pb.PERTURBATION_KIND_TRANSFER_ATTACK,
          "score_attack": pb.PERTURBATION_KIND_SCORE_ATTACK,
          "decision_attack": pb.PERTURBATION_KIND_DECISION_ATTACK}
_LEVEL_KINDS = {None: pb.LEVEL_KIND_UNSPECIFIED, "severity": pb.LEVEL_KIND_SEVERITY,
                "level": pb.LEVEL_KIND_LEVEL, "epsilon": pb.LEVEL_KIND_EPSILON}


def _info(item: dict[str, Any]) -> pb.PerturbationInfo:
    ch = item.get("characterisation")
    return pb.PerturbationInfo(
        id=item["id"], kind=_KINDS[item["kind"]], family=item["family"], ieee_ref=item["ieee_ref"],
        description=item["description"], stochastic=item["stochastic"],
        severities=item["severities"], refs=item["refs"],
        level_kind=_LEVEL_KINDS[item["level_kind"]], levels=item["levels"],
        characterisation=pb.Characterisation(**ch) if ch else None,
        needs_model=item["needs_model"], level_table_doc=item["level_table_doc"],
        parameters=[pb.ParameterSpec(name=p["name"], type=p["type"],
                                     default_json="" if p["default"] is None else json.dumps(p["default"]),
                                     description=p["description"]) for p in item["parameters"]],
        severity_table_json=json.dumps(item["level_table"]))


class PerturbationServicer(perturbation_pb2_grpc.PerturbationServiceServicer):
    def __init__(self, *, proxy_stub: proxy_pb2_grpc.TargetProxyServiceStub | None,
                 surrogate_loader: Callable[[str, str], Any]) -> None:
        self.proxy_stub = proxy_stub
        self.surrogate_loader = surrogate_loader

    def ListPerturbations(self, request: Any, context: Any) -> pb.ListPerturbationsResponse:
        return pb.ListPerturbationsResponse(perturbations=[
            _info(item) for item in list_catalogue()
            if not request.kind or _KINDS[item["kind"]] == request.kind])

    def _apply(self, req: Any) -> list:
        spec = perturbation_spec(req.perturbation_id)
        images = req.images
        arrays = decode_images(images)
        for i, m in enumerate(images):
            if not m.image_id:
                raise errors.InvalidArgument(f"images[{i}].image_id", "image_id is required")
        params = json_format.MessageToDict(req.params) if req.HasField("params") else {}
        level = req.epsilon if spec.level_kind == "epsilon" else req.severity
        surrogate = None
        labels = None
        if spec.needs_model:
            if not req.surrogate:
                raise errors.InvalidArgument("surrogate", f"{spec.id} is white-box: name a surrogate model")
            surrogate = self.surrogate_loader(req.surrogate, "surrogate")
            labels = list(req.labels)
        out = engine.perturb(spec.id, level, req.seed,
                             [(m.image_id, a) for m, a in zip(images, arrays, strict=True)],
                             params=params, surrogate=surrogate, labels=labels)
        return [image_msg(m.image_id, o) for m, o in zip(images, out, strict=True)]

    def ApplyPerturbation(self, request: Any, context: Any) -> pb.ApplyPerturbationResponse:
        return pb.ApplyPerturbationResponse(images=self._apply(request))

    def ApplyPerturbationStream(self, request_iterator: Any, context: Any
                                ) -> Iterator[pb.ApplyPerturbationStreamResponse]:
        for req in request_iterator:
            try:
                yield pb.ApplyPerturbationStreamResponse(request_id=req.request_id,
                                                         images=self._apply(req))
            except errors.FortisError as exc:
                yield pb.ApplyPerturbationStreamResponse(request_id=req.request_id,
                                                         error=status_for(exc))

    def RunAttack(self, request: Any, context: Any) -> Iterator[pb.RunAttackResponse]:
        spec = attack_spec(request.attack_id)
        params = json_format.MessageToDict(request.params) if request.HasField("params") else {}
        items = []
        for i, li in enumerate(request.images):
            if not li.image.image_id:
                raise errors.InvalidArgument(f"images[{i}].image.image_id", "image_id is required")
            items.append(engine.AttackItem(image_id=li.image.image_id,
                                           image=decode_image(li.image, f"images[{i}].image"),
                                           labels=tuple(li.labels)))
        query = surrogate = None
        if spec.is_query_attack:
            query = self._query_client(request, spec.id)
        elif request.surrogate:
            surrogate = self.surrogate_loader(request.surrogate, "surrogate")
        results = engine.run_attack(spec.id, params, request.seed, items, query=query,
                                    surrogate=surrogate)
        for it, r in zip(items, results, strict=True):
            resp = pb.RunAttackResponse(
                image_id=it.image_id, adversarial=image_msg(it.image_id, r.adversarial),
                adversarial_float=array_to_tensor(np.asarray(r.adversarial_float, dtype=np.float32)),
                queries=int(r.queries), linf=float(r.linf), l2=float(r.l2),
                stop_reason=r.stop_reason)
            if r.success is not None:
                resp.success = bool(r.success)
            if r.initially_correct is not None:
                resp.initially_correct = bool(r.initially_correct)
            yield resp

    def _query_client(self, request: Any, attack_id: str) -> ProxyQueryClient:
        if self.proxy_stub is None:
            raise errors.FailedPrecondition("this perturbation service has no proxy configured")
        if not request.proxy_session_id:
            raise errors.InvalidArgument("proxy_session_id", f"{attack_id} is a query attack: open a proxy session and name it")
        md = call_metadata(current_api_key.get(), current_tenant.get())
        try:
            sess = self.proxy_stub.GetSession(
                proxy_pb2.GetSessionRequest(session_id=request.proxy_session_id), metadata=md).session
            info = self.proxy_stub.GetTargetInfo(
                proxy_pb2.GetTargetInfoRequest(target=sess.target), metadata=md).info
        except Exception as exc:  # grpc.RpcError
            raise error_from_rpc(exc) from None  # type: ignore[arg-type]
        return ProxyQueryClient(self.proxy_stub, session_id=request.proxy_session_id,
                                origin=request.origin or attack_id, num_classes=len(info.labels),
                                metadata=md)
