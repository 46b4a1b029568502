"""Fair scheduling of evaluations across tenants, so one tenant's queue cannot starve
another's (SPEC CAN-9 for resumed evaluations).

:class:`FairScheduler` decides which waiting evaluation a free worker starts next:

- **across tenants, least recently started first**: the tenant whose last start is oldest
  (a tenant never started yet before any other) goes first, so tenants take turns, one start
  each, whatever the length of their queues; tenants that never started, or started at the
  same turn, go by the age of their oldest waiting job;
- **within a tenant, oldest first** (submission order; resumed evaluations re-enter in the
  order they were created);
- a tenant at its ``running`` quota is skipped (its jobs wait, others' start), and no more
  than ``capacity`` jobs run at once (the worker threads).

So tenant B's one evaluation starts as soon as a worker frees even when tenant A queued 50
earlier: after A's start, A is the most recently served tenant. A cancelled job leaves the
queue (:meth:`FairScheduler.remove`). The queue also gives the ``queued`` quota its count
(:meth:`FairScheduler.queued`).

Pure and not thread-safe: the evaluation manager holds its lock around every call. No gRPC,
no store: the manager maps picks to worker threads and rows.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["FairScheduler", "Pick"]

P = TypeVar("P")


@dataclass(frozen=True)
class Pick(Generic[P]):
    """A job the scheduler started: run it, then call :meth:`FairScheduler.done`."""

    tenant: str
    job_id: str
    payload: P


@dataclass
class _Waiting(Generic[P]):
    job_id: str
    seq: int
    payload: P


class FairScheduler(Generic[P]):
    """Round-robin across tenants (least recently started first), oldest first within one,
    at most ``capacity`` running and at most ``running_limit(tenant)`` (0 = no limit) per
    tenant."""

    def __init__(self, capacity: int, running_limit: Callable[[str], int] = lambda _t: 0
                 ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.running_limit = running_limit
        self._queues: dict[str, deque[_Waiting[P]]] = {}
        self._running: dict[str, set[str]] = {}
        #: Per tenant: the turn number of its last start (absent: never started).
        self._last_start: dict[str, int] = {}
        self._turns = itertools.count(1)
        self._seq = itertools.count()

    # -- queue --------------------------------------------------------------------------
    def push(self, tenant: str, job_id: str, payload: P) -> None:
        """Queue ``job_id`` behind the tenant's other waiting jobs. ValueError when the
        tenant's job of that id is already waiting or running."""
        if self.is_waiting(tenant, job_id) or job_id in self._running.get(tenant, ()):
            raise ValueError("job already queued or running")
        self._queues.setdefault(tenant, deque()).append(
            _Waiting(job_id=job_id, seq=next(self._seq), payload=payload))

    def remove(self, tenant: str, job_id: str) -> bool:
        """Take a waiting job out of the queue (a cancelled evaluation); whether it was
        waiting. A running job is not affected."""
        queue = self._queues.get(tenant)
        if not queue:
            return False
        for w in queue:
            if w.job_id == job_id:
                queue.remove(w)
                if not queue:
                    del self._queues[tenant]
                return True
        return False

    def is_waiting(self, tenant: str, job_id: str) -> bool:
        return any(w.job_id == job_id for w in self._queues.get(tenant, ()))

    def queued(self, tenant: str) -> int:
        """How many of the tenant's jobs wait to start (the ``queued`` quota counts these)."""
        return len(self._queues.get(tenant, ()))

    def running(self, tenant: str) -> int:
        return len(self._running.get(tenant, ()))

    @property
    def total_running(self) -> int:
        return sum(len(s) for s in self._running.values())

    @property
    def total_queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    # -- picking --------------------------------------------------------------------------
    def _eligible(self, tenant: str) -> bool:
        limit = self.running_limit(tenant)
        return not limit or self.running(tenant) < limit

    def next(self) -> Pick[P] | None:
        """Start the next job (it counts as running until :meth:`done`), or None when no
        worker is free or every waiting tenant is at its running quota."""
        if self.total_running >= self.capacity:
            return None
        candidates = [t for t, q in self._queues.items() if q and self._eligible(t)]
        if not candidates:
            return None
        tenant = min(candidates, key=lambda t: (self._last_start.get(t, 0),
                                                self._queues[t][0].seq))
        queue = self._queues[tenant]
        w = queue.popleft()
        if not queue:
            del self._queues[tenant]
        self._running.setdefault(tenant, set()).add(w.job_id)
        self._last_start[tenant] = next(self._turns)
        return Pick(tenant=tenant, job_id=w.job_id, payload=w.payload)

    def drain(self) -> list[Pick[P]]:
        """Every job that may start now, in start order."""
        out = []
        while (p := self.next()) is not None:
            out.append(p)
        return out

    def done(self, tenant: str, job_id: str) -> None:
        """A running job ended (finished, failed, cancelled or interrupted): its worker and
        its place in the tenant's running quota are free."""
        running = self._running.get(tenant)
        if running is not None:
            running.discard(job_id)
            if not running:
                del self._running[tenant]
