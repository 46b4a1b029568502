"""The server interceptor: authentication (API key, bearer token or client certificate;
health and reflection exempt), tenant binding, and the per-tenant admission of each call
(call slots, call rate, seats) before the wrapped handler (``call_handler.py``) runs it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import grpc
import structlog
from fortis.infra.serving.admission import (
    UNSEATED_METHODS,
    Drain,
    refuse,
    wait_for_turn,
)
from fortis.infra.serving.api_keys import KeyTable
from fortis.infra.serving.call_context import (
    API_KEY_HEADER,
    AUTHORIZATION_HEADER,
    REQUEST_ID_HEADER,
    SERVICE_TENANT,
    TENANT_HEADER,
    current_api_key,
    current_bearer,
    current_internal,
    current_seat,
    current_tenant,
    current_work,
    request_id_from,
    stop_of,
)
from fortis.infra.serving.call_handler import Observer, wrap_handler
from fortis.infra.serving.identity import AuditLog, CertTenant, Identity, TokenVerifier
from fortis.infra.serving.memory import CallHold, MemoryBudget
from fortis.infra.serving.quotas import CallRate, CallSlots
from fortis.infra.serving.tracing import ServerCall
from fortis.infra.serving.tracing import trace_ids as _trace_ids
from fortis.infra.serving.workshare import WorkShare
from fortis.services.common import errors

log = structlog.get_logger("fortis.server")

_EXEMPT_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


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
        # A caller's trace context is a parent only when the caller is trusted (tracing.py):
        # another Fortis service (the internal key), or anyone when auth is off.
        auth_off = not keys.enabled and tokens is None and cert_tenant is None
        trusted = auth_off or (
            "traceparent" in md and bool(api_key)
            and keys.tenant_of(api_key) == SERVICE_TENANT)
        call_trace = ServerCall(method, md, trusted)

        def hold_for() -> CallHold | None:
            if memory is None or "tenant" not in who:
                return None
            return CallHold(memory, who["tenant"], method, counted=not who["internal"])

        def before(context: grpc.ServicerContext) -> Callable[[], None] | None:
            # A handler thread serves many calls: start each from a clean log context.
            structlog.contextvars.clear_contextvars()
            structlog.contextvars.bind_contextvars(request_id=request_id, method=method)
            call_trace.start()
            structlog.contextvars.bind_contextvars(**_trace_ids())
            try:
                context.set_trailing_metadata(((REQUEST_ID_HEADER, request_id),))
            except Exception:  # noqa: BLE001 - test doubles of the context may lack it
                pass
            if drain is not None:   # SIGTERM: no new work (UNAVAILABLE), the rest counted
                drain.enter(context)
            tenant, internal, bearer = _identify(context, method, keys, tokens, cert_tenant,
                                                 audit, api_key, authorization, acting_for)
            current_tenant.set(tenant)
            current_work.set(work)
            current_api_key.set(api_key)
            current_bearer.set(bearer)
            current_internal.set(internal or (not keys.enabled and tokens is None
                                              and cert_tenant is None))
            who.update(tenant=tenant, internal=internal)
            structlog.contextvars.bind_contextvars(tenant=tenant)
            call_trace.tenant(tenant)
            if internal:
                return None
            return _admit(context, tenant, slots, rate, seats)

        return wrap_handler(handler, before, method, self._observe, request_id, hold_for,
                            traced=call_trace)


def _identify(context: grpc.ServicerContext, method: str, keys: KeyTable,
              tokens: TokenVerifier | None, cert_tenant: CertTenant | None, audit: AuditLog,
              api_key: str, authorization: str, acting_for: str) -> tuple[str, bool, str]:
    """(tenant, internal, bearer token to forward) of a call: from its API key, else its
    bearer token or client certificate; with auth off, the tenant it acts for. Refusals are
    UNAUTHENTICATED, logged with their reason and never with the key."""
    if not keys.enabled and tokens is None and cert_tenant is None:
        return acting_for or "default", False, ""   # auth disabled (single-user local mode)
    if not api_key and (tokens is not None or cert_tenant is not None):
        ident, bearer = _other_identity(context, authorization, tokens, cert_tenant, method)
        audit.note(ident, method, _peer(context))
        return ident.tenant, False, bearer  # a token or certificate never acts for another
    reason = ""
    tenant = keys.tenant_of(api_key) if api_key else ""
    if not api_key:
        reason = "missing_key"
    elif not tenant:
        reason = "unknown_key"
    if reason:
        # Audit: never the key itself, not even a prefix of it.
        log.warning("auth_failed", method=method, reason=reason, peer=_peer(context))
        raise errors.Unauthenticated(
            f"missing API key: send metadata '{API_KEY_HEADER}'"
            if reason == "missing_key" else "unknown API key")
    if tenant == SERVICE_TENANT:
        return acting_for or "default", True, ""
    audit.note(Identity(tenant=tenant, kind="api_key"), method, _peer(context))
    return tenant, False, ""


def _admit(context: grpc.ServicerContext, tenant: str, slots: CallSlots | None,
           rate: CallRate | None, seats: WorkShare | None) -> Callable[[], None]:
    """Take the tenant's call slot, wait for its call-rate turn and take its seat; what to
    run when the call ends to give them back (RESOURCE_EXHAUSTED, nothing kept, when one is
    refused)."""
    # what the call holds, given back in reverse order when it ends (or here, if a later
    # step refuses it)
    admitted = contextlib.ExitStack()
    if slots is not None:
        if not slots.enter(tenant):
            refuse(tenant, "calls_in_progress", slots.limit(tenant),
                   "calls of this tenant in progress at once on this server "
                   "(--max-calls-per-tenant); retry when one has finished")
        admitted.callback(slots.leave, tenant)
    with admitted:
        if rate is not None:
            wait_for_turn(rate, tenant, context)
        if seats is not None:
            seat = seats.hold(tenant, stop_of(context))
            current_seat.set(seat)
            admitted.callback(seat)
        return admitted.pop_all().close


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


