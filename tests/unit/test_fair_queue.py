"""The fair scheduler's pick order and the quota bookkeeping, as pure code (bounded
work: per-tenant quotas on concurrent and queued evaluations, ... queries per day; fair
scheduling so one tenant's queue cannot starve another's).

``services/evaluation/scheduling.py``: least recently started tenant first, oldest first
within a tenant, the tenant's running quota and the workers respected, cancelled jobs gone.
``infra/serving/quotas.py``: the ``--tenant-quota`` form and its defaults.
``services/proxy/quotas.py``: queries per UTC day, held / taken / released, retries,
midnight, start-up from ledger counts. The loopback versions of these are in
``tests/integration/test_tenant_quotas.py``.
"""

from __future__ import annotations

import pytest
from fortis.infra.serving.quotas import QuotaSettings, TenantQuota, parse_tenant_quotas
from fortis.services.common.errors import QuotaExceeded
from fortis.services.evaluation.scheduling import FairScheduler
from fortis.services.proxy.quotas import DAY_S, DailyQueryQuotas


def _start_all(s: FairScheduler[None]) -> list[str]:
    """Run the scheduler to empty, one job at a time ending before the next pick; the
    start order as "tenant/job"."""
    order = []
    while (p := s.next()) is not None:
        order.append(f"{p.tenant}/{p.job_id}")
        s.done(p.tenant, p.job_id)
    return order


def test_a_late_tenant_starts_at_the_next_free_worker_not_after_the_earlier_queue() -> None:
    s: FairScheduler[None] = FairScheduler(1)
    for k in range(50):
        s.push("a", f"a{k}", None)
    first = s.next()
    assert first is not None and first.job_id == "a0"
    s.push("b", "b0", None)                     # B submits after A queued 50
    assert s.next() is None                     # the one worker is busy
    s.done("a", "a0")
    nxt = s.next()
    assert nxt is not None and (nxt.tenant, nxt.job_id) == ("b", "b0")
    s.done("b", "b0")
    assert _start_all(s) == [f"a/a{k}" for k in range(1, 50)]   # A's own order kept


def test_tenants_take_turns_and_oldest_first_within_each() -> None:
    s: FairScheduler[None] = FairScheduler(1)
    for job in ("a1", "a2", "a3"):
        s.push("a", job, None)
    for job in ("b1", "b2"):
        s.push("b", job, None)
    s.push("c", "c1", None)
    # Never-started tenants go by their oldest job's age; then least recently started first.
    assert _start_all(s) == ["a/a1", "b/b1", "c/c1", "a/a2", "b/b2", "a/a3"]


def test_a_tenant_at_its_running_quota_waits_while_others_use_the_free_workers() -> None:
    limits = {"a": 1}
    s: FairScheduler[None] = FairScheduler(3, lambda t: limits.get(t, 0))
    for job in ("a1", "a2", "a3"):
        s.push("a", job, None)
    s.push("b", "b1", None)
    s.push("b", "b2", None)
    started = [(p.tenant, p.job_id) for p in s.drain()]
    assert started == [("a", "a1"), ("b", "b1"), ("b", "b2")]   # a2 waits: quota, not workers
    assert s.running("a") == 1 and s.queued("a") == 2 and s.total_running == 3
    s.done("b", "b1")
    assert s.next() is None                     # a worker is free, but A is at its quota
    s.done("a", "a1")
    p = s.next()
    assert p is not None and p.job_id == "a2"


def test_capacity_bounds_the_running_jobs() -> None:
    s: FairScheduler[int] = FairScheduler(2)
    for k in range(5):
        s.push(f"t{k}", "x", k)
    picks = s.drain()
    assert [p.payload for p in picks] == [0, 1]
    assert s.total_running == 2 and s.total_queued == 3


def test_a_cancelled_waiting_job_leaves_the_queue_and_a_running_one_is_unaffected() -> None:
    s: FairScheduler[None] = FairScheduler(1)
    for job in ("a1", "a2", "a3"):
        s.push("a", job, None)
    assert s.next() is not None                 # a1 runs
    assert s.remove("a", "a2") is True
    assert s.remove("a", "a2") is False         # not waiting any more
    assert s.remove("a", "a1") is False         # running: only its worker ends it
    assert s.queued("a") == 1
    s.done("a", "a1")
    assert _start_all(s) == ["a/a3"]


def test_one_tenants_job_id_is_queued_once_and_ids_are_per_tenant() -> None:
    s: FairScheduler[None] = FairScheduler(1)
    s.push("a", "x", None)
    with pytest.raises(ValueError):
        s.push("a", "x", None)
    s.push("b", "x", None)                      # another tenant's namespace
    assert s.queued("a") == 1 and s.queued("b") == 1


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        FairScheduler(0)


# -- quota settings ---------------------------------------------------------------------
def test_tenant_quota_overrides_the_defaults_field_by_field() -> None:
    tenants = parse_tenant_quotas(["alice=running:2,queued:20,queries_per_day:100000",
                                   "bob=queued:0"])
    assert tenants == {"alice": TenantQuota(2, 20, 100000), "bob": TenantQuota(queued=0)}
    q = QuotaSettings(max_running=1, max_queued=5, queries_per_day=7, tenants=tenants)
    assert (q.running_limit("alice"), q.queued_limit("alice"),
            q.queries_per_day_limit("alice")) == (2, 20, 100000)
    assert (q.running_limit("bob"), q.queued_limit("bob"),
            q.queries_per_day_limit("bob")) == (1, 0, 7)      # 0: bob's queue unlimited
    assert (q.running_limit("carol"), q.queued_limit("carol")) == (1, 5)


@pytest.mark.parametrize("spec", ["alice", "=running:1", "alice=", "alice=speed:3",
                                  "alice=running:x", "alice=running:-1", "alice=running:1,running:2",
                                  "alice=running:10000000000000"])
def test_malformed_tenant_quotas_are_refused_with_a_bounded_message(spec: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_tenant_quotas([spec])
    assert len(str(info.value)) < 300


def test_a_tenant_named_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        parse_tenant_quotas(["a=running:1", "a=queued:2"])


def test_a_long_spec_is_not_echoed() -> None:
    with pytest.raises(ValueError) as info:
        parse_tenant_quotas(["a" * 100_000])
    assert len(str(info.value)) < 300


# -- queries per day --------------------------------------------------------------------
class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_call_that_would_cross_the_daily_limit_is_refused_whole() -> None:
    q = DailyQueryQuotas(lambda t: 10 if t == "a" else 0, clock=_Clock(5 * DAY_S + 100))
    hold = q.admit("a", 6)
    hold.take(6)
    hold.release()
    with pytest.raises(QuotaExceeded) as info:
        q.admit("a", 5)                          # 6 + 5 > 10: nothing held
    v = info.value.violations[0]
    assert v.subject == "tenant:a" and "6 of 10" in v.description
    assert q.usage("a") == (6, 10)
    q.admit("a", 4).take(4)                      # exactly to the limit
    assert q.usage("a") == (10, 10)
    q.admit("b", 1000).take(1000)                # another tenant, no limit
    assert q.usage("b") == (1000, 0)


def test_held_room_counts_for_concurrent_calls_and_unsent_images_are_released() -> None:
    q = DailyQueryQuotas(lambda t: 10, clock=_Clock(0.0))
    first = q.admit("a", 8)                     # in progress: 8 held
    with pytest.raises(QuotaExceeded):
        q.admit("a", 3)
    first.take(2)                               # one chunk of 2 sent, then the call failed
    first.release()
    assert q.usage("a") == (2, 10)
    q.admit("a", 8).take(8)


def test_retries_count_and_a_retry_that_does_not_fit_is_not_charged() -> None:
    q = DailyQueryQuotas(lambda t: 10, clock=_Clock(0.0))
    q.admit("a", 4).take(4)
    assert q.try_charge("a", 4) is True          # one retry of the 4
    assert q.try_charge("a", 4) is False         # 12 > 10
    assert q.usage("a") == (8, 10)


def test_the_count_starts_again_at_midnight_utc_and_loads_from_ledger_counts() -> None:
    clock = _Clock(3 * DAY_S + DAY_S - 1.0)      # 23:59:59 UTC
    q = DailyQueryQuotas(lambda t: 10, clock=clock)
    q.load({"a": 9, "b": 0})
    with pytest.raises(QuotaExceeded):
        q.admit("a", 2)
    clock.t += 2.0                               # 00:00:01 UTC the next day
    q.admit("a", 10).take(10)
    assert q.usage("a") == (10, 10)


def test_load_from_counts_the_real_ledgers_rows_since_midnight_utc(tmp_path) -> None:
    """The start-up count, from a real SQLite ledger: rows sent since 00:00 UTC per tenant,
    failed and interrupted attempts included, yesterday's and "not sent" rows not."""
    from fortis.services.proxy.ledger import INTERRUPTED, Ledger, QueryRow
    today = 12 * DAY_S

    def row(tenant: str, sent_at: float, status: str = "OK", error: str = "") -> QueryRow:
        return QueryRow(tenant=tenant, session_id="s", target="t", origin="o", image_id="i",
                        input_sha256="0" * 64, output_summary="", latency_ms=1.0,
                        status=status, error=error, sent_at=sent_at, call_id="c", attempts=1)

    ledger = Ledger(tmp_path / "ledger.sqlite", synchronous="NORMAL")
    ledger.record([row("a", today - 1.0),                              # yesterday 23:59:59
                   row("a", today + 1.0), row("a", today + 2.0, "UNAVAILABLE", "down"),
                   row("a", today + 3.0, INTERRUPTED, "interrupted"),
                   row("a", today + 4.0, "DEADLINE_EXCEEDED", "not sent: deadline"),
                   row("b", today + 5.0)])
    q = DailyQueryQuotas(lambda t: 10, clock=_Clock(today + 3600.0))
    q.load_from(ledger)
    ledger.close()
    assert q.usage("a") == (3, 10) and q.usage("b") == (1, 10)


def test_a_retry_not_sent_after_all_is_refunded() -> None:
    q = DailyQueryQuotas(lambda t: 10, clock=_Clock(0.0))
    q.admit("a", 4).take(4)
    assert q.try_charge("a", 4)
    q.refund("a", 4)                             # the rate limiter gave up: not sent
    assert q.usage("a") == (4, 10)
