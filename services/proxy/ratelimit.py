"""Exact rate limits, counted in images per second as the *target* sees them.

What a service owner asks for is "never more than L images in any one-second window at my
service". The limiter only controls *grant* times; an image reaches the target some time
after its grant (hashing, serialisation, the network, the target's own thread pool), and
that delay varies. A limiter that only bounds grant-time windows of 1 s therefore overshoots
at the target: an earlier sliding-window bucket released a full burst exactly one window
after the previous one, and the target counted 23 (batch 1) and 40 (batch 5) images in one
second at ``rate=20``.

``RateLimiter`` combines two rules, both checked atomically before a grant:

* **the guarantee** -- an exact log of recent grants: no *closed* grant-time window of length
  ``window_s + jitter_s`` ever holds more than ``L`` images. If every image reaches the
  target between ``d`` and ``d + jitter_s`` after its grant (``d`` any constant), the
  images arriving in any window ``[a, a + window_s]`` were granted in
  ``[a - d - jitter_s, a + window_s - d]``, so **no sliding window at the target holds more
  than L images**, whatever the batch sizes, the number of threads or the idle spells;
* **the pacing** -- GCRA (virtual scheduling) with emission interval
  ``T = (window_s + jitter_s) / L`` per image: a grant of ``n`` images books ``n * T`` of
  the schedule, and the next grant may start at most ``tolerance_s`` (one interval, i.e.
  one image's worth) ahead of it. Sends are spread evenly instead
  of being released in bursts, so the log above rarely has to hold anything back and the
  target sees a smooth flow.

The price of the margin is throughput: sustained, ``L * window_s / (window_s + jitter_s)``
images per second (about 95% of L with the default 50 ms). A grant carries at most ``L``
images (``max_chunk()``); callers split larger batches. Batches of ``n`` images that do not
divide ``L`` go slower: at most ``floor(L / n)`` of them fit in any window, so the sustained
rate is ``n * floor(L / n) / (window_s + jitter_s)`` -- the most an exact limit allows.

``CompositeLimiter`` grants only when several limiters (a target's and a tenant's) all
agree, taking from none of them when one refuses; ``TenantLimits`` holds the per-tenant
limiters (across targets). Domain code: no gRPC. Clock and sleep are injectable so the
tests can drive a fake clock.

**Fair shares between tenants** (no tenant slows another's work). Who gets the
next free slot at a shared limiter is decided by ``FairQueue``, start-time fair queueing
(Goyal, Vin & Cheng, SIGCOMM 1996) counted in *images*: a call of ``n`` images from tenant
``i`` gets the start tag ``S = max(v, F_i)`` and moves ``F_i`` to ``S + n``, where ``v`` is
the start tag of the last grant; of the calls waiting, only the one with the smallest tag
may take a grant, the others wait their turn. So tenants with calls waiting share the
target equally in images per second whatever their batch sizes or number of threads
(before, a tenant sending single images from three threads kept taking each freed slot
while another's batches of five waited for five at once: 40 images took 246 s at 40/s);
a tenant back from idle gets no credit for the time it was away (``S >= v``), and within a
tenant calls go first come, first served. A call held back by its *own* tenant's limit is
set aside until that limit lets it go and keeps its tag, so it neither blocks the others
(the target keeps serving whoever can be served) nor loses its place. The queue only
orders grants; every grant still passes the exact rules above, so the guarantee is
unchanged.

**Where the state lives** (for a global rate limit across proxy
replicas). By default in this process (the embedded mode: ``_grants``/``_tat`` under the
limiter's lock, the code below). A limiter built with a ``store`` (a ``LimiterStore``, e.g.
``redis_store.RedisLimiterStore``) keeps the grant log and the GCRA schedule there instead,
so several proxy replicas share one limit: each try (``_try_grant``) is one atomic
operation of the store over every limiter of the grant (the same two rules, all-or-nothing),
on the store's one clock. The fair queue stays per replica: it orders this replica's
waiting calls; the store arbitrates between replicas.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import Protocol

from fortis.services.common.stopping import StopCheck, never, raise_if_stopped

#: Default allowance for the spread of the grant-to-arrival delay (seconds).
DEFAULT_JITTER_S = 0.1
#: A grant waits until strictly after an old grant leaves the window (float safety).
_EPS = 1e-6


#: What a waiting call is wrapped in while it waits (``WorkShare.yielded``: the caller's CPU
#: slot given back while it sleeps, taken back before it tries again).
Idle = Callable[[], AbstractContextManager[None]]


class Limiter(Protocol):
    """What the proxy needs of a limiter (a ``RateLimiter`` or a ``CompositeLimiter``)."""

    @property
    def limit(self) -> int: ...

    @property
    def unlimited(self) -> bool: ...

    def max_chunk(self) -> int: ...

    def acquire(self, n: int, tenant: str = "", should_stop: StopCheck = never,
                idle: Idle | None = None) -> float: ...


class LimiterStore(Protocol):
    """Limiter state outside this process, shared by proxy replicas.

    ``try_grant`` applies both rules of every limiter of one grant at once, atomically, on
    the store's own clock: ``shared`` is the limiter whose wait is reported first (the
    target's), ``rest`` the others (the tenant's). It returns ``(shared_wait, own_wait)`` in
    seconds; both ``0.0`` means the ``n`` images were granted on all of them (taken), else
    nothing was taken. A store that cannot answer raises ``errors.Unavailable`` (the proxy
    fails closed: nothing is sent)."""

    def try_grant(self, n: int, shared: RateLimiter, rest: Sequence[RateLimiter]
                  ) -> tuple[float, float]: ...


def _check_rate(images_per_second: float) -> int:
    if images_per_second < 0 or math.isnan(images_per_second):
        raise ValueError("images_per_second must be >= 0 (0 = unlimited)")
    limit = int(images_per_second) if images_per_second else 0
    if images_per_second and limit < 1:
        raise ValueError("images_per_second must be 0 or >= 1")
    return limit


class RateLimiter:
    """At most ``images_per_second`` images at the target in any window of ``window_s``.

    ``jitter_s`` is how much the grant-to-arrival delay may vary while the guarantee still
    holds (see the module docstring); ``tolerance_s`` is how far a grant may run ahead of
    the pacing schedule (default one interval): slack so that a grant delayed by a late
    wake-up or by the log does not push the whole schedule back (less slack is smoother,
    more sustains mixed batch sizes better; the guarantee holds either way).
    """

    def __init__(self, images_per_second: float, *, window_s: float = 1.0,
                 jitter_s: float = DEFAULT_JITTER_S, tolerance_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 store: LimiterStore | None = None, key: str = "") -> None:
        self._limit = _check_rate(images_per_second)
        if store is not None and not key:
            raise ValueError("a limiter kept in a store needs a key (e.g. 'target:NAME')")
        #: where the state lives: None = this process (below); else shared
        self.store = store
        #: the limiter's name in the store ("target:NAME" / "tenant:NAME")
        self.key = key
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        if jitter_s < 0:
            raise ValueError("jitter_s must be >= 0")
        if tolerance_s is not None and tolerance_s < 0:
            raise ValueError("tolerance_s must be >= 0")
        self.window = window_s
        self.jitter = jitter_s
        #: the closed window, at grant time, that must never hold more than ``limit``
        self.span = window_s + jitter_s
        #: GCRA emission interval, seconds per image
        self.interval = self.span / self._limit if self._limit else 0.0
        #: how far (s) a grant may start ahead of the GCRA schedule
        self.tau = self.interval if tolerance_s is None else tolerance_s
        self._clock = clock
        self._sleep = sleep
        self._grants: deque[tuple[float, int]] = deque()
        self._in_span = 0
        self._tat: float | None = None          # GCRA theoretical arrival time
        self._lock = threading.Lock()
        #: who goes next when several calls wait here (fair between tenants)
        self.queue = FairQueue()

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def unlimited(self) -> bool:
        return self._limit == 0

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    def max_chunk(self) -> int:
        """Largest number of images one grant may carry."""
        return self._limit if self._limit else 1 << 30

    def _check_n(self, n: int) -> None:
        if n < 1:
            raise ValueError("a grant carries at least one image")
        if not self.unlimited and n > self._limit:
            raise ValueError(f"cannot send {n} images at once under a limit of {self._limit}/s")

    # -- the two rules; call with the lock held ---------------------------------------------
    def _wait_for(self, n: int, now: float) -> float:
        """Seconds from ``now`` until ``n`` images may be granted (0: now). Takes nothing."""
        horizon = now - self.span
        while self._grants and self._grants[0][0] < horizon:
            self._in_span -= self._grants.popleft()[1]
        wait = 0.0
        if self._tat is not None:
            # GCRA: a grant may start at most tau ahead of the schedule.
            wait = max(wait, self._tat - self.tau - now)
        excess = self._in_span + n - self._limit
        if excess > 0:
            freed = 0
            for t, k in self._grants:
                freed += k
                if freed >= excess:
                    wait = max(wait, t + self.span - now + _EPS)
                    break
        return wait if wait > 1e-9 else 0.0

    def _take(self, n: int, now: float) -> None:
        self._grants.append((now, n))
        self._in_span += n
        self._tat = max(self._tat if self._tat is not None else now, now) + n * self.interval

    # -- public -----------------------------------------------------------------------------
    def try_acquire(self, n: int) -> float:
        """Grant ``n`` images now and return 0.0, or take nothing and return the wait (s)."""
        return _attempt((self,), n, self._clock)[0]

    def acquire(self, n: int, tenant: str = "", should_stop: StopCheck = never,
                idle: Idle | None = None) -> float:
        """Block until ``n`` images may be sent; return the grant time (clock units).

        ``n`` must not exceed ``max_chunk()``: callers split larger batches. Waiting calls
        are served fairly between tenants (``FairQueue``), first come first served within one.
        ``should_stop`` is checked while waiting (at least every ``STOP_CHECK_S``): a caller
        gone or past its deadline gives up its place and takes nothing. Each wait runs inside
        ``idle()`` when given; the grant itself never does.
        """
        return acquire_all((self,), n, clock=self._clock, sleep=self._sleep, tenant=tenant,
                           should_stop=should_stop, idle=idle)


def _flatten(limiters: Iterable[RateLimiter | CompositeLimiter]) -> list[RateLimiter]:
    """The distinct limited ``RateLimiter``s, in the one fixed lock order (by ``id``)."""
    out: dict[int, RateLimiter] = {}
    for x in limiters:
        for p in (x.parts if isinstance(x, CompositeLimiter) else (x,)):
            if not p.unlimited:
                out[id(p)] = p
    flat = [out[k] for k in sorted(out)]
    if len(flat) > 1 and any(p.store is not flat[0].store for p in flat):
        raise ValueError("the limiters of one grant must keep their state in one place "
                         "(all in this process, or all in the same store)")
    return flat


def _try_grant(shared: RateLimiter, rest: Sequence[RateLimiter], flat: Sequence[RateLimiter],
               n: int, clock: Callable[[], float]) -> tuple[float, float, float]:
    """One all-or-nothing try on ``shared`` and ``rest`` (``flat``: both, in lock order;
    one store): ``(now, own_wait, shared_wait)``; both waits 0.0: granted and taken.

    In this process: the locks in one fixed order (by ``id``, so two callers combining the
    same limiters cannot deadlock), the two rules, and nothing taken unless all agree. In a
    store: one atomic operation of the store does the same; ``now`` is then this
    process's clock right after the store's answer (the grant's send time).
    """
    if shared.store is not None:
        wait, own = shared.store.try_grant(n, shared, rest)
        return clock(), own, wait
    with ExitStack() as stack:
        for x in flat:
            stack.enter_context(x._lock)
        now = clock()
        own = max((x._wait_for(n, now) for x in rest), default=0.0)
        wait = shared._wait_for(n, now)
        if own <= 0.0 and wait <= 0.0:
            for x in flat:
                x._take(n, now)
        return now, own, wait


def _attempt(limiters: Sequence[RateLimiter], n: int,
             clock: Callable[[], float]) -> tuple[float, float]:
    """One try on already-flattened limiters: ``(0.0, grant time)`` or ``(wait, now)``;
    nothing is taken from any limiter unless all of them agree (``_try_grant``)."""
    if not limiters:
        return 0.0, clock()
    now, own, wait = _try_grant(limiters[0], limiters[1:], limiters, n, clock)
    wait = max(own, wait)
    return (0.0, now) if wait <= 0.0 else (wait, now)


def try_acquire_all(limiters: Iterable[RateLimiter | CompositeLimiter], n: int,
                    clock: Callable[[], float] = time.monotonic) -> float:
    """Grant ``n`` images on every limiter at once (0.0), or on none (the longest wait)."""
    flat = _flatten(limiters)
    for x in flat:
        x._check_n(n)
    return _attempt(flat, n, clock)[0]


def acquire_all(limiters: Iterable[RateLimiter | CompositeLimiter], n: int, *,
                clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep, tenant: str = "",
                should_stop: StopCheck = never, idle: Idle | None = None) -> float:
    """Block until every limiter grants ``n`` images; return the grant time.

    The first limited limiter given (the shared one: the target's, in the proxy) orders the
    waiting calls with its ``FairQueue``; the call whose turn it is sleeps for the computed
    wait (no busy loop) and tries again, the others wait to be woken when a grant is made.
    """
    ordered = [p for x in limiters
               for p in (x.parts if isinstance(x, CompositeLimiter) else (x,))
               if not p.unlimited]
    flat = _flatten(limiters)
    for x in flat:
        x._check_n(n)
    if not flat:
        return clock()
    shared = ordered[0]
    return shared.queue.acquire(tenant, n, shared, flat, clock=clock, sleep=sleep,
                                should_stop=should_stop, idle=idle)


class _Ticket:
    __slots__ = ("tenant", "n", "start", "seq", "not_before")

    def __init__(self, tenant: str, n: int, start: float, seq: int) -> None:
        self.tenant = tenant
        self.n = n
        self.start = start
        self.seq = seq
        self.not_before = -math.inf     # set aside by the tenant's own limit until then


#: the longest a waiting call sleeps before looking again without being woken (s): a
#: safety net only; turns are handed over by ``notify_all``.
_MAX_IDLE_WAIT_S = 0.25
#: how often (s) a waiting call with a ``should_stop`` check looks at it
STOP_CHECK_S = 0.1


class FairQueue:
    """Start-time fair queueing of grants between tenants at one shared limiter.

    See the module docstring. ``acquire`` is the blocking path; the state (tags, virtual
    time) is in images, so shares are equal in images per second. Only tenants seen in the
    current busy period are remembered: when nobody waits, the virtual time moves to the
    last finish tag and the tags are forgotten (and during a long busy period, tenants whose
    tag is behind ``_vtime`` are dropped), so many tenants grow nothing.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._waiting: dict[int, _Ticket] = {}
        self._vtime = 0.0                       # start tag of the last grant
        self._finish: dict[str, float] = {}     # each tenant's last finish tag
        self._seq = itertools.count()

    def __len__(self) -> int:
        with self._cond:
            return len(self._waiting)

    # -- with the condition's lock held ----------------------------------------------------
    def _join(self, tenant: str, n: int) -> _Ticket:
        start = max(self._vtime, self._finish.get(tenant, self._vtime))
        self._finish[tenant] = start + n
        ticket = _Ticket(tenant, n, start, next(self._seq))
        self._waiting[ticket.seq] = ticket
        return ticket

    def _leave(self, ticket: _Ticket, granted: bool) -> None:
        self._waiting.pop(ticket.seq, None)
        if granted:
            self._vtime = max(self._vtime, ticket.start)
        elif self._finish.get(ticket.tenant) == ticket.start + ticket.n:
            self._finish[ticket.tenant] = ticket.start      # a call given up: no debt
        if not self._waiting:
            # the end of a busy period: nobody is behind anybody any more
            self._vtime = max([self._vtime, *self._finish.values()])
            self._finish.clear()
        elif len(self._finish) > 2 * len(self._waiting) + 16:
            # forget tenants whose tags are behind: they would start at ``_vtime`` anyway
            waiting = {t.tenant for t in self._waiting.values()}
            self._finish = {k: f for k, f in self._finish.items()
                            if f > self._vtime or k in waiting}
        self._cond.notify_all()

    def _head(self, now: float) -> _Ticket | None:
        """The waiting call whose turn it is: the smallest tag among those not set aside."""
        best: _Ticket | None = None
        for t in self._waiting.values():
            if t.not_before <= now and (best is None or t.start < best.start):
                best = t        # dict order is arrival order: ties go to the earlier call
        return best

    # -- public ------------------------------------------------------------------------------
    def acquire(self, tenant: str, n: int, shared: RateLimiter, flat: Sequence[RateLimiter],
                *, clock: Callable[[], float], sleep: Callable[[float], None],
                should_stop: StopCheck = never, idle: Idle | None = None) -> float:
        """Wait for this call's turn, then for ``flat`` (which includes ``shared``) to grant.

        ``should_stop`` (the caller's deadline or cancellation) is checked before each wait;
        a stopped call leaves the queue having taken nothing (its error is raised). With
        ``idle``, each wait -- for the call's turn, or for the limits to allow it -- runs
        inside ``idle()``, which may itself take time on the way out (taking a CPU slot back);
        the try that grants does not."""
        rest = [x for x in flat if x is not shared]
        slice_s = math.inf if should_stop is never else STOP_CHECK_S
        with self._cond:
            ticket = self._join(tenant, n)
        granted = False
        try:
            while True:
                raise_if_stopped(should_stop, "waiting for the rate limit")
                pause: float | None
                with self._cond:
                    now = clock()
                    if ticket.not_before > now:
                        pause = ticket.not_before - now      # held by the tenant's own limit
                    elif self._head(now) is not ticket:
                        if idle is None:
                            self._cond.wait(min(_MAX_IDLE_WAIT_S, slice_s))  # another's turn
                            continue
                        pause = None
                    else:
                        now, own, wait = _try_grant(shared, rest, flat, n, clock)
                        granted = own <= 0.0 and wait <= 0.0
                        if granted:
                            self._leave(ticket, granted=True)
                            return now
                        if own > 0.0:
                            # the tenant's own limit holds this call: the next one's turn
                            ticket.not_before = now + own
                            self._cond.notify_all()
                            pause = own
                        else:
                            pause = wait
                if idle is None:
                    assert pause is not None
                    sleep(min(pause, slice_s))
                else:
                    with idle():
                        self._idle_wait(ticket, pause, clock, sleep, should_stop, slice_s)
        finally:
            if not granted:
                with self._cond:
                    self._leave(ticket, granted=False)

    def _idle_wait(self, ticket: _Ticket, pause: float | None, clock: Callable[[], float],
                   sleep: Callable[[float], None], should_stop: StopCheck,
                   slice_s: float) -> None:
        """One wait of ``acquire`` with ``idle``: the whole ``pause``, or -- ``None`` --
        until it is ``ticket``'s turn, so what ``idle`` gives back is taken back once per
        wait rather than at every grant another call gets."""
        if pause is not None:
            end = clock() + pause
            while (left := end - clock()) > 0:
                sleep(min(left, slice_s))
                raise_if_stopped(should_stop, "waiting for the rate limit")
            return
        with self._cond:
            while (now := clock()) >= ticket.not_before and self._head(now) is not ticket:
                self._cond.wait(min(_MAX_IDLE_WAIT_S, slice_s))
                raise_if_stopped(should_stop, "waiting for the rate limit")


class CompositeLimiter:
    """Several limiters as one: a grant needs (and takes from) all of them.

    All parts must read the same clock (``time.monotonic`` in production); the composite
    uses the first part's clock and sleep. ``limit`` is the tightest part's limit.
    """

    def __init__(self, *parts: RateLimiter | CompositeLimiter) -> None:
        flat: list[RateLimiter] = []
        for p in parts:
            flat += p.parts if isinstance(p, CompositeLimiter) else (p,)
        if not flat:
            raise ValueError("a composite limiter needs at least one part")
        self.parts: tuple[RateLimiter, ...] = tuple(flat)
        self._clock = flat[0]._clock
        self._sleep = flat[0]._sleep

    @property
    def limit(self) -> int:
        return min((p.limit for p in self.parts if not p.unlimited), default=0)

    @property
    def unlimited(self) -> bool:
        return all(p.unlimited for p in self.parts)

    def max_chunk(self) -> int:
        return min(p.max_chunk() for p in self.parts)

    def try_acquire(self, n: int) -> float:
        return try_acquire_all(self.parts, n, self._clock)

    def acquire(self, n: int, tenant: str = "", should_stop: StopCheck = never,
                idle: Idle | None = None) -> float:
        """Block until every part grants; the first limited part's queue orders the waiters."""
        return acquire_all(self.parts, n, clock=self._clock, sleep=self._sleep, tenant=tenant,
                           should_stop=should_stop, idle=idle)


def parse_tenant_rates(pairs: Iterable[str]) -> dict[str, float]:
    """``["alice=20", "bob=5.5"]`` -> ``{"alice": 20.0, "bob": 5.5}`` (the CLI's form)."""
    rates: dict[str, float] = {}
    for pair in pairs:
        tenant, sep, value = pair.partition("=")
        tenant = tenant.strip()
        if not sep or not tenant:
            raise ValueError(f"expected TENANT=IMAGES_PER_SECOND, got {pair!r}")
        if tenant in rates:
            raise ValueError(f"tenant {tenant!r} given twice")
        try:
            rate = float(value)
        except ValueError:
            raise ValueError(f"rate of tenant {tenant!r} is not a number: {value!r}") from None
        _check_rate(rate)
        rates[tenant] = rate
    return rates


class TenantLimits:
    """Per-tenant images/s across all targets; tenants not named get ``default`` (0 = none).

    One limiter per limited tenant, created on first use and shared by every target, so a
    tenant's limit holds on the sum of its traffic (to the extent the targets'
    grant-to-arrival delays stay within ``jitter_s`` of each other). Tenants without a limit
    share one unlimited limiter, so unknown tenant names grow nothing. With a ``store``,
    each tenant's limiter keeps its state there, under ``tenant:<name>``, shared
    by every proxy replica using that store.
    """

    def __init__(self, rates: Mapping[str, float] | None = None, *, default: float = 0.0,
                 window_s: float = 1.0, jitter_s: float = DEFAULT_JITTER_S,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 store: LimiterStore | None = None) -> None:
        self.rates = dict(rates or {})
        #: where the tenants' limiters keep their state (None: this process)
        self.store = store
        for tenant, rate in self.rates.items():
            if not tenant:
                raise ValueError("tenant names must not be empty")
            _check_rate(rate)
        _check_rate(default)
        self.default = default
        self.window = window_s
        self.jitter = jitter_s
        self._clock = clock
        self._sleep = sleep
        self._unlimited = RateLimiter(0, clock=clock, sleep=sleep)
        self._limiters: dict[str, RateLimiter] = {}
        self._lock = threading.Lock()

    @classmethod
    def parse(cls, pairs: Iterable[str], *, default: float = 0.0) -> TenantLimits:
        """From the CLI's ``TENANT=IMAGES_PER_SECOND`` pairs."""
        return cls(parse_tenant_rates(pairs), default=default)

    def rate_of(self, tenant: str) -> float:
        return self.rates.get(tenant, self.default)

    def limiter_for(self, tenant: str) -> RateLimiter:
        """The tenant's limiter (the shared unlimited one when the tenant has no limit)."""
        rate = self.rate_of(tenant)
        if not rate:
            return self._unlimited
        with self._lock:
            lim = self._limiters.get(tenant)
            if lim is None:
                lim = RateLimiter(rate, window_s=self.window, jitter_s=self.jitter,
                                  clock=self._clock, sleep=self._sleep, store=self.store,
                                  key=f"tenant:{tenant}" if self.store is not None else "")
                self._limiters[tenant] = lim
            return lim
