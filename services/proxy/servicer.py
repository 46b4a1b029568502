"""gRPC transport of the target-proxy service: decode, call ``TargetProxy``, encode.

Every ledger read names the caller's tenant: sessions, stats and
entries of another tenant are never seen, whatever the id.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fortis.common.v1 import common_pb2
from fortis.infra.serving.call_context import current_internal, current_tenant
from fortis.infra.serving.memory import check_answer, holding
from fortis.infra.serving.status import status_for
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common import errors, limits
from fortis.services.common.codec import add_messages
from fortis.services.common.limits import SEGMENTATION_ANSWER_BYTES_PER_PIXEL
from fortis.services.common.pagination import (
    decode_token,
    encode_token,
    page_of,
    page_size,
    tenant_list,
)
from fortis.services.common.stopping import caller_stop
from fortis.services.proxy.ledger import SessionRecord
from fortis.services.proxy.proxy import TargetProxy
from google.protobuf import timestamp_pb2
from google.rpc import code_pb2

SERVICE_NAME = proxy_pb2.DESCRIPTOR.services_by_name["TargetProxyService"].full_name


def _code(name: str) -> int:
    """A ledger row's status name as the google.rpc.Code enum: UNKNOWN for a row still
    ``IN_FLIGHT`` (reserved, no outcome recorded; its ``error`` says so) and for names that
    are not code names."""
    try:
        return int(code_pb2.Code.Value(name))
    except ValueError:
        return code_pb2.UNKNOWN


def _ts(t: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(t * 1e9))
    return ts


class TargetProxyServicer(proxy_pb2_grpc.TargetProxyServiceServicer):
    def __init__(self, proxy: TargetProxy) -> None:
        self.proxy = proxy

    def _session_msg(self, rec: SessionRecord) -> proxy_pb2.Session:
        return proxy_pb2.Session(
            session_id=rec.session_id, tenant=rec.tenant, target=rec.target,
            query_budget=rec.query_budget, per_image_budget=rec.per_image_budget,
            queries_used=self.proxy.queries_used(rec.tenant, rec.session_id),
            description=rec.description, create_time=_ts(rec.created_at))

    def ListTargets(self, request: Any, context: Any) -> proxy_pb2.ListTargetsResponse:
        size = page_size(request.page_size, default=100, maximum=1000)
        # Only the targets the caller may use; the others do not exist for it.
        tenant = current_tenant.get()
        targets = self.proxy.visible_targets(tenant)
        page, token = page_of(targets, tenant_list("targets", tenant), size, request.page_token)
        return proxy_pb2.ListTargetsResponse(targets=[
            proxy_pb2.TargetSummary(name=t.name, images_per_second=t.limiter.limit,
                                    price_per_1000=t.price_per_1000)
            for t in page], next_page_token=token)

    def GetTenantUsage(self, request: Any, context: Any) -> proxy_pb2.GetTenantUsageResponse:
        # the caller's own tenant only: no field names another
        tenant = current_tenant.get()
        today, per_day = self.proxy.daily_quotas.usage(tenant)
        return proxy_pb2.GetTenantUsageResponse(
            queries_today=today, queries_per_day=per_day,
            images_per_second=self.proxy.tenant_limits.rate_of(tenant))

    def GetBuiltinTargets(self, request: Any, context: Any
                           ) -> proxy_pb2.GetBuiltinTargetsResponse:
        if not current_internal.get():
            raise errors.PermissionDenied("GetBuiltinTargets is for Fortis's own services "
                                          "(the internal service key)")
        return proxy_pb2.GetBuiltinTargetsResponse(models=[
            proxy_pb2.BuiltinModelTargets(model=m, targets=names)
            for m, names in sorted(self.proxy.builtin_targets().items())])

    def GetTargetInfo(self, request: Any, context: Any) -> proxy_pb2.GetTargetInfoResponse:
        return proxy_pb2.GetTargetInfoResponse(
            info=self.proxy.target_info(request.target, current_tenant.get()))

    def CreateSession(self, request: Any, context: Any) -> proxy_pb2.CreateSessionResponse:
        rec = self.proxy.create_session(
            tenant=current_tenant.get(), target=request.target, session_id=request.session_id,
            query_budget=request.query_budget, per_image_budget=request.per_image_budget,
            description=request.description)
        return proxy_pb2.CreateSessionResponse(session=self._session_msg(rec))

    def GetSession(self, request: Any, context: Any) -> proxy_pb2.GetSessionResponse:
        rec = self.proxy.session(current_tenant.get(), request.session_id)
        return proxy_pb2.GetSessionResponse(session=self._session_msg(rec))

    def _check_answer(self, tenant: str, request: Any) -> None:
        """A segmentation target answers per pixel: an answer past the largest message is
        refused before anything is sent to the target (or charged to the session)."""
        if not request.images or not request.session_id:
            return                      # predict names what is missing
        rec = self.proxy.session_record(tenant, request.session_id)
        if self.proxy.task_type(rec.target, tenant) == common_pb2.TASK_TYPE_SEGMENTATION:
            check_answer(request, SEGMENTATION_ANSWER_BYTES_PER_PIXEL)

    def Predict(self, request: Any, context: Any) -> proxy_pb2.PredictResponse:
        self._check_answer(current_tenant.get(), request)
        res = self.proxy.predict(tenant=current_tenant.get(), session_id=request.session_id,
                                 origin=request.origin, images=request.images,
                                 should_stop=caller_stop(context.is_active,
                                                         context.time_remaining))
        resp = proxy_pb2.PredictResponse(queries_left=res.queries_left)
        add_messages(resp.predictions, res.predictions)     # CopyFrom: fast (codec)
        return resp

    def PredictStream(self, request_iterator: Any, context: Any
                      ) -> Iterator[proxy_pb2.PredictStreamResponse]:
        tenant = current_tenant.get()
        should_stop = caller_stop(context.is_active, context.time_remaining)
        for req in request_iterator:
            try:
                limits.check_message(req)   # in band: the stream goes on
                with holding(req):          # its decoded size, held while it is answered
                    self._check_answer(tenant, req)
                    res = self.proxy.predict(tenant=tenant, session_id=req.session_id,
                                             origin=req.origin, images=req.images,
                                             should_stop=should_stop)
                resp = proxy_pb2.PredictStreamResponse(request_id=req.request_id,
                                                       queries_left=res.queries_left)
                add_messages(resp.predictions, res.predictions)
                yield resp
            except errors.FortisError as exc:
                yield proxy_pb2.PredictStreamResponse(request_id=limits.echoed_id(req.request_id),
                                                      error=status_for(exc))

    def GetSessionStats(self, request: Any, context: Any) -> proxy_pb2.GetSessionStatsResponse:
        rec = self.proxy.session(current_tenant.get(), request.session_id)
        st = self.proxy.ledger.stats(rec.session_id, rec.tenant)
        today, per_day = self.proxy.daily_quotas.usage(rec.tenant)
        return proxy_pb2.GetSessionStatsResponse(
            session=self._session_msg(rec), queries_ok=st.queries_ok,
            queries_failed=st.queries_failed, calls_refused=st.calls_refused,
            images=[proxy_pb2.ImageQueryCount(image_id=k, queries=v[0], failed=v[1],
                                              attempts=st.per_image_attempts.get(k, 0))
                    for k, v in sorted(st.per_image.items())],
            origins=[proxy_pb2.OriginQueryCount(origin=k, queries=v[0], failed=v[1])
                     for k, v in sorted(st.per_origin.items())],
            latency_p50_ms=st.latency_p50_ms, queries_attempted=st.attempts,
            queries_in_flight=st.in_flight, tenant_queries_today=today,
            tenant_queries_per_day=per_day)

    def ListLedgerEntries(self, request: Any, context: Any
                          ) -> proxy_pb2.ListLedgerEntriesResponse:
        rec = self.proxy.session(current_tenant.get(), request.session_id)
        size = page_size(request.page_size, default=1000, maximum=10000)
        after = 0
        kind = tenant_list("ledger", rec.tenant)     # A's token is not B's
        if request.page_token:
            pos = decode_token(request.page_token, kind, {"s": str, "e": int})
            if pos["s"] != rec.session_id[:256]:
                raise errors.InvalidArgument(
                    "page_token", "not a page token from a previous response of this list")
            after = pos["e"]
        rows = self.proxy.ledger.entries(rec.session_id, tenant=rec.tenant, after_id=after,
                                         limit=size + 1)
        more = len(rows) > size
        rows = rows[:size]
        return proxy_pb2.ListLedgerEntriesResponse(
            entries=[proxy_pb2.LedgerEntry(
                entry_id=r[0], tenant=r[1], session_id=r[2], target=r[3], origin=r[4],
                image_id=r[5], input_sha256=r[6], output_summary=r[7], latency_ms=r[8],
                status=_code(r[9]), error=r[10], send_time=_ts(r[11]), call_id=r[12],
                attempts=r[13])
                for r in rows],
            next_page_token=encode_token(kind, s=rec.session_id[:256], e=rows[-1][0])
            if more and rows else "")
