"""gRPC transport of the evaluation service: decode, call ``EvaluationManager``, encode.

The one place converting evaluation rows to ``fortis.evaluation.v1`` messages. Every
evaluation is read in the caller's tenant namespace."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from fortis.evaluation.v1 import evaluation_pb2 as pb
from fortis.evaluation.v1 import evaluation_pb2_grpc
from fortis.infra.serving.call_context import current_tenant
from fortis.services.common import errors
from fortis.services.common.pagination import decode_token, encode_token, page_size, tenant_list
from fortis.services.evaluation.estimate import FIXED, UPPER_BOUND, QueryEstimate
from fortis.services.evaluation.service import EvaluationManager
from fortis.services.evaluation.store import FINAL_STATES, EvaluationRow
from google.protobuf import timestamp_pb2
from google.rpc import code_pb2, status_pb2

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EvaluationService"].full_name
_STATES = {"PENDING": pb.EVALUATION_STATE_PENDING, "RUNNING": pb.EVALUATION_STATE_RUNNING,
           "SUCCEEDED": pb.EVALUATION_STATE_SUCCEEDED, "FAILED": pb.EVALUATION_STATE_FAILED,
           "CANCELLED": pb.EVALUATION_STATE_CANCELLED}
_STAGES = {"plan": pb.STAGE_PLAN, "clean": pb.STAGE_CLEAN, "corruptions": pb.STAGE_CORRUPTIONS,
           "degradation": pb.STAGE_DEGRADATION, "transfer_attacks": pb.STAGE_TRANSFER_ATTACKS,
           "query_attacks": pb.STAGE_QUERY_ATTACKS, "scoring": pb.STAGE_SCORING,
           "report": pb.STAGE_REPORT, "done": pb.STAGE_DONE}
_FORMATS = {pb.PLAN_FORMAT_UNSPECIFIED: "", pb.PLAN_FORMAT_YAML: "yaml", pb.PLAN_FORMAT_JSON: "json"}
_PAGE = "evaluations"
#: A watcher hears from a running evaluation at least this often (a heartbeat).
HEARTBEAT_S = 5.0


def _ts(t: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(t * 1e9))
    return ts


def _summary(row: EvaluationRow) -> pb.EvaluationSummary | None:
    if not row.summary_json:
        return None
    d = json.loads(row.summary_json)
    s = pb.EvaluationSummary(m=int(d.get("m") or 0),
                             failed_settings=[str(x) for x in d.get("failed_settings") or ()])
    for key in ("accuracy", "average_robustness_corr", "average_robustness_adv"):
        if d.get(key) is not None:
            setattr(s, key, float(d[key]))
    return s


def to_proto(row: EvaluationRow) -> pb.Evaluation:
    ev = pb.Evaluation(
        evaluation_id=row.evaluation_id, tenant=row.tenant, state=_STATES[row.state],
        progress=pb.Progress(stage=_STAGES.get(row.stage, pb.STAGE_UNSPECIFIED),
                             items_done=row.items_done, items_total=row.items_total,
                             queries=row.queries, message=row.message,
                             images_done=row.images_done, images_total=row.images_total),
        plan_text=row.plan_text, plan_name=row.plan_name, create_time=_ts(row.created_at),
        update_time=_ts(row.updated_at), resumed_count=row.resumed_count)
    summary = _summary(row)
    if summary is not None:
        ev.summary.CopyFrom(summary)
    if row.state == "FAILED":
        if row.error_status:
            ev.error.ParseFromString(row.error_status)
        else:
            ev.error.CopyFrom(status_pb2.Status(code=code_pb2.INTERNAL, message=row.error_message))
    return ev


_COUNT_KINDS = {FIXED: pb.QUERY_COUNT_KIND_FIXED, UPPER_BOUND: pb.QUERY_COUNT_KIND_UPPER_BOUND}


def estimate_to_proto(est: QueryEstimate) -> pb.QueryEstimate:
    msg = pb.QueryEstimate(
        images=est.images, batch_size=est.batch_size, fixed=est.fixed,
        upper_bound=est.upper_bound, expected_from=est.expected_from,
        tenant_queries_today=est.tenant_queries_today,
        tenant_queries_per_day=est.tenant_queries_per_day,
        settings=[pb.SettingQueryEstimate(
            stage=s.stage, setting=s.setting, kind=_COUNT_KINDS[s.kind], images=s.images,
            per_image=s.per_image, fixed=s.fixed, upper_bound=s.upper_bound,
            expected=s.expected, target=s.target) for s in est.settings],
        durations=[pb.DurationEstimate(limit=d.limit, rate=d.rate, unit=d.unit,
                                       seconds_fixed=d.seconds_fixed,
                                       seconds_upper_bound=d.seconds_upper_bound)
                   for d in est.durations])
    if est.expected is not None:
        msg.expected = est.expected
    if est.price is not None:
        msg.price.CopyFrom(pb.PriceEstimate(per_1000=est.price.per_1000, source=est.price.source,
                                            fixed=est.price.fixed,
                                            upper_bound=est.price.upper_bound))
    return msg


class EvaluationServicer(evaluation_pb2_grpc.EvaluationServiceServicer):
    def __init__(self, manager: EvaluationManager, *, watch_poll_s: float = 1.0,
                 heartbeat_s: float = HEARTBEAT_S) -> None:
        self.manager = manager
        self.watch_poll_s = watch_poll_s
        self.heartbeat_s = heartbeat_s

    def ValidatePlan(self, request: Any, context: Any) -> pb.ValidatePlanResponse:
        tenant, fmt = current_tenant.get(), _FORMATS.get(request.format, "")
        plan = self.manager.validate(tenant=tenant, plan_text=request.plan, fmt=fmt)
        est = self.manager.estimate(tenant=tenant, plan=plan, plan_text=request.plan, fmt=fmt)
        return pb.ValidatePlanResponse(plan_name=plan.name, corruptions=len(plan.corruptions),
                                       attacks=len(plan.attacks),
                                       degradation_operators=len(plan.degradation),
                                       estimate=estimate_to_proto(est))

    def CreateEvaluation(self, request: Any, context: Any) -> pb.CreateEvaluationResponse:
        row = self.manager.create(tenant=current_tenant.get(), plan_text=request.plan,
                                  fmt=_FORMATS.get(request.format, ""),
                                  evaluation_id=request.evaluation_id)
        return pb.CreateEvaluationResponse(evaluation=to_proto(row))

    def GetEvaluation(self, request: Any, context: Any) -> pb.GetEvaluationResponse:
        return pb.GetEvaluationResponse(evaluation=to_proto(
            self.manager.get(current_tenant.get(), request.evaluation_id)))

    def ListEvaluations(self, request: Any, context: Any) -> pb.ListEvaluationsResponse:
        size = page_size(request.page_size, default=50, maximum=1000)
        tenant = current_tenant.get()
        kind = tenant_list(_PAGE, tenant)       # one tenant's token is not another's
        after = None
        if request.page_token:
            pos = decode_token(request.page_token, kind, {"t": float, "id": str})
            after = (pos["t"], pos["id"])
        rows = self.manager.store.list(tenant, limit=size + 1, after=after)
        more = len(rows) > size
        rows = rows[:size]
        token = encode_token(kind, t=rows[-1].created_at, id=rows[-1].evaluation_id) \
            if more and rows else ""
        return pb.ListEvaluationsResponse(evaluations=[to_proto(r) for r in rows],
                                          next_page_token=token)

    def CancelEvaluation(self, request: Any, context: Any) -> pb.CancelEvaluationResponse:
        return pb.CancelEvaluationResponse(evaluation=to_proto(
            self.manager.cancel(current_tenant.get(), request.evaluation_id)))

    def WatchEvaluation(self, request: Any, context: Any) -> Iterator[pb.WatchEvaluationResponse]:
        tenant = current_tenant.get()
        store = self.manager.store
        version = store.version
        row = self.manager.get(tenant, request.evaluation_id)
        last = None
        sent_at = 0.0
        while context.is_active():
            key = (row.state, row.stage, row.items_done, row.items_total, row.images_done,
                   row.queries, row.message)
            now = time.monotonic()
            if key != last or now - sent_at >= self.heartbeat_s:
                yield pb.WatchEvaluationResponse(evaluation=to_proto(row), heartbeat=key == last)
                last, sent_at = key, now
            if row.state in FINAL_STATES:
                return
            if self.manager.closed:     # SIGTERM: end now, the client watches again
                raise errors.Unavailable("the server is shutting down; the evaluation stays "
                                         f"{row.state} and resumes when the service is back "
                                         "(watch it again)")
            with store.changed:
                store.changed.wait_for(lambda v=version: store.version != v,
                                       timeout=min(self.watch_poll_s, self.heartbeat_s))
                version = store.version
            row = self.manager.get(tenant, request.evaluation_id)

    def GetEvaluationReport(self, request: Any, context: Any) -> pb.GetEvaluationReportResponse:
        row = self.manager.get(current_tenant.get(), request.evaluation_id)
        if row.state != "SUCCEEDED":
            raise errors.FailedPrecondition(f"evaluation '{row.evaluation_id}' has no report yet (state {row.state})")
        js, html = self.manager.store.for_tenant(row.tenant).report(row.evaluation_id)
        return pb.GetEvaluationReportResponse(report_json=js, report_html=html)
