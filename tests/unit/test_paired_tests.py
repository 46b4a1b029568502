"""McNemar's exact test and the Holm / Benjamini-Hochberg adjustments
(services/common/paired_tests.py) against statsmodels, an independent implementation
(``statsmodels.stats.contingency_tables.mcnemar(exact=True)``, ``multipletests``), and against
worked examples computed by hand."""

from __future__ import annotations

import math
import random

import pytest
from fortis.services.common.paired_tests import (
    adjust,
    benjamini_hochberg,
    binomial_cdf_half,
    holm,
    mcnemar_exact,
    paired_counts,
)
from statsmodels.stats import contingency_tables as contingency  # the dev extra's reference
from statsmodels.stats import multitest


def test_mcnemar_worked_examples():
    """b = 1, c = 9: P(X <= 1) for Bin(10, 1/2) = (1 + 10) / 1024, p = 22 / 1024.
    b = c: the most likely split, p = 1. b = 0, c = 5: p = 2 / 32. Nothing discordant: p = 1."""
    assert mcnemar_exact(1, 9) == pytest.approx(22 / 1024, rel=1e-12)
    assert mcnemar_exact(9, 1) == pytest.approx(22 / 1024, rel=1e-12)
    assert mcnemar_exact(4, 4) == 1.0
    assert mcnemar_exact(0, 5) == pytest.approx(2 / 32, rel=1e-12)
    assert mcnemar_exact(0, 0) == 1.0


@pytest.mark.parametrize("b,c", [(0, 1), (1, 9), (3, 11), (17, 4), (25, 25), (60, 90),
                                 (120, 80), (1000, 1100), (5, 300), (0, 1500), (40000, 40600)])
def test_mcnemar_matches_statsmodels(b, c):
    ref = contingency.mcnemar([[100, b], [c, 100]], exact=True).pvalue
    assert mcnemar_exact(b, c) == pytest.approx(ref, rel=1e-9, abs=1e-300)


def test_binomial_cdf_half_against_exact_sum():
    for n in (1, 2, 7, 30, 101):
        for k in (-1, 0, 1, n // 3, n // 2, n - 1, n):
            exact = sum(math.comb(n, i) for i in range(0, max(k, -1) + 1)) / 2 ** n
            assert binomial_cdf_half(k, n) == pytest.approx(min(exact, 1.0), rel=1e-12)


def test_mcnemar_refuses_non_counts():
    for bad in ((-1, 3), (1.5, 2), (True, 3), (2, None)):
        with pytest.raises(ValueError, match="count"):
            mcnemar_exact(*bad)  # type: ignore[arg-type]


def test_holm_and_bh_worked_example():
    """p = (0.01, 0.04, 0.03, 0.005), m = 4. Holm: sorted 0.005 x 4 = 0.02, 0.01 x 3 = 0.03,
    0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> running max 0.06. BH: 0.005 x 4/1 = 0.02,
    0.01 x 4/2 = 0.02, 0.03 x 4/3 = 0.04, 0.04 x 4/4 = 0.04 -> running min from the top."""
    p = [0.01, 0.04, 0.03, 0.005]
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert benjamini_hochberg(p) == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert adjust(p, "none") == p
    assert holm([]) == [] and benjamini_hochberg([]) == []


def test_adjustments_match_statsmodels():
    rng = random.Random(29)
    for size in (1, 2, 5, 17, 90):
        for _ in range(6):      # statsmodels takes ~50 ms a call here
            # mixtures of small and large p-values, with ties and exact 0 / 1
            p = [rng.choice([rng.random(), rng.random() ** 6, 0.05, 1.0, 0.0])
                 for _ in range(size)]
            for method, ours in (("holm", holm), ("fdr_bh", benjamini_hochberg)):
                ref = multitest.multipletests(p, alpha=0.05, method=method)[1]
                assert ours(p) == pytest.approx(list(ref), rel=1e-12, abs=1e-15)


def test_adjust_refuses_bad_input():
    for bad in ([0.1, math.nan], [0.2, 1.5], [-0.1], ["0.1"], [True]):
        with pytest.raises(ValueError, match=r"p-value \[\d\]"):
            holm(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="family"):
        adjust([0.1], "bonferroni")


def test_paired_counts():
    n, b, c = paired_counts("1101-0", "1011-1")
    assert (n, b, c) == (5, 1, 2)     # image 4 not covered by either; '-' never pairs
    assert paired_counts("1-", "-1") == (0, 0, 0)
    with pytest.raises(ValueError, match="lengths"):
        paired_counts("10", "1")
