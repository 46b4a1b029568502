"""The query estimate's arithmetic (``services/evaluation/estimate.py``): the bounds hold
whatever the adaptive parts decide, multi-target plans count every model, a finished run's
ledger sessions map onto the settings, durations and prices follow the limits and prices given.
The estimate against a real run's ledger is in tests/integration/test_estimate.py."""

from __future__ import annotations

import itertools
import math

import pytest
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.prices import split_price
from fortis.services.evaluation.benchmark import member_runs
from fortis.services.evaluation.estimate import (
    FIXED,
    UPPER_BOUND,
    estimate_plan,
    ledger_groups,
    report_section,
)
from fortis.services.evaluation.plan import load_plan
from fortis.services.evaluation.selection import select_epsilon

HEAD = """
name: p
seed: 1
dataset: {source: fashion-mnist, split: test, limit: 50}
"""
SINGLE = (
    HEAD
    + """target: {name: fmnist-cnn, task: classification}
corruptions: [{id: fog, severities: [1, 2]}]
degradation: [{id: black_lines, levels: [1, 5, 9]}]
attacks:
  - {id: fgsm, surrogate: fmnist-surrogate, params: {epsilon: 0.1}, limit: 30,
     select_budget: {images: 20, max_steps: 2}}
  - {id: square, params: {epsilon: 0.1, max_queries: 40}, limit: 10}
  - {id: hsja, params: {epsilon: 2.0, max_queries: 70}}
"""
)


def test_each_setting_counts_what_its_stage_sends(catalogue) -> None:
    plan = load_plan(SINGLE, catalogue)
    n = 47  # fewer images than the limit asks
    e = estimate_plan(plan, n, catalogue)
    by = {s.setting: s for s in e.settings}
    assert by["clean"].fixed == by["fog@2"].fixed == by["black_lines@9"].fixed == n
    assert by["fgsm"].fixed == by["fgsm"].upper_bound == 30 and by["fgsm"].kind == FIXED
    sel = by["fgsm.select"]  # 20 clean, then at most 2 + max_steps epsilons
    assert (sel.fixed, sel.upper_bound, sel.kind) == (20, 20 * (1 + 2 + 2), UPPER_BOUND)
    assert (by["square"].fixed, by["square"].upper_bound) == (0, 40 * 10)
    assert by["hsja"].upper_bound == 70 * n
    assert e.fixed == n + 2 * n + 3 * n + 30 + 20
    assert e.upper_bound == e.fixed - 20 + 100 + 400 + 70 * n
    assert e.expected is None  # the adaptive settings are unknown


@pytest.mark.parametrize("steps", [0, 1, 2, 3])
def test_budget_selection_never_measures_more_epsilons_than_the_bound(steps: int) -> None:
    """Every sequence of significant / not significant MR changes select_epsilon can meet:
    it measures at most 2 + max_steps epsilons, the bound the estimate uses."""
    from fortis.services.evaluation.plan_model import AttackTest

    at = AttackTest(
        id="fgsm",
        name="fgsm",
        params={"epsilon": 0.01},
        select_budget={"max_steps": steps, "factor": 2.0},
    )
    worst = 0

    def measure_with(pattern: tuple[int, ...], count: list[int]):  # type: ignore[no-untyped-def]
        calls = iter(pattern)

        def measure(eps: float) -> tuple[int, int]:
            count[0] += 1
            return next(calls, 0), 60

        return measure

    for pattern in itertools.product((0, 60), repeat=2 * steps + 3):
        count = [0]
        select_epsilon(at, measure_with(pattern, count), upper=1.0)
        worst = max(worst, count[0])
    assert worst <= 2 + steps
    assert worst == 2 + steps or steps == 0


def test_multi_target_plans_count_every_model(catalogue) -> None:
    plan = load_plan(
        HEAD
        + """targets:
  - {name: fmnist-cnn, surrogate: fmnist-cnn, endpoint: "a?price_per_1000=1"}
  - {name: fmnist-cnn-at, surrogate: fmnist-cnn-at, endpoint: "b?price_per_1000=3"}
attacks:
  - {id: fgsm, params: {epsilon: 0.1}}
  - {id: square, params: {epsilon: 0.1, max_queries: 10}, limit: 4}
corruptions: [{id: fog, severities: [1]}]
""",
        catalogue,
    )
    runs = sorted(
        member_runs(plan, catalogue, "e", ["fmnist-cnn", "fmnist-cnn-at"]), key=lambda r: r.index
    )
    e = estimate_plan(
        plan,
        50,
        catalogue,
        members=[(r.plan, r.prefix) for r in runs],
        prices={
            m.name: (m.price_per_1000, "plan") for m in plan.members if m.price_per_1000 is not None
        },
    )
    targets = {s.target for s in e.settings}
    assert targets == {"fmnist-cnn", "fmnist-cnn-at"}
    # per model: clean + fog + fgsm crafted on each of the two surrogates; square on itself
    assert e.fixed == 2 * (50 + 50 + 2 * 50) and e.upper_bound == e.fixed + 2 * 40
    assert e.price is not None and math.isnan(e.price.per_1000)
    assert e.price.fixed == pytest.approx(200 / 1000 * 1 + 200 / 1000 * 3)


def test_a_finished_runs_sessions_give_the_expected_counts(catalogue) -> None:
    plan = load_plan(SINGLE, catalogue)
    sessions = {
        "ev1/clean": 50,
        "ev1/corruptions": 100,
        "ev1/degradation": 150,
        "ev1/attack/fgsm": 30,
        "ev1/attack/fgsm.select": 45,
        "ev1/attack/square/00000/a1": 120,
        "ev1/attack/hsja/00000/a1": 900,
        "ev1/attack/hsja/00001/a1": 11,
        "ev2/clean": 999,
    }
    prior = ledger_groups(sessions, "ev1")
    assert prior["attack/hsja/"] == 911 and "ev2/clean" not in prior
    e = estimate_plan(plan, 50, catalogue, prior=prior, prior_from="ev1")
    assert e.expected == 50 + 100 + 150 + 30 + 45 + 120 + 911 and e.expected_from == "ev1"
    section = report_section(e, sessions, "ev1")
    rows = {r["setting"]: r for r in section["per_setting"]}
    assert rows["2 settings"]["actual"] == 100 and rows["hsja"]["actual"] == 911
    assert section["total_actual"] == sum(sessions.values())  # every session it was given


def test_durations_are_queries_over_each_rate(catalogue) -> None:
    plan = load_plan(SINGLE, catalogue)
    e = estimate_plan(plan, 50, catalogue, target_rates={"fmnist-cnn": 100.0}, tenant_rate=25.0)
    d = {x.limit: x for x in e.durations}
    assert set(d) == {"target fmnist-cnn", "tenant images per second"}
    assert d["target fmnist-cnn"].seconds_fixed == pytest.approx(e.fixed / 100)
    assert d["tenant images per second"].seconds_upper_bound == pytest.approx(e.upper_bound / 25)
    assert not estimate_plan(plan, 50, catalogue).durations  # no limit: no bound


def test_split_price_takes_only_the_price_off() -> None:
    assert split_price("https://h/p?a=%2F&price_per_1000=1.5&b=2", "f") == (
        "https://h/p?a=%2F&b=2",
        1.5,
    )
    assert split_price("builtin:m?price_per_1000=0", "f") == ("builtin:m", 0.0)
    assert split_price("builtin:m?rate=3", "f") == ("builtin:m?rate=3", None)
    for bad in ("nan", "-0.1", "1e10", "inf", "1,5", "1&price_per_1000=1"):
        with pytest.raises(InvalidArgument) as exc:
            split_price(f"x:y?price_per_1000={bad}", "target.endpoint")
        assert exc.value.violations[0].field == "target.endpoint"


def test_sequential_acceptance_makes_the_settings_it_may_stop_bounds(catalogue) -> None:
    """Under sequential acceptance a setting a sequential criterion reads may stop after
    its first chunk: its count is a bound with one chunk fixed; settings no criterion reads
    run whole (``unreferenced: run``) or count nothing (``skip``); a finished run's count of
    a session the stopped settings share is split between them."""
    text = SINGLE.replace("limit: 50}", "limit: 50}\nexecution: {batch_size: 16}") + (
        'acceptance:\n  sequential: true\n  corruptions.fog.mean: ">= 0.5"\n'
        '  attacks.square.success_rate: "<= 0.5"\n')
    plan = load_plan(text, catalogue)
    e = estimate_plan(plan, 50, catalogue)
    by = {s.setting: s for s in e.settings}
    assert (by["fog@1"].kind, by["fog@1"].fixed, by["fog@1"].upper_bound) == \
        (UPPER_BOUND, 16, 50)
    assert by["clean"].kind == FIXED and by["clean"].fixed == 50
    assert by["fgsm"].kind == FIXED and by["fgsm"].fixed == 30            # read by none: whole
    assert (by["square"].fixed, by["square"].upper_bound) == (0, 10 * 40)
    skip = load_plan(text.replace("sequential: true", "sequential: {unreferenced: skip}"),
                     catalogue)
    s = {x.setting: x for x in estimate_plan(skip, 50, catalogue).settings}
    assert s["fgsm"].fixed == s["fgsm"].upper_bound == s["hsja"].upper_bound == 0
    assert s["black_lines@1"].fixed == 50                 # degradation always runs whole
    prior = estimate_plan(plan, 50, catalogue, prior={"corruptions": 40, "attack/square/": 77})
    p = {x.setting: x for x in prior.settings}
    assert p["fog@1"].expected == p["fog@2"].expected == 20 and p["square"].expected == 77
