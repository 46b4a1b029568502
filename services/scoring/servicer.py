"""gRPC transport of the scoring service: decode, call ``score_classification``, encode."""

from __future__ import annotations

from typing import Any

from fortis.scoring.v1 import scoring_pb2, scoring_pb2_grpc
from fortis.services.scoring.ieee import ClassPrediction, CorrectnessRule
from fortis.services.scoring.outcomes import TestRecord, score_classification
from google.protobuf import json_format, struct_pb2

SERVICE_NAME = scoring_pb2.DESCRIPTOR.services_by_name["ScoringService"].full_name


def _pred(p: Any) -> ClassPrediction:
    return ClassPrediction(labels=tuple(p.labels), scores=tuple(p.scores) if p.scores else None,
                           error=p.error or None)


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
