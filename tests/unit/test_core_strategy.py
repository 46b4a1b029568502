"""The task strategies of the domain kernel (``fortis.core.strategy``): one per task, the right
types, and the same validation (fields, messages, order) the plan criteria gave before."""

from __future__ import annotations

import pytest
from fortis.client.errors import InvalidArgument
from fortis.core.answers import (
    ANSWER_TYPES,
    ClassificationAnswers,
    DetectionAnswers,
    SegmentationAnswers,
)
from fortis.core.criteria import (
    ATTACK_CRITERIA,
    TARGETED_DEFAULT,
    CorrectnessRule,
    DetectionCriterion,
    SegmentationCriterion,
)
from fortis.core.strategy import STRATEGIES, TaskStrategy, strategy
from fortis.core.task import TASKS, Task
from fortis.services.perturbation.criteria import (
    CRITERION_KINDS,
    MIoUBelow,
    Misclassification,
    ObjectMissed,
    ObjectRelabelled,
    TargetedMisclassification,
    criterion_from_spec,
)
from fortis.services.perturbation.judges import signal_of_output


def test_every_task_has_one_strategy_in_task_order():
    assert tuple(STRATEGIES) == TASKS
    for task, st in STRATEGIES.items():
        assert isinstance(st, TaskStrategy) and st.task is task
        assert strategy(task) is st and strategy(str(task)) is st


@pytest.mark.parametrize("task, answers, rule, section, truth", [
    (Task.CLASSIFICATION, ClassificationAnswers, CorrectnessRule, "correctness", "label_sets"),
    (Task.DETECTION, DetectionAnswers, DetectionCriterion, "detection", "boxes"),
    (Task.SEGMENTATION, SegmentationAnswers, SegmentationCriterion, "segmentation", "class_map"),
])
def test_lookups_give_the_task_types(task, answers, rule, section, truth):
    st = strategy(task)
    assert st.answers is answers is ANSWER_TYPES[task]
    assert st.rule is rule and st.section == section and st.truth == truth
    assert st.attack_criteria == ATTACK_CRITERIA[task]
    assert st.default_attack_criterion == ATTACK_CRITERIA[task][0]
    assert st.targeted_default == TARGETED_DEFAULT.get(task)
    assert st.own_section is (task != Task.CLASSIFICATION)
    assert st.section_required is (task == Task.SEGMENTATION)


def test_wire_values_and_rule_ids():
    from fortis.common.v1 import common_pb2
    assert {t: st.task_type for t, st in STRATEGIES.items()} == {
        Task.CLASSIFICATION: common_pb2.TASK_TYPE_CLASSIFICATION,
        Task.DETECTION: common_pb2.TASK_TYPE_DETECTION,
        Task.SEGMENTATION: common_pb2.TASK_TYPE_SEGMENTATION}
    assert [st.rule_id for st in STRATEGIES.values()] == ["IEEE-C2", "IEEE-C4", "IEEE-C5"]


def test_an_unknown_task_is_invalid_argument_naming_task():
    with pytest.raises(InvalidArgument) as e:
        strategy("regression")
    assert e.value.violations[0].field == "task"
    assert str(e.value) == "task: unknown task 'regression'"


def test_output_kinds_and_signals():
    assert dict(strategy(Task.CLASSIFICATION).outputs) == {
        "full_scores": "scores", "top_k": "top_k", "label_only": "labels"}
    assert dict(strategy(Task.DETECTION).outputs) == {"boxes": "boxes"}
    assert dict(strategy(Task.SEGMENTATION).outputs) == {"masks": "masks"}
    for kind, signal in [("full_scores", "scores"), ("top_k", "top_k"), ("label_only", "labels"),
                         ("boxes", "boxes"), ("masks", "masks"), ("unknown", "scores")]:
        assert signal_of_output(kind) == signal


def test_every_kind_once_across_the_tasks():
    assert CRITERION_KINDS == tuple(k for kinds in ATTACK_CRITERIA.values() for k in kinds)


@pytest.mark.parametrize("task, section", [
    (Task.CLASSIFICATION, {"mode": "topk", "k": 0, "threshold": 2, "extra": 1}),
    (Task.DETECTION, {"mode": "x", "iou_threshold": 1.0, "aggregate": "some", "q": 0,
                      "confidence_threshold": "a", "extra": 1}),
    (Task.SEGMENTATION, {"classes": [1, 1], "miou_threshold": -1, "ignore_label": "x",
                         "all_absent": "maybe"}),
    (Task.SEGMENTATION, {}),
    (Task.DETECTION, None),
    (Task.CLASSIFICATION, {"mode": "top1"}),
])
def test_rule_violations_are_the_rules_own(task, section):
    """The strategy validates with the rule's ``from_dict``: the same violations, in order."""
    st = strategy(task)
    try:
        st.rule.from_dict(section)
        expected = []
    except InvalidArgument as exc:
        expected = list(exc.violations)
    assert st.rule_violations(section) == expected
    if expected:
        with pytest.raises(InvalidArgument) as e:
            st.parse_rule(section)
        assert list(e.value.violations) == expected
    else:
        assert isinstance(st.parse_rule(section), st.rule)


def test_segmentation_needs_its_classes():
    assert [(v.field, v.description) for v in strategy(Task.SEGMENTATION).rule_violations({})] \
        == [("segmentation.classes", "is required (the Y classes of interest)")]


@pytest.mark.parametrize("task, spec, kind", [
    (Task.CLASSIFICATION, None, Misclassification),
    (Task.CLASSIFICATION, {"target_label": 3}, TargetedMisclassification),
    (Task.DETECTION, None, ObjectMissed),
    (Task.DETECTION, {"target_label": 2}, ObjectRelabelled),
    (Task.SEGMENTATION, {"segmentation": {"classes": [1]}}, MIoUBelow),
])
def test_attack_criterion_defaults_come_from_the_strategy(task, spec, kind):
    assert type(criterion_from_spec(str(task), spec)) is kind


def test_attack_criterion_errors_unchanged():
    with pytest.raises(InvalidArgument) as e:
        criterion_from_spec("regression", None)
    assert str(e.value) == "task: unknown task 'regression'"
    with pytest.raises(InvalidArgument) as e:
        criterion_from_spec("segmentation", {"kind": "object_missed"})
    assert e.value.violations[0].field == "criterion.kind"
    assert "'object_missed' does not apply to a segmentation target; use one of miou_below" \
        in str(e.value)


def test_plan_sections_of_another_task_are_refused_and_a_missing_one_named():
    """The evaluation service's plan validation loops over the strategies: the same problems,
    in the same order, as its former one branch per task."""
    from fortis.services.evaluation.plan_criteria import parse_criteria
    from fortis.services.evaluation.plan_fields import Fields

    v = Fields()
    out = parse_criteria(v, {"detection": {}, "segmentation": {"classes": [0]}},
                         Task.CLASSIFICATION)
    assert out == ({"mode": "top1", "k": 5, "threshold": 0.5}, {}, {})
    assert [(p.field, p.description) for p in v.problems] == [
        ("detection", "only for detection targets; this plan's target.task is classification"),
        ("segmentation", "only for segmentation targets; this plan's target.task is "
                         "classification")]
    v = Fields()
    parse_criteria(v, {"segmentation": None}, Task.SEGMENTATION)
    assert [(p.field, p.description) for p in v.problems] == [
        ("segmentation", "must be a mapping, got NoneType"),
        ("segmentation.classes", "is required (the Y classes of interest)")]
    v = Fields()
    _, det, seg = parse_criteria(v, {"detection": {"iou_threshold": 0.3, "q": 2,
                                                   "aggregate": "at_least"}}, Task.DETECTION)
    assert not v.problems and seg == {}
    assert det == {"iou_threshold": 0.3, "q": 2, "aggregate": "at_least"}
