"""A tenant-fair share of one server's CPU-heavy work.

Admission (``CallSlots``, the memory budget) bounds how *many* calls a tenant has in progress
and how much memory they may hold, not what they *cost*: a tenant with a dozen large
perturbation, scoring or built-in-model calls in progress would otherwise keep every core
busy while another tenant's evaluation, whose calls are small, waits behind them. So every
costly piece of work (a perturbation, a white-box attack, a built-in target's inference, a
metric computation, a report rendering) runs through :meth:`WorkShare.run` (or inside
:meth:`WorkShare.slot`), which:

- runs at most ``slots`` pieces at once (by default the cores this process may use);
- gives a tenant at most ``max(1, slots // active)`` of them, where *active* counts the
  tenants that hold or wait for a slot or held one within the last ``active_window_s``:
  alone a tenant may use every core, beside others it keeps its share and leaves theirs
  free for the moment their next small call comes (a tenant's work between two calls is not
  a reason to give its share away);
- beside other active tenants, holds a tenant to its fair *rate* too (``slots / active``
  slots on average over the last seconds): whole slots alone would let a tenant keep one
  busy without pause while two others share the second, and their work between pieces
  (answering calls, storing results) runs on the same cores;
- grants a freed slot to the waiting tenant that has used the least slot time, so a tenant
  with many calls queued is served in turn with one that has a single call, not after all of
  its calls (start-time fair queueing: a tenant that arrives starts at the least usage among
  the active ones, so it neither owes for a past it did not use nor starves the others);
- lets a piece give its slot back while it waits for something that is not CPU
  (:meth:`WorkShare.yielded`: the proxy's wait for a rate limiter's turn) and take it back
  before it goes on, so sleeping holds no core and costs no share;
- (``run``) runs the piece on the share's own threads, at a lower scheduling priority than
  the threads answering calls, so a core busy with a piece still answers a control call or
  an evaluation's bookkeeping first.

Work done for a tenant by Fortis's own services (an evaluation's calls to the perturbation
service and the proxy) is counted for that tenant, not for the service. A thread that already
holds a slot passes through (nested work is one piece). Waiting stops when ``should_stop``
raises (the caller's deadline or cancellation), so a waiting call holds nothing after it ends.

Pure Python, no gRPC: the transport names the tenant, the domain code never sees this.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

__all__ = ["WorkShare", "default_slots"]

T = TypeVar("T")

#: How long a tenant counts as active after its last piece of work ended (seconds).
DEFAULT_ACTIVE_WINDOW_S = 1.0
#: Time constant of a tenant's recent use of the slots (seconds), against its fair rate.
RATE_TAU_S = 2.0
#: How much lower the scheduling priority (nice) of the threads that run the pieces is than
#: that of the threads answering calls.
WORK_NICE = 10
#: How often a waiting piece looks at its caller's deadline (seconds).
_POLL_S = 0.05


def _lower_priority() -> None:
    """This thread (a Linux task of its own) ``WORK_NICE`` below the priority it was started
    with (at most nice 19); where that is not supported, it stays as it is."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid,
                       min(19, os.getpriority(os.PRIO_PROCESS, tid) + WORK_NICE))
    except (AttributeError, OSError):
        pass


def default_slots(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may use, at least 1: its CPU affinity, lowered to its cgroup's
    CPU quota rounded up (a Kubernetes pod's CPU limit; the affinity there shows the node's
    cores, not the pod's)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_cpu_quota(cgroup_root)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def _cgroup_cpu_quota(root: Path) -> float | None:
    """CPUs of the cgroup's quota (v2 ``cpu.max``, else v1 ``cpu.cfs_quota_us``); None: none
    set or not readable."""
    try:
        quota, _, period = (root / "cpu.max").read_text().strip().partition(" ")
        if quota != "max":
            return int(quota) / int(period or 100000)
        return None
    except (OSError, ValueError):
        pass
    try:
        q = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        p = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return q / p if q > 0 and p > 0 else None
    except (OSError, ValueError):
        return None


@dataclass
class _Tenant:
    running: int = 0
    #: slot-seconds used (virtual time), the order in which waiting tenants are served
    used: float = 0.0
    last_end: float = 0.0
    #: when each running piece started
    starts: list[float] = field(default_factory=list)
    #: slot-seconds of the pieces ended, decayed with ``RATE_TAU_S`` (as of ``recent_at``)
    recent: float = 0.0
    recent_at: float = 0.0


@dataclass
class _Held:
    """A slot taken by :meth:`WorkShare.slot` on one thread (``held`` False while given back
    by :meth:`WorkShare.yielded`)."""
    tenant: str
    start: float
    should_stop: Callable[[], bool] | None
    held: bool = True


@dataclass
class _Waiter:
    tenant: str
    seq: int
    granted: threading.Event
    #: when the slot was granted (the piece's start, for its release)
    start: float = 0.0


class WorkShare:
    """See the module docstring. ``slots`` 0 turns sharing off (every piece runs at once)."""

    def __init__(self, slots: int, *, active_window_s: float = DEFAULT_ACTIVE_WINDOW_S,
                 rate_tau_s: float | None = RATE_TAU_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 0:
            raise ValueError("slots must be an integer >= 0 (0 = no sharing)")
        self.slots = slots
        self._window = active_window_s
        #: None: no cap on a tenant's rate, only on its slots (the order alone, in tests)
        self._tau = rate_tau_s
        self._clock = clock
        self._lock = threading.Lock()
        self._tenants: dict[str, _Tenant] = {}
        self._waiting: list[_Waiter] = []
        self._running = 0
        self._seq = itertools.count()
        self._held = threading.local()
        self._pool: ThreadPoolExecutor | None = None

    @property
    def enabled(self) -> bool:
        return self.slots > 0

    # -- the share ---------------------------------------------------------------------------

    def _active(self, now: float) -> int:
        waiting = {w.tenant for w in self._waiting}
        return sum(1 for name, t in self._tenants.items()
                   if t.running or name in waiting or now - t.last_end < self._window)

    def _forget_idle(self, now: float) -> None:
        waiting = {w.tenant for w in self._waiting}
        for name in [n for n, t in self._tenants.items()
                     if not t.running and n not in waiting
                     and now - t.last_end >= self._window]:
            del self._tenants[name]

    def _tenant(self, name: str, now: float) -> _Tenant:
        t = self._tenants.get(name)
        if t is None:
            self._forget_idle(now)
            floor = min((o.used for o in self._tenants.values()), default=0.0)
            t = self._tenants[name] = _Tenant(used=floor, last_end=now)
        return t

    def _rate(self, t: _Tenant, now: float) -> float:
        """Slots ``t`` has used lately (an exponential average over ``RATE_TAU_S``, its
        running pieces included)."""
        tau = self._tau or RATE_TAU_S
        decayed = t.recent * math.exp(-max(0.0, now - t.recent_at) / tau)
        return (decayed + sum(now - s for s in t.starts)) / tau

    def _eligible(self, t: _Tenant, now: float, share: int, active: int) -> bool:
        """Under its share of slots, and -- beside other active tenants -- under its fair
        rate (slots / active): a tenant that keeps one slot busy while two others come and
        go would otherwise take a whole core where its fair part is two thirds of one; the
        others' work between their pieces (answering calls, writing results) needs the rest."""
        if t.running >= share:
            return False
        return active <= 1 or self._tau is None or self._rate(t, now) < self.slots / active

    def _dispatch(self, now: float) -> None:
        """Grant free slots to waiting pieces, least-used tenant first (lock held)."""
        while self._waiting and self._running < self.slots:
            active = self._active(now)
            share = max(1, self.slots // max(1, active))
            ready = [w for w in self._waiting
                     if self._eligible(self._tenants[w.tenant], now, share, active)]
            if not ready:
                return
            w = min(ready, key=lambda w: (self._tenants[w.tenant].used, w.seq))
            self._waiting.remove(w)
            self._grant(w.tenant, now)
            w.start = now
            w.granted.set()

    def _grant(self, name: str, now: float) -> None:
        t = self._tenants[name]
        t.running += 1
        t.starts.append(now)
        self._running += 1

    @contextlib.contextmanager
    def slot(self, tenant: str, should_stop: Callable[[], bool] | None = None
             ) -> Iterator[None]:
        """Run the body in one of ``tenant``'s slots, waiting for it if the server is busy.
        ``should_stop`` is called while waiting; what it raises ends the wait."""
        depth: int = getattr(self._held, "depth", 0)
        if not self.enabled or depth:
            self._held.depth = depth + 1
            try:
                yield
            finally:
                self._held.depth -= 1
            return
        held = _Held(tenant=tenant, start=self._acquire(tenant, should_stop),
                     should_stop=should_stop)
        self._held.depth, self._held.slot = 1, held
        try:
            yield
        finally:
            self._held.depth, self._held.slot = 0, None
            if held.held:
                self._release(tenant, held.start)

    @contextlib.contextmanager
    def yielded(self) -> Iterator[None]:
        """Give this thread's slot back while the body waits for something that is not CPU
        (a rate limiter's turn), then take it back -- in turn, like any piece -- before going
        on. A slot held asleep would be a core nobody computes on, and its time would count
        against the tenant's fair rate as if it had computed. If taking it back is stopped
        (``should_stop``), nothing is held after. Outside a slot this thread took itself
        (sharing off, nested work, a piece on the share's threads) it does nothing."""
        held: _Held | None = getattr(self._held, "slot", None)
        if held is None or not held.held:
            yield
            return
        held.held = False
        self._release(held.tenant, held.start)
        yield           # an exception here leaves the slot given back
        held.start = self._acquire(held.tenant, held.should_stop)
        held.held = True

    def run(self, tenant: str, fn: Callable[[], T],
            should_stop: Callable[[], bool] | None = None) -> T:
        """``fn()`` in one of ``tenant``'s slots, on one of the share's own threads, which run
        at a lower scheduling priority (``WORK_NICE``) than the threads answering calls: a
        busy core then still answers a control call, or runs an evaluation's bookkeeping,
        before it goes on with a costly piece. The caller's context (tenant, log fields)
        goes with it; what ``fn`` raises is raised here. Inside a slot this thread took with
        :meth:`slot`, ``fn`` runs on a share thread in that slot; other nested work runs where
        it is."""
        depth: int = getattr(self._held, "depth", 0)
        held: _Held | None = getattr(self._held, "slot", None)
        if depth and held is not None and held.held:
            return self._on_share_thread(fn)
        if not self.enabled or depth:
            with self.slot(tenant, should_stop):
                return fn()
        with self.slot(tenant, should_stop):
            return self._on_share_thread(fn)

    def _on_share_thread(self, fn: Callable[[], T]) -> T:
        ctx = contextvars.copy_context()
        return self._executor().submit(ctx.run, self._nested, fn).result()

    def _nested(self, fn: Callable[[], T]) -> T:
        """``fn`` on a share thread, counted as already holding its slot (which the caller's
        thread took, and gives back)."""
        self._held.depth, self._held.slot = 1, None
        try:
            return fn()
        finally:
            self._held.depth = 0

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                # one thread per slot: a piece that holds a slot always finds one free
                self._pool = ThreadPoolExecutor(max_workers=self.slots,
                                                thread_name_prefix="work",
                                                initializer=_lower_priority)
            return self._pool

    def close(self) -> None:
        """Stop the share's threads once their pieces end."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def hold(self, tenant: str, should_stop: Callable[[], bool] | None = None
             ) -> Callable[[], None]:
        """Take a slot as :meth:`slot` does, for work that does not fit a ``with`` block
        (a call whose end is seen elsewhere); returns the function that gives it back (once;
        later calls do nothing)."""
        if not self.enabled:
            return lambda: None
        start = self._acquire(tenant, should_stop)
        once = threading.Lock()

        def release() -> None:
            if once.acquire(blocking=False):    # never released again
                self._release(tenant, start)
        return release

    def _acquire(self, tenant: str, should_stop: Callable[[], bool] | None
                 ) -> float:
        """When the piece's slot was granted (its start, for its release)."""
        with self._lock:
            now = self._clock()
            self._tenant(tenant, now)
            w = _Waiter(tenant=tenant, seq=next(self._seq), granted=threading.Event())
            self._waiting.append(w)
            self._dispatch(now)     # at once when a slot is free and nobody is owed it first
            if w.granted.is_set():
                return w.start
        try:
            while not w.granted.wait(_POLL_S):
                if should_stop is not None:
                    should_stop()
                with self._lock:    # a share held for a tenant gone idle is free again
                    self._dispatch(self._clock())
        except BaseException:
            with self._lock:
                if w in self._waiting:
                    self._waiting.remove(w)
                    self._dispatch(self._clock())
                    raise
            # granted between the wait and the lock: give it back
            self._release(tenant, w.start)
            raise
        return w.start

    def _release(self, tenant: str, start: float) -> None:
        with self._lock:
            now = self._clock()
            rec = self._tenants[tenant]
            rec.running -= 1
            self._running -= 1
            with contextlib.suppress(ValueError):
                rec.starts.remove(start)
            rec.used += now - start
            rec.recent = rec.recent * math.exp(
                -max(0.0, now - rec.recent_at) / (self._tau or RATE_TAU_S)) + (now - start)
            rec.recent_at = now
            rec.last_end = now
            self._dispatch(now)

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Per tenant: slots held, pieces waiting, slot-seconds used (for tests and metrics)."""
        with self._lock:
            waiting: dict[str, int] = {}
            for w in self._waiting:
                waiting[w.tenant] = waiting.get(w.tenant, 0) + 1
            return {name: {"running": t.running, "waiting": waiting.get(name, 0),
                           "used_s": t.used} for name, t in self._tenants.items()}
