"""Shared gRPC server plumbing: the factory every service uses, auth and error mapping.

Transport only. Domain code raises ``fortis.services.common.errors`` exceptions; the
``ErrorInterceptor`` maps them to status codes with google.rpc rich details (see
docs/architecture.md, section 4), so a bad request never takes a service down and internals
never leak.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import re
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import grpc
import structlog
from fortis.client.errors import from_rpc_error
from fortis.services.common import errors, grpc_options, limits
from fortis.services.common.api_keys import KeyTable
from fortis.services.common.health import HealthServicer as FortisHealthServicer
from fortis.services.common.identity import AuditLog, CertTenant, Identity, TokenVerifier
from fortis.services.common.memory import (
    CallHold,
    MemoryBudget,
    MemoryLimits,
    current_hold,
    stream_holding,
)
from fortis.services.common.quotas import CallRate, CallSlots
from fortis.services.common.status import status_for
from fortis.services.common.stopping import StopCheck, caller_stop
from fortis.services.common.tls import PemFiles, PemReloader, TlsSettings, channel_options, load_pem
from fortis.services.common.wire import Wire
from fortis.services.common.workshare import WorkShare
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from grpc_status import rpc_status

log = structlog.get_logger("fortis.server")

#: Metadata key carrying the API key.
API_KEY_HEADER = "x-api-key"
#: Metadata key carrying an OpenID Connect / JWT bearer token (``Bearer <jwt>``).
AUTHORIZATION_HEADER = "authorization"
#: Metadata key with which an internal service key acts for a tenant.
TENANT_HEADER = "x-fortis-tenant"
#: Tenant value of an internal service key (may act for any tenant).
SERVICE_TENANT = "*"
#: Default largest message, bytes (a batch of 64 224x224 RGB PNGs is well under this).
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

T = TypeVar("T")

_EXEMPT_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
#: Calls that take no seat (``ServerSettings.seats``): their costly part takes a work slot of
#: its own, or they mostly wait (a Predict for its rate-limit turn, a query attack for its
#: answers), and a seat held while waiting would keep the tenant's other calls waiting too.
UNSEATED_METHODS = frozenset({
    "/fortis.proxy.v1.TargetProxyService/Predict",
    "/fortis.proxy.v1.TargetProxyService/PredictStream",
    "/fortis.perturbation.v1.PerturbationService/ApplyPerturbation",
    "/fortis.perturbation.v1.PerturbationService/ApplyPerturbationStream",
    "/fortis.perturbation.v1.PerturbationService/RunAttack",
    "/fortis.scoring.v1.ScoringService/Compute",
    "/fortis.scoring.v1.ScoringService/ScoreEvaluation",
    "/fortis.report.v1.ReportService/RenderReport",
    "/fortis.evaluation.v1.UploadService/UploadBlob",
})
#: Metadata key of a per-call request id: taken from the caller when safe, else generated,
#: returned in the trailing metadata and bound to every log line of the call (for the audit).
REQUEST_ID_HEADER = "x-request-id"
_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")


def request_id_from(metadata: Mapping[str, str]) -> str:
    """The caller's request id when it is short and plain (it goes into log lines, so no
    control characters or unbounded text), else a fresh one."""
    given = metadata.get(REQUEST_ID_HEADER, "")
    if isinstance(given, str) and _SAFE_REQUEST_ID.fullmatch(given):
        return given
    return uuid.uuid4().hex

current_tenant: contextvars.ContextVar[str] = contextvars.ContextVar("fortis_tenant", default="")
current_api_key: contextvars.ContextVar[str] = contextvars.ContextVar("fortis_api_key", default="")
#: The caller's bearer token, forwarded like its API key when a service calls another on the
#: caller's behalf (perturbation -> proxy for a query attack) so the callee sees the same tenant.
current_bearer: contextvars.ContextVar[str] = contextvars.ContextVar("fortis_bearer", default="")
#: True when the call came with the internal service key (one Fortis service calling another),
#: or when authentication is off (the single-user mode: its one user holds every trust).
current_internal: contextvars.ContextVar[bool] = contextvars.ContextVar("fortis_internal",
                                                                        default=False)
#: Gives back the call's seat (a streaming call's after its first message); set per call.
current_seat: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "fortis_seat", default=None)
#: This server's work share, for the servicers' :func:`work_slot` (set per call).
current_work: contextvars.ContextVar[WorkShare | None] = contextvars.ContextVar(
    "fortis_work", default=None)


def in_work_slot(context: Any, fn: Callable[[], T]) -> T:
    """A servicer's costly part, ``fn()``, in the calling tenant's share of the server's CPU
    (``WorkShare.run``: on the share's lower-priority threads); waiting for a slot ends with
    the call's deadline or cancellation."""
    share = current_work.get()
    if share is None or not share.enabled:
        return fn()
    return share.run(current_tenant.get() or "default", fn, _stop_of(context))


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """How a service's server is bound and protected."""

    address: str = "127.0.0.1:0"
    #: Who may call: a KeyTable (hashed keys, reloadable), or ``{key: tenant}`` hashed at
    #: once ("*" = internal). Empty: auth off (single-user local mode).
    api_keys: Mapping[str, str] | KeyTable = field(default_factory=dict)
    #: Listen with TLS only; None: plain text.
    tls: TlsSettings | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_workers: int = 16
    observe: Observer | None = None     # after every call: (method, code, seconds, tenant)
    #: Most calls of one tenant in progress at once (``CallSlots``: one tenant must
    #: not hold every worker thread). None: no limit. Internal calls are not counted.
    call_slots: CallSlots | None = None
    #: Calls each tenant starts per second (``CallRate``); a call beyond it waits its turn or
    #: is refused. None: no limit. Internal calls are not counted.
    call_rate: CallRate | None = None
    #: Close each connection after this long so clients re-resolve and rebalance
    #: (grpc_options); 0: never. Calls in flight are not cut.
    max_connection_age_s: float = grpc_options.DEFAULT_MAX_CONNECTION_AGE_S
    #: Bearer tokens accepted beside API keys (OIDC issuers, services/common/identity.py).
    tokens: TokenVerifier | None = None
    #: The tenant taken from a verified client certificate (``--tls-tenant-from``).
    cert_tenant: CertTenant | None = None
    #: Decoded bytes per request and per tenant in flight, and the answer's size, checked
    #: before a servicer decodes anything (``services/common/memory.py``). None: unchecked.
    memory: MemoryLimits | None = field(default_factory=MemoryLimits)
    #: The tenant-fair share of CPU-heavy work (``services/common/workshare.py``), the same
    #: object the process's other users of it hold (the proxy's built-in targets). None: off.
    work: WorkShare | None = None
    #: Seats: a tenant's calls (other than ``UNSEATED_METHODS``; internal ones and health
    #: neither) run their handler -- a stream until its first message -- in one of these,
    #: shared fairly like the work slots, so one tenant's flood of small calls (reopening
    #: Watch streams, listing) takes its share of the server's threads and interpreter, not
    #: every turn. None: no seats.
    seats: WorkShare | None = None


#: Seconds health says NOT_SERVING before a draining server refuses new calls: clients that
#: watch health (internal ``dns:///`` channels: round_robin with ``healthCheckConfig``,
#: grpc_options) move their new calls to other replicas first, so none is refused.
ANNOUNCE_S = 0.5
#: Message of a call refused while the server drains (UNAVAILABLE: retry elsewhere or later).
DRAINING_MESSAGE = ("the server is shutting down (draining its calls in progress); retry: "
                    "another replica, or this service once restarted, takes the call")


class Drain:
    """The calls in progress on one server, and whether new ones are refused (on
    SIGTERM every service drains in-flight work and exits within the pod's grace period).

    A call counts from the moment it is admitted until gRPC reports it terminated (its answer
    sent, or cancelled), so a server stopped once the count is 0 cuts no answer in transit.
    Health and reflection calls are not counted and never refused: health keeps answering
    NOT_SERVING while the server drains."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._calls = 0
        self._refusing = False

    @property
    def refusing(self) -> bool:
        return self._refusing

    @property
    def calls(self) -> int:
        with self._cond:
            return self._calls

    def enter(self, context: grpc.ServicerContext) -> None:
        """Admit a call (errors.Unavailable while draining); it leaves when it terminates."""
        with self._cond:
            if self._refusing:
                raise errors.Unavailable(DRAINING_MESSAGE)
            self._calls += 1
        try:
            registered = context.add_callback(self._leave)
        except Exception:  # noqa: BLE001 - test doubles of the context may lack add_callback
            registered = False
        if not registered:          # already terminated, or nothing to tell us when it does
            self._leave()

    def _leave(self) -> None:
        with self._cond:
            self._calls -= 1
            if self._calls <= 0:
                self._cond.notify_all()

    def refuse_new_calls(self) -> None:
        with self._cond:
            self._refusing = True

    def wait(self, timeout: float) -> int:
        """Wait at most ``timeout`` seconds for the calls in progress to end; the number left."""
        with self._cond:
            self._cond.wait_for(lambda: self._calls <= 0, timeout=max(0.0, timeout))
            return self._calls


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
#: services/common/metrics.py); tenant "" when the call was refused before auth.
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


def _wrap_handler(handler: grpc.RpcMethodHandler,
                  before: Before,
                  method: str = "", observe: Observer | None = None,
                  request_id: str = "",
                  hold_for: Callable[[], CallHold | None] | None = None
                  ) -> grpc.RpcMethodHandler:
    """Wrap every behaviour of a handler: run ``before`` then map domain errors (a request
    that does not parse is INVALID_ARGUMENT on ``request``). ``hold_for`` (after ``before``)
    gives the call's memory hold: a unary request is held whole before the servicer runs, a
    client stream message by message; a bidirectional stream's servicer holds each message
    itself (``memory.holding``), answering refusals in band."""
    check: Callable[[Any], Any] = _decoded_stream if handler.request_streaming else _decoded
    if not (handler.request_streaming and handler.response_streaming):
        check = _bounded(check)     # a bidirectional stream's servicer answers it in band
    bidi = handler.request_streaming and handler.response_streaming
    parse = _tolerant(handler.request_deserializer)
    # A unary request reaches the behaviour as the bytes received and is parsed only once
    # the caller is known and the bytes fit its tenant's memory: an unauthenticated or
    # over-budget request is never copied into a message.
    later = parse if not handler.request_streaming and parse is not None else None

    def admitted(request: Any, context: grpc.ServicerContext,
                 holds: list[CallHold]) -> Any:
        """The checked request, held in the call's memory budget (released at its end)."""
        hold = hold_for() if hold_for is not None else None
        if later is not None:
            if hold is not None:
                hold.check_carried(len(request))
            request = later(request)
        request = check(request)
        if hold is None:
            return request
        holds.append(hold)
        current_hold.set(hold)
        _on_end(context, hold.close)
        if not handler.request_streaming:
            hold.hold(request)
        elif not bidi:
            request = stream_holding(hold, request)
        return request

    def let_go(holds: list[CallHold]) -> None:
        for hold in holds:
            hold.close()

    def done(context: grpc.ServicerContext, exc: BaseException | None, t0: float) -> None:
        if observe is not None:
            try:
                observe(method, _code_of(context, exc), time.perf_counter() - t0,
                        current_tenant.get())
            except Exception:  # noqa: BLE001 - metrics never break a call
                log.warning("metrics observer failed", method=method)

    def unary(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            t0 = time.perf_counter()
            current_tenant.set("")      # a worker thread's last caller is not this one's
            current_hold.set(None)
            current_work.set(None)
            current_seat.set(None)
            release = _once(None)
            holds: list[CallHold] = []
            try:
                release = _once(before(context))
                _on_end(context, release)
                result = fn(admitted(request, context, holds), context)
            except Exception as exc:  # noqa: BLE001 - mapped to a status
                release()
                let_go(holds)
                done(context, exc, t0)
                if isinstance(exc, grpc.RpcError) or _aborted(context):
                    raise
                _abort(context, exc, request_id)
            release()
            let_go(holds)
            done(context, None, t0)
            return result
        return call

    def streaming(fn: Callable[..., Iterable[Any]]) -> Callable[..., Iterable[Any]]:
        def call(request: Any, context: grpc.ServicerContext) -> Iterable[Any]:
            t0 = time.perf_counter()
            current_tenant.set("")      # a worker thread's last caller is not this one's
            current_hold.set(None)
            current_work.set(None)
            current_seat.set(None)
            release = _once(None)
            holds: list[CallHold] = []
            try:
                release = _once(before(context))
                _on_end(context, release)
                first = True
                for item in fn(admitted(request, context, holds), context):
                    if first:           # a stream's later messages wait, not work: no seat
                        first = False
                        seat = current_seat.get()
                        if seat is not None:
                            seat()
                    yield item
            except Exception as exc:  # noqa: BLE001 - mapped to a status
                release()
                let_go(holds)
                done(context, exc, t0)
                if isinstance(exc, grpc.RpcError) or _aborted(context):
                    raise
                _abort(context, exc, request_id)
            finally:
                release()
                let_go(holds)
            done(context, None, t0)
        return call

    send = _passing_wire(handler.response_serializer)
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary(handler.unary_unary), None, send)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(streaming(handler.unary_stream), None, send)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary(handler.stream_unary), parse, send)
    return grpc.stream_stream_rpc_method_handler(streaming(handler.stream_stream), parse, send)


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


class FortisInterceptor(grpc.ServerInterceptor):
    """Auth (health and reflection exempt), tenant binding, error mapping.

    A caller proves who it is with, in this order: an API key (``x-api-key``), a bearer token
    (``authorization: Bearer <jwt>``, when OIDC issuers are configured), or its verified
    client certificate (when ``--tls-tenant-from`` is set). Each gives a tenant name; what
    follows (namespaces, quotas, metrics) does not know which."""

    def __init__(self, api_keys: Mapping[str, str] | KeyTable,
                 observe: Observer | None = None, call_slots: CallSlots | None = None,
                 drain: Drain | None = None, memory: MemoryBudget | None = None, *,
                 tokens: TokenVerifier | None = None,
                 cert_tenant: CertTenant | None = None,
                 work: WorkShare | None = None, seats: WorkShare | None = None,
                 call_rate: CallRate | None = None) -> None:
        # Hashed keys only: a plain mapping is hashed here and not kept.
        self._keys = api_keys if isinstance(api_keys, KeyTable) else KeyTable.from_plain(api_keys)
        self._observe = observe
        self._slots = call_slots
        self._drain = drain
        self._memory = memory
        self._tokens = tokens
        self._cert_tenant = cert_tenant
        self._work = work
        self._seats = seats if seats is not None and seats.enabled else None
        self._rate = call_rate
        self._audit = AuditLog()

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or method.startswith(_EXEMPT_PREFIXES):
            return handler
        md = dict(handler_call_details.invocation_metadata or ())
        api_key = md.get(API_KEY_HEADER, "")
        authorization = md.get(AUTHORIZATION_HEADER, "")
        acting_for = md.get(TENANT_HEADER, "")
        keys = self._keys
        tokens, cert_tenant, audit = self._tokens, self._cert_tenant, self._audit
        slots = self._slots
        drain = self._drain
        request_id = request_id_from(md)
        memory = self._memory
        work = self._work
        seats = self._seats if method not in UNSEATED_METHODS else None
        rate = self._rate
        who: dict[str, Any] = {}

        def hold_for() -> CallHold | None:
            if memory is None or "tenant" not in who:
                return None
            return CallHold(memory, who["tenant"], method, counted=not who["internal"])

        def before(context: grpc.ServicerContext) -> Callable[[], None] | None:
            # A handler thread serves many calls: start each from a clean log context.
            structlog.contextvars.clear_contextvars()
            structlog.contextvars.bind_contextvars(request_id=request_id, method=method)
            try:
                context.set_trailing_metadata(((REQUEST_ID_HEADER, request_id),))
            except Exception:  # noqa: BLE001 - test doubles of the context may lack it
                pass
            if drain is not None:   # SIGTERM: no new work (UNAVAILABLE), the rest counted
                drain.enter(context)
            internal = False
            bearer = ""
            if not keys.enabled and tokens is None and cert_tenant is None:
                tenant = acting_for or "default"    # auth disabled (single-user local mode)
            elif not api_key and (tokens is not None or cert_tenant is not None):
                ident, bearer = _other_identity(context, authorization, tokens, cert_tenant,
                                                method)
                tenant = ident.tenant       # a token or certificate never acts for another
                audit.note(ident, method, _peer(context))
            else:
                reason = ""
                tenant = keys.tenant_of(api_key) if api_key else ""
                if not api_key:
                    reason = "missing_key"
                elif not tenant:
                    reason = "unknown_key"
                if reason:
                    # Audit: never the key itself, not even a prefix of it.
                    log.warning("auth_failed", method=method, reason=reason,
                                peer=_peer(context))
                    raise errors.Unauthenticated(
                        f"missing API key: send metadata '{API_KEY_HEADER}'"
                        if reason == "missing_key" else "unknown API key")
                if tenant == SERVICE_TENANT:
                    tenant = acting_for or "default"
                    internal = True
                else:
                    audit.note(Identity(tenant=tenant, kind="api_key"), method, _peer(context))
            current_tenant.set(tenant)
            current_work.set(work)
            current_api_key.set(api_key)
            current_bearer.set(bearer)
            current_internal.set(internal or (not keys.enabled and tokens is None
                                              and cert_tenant is None))
            who.update(tenant=tenant, internal=internal)
            structlog.contextvars.bind_contextvars(tenant=tenant)
            if internal:
                return None
            # what the call holds, given back in reverse order when it ends (or here, if
            # a later step refuses it)
            admitted = contextlib.ExitStack()
            if slots is not None:
                if not slots.enter(tenant):
                    _refuse(tenant, "calls_in_progress", slots.limit(tenant),
                            "calls of this tenant in progress at once on this server "
                            "(--max-calls-per-tenant); retry when one has finished")
                admitted.callback(slots.leave, tenant)
            with admitted:
                if rate is not None:
                    _wait_for_turn(rate, tenant, context)
                if seats is not None:
                    seat = seats.hold(tenant, _stop_of(context))
                    current_seat.set(seat)
                    admitted.callback(seat)
                return admitted.pop_all().close

        return _wrap_handler(handler, before, method, self._observe, request_id, hold_for)


def _wait_for_turn(rate: CallRate, tenant: str, context: grpc.ServicerContext) -> None:
    """The tenant's next call start under ``--max-call-rate-per-tenant``: at once, after a
    short wait (the call holds its thread, counted in the tenant's calls in progress), or
    RESOURCE_EXHAUSTED when the turn is further away than the call's deadline or the most a
    call waits."""
    wait = rate.turn(tenant)
    remaining = getattr(context, "time_remaining", lambda: None)()
    if wait is None or (wait and remaining is not None and remaining < wait):
        _refuse(tenant, "call_rate", rate.limit(tenant),
                "calls of this tenant started per second on this server "
                "(--max-call-rate-per-tenant); retry after a short wait")
    if wait:
        time.sleep(wait)


def _refuse(tenant: str, reason: str, limit: int, what: str) -> NoReturn:
    """RESOURCE_EXHAUSTED for a tenant past one of its per-server quotas, with its audit line."""
    log.warning("call_refused", reason=reason, limit=limit)
    raise errors.QuotaExceeded([errors.QuotaViolation(f"tenant:{tenant}",
                                                      f"at most {limit} {what}")])


def _stop_of(context: Any) -> StopCheck:
    """The call's stop check (deadline, cancellation); a test double may lack either."""
    return caller_stop(getattr(context, "is_active", lambda: True),
                       getattr(context, "time_remaining", lambda: None))


def _other_identity(context: grpc.ServicerContext, authorization: str,
                    tokens: TokenVerifier | None, cert_tenant: CertTenant | None,
                    method: str) -> tuple[Identity, str]:
    """The identity of a call without an API key: its bearer token, else its client
    certificate; (identity, the token to forward). Refusals are logged with their reason,
    never with the token."""
    try:
        if authorization and tokens is not None:
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise errors.Unauthenticated(
                    f"metadata '{AUTHORIZATION_HEADER}' must be 'Bearer <token>'")
            return tokens.verify(token.strip()), token.strip()
        if cert_tenant is not None:
            try:
                auth = context.auth_context()
            except Exception:  # noqa: BLE001 - test doubles of the context may lack it
                auth = {}
            return cert_tenant.tenant_of(auth), ""
        raise errors.Unauthenticated(
            f"missing credentials: send metadata '{API_KEY_HEADER}' or "
            f"'{AUTHORIZATION_HEADER}: Bearer <token>'")
    except (errors.Unauthenticated, errors.Unavailable) as exc:
        kind = "oidc" if authorization and tokens is not None else (
            "mtls" if cert_tenant is not None else "none")
        log.warning("auth_failed", method=method, kind=kind, reason=exc.message[:200],
                    peer=_peer(context))
        raise


def _peer(context: grpc.ServicerContext) -> str:
    try:
        return str(context.peer())[:100]
    except Exception:  # noqa: BLE001 - test doubles of the context may lack it
        return ""


# -- Reflection: v1 and v1alpha, from the contracts' descriptor set (comments included) --------

#: The contracts as a FileDescriptorSet *with* source info (comments) plus google.rpc's status,
#: code and error_details; written by scripts/gen_protos.py. The _pb2 modules strip comments
#: and nothing imports error_details, so reflection from the default pool would serve neither.
DESCRIPTOR_SET = Path(__file__).with_name("fortis_descriptors.binpb")
#: Both reflection versions: buf curl and grpcurl ask for v1 first, older tools for v1alpha.
REFLECTION_SERVICES = ("grpc.reflection.v1.ServerReflection",
                       "grpc.reflection.v1alpha.ServerReflection")


def _v1_reflection_file() -> descriptor_pb2.FileDescriptorProto:
    """grpc/reflection/v1/reflection.proto, made from v1alpha's descriptor.

    grpcio-reflection 1.81 ships only v1alpha's stubs; v1 has the same messages under another
    package, so the wire format is identical and only the descriptor needs renaming.
    """
    fdp = descriptor_pb2.FileDescriptorProto.FromString(reflection_pb2.DESCRIPTOR.serialized_pb)
    old, new = ".grpc.reflection.v1alpha.", ".grpc.reflection.v1."
    fdp.name, fdp.package = "grpc/reflection/v1/reflection.proto", "grpc.reflection.v1"
    fdp.ClearField("options")
    for msg in fdp.message_type:
        for f in msg.field:
            if f.HasField("type_name"):  # scalars must keep it unset
                f.type_name = f.type_name.replace(old, new)
    for svc in fdp.service:
        for m in svc.method:
            m.input_type, m.output_type = (m.input_type.replace(old, new),
                                           m.output_type.replace(old, new))
    return fdp


class ReflectionServicer:
    """Serves grpc.reflection (v1 and v1alpha) from serialized files that keep their comments.

    The files come from DESCRIPTOR_SET first (documented contracts, google.rpc error details),
    then from the default pool for any registered service the set lacks (health, test
    services), so every listed service resolves.
    """

    def __init__(self, service_names: Iterable[str]) -> None:
        self._names = sorted(set(service_names))
        self._pool = descriptor_pool.DescriptorPool()
        self._files: dict[str, bytes] = {}
        if DESCRIPTOR_SET.exists():
            fds = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes())
            for fdp in fds.file:  # protoc writes dependencies first
                self._add(fdp.name, fdp.SerializeToString())
        else:
            log.warning("reflection without comments: descriptor set missing",
                        path=str(DESCRIPTOR_SET))
        v1 = _v1_reflection_file()
        self._add(v1.name, v1.SerializeToString())
        default = descriptor_pool.Default()
        for name in self._names:
            if self._find_file(name) is None:
                try:
                    self._add_from(default.FindFileContainingSymbol(name))
                except KeyError:
                    log.warning("reflection: no descriptor for service", service=name)

    def _add(self, name: str, serialized: bytes) -> None:
        if name not in self._files:
            self._pool.AddSerializedFile(serialized)
            self._files[name] = serialized

    def _add_from(self, fd: Any) -> None:
        for dep in fd.dependencies:
            if dep.name not in self._files:
                self._add_from(dep)
        self._add(fd.name, fd.serialized_pb)

    def _find_file(self, symbol: str) -> str | None:
        try:
            return str(self._pool.FindFileContainingSymbol(symbol).name)
        except KeyError:
            return None

    def _closure(self, name: str) -> list[bytes]:
        """The file and its transitive imports, the file first (as the reflection spec asks)."""
        order: list[str] = []
        todo = [name]
        while todo:
            n = todo.pop()
            if n not in order:
                order.append(n)
                todo.extend(d.name for d in self._pool.FindFileByName(n).dependencies)
        return [self._files[n] for n in order]

    def _answer(self, req: Any) -> Any:
        pb = reflection_pb2
        kind = req.WhichOneof("message_request")
        filename: str | None = None
        try:
            if kind == "file_by_filename":
                filename = req.file_by_filename if req.file_by_filename in self._files else None
            elif kind == "file_containing_symbol":
                filename = self._find_file(req.file_containing_symbol)
            elif kind == "file_containing_extension":
                ext = req.file_containing_extension
                msg = self._pool.FindMessageTypeByName(ext.containing_type)
                filename = self._pool.FindExtensionByNumber(msg, ext.extension_number).file.name
            elif kind == "all_extension_numbers_of_type":
                msg = self._pool.FindMessageTypeByName(req.all_extension_numbers_of_type)
                numbers = sorted(e.number for e in self._pool.FindAllExtensions(msg))
                return pb.ServerReflectionResponse(
                    original_request=req, all_extension_numbers_response=pb.ExtensionNumberResponse(
                        base_type_name=msg.full_name, extension_number=numbers))
            elif kind == "list_services":
                return pb.ServerReflectionResponse(
                    original_request=req, list_services_response=pb.ListServiceResponse(
                        service=[pb.ServiceResponse(name=n) for n in self._names]))
            else:
                return pb.ServerReflectionResponse(
                    original_request=req, error_response=pb.ErrorResponse(
                        error_code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                        error_message="unknown reflection request"))
        except KeyError:
            filename = None
        if filename is None:
            return pb.ServerReflectionResponse(
                original_request=req, error_response=pb.ErrorResponse(
                    error_code=grpc.StatusCode.NOT_FOUND.value[0], error_message="not found"))
        return pb.ServerReflectionResponse(
            original_request=req, file_descriptor_response=pb.FileDescriptorResponse(
                file_descriptor_proto=self._closure(filename)))

    def ServerReflectionInfo(self, requests: Iterable[Any],  # noqa: N802 - gRPC method name
                             context: grpc.ServicerContext) -> Iterable[Any]:
        for req in requests:
            yield self._answer(req)


def add_reflection(server: grpc.Server, service_names: Iterable[str]) -> ReflectionServicer:
    """Register reflection v1 and v1alpha (both exempt from API keys) on ``server``."""
    servicer = ReflectionServicer(service_names)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)
    server.add_generic_rpc_handlers(tuple(
        grpc.method_handlers_generic_handler(name, {"ServerReflectionInfo": handler})
        for name in REFLECTION_SERVICES))
    return servicer


@dataclass
class RunningServer:
    """A started server and the port it is bound to."""

    server: grpc.Server
    port: int
    health: health.HealthServicer
    address: str
    drain: Drain = field(default_factory=Drain)
    #: The decoded bytes each tenant's calls hold (None: unchecked).
    memory: MemoryBudget | None = None

    def begin_drain(self, grace: float) -> None:
        """First step of a graceful stop (on SIGTERM): health NOT_SERVING at once (to
        ``Check`` and to ``Watch``ers: probes fail, round_robin clients that watch health stop
        picking this server), new calls still served for ``min(ANNOUNCE_S, grace / 4)`` while
        those clients move, then refused with UNAVAILABLE. The listener stays open, so health
        goes on answering NOT_SERVING until :meth:`finish`."""
        self.health.enter_graceful_shutdown()
        announce = min(ANNOUNCE_S, max(0.0, grace) / 4)
        if announce > 0:
            time.sleep(announce)
        self.drain.refuse_new_calls()

    def finish(self, deadline: float) -> int:
        """Wait until the calls in progress end or ``deadline`` (``time.monotonic()``) passes,
        then stop: calls still running are cancelled (clients get UNAVAILABLE), health
        watches and reflection streams end. Returns the number of calls cut."""
        left = self.drain.wait(deadline - time.monotonic())
        self.server.stop(0).wait()
        return left

    def stop(self, grace: float | None = 1.0) -> None:
        """Drain (see :meth:`begin_drain`) and stop within ``grace`` seconds (None or 0: at
        once, cancelling the calls in progress, as ``grpc.Server.stop``)."""
        grace = grace or 0.0
        deadline = time.monotonic() + grace
        self.begin_drain(grace)
        self.finish(deadline)


def _certificate_config(pem: PemFiles) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(pem.key, pem.cert)],
                                                     root_certificates=pem.ca)


def _server_credentials(tls: TlsSettings) -> grpc.ServerCredentials:
    """TLS server credentials whose files are re-read when they change: gRPC asks before each
    new connection's handshake, so certificates rotate without a restart
    (``fortis.services.common.tls.PemReloader``)."""
    reloader = PemReloader(tls)

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        pem = reloader()
        return None if pem is None else _certificate_config(pem)
    return grpc.dynamic_ssl_server_credentials(
        _certificate_config(reloader.initial), fetch,
        require_client_authentication=tls.client_auth == "require")


def build_server(settings: ServerSettings,
                 register: Iterable[tuple[Callable[[Any, grpc.Server], None], Any, str]]
                 ) -> RunningServer:
    """Create, register, bind and start a server with health and reflection.

    ``register`` yields ``(add_XServicer_to_server, servicer, full_service_name)``. With
    ``settings.tls`` the server listens with TLS only (its files reloaded on change).
    """
    # Bad TLS files are the operator's InvalidArgument before anything starts.
    creds = _server_credentials(settings.tls) if settings.tls is not None else None
    opts = [("grpc.max_receive_message_length", settings.max_message_bytes),
            ("grpc.max_send_message_length", settings.max_message_bytes),
            ("grpc.so_reuseport", 0), *grpc_options.server_options(settings.max_connection_age_s)]
    drain = Drain()
    memory = None
    if settings.memory is not None:     # no answer past the message limit is ever worked on
        cap = settings.memory.max_response_bytes
        memory = MemoryBudget(dataclasses.replace(
            settings.memory, max_response_bytes=min(cap, settings.max_message_bytes)
            if cap else settings.max_message_bytes))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=settings.max_workers),
                         interceptors=[FortisInterceptor(settings.api_keys, settings.observe,
                                                       settings.call_slots, drain, memory,
                                                       tokens=settings.tokens,
                                                       cert_tenant=settings.cert_tenant,
                                                       work=settings.work,
                                                       seats=settings.seats,
                                                       call_rate=settings.call_rate)],
                         options=opts)
    health_servicer = FortisHealthServicer()   # no deadlock on Watch close (common/health.py)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [*REFLECTION_SERVICES, health.SERVICE_NAME]
    for add, servicer, name in register:
        add(servicer, server)
        names.append(name)
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    add_reflection(server, names)
    try:
        port = (server.add_secure_port(settings.address, creds) if creds is not None
                else server.add_insecure_port(settings.address))
    except RuntimeError:            # grpcio raises on a port in use (newer versions)
        port = 0
    if port == 0:
        server.stop(None)
        raise errors.Unavailable(f"cannot listen on {settings.address}: address in use "
                                 "or not available")
    server.start()
    host = settings.address.rsplit(":", 1)[0]
    address = f"{host}:{port}"
    log.info("server started", address=address, services=names[len(REFLECTION_SERVICES) + 1:],
             tls="off" if settings.tls is None else f"client_auth={settings.tls.client_auth}")
    return RunningServer(server=server, port=port, health=health_servicer, address=address,
                         drain=drain, memory=memory)


def channel(address: str, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
            tls: TlsSettings | None = None) -> grpc.Channel:
    """A client channel with Fortis's message limits; with ``tls``, an internal channel over
    TLS that trusts ``tls.ca_file`` and presents the service's own certificate (mTLS)."""
    opts: list[tuple[str, Any]] = [("grpc.max_receive_message_length", max_message_bytes),
                                   ("grpc.max_send_message_length", max_message_bytes),
                                   *grpc_options.client_options(address)]   # dns:///: round_robin
    if tls is None:
        return grpc.insecure_channel(address, options=opts)
    pem = load_pem(tls)
    creds = grpc.ssl_channel_credentials(root_certificates=pem.ca, private_key=pem.key,
                                         certificate_chain=pem.cert)
    return grpc.secure_channel(address, creds, options=opts + channel_options(tls))


def call_metadata(api_key: str, tenant: str = "") -> tuple[tuple[str, str], ...]:
    """Metadata of a call made with ``api_key`` (for ``tenant`` when it is the internal key).
    Without a key, inside a call that came with a bearer token, that token is forwarded."""
    md: list[tuple[str, str]] = []
    if api_key:
        md.append((API_KEY_HEADER, api_key))
    elif current_bearer.get():
        md.append((AUTHORIZATION_HEADER, f"Bearer {current_bearer.get()}"))
    if tenant:
        md.append((TENANT_HEADER, tenant))
    return tuple(md)


def error_from_rpc(exc: grpc.RpcError) -> errors.FortisError:
    """Turn a failed call back into the domain error it carries (client side): the same
    class, with the same details, via the one error model (``fortis.client.errors``)."""
    return from_rpc_error(exc)
