"""The plan's ``acceptance.sequential`` (services/common/acceptance.py): the section's
default, per-criterion opt-in and opt-out, what becomes of settings no criterion reads, and
every bad value refused naming its field."""

from __future__ import annotations

import pytest
from fortis.services.common.acceptance import parse_acceptance, parse_sequential

NAMES = {"corruptions": {"fog"}, "attacks": {"square"}}


def parse(raw):
    return parse_acceptance(raw, **NAMES)


def test_the_section_default_makes_every_rate_sequential_but_counts():
    crit, problems = parse({"sequential": True, "accuracy": ">= 0.9",
                            "attacks.square.success_rate": "<= 0.3",
                            "attacks.square.mean_queries": ">= 100"})
    assert problems == []
    by = {c.metric: c.sequential for c in crit}
    assert by == {"accuracy": True, "attacks.square.success_rate": True,
                  "attacks.square.mean_queries": False}     # a count has no sequence
    assert parse_sequential({"sequential": True})[0].unreferenced == "run"


def test_without_the_key_nothing_is_sequential():
    crit, problems = parse({"accuracy": ">= 0.9"})
    assert problems == [] and not crit[0].sequential
    assert not parse_sequential({"accuracy": ">= 0.9"})[0].enabled
    assert not parse_sequential(None)[0].enabled


def test_per_criterion_opt_in_and_out():
    crit, problems = parse({"sequential": True,
                            "accuracy": {"rule": ">= 0.9", "sequential": False},
                            "corruptions.fog.mean": ">= 0.5"})
    assert problems == []
    assert {c.metric: c.sequential for c in crit} == {"accuracy": False,
                                                       "corruptions.fog.mean": True}
    crit, problems = parse({"accuracy": {"rule": ">= 90%", "sequential": True}})
    assert problems == [] and crit[0].sequential and crit[0].threshold == 0.9


def test_unreferenced_skip():
    policy, problems = parse_sequential({"sequential": {"unreferenced": "skip"}})
    assert problems == [] and policy.enabled and policy.unreferenced == "skip"


@pytest.mark.parametrize(("raw", "field"), [
    ({"sequential": "yes"}, "acceptance.sequential"),
    ({"sequential": 1}, "acceptance.sequential"),
    ({"sequential": {"unreferenced": "never"}}, "acceptance.sequential.unreferenced"),
    ({"sequential": {"unreferenced": "skip", "alpha": 0.1}}, "acceptance.sequential.alpha"),
    ({"sequential": {"unreferenced": {"a": {"b": [1] * 3}}}}, "acceptance.sequential.unreferenced"),
    ({"accuracy": {"rule": ">= 0.9", "sequential": "true"}}, "acceptance.accuracy.sequential"),
    ({"accuracy": {"sequential": True}}, "acceptance.accuracy.rule"),
    ({"accuracy": {"rule": ">= 0.9", "stop": True}}, "acceptance.accuracy.stop"),
    ({"accuracy": {"rule": float("nan")}}, "acceptance.accuracy"),
])
def test_bad_values_name_their_field(raw, field):
    _, problems = parse(raw)
    assert [p.field for p in problems] == [field], problems


def test_a_multi_target_plan_refuses_sequential(catalogue):
    from fortis.services.common.errors import InvalidArgument
    from fortis.services.evaluation.plan import load_plan

    text = """
name: bench
seed: 1
targets:
  - {name: fmnist-cnn, task: classification}
  - {name: fmnist-cnn-at, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 8}
corruptions: [{id: fog}]
acceptance: {sequential: true, accuracy: ">= 0.5"}
"""
    with pytest.raises(InvalidArgument) as exc:
        load_plan(text, catalogue)
    assert "acceptance.sequential" in [v.field for v in exc.value.violations]


def test_a_bad_sequential_key_is_named_once_by_plan_validation(catalogue):
    from fortis.services.common.errors import InvalidArgument
    from fortis.services.evaluation.plan import load_plan

    text = """
name: p
seed: 1
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 8}
corruptions: [{id: fog}]
acceptance: {sequential: "yes", accuracy: ">= 0.5"}
"""
    with pytest.raises(InvalidArgument) as exc:
        load_plan(text, catalogue)
    assert [v.field for v in exc.value.violations] == ["acceptance.sequential"]
