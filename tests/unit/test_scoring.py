"""IEEE Std 3129-2023 scoring: correctness rules (IEEE-C1/C2), several label sets per image
(IEEE-C3), label mapping (IEEE-P6), Wilson CIs (IEEE-M8) and the metrics of section 4.7
(IEEE-M1..M7), checked against values worked out by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring import correctness as cr
from fortis.services.scoring.correctness import (
    AggregationRule,
    LabelMapping,
    class_predictions_correct,
    class_truth_array,
    classification_correct,
    classification_correct_from_scores,
)
from fortis.services.scoring.ieee import (
    AttackImageOutcome,
    ClassPrediction,
    CorrectnessRule,
    compute_classification_metrics,
    compute_ieee_metrics,
    is_correct,
    wilson_interval,
)
from fortis.services.scoring.outcomes import TestRecord, score_classification

TOP1 = CorrectnessRule()


def fields(err: InvalidArgument) -> list[str]:
    return [v.field for v in err.violations]


# ---------------------------------------------------------------- IEEE-C1 / IEEE-C2 ----------


class TestIsCorrect:
    def test_c1_labels_only_single_prediction(self) -> None:
        pred = ClassPrediction(labels=(3,), scores=None)
        assert is_correct(pred, [3], TOP1)
        assert not is_correct(pred, [4], TOP1)

    def test_c2_alt1_top1_uses_the_best_ranked_label(self) -> None:
        pred = ClassPrediction(labels=(7, 3, 1), scores=(0.5, 0.3, 0.2))
        assert is_correct(pred, [7], TOP1)
        assert not is_correct(pred, [3], TOP1)

    def test_any_acceptable_label_counts(self) -> None:
        pred = ClassPrediction(labels=(7, 3), scores=(0.6, 0.4))
        assert is_correct(pred, [1, 7], TOP1)

    def test_c2_alt2_topk(self) -> None:
        pred = ClassPrediction(labels=(1, 2, 3), scores=(0.5, 0.3, 0.2))
        assert is_correct(pred, [3], CorrectnessRule(mode="topk", k=3))
        assert not is_correct(pred, [3], CorrectnessRule(mode="topk", k=2))
        # the example of 4.7.6.2.1 Alternative 2 (K = 2): the 2nd label still counts
        assert is_correct(pred, [2], CorrectnessRule(mode="topk", k=2))

    def test_topk_beyond_returned_labels(self) -> None:
        # a target returning 3 labels judged with k = 5: only what it returned can match
        pred = ClassPrediction(labels=(1, 2, 3), scores=(0.5, 0.3, 0.2))
        rule = CorrectnessRule(mode="topk", k=5)
        assert is_correct(pred, [3], rule)
        assert not is_correct(pred, [9], rule)

    def test_topk_labels_only_target(self) -> None:
        pred = ClassPrediction(labels=(4,), scores=None)
        rule = CorrectnessRule(mode="topk", k=5)
        assert is_correct(pred, [4], rule)
        assert not is_correct(pred, [5], rule)

    def test_c2_alt3_threshold_is_strictly_greater(self) -> None:
        pred = ClassPrediction(labels=(1, 2), scores=(0.6, 0.4))
        assert not is_correct(pred, [1], CorrectnessRule(mode="threshold", threshold=0.6))
        assert is_correct(pred, [1], CorrectnessRule(mode="threshold", threshold=0.59))
        # a lower-ranked label above sigma counts too
        assert is_correct(pred, [2], CorrectnessRule(mode="threshold", threshold=0.3))
        assert not is_correct(pred, [2], CorrectnessRule(mode="threshold", threshold=0.4))

    def test_c2_alt3_standard_example(self) -> None:
        # 4.7.6.2.1, Figure 9 with sigma = 65 %: p1 {ball games 60 %, running 40 %} incorrect,
        # p2 {baseball 70 %, golfball 40 %} correct.
        rule = CorrectnessRule(mode="threshold", threshold=0.65)
        ball_games, running, baseball, golfball = 0, 1, 2, 3
        p1 = ClassPrediction(labels=(ball_games, running), scores=(0.6, 0.4))
        p2 = ClassPrediction(labels=(baseball, golfball), scores=(0.7, 0.4))
        assert not is_correct(p1, [ball_games], rule)
        assert is_correct(p2, [baseball], rule)

    def test_threshold_needs_scores(self) -> None:
        pred = ClassPrediction(labels=(1,), scores=None)
        with pytest.raises(InvalidArgument) as exc:
            is_correct(pred, [1], CorrectnessRule(mode="threshold"))
        assert fields(exc.value) == ["correctness.mode"]

    def test_failed_query_is_incorrect(self) -> None:
        pred = ClassPrediction(labels=(1,), scores=(0.9,), error="UNAVAILABLE: timeout")
        for rule in (TOP1, CorrectnessRule(mode="topk"), CorrectnessRule(mode="threshold")):
            assert not is_correct(pred, [1], rule)

    def test_empty_prediction_is_incorrect(self) -> None:
        pred = ClassPrediction(labels=(), scores=())
        assert not is_correct(pred, [1], TOP1)
        assert not is_correct(pred, [1], CorrectnessRule(mode="topk"))
        assert not is_correct(pred, [1], CorrectnessRule(mode="threshold"))

    def test_scores_must_match_labels(self) -> None:
        with pytest.raises(InvalidArgument):
            is_correct(ClassPrediction(labels=(1, 2), scores=(0.9,)), [1], TOP1)

    def test_no_truth_label(self) -> None:
        with pytest.raises(InvalidArgument) as exc:
            is_correct(ClassPrediction(labels=(1,), scores=None), [], TOP1)
        assert fields(exc.value) == ["truth"]


class TestCorrectnessRule:
    def test_defaults_and_from_dict(self) -> None:
        assert CorrectnessRule.from_dict({}) == CorrectnessRule(mode="top1", k=5, threshold=0.5)
        assert CorrectnessRule.from_dict(None) == CorrectnessRule()
        rule = CorrectnessRule.from_dict({"mode": "topk", "k": 3})
        assert (rule.mode, rule.k) == ("topk", 3)
        rule = CorrectnessRule.from_dict({"mode": "threshold", "threshold": 0.65})
        assert rule.threshold == 0.65

    @pytest.mark.parametrize(("d", "field"), [
        ({"mode": "top3"}, "correctness.mode"),
        ({"mode": 1}, "correctness.mode"),
        ({"mode": "topk", "k": 0}, "correctness.k"),
        ({"mode": "topk", "k": 2.5}, "correctness.k"),
        ({"mode": "topk", "k": True}, "correctness.k"),
        ({"mode": "threshold", "threshold": 1.5}, "correctness.threshold"),
        ({"mode": "threshold", "threshold": -0.1}, "correctness.threshold"),
        ({"mode": "threshold", "threshold": float("nan")}, "correctness.threshold"),
        ({"mode": "threshold", "threshold": "high"}, "correctness.threshold"),
        ({"mode": "top1", "sigma": 0.3}, "correctness.sigma"),
    ])
    def test_invalid(self, d: dict, field: str) -> None:
        with pytest.raises(InvalidArgument) as exc:
            CorrectnessRule.from_dict(d)
        assert field in fields(exc.value)

    def test_constructor_validates_too(self) -> None:
        with pytest.raises(InvalidArgument):
            CorrectnessRule(mode="nope")


# ---------------------------------------------------------------- IEEE-M8 --------------------


class TestWilson:
    def test_known_values(self) -> None:
        lo, hi = wilson_interval(8, 10)
        assert (round(lo, 3), round(hi, 3)) == (0.490, 0.943)
        lo, hi = wilson_interval(1, 4)
        assert (round(lo, 4), round(hi, 4)) == (0.0456, 0.6994)
        lo, hi = wilson_interval(50, 100)
        assert (round(lo, 4), round(hi, 4)) == (0.4038, 0.5962)

    def test_extremes(self) -> None:
        lo, hi = wilson_interval(0, 10)
        assert lo == 0.0 and round(hi, 4) == 0.2775
        lo, hi = wilson_interval(10, 10)
        assert round(lo, 4) == 0.7225 and hi == 1.0
        assert wilson_interval(0, 0) == (0.0, 1.0)

    def test_bad_counts(self) -> None:
        with pytest.raises(ValueError):
            wilson_interval(11, 10)
        with pytest.raises(ValueError):
            wilson_interval(-1, 10)


# ---------------------------------------------------------------- IEEE-M1..M7 ----------------
# A hand-built matrix: 4 images (a, b, c, d) x 3 corruptions x 2 severities, and 2 attacks.
#
#                clean | noise s1 s2 | blur s1 s2 | fog s1 s2
#   a              1   |       1  1  |      1  1  |     1  1     right everywhere
#   b              1   |       1  0  |      1  1  |     1  1     wrong under one setting only
#   c              1   |       1  1  |      1  0  |     1  1     wrong under one setting only
#   d              0   |       0  0  |      1  0  |     0  0
#
#   Robustness_Corr  noise 3/4, 2/4 (mean .625); blur 4/4, 2/4 (mean .75); fog 3/4, 3/4 (.75)
#   Average_Robustness_Corr = (.625 + .75 + .75) / 3 = .708333...
#   WorstCase (all 6 settings) = 1/4 (only a); at s1 = 3/4 (a, b, c); at s2 = 1/4 (a)
#
#   square (query, Q_m = 100):  a success@10 (wrong), b fails@100 (right), c success@31,
#                               d initially wrong (not attacked)
#   fgsm (transfer):            a right, b right, c wrong, d wrong
#   Robustness_Adv: square 1/4, fgsm 2/4; Average = .375; WorstCase_Adv = 1/4 (only b)

IDS = ["a", "b", "c", "d"]
T, F = True, False


def _col(*vals: bool) -> dict[str, bool]:
    return dict(zip(IDS, vals, strict=True))


CLEAN = _col(T, T, T, F)
CORR = {
    "gaussian_noise": {1: _col(T, T, T, F), 2: _col(T, F, T, F)},
    "defocus_blur": {1: _col(T, T, T, T), 2: _col(T, T, F, F)},
    "fog": {1: _col(T, T, T, F), 2: _col(T, T, T, F)},
}


def _square() -> list[AttackImageOutcome]:
    return [
        AttackImageOutcome(image_id="a", correct=F, initially_correct=T, success=T, queries=10),
        AttackImageOutcome(image_id="b", correct=T, initially_correct=T, success=F, queries=100),
        AttackImageOutcome(image_id="c", correct=F, initially_correct=T, success=T, queries=31),
        AttackImageOutcome(image_id="d", correct=F, initially_correct=F, success=None,
                           queries=None),
    ]


def _fgsm() -> list[AttackImageOutcome]:
    return [AttackImageOutcome(image_id=i, correct=c, initially_correct=ic, success=None,
                               queries=None)
            for i, c, ic in [("a", T, T), ("b", T, T), ("c", F, T), ("d", F, F)]]


def _metrics(**over: object) -> dict:
    kw: dict = {"clean": CLEAN, "corruptions": CORR, "attacks": {"square": _square(),
                                                                 "fgsm": _fgsm()},
                "attack_budgets": {"square": 100, "fgsm": None}, "image_ids": IDS}
    kw.update(over)
    return compute_classification_metrics(**kw)


class TestClassificationMetrics:
    def test_m1_accuracy(self) -> None:
        acc = _metrics()["accuracy"]
        assert acc["value"] == 0.75 and acc["m"] == 4 and acc["correct"] == 3
        assert acc["ci95"][0] == pytest.approx(0.3006, abs=1e-4)
        assert acc["ci95"][1] == pytest.approx(0.9544, abs=1e-4)

    def test_m2_m7_per_corruption_per_severity(self) -> None:
        c = _metrics()["corruptions"]
        assert set(c) == {"gaussian_noise", "defocus_blur", "fog"}
        assert set(c["fog"]) == {"1", "2", "mean"}
        assert c["gaussian_noise"]["1"]["robustness"] == 0.75
        assert c["gaussian_noise"]["2"]["robustness"] == 0.5
        assert c["gaussian_noise"]["2"]["correct"] == 2
        assert c["gaussian_noise"]["2"]["m"] == 4
        assert c["defocus_blur"]["1"]["robustness"] == 1.0
        assert c["defocus_blur"]["1"]["ci95"][1] == 1.0
        assert c["gaussian_noise"]["mean"]["robustness"] == pytest.approx(0.625)
        assert c["defocus_blur"]["mean"]["robustness"] == pytest.approx(0.75)
        assert c["fog"]["mean"]["robustness"] == pytest.approx(0.75)
        assert c["fog"]["mean"]["severities"] == [1, 2]
        lo, hi = c["gaussian_noise"]["2"]["ci95"]
        assert (round(lo, 4), round(hi, 4)) == (0.1500, 0.8500)

    def test_m2_average(self) -> None:
        avg = _metrics()["average_robustness_corr"]
        assert avg["value"] == pytest.approx(0.708333, abs=1e-6)
        assert avg["n"] == 3 and avg["ci95"] is None
        by_sev = _metrics()["average_robustness_corr_by_severity"]
        assert by_sev["1"]["value"] == pytest.approx(2.5 / 3)
        assert by_sev["2"]["value"] == pytest.approx(1.75 / 3)

    def test_m4_worst_case_image_wrong_under_one_setting_does_not_count(self) -> None:
        out = _metrics()
        wc = out["worstcase_robustness_corr"]
        assert wc["value"] == 0.25 and wc["correct"] == 1 and wc["m"] == 4
        assert wc["n_settings"] == 6
        assert wc["ci95"][0] == pytest.approx(0.0456, abs=1e-4)
        by_sev = out["worstcase_robustness_corr_by_severity"]
        assert by_sev["1"]["value"] == 0.75
        assert by_sev["2"]["value"] == 0.25

    def test_m3_m6_query_attack(self) -> None:
        sq = _metrics()["attacks"]["square"]
        assert sq["kind"] == "query"
        assert sq["robustness_adv"] == 0.25 and sq["correct"] == 1 and sq["m"] == 4
        assert sq["success_rate"] == pytest.approx(2 / 3)
        assert sq["success_rate_n"] == 3
        lo, hi = sq["success_rate_ci95"]
        assert (round(lo, 4), round(hi, 4)) == (0.2077, 0.9385)
        # over the 3 initially-correct images attacked (d was not): (10 + 100 + 31) / 3
        assert sq["mean_queries"] == pytest.approx(47.0)
        assert sq["median_queries"] == 31
        assert sq["mean_queries_successful"] == pytest.approx(20.5)
        assert sq["query_budget"] == 100
        assert sq["errors"] == 0 and sq["clean_mismatches"] == 0

    def test_m3_transfer_attack_success_is_derived(self) -> None:
        fg = _metrics()["attacks"]["fgsm"]
        assert fg["kind"] == "transfer"
        assert fg["robustness_adv"] == 0.5
        # initially correct: a, b, c; misled: c only (d was never right, so it is no success)
        assert fg["success_rate"] == pytest.approx(1 / 3)
        assert fg["successes"] == 1
        assert fg["mean_queries"] is None and fg["median_queries"] is None
        assert fg["query_budget"] is None

    def test_m3_m5_average_and_worst_case_adv(self) -> None:
        out = _metrics()
        assert out["average_robustness_adv"]["value"] == pytest.approx(0.375)
        assert out["average_robustness_adv"]["n"] == 2
        # a is right under fgsm but not square: it does not count; only b does
        wc = out["worstcase_robustness_adv"]
        assert wc["value"] == 0.25 and wc["correct"] == 1 and wc["n_settings"] == 2

    def test_median_of_even_count(self) -> None:
        outs = [AttackImageOutcome(image_id=i, correct=F, initially_correct=T, success=T,
                                   queries=q) for i, q in zip(IDS, [1, 2, 3, 100], strict=True)]
        att = _metrics(clean=_col(T, T, T, T), attacks={"simba": outs},
                       attack_budgets={"simba": 100})["attacks"]["simba"]
        assert att["median_queries"] == 2.5
        assert att["mean_queries"] == 26.5
        assert att["success_rate"] == 1.0

    def test_error_counts_as_incorrect_and_is_reported(self) -> None:
        outs = _square()
        outs[1] = AttackImageOutcome(image_id="b", correct=T, initially_correct=T, success=None,
                                     queries=7, error="UNAVAILABLE")
        att = _metrics(attacks={"square": outs})["attacks"]["square"]
        assert att["robustness_adv"] == 0.0
        assert att["errors"] == 1 and att["error_images"] == ["b"]
        # b is left out of the success rate and query stats: 2 successes out of a, c
        assert att["success_rate"] == 1.0 and att["success_rate_n"] == 2
        assert att["mean_queries"] == pytest.approx(20.5)

    def test_clean_mismatch_is_counted(self) -> None:
        outs = _fgsm()
        outs[3] = AttackImageOutcome(image_id="d", correct=F, initially_correct=T, success=None,
                                     queries=None)
        att = _metrics(attacks={"fgsm": outs})["attacks"]["fgsm"]
        assert att["clean_mismatches"] == 1

    def test_empty_corruptions_and_attacks_give_null_not_zero(self) -> None:
        out = _metrics(corruptions={}, attacks={}, attack_budgets={})
        assert out["corruptions"] == {} and out["attacks"] == {}
        for key in ("average_robustness_corr", "worstcase_robustness_corr",
                    "average_robustness_adv", "worstcase_robustness_adv"):
            assert out[key]["value"] is None, key
            assert out[key]["ci95"] is None, key
        assert out["accuracy"]["value"] == 0.75

    def test_json_round_trip(self) -> None:
        out = _metrics()
        assert json.loads(json.dumps(out)) == out

    @pytest.mark.parametrize(("over", "field", "image"), [
        ({"clean": {"a": T, "b": T, "c": T}}, "clean", "d"),
        ({"corruptions": {**CORR, "fog": {1: CORR["fog"][1], 2: {"a": T, "b": T, "d": F}}}},
         "corruptions.fog.2", "c"),
        ({"attacks": {"square": _square()[:3], "fgsm": _fgsm()}}, "attacks.square", "d"),
    ])
    def test_missing_image_names_field_and_image(self, over: dict, field: str,
                                                 image: str) -> None:
        with pytest.raises(InvalidArgument) as exc:
            _metrics(**over)
        assert fields(exc.value) == [field]
        assert f"'{image}'" in exc.value.violations[0].description

    def test_unknown_image_and_duplicates_rejected(self) -> None:
        with pytest.raises(InvalidArgument) as exc:
            _metrics(clean={**CLEAN, "e": T})
        assert fields(exc.value) == ["clean"] and "'e'" in exc.value.message
        with pytest.raises(InvalidArgument) as exc:
            _metrics(attacks={"fgsm": _fgsm() + _fgsm()[:1]})
        assert fields(exc.value) == ["attacks.fgsm"]
        with pytest.raises(InvalidArgument) as exc:
            _metrics(image_ids=IDS + ["a"])
        assert fields(exc.value) == ["image_ids"]

    def test_no_images_and_bad_severity(self) -> None:
        with pytest.raises(InvalidArgument) as exc:
            _metrics(image_ids=[], clean={})
        assert fields(exc.value) == ["image_ids"]
        with pytest.raises(InvalidArgument) as exc:
            _metrics(corruptions={"fog": {}})
        assert fields(exc.value) == ["corruptions.fog"]
        with pytest.raises(InvalidArgument) as exc:
            _metrics(corruptions={"fog": {"high": CORR["fog"][1]}})
        assert fields(exc.value) == ["corruptions.fog.high"]


class TestAttackLimitedToSubset:
    """A plan may run an expensive query attack on its first N images only: IEEE-M3/M6 are then
    taken over those N (M_j = N), never counting the unattacked images as robust; IEEE-M5 is
    taken over the images every attack covered."""

    def test_limited_attack_scored_over_its_subset(self) -> None:
        out = _metrics(attacks={"square": _square()[:2], "fgsm": _fgsm()},
                       attack_coverage={"square": ["a", "b"]})
        sq = out["attacks"]["square"]
        # a misled, b held: 1/2 (not 3/4 as it would be if c and d "stood" on their clean result)
        assert sq["m"] == 2 and sq["robustness_adv"] == 0.5
        assert sq["success_rate_n"] == 2 and sq["successes"] == 1
        assert out["attacks"]["fgsm"]["m"] == 4
        avg = out["average_robustness_adv"]
        assert avg["value"] == pytest.approx((0.5 + 0.5) / 2)
        assert avg["m"] is None and avg["m_per_attack"] == {"square": 2, "fgsm": 4}
        # worst case over {a, b}: a fails square, b holds under both -> 1/2
        wc = out["worstcase_robustness_adv"]
        assert wc["m"] == 2 and wc["value"] == 0.5

    def test_coverage_is_checked(self) -> None:
        with pytest.raises(InvalidArgument) as exc:
            _metrics(attacks={"square": _square()[:1], "fgsm": _fgsm()},
                     attack_coverage={"square": ["a", "b"]})
        assert fields(exc.value) == ["attacks.square"] and "'b'" in exc.value.message
        with pytest.raises(InvalidArgument) as exc:
            _metrics(attacks={"square": _square()[:2], "fgsm": _fgsm()},
                     attack_coverage={"square": ["a", "b", "zz"]})
        assert "attack_coverage.square" in fields(exc.value)
        with pytest.raises(InvalidArgument) as exc:
            _metrics(attacks={"square": _square(), "fgsm": _fgsm()},
                     attack_coverage={"square": ["a", "b"]})
        assert set(fields(exc.value)) == {"attacks.square"} and "did not cover" in exc.value.message


# ---------------------------------------------------------------- IEEE-C3 label sets --------
# 4.7.6.2, Figure 9: two label sets, L1 (activity) and L2 (object); the image is labelled
# l1 = {ball games}, l2 = {baseball}. p1 = {ball games 60 %, running 40 %},
# p2 = {baseball 70 %, golfball 40 %}.

BALL_GAMES, RUNNING = 0, 1          # label set L1
BASEBALL, GOLFBALL = 0, 1           # label set L2
FIG9_PRED = [ClassPrediction(labels=(BALL_GAMES, RUNNING), scores=(0.6, 0.4)),
             ClassPrediction(labels=(BASEBALL, GOLFBALL), scores=(0.7, 0.4))]
FIG9_TRUTH = [[BALL_GAMES], [BASEBALL]]


def _fig9(rule: CorrectnessRule, agg: AggregationRule) -> bool:
    truth = class_truth_array([FIG9_TRUTH])
    return bool(class_predictions_correct([FIG9_PRED], truth, rule, aggregate=agg)[0])


ALL = AggregationRule(mode="all")


def at_least(q: int) -> AggregationRule:
    return AggregationRule(mode="at_least", q=q)


class TestLabelSets:
    def test_standard_example_alternative1_top1(self) -> None:
        """C2 Alt 1 on Figure 9: both p1 and p2 are correct, so the image is under C3 Alt 1
        (Q = 2) and Alt 2 (all)."""
        assert _fig9(TOP1, ALL)
        assert _fig9(TOP1, at_least(2))

    def test_standard_example_alternative2_topk(self) -> None:
        rule = CorrectnessRule(mode="topk", k=2)
        assert _fig9(rule, ALL)

    def test_standard_example_alternative3_threshold(self) -> None:
        """C2 Alt 3 with sigma = 65 %: p1 incorrect, p2 correct. C3 Alt 2 (all): incorrect;
        Alt 1 with Q = 1: correct; with Q = 2: incorrect."""
        rule = CorrectnessRule(mode="threshold", threshold=0.65)
        assert not _fig9(rule, ALL)
        assert _fig9(rule, at_least(1))
        assert not _fig9(rule, at_least(2))

    def test_q_greater_than_s_is_rejected(self) -> None:
        with pytest.raises(InvalidArgument) as exc:
            _fig9(TOP1, at_least(3))
        assert fields(exc.value) == ["correctness.q"]

    def test_prediction_count_must_match_label_sets(self) -> None:
        with pytest.raises(InvalidArgument) as exc:
            class_predictions_correct([FIG9_PRED[:1]], class_truth_array([FIG9_TRUTH]), TOP1,
                                      image_ids=["img7"])
        assert fields(exc.value) == ["predictions['img7']"]

    def test_images_need_the_same_number_of_label_sets(self) -> None:
        with pytest.raises(InvalidArgument) as exc:
            class_truth_array([[[1], [2]], [[1]]], image_ids=["a", "b"])
        assert fields(exc.value) == ["labels['b']"]

    def test_empty_label_set_rejected(self) -> None:
        with pytest.raises(InvalidArgument) as exc:
            class_truth_array([[[1], []]])
        assert fields(exc.value) == ["labels[0]"]

    def test_one_failed_set_fails_only_that_set(self) -> None:
        preds = [[ClassPrediction(labels=(0,), scores=None),
                  ClassPrediction(labels=(0,), scores=None, error="UNAVAILABLE")]]
        truth = class_truth_array([[[0], [0]]])
        assert not class_predictions_correct(preds, truth, TOP1)[0]
        assert class_predictions_correct(preds, truth, TOP1, aggregate=at_least(1))[0]


class TestAggregationRule:
    def test_from_dict(self) -> None:
        assert AggregationRule.from_dict(None) == AggregationRule()
        assert AggregationRule.from_dict({"aggregate": "at_least", "q": 2}) == at_least(2)
        assert AggregationRule.from_dict(at_least(3).to_dict()) == at_least(3)

    @pytest.mark.parametrize(("d", "field"), [
        ({"aggregate": "most"}, "correctness.aggregate"),
        ({"aggregate": "at_least", "q": 0}, "correctness.q"),
        ({"aggregate": "at_least", "q": 1.5}, "correctness.q"),
        ({"aggregate": "at_least", "q": True}, "correctness.q"),
    ])
    def test_invalid(self, d: dict, field: str) -> None:
        with pytest.raises(InvalidArgument) as exc:
            AggregationRule.from_dict(d)
        assert fields(exc.value) == [field]

    def test_combine(self) -> None:
        c = np.array([[True, True, False], [True, True, True], [False, False, True]])
        assert ALL.combine(c).tolist() == [False, True, False]
        assert at_least(2).combine(c).tolist() == [True, True, False]
        assert at_least(1).combine(c).tolist() == [True, True, True]


# ---------------------------------------------------------------- IEEE-P6 label mapping ------


class TestLabelMapping:
    def test_one_to_one(self) -> None:
        """Dataset labels 1..3 (1-indexed) -> the service's 0..2."""
        lm = LabelMapping({1: 0, 2: 1, 3: 2})
        truth = class_truth_array([[1], [3]], label_mapping=lm)
        preds = [ClassPrediction(labels=(0,), scores=None),
                 ClassPrediction(labels=(1,), scores=None)]
        assert class_predictions_correct(preds, truth, TOP1).tolist() == [True, False]
        assert lm.one_to_one and lm[2] == (1,)

    def test_one_to_many(self) -> None:
        """A coarse dataset label ("dog" = 5) accepted as any of the service's dog breeds."""
        lm = LabelMapping({5: [151, 152, 153], 7: 9})
        assert not lm.one_to_one
        truth = class_truth_array([[5], [5], [5]], label_mapping=lm)
        assert truth.shape == (3, 1, 3)
        preds = [ClassPrediction(labels=(152,), scores=None),
                 ClassPrediction(labels=(153, 1), scores=None),
                 ClassPrediction(labels=(9,), scores=None)]
        assert class_predictions_correct(preds, truth, TOP1).tolist() == [True, True, False]

    def test_unmapped_label_names_the_field_and_image(self) -> None:
        lm = LabelMapping({1: 0}, field="dataset.label_map")
        with pytest.raises(InvalidArgument) as exc:
            class_truth_array([[1], [4]], label_mapping=lm, image_ids=["cat.png", "dog.png"])
        assert fields(exc.value) == ["dataset.label_map"]
        assert "4" in exc.value.message and "dog.png" in exc.value.message

    def test_from_dict_with_string_keys(self) -> None:
        lm = LabelMapping.from_dict({"1": 0, "2": [3, 4]})
        assert lm[1] == (0,) and lm[2] == (3, 4)

    @pytest.mark.parametrize(("table", "field"), [
        ({-1: 0}, "dataset.label_map.-1"),
        ({"x": 0}, "dataset.label_map.x"),
        ({1: []}, "dataset.label_map.1"),
        ({1: -3}, "dataset.label_map.1"),
        ({1: 2.5}, "dataset.label_map.1"),
        ({1: 0, "1": 2}, "dataset.label_map.1"),
    ])
    def test_invalid(self, table: dict, field: str) -> None:
        with pytest.raises(InvalidArgument) as exc:
            LabelMapping(table)
        assert field in fields(exc.value)

    def test_per_label_set_mappings(self) -> None:
        maps = [LabelMapping({0: 10}), None]
        truth = class_truth_array([[[0], [0]]], label_mapping=maps)
        assert truth[0, :, 0].tolist() == [10, 0]
        with pytest.raises(InvalidArgument) as exc:
            class_truth_array([[[0], [0]]], label_mapping=[None])
        assert fields(exc.value) == ["label_mapping"]


# ---------------------------------------------------------------- vectorised C1/C2 ----------


def _random_predictions(seed: int, n: int) -> tuple[list[ClassPrediction], list[list[int]]]:
    rng = np.random.default_rng(seed)
    preds, truths = [], []
    for _ in range(n):
        labels = rng.permutation(8)[: rng.integers(0, 7)]
        scores = np.sort(rng.integers(0, 5, len(labels)) / 4)[::-1]     # many ties with sigma
        err = "UNAVAILABLE" if rng.random() < 0.05 else None
        preds.append(ClassPrediction(labels=tuple(int(x) for x in labels),
                                     scores=tuple(float(x) for x in scores), error=err))
        t = [int(rng.integers(0, 8))]
        if rng.random() < 0.3:
            t.append(int(rng.integers(0, 8)))
        truths.append(t)
    return preds, truths


class TestVectorisedClassification:
    @pytest.mark.parametrize("rule", [
        CorrectnessRule(), CorrectnessRule(mode="topk", k=1), CorrectnessRule(mode="topk", k=3),
        CorrectnessRule(mode="threshold", threshold=0.5),
        CorrectnessRule(mode="threshold", threshold=0.0),
    ])
    def test_agrees_with_is_correct_on_every_prediction(self, rule: CorrectnessRule) -> None:
        """The batch path (IEEE-C1/C2) is exactly the per-prediction rule."""
        preds, truths = _random_predictions(3, 3000)
        ref = [is_correct(p, t, rule) for p, t in zip(preds, truths, strict=True)]
        got = class_predictions_correct(preds, class_truth_array(truths), rule)
        assert got.tolist() == ref
        assert 0 < sum(ref) < len(ref)

    @pytest.mark.parametrize("rule", [CorrectnessRule(), CorrectnessRule(mode="topk", k=3),
                                      CorrectnessRule(mode="threshold", threshold=0.5)])
    def test_full_score_vectors_agree_with_ranked_labels(self, rule: CorrectnessRule) -> None:
        rng = np.random.default_rng(5)
        scores = rng.integers(0, 6, (2000, 10)) / 5                     # many equal scores
        truth = rng.integers(0, 10, 2000)
        order = np.argsort(-scores, axis=1, kind="stable")
        ranked = np.take_along_axis(scores, order, axis=1)
        a = classification_correct(order, truth, rule, ranked_scores=ranked)
        b = classification_correct_from_scores(scores, truth, rule)
        assert a.tolist() == b.tolist()
        # the same through ClassPrediction and is_correct
        preds = [ClassPrediction(labels=tuple(o.tolist()), scores=tuple(r.tolist()))
                 for o, r in zip(order, ranked, strict=True)]
        assert [is_correct(p, [int(t)], rule) for p, t in zip(preds, truth, strict=True)] \
            == a.tolist()

    def test_ties_rank_the_lower_label_first(self) -> None:
        scores = np.array([[0.2, 0.4, 0.4, 0.0]])
        assert classification_correct_from_scores(scores, [1], TOP1).tolist() == [True]
        assert classification_correct_from_scores(scores, [2], TOP1).tolist() == [False]
        assert classification_correct_from_scores(
            scores, [2], CorrectnessRule(mode="topk", k=2)).tolist() == [True]

    def test_multi_set_arrays(self) -> None:
        """(N, S, T) ranked labels, (N, S) truth: three images, two sets each."""
        ranked = np.array([[[1, 2], [5, 6]], [[2, 1], [5, 6]], [[2, 1], [6, 5]]])
        truth = np.array([[1, 5], [1, 5], [1, 5]])
        assert classification_correct(ranked, truth, TOP1).tolist() == [True, False, False]
        assert classification_correct(ranked, truth, TOP1,
                                      aggregate=at_least(1)).tolist() == [True, True, False]
        assert classification_correct(ranked, truth, CorrectnessRule(mode="topk", k=2)
                                      ).tolist() == [True, True, True]
        failed = np.array([False, False, True])
        assert classification_correct(ranked, truth, CorrectnessRule(mode="topk", k=2),
                                      failed=failed).tolist() == [True, True, False]

    def test_shape_errors(self) -> None:
        with pytest.raises(InvalidArgument) as exc:
            classification_correct(np.zeros((2, 3), int), np.zeros((3,), int), TOP1)
        assert fields(exc.value) == ["truth"]
        with pytest.raises(InvalidArgument) as exc:
            classification_correct(np.zeros((2, 3), int), np.full((2,), -1), TOP1)
        assert fields(exc.value) == ["truth"]
        with pytest.raises(InvalidArgument) as exc:
            classification_correct(np.zeros((2, 3), int), np.zeros(2, int),
                                   CorrectnessRule(mode="threshold"))
        assert fields(exc.value) == ["correctness.mode"]
        with pytest.raises(InvalidArgument) as exc:
            classification_correct_from_scores(np.array([[0.1, np.nan]]), [0], TOP1)
        assert fields(exc.value) == ["scores"]
        with pytest.raises(InvalidArgument) as exc:
            classification_correct_from_scores(np.array([[0.1, 0.2]]), [2], TOP1)
        assert fields(exc.value) == ["truth"]


# ---------------------------------------------------------------- records -> tree ------------


def _records(preds_by_setting: dict[str, list[object]]) -> list[TestRecord]:
    ids = ["a", "b", "c", "d"]
    tests: list[TestRecord] = []
    for key, preds in preds_by_setting.items():
        by_id = dict(zip(ids, preds, strict=True))
        if key == "clean":
            tests.append(TestRecord(kind="clean", predictions=by_id))
        else:
            name, sev = key.split("@")
            tests.append(TestRecord(kind="corruption", perturbation_id=name, severity=int(sev),
                                    predictions=by_id))
    return tests


def _cp(*labels: int) -> ClassPrediction:
    return ClassPrediction(labels=labels, scores=None)


class TestScoreClassification:
    def test_single_label_set_unchanged(self) -> None:
        labels = {"a": [1], "b": [2], "c": [3], "d": [4]}
        tests = _records({"clean": [_cp(1), _cp(2), _cp(3), _cp(0)],
                          "fog@1": [_cp(1), _cp(0), _cp(3), _cp(4)]})
        out = score_classification(TOP1, labels, tests)
        assert out["accuracy"]["value"] == 0.75
        assert out["corruptions"]["fog"]["1"]["robustness"] == 0.75
        # IEEE-M4 is the product over the corruption settings (clean is not one of them)
        assert out["worstcase_robustness_corr"]["value"] == 0.75

    def test_label_sets_and_mapping_through_records(self) -> None:
        """IEEE-C3 + P6 end to end: 2 label sets per image, dataset labels 1-indexed."""
        lm = LabelMapping({1: 0, 2: 1, 3: 2})
        labels = {i: [[1], [3]] for i in "abcd"}                # service: set1 0, set2 2
        right, half = [_cp(0), _cp(2)], [_cp(0), _cp(1)]
        tests = _records({"clean": [right, right, half, half],
                          "fog@1": [right, half, half, right]})
        out = score_classification(TOP1, labels, tests, label_mapping=lm)
        assert out["accuracy"]["value"] == 0.5
        assert out["corruptions"]["fog"]["1"]["robustness"] == 0.5        # a and d
        out = score_classification(TOP1, labels, tests, label_mapping=lm,
                                   aggregate=at_least(1))
        assert out["accuracy"]["value"] == 1.0

    def test_unmapped_dataset_label(self) -> None:
        with pytest.raises(InvalidArgument) as exc:
            score_classification(TOP1, {"a": [9]}, _records({}),
                                 label_mapping=LabelMapping({1: 0}))
        assert fields(exc.value) == ["dataset.label_map"] and "'a'" in exc.value.message

    def test_every_image_of_a_setting_is_judged(self) -> None:
        """No 'first element only': moving the one wrong answer moves the verdict."""
        labels = {i: [1] for i in "abcd"}
        for wrong in range(4):
            preds = [_cp(0) if n == wrong else _cp(1) for n in range(4)]
            out = score_classification(TOP1, labels, _records({"clean": preds}))
            assert out["accuracy"]["correct"] == 3

    def test_one_vectorised_call_per_setting(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Throughput by construction (no timed assertion): each setting is judged by one
        call over all its images, not one call per image."""
        calls = {"n": 0}
        real = cr.classification_correct

        def count(*a: object, **k: object) -> np.ndarray:
            calls["n"] += 1
            return real(*a, **k)  # type: ignore[arg-type]

        monkeypatch.setattr(cr, "classification_correct", count)
        ids = [f"i{n}" for n in range(500)]
        labels = {i: [1] for i in ids}
        tests = [TestRecord(kind="clean", predictions={i: _cp(1) for i in ids})]
        tests += [TestRecord(kind="corruption", perturbation_id=f"c{j}", severity=1,
                             predictions={i: _cp(j % 2) for i in ids}) for j in range(6)]
        out = score_classification(TOP1, labels, tests)
        assert calls["n"] == 7
        assert out["average_robustness_corr"]["value"] == 0.5


class TestResultArrays:
    """IEEE-M1..M7 from numpy result vectors (the fast path for large M) give the very same
    tree as the id -> bool mappings."""

    def test_arrays_equal_mappings(self) -> None:
        corr_arrays = {n: {s: np.array([v[i] for i in IDS]) for s, v in sev.items()}
                       for n, sev in CORR.items()}
        a = _metrics()
        b = compute_ieee_metrics(clean=np.array([CLEAN[i] for i in IDS]), corruptions=corr_arrays,
                                 attacks={"square": _square(), "fgsm": _fgsm()},
                                 attack_budgets={"square": 100, "fgsm": None}, image_ids=IDS)
        assert a == b
        c = compute_ieee_metrics(clean=np.array([1, 1, 1, 0]), corruptions={}, attacks={},
                                 attack_budgets={}, image_ids=IDS)
        assert c["accuracy"]["correct"] == 3

    def test_array_shape_and_values_checked(self) -> None:
        with pytest.raises(InvalidArgument) as exc:
            compute_ieee_metrics(clean=np.ones(3, bool), corruptions={}, attacks={},
                                 attack_budgets={}, image_ids=IDS)
        assert fields(exc.value) == ["clean"]
        with pytest.raises(InvalidArgument) as exc:
            compute_ieee_metrics(clean=np.ones(4, bool),
                                 corruptions={"fog": {1: np.array([0, 1, 2, 1])}}, attacks={},
                                 attack_budgets={}, image_ids=IDS)
        assert fields(exc.value) == ["corruptions.fog.1"]

    def test_m4_worst_case_on_a_hand_built_matrix(self) -> None:
        """IEEE-M4: 5 images x 4 settings. Row sums 4, 3, 3, 2, 0: only image 0 is right
        under every setting -> 1/5, although every setting alone is 3/5."""
        ids = ["i0", "i1", "i2", "i3", "i4"]
        mat = np.array([[1, 1, 1, 1],
                        [1, 1, 1, 0],
                        [0, 1, 1, 1],
                        [1, 0, 0, 1],
                        [0, 0, 0, 0]], dtype=bool)
        assert mat.sum(axis=0).tolist() == [3, 3, 3, 3]
        corr = {"noise": {1: mat[:, 0], 2: mat[:, 1]}, "blur": {1: mat[:, 2], 3: mat[:, 3]}}
        out = compute_ieee_metrics(clean=np.ones(5, bool), corruptions=corr, attacks={},
                                   attack_budgets={}, image_ids=ids)
        wc = out["worstcase_robustness_corr"]
        assert wc["value"] == 0.2 and wc["correct"] == 1 and wc["n_settings"] == 4
        # by severity: s1 = noise1 & blur1 -> images 0, 1 -> 2/5; s2 only noise2 -> 3/5
        assert out["worstcase_robustness_corr_by_severity"]["1"]["value"] == 0.4
        assert out["worstcase_robustness_corr_by_severity"]["2"]["value"] == 0.6
        assert out["worstcase_robustness_corr_by_severity"]["3"]["value"] == 0.6

    def test_m5_worst_case_adv_on_a_hand_built_matrix(self) -> None:
        """IEEE-M5: 3 transfer attacks, 4 images; Adv_Result rows 111, 110, 011, 101 -> 1/4."""
        ids = ["w", "x", "y", "z"]
        rows = {"w": (1, 1, 1), "x": (1, 1, 0), "y": (0, 1, 1), "z": (1, 0, 1)}
        attacks = {f"a{j}": [AttackImageOutcome(image_id=i, correct=bool(rows[i][j]),
                                                initially_correct=True, success=None,
                                                queries=None) for i in ids]
                   for j in range(3)}
        out = compute_ieee_metrics(clean=np.ones(4, bool), corruptions={}, attacks=attacks,
                                   attack_budgets=dict.fromkeys(attacks), image_ids=ids)
        assert [out["attacks"][f"a{j}"]["robustness_adv"] for j in range(3)] == [0.75] * 3
        assert out["worstcase_robustness_adv"]["value"] == 0.25
        assert out["average_robustness_adv"]["value"] == 0.75

    def test_large_m_uses_arrays(self) -> None:
        """M = 10,000 x 75 settings as arrays: exact counts (no timed assertion)."""
        rng = np.random.default_rng(0)
        m = 10_000
        ids = [f"img{n}" for n in range(m)]
        mat = rng.random((75, m)) < 0.97
        corr: dict[str, dict[int, np.ndarray]] = {f"c{j // 5}": {} for j in range(75)}
        for j in range(75):
            corr[f"c{j // 5}"][j % 5 + 1] = mat[j]
        out = compute_ieee_metrics(clean=np.ones(m, bool), corruptions=corr, attacks={},
                                   attack_budgets={}, image_ids=ids)
        assert out["worstcase_robustness_corr"]["correct"] == int(mat.all(axis=0).sum())
        assert out["corruptions"]["c3"]["2"]["correct"] == int(mat[16].sum())
