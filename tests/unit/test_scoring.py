"""IEEE Std 3129-2023 scoring: correctness rules (IEEE-C1/C2), Wilson CIs (IEEE-M8) and the
metrics of section 4.7 (IEEE-M1..M7) from id -> bool mappings and from result arrays,
checked against values worked out by hand. Several label sets, label mappings and the
vectorised classification judge are in test_scoring_classification.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.ieee import (
    AttackImageOutcome,
    ClassPrediction,
    CorrectnessRule,
    compute_classification_metrics,
    compute_ieee_metrics,
    is_correct,
    wilson_interval,
)

from tests.unit.scoring_cases import fields

TOP1 = CorrectnessRule()


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


class TestCorruptionsOnTheirFirstImages:
    """Sequential acceptance stops a corruption setting once the criteria reading it are
    decided: its Robustness_Corr is then over the images it was sent (M_j), never counting
    the others as wrong, and the worst case (IEEE-M4) over the images every setting saw."""

    def _arrays(self) -> dict:
        return {n: {s: np.array([v[i] for i in IDS]) for s, v in sev.items()}
                for n, sev in CORR.items()}

    def test_a_setting_counted_over_its_first_images(self) -> None:
        corr = self._arrays()
        corr["gaussian_noise"][2] = np.array([T, F, F, F])   # sent a and b only
        clean = np.array([CLEAN[i] for i in IDS])
        out = compute_ieee_metrics(clean=clean, corruptions=corr, attacks={},
                                   attack_budgets={}, image_ids=IDS,
                                   corruption_coverage={"gaussian_noise": {2: np.array([0, 1])}})
        g2 = out["corruptions"]["gaussian_noise"]["2"]
        assert g2["m"] == 2 and g2["correct"] == 1 and g2["robustness"] == 0.5
        lo, hi = g2["ci95"]
        assert lo < 0.5 < hi
        assert out["corruptions"]["gaussian_noise"]["1"]["m"] == 4
        # a is right under every setting, b not under gaussian_noise@2: 1 of the 2 seen by all
        wc = out["worstcase_robustness_corr"]
        assert wc["m"] == 2 and wc["value"] == 0.5
        assert out["worstcase_robustness_corr_by_severity"]["1"]["m"] == 4
        assert out["worstcase_robustness_corr_by_severity"]["2"]["m"] == 2
        # without the coverage the same arrays would count c and d as wrong
        whole = compute_ieee_metrics(clean=clean, corruptions=corr, attacks={},
                                     attack_budgets={}, image_ids=IDS)
        assert whole["corruptions"]["gaussian_noise"]["2"]["robustness"] == 0.25

    def test_full_coverage_is_the_whole_tree(self) -> None:
        corr = self._arrays()
        clean = np.array([CLEAN[i] for i in IDS])
        every = {n: {s: np.arange(4) for s in sev} for n, sev in corr.items()}
        assert compute_ieee_metrics(clean=clean, corruptions=corr, attacks={},
                                    attack_budgets={}, image_ids=IDS,
                                    corruption_coverage=every) == \
            compute_ieee_metrics(clean=clean, corruptions=corr, attacks={},
                                 attack_budgets={}, image_ids=IDS)
