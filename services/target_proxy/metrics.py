"""Prometheus metrics of the target proxy (for Kubernetes platform teams). Domain code: no gRPC.

Registered on the stack's registry (:mod:`fortis.services.common.metrics`);
``fortis serve --metrics-port N`` exposes it over HTTP at ``/metrics``. The ledger stays the source of truth for counts (IEEE-M6); these are for
dashboards and alerts.
"""

from __future__ import annotations

from fortis.services.common.metrics import LATENCY_BUCKETS
from prometheus_client import CollectorRegistry, Counter, Histogram


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.queries = Counter("fortis_proxy_queries", "Images sent to a target (one query per image)",
                               ["target", "status"], registry=self.registry)
        self.calls = Counter("fortis_proxy_target_calls", "Calls made to a target (a call carries a batch)",
                             ["target", "status"], registry=self.registry)
        self.refused = Counter("fortis_proxy_refused_calls", "Calls refused for an exhausted budget",
                               ["target"], registry=self.registry)
        self.retries = Counter("fortis_proxy_retries", "Retries after the target was UNAVAILABLE",
                               ["target"], registry=self.registry)
        self.latency = Histogram("fortis_proxy_target_latency_seconds",
                                 "Latency of one call to a target, retries included", ["target"],
                                 buckets=LATENCY_BUCKETS,
                                 registry=self.registry)

    def call(self, target: str, status: str, images: int, latency_s: float, attempts: int) -> None:
        self.queries.labels(target, status).inc(images)
        self.calls.labels(target, status).inc()
        self.latency.labels(target).observe(latency_s)
        if attempts > 1:
            self.retries.labels(target).inc(attempts - 1)

    def refused_call(self, target: str) -> None:
        self.refused.labels(target).inc()
