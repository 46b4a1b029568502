"""Prometheus metrics of a Fortis process: an endpoint per service.

Every service counts its RPCs by method, tenant and status code (``fortis_rpc_requests_total``)
and times them (``fortis_rpc_latency_seconds``); the proxy adds its own counters
(:mod:`fortis.services.proxy.metrics`). Tenant labels are bounded (:class:`TenantLabels`,
docs/security.md). Each stack has its own registry, so several stacks can share a process (tests).
``fortis serve --metrics-address HOST:PORT`` serves it at ``/metrics`` (127.0.0.1 unless
another host is named). Transport-neutral: the gRPC interceptor calls :meth:`RpcMetrics.observe`.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Container, Iterable
from http.server import ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import MetricsHandler

LATENCY_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60)


#: Tenant label of a call without a tenant (unauthenticated, refused before auth).
NO_TENANT = "-"
#: Tenant label of a tenant name outside the configured key table (bounded cardinality).
OTHER_TENANT = "other"


class TenantLabels:
    """Tenant label values with bounded cardinality (metrics are labelled by tenant):
    the configured tenants (the API-key table's) as themselves, ``-`` for no tenant
    (unauthenticated calls) and ``other`` for any other name, so a caller cannot create
    label values (e.g. with ``x-fortis-tenant`` when auth is off)."""

    def __init__(self, tenants: Iterable[str] | Callable[[], Container[str]]) -> None:
        #: The configured tenants, or a function giving them now (keys rotated at run time).
        if callable(tenants):
            self._known = tenants
        else:
            fixed = frozenset(tenants)
            self._known = lambda: fixed

    def __call__(self, tenant: str) -> str:
        if not tenant:
            return NO_TENANT
        return tenant if tenant in self._known() else OTHER_TENANT


class RpcMetrics:
    def __init__(self, registry: CollectorRegistry,
                 tenant_label: Callable[[str], str] = TenantLabels(())) -> None:
        self.tenant_label = tenant_label
        self.requests = Counter("fortis_rpc_requests", "RPCs served, by method, tenant and status code",
                                ["method", "tenant", "code"], registry=registry)
        self.latency = Histogram("fortis_rpc_latency_seconds", "Time to serve an RPC",
                                 ["method", "tenant"], buckets=LATENCY_BUCKETS, registry=registry)

    def observe(self, method: str, code: str, seconds: float, tenant: str = "") -> None:
        t = self.tenant_label(tenant)
        self.requests.labels(method, t, code).inc()
        self.latency.labels(method, t).observe(seconds)


class _HTTPServer6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def parse_metrics_address(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9100`` for IPv6; ``:PORT`` = loopback) as (host, port); ValueError
    with a bounded message otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"'{value[:100]}' is not HOST:PORT (port 0..65535; 0 = any free port)")
    host = host or "127.0.0.1"
    if host.startswith("["):
        if not host.endswith("]"):
            raise ValueError(f"'{value[:100]}' is not HOST:PORT")
        host = host[1:-1]
    return host, int(port)


class MetricsServer:
    """``/metrics`` over HTTP for a registry; ``port=0`` picks a free port. Loopback unless the
    operator names another host (``fortis serve --metrics-address``): the page has no API key."""

    def __init__(self, registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0) -> None:
        handler = MetricsHandler.factory(registry)
        server_class = _HTTPServer6 if ":" in host else ThreadingHTTPServer
        self._httpd = server_class((host.strip("[]"), port), handler)
        self._httpd.daemon_threads = True
        self.host = host
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
