"""gRPC transport of the scoring service: decode, call ``score_classification``, encode."""

from __future__ import annotations

from typing import Any

from fortis.scoring.v1 import scoring_pb2, scoring_pb2_grpc
from fortis.services.common.codec import tensor_to_array
from fortis.services.scoring.catalogue import compute, list_metrics
from fortis.services.scoring.ieee import ClassPrediction, CorrectnessRule
from fortis.services.scoring.outcomes import TestRecord, score_classification
from google.protobuf import json_format, struct_pb2

SERVICE_NAME = scoring_pb2.DESCRIPTOR.services_by_name["ScoringService"].full_name


def _pred(p: Any) -> ClassPrediction:
    return ClassPrediction(labels=tuple(p.labels), scores=tuple(p.scores) if p.scores else None,
                           error=p.error or None)


def _ints(x: Any) -> Any:
    """google.protobuf.Struct carries every number as a double: give integral ones back as
    int, as a JSON parser would (k = 3, not 3.0)."""
    if isinstance(x, dict):
        return {k: _ints(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_ints(v) for v in x]
    if isinstance(x, float) and x.is_integer() and abs(x) < 2**53:
        return int(x)
    return x


class ScoringServicer(scoring_pb2_grpc.ScoringServiceServicer):
    def ScoreClassification(self, request: Any, context: Any) -> scoring_pb2.ScoreClassificationResponse:
        rule = CorrectnessRule.from_dict({"mode": request.rule.mode or "top1",
                                          "k": request.rule.k or 5,
                                          "threshold": request.rule.threshold or 0.5})
        labels = {k: list(v.labels) for k, v in request.labels.items()}
        tests = []
        for t in request.tests:
            ids = [p.image_id for p in t.predictions]
            tests.append(TestRecord(
                kind=t.kind, perturbation_id=t.perturbation_id, severity=t.severity,
                predictions={p.image_id: _pred(p) for p in t.predictions},
                queries=dict(zip(ids, t.queries, strict=False)),
                success=dict(zip(ids, t.success, strict=False)), query_budget=t.query_budget,
                image_ids=tuple(t.image_ids)))
        metrics = score_classification(rule, labels, tests)
        s = struct_pb2.Struct()
        json_format.ParseDict(metrics, s)
        return scoring_pb2.ScoreClassificationResponse(metrics=s)

    def ListMetrics(self, request: Any, context: Any) -> scoring_pb2.ListMetricsResponse:
        return scoring_pb2.ListMetricsResponse(metrics=[
            scoring_pb2.MetricInfo(id=m["id"], refs=m["refs"], description=m["description"],
                                   inputs=[scoring_pb2.MetricInput(**i) for i in m["inputs"]])
            for m in list_metrics()])

    def Compute(self, request: Any, context: Any) -> scoring_pb2.ComputeResponse:
        arrays = {name: tensor_to_array(t, f"arrays.{name}") for name, t in request.arrays.items()}
        params = json_format.MessageToDict(request.params) if request.HasField("params") else {}
        result = compute(request.metric, arrays, _ints(params))
        s = struct_pb2.Struct()
        json_format.ParseDict(result, s)
        return scoring_pb2.ComputeResponse(result=s)
