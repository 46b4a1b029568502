"""RenderReport over real gRPC on loopback (the full stack of tests/conftest.py): typed
ReportParts in, report.json with real ints and an escaped, self-contained report.html out;
malformed requests get INVALID_ARGUMENT naming the field (never INTERNAL) and the service
keeps serving."""

from __future__ import annotations

import json
import math

import grpc
import pytest
from fortis.report.v1 import report_pb2, report_pb2_grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from tests.conftest import MD
from tests.unit.report_parts import QUERY, make_parts


def _fields(exc: grpc.RpcError) -> list[str]:
    st = rpc_status.from_call(exc)  # type: ignore[arg-type]
    assert st is not None
    for d in st.details:
        br = error_details_pb2.BadRequest()
        if d.Unpack(br):
            return [v.field for v in br.field_violations]
    raise AssertionError("no BadRequest detail")


@pytest.fixture()
def rp(channel: grpc.Channel) -> report_pb2_grpc.ReportServiceStub:
    return report_pb2_grpc.ReportServiceStub(channel)


def test_render_report_over_grpc(rp: report_pb2_grpc.ReportServiceStub) -> None:
    resp = rp.RenderReport(report_pb2.RenderReportRequest(parts=make_parts(transfer="<script>")),
                           metadata=MD)
    report = json.loads(resp.report_json)
    assert report["schema_version"] == "fortis.report/v1"
    m = report["metrics"]
    assert m["accuracy"]["m"] == 6 and type(m["accuracy"]["m"]) is int
    assert type(m["attacks"][QUERY]["query_budget"]) is int
    assert type(report["ledger"]["total_queries"]) is int
    assert type(report["environment"]["seed"]) is int
    assert isinstance(m["accuracy"]["value"], float)
    assert set(m["attacks"]) == {"<script>", QUERY}
    assert report["evaluation"]["started_at"] == "2025-01-02T10:00:00+00:00"
    page = resp.report_html
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page.lower() and "&lt;script&gt;" in page
    assert "default-src 'none'" in page


@pytest.mark.parametrize(("request_", "field"), [
    (report_pb2.RenderReportRequest(), "parts"),
    (report_pb2.RenderReportRequest(parts=report_pb2.ReportParts(plan_text="seed: 1\n")),
     "parts.target"),
])
def test_malformed_request_is_invalid_argument_naming_the_field(
        rp: report_pb2_grpc.ReportServiceStub, request_: report_pb2.RenderReportRequest,
        field: str) -> None:
    with pytest.raises(grpc.RpcError) as ei:
        rp.RenderReport(request_, metadata=MD)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _fields(ei.value) == [field]


def test_bad_parts_deep_in_the_tree_and_the_service_keeps_serving(
        rp: report_pb2_grpc.ReportServiceStub) -> None:
    for mutate, field in [
        (lambda p: p.metrics.ClearField("ieee"), "parts.metrics.ieee"),
        (lambda p: p.tests[4].ClearField("kind"), "parts.tests[4].kind"),
        (lambda p: setattr(p, "plan_text", "[1, 2]"), "parts.plan_text"),
        (lambda p: p.metrics.ieee.accuracy.ClearField("ci95_low"),
         "parts.metrics.ieee.accuracy.ci95_low"),
        # per-image outcomes of the wrong length: refused, never written half-true
        (lambda p: (p.outcomes.image_ids.extend(["a", "b"]),
                    p.outcomes.settings.add(kind="clean", outcomes="1")),
         "parts.outcomes.settings[0].outcomes"),
    ]:
        parts = make_parts()
        mutate(parts)
        with pytest.raises(grpc.RpcError) as ei:
            rp.RenderReport(report_pb2.RenderReportRequest(parts=parts), metadata=MD)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert _fields(ei.value) == [field]
        assert field in (ei.value.details() or "")
    ok = rp.RenderReport(report_pb2.RenderReportRequest(parts=make_parts()), metadata=MD)
    assert json.loads(ok.report_json)["evaluation"]["id"] == "ev-42"


def test_render_report_needs_an_api_key(rp: report_pb2_grpc.ReportServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as ei:
        rp.RenderReport(report_pb2.RenderReportRequest(parts=make_parts()))
    assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED


def _float_fields(msg, path=""):  # type: ignore[no-untyped-def]
    """(message, field name, path) of every float/double set in ``msg``, recursively."""
    from google.protobuf.descriptor import FieldDescriptor as FD
    for fd, value in msg.ListFields():
        p = f"{path}.{fd.name}" if path else fd.name
        if fd.type in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT) and not fd.is_repeated:
            yield msg, fd.name, p
        elif fd.message_type is not None and not fd.message_type.GetOptions().map_entry:
            for i, sub in enumerate(value if fd.is_repeated else [value]):
                yield from _float_fields(sub, f"{p}[{i}]" if fd.is_repeated else p)


def test_non_finite_numbers_anywhere_in_the_parts_never_break_the_report(
        rp: report_pb2_grpc.ReportServiceStub) -> None:
    """Found by fuzzing: an Inf in a report part's number made json.dumps(allow_nan=False)
    fail, INTERNAL. Every float the parts carry, set to +Inf, -Inf or NaN in turn: never
    INTERNAL; a rendered report is strict JSON with null where the value was not finite."""
    paths = [p for _, _, p in _float_fields(make_parts())]
    assert len(paths) > 20
    for i, path in enumerate(paths):
        parts = make_parts()
        msg, name, _ = list(_float_fields(parts))[i]
        setattr(msg, name, (math.inf, -math.inf, math.nan)[i % 3])
        try:
            out = rp.RenderReport(report_pb2.RenderReportRequest(parts=parts), metadata=MD)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (path, exc.details())
            continue
        report = json.loads(out.report_json)            # strict: Infinity/NaN do not parse
        assert "Infinity" not in out.report_json and "NaN" not in out.report_json, path
        assert report["evaluation"]["id"] == "ev-42"
