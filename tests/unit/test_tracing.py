"""Tracing set-up and trace context carriers (``infra/serving/tracing.py``).

- No ``OTEL_*`` configuration: nothing installed (the API's no-op provider), no exporter
  thread, no connection; ``OTEL_SDK_DISABLED`` and ``none`` win over an endpoint.
- Configured by the standard variables alone, the SDK's real OTLP exporters (gRPC and
  HTTP/protobuf) deliver spans to a loopback collector. The collector is a stand-in for an
  OpenTelemetry Collector (not installable here): a gRPC ``TraceService`` and an HTTP
  ``/v1/traces`` endpoint that decode what they receive with the OTLP protos' own generated
  code (``opentelemetry-proto``), so a malformed export would fail to parse.
- The trace context travels without any SDK too (a Fortis service passes on what it got):
  into an HTTP target's headers and into worker processes' environment (a real process).
- Hostile carriers: malformed, oversized, non-text values are no context, never an error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
from fortis.infra.serving import tracing
from opentelemetry import context as otel_context
from opentelemetry import trace

ROOT = Path(__file__).resolve().parents[2]
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
PARENT = f"00-{TRACE}-{SPAN}-01"


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACE"))}
    env.update(extra)
    return env


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({}, []),
        ({"OTEL_SERVICE_NAME": "x"}, []),  # a name alone exports nothing
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "console,otlp"}, ["console", "otlp"]),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, []),
        ({"OTEL_SDK_DISABLED": "TRUE", "OTEL_TRACES_EXPORTER": "otlp"}, []),
    ],
)
def test_what_the_otel_variables_ask_for(env: dict[str, str], names: list[str]) -> None:
    assert tracing.exporter_names(env) == names


_PROBE = """
import sys, threading
from opentelemetry import trace
from fortis.infra.serving import tracing
provider = tracing.configure("fortis-probe")
with tracing.span("probe", {"fortis.stage": "clean"}):
    carried = tracing.headers()
print("PROVIDER", type(trace.get_tracer_provider()).__name__, provider is not None)
print("THREADS", threading.active_count())
print("HEADERS", carried)
if provider is not None:
    provider.shutdown()     # flushes the batch to the exporter
"""


def _probe(env: dict[str, str], *, with_stderr: bool = False) -> str:
    r = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout + (r.stderr if with_stderr else "")


def test_no_otel_configuration_installs_nothing() -> None:
    out = _probe(_clean_env())
    assert "PROVIDER ProxyTracerProvider False" in out  # the API's no-op default
    assert "THREADS 1" in out  # no exporter thread
    assert "HEADERS []" in out  # no trace made up to send


def test_a_bad_exporter_name_is_a_start_error_naming_the_variable() -> None:
    from fortis.services.common import errors

    with pytest.raises(errors.InvalidArgument, match="OTEL_TRACES_EXPORTER"):
        tracing.configure(environ={"OTEL_TRACES_EXPORTER": "zipkin-nope"})
    with pytest.raises(errors.InvalidArgument, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        tracing.configure(
            environ={
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon",
            }
        )


class _GrpcCollector:
    """OTLP/gRPC ``TraceService`` on loopback, keeping each decoded export request."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1 import (
            trace_service_pb2,
            trace_service_pb2_grpc,
        )

        self.requests: list[Any] = []
        self.metadata: list[dict[str, str]] = []
        outer = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                outer.metadata.append(dict(context.invocation_metadata()))
                outer.requests.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()


class _HttpCollector:
    """OTLP/HTTP ``POST /v1/traces`` on loopback, keeping each decoded export request."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        self.requests: list[Any] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                assert self.path == "/v1/traces"
                assert self.headers["Content-Type"] == "application/x-protobuf"
                outer.requests.append(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _exported(requests: list[Any]) -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for req in requests:
        for rs in req.resource_spans:
            service = next(
                a.value.string_value for a in rs.resource.attributes if a.key == "service.name"
            )
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append(
                        (service, s.name, {a.key: a.value.string_value for a in s.attributes})
                    )
    return out


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_otel_variables_alone_export_spans_over_otlp(protocol: str) -> None:
    if protocol == "grpc":
        collector: Any = _GrpcCollector()
        endpoint = f"http://127.0.0.1:{collector.port}"
    else:
        collector = _HttpCollector()
        endpoint = f"http://127.0.0.1:{collector.port}"
    try:
        out = _probe(
            _clean_env(
                OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
                OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
                OTEL_SERVICE_NAME="fortis-under-test",
            )
        )
    finally:
        if protocol == "grpc":
            collector.server.stop(0)
        else:
            collector.server.shutdown()
    assert "PROVIDER TracerProvider True" in out
    assert ("fortis-under-test", "probe", {"fortis.stage": "clean"}) in _exported(
        collector.requests
    )


@pytest.mark.parametrize(
    "carrier",
    [
        {},
        {"traceparent": ""},
        {"traceparent": "00-xyz"},
        {"traceparent": f"00-{TRACE}-{SPAN}-01" + " " * 200},
        {"traceparent": b"\xff\xfe"},
        {"traceparent": 12345},
        {"traceparent": f"00-{'0' * 32}-{SPAN}-01"},
        {"traceparent": f"00-{TRACE}-{'0' * 16}-01"},
        {"traceparent": f"01-{TRACE}-{SPAN}-01-" + "x" * 200},
    ],
)
def test_a_bad_carrier_is_no_context(carrier: dict[str, Any]) -> None:
    assert tracing.extract(carrier) is None


def test_a_good_carrier_any_case_and_bytes() -> None:
    for carrier in (
        {"traceparent": PARENT},
        {"TraceParent": PARENT.encode()},
        {"traceparent": PARENT, "tracestate": "x" * 10_000},
    ):
        ctx = tracing.extract(carrier)
        assert ctx is not None
        sc = trace.get_current_span(ctx).get_span_context()
        assert trace.format_trace_id(sc.trace_id) == TRACE and sc.is_remote
        assert not sc.trace_state  # none given, or too long: dropped


@pytest.fixture()
def received() -> Iterator[Any]:
    """The trace context received from a Fortis service, current (no SDK needed)."""
    ctx = tracing.extract({"traceparent": PARENT})
    token = otel_context.attach(ctx)
    yield ctx
    otel_context.detach(token)


def test_an_http_target_gets_the_trace_context(received: Any) -> None:
    from fortis.adapters.http_client import HttpClient

    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append({k.lower(): v for k, v in self.headers.items()})
            body = json.dumps({"ok": True}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = HttpClient(timeout_s=10, label="t")
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/predict"
        assert client.request("POST", url, {"X-Api-Key": "k"}, b"{}").status == 200
        # a header the profile sets itself is the profile's
        client.request("POST", url, {"traceparent": "00-profile"}, b"{}")
    finally:
        client.close()
        server.shutdown()
    assert seen[0]["traceparent"].split("-")[1] == TRACE
    assert seen[1]["traceparent"] == "00-profile"


def test_worker_processes_get_the_runs_trace_context(tmp_path: Path, received: Any) -> None:
    """The executor's worker processes start in the run's trace (``TRACEPARENT``), and
    ``fortis worker`` reads it back; without a context none is made up."""
    from fortis.services.evaluation.executors import ProcessExecutor, ProcessSettings

    script = (
        "import os, pathlib; pathlib.Path(os.environ['OUT'] + os.environ["
        "'JOB_COMPLETION_INDEX']).write_text(os.environ.get('TRACEPARENT', '-'))"
    )
    ex = ProcessExecutor(
        ProcessSettings(
            command=[sys.executable, "-c", script], shards=2, env={"OUT": str(tmp_path / "w")}
        )
    )
    assert ex.wait(ex.submit(tenant="t", evaluation_id="e1"), timeout_s=60).state == "succeeded"
    got = [(tmp_path / f"w{i}").read_text() for i in range(2)]
    assert all(g.split("-")[1] == TRACE for g in got)
    ctx = tracing.from_env({"TRACEPARENT": got[0]})
    assert ctx is not None
    assert trace.get_current_span(ctx).get_span_context().trace_id == int(TRACE, 16)

    token = otel_context.attach(otel_context.Context())  # no context now
    try:
        ex.wait(ex.submit(tenant="t", evaluation_id="e2"), timeout_s=60)
    finally:
        otel_context.detach(token)
    assert (tmp_path / "w0").read_text() == "-"


def test_an_indexed_job_gets_the_runs_trace_context(received: Any) -> None:
    from fortis.services.evaluation.k8s_jobs import JobSettings, job_manifest

    plain = job_manifest(JobSettings(namespace="n", image="i"), tenant="t", evaluation_id="e")
    traced = job_manifest(
        JobSettings(namespace="n", image="i"),
        tenant="t",
        evaluation_id="e",
        trace_env=tracing.env_carrier(),
    )

    def env_of(m: dict[str, Any]) -> dict[str, Any]:
        return {
            e["name"]: e.get("value") for e in m["spec"]["template"]["spec"]["containers"][0]["env"]
        }

    assert "TRACEPARENT" not in env_of(plain)
    assert env_of(traced)["TRACEPARENT"].split("-")[1] == TRACE


def test_an_open_inference_protocol_target_gets_the_trace_context(received: Any) -> None:
    """The KServe v2 gRPC transport's calls carry ``traceparent`` in their metadata (a
    loopback ``GRPCInferenceService`` records what it receives)."""
    from fortis.adapters.kserve_v2.grpc_transport import GrpcTransport
    from fortis.adapters.kserve_v2.options import parse_url
    from fortis.adapters.kserve_v2_protos import grpc_predict_v2_pb2 as kpb
    from fortis.adapters.kserve_v2_protos import grpc_predict_v2_pb2_grpc as kgrpc

    seen: list[str | None] = []

    class Server(kgrpc.GRPCInferenceServiceServicer):
        def ModelReady(self, request: Any, context: Any) -> Any:
            seen.append(dict(context.invocation_metadata()).get("traceparent"))
            return kpb.ModelReadyResponse(ready=True)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    kgrpc.add_GRPCInferenceServiceServicer_to_server(Server(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    transport = GrpcTransport(parse_url(f"kserve+grpc://127.0.0.1:{port}/m"))
    try:
        assert transport.ready()
    finally:
        transport.close()
        server.stop(0)
    assert seen and seen[0] is not None and seen[0].split("-")[1] == TRACE


def test_json_log_lines_carry_the_trace_id(received: Any, capsys: pytest.CaptureFixture) -> None:
    """``fortis serve``'s JSON lines (``server/cli/logs.py``) written inside a span carry its
    trace and span ids; outside any span, none."""
    import structlog
    from fortis.server.cli.logs import configure

    configure("info")
    structlog.get_logger("t").info("inside")
    token = otel_context.attach(otel_context.Context())
    try:
        structlog.get_logger("t").info("outside")
    finally:
        otel_context.detach(token)
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    inside, outside = lines[-2], lines[-1]
    assert (inside["event"], inside["trace_id"], inside["span_id"]) == ("inside", TRACE, SPAN)
    assert outside["event"] == "outside" and "trace_id" not in outside


def test_the_collectors_credentials_are_sent_and_never_printed() -> None:
    """``OTEL_EXPORTER_OTLP_HEADERS`` (e.g. a collector's token) reaches the collector; the
    process's output (its log lines included) never shows it."""
    secret = "otlp-token-" + os.urandom(8).hex()
    collector = _GrpcCollector()
    try:
        out = _probe(
            _clean_env(
                OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.port}",
                OTEL_EXPORTER_OTLP_HEADERS=f"authorization=Bearer%20{secret}",
            ),
            with_stderr=True,
        )
    finally:
        collector.server.stop(0)
    assert collector.metadata and all(
        md.get("authorization") == f"Bearer {secret}" for md in collector.metadata
    )
    assert secret not in out
