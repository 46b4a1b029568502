"""OpenTelemetry tracing across the services, over real loopback gRPC servers.

The spans of every service of an in-process stack go to an ``InMemorySpanExporter`` (the
SDK's own, installed as the global provider for this module). A whole small evaluation --
clean pass, a corruption and a query attack -- is run against a built-in target and against
a target reached over real gRPC: a loopback ``TargetService`` server (no Fortis code
between it and the wire) that records the ``traceparent`` each call brought. One trace must
run from the CreateEvaluation call to the target: every span of the evaluation shares its
trace id, their parent links form a single tree, and the target saw that trace id.

Also: a tenant's trace context is only linked, never a parent; the internal key's is the
parent; malformed or oversized headers are ignored, never an error; no span attribute holds
a key, the plan text or bytes; the audit and request log lines carry the trace id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from fortis.evaluation.v1 import evaluation_pb2 as pb
from fortis.evaluation.v1 import evaluation_pb2_grpc
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.conftest import API_KEY, MD

pytestmark = pytest.mark.usefixtures("one_thread")

INTERNAL_KEY = "internal-key-for-the-tracing-test"
PLAN_NAME = "tracing-plan-name-not-in-spans"
PLAN = f"""
name: {PLAN_NAME}
seed: 3
target: {{name: TARGET, task: classification}}
dataset: {{source: fashion-mnist, split: test, limit: 16}}
corruptions: [{{id: gaussian_noise, severities: [1]}}]
attacks:
  - {{id: square, params: {{epsilon: 0.05, max_queries: 12}}, limit: 4}}
execution: {{batch_size: 8}}
"""
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
CLIENT_TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    """The SDK's in-memory exporter behind the global tracer provider (for this module
    only: the global is put back to unset after it)."""
    mem = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(mem))
    trace.set_tracer_provider(provider)
    yield mem
    provider.shutdown()
    from opentelemetry.util._once import Once

    trace._TRACER_PROVIDER_SET_ONCE = Once()  # the SDK's own tests reset it so
    trace._TRACER_PROVIDER = None


class _RecordingTarget:
    """A ``TargetService`` (the built-in CNN behind the generated servicer) that keeps the
    trace headers of every call, as any remote target would see them on the wire."""

    def __init__(self, model: Any) -> None:
        from fortis.adapters.torch_target import ClassifierTarget, TargetServicer
        from fortis.target.v1 import target_pb2_grpc

        self.seen: list[tuple[str, str | None]] = []
        inner = TargetServicer(ClassifierTarget(model))
        outer = self

        class Servicer(target_pb2_grpc.TargetServiceServicer):
            def GetTargetInfo(self, request: Any, context: Any) -> Any:
                outer._note("GetTargetInfo", context)
                return inner.GetTargetInfo(request, context)

            def Predict(self, request: Any, context: Any) -> Any:
                outer._note("Predict", context)
                return inner.Predict(request, context)

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        target_pb2_grpc.add_TargetServiceServicer_to_server(Servicer(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _note(self, rpc: str, context: Any) -> None:
        self.seen.append((rpc, dict(context.invocation_metadata()).get("traceparent")))


@pytest.fixture(scope="module")
def remote(fmnist_target: Any) -> Iterator[_RecordingTarget]:
    t = _RecordingTarget(fmnist_target)
    yield t
    t.server.stop(0)


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    remote: _RecordingTarget,
    exporter: InMemorySpanExporter,
    fmnist_target: Any,
    fmnist_surrogate: Any,
) -> Iterator[Any]:
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    s = start_stack(
        StackSettings(
            state_dir=tmp_path_factory.mktemp("tracing") / "state",
            api_keys={API_KEY: "tenant-a"},
            internal_key=INTERNAL_KEY,
            targets=[
                TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn"),
                TargetConfig.parse(f"remote=grpc://127.0.0.1:{remote.port}"),
            ],
        )
    )
    yield s
    s.stop(0)


@pytest.fixture()
def stub(stack: Any) -> Iterator[evaluation_pb2_grpc.EvaluationServiceStub]:
    ch = grpc.insecure_channel(stack.address)
    yield evaluation_pb2_grpc.EvaluationServiceStub(ch)
    ch.close()


def _wait(stub: Any, eid: str, timeout: float = 240) -> pb.Evaluation:
    deadline = time.time() + timeout
    while time.time() < deadline:
        ev = stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id=eid), metadata=MD).evaluation
        if ev.state in (
            pb.EVALUATION_STATE_SUCCEEDED,
            pb.EVALUATION_STATE_FAILED,
            pb.EVALUATION_STATE_CANCELLED,
        ):
            return ev
        time.sleep(0.2)
    raise AssertionError(f"{eid} did not end")


def _hex(n: int, width: int) -> str:
    return format(n, f"0{width}x")


def _server_span(spans: list[ReadableSpan], rpc: str) -> ReadableSpan:
    found = [s for s in spans if s.kind is SpanKind.SERVER and s.name.endswith("/" + rpc)]
    assert found, f"no server span of {rpc}"
    return found[-1]


def _flat_values(span: ReadableSpan) -> list[Any]:
    out: list[Any] = list((span.attributes or {}).values())
    for link in span.links:
        out += list((link.attributes or {}).values())
    for event in span.events:
        out += list((event.attributes or {}).values())
    return out


@pytest.mark.slow
@pytest.mark.parametrize("target", ["fmnist-cnn", "remote"])
def test_one_trace_from_create_evaluation_to_the_target(
    target: str,
    stub: Any,
    exporter: InMemorySpanExporter,
    remote: _RecordingTarget,
    captured: list[dict[str, Any]],
) -> None:
    exporter.clear()
    remote.seen.clear()
    plan = PLAN.replace("TARGET", target)
    md = (*MD, ("traceparent", CLIENT_TRACEPARENT), ("tracestate", "tenant=injected"))
    ev = stub.CreateEvaluation(pb.CreateEvaluationRequest(plan=plan), metadata=md).evaluation
    final = _wait(stub, ev.evaluation_id)
    assert final.state == pb.EVALUATION_STATE_SUCCEEDED, final.error
    time.sleep(0.5)  # the last client spans end in gRPC's callback thread
    spans = list(exporter.get_finished_spans())

    create = _server_span([s for s in spans if s.parent is None], "CreateEvaluation")
    tid = create.context.trace_id
    # the tenant's trace context is linked, never the parent, and its tracestate is dropped
    assert create.parent is None and _hex(tid, 32) != CLIENT_TRACE
    assert [(_hex(k.context.trace_id, 32), _hex(k.context.span_id, 16)) for k in create.links] == [
        (CLIENT_TRACE, CLIENT_SPAN)
    ]
    assert all(not s.context.trace_state for s in spans)

    ours = [s for s in spans if s.context.trace_id == tid]
    ids = {s.context.span_id for s in ours}
    assert len(ids) == len(ours)
    roots = [s for s in ours if s.parent is None]
    assert roots == [create], "one root: CreateEvaluation"
    assert all(s.parent.span_id in ids for s in ours if s.parent is not None), (
        "every parent is a span of the same trace"
    )
    # ... and the parent links reach the root from every span (a tree, no cycle)
    parent_of = {s.context.span_id: (s.parent.span_id if s.parent else None) for s in ours}
    for sid in ids:
        seen: set[int] = set()
        while parent_of[sid] is not None:
            assert sid not in seen
            seen.add(sid)
            sid = parent_of[sid]
        assert sid == create.context.span_id

    names = {s.name for s in ours}
    run = next(s for s in ours if s.name == "evaluation.run")
    assert run.attributes["fortis.evaluation_id"] == ev.evaluation_id
    assert run.attributes["fortis.tenant"] == "tenant-a"
    assert {"stage clean", "stage corruptions", "stage query_attacks"} <= names
    for rpc in (
        "fortis.perturbation.v1.PerturbationService/ApplyPerturbation",
        "fortis.perturbation.v1.PerturbationService/RunAttack",
        "fortis.proxy.v1.TargetProxyService/Predict",
        "fortis.scoring.v1.ScoringService/ScoreEvaluation",
        "fortis.report.v1.ReportService/RenderReport",
    ):
        kinds = {s.kind for s in ours if s.name == rpc}
        assert kinds == {SpanKind.CLIENT, SpanKind.SERVER}, (rpc, kinds)
    # the query attack's proxy calls (perturbation -> proxy) are in the trace too
    attack = next(s for s in ours if s.name.endswith("/RunAttack") and s.kind is SpanKind.SERVER)
    below_attack = [
        s for s in ours if s.parent is not None and s.parent.span_id == attack.context.span_id
    ]
    assert any(s.name.endswith("TargetProxyService/Predict") for s in below_attack)
    servers = [s for s in ours if s.kind is SpanKind.SERVER]
    assert {s.attributes["fortis.tenant"] for s in servers} == {"tenant-a"}
    assert {s.attributes["fortis.service"] for s in servers} >= {
        "evaluation",
        "perturbation",
        "proxy",
        "scoring",
        "report",
    }

    if target == "remote":
        predicts = [tp for rpc, tp in remote.seen if rpc == "Predict"]
        assert predicts and all(tp is not None for tp in predicts)
        client_ids = {
            s.context.span_id
            for s in ours
            if s.kind is SpanKind.CLIENT and s.name == "fortis.target.v1.TargetService/Predict"
        }
        for tp in predicts:
            _, trace_hex, parent_hex, _ = tp.split("-")
            assert trace_hex == _hex(tid, 32)
            assert int(parent_hex, 16) in client_ids  # the proxy's call is its parent

    # no secrets, no plan text, no bytes in any span
    for s in spans:
        for value in _flat_values(s):
            text = value if isinstance(value, str) else repr(value)
            assert not isinstance(value, bytes)
            assert API_KEY not in text and INTERNAL_KEY not in text and PLAN_NAME not in text

    # the trace id in the request's log lines and in the run's
    trace_hex = _hex(tid, 32)
    started = [
        ln
        for ln in captured
        if ln.get("event") == "evaluation_started" and ln.get("evaluation_id") == ev.evaluation_id
    ]
    assert started and started[0].get("trace_id") == trace_hex


def _call(stack: Any, md: tuple[tuple[str, str], ...]) -> None:
    ch = grpc.insecure_channel(stack.address)
    try:
        evaluation_pb2_grpc.EvaluationServiceStub(ch).ListEvaluations(
            pb.ListEvaluationsRequest(page_size=1), metadata=md, timeout=30
        )
    finally:
        ch.close()


def _list_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    return _server_span(list(exporter.get_finished_spans()), "ListEvaluations")


def test_the_internal_key_continues_the_callers_trace(
    stack: Any, exporter: InMemorySpanExporter
) -> None:
    exporter.clear()
    _call(
        stack,
        (
            ("x-api-key", INTERNAL_KEY),
            ("x-fortis-tenant", "tenant-a"),
            ("traceparent", CLIENT_TRACEPARENT),
            ("tracestate", "fortis=kept"),
        ),
    )
    span = _list_span(exporter)
    assert _hex(span.context.trace_id, 32) == CLIENT_TRACE
    assert span.parent is not None and _hex(span.parent.span_id, 16) == CLIENT_SPAN
    assert dict(span.context.trace_state) == {"fortis": "kept"}


GOOD_TRACE = "0af7651916cd43dd8448eb211c80319c"
HOSTILE = {
    "garbage": [("traceparent", "not a trace context")],
    "all-zero ids": [("traceparent", "00-" + "0" * 32 + "-" + "0" * 16 + "-01")],
    "version ff": [("traceparent", f"ff-{GOOD_TRACE}-b7ad6b7169203331-01")],
    "extra field on version 00": [("traceparent", f"00-{GOOD_TRACE}-b7ad6b7169203331-01-x")],
    "too long": [("traceparent", f"00-{GOOD_TRACE}-b7ad6b7169203331-01" + "a" * 6000)],
    "uppercase hex": [("traceparent", f"00-{GOOD_TRACE.upper()}-B7AD6B7169203331-01")],
    "tracestate alone": [("tracestate", "a=" + "b" * 200)],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("key", ["tenant", "internal"])
def test_a_malformed_trace_context_is_ignored_never_an_error(
    case: str,
    key: str,
    stack: Any,
    exporter: InMemorySpanExporter,
    captured: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Whoever sends it, a bad trace header is no trace header: the call succeeds and its
    span starts a trace of its own (nothing linked), with no warning logged per call."""
    exporter.clear()
    caplog.set_level(logging.DEBUG, logger="opentelemetry")
    auth = MD if key == "tenant" else (("x-api-key", INTERNAL_KEY), ("x-fortis-tenant", "tenant-a"))
    _call(stack, (*auth, *HOSTILE[case]))
    span = _list_span(exporter)
    assert span.parent is None and not span.links
    assert span.attributes["rpc.grpc.status_code"] == "OK"
    assert not [ln for ln in captured if ln.get("level") in ("warning", "error")]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_huge_tracestate_is_dropped_and_the_traceparent_kept(
    stack: Any, exporter: InMemorySpanExporter
) -> None:
    from fortis.infra.serving.tracing import MAX_TRACESTATE_CHARS

    exporter.clear()
    state = ",".join(f"k{i}=" + "v" * 100 for i in range(30))  # ~3 KB, 30 members
    assert len(state) > MAX_TRACESTATE_CHARS
    _call(
        stack,
        (
            ("x-api-key", INTERNAL_KEY),
            ("x-fortis-tenant", "tenant-a"),
            ("traceparent", CLIENT_TRACEPARENT),
            ("tracestate", state),
        ),
    )
    span = _list_span(exporter)
    assert _hex(span.context.trace_id, 32) == CLIENT_TRACE
    assert not span.context.trace_state


def test_the_audit_line_carries_the_calls_trace_id(
    tmp_path: Path, exporter: InMemorySpanExporter, captured: list[dict[str, Any]]
) -> None:
    """The ``authenticated`` audit line (once per identity) is written inside the call's
    span: its trace id is the call's."""
    from fortis.server.app.stack import StackSettings, start_stack

    s = start_stack(
        StackSettings(
            state_dir=tmp_path / "state",
            api_keys={API_KEY: "tenant-a"},
            only="evaluation",
            proxy_address="127.0.0.1:1",
            perturbation_address="127.0.0.1:1",
            scoring_address="127.0.0.1:1",
            report_address="127.0.0.1:1",
        )
    )
    try:
        exporter.clear()
        _call(s, MD)
    finally:
        s.stop(0)
    span = _list_span(exporter)
    audit = [ln for ln in captured if ln.get("event") == "authenticated"]
    assert len(audit) == 1
    assert audit[0]["trace_id"] == _hex(span.context.trace_id, 32)
    assert audit[0]["tenant"] == "tenant-a"


@pytest.mark.slow
def test_worker_processes_continue_the_runs_trace(
    tmp_path: Path, exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--executor processes``: the workers are other processes, so their spans go out
    over OTLP (the standard variables, in the environment they inherit) to a loopback
    collector (a stand-in for an OpenTelemetry Collector, decoding with the OTLP protos);
    the service's own spans stay in memory. Together they are one tree: each worker's span
    is a child of the evaluation's run (``TRACEPARENT``), and the proxy's server spans are
    children of the workers' client spans."""
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    from tests.unit.test_tracing import _GrpcCollector

    collector = _GrpcCollector()
    s = start_stack(
        StackSettings(
            state_dir=tmp_path / "state",
            api_keys={API_KEY: "tenant-a"},
            internal_key=INTERNAL_KEY,
            targets=[TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn")],
            executor="processes",
            worker_processes=2,
        )
    )
    # set after the start: this process keeps its in-memory exporter, the workers export
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
    try:
        exporter.clear()
        ch = grpc.insecure_channel(s.address)
        stub = evaluation_pb2_grpc.EvaluationServiceStub(ch)
        plan = PLAN.replace("TARGET", "fmnist-cnn").split("attacks:")[0]
        ev = stub.CreateEvaluation(pb.CreateEvaluationRequest(plan=plan), metadata=MD).evaluation
        final = _wait(stub, ev.evaluation_id)
        ch.close()
        assert final.state == pb.EVALUATION_STATE_SUCCEEDED, final.error
    finally:
        s.stop(0)
        collector.server.stop(0)
    mine = list(exporter.get_finished_spans())
    run = next(x for x in mine if x.name == "evaluation.run")
    tid = run.context.trace_id
    remote = [
        (rs, sp)
        for req in collector.requests
        for rs in req.resource_spans
        for ss in rs.scope_spans
        for sp in ss.spans
    ]
    services = {
        a.value.string_value
        for rs, _ in remote
        for a in rs.resource.attributes
        if a.key == "service.name"
    }
    assert services == {"fortis-worker"}
    workers = [sp for _, sp in remote if sp.name == "evaluation.worker"]
    assert len(workers) == 2
    for w in workers:
        assert int.from_bytes(w.trace_id, "big") == tid
        assert int.from_bytes(w.parent_span_id, "big") == run.context.span_id
    assert all(int.from_bytes(sp.trace_id, "big") == tid for _, sp in remote)
    worker_clients = {
        int.from_bytes(sp.span_id, "big")
        for _, sp in remote
        if sp.name == "fortis.proxy.v1.TargetProxyService/Predict"
    }
    assert worker_clients, "the workers' queries to the proxy"
    proxy_servers = [
        x
        for x in mine
        if x.kind is SpanKind.SERVER
        and x.name == "fortis.proxy.v1.TargetProxyService/Predict"
        and x.parent is not None
        and x.parent.span_id in worker_clients
    ]
    assert proxy_servers and all(x.context.trace_id == tid for x in proxy_servers)


@pytest.mark.parametrize("state", ["!!!bad,,=", "A=upper", "a=b=c", "k=v," * 40 + "k=v"])
def test_a_malformed_tracestate_is_dropped_silently_and_the_parent_kept(
    state: str, stack: Any, exporter: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    exporter.clear()
    caplog.set_level(logging.DEBUG, logger="opentelemetry")
    _call(
        stack,
        (
            ("x-api-key", INTERNAL_KEY),
            ("x-fortis-tenant", "tenant-a"),
            ("traceparent", CLIENT_TRACEPARENT),
            ("tracestate", state),
        ),
    )
    span = _list_span(exporter)
    assert _hex(span.parent.span_id, 16) == CLIENT_SPAN and not span.context.trace_state
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
