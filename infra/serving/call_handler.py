"""The wrapper around every method handler of a Fortis server: authenticate and bind the call
(``before``), admit the request into its tenant's memory budget, check every field's bound,
and map domain errors to gRPC statuses with rich details (a bad request never takes a service
down and internals never leak). Metrics are observed once per call.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from fortis.infra.serving.call_context import (
    REQUEST_ID_HEADER,
    current_seat,
    current_tenant,
    current_work,
)
from fortis.infra.serving.memory import (
    CallHold,
    current_hold,
    stream_holding,
)
from fortis.infra.serving.status import status_for
from fortis.infra.serving.tracing import ServerCall
from fortis.infra.serving.wire import Wire
from fortis.services.common import errors, limits
from google.protobuf.message import Message
from grpc_status import rpc_status

log = structlog.get_logger("fortis.server")


def _abort(context: grpc.ServicerContext, exc: BaseException, request_id: str = "") -> None:
    if not isinstance(exc, errors.FortisError):
        log.error("unhandled error", error=repr(exc), traceback=traceback.format_exc())
    status = rpc_status.to_status(status_for(exc))
    if request_id:      # an aborted call returns its request id too (abort replaces trailers)
        status = _Status(status.code, status.details,
                         (*status.trailing_metadata, (REQUEST_ID_HEADER, request_id)))
    context.abort_with_status(status)


@dataclass(frozen=True)
class _Status(grpc.Status):
    """A ``grpc.Status`` with extra trailing metadata (the request id)."""

    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...]


_CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}

#: ``observe(method, code_name, seconds, tenant)`` after every call (Prometheus, see
#: infra/serving/metrics.py); tenant "" when the call was refused before auth.
Observer = Callable[[str, str, float, str], None]


def _code_of(context: grpc.ServicerContext, exc: BaseException | None) -> str:
    if exc is not None and not isinstance(exc, grpc.RpcError) and not _aborted(context):
        return _CODE_NAMES.get(status_for(exc).code, "UNKNOWN")
    code = getattr(context, "code", lambda: None)()
    if code is None:
        return "OK" if exc is None else "UNKNOWN"
    return code.name if isinstance(code, grpc.StatusCode) else _CODE_NAMES.get(int(code), "UNKNOWN")


class _Undecodable:
    """A request protobuf could not parse (nested beyond its recursion limit, e.g. a Struct
    90 levels deep, or not the method's message)."""


_UNDECODABLE = _Undecodable()


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """``deserializer`` answering ``_UNDECODABLE`` instead of raising: gRPC would turn the
    exception into INTERNAL "Exception deserializing request!" before any handler runs
    (a client's mistake reported as a server fault); the wrapped handler makes it
    INVALID_ARGUMENT naming ``request``."""
    if deserializer is None:
        return None

    def parse(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception:  # noqa: BLE001 - any parse failure is the caller's bad message
            return _UNDECODABLE
    return parse


def _decoded(request: Any) -> Any:
    if request is _UNDECODABLE:
        raise errors.InvalidArgument(
            "request", "the message could not be parsed: nested deeper than protobuf allows "
            "(100 levels; a Struct level counts 3) or not this method's request message")
    return request


def _decoded_stream(requests: Iterable[Any]) -> Iterator[Any]:
    for request in requests:
        yield _decoded(request)


def _bounded(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``check``, then every request message against the documented bound of each of its
    fields (bounded work: ``services/common/limits.py``), INVALID_ARGUMENT naming
    the field before the servicer sees it."""

    def run(request: Any) -> Any:
        request = check(request)
        if isinstance(request, Message):
            limits.check_message(request)
            return request
        if isinstance(request, (bytes, bytearray)):
            return request          # a raw handler (no deserializer): nothing typed to bound
        return (limits.checked(message) for message in request)
    return run


#: ``before(context)`` authenticates and binds the call; it may return what to run once when
#: the call ends (give back the tenant's call slot).
Before = Callable[[grpc.ServicerContext], Callable[[], None] | None]


def _once(fn: Callable[[], None] | None) -> Callable[[], None]:
    """``fn`` made safe to call from both the handler's end and the RPC's termination."""
    if fn is None:
        return lambda: None
    lock, done = threading.Lock(), [False]

    def run() -> None:
        with lock:
            if done[0]:
                return
            done[0] = True
        fn()
    return run


def _on_end(context: grpc.ServicerContext, release: Callable[[], None]) -> None:
    """Also release when the RPC terminates (a cancelled stream's handler may never resume)."""
    try:
        if not context.add_callback(release):
            release()               # already terminated
    except Exception:  # noqa: BLE001 - test doubles of the context may lack add_callback
        pass


def wrap_handler(handler: grpc.RpcMethodHandler,
                 before: Before,
                 method: str = "", observe: Observer | None = None,
                 request_id: str = "",
                 hold_for: Callable[[], CallHold | None] | None = None,
                 *, traced: ServerCall | None = None) -> grpc.RpcMethodHandler:
    """Wrap every behaviour of a handler: run ``before`` then map domain errors (a request
    that does not parse is INVALID_ARGUMENT on ``request``). ``hold_for`` (after ``before``)
    gives the call's memory hold: a unary request is held whole before the servicer runs, a
    client stream message by message; a bidirectional stream's servicer holds each message
    itself (``memory.holding``), answering refusals in band. ``traced`` is the call's span
    (started by ``before``), ended with the call's status code."""
    check: Callable[[Any], Any] = _decoded_stream if handler.request_streaming else _decoded
    if not (handler.request_streaming and handler.response_streaming):
        check = _bounded(check)     # a bidirectional stream's servicer answers it in band
    bidi = handler.request_streaming and handler.response_streaming
    parse = _tolerant(handler.request_deserializer)
    # A unary request reaches the behaviour as the bytes received and is parsed only once
    # the caller is known and the bytes fit its tenant's memory: an unauthenticated or
    # over-budget request is never copied into a message.
    later = parse if not handler.request_streaming and parse is not None else None
    steps = _CallSteps(before=before, check=check, later=later,
                       request_streaming=bool(handler.request_streaming), bidi=bool(bidi),
                       method=method, observe=observe, request_id=request_id,
                       hold_for=hold_for, traced=traced)
    send = _passing_wire(handler.response_serializer)
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(_unary(handler.unary_unary, steps), None,
                                                   send)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(_streaming(handler.unary_stream, steps),
                                                    None, send)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(_unary(handler.stream_unary, steps), parse,
                                                    send)
    return grpc.stream_stream_rpc_method_handler(_streaming(handler.stream_stream, steps),
                                                 parse, send)


@dataclass(frozen=True, kw_only=True)
class _CallSteps:
    """What every call of one wrapped handler runs around its servicer: ``before`` (auth and
    admission), the request's checks and memory hold, and the metrics at its end."""

    before: Before
    check: Callable[[Any], Any]
    #: The request's parser when a unary request arrives as bytes (parsed once admitted).
    later: Callable[[bytes], Any] | None
    request_streaming: bool
    bidi: bool
    method: str
    observe: Observer | None
    request_id: str
    hold_for: Callable[[], CallHold | None] | None
    traced: ServerCall | None = None

    def admitted(self, request: Any, context: grpc.ServicerContext,
                 holds: list[CallHold]) -> Any:
        """The checked request, held in the call's memory budget (released at its end)."""
        hold = self.hold_for() if self.hold_for is not None else None
        if self.later is not None:
            if hold is not None:
                hold.check_carried(len(request))
            request = self.later(request)
        request = self.check(request)
        if hold is None:
            return request
        holds.append(hold)
        current_hold.set(hold)
        _on_end(context, hold.close)
        if not self.request_streaming:
            hold.hold(request)
        elif not self.bidi:
            request = stream_holding(hold, request)
        return request

    def done(self, context: grpc.ServicerContext, exc: BaseException | None,
             t0: float) -> None:
        if self.traced is not None:
            self.traced.end(_code_of(context, exc))
        if self.observe is not None:
            try:
                self.observe(self.method, _code_of(context, exc), time.perf_counter() - t0,
                             current_tenant.get())
            except Exception:  # noqa: BLE001 - metrics never break a call
                log.warning("metrics observer failed", method=self.method)


def _let_go(holds: list[CallHold]) -> None:
    for hold in holds:
        hold.close()


def _fresh_call() -> None:
    """Clear what a worker thread's last call left in the call's context variables: its
    last caller is not this one."""
    current_tenant.set("")
    current_hold.set(None)
    current_work.set(None)
    current_seat.set(None)


def _unary(fn: Callable[..., Any], steps: _CallSteps) -> Callable[..., Any]:
    """A behaviour with one answer, run under ``steps``."""
    def call(request: Any, context: grpc.ServicerContext) -> Any:
        t0 = time.perf_counter()
        _fresh_call()
        release = _once(None)
        holds: list[CallHold] = []
        try:
            release = _once(steps.before(context))
            _on_end(context, release)
            result = fn(steps.admitted(request, context, holds), context)
        except Exception as exc:  # noqa: BLE001 - mapped to a status
            release()
            _let_go(holds)
            steps.done(context, exc, t0)
            if isinstance(exc, grpc.RpcError) or _aborted(context):
                raise
            _abort(context, exc, steps.request_id)
        release()
        _let_go(holds)
        steps.done(context, None, t0)
        return result
    return call


def _streaming(fn: Callable[..., Iterable[Any]], steps: _CallSteps
               ) -> Callable[..., Iterable[Any]]:
    """A behaviour with a stream of answers, run under ``steps``; its seat is given back
    after the first answer."""
    def call(request: Any, context: grpc.ServicerContext) -> Iterable[Any]:
        t0 = time.perf_counter()
        _fresh_call()
        release = _once(None)
        holds: list[CallHold] = []
        try:
            release = _once(steps.before(context))
            _on_end(context, release)
            first = True
            for item in fn(steps.admitted(request, context, holds), context):
                if first:           # a stream's later messages wait, not work: no seat
                    first = False
                    seat = current_seat.get()
                    if seat is not None:
                        seat()
                yield item
        except Exception as exc:  # noqa: BLE001 - mapped to a status
            release()
            _let_go(holds)
            steps.done(context, exc, t0)
            if isinstance(exc, grpc.RpcError) or _aborted(context):
                raise
            _abort(context, exc, steps.request_id)
        finally:
            release()
            _let_go(holds)
            if steps.traced is not None:    # a stream closed early ends its span too
                steps.traced.end(_code_of(context, None))
        steps.done(context, None, t0)
    return call


def _passing_wire(serialize: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """The handler's serializer, but an answer already in its wire form (``wire.Wire``: built
    without holding the interpreter lock for its pixels) goes out as it is."""
    if serialize is None:
        return None

    def send(response: Any) -> bytes:
        if isinstance(response, Wire):
            return response.data
        return serialize(response)
    return send


def _aborted(context: grpc.ServicerContext) -> bool:
    code = getattr(context, "code", lambda: None)()
    return code is not None and code != grpc.StatusCode.OK

