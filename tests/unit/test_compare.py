"""``fortis compare`` (server/cli/compare.py): the pooled two-proportion z-test
against a hand-computed example, the CI-overlap fallback, warnings when the plans or images
differ, the ordering, and the command's exit codes (through the CLI entry point)."""

from __future__ import annotations

import copy
import json
import math

import pytest
from fortis.server.cli import main
from fortis.server.cli.compare import EXIT_REGRESSION, compare_reports, two_proportion_z


def test_two_proportion_z_hand_computed():
    """A 90/100, B 80/100: pooled p = 170/200 = 0.85; SE = sqrt(0.85 * 0.15 * (1/100 + 1/100))
    = sqrt(0.00255) = 0.0504975; z = (0.80 - 0.90) / 0.0504975 = -1.98030; two-sided
    p = 2 (1 - Phi(1.98030)) = 0.047670 (normal table: Phi(1.98) = 0.97615)."""
    z, p = two_proportion_z(90, 100, 80, 100)
    assert z == pytest.approx(-1.98030, abs=1e-5)
    assert p == pytest.approx(0.047670, abs=1e-6)
    # symmetric, and no variation means nothing to test
    z2, p2 = two_proportion_z(80, 100, 90, 100)
    assert (z2, p2) == pytest.approx((-z, p))
    assert two_proportion_z(50, 50, 20, 20) == (0.0, 1.0)
    with pytest.raises(ValueError):
        two_proportion_z(0, 0, 1, 2)


def test_two_proportion_z_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for x1, n1, x2, n2 in ((45, 50, 170, 200), (3, 64, 11, 64), (500, 1000, 530, 1000)):
        z, p = two_proportion_z(x1, n1, x2, n2)
        pooled = (x1 + x2) / (n1 + n2)
        se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
        assert z == pytest.approx((x2 / n2 - x1 / n1) / se)
        assert p == pytest.approx(2 * stats.norm.sf(abs(z)), rel=1e-9)


def _rate(correct: int, m: int) -> dict:
    return {"value": correct / m, "ci95": [correct / m - 0.05, correct / m + 0.05],
            "correct": correct, "m": m}


def report(target: str = "model-a", *, acc: int = 90, fog1: int = 70, sq_succ: int = 20,
           seed: int = 1) -> dict:
    return {
        "plan": {"name": "p", "seed": seed, "target": {"name": target},
                 "dataset": {"source": "fashion-mnist", "limit": 100}},
        "target": {"name": target},
        "evaluation": {"id": f"ev-{target}", "images": 100,
                       "dataset": {"source": "fashion-mnist", "split": "test", "offset": 0,
                                   "limit": 100}},
        "metrics": {
            "accuracy": _rate(acc, 100),
            "average_robustness_corr": {"value": fog1 / 100, "ci95": None},
            "worstcase_robustness_corr": _rate(fog1 - 10, 100),
            "corruptions": {"fog": {"1": {"robustness": fog1 / 100,
                                          "ci95": [fog1 / 100 - .05, fog1 / 100 + .05],
                                          "correct": fog1, "m": 100},
                                    "mean": {"robustness": fog1 / 100, "ci95": None}}},
            "attacks": {"square": {"robustness_adv": 0.5, "ci95": [0.4, 0.6],
                                   "success_rate": sq_succ / 80,
                                   "success_rate_ci95": [sq_succ / 80 - .1, sq_succ / 80 + .1],
                                   "successes": sq_succ, "success_rate_n": 80}},
        },
    }


def test_rows_tests_and_order():
    a, b = report(), report("model-b", acc=80, fog1=71, sq_succ=40)
    result = compare_reports(a, b, family="none")   # each metric at alpha: the z-test itself
    # only the target differs; no per-image outcomes, so no paired test
    assert result["warnings"] == ["no paired test: A and B carry no per-image outcomes; the "
                                  "unpaired z-test is used"]
    rows = {r["metric"]: r for r in result["rows"]}
    acc = rows["accuracy"]
    assert acc["test"] == "two-proportion z-test"
    assert acc["difference"] == pytest.approx(-0.10)
    assert acc["p_value"] == pytest.approx(two_proportion_z(90, 100, 80, 100)[1])
    assert acc["significant"] and acc["change"] == "worse" and acc["regression"]
    # attack success rate: higher in B is worse for the defender
    sr = rows["attacks.square.success_rate"]
    assert sr["change"] == "worse" and sr["significant"] and sr["regression"]
    assert sr["a_counts"] == [20, 80] and sr["b_counts"] == [40, 80]
    # a small change is not significant
    assert not rows["corruptions.fog.1"]["significant"]
    assert rows["corruptions.fog.1"]["change"] == "better"
    # no counts, no interval: no test
    for name in ("average_robustness_corr", "corruptions.fog.mean"):
        assert rows[name]["test"] == "no test" and not rows[name]["significant"]
    # significant first, then by the size of the change
    sig = [r["significant"] for r in result["rows"]]
    assert sig == sorted(sig, reverse=True)
    sizes = [abs(r["difference"]) for r in result["rows"] if r["significant"]]
    assert sizes == sorted(sizes, reverse=True)
    assert result["regressions"] == 2


def test_ci_overlap_when_no_counts():
    a, b = report(), report("model-b", acc=60)
    for r in (a, b):
        del r["metrics"]["accuracy"]["correct"]
    rows = {r["metric"]: r for r in compare_reports(a, b, family="none")["rows"]}
    assert rows["accuracy"]["test"] == "CI overlap"
    assert rows["accuracy"]["significant"]           # [0.85, 0.95] vs [0.55, 0.65]
    b2 = report("model-b", acc=88)
    del b2["metrics"]["accuracy"]["correct"]
    rows = {r["metric"]: r for r in compare_reports(a, b2, family="none")["rows"]}
    assert rows["accuracy"]["test"] == "CI overlap" and not rows["accuracy"]["significant"]
    # an interval rule has no p-value to adjust: outside a Holm family, never flagged
    rows = {r["metric"]: r for r in compare_reports(a, b)["rows"]}
    assert not rows["accuracy"]["in_family"] and not rows["accuracy"]["significant"]


def test_warnings_when_plans_or_images_differ():
    a = report()
    b = report("model-b", seed=2)
    b["evaluation"]["dataset"]["limit"] = 50
    warnings = compare_reports(a, b)["warnings"]
    assert any("plans differ" in w and "seed" in w for w in warnings)
    assert any("image sets differ" in w for w in warnings)
    # a metric only one side has
    c = copy.deepcopy(a)
    del c["metrics"]["attacks"]
    rows = {r["metric"]: r for r in compare_reports(a, c)["rows"]}
    assert rows["attacks.square.success_rate"]["test"] == "missing in B"
    with pytest.raises(ValueError):
        compare_reports(a, b, alpha=1.5)


def test_cli_exit_codes_and_json(tmp_path, capsys):
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(report()))
    pb.write_text(json.dumps(report("model-b", acc=80)))
    assert main(["compare", str(pa), str(pb), "--family", "none"]) == 0
    table = capsys.readouterr().out
    assert "accuracy" in table and "two-proportion z-test" in table and "SIGNIFICANT" in table
    assert main(["compare", str(pa), str(pb), "--fail-on-regression",
                 "--family", "none"]) == EXIT_REGRESSION
    capsys.readouterr()
    # Holm over the family: p = 0.048 on accuracy among the 4 tested metrics does not hold
    assert main(["compare", str(pa), str(pb), "--fail-on-regression"]) == 0
    capsys.readouterr()
    assert main(["compare", str(pb), str(pa), "--fail-on-regression"]) == 0   # B better
    capsys.readouterr()
    assert main(["compare", str(pa), str(pb), "--json", "--alpha", "0.01",
                 "--family", "none"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["alpha"] == 0.01 and doc["rows"][0]["metric"] == "accuracy"
    assert not doc["rows"][0]["significant"]          # p = 0.048 > 0.01
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert main(["compare", str(pa), str(tmp_path / "bad.json")]) == 2
    assert "b: cannot read report" in capsys.readouterr().err
    assert main(["compare", str(pa), str(tmp_path / "none.json")]) == 2
    assert main(["compare", str(pa), str(pb), "--alpha", "0"]) == 2
