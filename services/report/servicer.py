"""gRPC transport of the report service: typed parts -> report document -> JSON and HTML.

Decode nothing by hand: ``convert.build_report`` reads the typed ``ReportParts`` (and raises
``InvalidArgument`` naming the bad field, which the server's interceptor turns into
INVALID_ARGUMENT with a BadRequest detail); ``render`` writes the two texts.
"""

from __future__ import annotations

from typing import Any

from fortis.infra.serving.call_context import in_work_slot
from fortis.report.v1 import report_pb2, report_pb2_grpc
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.stopping import caller_stop, raise_if_stopped
from fortis.services.report.convert import build_report
from fortis.services.report.render import render_html, report_json

SERVICE_NAME = report_pb2.DESCRIPTOR.services_by_name["ReportService"].full_name


class ReportServicer(report_pb2_grpc.ReportServiceServicer):
    """Renders a report from what one call sends; keeps nothing."""

    def RenderReport(self, request: report_pb2.RenderReportRequest,
                     context: Any) -> report_pb2.RenderReportResponse:
        if not request.HasField("parts"):
            raise InvalidArgument("parts", "the report parts are required")
        stop = caller_stop(context.is_active, context.time_remaining)

        def render() -> tuple[str, str]:
            report = build_report(request.parts)
            raise_if_stopped(stop, "the report")    # the caller's deadline
            text = report_json(report)
            raise_if_stopped(stop, "the report")
            return text, render_html(report)
        # rendering a large report: in the tenant's share of the CPU
        text, html = in_work_slot(context, render)
        return report_pb2.RenderReportResponse(report_json=text, report_html=html)
