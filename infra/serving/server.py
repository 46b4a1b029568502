"""Shared gRPC server plumbing: the factory every service uses, auth and error mapping.

Transport only. Domain code raises ``fortis.services.common.errors`` exceptions; the handler
wrapper maps them to status codes with google.rpc rich details (see docs/architecture.md,
section 4), so a bad request never takes a service down and internals never leak.

Made of parts, each imported from its own module: ``call_context.py`` (metadata keys and
what a call knows of its caller), ``admission.py`` (draining, call rate, quota refusals),
``call_handler.py`` (the wrapper around every handler), ``interceptor.py`` (authentication
and per-tenant admission) and ``reflection.py``; this module builds and stops the server.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import structlog
from fortis.client.errors import from_rpc_error
from fortis.infra.serving import grpc_options
from fortis.infra.serving.admission import (
    Drain,
)
from fortis.infra.serving.api_keys import KeyTable
from fortis.infra.serving.call_context import (
    API_KEY_HEADER,
    AUTHORIZATION_HEADER,
    TENANT_HEADER,
    current_bearer,
)
from fortis.infra.serving.call_handler import Observer
from fortis.infra.serving.health import HealthServicer as FortisHealthServicer
from fortis.infra.serving.identity import CertTenant, TokenVerifier
from fortis.infra.serving.interceptor import FortisInterceptor
from fortis.infra.serving.memory import MemoryBudget, MemoryLimits
from fortis.infra.serving.quotas import CallRate, CallSlots
from fortis.infra.serving.reflection import (
    REFLECTION_SERVICES,
    add_reflection,
)
from fortis.infra.serving.tls import PemFiles, PemReloader, TlsSettings, channel_options, load_pem
from fortis.infra.serving.tracing_grpc import traced
from fortis.infra.serving.workshare import WorkShare
from fortis.services.common import errors
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

log = structlog.get_logger("fortis.server")

#: Default largest message, bytes (a batch of 64 224x224 RGB PNGs is well under this).
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


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
    #: Bearer tokens accepted beside API keys (OIDC issuers, infra/serving/identity.py).
    tokens: TokenVerifier | None = None
    #: The tenant taken from a verified client certificate (``--tls-tenant-from``).
    cert_tenant: CertTenant | None = None
    #: Decoded bytes per request and per tenant in flight, and the answer's size, checked
    #: before a servicer decodes anything (``infra/serving/memory.py``). None: unchecked.
    memory: MemoryLimits | None = field(default_factory=MemoryLimits)
    #: The tenant-fair share of CPU-heavy work (``infra/serving/workshare.py``), the same
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
    (``fortis.infra.serving.tls.PemReloader``)."""
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
    TLS that trusts ``tls.ca_file`` and presents the service's own certificate (mTLS). Its
    calls are traced and carry the trace context (``tracing_grpc``)."""
    opts: list[tuple[str, Any]] = [("grpc.max_receive_message_length", max_message_bytes),
                                   ("grpc.max_send_message_length", max_message_bytes),
                                   *grpc_options.client_options(address)]   # dns:///: round_robin
    if tls is None:
        return traced(grpc.insecure_channel(address, options=opts))
    pem = load_pem(tls)
    creds = grpc.ssl_channel_credentials(root_certificates=pem.ca, private_key=pem.key,
                                         certificate_chain=pem.cert)
    return traced(grpc.secure_channel(address, creds, options=opts + channel_options(tls)))


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


#: The server's public names, several defined in the modules it is made of (call_context,
#: admission, call_handler, interceptor, reflection) and importable from here as before.
__all__ = ["ANNOUNCE_S", "DEFAULT_MAX_MESSAGE_BYTES", "RunningServer", "ServerSettings", "build_server",
           "call_metadata", "channel", "error_from_rpc"]
