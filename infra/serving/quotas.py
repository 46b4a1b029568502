"""Per-tenant quotas, so one tenant cannot take all the work: the settings both the
evaluation service and the target proxy read, and the parser of
``fortis serve --tenant-quota``.

Three quotas, each a server-wide default (``--max-running-per-tenant``,
``--max-queued-per-tenant``, ``--max-queries-per-day-per-tenant``) that a tenant's own entry
overrides (``--tenant-quota TENANT=running:2,queued:20,queries_per_day:100000``); 0 means no
limit:

- ``running``: evaluations of the tenant a worker runs at once (the fair scheduler,
  ``services/evaluation/scheduling.py``, starts no more);
- ``queued``: evaluations of the tenant waiting to start; CreateEvaluation beyond it is
  RESOURCE_EXHAUSTED (``QuotaExceeded``) and nothing is stored;
- ``queries_per_day``: images the target proxy sends for the tenant per UTC day, every attempt
  counted (``services/proxy/quotas.py``);
- ``calls_per_second``: the tenant's RPCs started per second on one server
  (``--max-call-rate-per-tenant``, a token bucket of one second's burst, ``CallRate``): a
  call beyond it waits for its turn, up to ``CALL_RATE_MAX_WAIT_S``, else RESOURCE_EXHAUSTED;
  each call costs the server's interpreter and threads something before any handler runs,
  so a tenant reopening streams or polling as fast as it can would otherwise take that
  share from everyone. Internal calls are not counted;
- ``calls``: the tenant's RPCs in progress at once on one server (``--max-calls-per-tenant``),
  counted by the server's interceptor with ``CallSlots``; a call beyond it is
  RESOURCE_EXHAUSTED at once, so one tenant cannot hold every worker thread of a shared
  server (each waiting Predict, Watch or stream holds one) and stall the others. Calls
  between Fortis's own services (the internal key) are not counted: they are bounded by the
  evaluation workers.

Pure code, no gRPC (shared by two services, so it lives in ``services/common``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["CALL_RATE_MAX_WAIT_S", "DEFAULT_CALL_RATE_PER_TENANT", "MAX_QUOTA", "QUOTA_NAMES", "CallRate", "CallSlots",
           "QuotaSettings", "TenantQuota",
           "parse_tenant_quota", "parse_tenant_quotas"]

#: The quotas a ``--tenant-quota`` entry may set.
QUOTA_NAMES = ("running", "queued", "queries_per_day", "calls", "calls_per_second")
#: Largest value of any quota (a typo of extra digits is refused, not taken as "no limit").
MAX_QUOTA = 10**12
#: ``fortis serve``'s default of ``--max-call-rate-per-tenant``: ten times a dashboard polling
#: every 0.1 s, far below what reopening streams in a loop reaches (hundreds per second).
DEFAULT_CALL_RATE_PER_TENANT = 50
#: Longest a call waits for its turn under ``calls_per_second`` before it is refused.
CALL_RATE_MAX_WAIT_S = 2.0


@dataclass(frozen=True)
class TenantQuota:
    """One tenant's overrides; ``None`` = the server-wide default."""

    running: int | None = None
    queued: int | None = None
    queries_per_day: int | None = None
    calls: int | None = None
    calls_per_second: int | None = None


@dataclass(frozen=True)
class QuotaSettings:
    """Server-wide defaults (0 = no limit) and per-tenant overrides."""

    max_running: int = 0
    max_queued: int = 0
    queries_per_day: int = 0
    tenants: Mapping[str, TenantQuota] = field(default_factory=dict)
    #: RPCs of one tenant in progress at once on a server (``fortis serve`` defaults to 16)
    max_calls: int = 0
    #: RPCs of one tenant started per second on a server (``fortis serve``:
    #: DEFAULT_CALL_RATE_PER_TENANT)
    max_call_rate: int = 0

    def __post_init__(self) -> None:
        for name, value in (("max_running", self.max_running), ("max_queued", self.max_queued),
                            ("queries_per_day", self.queries_per_day),
                            ("max_calls", self.max_calls),
                            ("max_call_rate", self.max_call_rate)):
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

    def calls_limit(self, tenant: str) -> int:
        """Most RPCs of ``tenant`` in progress at once on one server (0 = no limit)."""
        own = self.tenants.get(tenant)
        return self.max_calls if own is None or own.calls is None else own.calls

    def call_rate_limit(self, tenant: str) -> int:
        """Most RPCs of ``tenant`` started per second on one server (0 = no limit)."""
        own = self.tenants.get(tenant)
        return self.max_call_rate if own is None or own.calls_per_second is None \
            else own.calls_per_second


class CallRate:
    """Calls each tenant starts per second, against ``limit_of(tenant)`` (0 = no limit): a
    token bucket holding one second's worth. :meth:`turn` takes a token and says how long the
    call must wait for it (0: at once), or None when that is longer than ``max_wait_s`` (the
    call is refused and takes nothing). Full buckets are forgotten, so unknown tenant names
    grow nothing. Thread-safe; no gRPC; the clock is injectable."""

    def __init__(self, limit_of: Callable[[str], int], *,
                 max_wait_s: float = CALL_RATE_MAX_WAIT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._limit_of = limit_of
        self._max_wait = max_wait_s
        self._clock = clock
        self._tokens: dict[str, tuple[float, float]] = {}   # tenant -> (tokens, at)
        self._lock = threading.Lock()

    def limit(self, tenant: str) -> int:
        return self._limit_of(tenant)

    def turn(self, tenant: str) -> float | None:
        rate = self._limit_of(tenant)
        if not rate:
            return 0.0
        with self._lock:
            now = self._clock()
            if len(self._tokens) > 1024:
                self._forget_full(now)
            tokens, at = self._tokens.get(tenant, (float(rate), now))
            tokens = min(float(rate), tokens + (now - at) * rate)
            wait = 0.0 if tokens >= 1.0 else (1.0 - tokens) / rate
            if wait > self._max_wait:
                self._tokens[tenant] = (tokens, now)
                return None
            self._tokens[tenant] = (tokens - 1.0, now)
            return wait

    def _forget_full(self, now: float) -> None:
        for name in [n for n, (tok, at) in self._tokens.items()
                     if tok + (now - at) * max(1, self._limit_of(n)) >= self._limit_of(n)]:
            del self._tokens[name]


class CallSlots:
    """How many calls each tenant has in progress, against ``limit_of(tenant)`` (0 = none).

    ``enter`` takes a slot or says no (never waits: a call beyond the limit is refused at
    once, holding no thread); ``leave`` gives it back. Tenants with no call in progress are
    forgotten, so unknown tenant names grow nothing. Thread-safe; no gRPC.
    """

    def __init__(self, limit_of: Callable[[str], int]) -> None:
        self._limit_of = limit_of
        self._in_progress: dict[str, int] = {}
        self._lock = threading.Lock()

    def limit(self, tenant: str) -> int:
        return self._limit_of(tenant)

    def enter(self, tenant: str) -> bool:
        limit = self._limit_of(tenant)
        with self._lock:
            n = self._in_progress.get(tenant, 0)
            if limit and n >= limit:
                return False
            self._in_progress[tenant] = n + 1
            return True

    def leave(self, tenant: str) -> None:
        with self._lock:
            n = self._in_progress.get(tenant, 0) - 1
            if n > 0:
                self._in_progress[tenant] = n
            else:
                self._in_progress.pop(tenant, None)

    def in_progress(self, tenant: str) -> int:
        with self._lock:
            return self._in_progress.get(tenant, 0)


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
        raise ValueError("expected TENANT=running:N,queued:N,queries_per_day:N,calls:N,"
                         "calls_per_second:N, "
                         f"got {shown!r}")
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
