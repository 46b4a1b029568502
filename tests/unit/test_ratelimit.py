"""The rate limiter's guarantee, checked at *arrival* time on simulated schedules.

A fake clock drives an event simulation: several clients (standing in for threads) ask for
batches at random moments, ``try_acquire`` grants or says how long to wait (exactly what
``acquire`` does in a loop), and every granted image "arrives" at the target some delay
later, the delay varying by up to the limiter's ``jitter_s``. No half-open 1-second window
of arrivals may hold more than the limit, and the throughput must stay close to it.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
import time

import numpy as np
import pytest
from fortis.services.proxy.ledger import max_in_window
from fortis.services.proxy.ratelimit import (
    DEFAULT_JITTER_S,
    CompositeLimiter,
    FairQueue,
    RateLimiter,
    TenantLimits,
    acquire_all,
    parse_tenant_rates,
)


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


def simulate(limiters_of, clients, *, clock, rng, duration, jitter, adversarial=False):
    """Run ``clients`` = [(name, batch_fn, think_fn)] against ``limiters_of(name)``.

    Returns {name: [arrival times]} and the list of all arrivals. Each client asks again
    ``think_fn()`` seconds after its previous grant; a refused client retries after the
    wait the limiter gave (no polling).
    """
    arrivals: dict[str, list[float]] = {name: [] for name, _, _ in clients}
    queue = [(clock.t + float(rng.uniform(0, 0.3)), k) for k in range(len(clients))]
    heapq.heapify(queue)
    pending = [clients[k][1]() for k in range(len(clients))]
    end = clock.t + duration
    while queue:
        t, k = heapq.heappop(queue)
        if t > end:
            continue
        clock.t = max(clock.t, t)
        name, batch_fn, think_fn = clients[k]
        n = pending[k]
        lim = limiters_of(name)
        wait = lim.try_acquire(n)
        if wait > 0:
            heapq.heappush(queue, (clock.t + wait, k))
            continue
        if adversarial:     # the worst spread: each grant either as early or as late as allowed
            delay = 0.02 + (jitter if rng.random() < 0.5 else 0.0)
        else:
            delay = 0.02 + float(rng.uniform(0, jitter))
        arrivals[name] += [clock.t + delay] * n
        pending[k] = batch_fn()
        heapq.heappush(queue, (clock.t + think_fn(), k))
    return arrivals


@pytest.mark.parametrize("seed", range(12))
def test_no_one_second_window_at_the_target_exceeds_the_limit(seed):
    rng = np.random.default_rng(seed)
    clock = FakeClock()
    limit = int(rng.choice([1, 3, 7, 20, 33]))
    rl = RateLimiter(limit, clock=clock, sleep=clock.sleep)
    n_clients = int(rng.integers(1, 7))
    fixed = int(rng.integers(1, limit + 1))
    mixed = bool(rng.random() < 0.5)

    def batch() -> int:
        return int(rng.integers(1, limit + 1)) if mixed else fixed

    def think() -> float:
        return float(rng.choice([0.0, rng.exponential(0.05), rng.exponential(1.5)]))

    clients = [(f"c{k}", batch, think) for k in range(n_clients)]
    arr = simulate(lambda _: rl, clients, clock=clock, rng=rng, duration=40.0,
                   jitter=DEFAULT_JITTER_S, adversarial=bool(seed % 2))
    times = [t for ts in arr.values() for t in ts]
    assert times
    assert max_in_window(times, 1.0) <= limit


@pytest.mark.parametrize("limit, batch, n_clients", [(20, 1, 4), (20, 5, 4), (20, 7, 3),
                                                     (10, 10, 2), (100, 3, 6)])
def test_sustained_throughput_is_close_to_the_limit(limit, batch, n_clients):
    rng = np.random.default_rng(1)
    clock = FakeClock()
    rl = RateLimiter(limit, clock=clock, sleep=clock.sleep)
    clients = [(f"c{k}", lambda: batch, lambda: 0.0) for k in range(n_clients)]
    arr = simulate(lambda _: rl, clients, clock=clock, rng=rng, duration=60.0,
                   jitter=DEFAULT_JITTER_S)
    times = sorted(t for ts in arr.values() for t in ts)
    assert max_in_window(times, 1.0) <= limit
    rate = len(times) / (times[-1] - times[0])
    # the documented ceiling: n * floor(L / n) per window + jitter margin
    best = batch * (limit // batch) / (1.0 + DEFAULT_JITTER_S)
    assert rate >= 0.97 * best


def test_sends_are_paced_not_released_in_bursts():
    """Four hungry clients with batch 1 at 20/s: grants come one interval apart."""
    clock = FakeClock()
    rl = RateLimiter(20, clock=clock, sleep=clock.sleep)
    grants = []
    for _ in range(60):
        grants.append(rl.acquire(1))
    gaps = np.diff(grants)
    assert gaps.min() >= rl.interval - rl.tau - 1e-9
    assert np.median(gaps) == pytest.approx(rl.interval)
    assert max_in_window(grants, 0.25) <= 6                # never a burst of a quarter second


def test_a_grant_of_a_whole_second_books_the_schedule():
    clock = FakeClock()
    rl = RateLimiter(10, clock=clock, sleep=clock.sleep)
    t0 = rl.acquire(10)
    t1 = rl.acquire(1)
    assert t1 - t0 > 1.0 + DEFAULT_JITTER_S               # the log: 10 in span, wait it out
    assert rl.try_acquire(1) == pytest.approx(rl.interval - rl.tau)   # then paced again


def test_validation():
    with pytest.raises(ValueError):
        RateLimiter(-1)
    with pytest.raises(ValueError):
        RateLimiter(0.5)
    with pytest.raises(ValueError):
        RateLimiter(5, jitter_s=-0.1)
    rl = RateLimiter(5)
    assert rl.max_chunk() == 5 and rl.limit == 5 and not rl.unlimited
    with pytest.raises(ValueError):
        rl.acquire(6)
    with pytest.raises(ValueError):
        rl.acquire(0)
    free = RateLimiter(0)
    assert free.unlimited and free.max_chunk() >= 1 << 20
    assert free.try_acquire(10_000) == 0.0


# -- composite: target and tenant ----------------------------------------------------------
def test_composite_takes_nothing_when_one_part_refuses():
    clock = FakeClock()
    target = RateLimiter(20, clock=clock, sleep=clock.sleep)
    tenant = RateLimiter(2, clock=clock, sleep=clock.sleep)
    both = CompositeLimiter(target, tenant)
    assert both.limit == 2 and both.max_chunk() == 2 and not both.unlimited
    assert both.try_acquire(2) == 0.0
    before = (target._in_span, target._tat)
    wait = both.try_acquire(1)
    assert wait > target.interval
    assert (target._in_span, target._tat) == before      # nothing taken from the target
    clock.t += 2 * target.interval
    assert target.try_acquire(1) == 0.0                    # which others may still use
    assert both.acquire(1) == pytest.approx(clock.t) and clock.sleeps


def test_composite_of_unlimited_parts_is_unlimited():
    both = CompositeLimiter(RateLimiter(0), RateLimiter(0))
    assert both.unlimited and both.limit == 0
    assert CompositeLimiter(RateLimiter(0), RateLimiter(7)).limit == 7
    with pytest.raises(ValueError):
        CompositeLimiter()


@pytest.mark.parametrize("seed", range(6))
def test_tenant_limit_and_target_limit_hold_together(seed):
    """Tenant A (limit 8) and tenant B (no limit) share a target limited to 20/s."""
    rng = np.random.default_rng(100 + seed)
    clock = FakeClock()
    target = RateLimiter(20, clock=clock, sleep=clock.sleep)
    tenants = TenantLimits({"a": 8}, clock=clock, sleep=clock.sleep)
    limiters = {name: CompositeLimiter(target, tenants.limiter_for(name)) for name in "ab"}
    batch = int(rng.choice([1, 5]))
    clients = [(name, lambda: batch, lambda: float(rng.exponential(0.01)))
               for name in "aabb"]
    arr = simulate(limiters.get, clients, clock=clock, rng=rng, duration=30.0,
                   jitter=DEFAULT_JITTER_S, adversarial=bool(seed % 2))
    assert max_in_window(arr["a"], 1.0) <= 8
    everything = arr["a"] + arr["b"]
    assert max_in_window(everything, 1.0) <= 20
    # B is not starved by A's limit: together they still use most of the target
    assert len(everything) / 30.0 >= 0.85 * 20 / (1 + DEFAULT_JITTER_S)
    # and A, though B saturates the target, still gets most of its own limit (its grants
    # snap to the target's pacing slots, hence not all of it)
    assert len(arr["a"]) / 30.0 >= 0.7 * batch * (8 // batch) / (1 + DEFAULT_JITTER_S)


def test_composites_in_opposite_orders_do_not_deadlock():
    a, b = RateLimiter(5000, jitter_s=0.0), RateLimiter(5000, jitter_s=0.0)
    done = []

    def worker(order):
        for _ in range(200):
            acquire_all(order, 1)
        done.append(1)

    ts = [threading.Thread(target=worker, args=(o,), daemon=True)
          for o in ([a, b], [b, a], [CompositeLimiter(b, a)], [a, CompositeLimiter(a, b)])]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=10)
    assert len(done) == 4
    assert a._in_span <= 5000


def test_real_threads_and_clock_respect_the_limit():
    """The blocking path with real threads: grant times within the window + margin."""
    rl = RateLimiter(50, jitter_s=0.02)
    grants: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + 1.5

    def worker(batch):
        while time.monotonic() < stop:
            t = rl.acquire(batch)
            with lock:
                grants.extend([t] * batch)

    ts = [threading.Thread(target=worker, args=(b,)) for b in (1, 5, 5, 3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=10)
    assert max_in_window(grants, 1.0 + 0.02) <= 50
    assert len(grants) >= 50


# -- tenant registry -----------------------------------------------------------------------
def test_tenant_limits_registry():
    tl = TenantLimits.parse(["alice=20", " bob = 5.5"])
    assert tl.rates == {"alice": 20.0, "bob": 5.5}
    a = tl.limiter_for("alice")
    assert a is tl.limiter_for("alice") and a.limit == 20
    assert tl.limiter_for("bob").limit == 5
    assert tl.limiter_for("carol").unlimited
    assert tl.limiter_for("carol") is tl.limiter_for("dave")    # unknown names grow nothing
    assert TenantLimits(default=3).limiter_for("anyone").limit == 3


@pytest.mark.parametrize("pairs", [["alice"], ["=3"], ["a=x"], ["a=-1"], ["a=0.5"],
                                   ["a=1", "a=2"]])
def test_tenant_rates_rejected(pairs):
    with pytest.raises(ValueError):
        parse_tenant_rates(pairs)


# -- fair turns between tenants ------------------------------------------------------------
def test_start_tags_share_in_images_and_give_no_credit_for_idle_time():
    """Start-time fair queueing: a tenant's tag moves by the images it asked for, and a
    tenant arriving late starts at the virtual time, not at the 0 it would have had."""
    q = FairQueue()
    with q._cond:
        a1 = q._join("alice", 5)
        b1, b2 = q._join("bob", 1), q._join("bob", 1)
        assert (a1.start, b1.start, b2.start) == (0.0, 0.0, 1.0)
        a2 = q._join("alice", 5)
        assert a2.start == 5.0          # alice's next turn comes after bob's next five images
        for t in (a1, b1, b2):
            q._leave(t, granted=True)
        assert q._vtime == 1.0          # the start tag of the last grant
        late = q._join("carol", 1)
        assert late.start == 1.0        # no credit for the time carol sent nothing
        assert q._head(0.0) is late and q._head(0.0).start < a2.start
        q._leave(late, granted=True)
        q._leave(a2, granted=True)
        # nobody waits: the busy period is over, the tags are forgotten
        assert q._vtime == 10.0 and not q._finish


def test_a_call_set_aside_by_its_own_limit_is_not_the_head_until_then():
    q = FairQueue()
    with q._cond:
        b = q._join("bob", 1)
        a = q._join("alice", 1)
        b.not_before = 10.0
        assert q._head(5.0) is a
        assert q._head(10.0) is b       # back, and still ahead (same tag, earlier call)


def test_a_call_given_up_while_waiting_leaves_no_ticket_and_no_debt():
    clock = FakeClock()

    def sleep(s: float) -> None:
        raise KeyboardInterrupt     # e.g. the caller's deadline, or a shutdown

    rl = RateLimiter(1, jitter_s=0.0, clock=clock, sleep=sleep)
    rl.acquire(1, "alice")
    with pytest.raises(KeyboardInterrupt):
        rl.acquire(1, "alice")      # must wait a second: gives up instead
    assert len(rl.queue) == 0
    assert rl.queue._vtime == 1.0 and not rl.queue._finish  # only the granted image counted
    assert rl._in_span == 1


def test_many_tenants_do_not_grow_the_queue_state():
    rl = RateLimiter(1_000_000)
    for k in range(2000):
        rl.acquire(1, f"tenant-{k}")
    assert len(rl.queue) == 0
    assert len(rl.queue._finish) <= 20


def test_fair_turns_with_real_threads_split_the_target_in_images():
    """Alice (one thread, batches of 5) against bob (four threads, single images) at 50/s:
    roughly half the images each while both wait, and the limit holds."""
    rl = RateLimiter(50, jitter_s=0.02)
    got: dict[str, list[float]] = {"alice": [], "bob": []}
    lock = threading.Lock()
    alice_done = threading.Event()

    def worker(tenant: str, batch: int, calls: int) -> None:
        c = 0
        while (c < calls) if calls else not alice_done.is_set():
            t = rl.acquire(batch, tenant)
            with lock:
                got[tenant] += [t] * batch
            c += 1
        if tenant == "alice":
            alice_done.set()

    ts = [threading.Thread(target=worker, args=("bob", 1, 0)) for _ in range(4)]
    ts.append(threading.Thread(target=worker, args=("alice", 5, 12)))
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=30)
    assert len(got["alice"]) == 60
    assert max_in_window(got["alice"] + got["bob"], 1.0 + 0.02) <= 50
    end = max(got["alice"])
    bob = sum(1 for t in got["bob"] if t <= end)
    assert 60 / (60 + bob) >= 0.4, (60, bob)    # an equal share is 0.5


def test_a_waiting_call_stops_when_its_caller_is_gone():
    """``should_stop`` is looked at while waiting (every STOP_CHECK_S): the call raises the
    check's error before its slot comes, leaves the queue, and takes nothing."""
    from fortis.services.common.errors import DeadlineExceeded
    from fortis.services.common.stopping import caller_stop

    rl = RateLimiter(1, jitter_s=0.0)
    rl.acquire(1, "alice")
    start = time.monotonic()
    stop = caller_stop(lambda: True, lambda: 0.2 - (time.monotonic() - start))
    with pytest.raises(DeadlineExceeded):
        rl.acquire(1, "alice", stop)        # the slot is ~1 s away
    assert time.monotonic() - start < 0.9   # gone before the slot, not at it
    assert len(rl.queue) == 0 and rl._in_span == 1


class IdleProbe:
    """An ``idle`` hook that records whether each sleep happens inside it."""

    def __init__(self, clock: FakeClock) -> None:
        self.inside = False
        self.entered = 0
        self.sleeps: list[bool] = []
        self._clock = clock

    @contextlib.contextmanager
    def __call__(self):
        self.entered += 1
        self.inside = True
        try:
            yield
        finally:
            self.inside = False

    def sleep(self, s: float) -> None:
        self.sleeps.append(self.inside)
        self._clock.sleep(s)


def test_the_waits_run_inside_idle_and_the_grant_does_not():
    """The proxy gives its CPU slot back (``idle``) while a call waits for the limits and
    takes it back before the try that grants: every sleep is inside ``idle``, a grant that
    needs no wait never enters it, and the grant comes after ``idle`` was left."""
    clock = FakeClock()
    probe = IdleProbe(clock)
    rl = RateLimiter(4, jitter_s=0.0, tolerance_s=0.0, clock=clock, sleep=probe.sleep)
    granted_inside: list[bool] = []
    for _ in range(3):
        rl.acquire(2, "alice", idle=probe)
        granted_inside.append(probe.inside)
    assert probe.entered >= 1 and probe.sleeps and all(probe.sleeps)
    assert granted_inside == [False, False, False]
    first = RateLimiter(4, jitter_s=0.0, clock=clock, sleep=probe.sleep)
    before = probe.entered
    first.acquire(1, "bob", idle=probe)          # free at once: no wait, no idle
    assert probe.entered == before


def test_a_wait_inside_idle_still_stops_with_its_caller():
    from fortis.services.common.errors import DeadlineExceeded
    from fortis.services.common.stopping import caller_stop

    rl = RateLimiter(1, jitter_s=0.0)
    rl.acquire(1, "alice")
    start = time.monotonic()
    stop = caller_stop(lambda: True, lambda: 0.2 - (time.monotonic() - start))
    left = []

    @contextlib.contextmanager
    def idle():
        yield
        left.append(True)               # reached only when the wait ended normally

    with pytest.raises(DeadlineExceeded):
        rl.acquire(1, "alice", stop, idle=idle)
    assert time.monotonic() - start < 0.9
    assert len(rl.queue) == 0 and rl._in_span == 1


def test_fair_turns_hold_with_waits_inside_idle():
    """Waiting for another tenant's turn inside ``idle`` (real threads): the shares and the
    limit are what they are without it."""
    rl = RateLimiter(50, jitter_s=0.02)
    got: dict[str, list[float]] = {"alice": [], "bob": []}
    lock = threading.Lock()
    alice_done = threading.Event()
    idles = [0]

    @contextlib.contextmanager
    def idle():
        with lock:
            idles[0] += 1
        yield

    def worker(tenant: str, batch: int, calls: int) -> None:
        c = 0
        while (c < calls) if calls else not alice_done.is_set():
            t = rl.acquire(batch, tenant, idle=idle)
            with lock:
                got[tenant] += [t] * batch
            c += 1
        if tenant == "alice":
            alice_done.set()

    ts = [threading.Thread(target=worker, args=("bob", 1, 0)) for _ in range(4)]
    ts.append(threading.Thread(target=worker, args=("alice", 5, 12)))
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=30)
    assert len(got["alice"]) == 60 and idles[0] > 0
    assert max_in_window(got["alice"] + got["bob"], 1.0 + 0.02) <= 50
    end = max(got["alice"])
    bob = sum(1 for t in got["bob"] if t <= end)
    assert 60 / (60 + bob) >= 0.4, (60, bob)
