"""Composition root of ``fortis worker`` (work fan-out on Kubernetes itself): one
worker process of an evaluation, as an Indexed Job pod or a local process runs it.

It wires the evaluation store (SQLite files in the state folder shared with the evaluation
service on one machine, or PostgreSQL at ``database_url``), clients of the proxy and the
perturbation service (as the evaluation's tenant, with the internal key: every query still
goes through the proxy, so its rate limits, budgets and ledger hold whatever the number of
workers) and the plan datasets, then runs ``EvaluationWorker``. Like ``server/app/stack.py`` it
composes services; no service imports it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fortis.infra.serving.tls import TlsSettings
from fortis.services.common import errors
from fortis.services.evaluation.claims import DEFAULT_LEASE_S
from fortis.services.evaluation.worker import EvaluationWorker, WorkerResult, worker_id


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    evaluation_id: str
    tenant: str
    #: the Job's completion index (``JOB_COMPLETION_INDEX``), part of the worker's name
    index: int = 0
    state_dir: Path = Path(".fortis-state")
    #: PostgreSQL shared by every worker and the evaluation service; None: SQLite files in
    #: ``state_dir`` (workers on the evaluation service's machine)
    database_url: str | None = None
    proxy_address: str = ""
    perturbation_address: str = ""
    internal_key: str = ""
    tls: TlsSettings | None = None
    data_root: Path | None = None
    dataset_stores: Path | None = None
    lease_s: float = DEFAULT_LEASE_S
    parallel: int = 2
    max_message_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if not self.evaluation_id:
            raise errors.InvalidArgument("evaluation_id", "required ($FORTIS_EVALUATION_ID)")
        if not self.tenant:
            raise errors.InvalidArgument("tenant", "required ($FORTIS_TENANT)")
        if not self.proxy_address:
            raise errors.InvalidArgument("proxy_address",
                                         "required ($FORTIS_PROXY_ADDRESS)")
        if not self.perturbation_address:
            raise errors.InvalidArgument("perturbation_address",
                                         "required ($FORTIS_PERTURBATION_ADDRESS)")
        if not self.internal_key:
            raise errors.InvalidArgument("internal_key", "required ($FORTIS_INTERNAL_KEY: the "
                                         "key the evaluation service calls the others with)")
        if not 0 <= self.index <= 100_000:
            raise errors.InvalidArgument("index", "JOB_COMPLETION_INDEX from 0 to 100000")
        if not 1.0 <= self.lease_s <= 3600.0:
            raise errors.InvalidArgument("lease_s", "from 1 to 3600 seconds")
        if not 1 <= self.parallel <= 16:
            raise errors.InvalidArgument("parallel", "from 1 to 16 items at a time")


def pick(addresses: str, index: int) -> str:
    """One of a comma-separated list of addresses, by the worker's index (replicas shared
    out among local workers); a single address (e.g. ``dns:///...``, balanced per call by
    gRPC's round_robin) as it is, and so an ``ipv4:``/``ipv6:`` address list, whose commas
    are gRPC's: every worker reaches every replica, balanced per call."""
    from fortis.infra.serving.grpc_options import ADDRESS_LIST_SCHEMES

    if addresses.strip().lower().startswith(ADDRESS_LIST_SCHEMES):
        return addresses.strip()
    options = [a.strip() for a in addresses.split(",") if a.strip()]
    return options[index % len(options)] if options else ""


def open_store(settings: WorkerSettings) -> Any:
    """The evaluation store the evaluation service uses, scoped to the tenant."""
    if settings.database_url:
        from fortis.services.evaluation.store_pg import PgEvaluationStore
        return PgEvaluationStore(settings.database_url).for_tenant(settings.tenant)
    from fortis.services.evaluation.store import EvaluationStore
    path = Path(settings.state_dir) / "evaluations.sqlite"
    if not path.exists():
        raise errors.InvalidArgument("state_dir", f"no evaluation store at {path} (give the "
                                     "evaluation service's --state-dir, or --database-url)")
    return EvaluationStore(path).for_tenant(settings.tenant)


def run_worker(settings: WorkerSettings, stop: threading.Event | None = None) -> WorkerResult:
    """Run one worker to the end of the evaluation's items (or until ``stop`` is set)."""
    from fortis.services.common import ast_guard

    ast_guard.install()         # threads parse (.npz headers): CPython 3.11 race, see there
    from fortis.adapters.plan_sources import BUILTIN_SOURCES
    from fortis.infra.serving import tracing
    from fortis.infra.serving.server import call_metadata, channel
    from fortis.infra.storage.blob_backends import open_blobs
    from fortis.server.app.parts import dataset_stores
    from fortis.services.evaluation.clients import GrpcPerturbation, GrpcProxy
    from fortis.services.evaluation.datasets import PlanDatasets

    stop = stop or threading.Event()
    tracing.configure("fortis-worker")      # only when OTEL_* asks for it
    store = open_store(settings)
    closers: list[Any] = [store.close]
    try:
        md = call_metadata(settings.internal_key, settings.tenant)
        proxy_at = pick(settings.proxy_address, settings.index)
        perturbation_at = pick(settings.perturbation_address, settings.index)
        channels = {a: channel(a, max_message_bytes=settings.max_message_bytes, tls=settings.tls)
                    for a in {proxy_at, perturbation_at}}
        closers += [c.close for c in channels.values()]
        proxy = GrpcProxy(channels[proxy_at], md)
        perturbation = GrpcPerturbation(channels[perturbation_at], md)
        # uploads: the shared PostgreSQL with database_url (pods share no disk), else the
        # evaluation service's state folder
        blobs = open_blobs(Path(settings.state_dir), database_url=settings.database_url,
                           reader=True)
        closers.append(blobs.close)
        datasets = PlanDatasets(BUILTIN_SOURCES, data_root=settings.data_root, blobs=blobs,
                                stores=dataset_stores(settings.dataset_stores))
        # the evaluation run's trace, from the environment the executor gave this process
        with tracing.span("evaluation.worker", {
                "fortis.tenant": settings.tenant[:200],
                "fortis.evaluation_id": settings.evaluation_id[:200],
                "fortis.worker_index": settings.index}, parent=tracing.from_env()):
            return EvaluationWorker(
                evaluation_id=settings.evaluation_id, store=store, proxy=proxy,
                perturbation=perturbation, datasets=datasets.for_tenant(settings.tenant),
                catalogue=perturbation.catalogue(),
                worker_id=worker_id(settings.index), lease_s=settings.lease_s,
                parallel=settings.parallel, stop=stop.is_set).run()
    finally:
        for c in reversed(closers):
            try:
                c()
            except Exception:  # noqa: BLE001 - best effort at exit
                pass
