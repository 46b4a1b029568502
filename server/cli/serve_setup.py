"""What ``fortis serve`` does around ``start_stack``: its options turned into the settings'
parts (each failure an InvalidArgument naming the option, so the start step reports it), the
busy-port check before anything starts, and the process's life after the start (the
collector's frozen generation, the bounded shutdown). ``cmd_serve`` (fortis.server.cli.local) runs
them in order; the converters stay importable from there.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any


def _address_in_use(address: str) -> bool:
    """True if ``host:port`` is already taken by a listening socket (port 0 never is).

    Checked before starting anything so a busy port is one clear line, not gRPC's bind
    error and a traceback. SO_REUSEADDR as gRPC sets it: a port in TIME_WAIT is not "busy".
    """
    host, _, port = address.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return False
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM)
    except OSError:
        return False              # unresolvable: let the server report it
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
    return False


def _tenant_rates(pairs: list[str]) -> dict[str, float]:
    from fortis.services.common.errors import InvalidArgument
    from fortis.services.proxy.ratelimit import parse_tenant_rates

    try:
        return parse_tenant_rates(pairs)
    except ValueError as exc:
        raise InvalidArgument("tenant_rate", str(exc)[:200]) from None


def _evaluation_workers(ns: argparse.Namespace) -> int:
    from fortis.services.common.errors import InvalidArgument

    workers = int(getattr(ns, "evaluation_workers", 2))
    if not 1 <= workers <= 256:
        raise InvalidArgument("evaluation_workers", "must be from 1 to 256")
    return workers


def _quota_settings(ns: argparse.Namespace) -> Any:
    """``fortis serve``'s per-tenant quotas as QuotaSettings; InvalidArgument
    naming the option when one is malformed."""
    from fortis.infra.serving.quotas import (
        DEFAULT_CALL_RATE_PER_TENANT,
        MAX_QUOTA,
        QuotaSettings,
        parse_tenant_quotas,
    )
    from fortis.services.common.errors import InvalidArgument

    try:
        tenants = parse_tenant_quotas(getattr(ns, "tenant_quota", None) or [])
    except ValueError as exc:
        raise InvalidArgument("tenant_quota", str(exc)[:200]) from None
    values = {}
    rate = getattr(ns, "max_call_rate_per_tenant", None)
    ns.max_call_rate_per_tenant = DEFAULT_CALL_RATE_PER_TENANT if rate is None else rate
    for opt in ("max_running_per_tenant", "max_queued_per_tenant",
                "max_queries_per_day_per_tenant", "max_calls_per_tenant",
                "max_call_rate_per_tenant"):
        values[opt] = int(getattr(ns, opt, 0) or 0)
        if not 0 <= values[opt] <= MAX_QUOTA:
            raise InvalidArgument(opt, f"must be from 0 (no limit) to {MAX_QUOTA}")
    return QuotaSettings(max_running=values["max_running_per_tenant"],
                         max_queued=values["max_queued_per_tenant"],
                         queries_per_day=values["max_queries_per_day_per_tenant"],
                         max_calls=values["max_calls_per_tenant"],
                         max_call_rate=values["max_call_rate_per_tenant"],
                         tenants=tenants)


def _memory_limits(ns: argparse.Namespace) -> Any:
    """``fortis serve``'s decoded-size limits (infra/serving/memory.py); InvalidArgument
    naming the option when one is out of range."""
    from fortis.infra.serving.memory import MemoryLimits
    from fortis.services.common import limits
    from fortis.services.common.errors import InvalidArgument

    values = {}
    for opt, default in (("max_request_decoded_bytes", limits.MAX_REQUEST_DECODED_BYTES),
                         ("max_tenant_decoded_bytes", limits.MAX_TENANT_DECODED_BYTES)):
        values[opt] = int(getattr(ns, opt, default))
        if not 0 <= values[opt] <= 1 << 50:
            raise InvalidArgument(opt, "must be from 0 (no limit) to 2^50 bytes")
    return MemoryLimits(max_request_bytes=values["max_request_decoded_bytes"],
                        max_tenant_bytes=values["max_tenant_decoded_bytes"])


def _server_workers(ns: argparse.Namespace) -> int:
    from fortis.services.common.errors import InvalidArgument

    workers = int(getattr(ns, "server_workers", 64))
    if not 4 <= workers <= 4096:
        raise InvalidArgument("server_workers", "must be from 4 to 4096")
    return workers


def _work_slots(ns: argparse.Namespace) -> int | None:
    from fortis.services.common.errors import InvalidArgument

    slots = getattr(ns, "work_slots", None)
    if slots is not None and not 0 <= int(slots) <= 4096:
        raise InvalidArgument("work_slots", "must be from 0 (no sharing) to 4096")
    return None if slots is None else int(slots)


def _work_processes(ns: argparse.Namespace) -> int | None:
    from fortis.services.common.errors import InvalidArgument

    n = getattr(ns, "work_processes", None)
    if n is not None and not 0 <= int(n) <= 256:
        raise InvalidArgument("work_processes", "must be from 0 (in this process) to 256")
    return None if n is None else int(n)


def _metrics_address(ns: argparse.Namespace) -> tuple[str, int | None]:
    """Where /metrics listens: ``--metrics-address HOST:PORT``, else ``--metrics-port`` on
    127.0.0.1 (loopback unless the operator says otherwise), else nowhere."""
    from fortis.infra.serving.metrics import parse_metrics_address
    from fortis.services.common.errors import InvalidArgument

    if getattr(ns, "metrics_address", None):
        if ns.metrics_port is not None:
            raise InvalidArgument("metrics_address", "give --metrics-address or --metrics-port, "
                                  "not both")
        try:
            host, port = parse_metrics_address(ns.metrics_address)
        except ValueError as exc:
            raise InvalidArgument("metrics_address", str(exc)) from None
        return host, port
    return "127.0.0.1", ns.metrics_port


def _tls_settings(ns: argparse.Namespace) -> Any:
    """``fortis serve``'s TLS options as TlsSettings (None: plain text); InvalidArgument
    when they do not go together."""
    from fortis.infra.serving.tls import TlsSettings
    from fortis.services.common.errors import InvalidArgument

    if not ns.tls_cert and not ns.tls_key:
        if ns.tls_ca or ns.tls_client_auth != "none" or ns.tls_server_name:
            raise InvalidArgument("tls_cert", "--tls-ca, --tls-client-auth and "
                                  "--tls-server-name need --tls-cert and --tls-key")
        return None
    if not ns.tls_cert or not ns.tls_key:
        raise InvalidArgument("tls_cert" if not ns.tls_cert else "tls_key",
                              "--tls-cert and --tls-key go together")
    return TlsSettings(cert_file=Path(ns.tls_cert), key_file=Path(ns.tls_key),
                       ca_file=Path(ns.tls_ca) if ns.tls_ca else None,
                       client_auth=ns.tls_client_auth, server_name=ns.tls_server_name or "")


def _identity_options(ns: argparse.Namespace) -> tuple[list[Any], str]:
    """``fortis serve``'s OIDC issuers and ``--tls-tenant-from``, each flag falling back to
    its environment variable (the Helm chart's ConfigMap can set them)."""
    from fortis.infra.serving.identity import parse_issuer_spec

    env = os.environ.get
    specs = getattr(ns, "oidc_issuer", None) or env("FORTIS_OIDC_ISSUER", "").split()
    audiences = getattr(ns, "oidc_audience", None) or env("FORTIS_OIDC_AUDIENCE", "").split()
    defaults = {"audiences": audiences,
                "tenant_claim": getattr(ns, "oidc_tenant_claim", None)
                or env("FORTIS_OIDC_TENANT_CLAIM", ""),
                "jwks_url": getattr(ns, "oidc_jwks_url", None) or env("FORTIS_OIDC_JWKS_URL", ""),
                "ca_file": getattr(ns, "oidc_ca_file", None) or env("FORTIS_OIDC_CA_FILE", ""),
                "tenants": [t for t in (getattr(ns, "oidc_tenants", None)
                                        or env("FORTIS_OIDC_TENANTS", "")).split(":") if t],
                "tenant_prefix": getattr(ns, "oidc_tenant_prefix", None)
                or env("FORTIS_OIDC_TENANT_PREFIX", "")}
    if defaults["jwks_url"] and len(specs) > 1:
        from fortis.services.common.errors import InvalidArgument
        raise InvalidArgument("oidc_jwks_url", "with several issuers, give each its own "
                              "(--oidc-issuer URL,jwks-url=...)")
    issuers = [parse_issuer_spec(s, **defaults) for s in specs]
    tenant_from = getattr(ns, "tls_tenant_from", None) or env("FORTIS_TLS_TENANT_FROM", "")
    return issuers, tenant_from


def _executor_settings(ns: argparse.Namespace) -> dict[str, Any]:
    """StackSettings of the work fan-out: --executor, --worker-processes, --job-*."""
    from fortis.services.common.errors import InvalidArgument

    executor = getattr(ns, "executor", "local") or "local"
    out: dict[str, Any] = {"executor": executor,
                           "worker_processes": int(getattr(ns, "worker_processes", 2))}
    if executor != "kubernetes":
        return out
    from fortis.services.evaluation.k8s_jobs import JobSettings

    namespace = ns.job_namespace
    sa_ns = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    if not namespace and sa_ns.exists():
        namespace = sa_ns.read_text().strip()
    if not namespace:
        raise InvalidArgument("job_namespace", "--executor kubernetes needs --job-namespace "
                              "(or $POD_NAMESPACE, or running in a pod)")
    if not ns.job_image:
        raise InvalidArgument("job_image", "--executor kubernetes needs --job-image")
    secret_env: dict[str, tuple[str, str]] = {}
    for spec in ns.job_secret_env or []:
        var, _, ref = spec.partition("=")
        secret, _, key = ref.partition(":")
        if not var or not secret or not key:
            raise InvalidArgument("job_secret_env", f"'{spec[:80]}' is not VAR=SECRET:KEY")
        secret_env[var] = (secret, key)
    env = {k: v for k, v in (("FORTIS_PROXY_ADDRESS", ns.proxy_address or ""),
                             ("FORTIS_PERTURBATION_ADDRESS", ns.perturbation_address or ""))
           if v}
    # tracing: the workers export where this service does (OTEL_*, docs/tracing.md), under
    # their own service name (fortis-worker) unless the operator named one in the resource.
    # Never the exporter's headers (a collector's credentials would be a plain value in the
    # Job): those come to the workers from a secret (--job-secret-env).
    env.update({k: v for k, v in os.environ.items()
                if k.startswith("OTEL_") and k != "OTEL_SERVICE_NAME"
                and not k.endswith("HEADERS")})
    # The services listen with TLS only when given a certificate: the worker pods then need
    # it too, from the Secret it came from.
    tls_secret = getattr(ns, "job_tls_secret", "") or ""
    if ns.tls_cert and not tls_secret:
        raise InvalidArgument("job_tls_secret", "with --tls-cert and --executor kubernetes, "
                              "give --job-tls-secret: the Secret of the certificate, which the "
                              "worker pods mount to reach the services over TLS")
    if tls_secret and not ns.tls_cert:
        raise InvalidArgument("job_tls_secret", "--job-tls-secret needs --tls-cert and "
                              "--tls-key (without them the services listen in plain text)")
    out["job_settings"] = JobSettings(namespace=namespace, image=ns.job_image,
                                      service_account=ns.job_service_account,
                                      shards=int(ns.job_shards), env=env, secret_env=secret_env,
                                      tls_secret=tls_secret,
                                      tls_server_name=(ns.tls_server_name or "")
                                      if tls_secret else "")
    return out


def _freeze_startup_objects() -> None:
    """Leave what the start loaded (models, catalogues, modules: hundreds of thousands of
    objects that live as long as the process) out of the collector's full passes. Each full
    pass stops every thread of the server; over those objects it took 90-170 ms here, every
    few seconds under load, and was the slowest of every tenant's control calls. Young
    collections are made rarer too (every 10,000 net allocations instead of 700): a busy
    server allocates that many in milliseconds, and a full pass follows every 100 of them."""
    import gc

    gc.collect()
    gc.freeze()
    _, g1, g2 = gc.get_threshold()
    gc.set_threshold(10_000, g1, g2)


def _shutdown(stack: Any, grace: float) -> int:
    """Drain ``stack`` and end the process within about ``grace`` + 3 seconds
    (Kubernetes sends SIGTERM, then SIGKILL after its own grace period).

    In-flight calls get ``grace`` seconds; evaluations stop at their next item and stay
    RUNNING, so the next start resumes them. A worker busy inside a long item, or a handler
    thread still computing, is not waited for: those threads are not daemons and would keep
    the interpreter alive, so the process ends with ``os._exit`` after saying what it cut."""
    import structlog

    log = structlog.get_logger("fortis.serve")
    log.info("shutdown_started", grace_s=grace)
    t0 = time.monotonic()
    busy = stack.stop(grace=grace, worker_wait=min(3.0, max(0.5, grace)))
    alive = [t.name for t in threading.enumerate()
             if t is not threading.main_thread() and t.is_alive() and not t.daemon]
    log.info("shutdown_finished", seconds=round(time.monotonic() - t0, 3),
             **({"cut_short_evaluations": busy} if busy else {}),
             **({"cut_short_threads": alive[:20]} if alive else {}))
    if busy or alive:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
