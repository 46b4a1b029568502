"""Per-attack metrics an evaluation report adds: the success-vs-queries curve of a
query attack (IEEE-M6, from the ledger's per-image counts) and the PER-4 fooling rate, as
ScoreEvaluation computes them and the report's metric tree shows them; and the answers
CANARY's metrics are given (CAN-1/CAN-2 inputs, ``canary_metrics.class_answers``).
Hand-computed small examples; the whole path through the real services is
tests/integration/test_canary_report_e2e.py."""

from __future__ import annotations

import numpy as np
import pytest
from fortis.core.criteria import CorrectnessRule
from fortis.services.common.errors import InvalidArgument
from fortis.services.evaluation.answers import ClassAnswers
from fortis.services.evaluation.canary_metrics import class_answers
from fortis.services.report.metrics_tree import metrics_tree
from fortis.services.scoring.convert import response_from_scores
from fortis.services.scoring.evaluation_data import (
    ClassificationAnswers,
    ClassificationTruth,
    EvaluationSetup,
    QueryOutcomes,
    SettingData,
)
from fortis.services.scoring.evaluation_extras import (
    MAX_CURVE_POINTS,
    fooling,
    success_by_queries,
)
from fortis.services.scoring.evaluation_scoring import score_evaluation

B = np.array


# -- IEEE-M6: success rate against queries -----------------------------------------------------

def test_curve_is_the_share_of_attacked_images_misled_within_q_queries() -> None:
    """Six images, five attacked (image 4 was wrong on the clean image: not attacked, its
    "success" does not count). Misled attacked images at 3, 3, 10 and 7 queries: 2/5 within
    3, 3/5 within 7, 4/5 within 10, and the budget 50 closes at the success rate 4/5."""
    success = B([True, True, False, True, True, True])
    queries = B([3, 10, 50, 3, 1, 7])
    attacked = B([True, True, True, True, False, True])
    assert success_by_queries(success, queries, attacked, 50) == [
        [3, 0.4], [7, 0.6], [10, 0.8], [50, 0.8]]


def test_curve_ends_at_the_budget_and_is_monotone() -> None:
    rng = np.random.default_rng(0)
    n, budget = 3000, 5000
    success = rng.random(n) < 0.7
    queries = np.where(success, rng.integers(1, budget + 1, n), budget)
    attacked = rng.random(n) < 0.9
    pts = success_by_queries(success, queries, attacked, budget)
    assert 2 <= len(pts) <= MAX_CURVE_POINTS          # downsampled, deterministically
    assert pts == success_by_queries(success, queries, attacked, budget)
    qs, rates = [p[0] for p in pts], [p[1] for p in pts]
    assert qs == sorted(set(qs)) and rates == sorted(rates)
    assert pts[-1] == [budget, pytest.approx((success & attacked).sum() / attacked.sum())]
    # every kept point is exact: the share misled within that many queries
    for q, r in pts:
        assert r == pytest.approx((success & attacked & (queries <= q)).sum() / attacked.sum())


def test_curve_edge_cases() -> None:
    none = B([False, False])
    # nothing attacked: no curve (the success rate is undefined, never 0)
    assert success_by_queries(B([True, True]), B([1, 2]), none, 10) == []
    # attacked, nothing misled: one point, 0 at the budget
    assert success_by_queries(none, B([10, 10]), B([True, True]), 10) == [[10, 0.0]]
    # no budget (0): the curve ends at the largest count of a misled image
    assert success_by_queries(B([True, False]), B([4, 9]), B([True, True]), 0) == [[4, 0.5]]
    # no budget, nothing misled: 0 at the most queries an attacked image used
    assert success_by_queries(none, B([4, 9]), B([True, True]), 0) == [[9, 0.0]]


# -- PER-4: fooling rate at T, never fooled ---------------------------------------------------

def test_fooling_rate_at_the_mean_minimal_l2() -> None:
    """Found at L2 0.1, 0.2 and 0.6 (T = their mean 0.3), one attacked image never fooled,
    one not attacked: fooled at T when L2 < T, over the four attacked -> 2/4; never 1/4."""
    success = B([True, True, True, False, True])
    l2 = B([0.1, 0.2, 0.6, 0.0, 0.01])
    attacked = B([True, True, True, True, False])
    got = fooling(success, l2, None, attacked)
    assert got == {"fooling_rate": 0.5, "fooling_threshold": pytest.approx(0.3),
                   "never_fooled": 0.25}
    assert fooling(success, l2, None, attacked, threshold=0.15)["fooling_rate"] == 0.25
    assert fooling(success, l2, None, B([False] * 5)) == {
        "fooling_rate": None, "fooling_threshold": None, "never_fooled": None}
    # nothing found: no threshold, no rate; every attacked image never fooled
    assert fooling(B([False, False]), B([0.0, 0.0]), None, B([True, True])) == {
        "fooling_rate": None, "fooling_threshold": None, "never_fooled": 1.0}


# -- through ScoreEvaluation, the typed response and the report's tree ------------------------

def _setup(m: int) -> EvaluationSetup:
    return EvaluationSetup(image_ids=tuple(f"i{k}" for k in range(m)),
                           truth=ClassificationTruth(labels=np.zeros((m, 1), dtype=np.int64)),
                           criterion=CorrectnessRule(mode="top1"))


def _answers(top1: list[int]) -> ClassificationAnswers:
    return ClassificationAnswers(labels=np.array(top1, dtype=np.int64)[:, None])


def test_score_evaluation_report_tree_carries_curve_and_fooling() -> None:
    """Clean: images 0..4 right, 5 wrong. Query attack on 0..5 (image 2's query failed):
    attacked = 0, 1, 3, 4; misled 0 (4 queries), 3 (9 queries) and 5 (not attacked)."""
    clean = SettingData(kind="clean", answers=_answers([0, 0, 0, 0, 0, 1]))
    q = SettingData(kind="query_attack", name="knob", field="setting[1]",
                    errors=("", "", "timeout", "", "", ""),
                    query=QueryOutcomes(success=B([True, False, True, True, False, True]),
                                        queries=B([4, 12, 1, 9, 12, 3]), budget=12),
                    linf=np.full(6, 0.1), l2=B([0.5, 0.0, 0.2, 1.5, 0.0, 0.1]))
    fgsm = SettingData(kind="transfer_attack", name="fgsm", answers=_answers([1, 0, 0, 0, 0, 0]),
                       linf=np.full(6, 0.1), l2=np.full(6, 1.0))
    out = score_evaluation(_setup(6), [clean, q, fgsm])
    node = out["ieee"]["attacks"]["knob"]
    assert node["success_rate"] == 0.5 and node["success_rate_n"] == 4
    assert node["success_by_queries"] == [[4, 0.25], [9, 0.5], [12, 0.5]]
    assert node["success_by_queries"][-1] == [node["query_budget"], node["success_rate"]]
    assert node["fooling_threshold"] == pytest.approx(1.0)         # mean of 0.5 and 1.5
    assert node["fooling_rate"] == 0.25 and node["never_fooled"] == 0.5
    f = out["ieee"]["attacks"]["fgsm"]
    assert f["success_by_queries"] is None and f["fooling_rate"] is None
    tree = metrics_tree(response_from_scores(out))
    got = tree["attacks"]["knob"]
    assert got["success_by_queries"] == [[4, 0.25], [9, 0.5], [12, 0.5]]
    assert (got["fooling_rate"], got["never_fooled"]) == (0.25, 0.5)
    assert got["fooling_threshold"] == pytest.approx(1.0)
    assert tree["attacks"]["fgsm"]["success_by_queries"] is None
    assert tree["attacks"]["fgsm"]["never_fooled"] is None


def test_metric_tree_refuses_a_malformed_curve_naming_the_point() -> None:
    clean = SettingData(kind="clean", answers=_answers([0, 0]))
    q = SettingData(kind="query_attack", name="sq",
                    query=QueryOutcomes(success=B([True, False]), queries=B([2, 5]), budget=5))
    resp = response_from_scores(score_evaluation(_setup(2), [clean, q]))
    resp.ieee.attacks[0].success_by_queries[1].queries = 1      # not increasing
    with pytest.raises(InvalidArgument) as ei:
        metrics_tree(resp)
    assert ei.value.violations[0].field == "parts.metrics.ieee.attacks[0].success_by_queries[1]"
    resp.ieee.attacks[0].success_by_queries[1].queries = 5
    resp.ieee.attacks[0].success_by_queries[1].success_rate = 1.5
    with pytest.raises(InvalidArgument, match=r"success rate in \[0, 1\]"):
        metrics_tree(resp)


# -- CANARY's answers (CAN-1 / CAN-2 inputs) ----------------------------------------------------

def test_class_answers_dense_probabilities_and_usable_rows() -> None:
    """Ranked full scores become an N x C probability matrix; a failed query, or an answer
    missing a class (not a full vector), is left out; labels only gives the top-1."""
    a = ClassAnswers(labels=np.array([[2, 0, 1], [1, 2, 0], [-1, -1, -1], [0, 1, -1]]),
                     scores=np.array([[.7, .2, .1], [.5, .3, .2], [np.nan] * 3,
                                      [.9, .1, np.nan]], dtype=np.float32),
                     errors=("", "", "timeout", ""))
    probs, ok = class_answers(a, 3, True)
    assert ok.tolist() == [True, True, False, False]
    np.testing.assert_allclose(probs[:2], [[.2, .1, .7], [.2, .5, .3]], rtol=1e-6)
    labels, ok = class_answers(a, 3, False)
    assert labels.tolist() == [2, 1, -1, 0] and ok.tolist() == [True, True, False, True]
