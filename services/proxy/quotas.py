"""Queries per day per tenant in the target proxy: a quota that bounds the work each
tenant may ask of the targets.

What counts: every ledger row of the tenant whose send time falls in the **current UTC day**
(00:00 to 24:00 UTC; the count starts again at midnight UTC) -- every attempt the target
received or may have received, retries and in-flight/interrupted rows included, the same
rows the hard session budgets count (the ledger is what the target saw). Rows the
proxy completed as ``not sent`` (the rate limiter refused before the images went) do not
count. Answers replayed from the ledger to a resumed attempt are not sent, so not counted.

How: the ledger is the source of truth at start-up (:meth:`DailyQueryQuotas.load_from`, one
``GROUP BY tenant`` over today's rows, so a restart does not reset the count); afterwards the
count is kept in memory, moved forward exactly when rows are reserved:

- a call is admitted whole or refused whole before anything is sent
  (:meth:`DailyQueryQuotas.admit`): room for all its images is *held*; refused calls are
  ``QuotaExceeded`` (RESOURCE_EXHAUSTED, QuotaFailure subject ``tenant:<name>``);
- as each chunk's first attempt is sent (its ledger rows reserved, the rate limiter's grant
  taken), its images move from held to used (:meth:`Hold.take`); what was held and never
  sent is released when the call ends (:meth:`Hold.release`);
- a retry is sent only if it fits (:meth:`DailyQueryQuotas.try_charge`); otherwise the
  target's error stands (as for a retry the session budget cannot pay); a retry the rate
  limiter gives up on is refunded (:meth:`DailyQueryQuotas.refund`: its rows are "not sent").

Domain code: no gRPC.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from fortis.services.common import errors

__all__ = ["DAY_S", "DailyQueryQuotas", "Hold", "utc_day"]

#: Seconds in a (UTC) day.
DAY_S = 86400


def utc_day(t: float) -> int:
    """The UTC day number (days since 1970-01-01 UTC) of wall-clock time ``t``."""
    return int(t // DAY_S)


class AttemptCounts(Protocol):
    """What the quota reads from the ledger at start-up."""

    def attempts_since(self, t: float) -> dict[str, int]: ...


class Hold:
    """Room held for one admitted call (``n`` images); :meth:`take` as rows are reserved,
    :meth:`release` when the call ends (frees what was never sent)."""

    def __init__(self, quotas: DailyQueryQuotas, tenant: str, n: int) -> None:
        self._quotas, self.tenant, self.left = quotas, tenant, n

    def take(self, k: int) -> None:
        """``k`` images' rows were reserved: count them as used."""
        k = min(k, self.left)
        self.left -= k
        if k:
            self._quotas._move(self.tenant, k)

    def release(self) -> None:
        if self.left:
            self._quotas._unhold(self.tenant, self.left)
        self.left = 0


class DailyQueryQuotas:
    """Per-tenant queries per UTC day; ``limit_of(tenant)`` 0 = no limit. Thread-safe."""

    def __init__(self, limit_of: Callable[[str], int] = lambda _t: 0, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.limit_of = limit_of
        self._clock = clock
        self._day = utc_day(clock())
        self._used: dict[str, int] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def load(self, counts: Mapping[str, int], *, day: int | None = None) -> None:
        """Start from ``counts`` (rows per tenant of UTC day ``day``, default today)."""
        with self._lock:
            self._day = utc_day(self._clock()) if day is None else day
            self._used = {t: int(n) for t, n in counts.items() if n}
            self._roll()

    def load_from(self, ledger: AttemptCounts) -> None:
        """Start from the ledger's rows of the current UTC day (the source of truth)."""
        day = utc_day(self._clock())
        self.load(ledger.attempts_since(float(day * DAY_S)), day=day)

    def _roll(self) -> None:
        """Start a new count at midnight UTC (the lock held)."""
        today = utc_day(self._clock())
        if today != self._day:
            self._day, self._used = today, {}

    def usage(self, tenant: str) -> tuple[int, int]:
        """(queries counted today, the tenant's limit; 0 = none)."""
        with self._lock:
            self._roll()
            return self._used.get(tenant, 0), self.limit_of(tenant)

    def _violation(self, tenant: str, used: int, held: int, limit: int, n: int
                   ) -> errors.QuotaViolation:
        day = time.strftime("%Y-%m-%d", time.gmtime(self._day * DAY_S))
        in_flight = f" ({held} more held by calls in progress)" if held else ""
        return errors.QuotaViolation(
            f"tenant:{tenant[:100]}",
            f"queries per day: {used} of {limit} used on {day} (UTC){in_flight}; {n} more "
            "requested; the count starts again at 00:00 UTC")

    def admit(self, tenant: str, n: int) -> Hold:
        """Hold room for ``n`` images, or raise ``QuotaExceeded`` (nothing held) when the
        tenant's sent and held images would pass its limit."""
        limit = self.limit_of(tenant)
        with self._lock:
            self._roll()
            used, held = self._used.get(tenant, 0), self._held.get(tenant, 0)
            if limit and used + held + n > limit:
                raise errors.QuotaExceeded([self._violation(tenant, used, held, limit, n)])
            self._held[tenant] = held + n
        return Hold(self, tenant, n)

    def try_charge(self, tenant: str, n: int) -> bool:
        """Count ``n`` more images (a retry) if they fit; whether they did."""
        limit = self.limit_of(tenant)
        with self._lock:
            self._roll()
            used, held = self._used.get(tenant, 0), self._held.get(tenant, 0)
            if limit and used + held + n > limit:
                return False
            self._used[tenant] = used + n
            return True

    def refund(self, tenant: str, n: int) -> None:
        """Uncount ``n`` images charged by :meth:`try_charge` that were not sent after all
        (the rate limiter gave up before the retry went)."""
        with self._lock:
            left = self._used.get(tenant, 0) - n
            if left > 0:
                self._used[tenant] = left
            else:
                self._used.pop(tenant, None)

    def _move(self, tenant: str, k: int) -> None:
        with self._lock:
            self._roll()
            self._unhold_locked(tenant, k)
            self._used[tenant] = self._used.get(tenant, 0) + k

    def _unhold(self, tenant: str, k: int) -> None:
        with self._lock:
            self._unhold_locked(tenant, k)

    def _unhold_locked(self, tenant: str, k: int) -> None:
        left = self._held.get(tenant, 0) - k
        if left > 0:
            self._held[tenant] = left
        else:
            self._held.pop(tenant, None)
