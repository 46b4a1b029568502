"""Pieces of the composition root that hold no gRPC: the in-process catalogue, built-in
targets, the identity rules, the evaluation executor, the shared database and the start-up
steps that open storage and metrics. ``server/app/stack.py``
wires them into servers; ``local_catalogue`` and ``builtin_target`` stay importable from there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fortis.infra.serving.startup import EXIT_LISTEN, step
from fortis.infra.serving.tls import load_pem
from fortis.server.app.settings import SERVICES, StackSettings, TargetConfig
from fortis.services.common import errors


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


def dataset_stores(path: Path | None) -> Any:
    """The opener of S3 dataset stores from the operator's ``--dataset-stores`` file (None:
    plans naming ``dataset.store`` are refused). A bad file stops the start, naming the key."""
    if path is None:
        return None
    from fortis.adapters.s3_store import load_config

    try:
        return load_config(Path(path))
    except ValueError as exc:
        raise errors.InvalidArgument("dataset_stores", str(exc)) from None


def identity(settings: StackSettings) -> tuple[Any, Any]:
    """The bearer-token verifier and the certificate-tenant rule of a stack (None when off)."""
    from fortis.infra.serving.identity import CertTenant, TokenVerifier

    tokens = TokenVerifier(settings.oidc_issuers, min_refresh_s=settings.oidc_refresh_min_s) \
        if settings.oidc_issuers else None
    cert_tenant = None
    if settings.tls_tenant_from:
        if settings.tls is None or settings.tls.client_auth != "require":
            raise errors.InvalidArgument("tls_tenant_from", "needs --tls-client-auth require "
                                         "(only a verified certificate may name a tenant)")
        cert_tenant = CertTenant.parse(settings.tls_tenant_from)
    return tokens, cert_tenant


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def evaluation_executor(settings: StackSettings, state: Path, internal_key: str,
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
    cmd = [sys.executable, "-m", "fortis.server.cli", "worker", "--state-dir", str(state.resolve()),
           "--lease", str(settings.worker_lease_s)]
    if settings.tls is not None:
        cmd += ["--tls-cert", str(settings.tls.cert_file), "--tls-key", str(settings.tls.key_file)]
        if settings.tls.ca_file is not None:
            cmd += ["--tls-ca", str(settings.tls.ca_file)]
        if settings.tls.server_name:
            cmd += ["--tls-server-name", settings.tls.server_name]
    if settings.data_root is not None:
        cmd += ["--data-root", str(settings.data_root)]
    if settings.dataset_stores is not None:
        cmd += ["--dataset-stores", str(settings.dataset_stores)]
    secret_env = {"FORTIS_INTERNAL_KEY": internal_key}
    if settings.database_url:
        secret_env["FORTIS_DATABASE_URL"] = settings.database_url

    def env() -> dict[str, str]:
        return {"FORTIS_PROXY_ADDRESS": settings.proxy_address or addr_box["self"],
                "FORTIS_PERTURBATION_ADDRESS": ",".join(settings.worker_perturbation_addresses)
                or settings.perturbation_address or addr_box["self"]}
    return ProcessExecutor(ProcessSettings(command=cmd, shards=settings.worker_processes,
                                           env=secret_env), env)


def open_database(settings: StackSettings, wanted: set[str]) -> tuple[Any, Any]:
    """The PostgreSQL ledger (proxy) and evaluation store (evaluation) of
    ``settings.database_url``, or (None, None) without one. Opened before anything else
    starts: a bad URL, an unreachable server or a schema not at head (naming ``fortis db
    upgrade``) is an InvalidArgument naming ``database_url``, password hidden."""
    if not settings.database_url:
        return None, None
    from fortis.services.evaluation.store_pg import PgEvaluationStore
    from fortis.services.proxy.ledger_pg import PgLedger

    ledger = PgLedger(settings.database_url) if "proxy" in wanted else None
    try:
        store = PgEvaluationStore(settings.database_url) if "evaluation" in wanted else None
    except BaseException:
        if ledger is not None:
            ledger.close()
        raise
    return ledger, store


# Start-up steps of ``start_stack`` that hold no gRPC (server/app/stack.py runs them in order).

def check_settings(settings: StackSettings) -> set[str]:
    """The services wanted; the TLS files read now, before anything listens: a missing or
    bad file is this step's error, not a failure of the first server or channel that reads it."""
    with step("options"):
        if settings.only and settings.only not in SERVICES:
            raise errors.InvalidArgument("service", f"unknown service '{settings.only}'; one of {', '.join(SERVICES)}")
    wanted = {settings.only} if settings.only else set(SERVICES)
    if settings.tls is not None:
        with step("TLS material"):
            load_pem(settings.tls)
    return wanted


def open_storage(settings: StackSettings, wanted: set[str]) -> tuple[Path, Any, Any]:
    """The state folder, and the PostgreSQL ledger and store when a database URL is given
    (replicas share it); (None, None): SQLite files in the state folder."""
    state = Path(settings.state_dir)
    with step("state", subject=f"state folder '{str(state)[:200]}'"):
        state.mkdir(parents=True, exist_ok=True)
    with step("state"):
        pg_ledger, pg_store = open_database(settings, wanted)
    return state, pg_ledger, pg_store


def metrics_registry(settings: StackSettings, key_table: Any, key_watcher: Any, tokens: Any,
                     closers: list[Any]) -> tuple[Any, Any, Any, int | None]:
    """The metrics registry, the tenant labels, the RPC metrics and, when asked, the /metrics
    server's port."""
    from fortis.infra.serving.metrics import MetricsServer, RpcMetrics, TenantLabels
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    if key_watcher is not None:
        from fortis.infra.serving.api_keys import KeyFileCollector
        registry.register(KeyFileCollector(key_watcher))    # type: ignore[arg-type]
    if tokens is not None:
        from fortis.infra.serving.identity import IdentityCollector
        registry.register(IdentityCollector(tokens))        # type: ignore[arg-type]
        tokens.prefetch()
    # Tenant labels come from the key table only (bounded cardinality); the key
    # file's tenants change with it.
    tenant_label = TenantLabels(key_table.tenants if key_table.enabled else {"default"})
    rpc_metrics = RpcMetrics(registry, tenant_label)
    metrics_port: int | None = None
    if settings.metrics_port is not None:
        where = host_port(settings.metrics_host, settings.metrics_port)
        with step("metrics address", EXIT_LISTEN):
            try:
                metrics_server = MetricsServer(registry, settings.metrics_host,
                                               settings.metrics_port)
            except OSError as exc:
                raise OSError(exc.errno, f"cannot listen on {where}: "
                              f"{exc.strerror or exc}") from exc
        metrics_port = metrics_server.port
        closers.append(metrics_server.close)
    return registry, tenant_label, rpc_metrics, metrics_port


def open_blob_store(settings: StackSettings, wanted: set[str], state: Path,
                    closers: list[Any]) -> Any:
    """Uploaded blobs: stored by the evaluation service's UploadService, read by its
    datasets and by the perturbation service (neural_style models) with the caller's tenant;
    in the shared PostgreSQL with database_url (pods share no disk), else files. None when
    neither service runs here."""
    if "evaluation" not in wanted and "perturbation" not in wanted:
        return None
    with step("state"):
        from fortis.infra.storage.blob_backends import open_blobs
        blob_store = open_blobs(state, database_url=settings.database_url,
                                quota_bytes=settings.upload_quota_bytes)
    closers.append(blob_store.close)
    return blob_store


def whitebox_policy(settings: StackSettings, wanted: set[str], builtin_models: tuple[str, ...],
                    operator_surrogates: Any, ask_proxy: Callable[[], Any]) -> Any:
    """Which tenant may use a surrogate sharing a target's weights. ``ask_proxy`` makes the
    table of the proxy's built-in targets when the proxy runs elsewhere."""
    from fortis.services.common.whitebox import WhiteboxPolicy

    served: dict[str, list[str]] = {}
    for t in settings.targets:
        if t.builtin:
            served.setdefault(t.builtin, []).append(t.name)
    return WhiteboxPolicy(
        grants=settings.whitebox_grants, builtin_models=builtin_models,
        # Run apart from the proxy, this service asks it which targets serve each
        # built-in model (the targets are the proxy's configuration, not this one's).
        builtin_targets=served if (settings.targets or "proxy" in wanted) else ask_proxy(),
        declared_twins=lambda name: () if name in builtin_models
        else operator_surrogates.twin_of(name))
