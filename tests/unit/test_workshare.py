"""The tenant-fair share of CPU-heavy work (infra/serving/workshare.py): who runs, who waits
and in which order. Pieces are threads held open by events, the clock is the test's: nothing
here depends on how fast the machine is."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from fortis.infra.serving.workshare import WorkShare, default_slots
from fortis.services.common.errors import Cancelled


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Piece:
    """One piece of work of ``tenant`` in its own thread, held in its slot until ``finish``."""

    def __init__(self, share: WorkShare, tenant: str, order: list[str] | None = None,
                 should_stop: Callable[[], bool] | None = None, name: str = "") -> None:
        self.tenant = tenant
        self.name = name or tenant
        self.started = threading.Event()
        self.release = threading.Event()
        self.error: BaseException | None = None
        self._order = order

        def run() -> None:
            try:
                with share.slot(tenant, should_stop):
                    if self._order is not None:
                        self._order.append(self.name)
                    self.started.set()
                    self.release.wait(30)
            except BaseException as exc:  # noqa: BLE001 - looked at by the test
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def finish(self) -> None:
        self.release.set()
        self.thread.join(10)
        assert not self.thread.is_alive()


def until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def waiting(share: WorkShare, tenant: str) -> int:
    return int(share.snapshot().get(tenant, {}).get("waiting", 0))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def pieces() -> Iterator[list[Piece]]:
    made: list[Piece] = []
    yield made
    for p in made:
        p.release.set()
    for p in made:
        p.thread.join(10)


def test_a_tenant_alone_uses_every_slot(clock: Clock, pieces: list[Piece]) -> None:
    share = WorkShare(3, clock=clock)
    pieces += [Piece(share, "alice") for _ in range(3)]
    for p in pieces:
        assert p.started.wait(5)
    assert share.snapshot()["alice"]["running"] == 3
    pieces.append(Piece(share, "alice"))      # the fourth waits for a free slot
    until(lambda: waiting(share, "alice") == 1, "the fourth piece waits")
    pieces[0].finish()
    assert pieces[3].started.wait(5)


def test_beside_another_tenant_each_keeps_its_share(clock: Clock, pieces: list[Piece]) -> None:
    """slots 2, two active tenants: each holds at most one, although mallory has many queued
    and a slot of alice's stands free between two of her pieces."""
    share = WorkShare(2, clock=clock)
    mallory = [Piece(share, "mallory", name=f"m{i}") for i in range(4)]
    pieces += mallory
    until(lambda: share.snapshot()["mallory"]["running"] == 2, "mallory alone takes both")
    first = Piece(share, "alice")
    pieces.append(first)
    # both slots are mallory's: alice waits for the first to end, then mallory keeps one only
    until(lambda: waiting(share, "alice") == 1, "alice waits")
    running = [p for p in mallory if p.started.is_set()]
    running[0].finish()
    assert first.started.wait(5)
    first.finish()                            # alice's piece ends; she is active a while yet
    clock.now += 0.5
    running[1].finish()                       # a slot is free, mallory holds one more...
    time.sleep(0.2)
    snap = share.snapshot()
    assert snap["mallory"]["running"] == 1, snap   # ...but not alice's share
    assert snap["mallory"]["waiting"] == 1, snap
    second = Piece(share, "alice")            # alice's next small call starts at once
    pieces.append(second)
    assert second.started.wait(5)
    assert waiting(share, "alice") == 0
    second.finish()
    clock.now += 5                            # alice has gone: mallory may take both again
    until(lambda: share.snapshot()["mallory"]["running"] == 2, "mallory gets the idle share")


def test_a_freed_slot_goes_to_the_tenant_that_used_least(clock: Clock,
                                                         pieces: list[Piece]) -> None:
    """One slot; mallory's first piece runs and five more wait; alice's one piece, queued
    after all of them, runs next, not sixth. (The order alone: no rate cap here.)"""
    share = WorkShare(1, clock=clock, rate_tau_s=None)
    order: list[str] = []
    first = Piece(share, "mallory", order, name="m0")
    pieces.append(first)
    assert first.started.wait(5)
    queued = []
    for i in range(1, 6):
        queued.append(Piece(share, "mallory", order, name=f"m{i}"))
        until(lambda i=i: waiting(share, "mallory") == i, "mallory's pieces queue")
    pieces += queued
    alice = Piece(share, "alice", order)
    pieces.append(alice)
    until(lambda: waiting(share, "alice") == 1, "alice queues last")
    clock.now += 2.0                          # mallory's first piece used 2 s of the slot
    first.finish()
    assert alice.started.wait(5)
    assert order == ["m0", "alice"]
    clock.now += 0.01
    alice.finish()
    for p in queued:                          # then mallory's, in the order they came
        until(lambda p=p: p.started.is_set(), "mallory's next piece")
        clock.now += 1.0
        p.finish()
    assert order == ["m0", "alice", "m1", "m2", "m3", "m4", "m5"]


def test_a_newcomer_starts_at_the_least_usage_not_at_zero(clock: Clock,
                                                          pieces: list[Piece]) -> None:
    """bob, who used nothing so far, does not take every turn from alice until he has used
    as much as she did since she started: both are served in turn. (The order alone.)"""
    share = WorkShare(1, clock=clock, rate_tau_s=None)
    order: list[str] = []
    for _ in range(3):                        # alice has used 30 s of the slot
        p = Piece(share, "alice", order)
        assert p.started.wait(5)
        clock.now += 10
        p.finish()
    order.clear()
    hold = Piece(share, "carol", order, name="carol")
    assert hold.started.wait(5)
    a = [Piece(share, "alice", order, name=f"a{i}") for i in range(2)]
    until(lambda: waiting(share, "alice") == 2, "alice queues")
    b = [Piece(share, "bob", order, name=f"b{i}") for i in range(2)]
    until(lambda: waiting(share, "bob") == 2, "bob queues")
    pieces += [hold, *a, *b]
    clock.now += 1
    hold.finish()
    served = []
    for _ in range(4):
        until(lambda: len(order) > len(served) + 1, "the next piece")
        name = order[-1]
        served.append(name)
        clock.now += 1
        next(p for p in pieces if p.name == name).finish()
    assert [n[0] for n in served] in (["a", "b", "a", "b"], ["b", "a", "b", "a"]), served


def test_waiting_ends_with_the_callers_deadline(clock: Clock, pieces: list[Piece]) -> None:
    share = WorkShare(1, clock=clock)
    holder = Piece(share, "mallory")
    pieces.append(holder)
    assert holder.started.wait(5)
    gone = threading.Event()

    def stop() -> bool:
        if gone.is_set():
            raise Cancelled("the call was cancelled")
        return False

    late = Piece(share, "alice", should_stop=stop)
    pieces.append(late)
    until(lambda: waiting(share, "alice") == 1, "alice waits")
    gone.set()
    late.thread.join(5)
    assert isinstance(late.error, Cancelled)
    assert waiting(share, "alice") == 0      # nothing left queued or held for her
    holder.finish()
    after = Piece(share, "bob")
    pieces.append(after)
    assert after.started.wait(5)              # the slot was not lost


def test_nested_work_in_one_thread_is_one_piece(clock: Clock) -> None:
    share = WorkShare(1, clock=clock)
    with share.slot("alice"), share.slot("alice"):   # would wait for itself if counted twice
        assert share.snapshot()["alice"]["running"] == 1
    assert share.snapshot()["alice"]["running"] == 0


def test_zero_slots_is_no_sharing(clock: Clock, pieces: list[Piece]) -> None:
    share = WorkShare(0, clock=clock)
    pieces += [Piece(share, "mallory") for _ in range(8)]
    for p in pieces:
        assert p.started.wait(5)
    assert share.snapshot() == {}


def test_idle_tenants_are_forgotten(clock: Clock) -> None:
    share = WorkShare(2, clock=clock)
    for i in range(50):
        with share.slot(f"tenant-{i}"):
            pass
    clock.now += 5
    with share.slot("alice"):
        assert set(share.snapshot()) == {"alice"}


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_slots_must_be_a_count(bad: object) -> None:
    with pytest.raises(ValueError, match="slots"):
        WorkShare(bad)  # type: ignore[arg-type]


def test_default_slots_are_the_cores_this_process_may_use(tmp_path) -> None:
    import os
    cores = len(os.sched_getaffinity(0))
    assert default_slots(tmp_path) == cores           # no cgroup quota readable
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert default_slots(tmp_path) == cores           # a cgroup without a quota
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    assert default_slots(tmp_path) == 1               # half a CPU: one slot
    (tmp_path / "cpu.max").write_text(f"{cores * 300000} 100000\n")
    assert default_slots(tmp_path) == cores           # never more than the affinity
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("150000\n")   # cgroup v1
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert default_slots(tmp_path) == min(cores, 2)


def test_beside_others_a_tenant_is_held_to_its_fair_rate(clock: Clock,
                                                        pieces: list[Piece]) -> None:
    """Two slots, three active tenants: mallory, who kept one slot busy for the last seconds,
    waits although a slot is free and nobody else waits -- her fair rate is 2/3 of a slot --
    and gets it once her recent use has decayed below that."""
    share = WorkShare(2, clock=clock)
    for name in ("alice", "bob"):             # two tenants who come and go
        with share.slot(name):
            pass
    busy = Piece(share, "mallory")
    pieces.append(busy)
    assert busy.started.wait(5)
    clock.now += 0.9                          # alice and bob still active (1 s window)
    busy.finish()                             # 0.9 s of 2 s: a rate of 0.45 -- under 2/3
    again = Piece(share, "mallory")
    pieces.append(again)
    assert again.started.wait(5)
    clock.now += 0.9
    for name in ("alice", "bob"):             # come again: still active
        with share.slot(name):
            pass
    again.finish()                            # about 1.6 slot-s in 2 s: 0.8 > 2/3
    third = Piece(share, "mallory")
    pieces.append(third)
    until(lambda: waiting(share, "mallory") == 1, "mallory is over her fair rate")
    time.sleep(0.2)
    assert not third.started.is_set()
    clock.now += 0.5                          # her use decays (and alice and bob, still active)
    with share.slot("alice"):
        pass
    assert third.started.wait(5)


def test_run_does_the_work_on_a_lower_priority_thread_with_the_callers_context() -> None:
    import contextvars
    import os

    from fortis.infra.serving.workshare import WORK_NICE

    who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="")
    share = WorkShare(2)
    try:
        who.set("alice")
        mine = threading.get_native_id()

        def piece() -> tuple[str, int, int, int]:
            tid = threading.get_native_id()
            inner = share.run("alice", threading.get_native_id)   # nested: where it is
            return who.get(), tid, os.getpriority(os.PRIO_PROCESS, tid), inner

        name, tid, nice, inner = share.run("alice", piece)
        assert name == "alice"                    # the caller's context went with it
        assert tid != mine and inner == tid
        # below the priority of the thread that answers the call
        assert nice == min(19, os.getpriority(os.PRIO_PROCESS, mine) + WORK_NICE)
        with pytest.raises(ZeroDivisionError):    # what the work raises is raised here
            share.run("alice", lambda: 1 // 0)
        assert share.snapshot()["alice"]["running"] == 0
    finally:
        share.close()


def test_run_without_sharing_is_a_plain_call() -> None:
    share = WorkShare(0)
    assert share.run("alice", threading.get_native_id) == threading.get_native_id()


def test_a_slot_given_back_while_waiting_lets_others_compute_and_costs_nothing(
        clock: Clock, pieces: list[Piece]) -> None:
    """One slot. Alice's call takes it, then waits for something that is not CPU (a rate
    limiter's turn) inside ``yielded``: bob's piece runs meanwhile, the 5 s alice slept are
    not charged to her, and she takes the slot back -- after bob, in turn -- before going on."""
    share = WorkShare(1, clock=clock)
    asleep, wake, back, done = (threading.Event() for _ in range(4))
    errors: list[BaseException] = []

    def alice() -> None:
        try:
            with share.slot("alice"):
                clock.now += 1.0                  # one second of work in the slot
                with share.yielded():
                    asleep.set()
                    wake.wait(10)
                back.set()                        # the slot is hers again
                done.wait(10)
        except BaseException as exc:  # noqa: BLE001 - looked at by the test
            errors.append(exc)

    t = threading.Thread(target=alice, daemon=True)
    t.start()
    assert asleep.wait(5)
    assert share.snapshot()["alice"]["running"] == 0
    bob = Piece(share, "bob")
    pieces.append(bob)
    assert bob.started.wait(5)                    # the one slot, while alice sleeps
    clock.now += 5.0
    wake.set()
    until(lambda: waiting(share, "alice") == 1, "alice waits to take her slot back")
    assert not back.is_set()
    bob.finish()
    assert back.wait(5)
    snap = share.snapshot()
    assert snap["alice"]["running"] == 1 and snap["alice"]["used_s"] == pytest.approx(1.0)
    assert snap["bob"]["used_s"] == pytest.approx(1.0 + 5.0)   # a newcomer starts at alice's
    done.set()
    t.join(5)
    assert not errors and share.snapshot()["alice"]["running"] == 0


def test_a_call_stopped_while_taking_its_slot_back_holds_nothing(clock: Clock,
                                                                 pieces: list[Piece]) -> None:
    share = WorkShare(1, clock=clock)
    gone = threading.Event()

    def stop() -> bool:
        if gone.is_set():
            raise Cancelled("the call was cancelled")
        return False

    asleep = threading.Event()
    errors: list[BaseException] = []

    def alice() -> None:
        try:
            with share.slot("alice", stop), share.yielded():
                asleep.set()
                until(lambda: share.snapshot().get("bob", {}).get("running") == 1, "bob runs")
        except BaseException as exc:  # noqa: BLE001 - looked at by the test
            errors.append(exc)

    t = threading.Thread(target=alice, daemon=True)
    t.start()
    assert asleep.wait(5)
    bob = Piece(share, "bob")
    pieces.append(bob)
    assert bob.started.wait(5)
    until(lambda: waiting(share, "alice") == 1, "alice waits for her slot")
    gone.set()
    t.join(5)
    assert len(errors) == 1 and isinstance(errors[0], Cancelled)
    assert share.snapshot()["alice"] == {"running": 0, "waiting": 0, "used_s": 0.0}
    bob.finish()
    after = Piece(share, "carol")
    pieces.append(after)
    assert after.started.wait(5)                  # no slot was lost or counted twice


def test_run_inside_a_held_slot_computes_on_a_share_thread_in_that_slot() -> None:
    """The proxy holds the slot on the caller's thread across a rate limiter's grant and
    runs the target's inference with ``run``: on a lower-priority share thread, in the slot
    already held (with one slot, taking a second would wait for itself)."""
    share = WorkShare(1)
    try:
        with share.slot("alice"):
            tid = share.run("alice", threading.get_native_id)
            assert tid != threading.get_native_id()
            assert share.snapshot()["alice"]["running"] == 1
        assert share.snapshot()["alice"]["running"] == 0
    finally:
        share.close()


def test_yielded_outside_a_slot_of_this_thread_does_nothing() -> None:
    share = WorkShare(1)
    try:
        with share.yielded():                     # no slot
            pass

        def on_share_thread() -> int:
            with share.yielded():                 # the caller's thread holds the slot
                return int(share.snapshot()["alice"]["running"])

        assert share.run("alice", on_share_thread) == 1
    finally:
        share.close()
