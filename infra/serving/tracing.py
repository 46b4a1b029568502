"""OpenTelemetry tracing: the set-up from the standard ``OTEL_*`` variables, W3C trace context
in and out (gRPC metadata, HTTP headers, a worker's environment), and the spans Fortis makes.

Nothing is exported unless the operator asks for it: with no ``OTEL_TRACES_EXPORTER`` and no
``OTEL_EXPORTER_OTLP_*ENDPOINT`` (or with ``OTEL_SDK_DISABLED=true``) no tracer provider is
installed, the API's no-op tracer makes every span, and a trace context received from a Fortis
service is only passed on. The spec's default exporter (``otlp``) is deliberately not
assumed: a server nobody configured for tracing opens no connection to a collector.

Trust: a trace context sent by a tenant's client is never a parent. A tenant that knew (or
guessed) another tenant's trace id could otherwise put its own calls into that trace, force
sampling, or push its ``tracestate`` into every call Fortis makes on its behalf. A tenant's
call starts a new trace whose root span *links* to the client's span (trace and span ids
only), so the client's trace can still be followed to Fortis. The context of a call made
with the internal service key (one Fortis service calling another), or of any call when
authentication is off (the single-user mode: its one user holds every trust), is the parent.

What spans carry: the service, the RPC, the tenant (already the operator's), the evaluation
id and the stage, status codes; never request bodies, images, plan text, credentials or
URLs (a target URL may hold a key in its query). No gRPC here: domain code opens spans.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

import structlog
from fortis.services.common import errors
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = structlog.get_logger("fortis.tracing")

TRACER_NAME = "fortis"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: The environment variables that carry a trace context into a worker process (the names
#: OpenTelemetry's environment-carrier proposal uses).
ENV_TRACEPARENT = "TRACEPARENT"
ENV_TRACESTATE = "TRACESTATE"
#: A version-00 traceparent is 55 characters; later versions may append fields. Longer
#: values are not parsed at all.
MAX_TRACEPARENT_CHARS = 128
#: W3C allows 32 list members (about 8 KiB); a tracestate longer than this is dropped, not
#: parsed or passed on (it would ride along on every call an evaluation makes).
MAX_TRACESTATE_CHARS = 512

#: A W3C tracestate list: ``key=value`` members (key: simple or ``tenant@system``; value:
#: printable ASCII but ``,`` and ``=``), comma-separated with optional blanks.
_MEMBER = r"[a-z0-9][a-z0-9_\-*/]{0,240}(?:@[a-z][a-z0-9_\-*/]{0,13})?=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_TRACESTATE = re.compile(rf"[ \t]*{_MEMBER}(?:[ \t]*,[ \t]*{_MEMBER}){{0,31}}[ \t]*")
_PROPAGATOR = TraceContextTextMapPropagator()  # W3C trace context only: no baggage
_lock = threading.Lock()
_provider: Any = None

#: The OTLP exporters by ``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL``.
_OTLP = {
    "grpc": ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter", "OTLPSpanExporter"),
    "http/protobuf": ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "OTLPSpanExporter"),
}
_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The span exporters the ``OTEL_*`` variables ask for; [] when tracing is off (not
    configured, ``none``, or ``OTEL_SDK_DISABLED=true``)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    given = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not given:
        # an OTLP endpoint alone is a request for OTLP (the spec's default exporter)
        return ["otlp"] if any(environ.get(v, "").strip() for v in _ENDPOINT_VARS) else []
    names = [n.strip() for n in given.split(",") if n.strip()]
    return [] if "none" in names else names


def _exporter(name: str, environ: Mapping[str, str]) -> Any:
    import importlib

    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name == "otlp":
        protocol = (
            (
                environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "grpc"
            )
            .strip()
            .lower()
        )
        if protocol not in _OTLP:
            raise errors.InvalidArgument(
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                f"'{protocol[:40]}' is not supported: use {' or '.join(sorted(_OTLP))}",
            )
        module, cls = _OTLP[protocol]
        return getattr(importlib.import_module(module), cls)()  # reads OTEL_EXPORTER_OTLP_*
    from importlib.metadata import entry_points

    found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
    if not found:
        raise errors.InvalidArgument(
            "OTEL_TRACES_EXPORTER",
            f"unknown span exporter '{name[:40]}': use otlp, console or none",
        )
    return found[0].load()()


def configure(service_name: str = "fortis", environ: Mapping[str, str] | None = None) -> Any:
    """Install a tracer provider exporting to what the ``OTEL_*`` variables name (once per
    process); the provider, or None when tracing is not configured (nothing installed: the
    no-op tracer, no exporter, no thread, no network). ``OTEL_SERVICE_NAME`` /
    ``OTEL_RESOURCE_ATTRIBUTES`` name the process, else ``service_name``; the sampler and
    batching follow ``OTEL_TRACES_SAMPLER`` and ``OTEL_BSP_*``. A bad value is a start error
    naming the variable."""
    global _provider
    env = os.environ if environ is None else environ
    names = exporter_names(env)
    if not names:
        return None
    with _lock:
        if _provider is not None:
            return _provider
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        exporters = [_exporter(n, env) for n in names]
        detected = OTELResourceDetector().detect()
        attrs = {} if "service.name" in detected.attributes else {"service.name": service_name}
        provider = TracerProvider(resource=Resource.create(attrs))
        for exporter in exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        _provider = provider
        log.info(
            "tracing_configured",
            exporters=names,
            service=str(provider.resource.attributes.get("service.name", "")),
        )
        return provider


_tracer_of: tuple[Any, trace.Tracer] | None = None


def tracer() -> trace.Tracer:
    """Fortis's tracer from the current global provider (kept: ``get_tracer`` builds a new
    one each time, a cost on every call)."""
    global _tracer_of
    provider = trace.get_tracer_provider()
    kept = _tracer_of
    if kept is None or kept[0] is not provider:
        kept = (provider, provider.get_tracer(TRACER_NAME))
        _tracer_of = kept
    return kept[1]


# -- trace context in ---------------------------------------------------------------------


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return ""
    return value if isinstance(value, str) else ""


def extract(carrier: Mapping[str, Any]) -> Context | None:
    """The trace context in ``carrier`` (``traceparent`` and ``tracestate``, any case of
    name), or None when it has none or a malformed one: a bad header is ignored, never an
    error, and nothing is logged per call (a client could fill the log). A ``tracestate``
    over :data:`MAX_TRACESTATE_CHARS` is dropped and the ``traceparent`` kept."""
    parent = state = ""
    for key, value in carrier.items():
        name = key.lower() if isinstance(key, str) else ""
        if name == TRACEPARENT:
            parent = _text(value)
        elif name == TRACESTATE:
            state = _text(value)
    if not parent or len(parent) > MAX_TRACEPARENT_CHARS:
        return None
    clean = {TRACEPARENT: parent.strip()}
    if state and len(state) <= MAX_TRACESTATE_CHARS and _TRACESTATE.fullmatch(state):
        clean[TRACESTATE] = state  # checked first: the SDK would log each bad member
    try:
        ctx = _PROPAGATOR.extract(clean)
    except Exception:  # noqa: BLE001 - a header that trips the parser is no header
        return None
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def caller_link(ctx: Context | None) -> list[Link]:
    """A link to the caller's span (ids and flags only: its tracestate is not kept)."""
    if ctx is None:
        return []
    sc = trace.get_current_span(ctx).get_span_context()
    return [
        Link(
            trace.SpanContext(sc.trace_id, sc.span_id, is_remote=True, trace_flags=sc.trace_flags),
            {"fortis.link": "caller"},
        )
    ]


# -- trace context out --------------------------------------------------------------------


def inject(carrier: MutableMapping[str, str], ctx: Context | None = None) -> None:
    """Put the current (or ``ctx``'s) trace context into ``carrier`` as W3C headers;
    nothing when there is none."""
    _PROPAGATOR.inject(carrier, context=ctx)


def headers(ctx: Context | None = None) -> list[tuple[str, str]]:
    out: dict[str, str] = {}
    inject(out, ctx)
    return list(out.items())


def env_carrier() -> dict[str, str]:
    """The current trace context as a worker process's environment (``TRACEPARENT``,
    ``TRACESTATE``); {} when there is none."""
    out: dict[str, str] = {}
    inject(out)
    return (
        {
            ENV_TRACEPARENT: out[TRACEPARENT],
            **({ENV_TRACESTATE: out[TRACESTATE]} if out.get(TRACESTATE) else {}),
        }
        if TRACEPARENT in out
        else {}
    )


def from_env(environ: Mapping[str, str] | None = None) -> Context | None:
    env = os.environ if environ is None else environ
    return extract(
        {TRACEPARENT: env.get(ENV_TRACEPARENT, ""), TRACESTATE: env.get(ENV_TRACESTATE, "")}
    )


def trace_ids() -> dict[str, str]:
    """``trace_id`` and ``span_id`` of the current span for a log line; {} when none."""
    sc = trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return {}
    return {
        "trace_id": trace.format_trace_id(sc.trace_id),
        "span_id": trace.format_span_id(sc.span_id),
    }


def add_trace_ids(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: the current span's ``trace_id``/``span_id`` on every line
    written inside a span (a line already carrying them keeps its own)."""
    for key, value in trace_ids().items():
        event.setdefault(key, value)
    return event


# -- spans ----------------------------------------------------------------------------------


def service_of(method: str) -> tuple[str, str, str]:
    """(Fortis service, RPC service, RPC method) of a full gRPC method name, e.g.
    ``/fortis.evaluation.v1.EvaluationService/CreateEvaluation`` -> ("evaluation",
    "fortis.evaluation.v1.EvaluationService", "CreateEvaluation")."""
    service, _, rpc = method.lstrip("/").partition("/")
    parts = service.split(".")
    area = parts[1] if len(parts) > 2 and parts[0] == "fortis" else parts[0]
    return area[:64], service[:200], rpc[:100]


@functools.lru_cache(maxsize=512)  # the served methods: a small, fixed set
def _rpc_attributes(method: str) -> tuple[tuple[str, str], ...]:
    area, service, rpc = service_of(method)
    return (
        ("rpc.system", "grpc"),
        ("rpc.service", service),
        ("rpc.method", rpc),
        ("fortis.service", area),
    )


def rpc_attributes(method: str) -> dict[str, str]:
    return dict(_rpc_attributes(method))


class ServerCall:
    """The span of one call a Fortis server answers (started before authentication, so the
    audit line has its trace id). Its context is made current in the handler's thread;
    it is not detached at the end: each call starts by making its own span current
    (``start``), as the call's other context variables are (``call_handler._fresh_call``),
    and a streaming call may end in another thread."""

    def __init__(self, method: str, metadata: Mapping[str, Any], trusted: bool) -> None:
        self.method = method
        # gRPC metadata keys are lower case; a tenant's tracestate is never read (only the
        # ids of its span are linked)
        given = metadata.get(TRACEPARENT)
        self._caller = (
            None
            if given is None
            else extract(
                {TRACEPARENT: given, TRACESTATE: metadata.get(TRACESTATE, "") if trusted else ""}
            )
        )
        self._trusted = trusted
        self.span: Span = trace.INVALID_SPAN
        self._ended = False

    def start(self) -> Span:
        if self._trusted:
            parent, links = (self._caller or Context()), None
        else:
            parent, links = Context(), caller_link(self._caller)
        self.span = tracer().start_span(
            self.method.lstrip("/"),
            context=parent,
            kind=SpanKind.SERVER,
            links=links,
            attributes=rpc_attributes(self.method),
        )
        otel_context.attach(trace.set_span_in_context(self.span, parent))
        return self.span

    def tenant(self, tenant: str) -> None:
        if tenant and self.span.is_recording():
            self.span.set_attribute("fortis.tenant", tenant[:200])

    def end(self, code: str) -> None:
        """End the span with the call's status code (once; later calls do nothing)."""
        if self._ended:
            return
        self._ended = True
        span = self.span
        if span.is_recording():
            span.set_attribute("rpc.grpc.status_code", code)
            if code not in (
                "OK",
                "CANCELLED",
                "NOT_FOUND",
                "ALREADY_EXISTS",
                "INVALID_ARGUMENT",
                "FAILED_PRECONDITION",
                "OUT_OF_RANGE",
                "UNAUTHENTICATED",
                "PERMISSION_DENIED",
                "RESOURCE_EXHAUSTED",
            ):
                # the server's own failures; a caller's mistake is not the server's error
                span.set_status(Status(StatusCode.ERROR, code))
        span.end()


@contextlib.contextmanager
def span(
    name: str,
    attributes: Mapping[str, str | int] | None = None,
    *,
    parent: Context | None = None,
    links: list[Link] | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> Iterator[Span]:
    """A span around a block, current inside it (a child of ``parent`` when given, else of
    the current span); an exception marks it failed with the error's class name only (its
    message may hold plan text or a target's answer)."""
    attrs = {k: v for k, v in (attributes or {}).items() if v != ""}
    s = tracer().start_span(name, context=parent, kind=kind, links=links, attributes=attrs)
    token = otel_context.attach(trace.set_span_in_context(s, parent))
    try:
        yield s
    except BaseException as exc:
        if s.is_recording():
            s.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        raise
    finally:
        s.end()
        otel_context.detach(token)


def stage_span(stage: Any, evaluation_id: str) -> contextlib.AbstractContextManager[Span]:
    """The span of one stage of an evaluation (named by its progress stage: ``clean``,
    ``corruptions``, ``query_attacks`` ...)."""
    name = str(getattr(stage, "progress_stage", "") or type(stage).__name__)[:64]
    return span(
        f"stage {name}", {"fortis.stage": name, "fortis.evaluation_id": evaluation_id[:200]}
    )


def in_context(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` to run in another thread under the caller's trace context (a pool thread
    otherwise starts a trace of its own). Only the trace context travels: the call's other
    context variables (its tenant, its memory hold) stay with the call's thread."""
    ctx = otel_context.get_current()

    def run(*args: Any, **kwargs: Any) -> Any:
        token = otel_context.attach(ctx)
        try:
            return fn(*args, **kwargs)
        finally:
            otel_context.detach(token)

    return run
