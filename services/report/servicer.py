"""gRPC transport of the report service: decode, call ``build_report``/``render_html``, encode."""

from __future__ import annotations

import json
from typing import Any

from fortis.report.v1 import report_pb2, report_pb2_grpc
from fortis.services.common.codec import intify
from fortis.services.common.errors import InvalidArgument
from fortis.services.report.render import build_report, render_html
from google.protobuf import json_format

SERVICE_NAME = report_pb2.DESCRIPTOR.services_by_name["ReportService"].full_name
PARTS = ("plan", "plan_text", "target", "tester", "environment", "metrics", "tests", "ledger",
         "evaluation")


class ReportServicer(report_pb2_grpc.ReportServiceServicer):
    def RenderReport(self, request: Any, context: Any) -> report_pb2.RenderReportResponse:
        # Struct numbers are doubles: give counts, seeds and sizes back their integer type.
        parts = intify(json_format.MessageToDict(request.parts)) if request.HasField("parts") else {}
        missing = [p for p in PARTS if p not in parts]
        if missing:
            raise InvalidArgument(f"parts.{missing[0]}", "required report part is missing")
        report = build_report(**{p: parts[p] for p in PARTS})
        return report_pb2.RenderReportResponse(
            report_json=json.dumps(report, indent=2, sort_keys=True), report_html=render_html(report))
