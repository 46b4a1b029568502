"""NDCG per rank position and DRR_k of Brama, Dery and Grinshpoun (seed 002): RANK-1..RANK-3.

The seed's Table I (toy poodle; benign, FGSM and targeted CW outputs; gamma_b = 0.01,
gamma_a = 0.001) is reproduced within 0.002 at every listed position, and its DRR worked example
(rank 2, p = 0.428 -> 0.476) exactly. The seed gives only the top of each output, so the
1000-class vectors below are built to match everything it states:

* benign pre-softmax outputs, sorted: 20.328, 19.829, 14.286, ..., -6.023 (section IV-A);
  benign top-5 probabilities 0.62, 0.37, 0.001, 0.0004, 3.69e-05 (Table I);
* FGSM top-5: 'miniature poodle' 0.566, 'toy poodle' 0.428, 'standard poodle' 0.004,
  'cocker spaniel' 0.0004, 'Irish water spaniel' 6.42e-05;
* CW top-5: 'snowmobile', 'Ches. Bay retriever', 'hyena', 'miniature poodle', 'jeep', all
  0.005; 'toy poodle' at position 11 (Table I's relevance row); k2 = 613 classes >= 0.001.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.ieee import ClassPrediction
from fortis.services.scoring.ranking import (
    drr,
    drr_batch,
    ndcg,
    ndcg_batch,
    prediction_arrays,
    rank_of_class,
)

C = 1000
TOY, MINI, STANDARD, COCKER, SEATBELT, IRISH, SNOWMOBILE, CHESAPEAKE, HYENA, JEEP = range(10)

# ---- Table I, transcribed (rows: benign e_b, FGSM e_a1, CW e_a2; positions @1..@12) ----------
TABLE_RELEVANCE = {
    "benign": [0.505, 0.495] + [0.0] * 10,
    "fgsm": [0.495, 0.505] + [0.0] * 10,
    "cw": [0.0, 0.0, 0.0, 0.495] + [0.0] * 6 + [0.505, 0.0],
}
TABLE_DCG = {
    "benign": [0.419] + [0.677] * 11,
    "fgsm": [0.409] + [0.674] * 11,
    "cw": [0.0, 0.0, 0.0] + [0.176] * 7 + [0.293, 0.293],
}
TABLE_NDCG = {
    "benign": [1.0] * 12,
    "fgsm": [0.977] + [0.995] * 11,
    "cw": [0.0, 0.0, 0.0] + [0.260] * 7 + [0.433, 0.433],
}
TABLE_K = {"benign": 2, "fgsm": 2, "cw": 613}


def benign_logits() -> np.ndarray:
    """Section IV-A: sorted pre-softmax outputs 20.328, 19.829, 14.286, ..., -6.023. The 4th and
    5th are placed where Table I's probabilities put them (0.0004, 3.69e-05 against 0.62)."""
    top = [20.328, 19.829, 14.286, 20.328 + math.log(0.0004 / 0.62),
           20.328 + math.log(3.69e-05 / 0.62)]
    rest = np.linspace(10.0, -6.023, C - len(top))
    return np.concatenate([top, rest])


def table_benign_probs() -> np.ndarray:
    """Table I's benign probabilities as printed; the other 995 classes share the rest."""
    top = np.array([0.62, 0.37, 0.001, 0.0004, 3.69e-05])
    rest = np.linspace(2.0, 1.0, C - 5)
    return np.concatenate([top, rest / rest.sum() * (1.0 - top.sum())])


def fgsm_probs() -> np.ndarray:
    p = np.zeros(C)
    p[[MINI, TOY, STANDARD, COCKER, IRISH]] = [0.566, 0.428, 0.004, 0.0004, 6.42e-05]
    others = [j for j in range(C) if p[j] == 0.0]
    rest = np.geomspace(5e-5, 1e-7, len(others))
    p[others] = rest / rest.sum() * (1.0 - p.sum())
    return p


def cw_probs() -> np.ndarray:
    """Top 5 at 0.005 (printed), strictly decreasing so the order is the printed one; 'toy
    poodle' 11th; 613 classes >= gamma_a = 0.001 in all; the mass sums to 1."""
    p = np.full(C, np.nan)
    first = [SNOWMOBILE, CHESAPEAKE, HYENA, MINI, JEEP, 10, 11, 12, 13, 14, TOY]
    p[first] = 0.00504 - 0.00001 * np.arange(len(first))
    middle = [j for j in range(C) if np.isnan(p[j])][: 613 - len(first)]
    p[middle] = np.linspace(0.0012, 0.001, len(middle))
    tail = [j for j in range(C) if np.isnan(p[j])]
    rest = np.linspace(0.00095, 0.0005, len(tail))
    p[tail] = rest / rest.sum() * (1.0 - np.nansum(p))
    return p


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class TestFixtureMatchesTheSeed:
    def test_benign_outputs(self) -> None:
        lb = benign_logits()
        assert lb.max() == 20.328 and lb.min() == -6.023 and np.argmax(lb) == TOY
        pb = softmax(lb)
        # the seed prints 0.62 / 0.37 (rounded from the full 1000-class softmax)
        assert pb[TOY] == pytest.approx(0.62, abs=0.005)
        assert pb[MINI] == pytest.approx(0.37, abs=0.01)
        assert (pb >= 0.01).sum() == 2

    def test_perturbed_outputs(self) -> None:
        fg, cw = fgsm_probs(), cw_probs()
        assert fg.sum() == pytest.approx(1.0) and cw.sum() == pytest.approx(1.0)
        assert list(np.argsort(-fg, kind="stable")[:5]) == [MINI, TOY, STANDARD, COCKER, IRISH]
        assert list(np.argsort(-cw, kind="stable")[:5]) == [SNOWMOBILE, CHESAPEAKE, HYENA, MINI,
                                                            JEEP]
        assert np.round(cw[[SNOWMOBILE, CHESAPEAKE, HYENA, MINI, JEEP]], 3).tolist() == [0.005] * 5
        assert (cw >= 0.001).sum() == 613


# ---------------------------------------------------------------- RANK-1: Table I -----------


def table_rows(benign_probs: np.ndarray | None) -> dict[str, dict]:
    lb = benign_logits()
    pb = softmax(lb) if benign_probs is None else benign_probs
    return {name: ndcg(pa, benign_logits=lb, benign_probs=benign_probs, gamma_b=0.01,
                       gamma_a=0.001, positions=12)
            for name, pa in (("benign", pb), ("fgsm", fgsm_probs()), ("cw", cw_probs()))}


@pytest.mark.parametrize("probs", ["softmax_of_logits", "printed"])
class TestTableI:
    """RANK-1: Table I agrees within 0.002 at every listed position (it is rounded to 3)."""

    def rows(self, probs: str) -> dict[str, dict]:
        return table_rows(None if probs == "softmax_of_logits" else table_benign_probs())

    def test_ndcg_every_position(self, probs: str) -> None:
        for name, r in self.rows(probs).items():
            assert r["applicable"]
            assert len(r["ndcg_at"]) == 12
            for i, (ours, seed) in enumerate(zip(r["ndcg_at"], TABLE_NDCG[name], strict=True)):
                assert abs(ours - seed) <= 0.002, (name, i + 1, ours, seed)
            assert r["ndcg_1"] == r["ndcg_at"][0]

    def test_dcg_and_relevance_rows(self, probs: str) -> None:
        for name, r in self.rows(probs).items():
            for key, table in (("dcg_at", TABLE_DCG), ("relevance_at", TABLE_RELEVANCE)):
                for i, (ours, seed) in enumerate(zip(r[key], table[name], strict=True)):
                    assert abs(ours - seed) <= 0.002, (name, key, i + 1, ours, seed)
            assert r["benign_dcg_at"] == pytest.approx(r["dcg_at"] if name == "benign"
                                                       else self.rows(probs)["benign"]["dcg_at"])

    def test_k1_and_k2(self, probs: str) -> None:
        rows = self.rows(probs)
        assert rows["benign"]["k1"] == TABLE_K["benign"]
        assert rows["cw"]["k2"] == TABLE_K["cw"]
        # The seed prints k2 = 2 for FGSM, but its own list has 'standard poodle' at 0.004 >=
        # gamma_a = 0.001, so the definition gives k2 = 3. That class has benign relevance 0,
        # so the NDCG values are unaffected (checked above).
        assert rows["fgsm"]["k2"] == 3

    def test_eq6_whole_list(self, probs: str) -> None:
        rows = self.rows(probs)
        assert rows["benign"]["ndcg_k2"] == pytest.approx(1.0)
        assert rows["fgsm"]["ndcg_k2"] == pytest.approx(0.995, abs=0.002)
        assert rows["cw"]["ndcg_k2"] == pytest.approx(0.433, abs=0.002)


def test_relevance_from_the_seeds_worked_numbers() -> None:
    """Section IV-A: 20.328 and 19.829 over the range down to -6.023 -> 1 and 0.98, normalised
    -> 0.505 / 0.495 (the text truncates the first to 0.504)."""
    r = table_rows(None)["benign"]
    hi, lo = 20.328, -6.023
    a, b = 1.0, (19.829 - lo) / (hi - lo)
    assert b == pytest.approx(0.98, abs=0.005)
    assert r["benign_relevance_at"][:2] == pytest.approx([a / (a + b), b / (a + b)])


def test_log_probabilities_give_the_same_relevance_as_logits() -> None:
    """RANK-1: without logits, log(p) is used; exact for a softmax (any temperature)."""
    lb = benign_logits()
    for temperature in (1.0, 2.5):
        pb = softmax(lb / temperature)
        for pa in (fgsm_probs(), cw_probs()):
            with_logits = ndcg(pa, benign_logits=lb, benign_probs=pb, positions=12)
            from_probs = ndcg(pa, benign_probs=pb, positions=12)
            assert from_probs["ndcg_at"] == pytest.approx(with_logits["ndcg_at"], abs=1e-9)


# ---------------------------------------------------------------- RANK-1: edge cases --------


def test_identical_benign_and_perturbed_is_one() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, size=(50, 100))
    probs = softmax(logits)
    out = ndcg_batch(probs, benign_logits=logits, positions=20)
    assert out["applicable"] and out["m_applicable"] == 50
    assert np.allclose(np.array(out["per_image"]["ndcg_at"], dtype=float), 1.0)
    assert out["mean"]["ndcg_1"] == pytest.approx(1.0)
    assert out["mean"]["ndcg_k2"] == pytest.approx(1.0)


def test_entirely_wrong_top_classes_score_zero() -> None:
    """Seed IV-B: high confidence on entirely wrong classes -> the perturbed list is all zeros."""
    lb = benign_logits()
    pa = np.full(C, 0.0)
    pa[[500, 501, 502]] = [0.6, 0.3, 0.1]  # benign relevance 0; everything else < gamma_a
    r = ndcg(pa, benign_logits=lb, positions=5)
    assert r["ndcg_at"] == [0.0] * 5 and r["ndcg_k2"] == 0.0 and r["k2"] == 3


def test_batch_equals_per_image() -> None:
    rng = np.random.default_rng(1)
    m, c = 64, 37
    logits = rng.normal(0, 4, size=(m, c))
    pb = softmax(logits)
    pa = softmax(logits + rng.normal(0, 3, size=(m, c)))
    out = ndcg_batch(pa, benign_logits=logits, gamma_b=0.05, gamma_a=0.01, positions=8)
    for i in range(m):
        one = ndcg(pa[i], benign_logits=logits[i], benign_probs=pb[i], gamma_b=0.05,
                   gamma_a=0.01, positions=8)
        assert out["per_image"]["ndcg_at"][i] == pytest.approx(one["ndcg_at"], abs=1e-12)
        assert out["per_image"]["ndcg_k2"][i] == pytest.approx(one["ndcg_k2"], abs=1e-12)
        assert (out["per_image"]["k1"][i], out["per_image"]["k2"][i]) == (one["k1"], one["k2"])
    means = np.array(out["per_image"]["ndcg_at"], dtype=float).mean(axis=0)
    assert out["mean"]["ndcg_at"] == pytest.approx(means.tolist())
    json.dumps(out)


def _same(a: dict, b: dict) -> None:
    """Equal trees up to float rounding (1e-12)."""
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            _same(a[key], b[key])
        elif isinstance(a[key], list) and a[key] and not isinstance(a[key][0], str | None):
            x, y = np.array(a[key], dtype=float), np.array(b[key], dtype=float)
            assert np.allclose(x, y, atol=1e-12, rtol=0, equal_nan=True), key
        else:
            assert a[key] == b[key], key


def test_blocks_and_position_strategies_do_not_change_results(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows are processed in bounded blocks for large M, and class positions are found by
    counting comparisons, sort + binary search or a stable argsort depending on how many
    classes are relevant: same results, ties and top-k (NaN) rows included (probabilities are
    quantised so that many are equal)."""
    from fortis.services.scoring.ranking import ranks
    rng = np.random.default_rng(2)
    logits = np.round(rng.normal(0, 2, size=(40, 20)), 1)
    pb = np.round(softmax(logits), 2)
    pa = np.round(softmax(logits + rng.normal(0, 2, size=(40, 20))), 2)
    for i in range(0, 40, 5):  # some top-k rows: the classes past the top 6 not returned
        pa[i, np.argsort(-pa[i], kind="stable")[6:]] = np.nan
    cls = rng.integers(0, 20, size=40)

    def run() -> tuple[dict, dict, tuple]:
        return (ndcg_batch(pa, benign_logits=logits, benign_probs=pb, gamma_b=0.02,
                           gamma_a=0.0, positions=20),
                drr_batch(pa, cls, k=20), rank_of_class(pa, cls))

    whole_n, whole_d, whole_r = run()
    for block, compare_max, search_max in ((7 * 20, 4096, 32), (10**9, 0, 10**9),
                                           (3 * 20, 0, 10**9), (10**9, 10**9, 0),
                                           (3 * 20, 0, 0)):
        monkeypatch.setattr(ranks, "_BLOCK_ELEMENTS", block)
        monkeypatch.setattr(ranks, "_COMPARE_MAX_WORK", compare_max)
        monkeypatch.setattr(ranks, "_SEARCH_MAX_K", search_max)
        n, d, r = run()
        _same(n, whole_n)
        _same(d, whole_d)
        assert all(np.array_equal(x, y) for x, y in zip(r, whole_r, strict=True))


def test_positions_match_a_stable_sort() -> None:
    """The tie rule: descending probability, equal probabilities by class index."""
    rng = np.random.default_rng(5)
    p = np.round(rng.random((50, 12)), 1)
    order = np.argsort(-p, axis=1, kind="stable")
    for i in range(50):
        ranks, found, n = rank_of_class(p[[i] * 12], np.arange(12))
        assert found.all() and (n == 12).all()
        assert [int(np.where(order[i] == c)[0][0]) for c in range(12)] == ranks.tolist()


def test_thresholds_set_k1_and_k2() -> None:
    lb = np.array([5.0, 4.0, 3.0, 0.0])
    pb = softmax(lb)  # 0.64, 0.24, 0.09, 0.004
    assert ndcg(pb, benign_logits=lb, gamma_b=0.05)["k1"] == 3
    assert ndcg(pb, benign_logits=lb, gamma_b=0.5)["k1"] == 1
    assert ndcg(pb, benign_logits=lb, gamma_b=0.05, max_k1=2)["k1"] == 2
    assert ndcg(pb, benign_logits=lb, gamma_a=0.1)["k2"] == 2
    assert ndcg(pb, benign_logits=lb, gamma_a=0.0, max_k2=3)["k2"] == 3
    # positions are clamped to C
    assert len(ndcg(pb, benign_logits=lb, positions=12)["ndcg_at"]) == 4


def test_hand_computed_small_case() -> None:
    """C = 4: benign logits 3, 2, 1, 0 -> rescaled 1, 2/3, 1/3, 0; with gamma_b keeping 2
    classes the relevances are 0.6, 0.4. Perturbed order 1, 0, 2, 3."""
    lb = np.array([3.0, 2.0, 1.0, 0.0])
    pb = np.array([0.5, 0.3, 0.15, 0.05])
    pa = np.array([0.3, 0.5, 0.15, 0.05])
    r = ndcg(pa, benign_logits=lb, benign_probs=pb, gamma_b=0.2, gamma_a=0.0, positions=4)
    g = lambda rel, i: (2 ** rel - 1) / math.log2(1 + i)  # noqa: E731
    ideal = [g(0.6, 1), g(0.6, 1) + g(0.4, 2)]
    got = [g(0.4, 1), g(0.4, 1) + g(0.6, 2)]
    assert r["k1"] == 2
    assert r["ndcg_at"] == pytest.approx([got[0] / ideal[0]] + [got[1] / ideal[1]] * 3)


# ---------------------------------------------------------------- RANK-3: no scores ---------


class TestNotApplicable:
    def test_labels_only_target(self) -> None:
        r = ndcg_batch(None, benign_logits=np.zeros((3, 5)))
        assert r["applicable"] is False and "labels only" in r["reason"]
        assert r["mean"]["ndcg_1"] is None and r["per_image"] is None
        d = drr_batch(None, [0, 1, 2])
        assert d["applicable"] is False and d["mean"]["drr"] is None
        assert ndcg(None, benign_logits=np.zeros(5))["ndcg_1"] is None
        assert drr(None, 0)["drr"] is None
        json.dumps([r, d])

    def test_no_benign_scores(self) -> None:
        r = ndcg_batch(np.full((2, 3), 1 / 3))
        assert r["applicable"] is False and "benign" in r["reason"]

    def test_topk_benign_without_logits_is_not_applicable(self) -> None:
        pb = np.array([[0.7, 0.2, np.nan, np.nan], [0.7, 0.2, 0.1, 0.0],
                       [0.7, 0.2, 0.06, 0.04]])
        pa = np.array([[0.6, 0.3, 0.05, 0.05]] * 3)
        r = ndcg_batch(pa, benign_probs=pb)
        assert r["per_image"]["ndcg_1"][:2] == [None, None]
        assert "not returned" in r["per_image"]["reason"][0]
        assert "contain 0" in r["per_image"]["reason"][1]
        assert r["per_image"]["ndcg_1"][2] == pytest.approx(1.0)
        assert r["m_applicable"] == 1 and r["mean"]["ndcg_1"] == pytest.approx(1.0)

    def test_no_image_applicable_gives_none_not_zero(self) -> None:
        r = ndcg_batch(np.full((2, 3), 1 / 3), benign_probs=np.full((2, 3), np.nan))
        assert r["applicable"] is False and r["mean"]["ndcg_1"] is None
        assert r["mean"]["ndcg_at"] == [None] * 3

    def test_constant_benign_and_k1_zero(self) -> None:
        pa = np.full((1, 4), 0.25)
        r = ndcg_batch(pa, benign_logits=np.zeros((1, 4)))
        assert "equal" in r["per_image"]["reason"][0]
        flat = np.log(np.full((1, 200), 1 / 200) + np.linspace(0, 1e-4, 200))  # all p < 0.01
        r = ndcg_batch(np.full((1, 200), 1 / 200), benign_logits=flat)
        assert "k1 = 0" in r["per_image"]["reason"][0]


class TestTopKPerturbed:
    """RANK-1 with a top-k perturbed output: positions past the returned list are known only
    when the last returned probability is already below gamma_a."""

    def test_positions_past_the_list_unknown(self) -> None:
        lb = benign_logits()
        full = ndcg(fgsm_probs(), benign_logits=lb, positions=12)
        pa = np.full(C, np.nan)
        pa[[MINI, TOY]] = [0.566, 0.428]  # top-2, both >= gamma_a
        r = ndcg(pa, benign_logits=lb, positions=12)
        assert r["ndcg_at"][:2] == pytest.approx(full["ndcg_at"][:2])
        assert r["ndcg_at"][2:] == [None] * 10 and r["ndcg_k2"] is None

    def test_known_when_last_returned_is_below_gamma_a(self) -> None:
        lb = benign_logits()
        full = ndcg(fgsm_probs(), benign_logits=lb, positions=12)
        pa = np.full(C, np.nan)
        pa[[MINI, TOY, STANDARD, COCKER, IRISH]] = [0.566, 0.428, 0.004, 0.0004, 6.42e-05]
        r = ndcg(pa, benign_logits=lb, positions=12)
        assert r["ndcg_at"] == pytest.approx(full["ndcg_at"])
        assert r["ndcg_k2"] == pytest.approx(full["ndcg_k2"])


# ---------------------------------------------------------------- RANK-2: DRR ---------------


class TestDRR:
    def test_seed_worked_example(self) -> None:
        """Rank 2, p = 0.428 -> 0.428/3 + 1/3 = 0.476; the CW example (rank 11) -> 0."""
        r = drr(fgsm_probs(), TOY, k=5)
        assert r["rank"] == 2 and r["probability"] == pytest.approx(0.428)
        assert r["drr"] == pytest.approx(0.428 / 3 + 1 / 3)
        assert round(r["drr"], 3) == 0.476
        cw = drr(cw_probs(), TOY)
        assert cw["rank"] == 11 and cw["drr"] == 0.0 and cw["applicable"]

    def test_top1_and_bounds(self) -> None:
        p = np.array([0.9, 0.05, 0.05])
        assert drr(p, 0)["drr"] == pytest.approx(0.95)
        assert drr(np.array([1.0, 0.0, 0.0]), 0)["drr"] == 1.0
        # at rank R with p <= 1/R, DRR lies in [1/(R+1), 1/R]
        rng = np.random.default_rng(3)
        probs = softmax(rng.normal(0, 2, size=(200, 10)))
        cls = rng.integers(0, 10, size=200)
        d = drr_batch(probs, cls, k=10)
        for v, rk in zip(d["per_image"]["drr"], d["per_image"]["rank"], strict=True):
            assert 1 / (rk + 1) - 1e-12 <= v <= 1 / rk + 1e-12

    def test_benign_class_out_of_top_k_is_zero(self) -> None:
        p = np.array([0.3, 0.25, 0.2, 0.1, 0.08, 0.07])
        assert drr(p, 4, k=5)["drr"] == pytest.approx(1.08 / 6)  # rank 5 is within top 5
        r = drr(p, 5, k=5)
        assert r["rank"] == 6 and r["drr"] == 0.0 and r["applicable"]
        assert drr(p, 5, k=6)["drr"] == pytest.approx(1.07 / 7)

    def test_ties_break_by_class_index(self) -> None:
        p = np.array([0.25, 0.25, 0.25, 0.25])
        assert [drr(p, c)["rank"] for c in range(4)] == [1, 2, 3, 4]
        rank, found, n = rank_of_class(p[None, :], [2])
        assert rank.tolist() == [2] and found.tolist() == [True] and n.tolist() == [4]

    def test_topk_target(self) -> None:
        p = np.full(10, np.nan)
        p[[3, 7, 1, 0, 9]] = [0.5, 0.2, 0.1, 0.05, 0.04]
        assert drr(p, 1)["drr"] == pytest.approx(1.1 / 4)
        r = drr(p, 5, k=5)  # not in the returned top-5 -> rank > 5 -> 0, exactly
        assert r["applicable"] and r["drr"] == 0.0 and r["rank"] is None
        r = drr(p, 5, k=6)  # only 5 returned: rank could be 6 -> unknown
        assert not r["applicable"] and r["drr"] is None and "unknown" in r["reason"]

    def test_batch_equals_per_image_and_mean(self) -> None:
        rng = np.random.default_rng(4)
        probs = softmax(rng.normal(0, 2, size=(100, 30)))
        cls = rng.integers(0, 30, size=100)
        d = drr_batch(probs, cls)
        singles = [drr(probs[i], int(cls[i]))["drr"] for i in range(100)]
        assert d["per_image"]["drr"] == pytest.approx(singles, abs=1e-15)
        assert d["mean"]["drr"] == pytest.approx(float(np.mean(singles)))
        assert d["m"] == 100 and d["m_applicable"] == 100
        json.dumps(d)

    def test_mean_skips_not_applicable_images(self) -> None:
        p = np.array([[0.6, 0.4, np.nan], [np.nan] * 3])
        d = drr_batch(p, [1, 0])
        assert d["per_image"]["drr"][1] is None and d["m_applicable"] == 1
        assert d["mean"]["drr"] == pytest.approx(1.4 / 3)


# ---------------------------------------------------------------- helpers and validation ----


def test_prediction_arrays_from_class_predictions() -> None:
    preds = [ClassPrediction(labels=(2, 0), scores=(0.7, 0.2)),
             ClassPrediction(labels=(1,), scores=(0.9,)),
             ClassPrediction(labels=(), scores=None, error="timeout")]
    labels, scores = prediction_arrays(preds, 4)
    assert labels.tolist() == [[2, 0], [1, -1], [-1, -1]]
    assert scores is not None
    assert np.array_equal(scores, np.array([[0.2, np.nan, 0.7, np.nan],
                                            [np.nan, 0.9, np.nan, np.nan],
                                            [np.nan] * 4]), equal_nan=True)
    labels_only, none = prediction_arrays([ClassPrediction(labels=(3,), scores=None)], 4)
    assert none is None and labels_only.tolist() == [[3]]
    with pytest.raises(InvalidArgument) as e:
        prediction_arrays([ClassPrediction(labels=(9,), scores=None)], 4)
    assert e.value.violations[0].field == "predictions[0].labels"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"perturbed_probs": np.ones(3)}, "perturbed_probs"),
    ({"perturbed_probs": np.full((1, 3), 1.5)}, "perturbed_probs"),
    ({"perturbed_probs": np.full((1, 3), 0.3), "benign_logits": np.ones((1, 4))}, "benign_logits"),
    ({"perturbed_probs": np.full((1, 3), 0.3), "benign_logits": np.array([[1, np.inf, 0]])},
     "benign_logits"),
    ({"perturbed_probs": np.full((1, 3), 0.3), "benign_logits": np.ones((1, 3)),
      "gamma_b": 2.0}, "gamma_b"),
    ({"perturbed_probs": np.full((1, 3), 0.3), "benign_logits": np.ones((1, 3)),
      "positions": 0}, "positions"),
])
def test_ndcg_validation_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        ndcg_batch(**kwargs)
    assert e.value.violations[0].field == field


def test_drr_validation_names_the_field() -> None:
    for cls, k in (([5], 5), ([0, 1], 5), ([0.5], 5), ([0], 0)):
        with pytest.raises(InvalidArgument) as e:
            drr_batch(np.full((1, 3), 0.3), cls, k=k)
        assert e.value.violations[0].field == ("k" if k == 0 else "benign_class")
