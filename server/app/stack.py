"""One wiring point for every service, the composition root (docs/architecture.md); nothing
starts at import. ``start_stack`` runs all five services in one process on one port (the embedded
default) or a single service (``only=``), plus the built-in target adapters it is asked for.

The settings live in ``server/app/settings.py`` and the gRPC-free pieces in
``server/app/parts.py``; their public names are importable from here as before.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from fortis.infra.serving import grpc_options
from fortis.infra.serving.api_keys import KeyFileWatcher, KeyTable, new_api_key
from fortis.infra.serving.call_context import SERVICE_TENANT
from fortis.infra.serving.quotas import CallRate, CallSlots
from fortis.infra.serving.server import (
    RunningServer,
    ServerSettings,
    build_server,
    call_metadata,
    channel,
)
from fortis.infra.serving.startup import EXIT_LISTEN, EXIT_MODELS, step
from fortis.infra.serving.tls import TlsSettings
from fortis.infra.serving.workprocs import PieceProcesses
from fortis.infra.serving.workshare import WorkShare, default_slots
from fortis.server.app.parts import (
    builtin_target,
    check_settings,
    dataset_stores,
    evaluation_executor,
    identity,
    metrics_registry,
    open_blob_store,
    open_storage,
    whitebox_policy,
)
from fortis.server.app.parts import (
    local_catalogue as local_catalogue,
)
from fortis.server.app.settings import (
    BUILTIN_MODELS_HINT,
    StackSettings,
    TargetConfig,
)
from fortis.server.app.settings import (
    DEFAULT_TARGETS as DEFAULT_TARGETS,
)
from fortis.server.app.settings import (
    SERVICES as SERVICES,
)
from fortis.services.common import errors

log = structlog.get_logger("fortis.app")


@dataclass
class Stack:
    server: RunningServer
    target_servers: dict[str, RunningServer]
    settings: StackSettings
    internal_key: str
    closers: list[Any] = field(default_factory=list)
    metrics_port: int | None = None
    #: The evaluation manager, when this stack runs the evaluation service.
    manager: Any = None
    #: The hashed API keys in force (KeyTable), and the key file's watcher (if any).
    key_table: Any = None
    key_watcher: Any = None
    #: The tenant-fair share of this process's CPU-heavy work, and of its call handlers.
    work: WorkShare | None = None
    seats: WorkShare | None = None

    @property
    def address(self) -> str:
        return self.server.address

    def stop(self, grace: float = 0.5, *, worker_wait: float = 2.0) -> list[str]:
        """Drain and stop, in an order that keeps in-flight work consistent (SIGTERM
        must end the process in bounded time; every service drains in-flight work
        and exits within the pod's grace period): health NOT_SERVING first (probes fail,
        clients watching health move to other replicas), the evaluation manager next (running
        evaluations stop at their next item and stay RUNNING, resumed by the next start;
        WatchEvaluation streams end UNAVAILABLE), then new calls refused (UNAVAILABLE) while
        the calls in progress get up to ``grace`` seconds and the evaluation workers
        ``worker_wait`` more, health still answering NOT_SERVING; then the server stops
        (calls still running are cancelled), and only then the ledger, channels and back
        ends the calls used. Returns the evaluations whose worker was still busy after
        ``worker_wait`` seconds: the caller decides whether to cut them short (``fortis
        serve`` does)."""
        deadline = time.monotonic() + max(0.0, grace)
        self.server.health.enter_graceful_shutdown()
        if self.manager is not None:
            self.manager.close()
        self.server.begin_drain(grace)
        self.server.drain.wait(deadline - time.monotonic())
        busy: list[str] = []
        if self.manager is not None:
            busy = self.manager.wait_idle(worker_wait)
        cut = self.server.finish(deadline)
        if cut:
            log.warning("shutdown: calls cut at the end of the grace period", calls=cut)
        for s in self.target_servers.values():
            s.stop(max(0.0, deadline - time.monotonic()))
        for c in self.closers:
            try:
                c()
            except Exception:  # noqa: BLE001 - best effort on shutdown
                log.warning("shutdown: a closer failed", closer=getattr(c, "__qualname__", "?"))
        return busy


class _ProxyBuiltinTargets(Mapping[str, Sequence[str]]):
    """Built-in model -> the proxy's targets serving it, asked of the proxy over its contract
    (``GetBuiltinTargets``, with the internal key) and kept a minute: the proxy's targets
    change only when it restarts. A proxy that cannot be asked fails the check (UNAVAILABLE),
    so no surrogate is let through because the answer was missing."""

    TTL_S = 60.0

    def __init__(self, stub: Any, internal_key: str) -> None:
        self._stub_factory = stub
        self._stub: Any = None
        self._key = internal_key
        self._cache: dict[str, list[str]] = {}
        self._at = float("-inf")

    def _table(self) -> dict[str, list[str]]:
        now = time.monotonic()
        if now - self._at > self.TTL_S:
            import grpc
            from fortis.infra.serving.server import call_metadata
            from fortis.proxy.v1 import proxy_pb2
            if self._stub is None:
                self._stub = self._stub_factory()
            try:
                resp = self._stub.GetBuiltinTargets(proxy_pb2.GetBuiltinTargetsRequest(),
                                                     metadata=call_metadata(self._key),
                                                     timeout=10)
            except grpc.RpcError as exc:
                log.warning("builtin_targets_unavailable", code=str(exc.code()))
                raise errors.Unavailable(
                    "the target proxy could not be asked which targets share a surrogate's "
                    "weights; try again") from None
            self._cache = {m.model: list(m.targets) for m in resp.models}
            self._at = now
        return self._cache

    def __getitem__(self, model: str) -> Sequence[str]:
        return self._table()[model]

    def __iter__(self) -> Any:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

def start_target_server(cfg: TargetConfig, *, max_message_bytes: int = 64 * 1024 * 1024,
                        target: Any = None) -> RunningServer:
    """Serve a built-in model through ``TargetService`` on its own loopback port (only when
    asked: by default the proxy calls built-in targets in process, so they are reachable
    through the proxy alone, with its budget, rate limit and ledger)."""
    from fortis.adapters.torch_target import SERVICE_NAME, TargetServicer
    from fortis.target.v1 import target_pb2_grpc
    return build_server(ServerSettings(address="127.0.0.1:0", max_message_bytes=max_message_bytes),
                        [(target_pb2_grpc.add_TargetServiceServicer_to_server,
                          TargetServicer(target if target is not None else builtin_target(cfg)),
                          SERVICE_NAME)])


def _key_table(settings: StackSettings, internal_key: str
               ) -> tuple[KeyTable, KeyFileWatcher | None]:
    """The hashed key table of a stack: plain keys of ``settings.api_keys`` hashed
    now, ``key_entries`` as given, the key file loaded and watched, and the internal service
    key (in memory only) when auth is on. No key anywhere: auth off (local mode)."""
    table = KeyTable()
    if settings.api_keys or settings.key_entries:
        plain = KeyTable.from_plain(settings.api_keys).entries()
        table.set_source("static", (*plain, *settings.key_entries))
    watcher = None
    if settings.api_keys_file is not None:
        watcher = KeyFileWatcher(settings.api_keys_file, table,
                                 interval_s=settings.api_keys_reload_s).start()
    if table.enabled or settings.oidc_issuers or settings.tls_tenant_from:
        table.add_key("internal", internal_key, SERVICE_TENANT)
    return table, watcher


def _check_loopback_tls(server: RunningServer, ch: Any, tls: TlsSettings) -> None:
    """Embedded mode over TLS: the services call each other at the server's own address, so
    its certificate must verify for that name (or ``tls.server_name``). Checked once at start
    with a health call, so a mismatch is a clear start error, not failed evaluations later."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    try:
        health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
    except Exception:  # noqa: BLE001 - any failure here is the same start error
        server.stop(None)
        host = server.address.rsplit(":", 1)[0]
        name = tls.server_name or host
        raise errors.InvalidArgument(
            "tls_server_name", f"the services call each other at {host[:100]} over TLS and the "
            f"handshake failed verifying the name '{name[:100]}' against --tls-ca: give "
            "--tls-server-name with a name the certificate holds (and a client certificate "
            "the CA signed when --tls-client-auth require)") from None


#: The services' and adapters' modules, imported in this order by the first start-up step, so
#: a package they need that is missing is named as an installation problem before anything
#: starts (the steps below import what they use from these, already loaded).
_SERVICE_MODULES = (
    "fortis.adapters.builtin",
    "fortis.adapters.plan_sources",
    "fortis.evaluation.v1.evaluation_pb2_grpc",
    "fortis.perturbation.v1.perturbation_pb2_grpc",
    "fortis.proxy.v1.proxy_pb2_grpc",
    "fortis.report.v1.report_pb2_grpc",
    "fortis.scoring.v1.scoring_pb2_grpc",
    "fortis.infra.serving.metrics",
    "fortis.services.evaluation.servicer",
    "fortis.services.evaluation.clients",
    "fortis.services.evaluation.datasets",
    "fortis.services.evaluation.service",
    "fortis.services.evaluation.store",
    "fortis.services.report.servicer",
    "fortis.services.scoring.servicer",
    "fortis.services.proxy.servicer",
    "fortis.services.proxy.backends",
    "fortis.services.proxy.ledger",
    "fortis.services.proxy.metrics",
    "fortis.services.proxy.proxy",
    "fortis.services.proxy.quotas",
    "fortis.services.proxy.ratelimit",
    "prometheus_client",
)


@dataclass
class _Wiring:
    """What the start-up steps of one stack share: the services wanted, where state lives,
    what to close on stop, the servicers to register and the lazily dialled channels between
    services (the server is built last, so its own address is known only after binding)."""

    settings: StackSettings
    wanted: set[str]
    state: Path
    internal_key: str
    closers: list[Any]
    registry: Any
    tenant_label: Any
    work: WorkShare
    seats: WorkShare
    register: list[tuple[Any, Any, str]] = field(default_factory=list)
    target_servers: dict[str, RunningServer] = field(default_factory=dict)
    addr_box: dict[str, str] = field(default_factory=dict)
    lazy_channels: dict[str, Any] = field(default_factory=dict)
    blob_store: Any = None

    def addr(self, name: str, explicit: str) -> str:
        if explicit:
            return explicit
        if name in self.wanted:
            return self.addr_box["self"]
        raise errors.InvalidArgument(f"{name}_address", f"running only '{self.settings.only}': give the {name} service's address")

    def lazy_channel(self, address: str) -> Any:
        if address not in self.lazy_channels:
            self.lazy_channels[address] = channel(
                address, max_message_bytes=self.settings.max_message_bytes, tls=self.settings.tls)
            self.closers.append(self.lazy_channels[address].close)
        return self.lazy_channels[address]

    def proxy_stub(self) -> Any:
        from fortis.proxy.v1 import proxy_pb2_grpc
        return proxy_pb2_grpc.TargetProxyServiceStub(
            self.lazy_channel(self.addr("proxy", self.settings.proxy_address)))


class _LazyProxyStub:
    """Proxy stub resolved on first use (the server's own address is known after bind)."""

    def __init__(self, wiring: _Wiring) -> None:
        self._wiring = wiring

    def __getattr__(self, item: str) -> Any:
        return getattr(self._wiring.proxy_stub(), item)


def _load_modules() -> None:
    with step("modules", EXIT_MODELS, hint=BUILTIN_MODELS_HINT):
        for name in _SERVICE_MODULES:
            importlib.import_module(name)


def _authentication(settings: StackSettings, internal_key: str, closers: list[Any]
                    ) -> tuple[KeyTable, KeyFileWatcher | None, Any, Any]:
    """The key table (and its file's watcher), the token verifier and the certificate rule."""
    with step("API keys"):
        key_table, key_watcher = _key_table(settings, internal_key)
    if key_watcher is not None:
        closers.append(key_watcher.close)
    with step("API keys"):
        tokens, cert_tenant = identity(settings)
    return key_table, key_watcher, tokens, cert_tenant


def _target_entries(w: _Wiring, redis_store: Any) -> list[Any]:
    """The proxy's targets: built-in models loaded now and called in process, the others'
    back ends (gRPC, gRPC over TLS, or a registry scheme)."""
    from fortis.services.proxy.backends import GrpcTargetBackend, TargetTls
    from fortis.services.proxy.proxy import TargetEntry
    from fortis.services.proxy.ratelimit import RateLimiter

    settings = w.settings
    entries = []
    for t in settings.targets:
        backend: Any
        if t.builtin:
            # Loaded now, called in process (no port to bypass the proxy): a package or
            # weights file it lacks is named here, with the target.
            with step("built-in targets", EXIT_MODELS, hint=BUILTIN_MODELS_HINT,
                      subject=f"target '{t.name}' (builtin:{t.builtin})"):
                backend = builtin_target(t)
            if settings.expose_builtin_targets:
                with step("gRPC address", EXIT_LISTEN):
                    w.target_servers[t.name] = start_target_server(
                        t, max_message_bytes=settings.max_message_bytes, target=backend)
        else:
            with step("targets configuration"):
                if t.url:
                    from fortis.adapters.registry import backend_for
                    backend = backend_for(t.url)
                else:
                    backend = GrpcTargetBackend(t.address, tls=TargetTls(
                        ca=t.tls_ca, cert=t.tls_cert, key=t.tls_key,
                        server_name=t.tls_server_name) if t.tls else None)
        if hasattr(backend, "close"):
            w.closers.append(backend.close)
        entries.append(TargetEntry(name=t.name, backend=backend,
                                   limiter=RateLimiter(
                                       t.images_per_second, key=f"target:{t.name}",
                                       store=redis_store and redis_store.limiter),
                                   tenants=t.tenants, max_batch=t.max_batch,
                                   builtin_model=t.builtin or "", price_per_1000=t.price_per_1000))
    return entries


def _add_proxy(w: _Wiring, pg_ledger: Any) -> None:
    """The target proxy: its Redis (limits and budgets shared by replicas), targets and ledger."""
    from fortis.proxy.v1 import proxy_pb2_grpc
    from fortis.services.proxy import servicer as px_servicer
    from fortis.services.proxy.ledger import Ledger
    from fortis.services.proxy.metrics import ProxyMetrics
    from fortis.services.proxy.proxy import TargetProxy
    from fortis.services.proxy.quotas import DailyQueryQuotas
    from fortis.services.proxy.ratelimit import TenantLimits

    settings = w.settings
    redis_store: Any = None
    if settings.redis_url:
        with step("state"):
            from fortis.services.proxy.redis_store import RedisStore
            redis_store = RedisStore.connect(settings.redis_url,
                                             namespace=settings.redis_namespace)
        w.closers.append(redis_store.close)
        redis_store.ping()      # a Redis down now is logged; calls fail closed until it answers
    entries = _target_entries(w, redis_store)
    with step("state"):
        ledger = pg_ledger if pg_ledger is not None else Ledger(
            w.state / "ledger.sqlite", synchronous=settings.ledger_synchronous)
    w.closers.append(ledger.close)
    proxy_metrics = ProxyMetrics(w.registry, w.tenant_label)
    w.register.append((proxy_pb2_grpc.add_TargetProxyServiceServicer_to_server,
                       px_servicer.TargetProxyServicer(TargetProxy(
                           ledger, entries, metrics=proxy_metrics,
                           tenant_limits=TenantLimits(
                               settings.tenant_rates,
                               store=redis_store and redis_store.limiter),
                           daily_quotas=DailyQueryQuotas(
                               settings.quotas.queries_per_day_limit) if redis_store is None
                           else redis_store.daily_quotas(settings.quotas.queries_per_day_limit),
                           shared_budgets=redis_store and redis_store.budgets,
                           work=w.work)),
                       px_servicer.SERVICE_NAME))


def _add_perturbation(w: _Wiring) -> None:
    """The perturbation service, with its surrogates: built-ins, the operator's folder (named
    like built-ins) and the calling tenant's uploaded models (by blob id, never a path;
    IEEE-P6 mapping), each checked against the white-box grants (IEEE-A7)."""
    # The one service that needs torch: imported only when it runs, so the slim image
    # (no torch) serves the proxy, scoring and report services.
    with step("modules", EXIT_MODELS, hint=BUILTIN_MODELS_HINT):
        from fortis.adapters.builtin import BUILTIN_MODELS
        from fortis.adapters.torch_models.surrogate import (
            OperatorSurrogates,
            SurrogateCache,
            TenantSurrogates,
        )
        from fortis.services.perturbation import servicer as pt_servicer
    from fortis.adapters.builtin import load_model
    from fortis.infra.serving.call_context import current_tenant
    from fortis.perturbation.v1 import perturbation_pb2_grpc

    settings = w.settings
    model_blobs = w.blob_store
    assert model_blobs is not None
    sur_cache = SurrogateCache()
    with step("surrogates"):
        # Its manifests are read when a plan names them (added without a restart), but a
        # folder that is not there is a typo or a missing mount: said now.
        if settings.surrogate_dir is not None and not Path(settings.surrogate_dir).is_dir():
            raise errors.InvalidArgument("surrogate_dir", f"'{str(settings.surrogate_dir)[:200]}'"
                                         " is not a folder")
        operator_surrogates = OperatorSurrogates(settings.surrogate_dir, sur_cache)
    tenant_surrogates = TenantSurrogates(
        lambda tenant, blob_id, field: model_blobs.path_of(tenant, blob_id, field,
                                                           kind="model"), sur_cache)

    def surrogate_loader(name: str, field: str) -> Any:
        if name not in BUILTIN_MODELS and name in operator_surrogates:
            return operator_surrogates.load(name, field)
        return load_model(name, field)

    whitebox = whitebox_policy(settings, w.wanted, tuple(BUILTIN_MODELS), operator_surrogates,
                               lambda: _ProxyBuiltinTargets(w.proxy_stub, w.internal_key))
    w.register.append((perturbation_pb2_grpc.add_PerturbationServiceServicer_to_server,
                       pt_servicer.PerturbationServicer(
                           proxy_stub=_LazyProxyStub(w),  # type: ignore[arg-type]
                           surrogate_loader=surrogate_loader,
                           tenant_surrogates=lambda spec, field: tenant_surrogates.load(
                               current_tenant.get(), spec, field),
                           surrogate_names=lambda: (*BUILTIN_MODELS,
                                                    *operator_surrogates.names()),
                           surrogate_access=lambda name, field, rpc: whitebox.check(
                               current_tenant.get(), name, field, audit=rpc),
                           # neural_style's uploaded models: the servicer binds the calling
                           # tenant; the model root stays $FORTIS_MODEL_ROOT
                           model_blobs=lambda tenant, blob_id, field: model_blobs.path_of(
                               tenant, blob_id, field, kind="model")),
                       pt_servicer.SERVICE_NAME))


def _add_scoring(w: _Wiring) -> None:
    from fortis.scoring.v1 import scoring_pb2_grpc
    from fortis.services.scoring import servicer as sc_servicer

    pieces = None
    if w.settings.work_processes != 0:
        # the metrics' chains hold an interpreter lock for seconds: not this process's
        pieces = PieceProcesses(
            w.settings.work_processes or w.work.slots or default_slots(),
            preload=["fortis.services.scoring.catalogue",
                     "fortis.services.scoring.evaluation_scoring"])
        w.closers.append(pieces.close)
    w.register.append((scoring_pb2_grpc.add_ScoringServiceServicer_to_server,
                       sc_servicer.ScoringServicer(pieces), sc_servicer.SERVICE_NAME))


def _add_report(w: _Wiring) -> None:
    from fortis.report.v1 import report_pb2_grpc
    from fortis.services.report import servicer as rp_servicer

    w.register.append((report_pb2_grpc.add_ReportServiceServicer_to_server,
                       rp_servicer.ReportServicer(), rp_servicer.SERVICE_NAME))


def _add_evaluation(w: _Wiring, pg_store: Any) -> Any:
    """The evaluation service and its upload service; returns the evaluation manager."""
    from fortis.adapters.plan_sources import BUILTIN_SOURCES
    from fortis.evaluation.v1 import evaluation_pb2_grpc
    from fortis.services.evaluation import servicer as ev_servicer
    from fortis.services.evaluation.clients import (
        GrpcPerturbation,
        GrpcProxy,
        GrpcReport,
        GrpcScoring,
    )
    from fortis.services.evaluation.datasets import PlanDatasets
    from fortis.services.evaluation.service import EvaluationManager, Ports
    from fortis.services.evaluation.store import EvaluationStorage, EvaluationStore

    settings = w.settings

    def ports_for(tenant: str) -> Ports:
        md = call_metadata(w.internal_key, tenant)
        return Ports(
            proxy=GrpcProxy(w.lazy_channel(w.addr("proxy", settings.proxy_address)), md),
            perturbation=GrpcPerturbation(w.lazy_channel(w.addr("perturbation", settings.perturbation_address)), md),
            scoring=GrpcScoring(w.lazy_channel(w.addr("scoring", settings.scoring_address)), md),
            report=GrpcReport(w.lazy_channel(w.addr("report", settings.report_address)), md))

    with step("state"):
        store: EvaluationStorage = pg_store if pg_store is not None else EvaluationStore(
            w.state / "evaluations.sqlite")
    if pg_store is not None:
        w.closers.append(pg_store.close)
    datasets = PlanDatasets(BUILTIN_SOURCES, data_root=settings.data_root, blobs=w.blob_store,
                            stores=dataset_stores(settings.dataset_stores))
    manager = EvaluationManager(store, ports_for=ports_for, datasets=datasets,
                                workers=settings.evaluation_workers, quotas=settings.quotas)
    w.register.append((evaluation_pb2_grpc.add_EvaluationServiceServicer_to_server,
                       ev_servicer.EvaluationServicer(manager, heartbeat_s=settings.watch_heartbeat_s), ev_servicer.SERVICE_NAME))
    from fortis.evaluation.v1 import uploads_pb2_grpc
    from fortis.services.evaluation import uploads as ev_uploads
    assert w.blob_store is not None
    w.register.append((uploads_pb2_grpc.add_UploadServiceServicer_to_server,
                       ev_uploads.UploadServicer(w.blob_store), ev_uploads.SERVICE_NAME))
    return manager


def _serve(w: _Wiring, key_table: KeyTable, tokens: Any, cert_tenant: Any,
           rpc_metrics: Any) -> RunningServer:
    """The one server of every registered service, with the per-tenant call limits; in
    embedded mode over TLS, checked to verify its own name for the services' loopback calls."""
    settings = w.settings
    slots = CallSlots(settings.quotas.calls_limit) if (
        settings.quotas.max_calls or any(q.calls for q in settings.quotas.tenants.values())) \
        else None
    rate = CallRate(settings.quotas.call_rate_limit) if (
        settings.quotas.max_call_rate
        or any(q.calls_per_second for q in settings.quotas.tenants.values())) else None
    with step("gRPC address", EXIT_LISTEN):
        server = build_server(ServerSettings(address=settings.address, api_keys=key_table,
                                             tls=settings.tls,
                                             max_message_bytes=settings.max_message_bytes,
                                             max_workers=settings.server_workers,
                                             observe=rpc_metrics.observe, call_slots=slots,
                                             call_rate=rate,
                                             memory=settings.memory, work=w.work, seats=w.seats,
                                             tokens=tokens, cert_tenant=cert_tenant,
                                             max_connection_age_s=grpc_options.max_connection_age_s(
                                                 settings.max_connection_age_s)),
                              w.register)
    w.addr_box["self"] = server.address
    if settings.tls is not None and not settings.only:
        with step("TLS material"):
            _check_loopback_tls(server, w.lazy_channel(server.address), settings.tls)
    return server


def start_stack(settings: StackSettings) -> Stack:
    """Start the services (and built-in targets) described by ``settings``.

    Each step runs inside :func:`~fortis.infra.serving.startup.step`: a failure raises
    StartupError naming the step ('modules', 'options', 'TLS material', 'state', 'API keys',
    'metrics address', 'built-in targets', 'targets configuration', 'surrogates', 'executor',
    'gRPC address', 'tracing') with the exit code of its class (infra/serving/startup.py)."""
    from fortis.services.common import ast_guard

    ast_guard.install()         # threads parse (.npz headers): CPython 3.11 race, see there
    _load_modules()
    wanted = check_settings(settings)
    with step("tracing"):   # the OTEL_* variables; nothing at all when none is set
        from fortis.infra.serving import tracing
        tracing.configure(f"fortis-{settings.only}" if settings.only else "fortis")
    state, pg_ledger, pg_store = open_storage(settings, wanted)
    internal_key = settings.internal_key or new_api_key()
    closers: list[Any] = []
    key_table, key_watcher, tokens, cert_tenant = _authentication(settings, internal_key, closers)
    registry, tenant_label, rpc_metrics, metrics_port = metrics_registry(
        settings, key_table, key_watcher, tokens, closers)
    # One share per process: the servicers' costly calls and the proxy's built-in targets
    # draw on the same cores; and as many seats for tenants' other calls
    # (common/server.py: UNSEATED_METHODS).
    work = WorkShare(default_slots() if settings.work_slots is None else settings.work_slots)
    seats = WorkShare(work.slots)
    closers.append(work.close)
    w = _Wiring(settings=settings, wanted=wanted, state=state, internal_key=internal_key,
                closers=closers, registry=registry, tenant_label=tenant_label, work=work,
                seats=seats)
    if "proxy" in wanted:
        _add_proxy(w, pg_ledger)
    w.blob_store = open_blob_store(settings, wanted, state, closers)
    if "perturbation" in wanted:
        _add_perturbation(w)
    if "scoring" in wanted:
        _add_scoring(w)
    if "report" in wanted:
        _add_report(w)
    manager = _add_evaluation(w, pg_store) if "evaluation" in wanted else None
    with step("executor"):
        executor = evaluation_executor(settings, state, internal_key, w.addr_box) \
            if manager is not None else None
    server = _serve(w, key_table, tokens, cert_tenant, rpc_metrics)
    if manager is not None and executor is not None:
        manager.executor = executor
    if manager is not None and settings.resume:
        with step("state"):
            manager.resume_unfinished()
    return Stack(server=server, target_servers=w.target_servers, settings=settings,
                 internal_key=internal_key, closers=closers, metrics_port=metrics_port,
                 key_table=key_table, key_watcher=key_watcher,
                 manager=manager, work=work, seats=seats)
