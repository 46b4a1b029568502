"""The evaluation runner's ports over gRPC: clients of the proxy, perturbation, scoring and
report services. Transport only."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import cv2
import grpc
import numpy as np
from fortis.common.v1 import common_pb2
from fortis.perturbation.v1 import perturbation_pb2, perturbation_pb2_grpc
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.report.v1 import report_pb2, report_pb2_grpc
from fortis.scoring.v1 import scoring_pb2, scoring_pb2_grpc
from fortis.services.common import errors
from fortis.services.common.codec import (
    array_to_tensor,
    decode_image,
    image_msg,
    intify,
    ranked_labels_scores,
    tensor_to_array,
)
from fortis.services.common.server import error_from_rpc
from fortis.services.evaluation.ports import AttackOutcome, TargetDescription
from fortis.services.scoring.ieee import ClassPrediction
from google.protobuf import json_format, struct_pb2

_OUTPUT = {common_pb2.OUTPUT_KIND_FULL_SCORES: "full_scores",
           common_pb2.OUTPUT_KIND_TOP_K_SCORES: "top_k",
           common_pb2.OUTPUT_KIND_LABEL_ONLY: "label_only",
           common_pb2.OUTPUT_KIND_BOXES: "boxes", common_pb2.OUTPUT_KIND_MASKS: "masks"}
_TASK = {common_pb2.TASK_TYPE_CLASSIFICATION: "classification",
         common_pb2.TASK_TYPE_DETECTION: "detection",
         common_pb2.TASK_TYPE_SEGMENTATION: "segmentation"}
T = TypeVar("T")


def _call(fn: Any, req: Any, md: Sequence[tuple[str, str]], timeout: float | None = None) -> Any:
    try:
        return fn(req, metadata=md, timeout=timeout)
    except grpc.RpcError as exc:
        raise error_from_rpc(exc) from None


def _per_query(err: errors.FortisError) -> bool:
    """A failed Predict that concerns these images (the target down after the proxy's
    retries, the target refusing the images, an unusable answer), not the evaluation itself
    (unknown session, spent budget, bad credentials)."""
    if isinstance(err, errors.BudgetExhausted | errors.NotFound | errors.Unauthenticated
                  | errors.FailedPrecondition | errors.AlreadyExists):
        return False
    return True


def answer_json(p: common_pb2.Prediction) -> dict[str, Any]:
    """A detection or segmentation answer as stored with the evaluation's items."""
    kind = p.WhichOneof("result")
    if kind == "detection":
        bs = p.detection.boxes
        return {"boxes": [[b.x_min, b.y_min, b.x_max, b.y_max] for b in bs],
                "labels": [int(b.label) for b in bs], "scores": [float(b.score) for b in bs]}
    if kind == "segmentation":
        m = tensor_to_array(p.segmentation.class_map, "segmentation.class_map")
        if m.ndim != 2:
            return {"error": f"class_map must be [height, width], got {list(m.shape)}"}
        m16 = m.astype(np.uint16) if m.max(initial=0) > 255 else m.astype(np.uint8)
        ok, buf = cv2.imencode(".png", m16)
        return {"mask_png": base64.b64encode(buf.tobytes()).decode()} if ok else {"error": "mask encoding failed"}
    return {"error": f"expected a detection or segmentation answer, got {kind or 'nothing'}"}


class GrpcProxy:
    def __init__(self, ch: grpc.Channel, metadata: Sequence[tuple[str, str]],
                 *, batch_limit: int = 256) -> None:
        self.stub = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        self.md = tuple(metadata)
        self.batch_limit = batch_limit

    def target_info(self, target: str) -> TargetDescription:
        info = _call(self.stub.GetTargetInfo, proxy_pb2.GetTargetInfoRequest(target=target), self.md).info
        return TargetDescription(name=info.name, task=_TASK.get(info.task_type, "unspecified"),
                                 labels=tuple(info.labels), output_kind=_OUTPUT.get(info.output_kind, "unspecified"),
                                 top_k=info.top_k, input_height=info.input.height,
                                 input_width=info.input.width, input_channels=info.input.channels,
                                 version=info.version)

    def open_session(self, *, session_id: str, target: str, query_budget: int = 0,
                     per_image_budget: int = 0, description: str = "") -> None:
        _call(self.stub.CreateSession, proxy_pb2.CreateSessionRequest(
            target=target, session_id=session_id, query_budget=query_budget,
            per_image_budget=per_image_budget, description=description), self.md)

    def _predict(self, session_id: str, origin: str, images: Sequence[tuple[str, np.ndarray]],
                 answer: Callable[[common_pb2.Prediction], T], failed: Callable[[str], T]) -> list[T]:
        """Predict through the proxy in batches. A failed call that concerns its images (the
        target down after the proxy's retries, refusing the images, or answering something
        unusable) gives per-query errors -- recorded in the ledger, scored as incorrect,
        shown in the report; any other failure ends the evaluation."""
        out: list[T] = []
        for s in range(0, len(images), self.batch_limit):
            part = images[s:s + self.batch_limit]
            req = proxy_pb2.PredictRequest(session_id=session_id, origin=origin,
                                           images=[image_msg(i, im) for i, im in part])
            try:
                resp = self.stub.Predict(req, metadata=self.md, timeout=300)
            except grpc.RpcError as exc:
                err = error_from_rpc(exc)
                if _per_query(err):
                    out += [failed(str(err)) for _ in part]
                    continue
                raise err from None
            out += [answer(p) for p in resp.predictions]
        return out

    def predict(self, *, session_id: str, origin: str,
                images: Sequence[tuple[str, np.ndarray]]) -> list[ClassPrediction]:
        def answer(p: common_pb2.Prediction) -> ClassPrediction:
            labels, scores = ranked_labels_scores(p)
            return ClassPrediction(labels=labels, scores=scores)
        return self._predict(session_id, origin, images, answer,
                             lambda e: ClassPrediction(labels=(), scores=None, error=e))

    def predict_answers(self, *, session_id: str, origin: str,
                        images: Sequence[tuple[str, np.ndarray]]) -> list[dict[str, Any]]:
        return self._predict(session_id, origin, images, answer_json, lambda e: {"error": e})

    def session_queries(self, session_id: str) -> tuple[int, dict[str, int]]:
        st = _call(self.stub.GetSessionStats, proxy_pb2.GetSessionStatsRequest(session_id=session_id), self.md)
        return int(st.queries_ok), {i.image_id: int(i.queries) for i in st.images}


class GrpcPerturbation:
    def __init__(self, ch: grpc.Channel, metadata: Sequence[tuple[str, str]]) -> None:
        self.stub = perturbation_pb2_grpc.PerturbationServiceStub(ch)
        self.md = tuple(metadata)

    def corrupt(self, corruption_id: str, severity: int, seed: int,
                images: Sequence[tuple[str, np.ndarray]],
                params: Mapping[str, Any] | None = None, *, surrogate: str = "",
                labels: Sequence[int] | None = None) -> list[np.ndarray]:
        req = perturbation_pb2.ApplyPerturbationRequest(
            perturbation_id=corruption_id, severity=severity, seed=seed,
            images=[image_msg(i, im) for i, im in images], surrogate=surrogate,
            labels=[int(x) for x in labels or ()])
        if params:
            json_format.ParseDict(json.loads(json.dumps(dict(params))), req.params)
        resp = _call(self.stub.ApplyPerturbation, req, self.md, 600)
        return [decode_image(m, f"images[{k}]") for k, m in enumerate(resp.images)]

    def attack(self, attack_id: str, params: Mapping[str, Any], seed: int,
               images: Sequence[tuple[str, np.ndarray, Sequence[int]]], *,
               session_id: str = "", origin: str = "", surrogate: str = "") -> list[AttackOutcome]:
        s = struct_pb2.Struct()
        json_format.ParseDict(json.loads(json.dumps(dict(params))), s)
        req = perturbation_pb2.RunAttackRequest(
            attack_id=attack_id, params=s, seed=seed, proxy_session_id=session_id,
            origin=origin, surrogate=surrogate,
            images=[perturbation_pb2.LabeledImage(image=image_msg(i, im), labels=list(lab))
                    for i, im, lab in images])
        outs = []
        try:
            for r in self.stub.RunAttack(req, metadata=self.md, timeout=3600):
                outs.append(AttackOutcome(
                    image_id=r.image_id, adversarial=decode_image(r.adversarial, "adversarial"),
                    adversarial_float=tensor_to_array(r.adversarial_float, "adversarial_float"),
                    success=r.success if r.HasField("success") else None, queries=int(r.queries),
                    linf=r.linf, l2=r.l2, stop_reason=r.stop_reason,
                    initially_correct=r.initially_correct if r.HasField("initially_correct") else None))
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return outs


class GrpcScoring:
    def __init__(self, ch: grpc.Channel, metadata: Sequence[tuple[str, str]]) -> None:
        self.stub = scoring_pb2_grpc.ScoringServiceStub(ch)
        self.md = tuple(metadata)

    def score(self, *, rule: Mapping[str, Any], labels: Mapping[str, Sequence[int]],
              tests: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        req = scoring_pb2.ScoreClassificationRequest(
            rule=scoring_pb2.CorrectnessRule(mode=rule["mode"], k=int(rule["k"]),
                                             threshold=float(rule["threshold"])),
            labels={k: scoring_pb2.LabelSet(labels=list(v)) for k, v in labels.items()})
        for t in tests:
            preds = t.get("predictions", {})
            to = scoring_pb2.TestOutcomes(kind=t["kind"], perturbation_id=t.get("perturbation_id", ""),
                                          severity=int(t.get("severity", 0)),
                                          query_budget=int(t.get("query_budget", 0)),
                                          image_ids=list(t.get("image_ids", ())))
            if "success" in t:
                for image_id, ok in t["success"].items():
                    to.predictions.add(image_id=image_id)
                    to.success.append(bool(ok))
                    to.queries.append(int(t["queries"].get(image_id, 0)))
            for image_id, p in preds.items():
                to.predictions.add(image_id=image_id, labels=p["labels"], scores=p["scores"] or [],
                                   error=p.get("error") or "")
            req.tests.append(to)
        resp = _call(self.stub.ScoreClassification, req, self.md, 600)
        return intify(json_format.MessageToDict(resp.metrics))

    def compute(self, metric: str, arrays: Mapping[str, np.ndarray],
                params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        req = scoring_pb2.ComputeRequest(metric=metric)
        for name, arr in arrays.items():
            req.arrays[name].CopyFrom(array_to_tensor(np.asarray(arr)))
        if params:
            json_format.ParseDict(json.loads(json.dumps(dict(params))), req.params)
        resp = _call(self.stub.Compute, req, self.md, 600)
        return json_format.MessageToDict(resp.result)


class GrpcReport:
    def __init__(self, ch: grpc.Channel, metadata: Sequence[tuple[str, str]]) -> None:
        self.stub = report_pb2_grpc.ReportServiceStub(ch)
        self.md = tuple(metadata)

    def render(self, parts: Mapping[str, Any]) -> tuple[str, str]:
        s = struct_pb2.Struct()
        json_format.ParseDict(json.loads(json.dumps(parts, default=str)), s)
        resp = _call(self.stub.RenderReport, report_pb2.RenderReportRequest(parts=s), self.md, 600)
        report = intify(json.loads(resp.report_json))
        return json.dumps(report, indent=2, sort_keys=True), resp.report_html
