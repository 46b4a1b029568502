"""Plan validation of query attacks: targeted variants, task criteria, detection
and segmentation targets; every refusal names the field (``attacks[i]....``)."""

from __future__ import annotations

import pytest
from fortis.services.common.errors import InvalidArgument
from fortis.services.evaluation.plan import check_against_target, load_plan
from fortis.services.evaluation.ports import TargetDescription


@pytest.fixture(scope="module")
def catalogue():
    from fortis.server.app.stack import local_catalogue

    return local_catalogue()


HEAD = """
name: p
seed: 1
roles: {tester: {name: t, organisation: o}}
"""
CLS = HEAD + """target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 8}
"""
DET = HEAD + """target: {name: haar-face, task: detection}
dataset: {source: manifest, path: m.jsonl}
detection: {mode: topk, k: 2, iou_threshold: 0.4, confidence_threshold: 0.3, aggregate: at_least, q: 1}
"""
SEG = HEAD + """target: {name: u2netp, task: segmentation}
dataset: {source: manifest, path: m.jsonl}
segmentation: {classes: [1], miou_threshold: 0.6}
"""


def _target(task: str, output: str, n_labels: int) -> TargetDescription:
    return TargetDescription(name="t", task=task, labels=tuple(str(i) for i in range(n_labels)),
                             output_kind=output, top_k=0, input_height=0, input_width=0,
                             input_channels=0, version="1")


def _fields(exc: pytest.ExceptionInfo[InvalidArgument]) -> dict[str, str]:
    return {v.field: v.description for v in exc.value.violations}


def test_targeted_and_criteria_on_a_classifier(catalogue):
    plan = load_plan(CLS + """attacks:
  - {id: hsja, targeted: {label: 3}, params: {epsilon: 2.0, max_queries: 50}}
  - {id: square, criterion: {kind: confident_misclassification, threshold: 0.8}, params: {epsilon: 0.1, max_queries: 50}}
""", catalogue)
    a, b = plan.attacks
    assert a.targeted and a.criterion["kind"] == "targeted_misclassification"
    assert a.criterion["target_label"] == 3
    assert b.criterion == {"kind": "confident_misclassification", "threshold": 0.8}
    # the class must be one of the target's labels (known only from GetTargetInfo)
    check_against_target(plan, _target("classification", "full_scores", 10), catalogue)
    bad = load_plan(CLS + """attacks:
  - {id: hsja, targeted: {label: 12}, params: {epsilon: 2.0, max_queries: 50}}
""", catalogue)
    with pytest.raises(InvalidArgument) as e:
        check_against_target(bad, _target("classification", "full_scores", 10), catalogue)
    assert "outside the target's 10 labels" in _fields(e)["attacks[0].targeted.label"]


def test_bad_targeted_fields_are_named(catalogue):
    with pytest.raises(InvalidArgument) as e:
        load_plan(CLS + """attacks:
  - {id: hsja, targeted: {label: -1}, params: {epsilon: 2.0, max_queries: 50}}
  - {id: geoda, targeted: {label: 2}, params: {epsilon: 2.0, max_queries: 50}}
  - {id: hsja, name: h2, targeted: {class: 2}, params: {epsilon: 2.0, max_queries: 50}}
  - {id: hsja, name: h3, criterion: {kind: targeted_misclassification}, params: {epsilon: 2.0, max_queries: 50}}
  - {id: hsja, name: h4, criterion: {kind: object_missed}, params: {epsilon: 2.0, max_queries: 50}}
""", catalogue)
    f = _fields(e)
    assert "class id >= 0" in f["attacks[0].targeted.label"]
    assert "geoda has no targeted variant" in f["attacks[1].targeted"]
    assert "attacks[2].targeted.class" in f
    assert "needs the target class" in f["attacks[3].targeted"]
    assert "attacks[4].criterion.kind" in f


def test_score_attack_refused_on_a_label_only_target(catalogue):
    plan = load_plan(CLS + """attacks:
  - {id: square, params: {epsilon: 0.1, max_queries: 50}}
  - {id: hsja, params: {epsilon: 2.0, max_queries: 50}}
""", catalogue)
    with pytest.raises(InvalidArgument) as e:
        check_against_target(plan, _target("classification", "label_only", 10), catalogue)
    f = _fields(e)
    assert list(f) == ["attacks[0].id"]
    assert "square is score-based" in f["attacks[0].id"] and "label_only" in f["attacks[0].id"]
    check_against_target(plan, _target("classification", "top_k", 10), catalogue)


def test_top_k_criterion_needs_k_classes_from_the_target(catalogue):
    plan = load_plan(CLS + """attacks:
  - {id: square, criterion: {kind: top_k_misclassification, k: 5}, params: {epsilon: 0.1, max_queries: 50}}
""", catalogue)
    top3 = TargetDescription(name="t", task="classification", labels=tuple("0123456789"),
                             output_kind="top_k", top_k=3, input_height=0, input_width=0,
                             input_channels=0, version="1")
    with pytest.raises(InvalidArgument) as e:
        check_against_target(plan, top3, catalogue)
    assert "top 3 classes" in _fields(e)["attacks[0].criterion.k"]
    check_against_target(plan, _target("classification", "full_scores", 10), catalogue)


def test_query_attacks_on_a_detector_take_the_plan_ieee_c4_rule(catalogue):
    plan = load_plan(DET + """attacks:
  - {id: square, params: {epsilon: 0.05, max_queries: 100}}
  - {id: hsja, targeted: {label: 0}, params: {epsilon: 5.0, max_queries: 100}}
""", catalogue)
    sq, hs = plan.attacks
    assert sq.criterion == {"kind": "object_missed", "detection": {
        "iou_threshold": 0.4, "min_objects": 1, "mode": "topk", "k": 2, "score_threshold": 0.3}}
    assert hs.criterion["kind"] == "object_relabelled" and hs.criterion["target_label"] == 0
    check_against_target(plan, _target("detection", "boxes", 1), catalogue)


def test_transfer_attacks_and_wrong_task_criteria_refused_on_a_detector(catalogue):
    with pytest.raises(InvalidArgument) as e:
        load_plan(DET + """attacks:
  - {id: fgsm, surrogate: fmnist-surrogate, params: {epsilon: 0.1}}
  - {id: square, criterion: {kind: misclassification}, params: {epsilon: 0.05, max_queries: 100}}
  - {id: hsja, criterion: {kind: miou_below}, params: {epsilon: 5.0, max_queries: 100}}
""", catalogue)
    f = _fields(e)
    # a transfer attack on a detector is crafted on a detection surrogate (IEEE-A7 on IEEE-C4)
    assert "'fmnist-surrogate' is a classification surrogate" in f["attacks[0].surrogate"]
    assert "mtcnn-surrogate" in f["attacks[0].surrogate"] and "attacks[0].id" not in f
    assert "attacks[1].criterion.kind" in f and "attacks[2].criterion.kind" in f


def test_query_attacks_on_a_segmenter(catalogue):
    plan = load_plan(SEG + """attacks:
  - {id: square, params: {epsilon: 0.05, max_queries: 100}}
""", catalogue)
    assert plan.attacks[0].criterion == {"kind": "miou_below", "segmentation": {
        "classes": [1], "miou_threshold": 0.6, "ignore_label": 255,
        "all_absent_incorrect": False}}
    with pytest.raises(InvalidArgument) as e:
        load_plan(SEG + """attacks:
  - {id: hsja, targeted: {label: 1}, params: {epsilon: 5.0, max_queries: 100}}
  - {id: square, criterion: {kind: object_missed}, params: {epsilon: 0.05, max_queries: 100}}
  - {id: pgd, surrogate: fmnist-surrogate, params: {epsilon: 0.1}}
""", catalogue)
    f = _fields(e)
    assert "IEEE-C5 defines none" in f["attacks[0].targeted"]
    assert "attacks[1].criterion.kind" in f
    assert "u2netp-surrogate" in f["attacks[2].surrogate"]


def test_transfer_attacks_on_detectors_and_segmenters(catalogue):
    """IEEE-A7 on IEEE-C4 / C5 targets: the gradient transfer attacks take a surrogate of the
    target's task, with the plan's task criterion; a surrogate of another task is refused,
    naming the field (an ensemble's member by its index)."""
    plan = load_plan(DET + """attacks:
  - {id: pgd, surrogate: mtcnn-surrogate, params: {epsilon: 0.05, steps: 5}}
  - {id: fgsm, surrogate: my-detector, params: {epsilon: 0.05}}
""", catalogue)
    assert plan.attacks[0].surrogate == "mtcnn-surrogate"
    assert plan.attacks[0].criterion["kind"] == "object_missed"
    assert plan.attacks[1].surrogate == "my-detector"      # an operator's: checked when run
    plan = load_plan(SEG + """attacks:
  - {id: mi_fgsm, surrogate: u2netp-surrogate, params: {epsilon: 0.03}}
  - {id: bim, surrogate: u2netp-surrogate, params: {epsilon: 0.03}}
""", catalogue)
    assert [a.criterion["kind"] for a in plan.attacks] == ["miou_below", "miou_below"]
    with pytest.raises(InvalidArgument) as e:
        load_plan(SEG + """attacks:
  - {id: pgd, surrogate: mtcnn-surrogate, params: {epsilon: 0.03}}
  - {id: pgd, name: ens, surrogate: [u2netp-surrogate, mobilenet-v2], params: {epsilon: 0.03}}
""", catalogue)
    f = _fields(e)
    assert "'mtcnn-surrogate' is a detection surrogate" in f["attacks[0].surrogate"]
    assert "mobilenet-v2" in f["attacks[1].surrogate[1]"]
    with pytest.raises(InvalidArgument) as e:
        load_plan(CLS + """attacks:
  - {id: fgsm, surrogate: u2netp-surrogate, params: {epsilon: 0.1}}
""", catalogue)
    assert "fmnist-surrogate" in _fields(e)["attacks[0].surrogate"]
