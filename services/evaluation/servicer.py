"""gRPC transport of the evaluation service: decode, call ``EvaluationManager``, encode."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fortis.evaluation.v1 import evaluation_pb2 as pb
from fortis.evaluation.v1 import evaluation_pb2_grpc
from fortis.services.common import errors
from fortis.services.common.server import current_tenant
from fortis.services.evaluation.service import EvaluationManager
from fortis.services.evaluation.store import FINAL_STATES, EvaluationRow
from google.protobuf import timestamp_pb2
from google.rpc import code_pb2, status_pb2

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EvaluationService"].full_name
_STATES = {"PENDING": pb.EVALUATION_STATE_PENDING, "RUNNING": pb.EVALUATION_STATE_RUNNING,
           "SUCCEEDED": pb.EVALUATION_STATE_SUCCEEDED, "FAILED": pb.EVALUATION_STATE_FAILED,
           "CANCELLED": pb.EVALUATION_STATE_CANCELLED}
_FORMATS = {pb.PLAN_FORMAT_UNSPECIFIED: "", pb.PLAN_FORMAT_YAML: "yaml", pb.PLAN_FORMAT_JSON: "json"}
_ERROR_CODES = {"InvalidArgument": code_pb2.INVALID_ARGUMENT, "NotFound": code_pb2.NOT_FOUND,
                "FailedPrecondition": code_pb2.FAILED_PRECONDITION,
                "Unavailable": code_pb2.UNAVAILABLE, "BudgetExhausted": code_pb2.RESOURCE_EXHAUSTED}


def _ts(t: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(t * 1e9))
    return ts


def to_proto(row: EvaluationRow) -> pb.Evaluation:
    ev = pb.Evaluation(
        evaluation_id=row.evaluation_id, tenant=row.tenant, state=_STATES[row.state],
        progress=pb.Progress(stage=row.stage, items_done=row.items_done,
                             items_total=row.items_total, queries=row.queries, message=row.message),
        plan_text=row.plan_text, plan_name=row.plan_name, create_time=_ts(row.created_at),
        update_time=_ts(row.updated_at), resumed_count=row.resumed_count,
        summary_json=row.summary_json)
    if row.state == "FAILED":
        ev.error.CopyFrom(status_pb2.Status(code=_ERROR_CODES.get(row.error_code, code_pb2.INTERNAL),
                                            message=row.error_message))
    return ev


class EvaluationServicer(evaluation_pb2_grpc.EvaluationServiceServicer):
    def __init__(self, manager: EvaluationManager, *, watch_poll_s: float = 1.0) -> None:
        self.manager = manager
        self.watch_poll_s = watch_poll_s

    def CreateEvaluation(self, request: Any, context: Any) -> pb.CreateEvaluationResponse:
        row = self.manager.create(tenant=current_tenant.get(), plan_text=request.plan,
                                  fmt=_FORMATS.get(request.format, ""),
                                  evaluation_id=request.evaluation_id)
        return pb.CreateEvaluationResponse(evaluation=to_proto(row))

    def GetEvaluation(self, request: Any, context: Any) -> pb.GetEvaluationResponse:
        return pb.GetEvaluationResponse(evaluation=to_proto(
            self.manager.get(current_tenant.get(), request.evaluation_id)))

    def ListEvaluations(self, request: Any, context: Any) -> pb.ListEvaluationsResponse:
        size = request.page_size or 50
        if not 1 <= size <= 1000:
            raise errors.InvalidArgument("page_size", "must be in 1..1000")
        before = None
        if request.page_token:
            try:
                before = float(request.page_token)
            except ValueError:
                raise errors.InvalidArgument("page_token", "not a token from a previous response") from None
        rows = self.manager.store.list(current_tenant.get(), limit=size + 1, before=before)
        more = len(rows) > size
        rows = rows[:size]
        return pb.ListEvaluationsResponse(
            evaluations=[to_proto(r) for r in rows],
            next_page_token=repr(rows[-1].created_at) if more and rows else "")

    def CancelEvaluation(self, request: Any, context: Any) -> pb.CancelEvaluationResponse:
        return pb.CancelEvaluationResponse(evaluation=to_proto(
            self.manager.cancel(current_tenant.get(), request.evaluation_id)))

    def WatchEvaluation(self, request: Any, context: Any) -> Iterator[pb.WatchEvaluationResponse]:
        tenant = current_tenant.get()
        store = self.manager.store
        version = store.version
        row = self.manager.get(tenant, request.evaluation_id)
        last = None
        while context.is_active():
            key = (row.state, row.stage, row.items_done, row.items_total, row.queries, row.message)
            if key != last:
                yield pb.WatchEvaluationResponse(evaluation=to_proto(row))
                last = key
            if row.state in FINAL_STATES:
                return
            with store.changed:
                store.changed.wait_for(lambda v=version: store.version != v,
                                       timeout=self.watch_poll_s)
                version = store.version
            row = self.manager.get(tenant, request.evaluation_id)

    def GetEvaluationReport(self, request: Any, context: Any) -> pb.GetEvaluationReportResponse:
        row = self.manager.get(current_tenant.get(), request.evaluation_id)
        if row.state != "SUCCEEDED":
            raise errors.FailedPrecondition(f"evaluation '{row.evaluation_id}' has no report yet (state {row.state})")
        js, html = self.manager.store.report(row.evaluation_id)
        return pb.GetEvaluationReportResponse(report_json=js, report_html=html)
