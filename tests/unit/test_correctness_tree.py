"""The IEEE-M1..M7 tree (IEEE-M4/M5 worst case, IEEE-M8 intervals) is built from per-image
booleans, so classification, detection (IEEE-C4) and segmentation (IEEE-C5) give the same
tree, value for value."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.correctness import (
    AggregationRule,
    DetectionCriterion,
    Detections,
    SegmentationPrediction,
)
from fortis.services.scoring.ieee import ClassPrediction, CorrectnessRule
from fortis.services.scoring.outcomes import (
    TestRecord,
    score_classification,
    score_detection,
    score_segmentation,
)

from tests.unit.scoring_cases import OBJ, SEG_CRIT, SEG_GT, SEG_PRED, THRESH, det, fields, gt

# ---------------------------------------------------------------- the IEEE-M tree ----------
# Three images x (clean, 2 corruption settings, a transfer attack, a query attack).
#
#              clean | blur s1  s2 | fgsm | square (Q_m = 50)
#   a            1   |      1    1 |   1  |   not misled          right everywhere
#   b            1   |      1    0 |   1  |   misled after 7      wrong under one setting
#   c            0   |      0    0 |   0  |   (not attacked)
#   Accuracy 2/3; Robustness_Corr 2/3, 1/3; WorstCase_Corr 1/3 (only a);
#   Robustness_Adv fgsm 2/3, square 1/3; WorstCase_Adv 1/3 (only a).

EXPECTED = {"accuracy": 2 / 3, "s1": 2 / 3, "s2": 1 / 3, "wc_corr": 1 / 3, "fgsm": 2 / 3,
            "square": 1 / 3, "wc_adv": 1 / 3}


def _check_tree(out: dict) -> None:
    assert out["m"] == 3
    assert out["accuracy"]["value"] == pytest.approx(EXPECTED["accuracy"])
    assert out["corruptions"]["blur"]["1"]["robustness"] == pytest.approx(EXPECTED["s1"])
    assert out["corruptions"]["blur"]["2"]["robustness"] == pytest.approx(EXPECTED["s2"])
    assert out["worstcase_robustness_corr"]["value"] == pytest.approx(EXPECTED["wc_corr"])
    assert out["worstcase_robustness_corr"]["n_settings"] == 2
    assert out["attacks"]["fgsm"]["robustness_adv"] == pytest.approx(EXPECTED["fgsm"])
    assert out["attacks"]["square"]["robustness_adv"] == pytest.approx(EXPECTED["square"])
    assert out["attacks"]["square"]["mean_queries"] == pytest.approx((50 + 7) / 2)
    assert out["worstcase_robustness_adv"]["value"] == pytest.approx(EXPECTED["wc_adv"])
    lo, hi = out["accuracy"]["ci95"]
    assert 0 < lo < 2 / 3 < hi < 1                                  # IEEE-M8
    assert json.loads(json.dumps(out)) == out


def _tests(right: object, wrong: object, pattern: dict[str, str]) -> list[TestRecord]:
    def preds(p: str) -> dict[str, object]:
        return {i: (right if ch == "1" else wrong) for i, ch in zip("abc", p, strict=True)}
    return [TestRecord(kind="clean", predictions=preds(pattern["clean"])),
            TestRecord(kind="corruption", perturbation_id="blur", severity=1,
                       predictions=preds(pattern["s1"])),
            TestRecord(kind="corruption", perturbation_id="blur", severity=2,
                       predictions=preds(pattern["s2"])),
            TestRecord(kind="attack", perturbation_id="fgsm", predictions=preds(pattern["fgsm"])),
            TestRecord(kind="attack", perturbation_id="square", query_budget=50,
                       success={"a": False, "b": True, "c": False},
                       queries={"a": 50, "b": 7})]


PATTERN = {"clean": "110", "s1": "110", "s2": "100", "fgsm": "110"}


class TestSameTreeForEveryTask:
    """IEEE-M1..M7 (+M8): the tree is built from per-image booleans, so detection and
    segmentation give the same tree, value for value, as classification."""

    def test_classification(self) -> None:
        labels = {"a": [1], "b": [1], "c": [1]}
        out = score_classification(CorrectnessRule(), labels, _tests(
            ClassPrediction(labels=(1,), scores=None), ClassPrediction(labels=(0,), scores=None),
            PATTERN))
        _check_tree(out)

    def test_detection(self) -> None:
        truths = {i: gt([[0, 0, 10, 10], [20, 20, 40, 40]], [1, 2], image_size=(64, 64))
                  for i in "abc"}
        right = det([[0, 0, 10, 10], [20, 20, 40, 40]], [1, 2], [0.9, 0.8])
        wrong = det([[0, 0, 10, 10], [20, 20, 40, 40]], [1, 0], [0.9, 0.8])  # one object off
        out = score_detection(THRESH, truths, _tests(right, wrong, PATTERN))
        _check_tree(out)
        # C3 "at least 1 of 2" turns every "wrong" answer right
        loose = DetectionCriterion(aggregate=AggregationRule(mode="at_least", q=1))
        assert score_detection(loose, truths, _tests(right, wrong, PATTERN))["accuracy"][
            "value"] == 1.0

    def test_detection_normalised_predictions_use_the_truths_size(self) -> None:
        truths = {i: gt([[0, 0, 16, 32]], [1], image_size=(64, 64)) for i in "abc"}
        right = det([[0, 0, 0.25, 0.5]], [1], [0.9], box_format="xyxyn")
        wrong = det([[0.5, 0.5, 0.75, 1.0]], [1], [0.9], box_format="xyxyn")
        _check_tree(score_detection(THRESH, truths, _tests(right, wrong, PATTERN)))

    def test_segmentation(self) -> None:
        truths = {i: SEG_GT for i in "abc"}
        right = SegmentationPrediction(mask=SEG_PRED)
        wrong = SegmentationPrediction(mask=np.zeros_like(SEG_PRED))
        out = score_segmentation(SEG_CRIT, truths, _tests(right, wrong, PATTERN))
        _check_tree(out)

    def test_failed_queries_count_as_incorrect_everywhere(self) -> None:
        truths = {i: gt([OBJ], [1]) for i in "abc"}
        failed = Detections(boxes=[], labels=[], error="DEADLINE_EXCEEDED")
        out = score_detection(THRESH, truths, _tests(det([OBJ], [1], [0.9]), failed, PATTERN))
        _check_tree(out)
        assert out["attacks"]["fgsm"]["errors"] == 1
        seg_failed = SegmentationPrediction(error="UNAVAILABLE")
        out = score_segmentation(SEG_CRIT, {i: SEG_GT for i in "abc"},
                                 _tests(SegmentationPrediction(mask=SEG_PRED), seg_failed,
                                        PATTERN))
        _check_tree(out)

    def test_worst_case_counts_an_image_only_if_right_under_every_setting(self) -> None:
        """IEEE-M4: each image is wrong under exactly one of three settings -> 0, although
        every setting alone has robustness 2/3."""
        truths = {i: gt([OBJ], [1]) for i in "abc"}
        r, w = det([OBJ], [1], [0.9]), det([OBJ], [0], [0.9])
        tests = [TestRecord(kind="clean", predictions={i: r for i in "abc"})]
        for s, bad in zip((1, 2, 3), "abc", strict=True):
            tests.append(TestRecord(kind="corruption", perturbation_id="fog", severity=s,
                                    predictions={i: (w if i == bad else r) for i in "abc"}))
        out = score_detection(THRESH, truths, tests)
        assert [out["corruptions"]["fog"][str(s)]["robustness"] for s in (1, 2, 3)] == \
            pytest.approx([2 / 3] * 3)
        assert out["worstcase_robustness_corr"]["value"] == 0.0
        assert out["worstcase_robustness_corr"]["ci95"][0] == 0.0

    def test_attack_coverage_subset_for_detection(self) -> None:
        truths = {i: gt([OBJ], [1]) for i in "abc"}
        r = det([OBJ], [1], [0.9])
        tests = [TestRecord(kind="clean", predictions={i: r for i in "abc"}),
                 TestRecord(kind="attack", perturbation_id="pgd", image_ids=("c", "a"),
                            predictions={"c": det([OBJ], [0], [0.9]), "a": r})]
        out = score_detection(THRESH, truths, tests)
        assert out["attacks"]["pgd"]["m"] == 2 and out["attacks"]["pgd"]["robustness_adv"] == 0.5

    def test_missing_prediction_is_named(self) -> None:
        truths = {i: gt([OBJ], [1]) for i in "abc"}
        r = det([OBJ], [1], [0.9])
        tests = [TestRecord(kind="clean", predictions={i: r for i in "abc"}),
                 TestRecord(kind="corruption", perturbation_id="fog", severity=1,
                            predictions={"a": r, "b": r})]
        with pytest.raises(InvalidArgument) as exc:
            score_detection(THRESH, truths, tests)
        assert fields(exc.value) == ["tests[fog@1].predictions"] and "'c'" in exc.value.message

    def test_bad_prediction_names_the_test_and_image(self) -> None:
        truths = {i: gt([OBJ], [1]) for i in "abc"}
        r = det([OBJ], [1], [0.9])
        tests = [TestRecord(kind="clean", predictions={i: r for i in "abc"}),
                 TestRecord(kind="corruption", perturbation_id="fog", severity=1,
                            predictions={"a": r, "b": det([[5, 5, 5, 9]], [1], [0.9]), "c": r})]
        with pytest.raises(InvalidArgument) as exc:
            score_detection(THRESH, truths, tests)
        assert fields(exc.value) == ["tests[1].predictions['b'].boxes[0]"]
