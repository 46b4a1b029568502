"""Per-property robustness statistics (PER-4, seed 004 III-A) of the scoring service, over
recorded PertKnob results. The search (PER-2 criteria, PER-3) moved to the perturbation
service; its tests are ``test_pertknob_search.py``."""

from __future__ import annotations

import pytest
from fortis.services.scoring.pertknob import SearchRecord, property_robustness

# ------------------------------------------------------------- PER-4: robustness statistics --


def _res(status: str, l2: float | None) -> SearchRecord:
    return SearchRecord(status=status, epsilon=None, l2=l2, queries=10)


def test_property_robustness_statistics() -> None:
    results = [_res("found", 1.0), _res("found", 2.0), _res("found", 6.0),
               _res("never_fooled", None), _res("already_met", 0.0),
               _res("budget_exhausted", None)]
    s = property_robustness(results)
    assert s.n_images == 6 and s.n_found == 3 and s.n_never_fooled == 1
    assert s.n_already_met == 1 and s.n_undetermined == 1
    assert s.mean_l2 == pytest.approx(3.0) and s.median_l2 == pytest.approx(2.0)
    assert s.never_fooled_share == pytest.approx(1 / 4)
    assert s.threshold == pytest.approx(3.0) and s.threshold_source == "mean_l2"
    assert s.fooling_rate == pytest.approx(2 / 4)                # l2 < T among decided images
    t = property_robustness(results, threshold=10.0)
    assert t.fooling_rate == pytest.approx(3 / 4) and t.threshold_source == "given"
    empty = property_robustness([_res("never_fooled", None)])
    assert empty.mean_l2 is None and empty.never_fooled_share == 1.0 and empty.fooling_rate is None


def test_a_search_cut_by_the_budget_after_a_hit_counts_as_fooled() -> None:
    """PER-3: the budget ran out after the criterion was met; the image at the smallest
    epsilon seen to fool does fool the target, its L2 an upper bound of the minimal one."""
    s = property_robustness([_res("found", 1.0), _res("budget_exhausted", 3.0),
                             _res("budget_exhausted", None), _res("never_fooled", None)])
    assert s.n_found == 2 and s.n_upper_bound == 1 and s.n_undetermined == 1
    assert s.mean_l2 == pytest.approx(2.0) and s.never_fooled_share == pytest.approx(1 / 3)




def test_the_search_result_is_read_as_recorded() -> None:
    """The perturbation service's KnobResult and the Compute entry's rows are read alike: only
    status, l2 and queries matter (the services share no types, only this shape)."""
    from fortis.services.scoring.catalogue import METRICS
    rows = [{"status": "found", "l2": 1.0, "queries": 4}, {"status": "never_fooled", "queries": 12}]
    out = METRICS["pertknob.robustness"].run({}, {"results": rows})
    assert out["n_found"] == 1 and out["never_fooled_share"] == pytest.approx(0.5)
    assert out["mean_queries"] == pytest.approx(8.0)
