"""Prometheus metrics of a Fortis process (DESIGN.md section 3: an endpoint per service).

Every service counts its RPCs by method and status code (``fortis_rpc_requests_total``) and
times them (``fortis_rpc_latency_seconds``); the proxy adds its own counters
(:mod:`fortis.services.target_proxy.metrics`). Each stack has its own registry, so several
stacks can share a process (tests). ``fortis serve --metrics-port N`` serves it at
``/metrics``. Transport-neutral: the gRPC interceptor calls :meth:`RpcMetrics.observe`.
"""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import MetricsHandler

LATENCY_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60)


class RpcMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("fortis_rpc_requests", "RPCs served, by method and status code",
                                ["method", "code"], registry=registry)
        self.latency = Histogram("fortis_rpc_latency_seconds", "Time to serve an RPC", ["method"],
                                 buckets=LATENCY_BUCKETS, registry=registry)

    def observe(self, method: str, code: str, seconds: float) -> None:
        self.requests.labels(method, code).inc()
        self.latency.labels(method).observe(seconds)


class MetricsServer:
    """``/metrics`` over HTTP for a registry; ``port=0`` picks a free port."""

    def __init__(self, registry: CollectorRegistry, host: str = "0.0.0.0", port: int = 0) -> None:
        handler = MetricsHandler.factory(registry)
        self._httpd = ThreadingHTTPServer((host, port), handler)
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
