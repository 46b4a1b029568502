"""Degradation profiles and failure points (DEG-2, DEG-3, DEG-4; Swingler, seed 001) on
hand-built profiles whose accuracies, ranks, probabilities and failure points are known."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.degradation import fraction_changed
from fortis.services.scoring.ieee import ClassPrediction, wilson_interval
from fortis.services.scoring.profiles import degradation_profile, degradation_profiles
from fortis.services.scoring.ranking import prediction_arrays

C = 5
M = 10
IDS = [f"img{i}" for i in range(M)]
TRUTH = np.array([i % C for i in range(M)])
#: RANKS[level][image]: 0-based rank of the true label. Images 8 and 9 are wrong at level 0, so
#: DEG-3 drops them (they are right at levels 1.. and must not count).
RANKS = {
    0: [0, 0, 0, 0, 0, 0, 0, 0, 1, 2],
    1: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    2: [0, 0, 0, 1, 0, 0, 0, 0, 0, 3],
    3: [0, 0, 0, 2, 1, 0, 0, 1, 0, 0],
    4: [0, 1, 0, 3, 2, 1, 0, 2, 0, 0],
    5: [0, 4, 2, 4, 3, 2, 1, 3, 0, 0],
}
#: Accuracy on the 8 level-0-correct images.
CORRECT = {0: 8, 1: 8, 2: 7, 3: 5, 4: 3, 5: 1}
#: Probability of the class at each position (strictly decreasing, sums to 1).
POS_P = np.array([5.0, 4.0, 3.0, 2.0, 1.0]) / 15.0


def ranked(truth: int, rank: int) -> list[int]:
    others = [c for c in range(C) if c != truth]
    return others[:rank] + [truth] + others[rank:]


def arrays(level: int) -> tuple[np.ndarray, np.ndarray]:
    labels = np.array([ranked(int(TRUTH[i]), RANKS[level][i]) for i in range(M)])
    probs = np.zeros((M, C))
    for i in range(M):
        probs[i, labels[i]] = POS_P
    return labels, probs


LABELS = {lv: arrays(lv)[0] for lv in RANKS}
PROBS = {lv: arrays(lv)[1] for lv in RANKS}
USED = list(range(8))


def by_threshold(out: dict[str, Any], t: float) -> Any:
    return out["failure_points"][str(t)]


class TestKnownProfile:
    """DEG-2 and DEG-4 on the hand-built profile (full labels and probabilities)."""

    @pytest.fixture
    def out(self) -> dict[str, Any]:
        return degradation_profile(image_ids=IDS, true_labels=TRUTH, labels=LABELS, probs=PROBS)

    def test_deg3_restriction(self, out: dict[str, Any]) -> None:
        assert out["m"] == 10 and out["m_used"] == 8 and out["applicable"]
        # images 8 and 9 are right at level 1 but are not counted: 8/8, not 10/10
        assert out["accuracy"][1]["correct"] == 8 and out["accuracy"][1]["m"] == 8

    def test_accuracy_profile_with_wilson_intervals(self, out: dict[str, Any]) -> None:
        assert out["levels"] == [0, 1, 2, 3, 4, 5]
        for row in out["accuracy"]:
            k = CORRECT[row["level"]]
            assert row["correct"] == k and row["value"] == pytest.approx(k / 8)
            assert row["ci95"] == pytest.approx(list(wilson_interval(k, 8)))
        assert out["accuracy"][0]["value"] == 1.0

    def test_rank_profile(self, out: dict[str, Any]) -> None:
        for row in out["rank"]:
            expected = np.mean([RANKS[row["level"]][i] for i in USED])
            assert row["value"] == pytest.approx(expected) and row["censored"] == 0
            assert row["at_least"] == pytest.approx(expected) and row["source"] == "labels"
        assert out["rank"][5]["value"] == pytest.approx(19 / 8)

    def test_probability_profile(self, out: dict[str, Any]) -> None:
        for row in out["probability"]:
            expected = np.mean([POS_P[RANKS[row["level"]][i]] for i in USED])
            assert row["value"] == pytest.approx(expected) and row["missing"] == 0
        assert out["probability"][0]["value"] == pytest.approx(5 / 15)

    def test_failure_points(self, out: dict[str, Any]) -> None:
        fp90, fp50, fp10 = (by_threshold(out, t) for t in (0.9, 0.5, 0.1))
        # 0.9: level 2 (7/8 = 0.875); img3 is the image that fell there
        assert fp90["level"] == 2 and fp90["accuracy"] == pytest.approx(0.875)
        assert fp90["example_image"] == "img3"
        # 0.5: level 4 (3/8); img1 and img5 fell there (img3, img4, img7 already had): img1
        assert fp50["level"] == 4 and fp50["example_image"] == "img1"
        assert fp50["ci95"] == pytest.approx(list(wilson_interval(3, 8)))
        # 0.1: the lowest accuracy is 1/8 = 0.125 -> never below 10 %
        assert fp10 is None

    def test_rank_from_probabilities_alone_is_the_same(self, out: dict[str, Any]) -> None:
        only_probs = degradation_profile(image_ids=IDS, true_labels=TRUTH, probs=PROBS)
        for key in ("accuracy", "probability", "failure_points"):
            assert only_probs[key] == out[key]
        assert [r["value"] for r in only_probs["rank"]] == [r["value"] for r in out["rank"]]
        assert {r["source"] for r in only_probs["rank"]} == {"probs"}

    def test_json_round_trip(self, out: dict[str, Any]) -> None:
        assert json.loads(json.dumps(out)) == out


def test_excluded_images_never_count_even_when_wrong() -> None:
    """DEG-3: making the two level-0-wrong images wrong everywhere changes nothing."""
    labels = {lv: a.copy() for lv, a in LABELS.items()}
    for lv in labels:
        labels[lv][8:] = np.array([ranked(int(TRUTH[i]), 4) for i in (8, 9)])
    a = degradation_profile(image_ids=IDS, true_labels=TRUTH, labels=labels)
    b = degradation_profile(image_ids=IDS, true_labels=TRUTH, labels=LABELS)
    assert a["accuracy"] == b["accuracy"] and a["failure_points"] == b["failure_points"]
    assert [r["value"] for r in a["rank"]] == [r["value"] for r in b["rank"]]


def test_first_level_below_threshold_even_if_accuracy_recovers() -> None:
    labels = {0: LABELS[0], 1: LABELS[4], 2: LABELS[1], 3: LABELS[5]}
    out = degradation_profile(image_ids=IDS, true_labels=TRUTH, labels=labels)
    assert [r["value"] for r in out["accuracy"]] == [1.0, 3 / 8, 1.0, 1 / 8]
    assert by_threshold(out, 0.9)["level"] == 1 and by_threshold(out, 0.5)["level"] == 1
    assert by_threshold(out, 0.1) is None
    # strictly below: 0.375 is not below 0.375
    out = degradation_profile(image_ids=IDS, true_labels=TRUTH, labels=labels,
                              thresholds=(0.375, 0.3))
    assert by_threshold(out, 0.375)["level"] == 3 and by_threshold(out, 0.3)["level"] == 3


class TestTopKAndLabelsOnly:
    """DEG-2 when the target does not return everything: ranks censored at >= k, probability
    not applicable -- never reported as a number it is not."""

    def test_labels_only_top1(self) -> None:
        top1 = {lv: a[:, :1] for lv, a in LABELS.items()}
        out = degradation_profile(image_ids=IDS, true_labels=TRUTH, labels=top1)
        full = degradation_profile(image_ids=IDS, true_labels=TRUTH, labels=LABELS)
        assert out["accuracy"] == full["accuracy"]
        assert out["failure_points"] == full["failure_points"]
        r0, r2, r5 = out["rank"][0], out["rank"][2], out["rank"][5]
        assert r0["value"] == 0.0 and r0["censored"] == 0
        assert r2["value"] is None and r2["censored"] == 1 and r2["at_least"] == 1 / 8
        assert r5["censored"] == 7 and r5["at_least"] == 7 / 8 and ">= k" in r5["reason"]
        for row in out["probability"]:
            assert row["value"] is None and "labels-only" in row["reason"]

    def test_top3_labels_and_scores(self) -> None:
        labels = {lv: a[:, :3] for lv, a in LABELS.items()}
        probs = {}
        for lv, lab in labels.items():
            p = np.full((M, C), np.nan)
            for i in range(M):
                p[i, lab[i]] = POS_P[:3]
            probs[lv] = p
        out = degradation_profile(image_ids=IDS, true_labels=TRUTH, labels=labels, probs=probs)
        # level 4: true-label ranks over the 8 images 0,1,0,3,2,1,0,2 -> the one 3 is censored
        r4 = out["rank"][4]
        assert r4["value"] is None and r4["censored"] == 1
        assert r4["at_least"] == pytest.approx(np.mean([0, 1, 0, 3, 2, 1, 0, 2]))  # 3 -> >= 3
        assert out["rank"][3]["value"] == pytest.approx(np.mean([0, 0, 0, 2, 1, 0, 0, 1]))
        p4, p3 = out["probability"][4], out["probability"][3]
        assert p4["value"] is None and p4["missing"] == 1 and "top-k" in p4["reason"]
        assert p3["value"] == pytest.approx(np.mean([POS_P[r] for r in RANKS[3][:8]]))

    def test_failed_query_is_wrong_and_its_rank_unknown(self) -> None:
        labels = {lv: a.copy() for lv, a in LABELS.items()}
        labels[1][0] = -1  # image 0 got no answer at level 1
        out = degradation_profile(image_ids=IDS, true_labels=TRUTH, labels=labels)
        assert out["accuracy"][1]["correct"] == 7
        assert out["rank"][1]["value"] is None and out["rank"][1]["censored"] == 1

    def test_from_class_predictions(self) -> None:
        """The proxy's recorded answers (ieee.ClassPrediction) via ranking.prediction_arrays."""
        labels, probs = {}, {}
        for lv in RANKS:
            preds = [ClassPrediction(labels=tuple(int(x) for x in LABELS[lv][i, :2]),
                                     scores=tuple(float(x) for x in POS_P[:2]))
                     for i in range(M)]
            labels[lv], probs[lv] = prediction_arrays(preds, C)
        out = degradation_profile(image_ids=IDS, true_labels=TRUTH, labels=labels, probs=probs)
        assert [r["correct"] for r in out["accuracy"]] == [CORRECT[lv] for lv in RANKS]
        assert out["probability"][1]["value"] == pytest.approx(POS_P[0])


def test_rank_ties_from_probabilities_break_by_class_index() -> None:
    """Documented tie rule: equal probabilities are ordered by class index (stable sort)."""
    p = np.array([[0.4, 0.4, 0.2], [0.4, 0.4, 0.2], [0.2, 0.4, 0.4]])
    out = degradation_profile(image_ids=["a", "b", "c"], true_labels=[0, 0, 1],
                              probs={0: p, 1: p[[1, 0, 2]][:, [1, 0, 2]]})
    # level 0: all three rank 0 (class 0 beats the tied class 1; in row c class 1 beats 2)
    assert out["m_used"] == 3 and out["rank"][0]["value"] == 0.0
    # level 1: classes 0 and 1 swapped in rows a, b -> still tied, class 0 still first;
    # row c becomes [0.4, 0.2, 0.4] for true class 1 -> rank 2 (0.4, 0.4 by index, then 0.2)
    assert out["rank"][1]["value"] == pytest.approx(2 / 3)
    assert out["accuracy"][1]["correct"] == 2


class TestChanges:
    """DEG-4: the change made at the failure level, as the caller measured it."""

    def test_per_image_fractions_and_example(self) -> None:
        rng = np.random.default_rng(0)
        original = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
        per_level = {}
        for lv in RANKS:
            fracs = []
            for i in range(M):
                degraded = original.copy()
                degraded.reshape(-1, 3)[: lv * (i + 1)] ^= 1  # lv*(i+1) pixels changed
                fracs.append(fraction_changed(original, degraded))
            per_level[lv] = np.array(fracs)
        out = degradation_profile(image_ids=IDS, true_labels=TRUTH, labels=LABELS,
                                  changes=per_level)
        fp = by_threshold(out, 0.9)
        assert fp["change"]["mean"] == pytest.approx(np.mean([2 * (i + 1) / 64 for i in USED]))
        assert fp["change"]["example"] == pytest.approx(2 * 4 / 64)  # img3
        assert [c["level"] for c in out["changes"]] == [0, 1, 2, 3, 4, 5]

    def test_scalars_mappings_and_as_dict(self) -> None:
        class Change:
            def as_dict(self) -> dict[str, Any]:
                return {"fraction_changed": 0.5, "change_made": "4 randomly placed lines"}

        out = degradation_profile(image_ids=IDS, true_labels=TRUTH, labels=LABELS,
                                  changes={2: 0.08, "4": Change(), 5: {"note": "x"}})
        assert by_threshold(out, 0.9)["change"] == 0.08
        assert by_threshold(out, 0.5)["change"]["change_made"] == "4 randomly placed lines"
        assert out["changes"][2] == {"level": 5, "change": {"note": "x"}}
        json.dumps(out)

    def test_change_for_an_unknown_level(self) -> None:
        with pytest.raises(InvalidArgument) as e:
            degradation_profile(image_ids=IDS, true_labels=TRUTH, labels=LABELS,
                                changes={7: 0.1})
        assert e.value.violations[0].field == "changes.7"


def test_nothing_correct_at_level_0() -> None:
    labels = {lv: np.array([ranked(int(TRUTH[i]), 1) for i in range(M)]) for lv in (0, 1)}
    out = degradation_profile(image_ids=IDS, true_labels=TRUTH, labels=labels)
    assert not out["applicable"] and "level 0" in out["reason"]
    assert out["accuracy"][1]["value"] is None and out["rank"][1]["value"] is None
    assert all(fp is None for fp in out["failure_points"].values())


def test_several_operators_and_their_average() -> None:
    ops = {"black_lines": {"labels": LABELS, "changes": {2: 0.01}},
           "fade_to_grey": {"labels": {0: LABELS[0], 1: LABELS[1], 2: LABELS[1]},
                            "probs": {0: PROBS[0], 1: PROBS[1], 2: PROBS[1]}}}
    out = degradation_profiles(ops, image_ids=IDS, true_labels=TRUTH)
    assert set(out["operators"]) == {"black_lines", "fade_to_grey"}
    assert by_threshold(out["operators"]["fade_to_grey"], 0.9) is None
    avg = {r["level"]: r for r in out["average"]["accuracy"]}
    assert avg[2]["value"] == pytest.approx((7 / 8 + 1.0) / 2) and avg[2]["n_operators"] == 2
    assert avg[5]["value"] == pytest.approx(1 / 8) and avg[5]["n_operators"] == 1
    prob = {r["level"]: r for r in out["average"]["probability"]}
    assert prob[1]["n_operators"] == 1  # black_lines has no scores
    json.dumps(out)
    with pytest.raises(InvalidArgument) as e:
        degradation_profiles({"x": {"labels": {1: LABELS[1]}}}, image_ids=IDS, true_labels=TRUTH)
    assert e.value.violations[0].field == "operators.x.labels"
    with pytest.raises(InvalidArgument) as e:
        degradation_profiles({"x": {"lables": LABELS}}, image_ids=IDS, true_labels=TRUTH)
    assert e.value.violations[0].field == "operators.x.lables"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"labels": {1: LABELS[1]}}, "labels"),
    ({"labels": {0: LABELS[0][:5]}}, "labels.0"),
    ({"labels": {0: LABELS[0], 1: np.full((M, 2), 9)}, "num_classes": C}, "labels.1"),
    ({"labels": {0: np.array([[-1, 2]] * M)}}, "labels.0"),
    ({"labels": {0: LABELS[0], "x": LABELS[1]}}, "labels.x"),
    ({"labels": {0: LABELS[0]}, "probs": {1: PROBS[1] + 1.0}}, "probs.1"),
    ({"labels": {0: LABELS[0]}, "probs": {0: PROBS[0], 1: PROBS[1][:, :3]}}, "probs"),
    ({"labels": {0: LABELS[0]}, "thresholds": (0.5, 1.5)}, "thresholds"),
    ({"labels": {0: LABELS[0]}, "true_labels": TRUTH[:3]}, "true_labels"),
    ({"labels": {0: LABELS[0]}, "image_ids": ["a"] * M}, "image_ids"),
])
def test_validation_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"image_ids": IDS, "true_labels": TRUTH, **kwargs}
    with pytest.raises(InvalidArgument) as e:
        degradation_profile(**args)
    assert e.value.violations[0].field == field


def test_large_m_is_vectorised() -> None:
    """Thousands of images x 1,000 classes of scores per level (vectorised, no Python loop
    over images)."""
    rng = np.random.default_rng(1)
    m, c = 3_000, 1_000
    truth = rng.integers(0, c, size=m)
    probs = {}
    for lv in range(0, 31, 10):
        logits = rng.normal(0, 1, size=(m, c))
        logits[np.arange(m), truth] += 6.0 - lv / 5
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs[lv] = e / e.sum(axis=1, keepdims=True)
    out = degradation_profile(image_ids=[str(i) for i in range(m)], true_labels=truth,
                              probs=probs)
    acc = [r["value"] for r in out["accuracy"]]
    assert acc[0] == 1.0 and acc == sorted(acc, reverse=True)
    assert out["rank"][-1]["value"] > out["rank"][0]["value"] == 0.0
