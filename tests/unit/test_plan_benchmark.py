"""Plan sections ``acceptance`` (the verdict's criteria), ``canary``, ``targets``
(multi-target CANARY benchmarks, CAN-7) and ``baseline`` (CAN-10 fast mode). Every refusal
names its field; a multi-target plan's transfer attacks expand per model surrogate."""

from __future__ import annotations

import pytest
from fortis.services.common.acceptance import parse_acceptance, parse_criterion
from fortis.services.common.errors import InvalidArgument
from fortis.services.evaluation.benchmark import MemberStore, member_plan
from fortis.services.evaluation.plan import crafted_on, load_plan
from fortis.services.evaluation.store import EvaluationStore


@pytest.fixture(scope="module")
def catalogue():
    from fortis.server.app.stack import local_catalogue

    return local_catalogue()


BASE = """
name: p
seed: 1
dataset: {source: fashion-mnist, split: test, limit: 8}
corruptions: [{id: fog, severities: [1, 2]}]
"""
MULTI = BASE + """targets:
  - {name: fmnist-cnn, surrogate: fmnist-cnn}
  - {name: fmnist-cnn-at, surrogate: fmnist-cnn-at, defends: fmnist-cnn}
attacks:
  - {id: pgd, params: {epsilon: 0.1, steps: 2}}
  - {id: fgsm, surrogate: fmnist-surrogate, params: {epsilon: 0.1}}
  - {id: square, params: {epsilon: 0.1, max_queries: 10}, limit: 2}
"""


def _fields(text: str, catalogue) -> list[str]:
    with pytest.raises(InvalidArgument) as exc:
        load_plan(text, catalogue)
    return [v.field for v in exc.value.violations]


def test_acceptance_criteria_parse_and_name_their_field(catalogue):
    plan = load_plan(BASE + """target: {name: fmnist-cnn}
attacks: [{id: square, name: sq.v2, params: {epsilon: 0.1, max_queries: 10}}]
acceptance: {accuracy: ">= 90%", corruptions.fog.2: "> 0.5", attacks.sq.v2.success_rate: "<= 0.3",
             attacks.sq.v2.mean_queries: "< 50"}
""", catalogue)
    got = {c.metric: (c.op, c.threshold, c.scope, c.setting) for c in plan.acceptance}
    assert got["accuracy"] == (">=", 0.9, "global", "")
    assert got["corruptions.fog.2"] == (">", 0.5, "corruption", "fog")
    assert got["attacks.sq.v2.success_rate"] == ("<=", 0.3, "attack", "sq.v2")
    assert got["attacks.sq.v2.mean_queries"][1] == 50.0
    bad = _fields(BASE + """target: {name: fmnist-cnn}
acceptance: {accuracy: "about 0.9", corruptions.snow.mean: ">= 0.1", attacks.x.success_rate: "<= 1",
             average_robustness_corr: ">= 1.5", bogus: ">= 0", corruptions.fog.9: ">= 0.1",
             worstcase_robustness_adv: ">= nan"}
""", catalogue)
    assert set(bad) >= {"acceptance.accuracy", "acceptance.corruptions.snow.mean",
                        "acceptance.attacks.x.success_rate",
                        "acceptance.average_robustness_corr", "acceptance.bogus",
                        "acceptance.corruptions.fog.9",
                        "acceptance.worstcase_robustness_adv"}


def test_criterion_holds_and_rejects_non_strings():
    c = parse_criterion("accuracy", ">= 0.9")
    assert not isinstance(c, str) and c.holds(0.9) and not c.holds(0.89)
    assert isinstance(parse_criterion("accuracy", 0.9), str)
    assert isinstance(parse_criterion("accuracy", ">= 1e999"), str)
    crit, problems = parse_acceptance([1, 2], corruptions=(), attacks=())
    assert crit == () and problems[0].field == "acceptance"


def test_multi_target_plan_expands_transfer_attacks_per_surrogate(catalogue):
    plan = load_plan(MULTI + "acceptance: {attacks.pgd.fmnist-cnn-at.success_rate: '<= 0.9'}\n",
                     catalogue)
    assert [m.name for m in plan.members] == ["fmnist-cnn", "fmnist-cnn-at"]
    assert plan.members[1].defends == "fmnist-cnn" and plan.is_benchmark
    assert plan.target.name == "fmnist-cnn"
    sub = member_plan(plan, plan.members[1], ["fmnist-cnn", "fmnist-cnn-at"], catalogue,
                      primary=False)
    assert sub.target.name == "fmnist-cnn-at" and not sub.members and not sub.acceptance
    assert [a.name for a in sub.attacks] == [crafted_on("pgd", "fmnist-cnn"),
                                             crafted_on("pgd", "fmnist-cnn-at"), "fgsm", "square"]
    assert [a.surrogate for a in sub.attacks][:2] == ["fmnist-cnn", "fmnist-cnn-at"]


def test_multi_target_refusals_name_fields(catalogue):
    text = BASE + """target: {name: fmnist-cnn}
targets:
  - {name: a, surrogate: [x, y]}
  - {name: a, defends: nobody}
  - {name: c, task: detection, defends: c}
attacks: [{id: pgd, params: {epsilon: 0.1}}]
baseline: {evaluation: "../etc"}
"""
    bad = _fields(text, catalogue)
    assert {"targets", "targets[0].surrogate", "targets[1].name", "targets[1].defends",
            "targets[2].task", "targets[2].defends", "baseline.evaluation", "baseline"} <= set(bad)
    # one target without targets: a transfer attack still needs its surrogate
    assert "attacks[0].surrogate" in _fields(BASE + """target: {name: fmnist-cnn}
attacks: [{id: pgd, params: {epsilon: 0.1}}]
""", catalogue)
    # a user's attack name may not collide with an expansion
    assert "attacks" in _fields(MULTI + "  - {id: fgsm, name: pgd.fmnist-cnn, surrogate: "
                                "fmnist-surrogate, params: {epsilon: 0.1}}\n", catalogue)


def test_member_store_prefixes_items_and_shares_transfer_examples(tmp_path):
    inner = EvaluationStore(tmp_path / "s.sqlite").for_tenant("t")
    inner.insert(evaluation_id="ev", tenant="t", plan_text="x", plan_name="p")
    shared = {"pgd.fmnist-cnn"}
    m1 = MemberStore(inner, evaluation_id="ev", prefix="m1/", shared=shared, label="model 1")
    m0 = MemberStore(inner, evaluation_id="ev", prefix="", shared=shared, label="model 2")
    m1.start_item("ev.m1", "clean/00000")
    m1.finish_item("ev.m1", "clean/00000", b"r1", items_done=1, images_done=8, queries=8,
                   message="clean")
    m0.start_item("ev", "clean/00000")
    assert [k for k, _, d in m1.items("ev.m1") if d] == ["clean/00000"]
    assert [k for k, _, d in m0.items("ev") if d] == []          # the primary's own item
    assert sorted(k for k, _, _ in inner.items("ev")) == ["clean/00000", "m1/clean/00000"]
    m1.put_artifact("ev.m1", "adversarial/pgd.fmnist-cnn-00000.npz", b"x")
    m1.put_artifact("ev.m1", "adversarial/square-00000.npz", b"y")
    assert m0.artifact("ev", "adversarial/pgd.fmnist-cnn-00000.npz") == b"x"   # shared
    assert m0.artifact("ev", "adversarial/square-00000.npz") is None          # per model
    assert sorted(a.name for a in inner.artifacts("ev")) == [
        "adversarial/pgd.fmnist-cnn-00000.npz", "m1/adversarial/square-00000.npz"]
    # every model's progress is the parent evaluation's row, each message naming its model
    assert m1.tenant == "t"
    m1.update_running("ev.m1", state="RUNNING", stage="clean")
    assert (inner.get("ev").stage, inner.get("ev").message) == ("clean", "model 1")
    m0.update_running("ev", message="3 work items")
    assert m0.get("ev").message == "model 2: 3 work items"


def test_embedded_run_serves_every_model_of_a_multi_target_plan(catalogue):
    from fortis.server.cli.local import _targets_for_plan

    plan = load_plan(MULTI, catalogue)
    assert [t.name for t in _targets_for_plan(plan)] == ["fmnist-cnn", "fmnist-cnn-at"]
    unknown = load_plan(MULTI.replace("name: fmnist-cnn-at,", "name: my-remote-model,"),
                        catalogue)
    with pytest.raises(InvalidArgument) as exc:
        _targets_for_plan(unknown)
    assert exc.value.violations[0].field == "targets[1].name"


def test_can6_selection_moves_the_budget_until_mr_stops_changing(catalogue):
    """CAN-6 (seed 003, 3.2.1): raise epsilon while MR rises significantly, else lower it while
    MR does not fall significantly; a synthetic MR curve with a plateau."""
    from fortis.services.evaluation.selection import select_epsilon, significant_change

    assert significant_change(40, 100, 60, 100, 0.05)        # p ~ 0.005
    assert not significant_change(50, 100, 55, 100, 0.05)
    plan = load_plan(BASE + """target: {name: fmnist-cnn}
attacks: [{id: pgd, surrogate: fmnist-surrogate, params: {epsilon: 0.02}, select_budget: true}]
""", catalogue)
    at = plan.attacks[0]
    assert at.select_budget == {"enabled": True}

    def plateau(eps: float) -> tuple[int, int]:      # MR climbs to 0.9 at eps 0.08, then flat
        return round(200 * min(0.9, 0.1 + 10 * eps)), 200

    tried: list[float] = []

    def measure(eps: float) -> tuple[int, int]:
        tried.append(eps)
        return plateau(eps)

    eps, trace = select_epsilon(at, measure, 1.0)
    assert eps == pytest.approx(0.08) and tried == pytest.approx([0.02, 0.04, 0.08, 0.16])
    assert trace[-1]["decision"].startswith("kept")
    # starting on the plateau: lowered while MR does not fall significantly
    high = load_plan(BASE + """target: {name: fmnist-cnn}
attacks: [{id: pgd, surrogate: fmnist-surrogate, params: {epsilon: 0.3},
           select_budget: {factor: 2, max_steps: 4}}]
""", catalogue).attacks[0]
    eps, _ = select_epsilon(high, plateau, 1.0)
    assert eps == pytest.approx(0.075)
    bad = _fields(BASE + """target: {name: fmnist-cnn}
attacks: [{id: square, params: {epsilon: 0.1, max_queries: 10}, select_budget: true},
          {id: pgd, surrogate: fmnist-surrogate, params: {epsilon: 0.1},
           select_budget: {factor: 9, images: 0, alpha: .nan, bogus: 1}}]
""", catalogue)
    assert {"attacks[0].select_budget", "attacks[1].select_budget.factor",
            "attacks[1].select_budget.images", "attacks[1].select_budget.alpha",
            "attacks[1].select_budget.bogus"} <= set(bad)
