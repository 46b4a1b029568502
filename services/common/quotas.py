"""Per-tenant quotas (issue 9, "Bounded work": "Per-tenant quotas: concurrent and queued
evaluations, ... queries per day"): the settings both the evaluation service and the target
proxy read, and the parser of ``fortis serve --tenant-quota``.

Three quotas, each a server-wide default (``--max-running-per-tenant``,
``--max-queued-per-tenant``, ``--max-queries-per-day-per-tenant``) that a tenant's own entry
overrides (``--tenant-quota TENANT=running:2,queued:20,queries_per_day:100000``); 0 means no
limit:

- ``running``: evaluations of the tenant a worker runs at once (the fair scheduler,
  ``services/evaluation/scheduling.py``, starts no more);
- ``queued``: evaluations of the tenant waiting to start; CreateEvaluation beyond it is
  RESOURCE_EXHAUSTED (``QuotaExceeded``) and nothing is stored;
- ``queries_per_day``: images the target proxy sends for the tenant per UTC day, every attempt
  counted (``services/target_proxy/quotas.py``).

Pure code, no gRPC (shared by two services, so it lives in ``services/common``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["MAX_QUOTA", "QUOTA_NAMES", "QuotaSettings", "TenantQuota", "parse_tenant_quota",
           "parse_tenant_quotas"]

#: The quotas a ``--tenant-quota`` entry may set.
QUOTA_NAMES = ("running", "queued", "queries_per_day")
#: Largest value of any quota (a typo of extra digits is refused, not taken as "no limit").
MAX_QUOTA = 10**12


@dataclass(frozen=True)
class TenantQuota:
    """One tenant's overrides; ``None`` = the server-wide default."""

    running: int | None = None
    queued: int | None = None
    queries_per_day: int | None = None


@dataclass(frozen=True)
class QuotaSettings:
    """Server-wide defaults (0 = no limit) and per-tenant overrides."""

    max_running: int = 0
    max_queued: int = 0
    queries_per_day: int = 0
    tenants: Mapping[str, TenantQuota] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value in (("max_running", self.max_running), ("max_queued", self.max_queued),
                            ("queries_per_day", self.queries_per_day)):
            _check_value(name, value)

    def running_limit(self, tenant: str) -> int:
        """Most evaluations of ``tenant`` running at once (0 = no limit)."""
        own = self.tenants.get(tenant)
        return self.max_running if own is None or own.running is None else own.running

    def queued_limit(self, tenant: str) -> int:
        """Most evaluations of ``tenant`` waiting to start (0 = no limit)."""
        own = self.tenants.get(tenant)
        return self.max_queued if own is None or own.queued is None else own.queued

    def queries_per_day_limit(self, tenant: str) -> int:
        """Most images sent to targets for ``tenant`` per UTC day (0 = no limit)."""
        own = self.tenants.get(tenant)
        return self.queries_per_day if own is None or own.queries_per_day is None \
            else own.queries_per_day


def _check_value(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_QUOTA:
        raise ValueError(f"{name} must be an integer from 0 (no limit) to {MAX_QUOTA}")


def parse_tenant_quota(spec: str) -> tuple[str, TenantQuota]:
    """``"alice=running:2,queued:20,queries_per_day:100000"`` -> ``("alice", TenantQuota(2,
    20, 100000))``; each quota may be left out (the default applies). ValueError, bounded and
    not echoing long input, when the form is wrong."""
    shown = spec if len(spec) <= 80 else spec[:80] + "..."
    tenant, sep, body = spec.rpartition("=")
    tenant = tenant.strip()
    if not sep or not tenant or not body.strip():
        raise ValueError(f"expected TENANT=running:N,queued:N,queries_per_day:N, got {shown!r}")
    values: dict[str, int] = {}
    for part in body.split(","):
        name, colon, raw = part.strip().partition(":")
        name = name.strip()
        if not colon or name not in QUOTA_NAMES:
            raise ValueError(f"quota of tenant {tenant[:80]!r}: expected one of "
                             f"{', '.join(QUOTA_NAMES)} as NAME:N, got {part.strip()[:40]!r}")
        if name in values:
            raise ValueError(f"quota {name} of tenant {tenant[:80]!r} given twice")
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError(f"quota {name} of tenant {tenant[:80]!r} is not an integer: "
                             f"{raw.strip()[:40]!r}") from None
        _check_value(name, value)
        values[name] = value
    return tenant, TenantQuota(**values)


def parse_tenant_quotas(specs: Iterable[str]) -> dict[str, TenantQuota]:
    """Every ``--tenant-quota`` entry, by tenant (a tenant named twice is an error)."""
    out: dict[str, TenantQuota] = {}
    for spec in specs:
        tenant, quota = parse_tenant_quota(spec)
        if tenant in out:
            raise ValueError(f"tenant {tenant[:80]!r} given twice in --tenant-quota")
        out[tenant] = quota
    return out
