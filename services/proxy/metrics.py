"""Prometheus metrics of the target proxy (for Kubernetes platform teams). Domain code: no gRPC.

Registered on the stack's registry (:mod:`fortis.infra.serving.metrics`);
``fortis serve --metrics-address HOST:PORT`` exposes it over HTTP at ``/metrics``. The ledger stays the source of truth for counts (IEEE-M6); these are for
dashboards and alerts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fortis.infra.serving.metrics import LATENCY_BUCKETS, TenantLabels
from prometheus_client import CollectorRegistry, Counter, Histogram


class ProxyMetrics:
    """The proxy's counters, labelled by target and tenant. Tenant
    label values go through ``tenant_label`` (the stack passes a
    :class:`~fortis.infra.serving.metrics.TenantLabels` of its key table), so their number
    stays bounded whatever a caller sends."""

    def __init__(self, registry: CollectorRegistry | None = None,
                 tenant_label: Callable[[str], str] = TenantLabels(())) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.tenant_label = tenant_label
        self.queries = Counter("fortis_proxy_queries", "Images sent to a target (one query per image)",
                               ["target", "tenant", "status"], registry=self.registry)
        self.calls = Counter("fortis_proxy_target_calls", "Calls made to a target (a call carries a batch)",
                             ["target", "tenant", "status"], registry=self.registry)
        self.refused = Counter("fortis_proxy_refused_calls", "Calls refused for an exhausted budget",
                               ["target", "tenant"], registry=self.registry)
        self.quota_refused_calls = Counter(
            "fortis_proxy_quota_refused_calls", "Calls refused for a tenant's exhausted quota "
            "(queries per day); nothing was sent", ["target", "tenant", "quota"],
            registry=self.registry)
        self.retries = Counter("fortis_proxy_retries", "Retries after the target was UNAVAILABLE",
                               ["target", "tenant"], registry=self.registry)
        self.latency = Histogram("fortis_proxy_target_latency_seconds",
                                 "Latency of one call to a target, retries included",
                                 ["target", "tenant"], buckets=LATENCY_BUCKETS,
                                 registry=self.registry)
        self._children: dict[tuple[str, str, str], tuple[Any, Any, Any]] = {}

    def call(self, target: str, status: str, images: int, latency_s: float, attempts: int,
             tenant: str = "") -> None:
        t = self.tenant_label(tenant)
        key = (target, t, status)
        children = self._children.get(key)
        if children is None:
            # Every answered call updates these three series: their children are looked up
            # once per (target, tenant, status), not through ``labels()`` on every call.
            # Bounded: targets are the operator's, tenant labels bounded by ``tenant_label``.
            children = (self.queries.labels(*key), self.calls.labels(*key),
                        self.latency.labels(target, t))
            self._children[key] = children
        queries, calls, latency = children
        queries.inc(images)
        calls.inc()
        latency.observe(latency_s)
        if attempts > 1:
            self.retries.labels(target, t).inc(attempts - 1)

    def refused_call(self, target: str, tenant: str = "") -> None:
        self.refused.labels(target, self.tenant_label(tenant)).inc()

    def quota_refused(self, target: str, tenant: str, quota: str) -> None:
        self.quota_refused_calls.labels(target, self.tenant_label(tenant), quota).inc()
