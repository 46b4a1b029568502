"""The gRPC client side of tracing: every call made on a traced channel is a CLIENT span, child
of the current span, and carries the W3C trace context in its metadata (``traceparent``,
``tracestate``), so the service (or target) called continues the trace.

Used by every channel Fortis dials: the services calling each other (``server.channel``),
the workers, the proxy calling a gRPC ``TargetService`` or an Open Inference Protocol server.
The span holds the RPC's names and status code, never the request, the metadata or the
address (see ``tracing.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import grpc
from fortis.infra.serving import tracing
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode


class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


class _CallDetails(_Details, grpc.ClientCallDetails):
    """``grpc.ClientCallDetails`` with the trace headers added to the metadata."""


def _with_headers(details: grpc.ClientCallDetails, span: trace.Span) -> grpc.ClientCallDetails:
    if span.get_span_context().is_valid:
        ctx = trace.set_span_in_context(span)
    else:  # no SDK: pass on the context received, if any (the no-op span has none)
        ctx = None
    extra = tracing.headers(ctx)
    if not extra:
        return details
    names = {name for name, _ in extra}
    md = [(k, v) for k, v in (details.metadata or ()) if k.lower() not in names]
    return _CallDetails(
        details.method,
        details.timeout,
        [*md, *extra],
        details.credentials,
        getattr(details, "wait_for_ready", None),
        getattr(details, "compression", None),
    )


def _ender(span: trace.Span) -> Callable[[Any], None]:
    def end(call: Any) -> None:
        try:
            code = call.code()
        except Exception:  # noqa: BLE001 - a call that cannot say how it ended
            code = None
        if span.is_recording():
            name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
            span.set_attribute("rpc.grpc.status_code", name)
            if code is not grpc.StatusCode.OK:
                span.set_status(Status(StatusCode.ERROR, name))
        span.end()

    return end


class TracingClientInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """A CLIENT span per call, its context sent in the call's metadata."""

    def _call(self, continuation: Any, details: grpc.ClientCallDetails, request: Any) -> Any:
        method = details.method if isinstance(details.method, str) else str(details.method)
        span = tracing.tracer().start_span(
            method.lstrip("/"), kind=SpanKind.CLIENT, attributes=tracing.rpc_attributes(method)
        )
        try:
            call = continuation(_with_headers(details, span), request)
        except BaseException:
            if span.is_recording():
                span.set_status(Status(StatusCode.ERROR, "UNKNOWN"))
            span.end()
            raise
        try:
            call.add_done_callback(_ender(span))
        except Exception:  # noqa: BLE001 - a call object without callbacks: end it now
            span.end()
        return call

    def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        return self._call(continuation, client_call_details, request)

    def intercept_unary_stream(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        return self._call(continuation, client_call_details, request)

    def intercept_stream_unary(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        return self._call(continuation, client_call_details, request_iterator)

    def intercept_stream_stream(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        return self._call(continuation, client_call_details, request_iterator)


_INTERCEPTOR = TracingClientInterceptor()


def traced(channel: grpc.Channel) -> grpc.Channel:
    """``channel`` with every call traced (see the module doc)."""
    return grpc.intercept_channel(channel, _INTERCEPTOR)
