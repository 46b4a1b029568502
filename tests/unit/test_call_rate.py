"""Calls started per second per tenant (infra/serving/quotas.py ``CallRate``): a token bucket
of one second's burst; a call beyond it waits its turn, or is refused when its turn is further
away than the most a call waits. The clock is the test's."""

from __future__ import annotations

import pytest
from fortis.infra.serving.quotas import (
    CALL_RATE_MAX_WAIT_S,
    CallRate,
    QuotaSettings,
    TenantQuota,
    parse_tenant_quotas,
)


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_one_second_then_turns_at_the_rate() -> None:
    clock = Clock()
    rate = CallRate(lambda t: 10, clock=clock)
    assert [rate.turn("mallory") for _ in range(10)] == [0.0] * 10
    waits = [rate.turn("mallory") for _ in range(5)]       # the bucket is empty: in turns
    assert waits == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    clock.now += 0.5                                        # five tokens came back
    assert rate.turn("mallory") == pytest.approx(0.1)


def test_a_turn_further_than_the_longest_wait_is_refused_and_takes_nothing() -> None:
    clock = Clock()
    rate = CallRate(lambda t: 2, clock=clock)
    waits = [rate.turn("mallory") for _ in range(20)]
    allowed = 2 + int(2 * CALL_RATE_MAX_WAIT_S)             # the burst, then 2 s of turns
    assert all(w is not None for w in waits[:allowed])
    assert waits[allowed:] == [None] * (20 - allowed)
    clock.now += 0.5                                        # one token back: the refused
    assert rate.turn("mallory") is not None                 # calls took none of them


def test_tenants_have_their_own_buckets_and_zero_is_no_limit() -> None:
    limits = {"mallory": 1, "alice": 0}
    rate = CallRate(lambda t: limits.get(t, 5), clock=Clock())
    for _ in range(3):
        rate.turn("mallory")
    assert rate.turn("bob") == 0.0                          # mallory's flood is not bob's
    assert [rate.turn("alice") for _ in range(1000)] == [0.0] * 1000


def test_full_buckets_of_many_tenants_are_forgotten() -> None:
    clock = Clock()
    rate = CallRate(lambda t: 10, clock=clock)
    for i in range(3000):
        rate.turn(f"t{i}")
    clock.now += 5
    rate.turn("alice")
    assert len(rate._tokens) <= 1025


def test_the_quota_is_per_tenant_over_the_server_default() -> None:
    tenants = parse_tenant_quotas(["ci=calls_per_second:500,calls:64"])
    assert tenants["ci"] == TenantQuota(calls=64, calls_per_second=500)
    q = QuotaSettings(max_call_rate=50, tenants=tenants)
    assert (q.call_rate_limit("ci"), q.call_rate_limit("alice")) == (500, 50)


@pytest.mark.parametrize("spec", ["a=calls_per_second:-1", "a=calls_per_second:x",
                                  "a=calls_per_second:1e3"])
def test_a_malformed_call_rate_quota_is_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="calls_per_second"):
        parse_tenant_quotas([spec])


def test_fortis_serve_defaults_to_the_documented_rate() -> None:
    from fortis.infra.serving.quotas import DEFAULT_CALL_RATE_PER_TENANT
    from fortis.server.cli.local import _quota_settings
    from fortis.server.cli.main import build_parser

    parser = build_parser()
    ns = parser.parse_args(["serve"])
    assert _quota_settings(ns).max_call_rate == DEFAULT_CALL_RATE_PER_TENANT
    serve = next(a for a in parser._subparsers._group_actions[0].choices.values()
                 if "--max-call-rate-per-tenant" in a.format_help())
    assert f"default {DEFAULT_CALL_RATE_PER_TENANT};" in " ".join(serve.format_help().split())
    ns = parser.parse_args(["serve", "--max-call-rate-per-tenant", "0"])
    assert _quota_settings(ns).max_call_rate == 0
