"""IEEE Std 3129-2023 classification correctness, vectorised: several label sets per image
(IEEE-C3), the aggregation rule, label mapping (IEEE-P6), the batch judges agreeing with
``ieee.is_correct`` on every prediction, and recorded answers -> the IEEE-M tree."""

from __future__ import annotations

import numpy as np
import pytest
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.correctness import (
    AggregationRule,
    LabelMapping,
    class_predictions_correct,
    class_truth_array,
    classification_correct,
    classification_correct_from_scores,
)
from fortis.services.scoring.correctness import classification as crc
from fortis.services.scoring.ieee import (
    ClassPrediction,
    CorrectnessRule,
    is_correct,
)
from fortis.services.scoring.outcomes import TestRecord, score_classification

from tests.unit.scoring_cases import fields

TOP1 = CorrectnessRule()


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
        real = crc.classification_correct

        def count(*a: object, **k: object) -> np.ndarray:
            calls["n"] += 1
            return real(*a, **k)  # type: ignore[arg-type]

        monkeypatch.setattr(crc, "classification_correct", count)
        ids = [f"i{n}" for n in range(500)]
        labels = {i: [1] for i in ids}
        tests = [TestRecord(kind="clean", predictions={i: _cp(1) for i in ids})]
        tests += [TestRecord(kind="corruption", perturbation_id=f"c{j}", severity=1,
                             predictions={i: _cp(j % 2) for i in ids}) for j in range(6)]
        out = score_classification(TOP1, labels, tests)
        assert calls["n"] == 7
        assert out["average_robustness_corr"]["value"] == 0.5
