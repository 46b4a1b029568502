"""The verdict against a plan's acceptance criteria (services/report/verdict.py).

Policy under test: the point estimate decides pass/fail; the 95 % Wilson interval (IEEE-M8)
makes the outcome conclusive or inconclusive; averages and counts are "no_ci"; a metric the
evaluation did not produce is "missing" and fails; one that depends on a setting that
failed to run is "not_evaluated" (it fails only under --strict); ``strict_passed`` also needs
every criterion with an interval to be conclusive."""

from __future__ import annotations

import math

import pytest
from fortis.services.common.acceptance import parse_acceptance
from fortis.services.common.errors import InvalidArgument
from fortis.services.report.convert import build_report
from fortis.services.report.verdict import criteria_of_plan, report_verdict, verdict

from tests.unit.report_parts import PLAN_TEXT, make_parts


def wilson(correct: int, m: int, z: float = 1.959963984540054) -> list[float]:
    """The 95 % Wilson score interval (IEEE-M8), written out from its formula."""
    p = correct / m
    centre = (p + z * z / (2 * m)) / (1 + z * z / m)
    half = z / (1 + z * z / m) * math.sqrt(p * (1 - p) / m + z * z / (4 * m * m))
    return [centre - half, centre + half]


def rate(correct: int, m: int) -> dict:
    return {"value": correct / m, "ci95": wilson(correct, m), "correct": correct, "m": m}


def metrics() -> dict:
    """A metrics tree shaped as report.json's (services/report/metrics_tree.py)."""
    sev1, sev2 = rate(180, 200), rate(120, 200)
    return {
        "accuracy": rate(188, 200),                                   # 0.94, CI ~0.90-0.97
        "average_robustness_corr": {"value": 0.62, "ci95": None},
        "worstcase_robustness_corr": rate(30, 200),
        "corruptions": {"fog": {"1": {"robustness": sev1["value"], "ci95": sev1["ci95"]},
                                "2": {"robustness": sev2["value"], "ci95": sev2["ci95"]},
                                "mean": {"robustness": 0.75, "ci95": None}}},
        "attacks": {
            "square": {"robustness_adv": 0.55, "ci95": wilson(55, 100),
                       "success_rate": 0.40, "success_rate_ci95": wilson(36, 90),
                       "mean_queries": 120.5, "median_queries": 100.0},
            "sq.v2": {"robustness_adv": 0.7, "ci95": wilson(70, 100),
                      "success_rate": 0.25, "success_rate_ci95": wilson(20, 80)},
        },
    }


CORR, ATT = {"fog"}, {"square", "sq.v2", "hsja"}


def judge(rules: dict) -> dict:
    criteria, problems = parse_acceptance(rules, corruptions=CORR, attacks=ATT)
    assert not problems, problems
    return verdict(criteria, metrics())


def only(rules: dict) -> dict:
    v = judge(rules)
    assert len(v["criteria"]) == 1
    return v["criteria"][0]


def test_conclusive_pass_states_value_interval_and_why():
    c = only({"accuracy": ">= 0.8"})
    lo, hi = wilson(188, 200)
    assert (c["outcome"], c["confidence"]) == ("pass", "conclusive")
    assert c["value"] == pytest.approx(0.94) and c["ci95"] == pytest.approx([lo, hi])
    assert (c["metric"], c["op"], c["threshold"]) == ("accuracy", ">=", 0.8)
    assert "0.940" in c["text"] and f"{lo:.3f}-{hi:.3f}" in c["text"]
    assert "conclusive" in c["text"]


def test_inconclusive_pass_passes_but_not_strictly():
    lo, _ = wilson(188, 200)
    threshold = round((lo + 0.94) / 2, 4)           # inside the interval, below the estimate
    v = judge({"accuracy": f">= {threshold}"})
    c = v["criteria"][0]
    assert (c["outcome"], c["confidence"]) == ("pass", "inconclusive")
    assert v["status"] == "pass" and v["passed"] is True and v["strict_passed"] is False
    assert "straddles" in c["text"] and "--strict" in c["text"]


def test_conclusive_and_inconclusive_failures():
    c = only({"worstcase_robustness_corr": ">= 0.5"})          # 0.15, CI far below
    assert (c["outcome"], c["confidence"]) == ("fail", "conclusive")
    _, hi = wilson(188, 200)
    c = only({"accuracy": f">= {round((hi + 0.94) / 2, 4)}"})  # above the estimate, in the CI
    assert (c["outcome"], c["confidence"]) == ("fail", "inconclusive")
    v = judge({"accuracy": ">= 0.99"})
    assert v["status"] == "fail" and not v["passed"] and not v["strict_passed"]


def test_averages_and_counts_have_no_interval():
    c = only({"average_robustness_corr": ">= 0.6"})
    assert (c["outcome"], c["confidence"], c["ci95"]) == ("pass", "no_ci", None)
    assert "no confidence interval" in c["text"]
    c = only({"corruptions.fog.mean": ">= 0.8"})
    assert (c["outcome"], c["confidence"]) == ("fail", "no_ci")
    c = only({"attacks.square.mean_queries": "> 100"})
    assert (c["outcome"], c["confidence"], c["value"]) == ("pass", "no_ci", 120.5)
    assert "120.5" in c["text"]
    # no interval: strict changes nothing
    v = judge({"average_robustness_corr": ">= 0.6", "attacks.square.median_queries": ">= 50"})
    assert v["passed"] and v["strict_passed"]


def test_missing_metric_fails():
    v = judge({"attacks.hsja.success_rate": "<= 0.5", "accuracy": ">= 0.5"})
    missing = v["criteria"][0]
    assert (missing["outcome"], missing["confidence"], missing["value"]) == \
        ("missing", "no_ci", None)
    assert "no value" in missing["text"]
    assert v["status"] == "fail" and not v["passed"] and not v["strict_passed"]
    # a value that is not a finite number is missing too, never a crash
    bad = metrics()
    bad["accuracy"] = {"value": float("nan"), "ci95": ["x", None]}
    bad["corruptions"]["fog"]["2"] = "garbage"
    criteria, _ = parse_acceptance({"accuracy": ">= 0.5", "corruptions.fog.2": ">= 0.5"},
                                   corruptions=CORR, attacks=ATT)
    assert [c["outcome"] for c in verdict(criteria, bad)["criteria"]] == ["missing", "missing"]


def test_percent_thresholds_and_severity_criteria():
    c = only({"attacks.square.success_rate": "<= 45%"})
    assert c["threshold"] == pytest.approx(0.45)
    assert (c["outcome"], c["confidence"]) == ("pass", "inconclusive")   # 0.40, CI ~0.30-0.50
    c = only({"corruptions.fog.2": "< 70%"})
    assert c["value"] == pytest.approx(0.6) and c["outcome"] == "pass"
    assert c["ci95"] == pytest.approx(wilson(120, 200))


def test_attack_names_with_dots():
    c = only({"attacks.sq.v2.success_rate": "<= 0.5", })
    assert c["value"] == pytest.approx(0.25) and c["outcome"] == "pass"
    c = only({"attacks.sq.v2.robustness_adv": ">= 0.9"})
    assert c["value"] == pytest.approx(0.7) and c["outcome"] == "fail"


def test_boundaries_of_the_operators():
    c = only({"accuracy": ">= 0.94"})            # equal meets >=
    assert c["outcome"] == "pass"
    c = only({"accuracy": "> 0.94"})             # equal does not meet >
    assert c["outcome"] == "fail"


def test_no_criteria_passes():
    v = verdict((), metrics())
    assert v == {"status": "no_criteria", "passed": True, "strict_passed": True,
                 "not_evaluated": 0, "criteria": []}


def _failed(kind: str, name: str, level: int | None = None) -> dict:
    return {"kind": kind, "name": name, "level": level,
            "setting": f"{name}@{level}" if level is not None else name,
            "code": "INVALID_ARGUMENT", "message": "params.model: the model failed",
            "images_done": 0, "images_planned": 200}


def test_criteria_on_failed_settings_are_not_evaluated():
    """A criterion whose metric depends on a setting that failed to run is not evaluated:
    the verdict passes without --strict (status incomplete) and fails with it."""
    rules = {"accuracy": ">= 0.9", "attacks.square.success_rate": "<= 0.5",
             "attacks.sq.v2.success_rate": "<= 0.5", "corruptions.fog.2": ">= 0.5",
             "corruptions.fog.1": ">= 0.5", "corruptions.fog.mean": ">= 0.5",
             "average_robustness_adv": ">= 0.1", "average_robustness_corr": ">= 0.1"}
    criteria, problems = parse_acceptance(rules, corruptions=CORR, attacks=ATT)
    assert not problems
    failed = [_failed("query_attack", "square"), _failed("corruption", "fog", 2)]
    v = verdict(criteria, metrics(), failed)
    out = {c["metric"]: c["outcome"] for c in v["criteria"]}
    assert out == {"accuracy": "pass", "attacks.square.success_rate": "not_evaluated",
                   "attacks.sq.v2.success_rate": "pass", "corruptions.fog.2": "not_evaluated",
                   "corruptions.fog.1": "pass", "corruptions.fog.mean": "not_evaluated",
                   "average_robustness_adv": "not_evaluated",
                   "average_robustness_corr": "not_evaluated"}
    assert v["status"] == "incomplete" and v["passed"] and not v["strict_passed"]
    assert v["not_evaluated"] == 5
    text = next(c["text"] for c in v["criteria"] if c["metric"] == "corruptions.fog.2")
    assert "fog@2" in text and "INVALID_ARGUMENT" in text and "--strict" in text
    # a criterion that fails still fails the verdict, whatever else was not evaluated
    criteria, _ = parse_acceptance({**rules, "accuracy": ">= 0.99"}, corruptions=CORR,
                                   attacks=ATT)
    assert verdict(criteria, metrics(), failed)["status"] == "fail"
    # a transfer attack's failure blocks the adversarial averages, not the corruption ones
    criteria, _ = parse_acceptance({"average_robustness_corr": ">= 0.1",
                                    "worstcase_robustness_adv": ">= 0.0"},
                                   corruptions=CORR, attacks=ATT)
    v = verdict(criteria, metrics(), [_failed("transfer_attack", "hsja")])
    assert [c["outcome"] for c in v["criteria"]] == ["pass", "not_evaluated"]


def test_report_verdict_reads_the_plan_and_names_bad_criteria():
    report = {"plan": {"corruptions": ["fog"], "attacks": [{"id": "square"}],
                       "acceptance": {"accuracy": ">= 0.9"}}, "metrics": metrics()}
    assert report_verdict(report)["status"] == "pass"
    v = report_verdict(report, acceptance={"attacks.square.success_rate": "<= 0.1"})
    assert v["status"] == "fail"
    with pytest.raises(InvalidArgument) as exc:
        report_verdict(report, acceptance={"attacks.nope.success_rate": "<= 0.1",
                                           "accuracy": "~ 3"})
    fields = {v.field for v in exc.value.violations}
    assert fields == {"plan.acceptance.attacks.nope.success_rate", "plan.acceptance.accuracy"}
    with pytest.raises(InvalidArgument) as exc:
        report_verdict({"plan": "x", "metrics": {}})
    assert exc.value.violations[0].field == "plan"


def test_build_report_carries_the_verdict():
    parts = make_parts()
    parts.plan_text = PLAN_TEXT + ('acceptance: {accuracy: ">= 0.5", '
                                   'attacks.square_linf.success_rate: "<= 0.9", '
                                   'corruptions.gaussian_noise.mean: ">= 0.99"}\n')
    report = build_report(parts)
    v = report["verdict"]
    assert [c["metric"] for c in v["criteria"]] == [
        "accuracy", "attacks.square_linf.success_rate", "corruptions.gaussian_noise.mean"]
    assert v["criteria"][0]["value"] == report["metrics"]["accuracy"]["value"]
    assert v["criteria"][2]["outcome"] == "fail" and v["status"] == "fail"
    # the same verdict when re-checked offline from the report document (fortis gate)
    assert report_verdict(report) == v
    # a plan without criteria
    assert build_report(make_parts())["verdict"]["status"] == "no_criteria"


def test_build_report_names_an_invalid_criterion():
    parts = make_parts()
    parts.plan_text = PLAN_TEXT + 'acceptance: {attacks.ghost.success_rate: "<= 0.1"}\n'
    with pytest.raises(InvalidArgument) as exc:
        build_report(parts)
    assert exc.value.violations[0].field == \
        "parts.plan_text.acceptance.attacks.ghost.success_rate"


def test_criteria_of_plan_knows_plan_names():
    plan = {"corruptions": [{"id": "fog"}, "contrast"],
            "attacks": [{"id": "square", "name": "sq.fast"}, {"id": "fgsm"}],
            "acceptance": {"corruptions.contrast.5": ">= 0.1",
                           "attacks.sq.fast.success_rate": "<= 0.5",
                           "attacks.fgsm.robustness_adv": ">= 0.1"}}
    assert [c.setting for c in criteria_of_plan(plan)] == ["contrast", "sq.fast", "fgsm"]


def _seq(metric: str, interval: list[float], images: int = 64) -> dict:
    return {"criteria": [{"metric": metric, "op": ">=", "threshold": 0.5, "outcome": "pass",
                          "images": images, "population": 200, "estimate": 0.6,
                          "interval": interval}]}


def test_a_sequential_criterion_is_judged_on_its_time_uniform_interval():
    """A sequential criterion stops where its confidence sequence cleared the threshold;
    the Wilson interval of the images seen would not cover at that data-chosen time, so the
    verdict shows and judges the time-uniform one."""
    crit, _ = parse_acceptance({"sequential": True, "average_robustness_corr": ">= 0.5",
                                "accuracy": ">= 0.9"}, corruptions=(), attacks=())
    v = verdict(crit, metrics(), sequential=_seq("average_robustness_corr", [0.52, 0.7]))
    avg = v["criteria"][0]
    assert avg["ci95"] == [0.52, 0.7] and avg["interval"] == "time-uniform"
    assert avg["confidence"] == "conclusive" and avg["outcome"] == "pass"
    assert "64 of 200 images (sequential)" in avg["text"]
    # accuracy has no entry in the record: judged as before, on its Wilson interval
    assert v["criteria"][1]["ci95"] == wilson(188, 200) and "interval" not in v["criteria"][1]
    # a straddling interval: the point estimate decides, inconclusive
    v = verdict(crit, metrics(), sequential=_seq("average_robustness_corr", [0.45, 0.7]))
    assert v["criteria"][0]["outcome"] == "pass"
    assert v["criteria"][0]["confidence"] == "inconclusive" and not v["strict_passed"]
    # a conclusive interval decides by its side even where the estimate sits outside it
    v = verdict(crit, {**metrics(), "average_robustness_corr": {"value": 0.49, "ci95": None}},
                sequential=_seq("average_robustness_corr", [0.51, 0.7]))
    assert v["criteria"][0]["outcome"] == "pass"


def test_fortis_gate_rechecks_a_sequential_report_with_its_intervals():
    crit = {"sequential": True, "average_robustness_corr": ">= 0.5"}
    report = {"plan": {"acceptance": crit}, "metrics": metrics(),
              "sequential": _seq("average_robustness_corr", [0.3, 0.45])}
    v = report_verdict(report)
    (c,) = v["criteria"]
    assert c["ci95"] == [0.3, 0.45] and c["outcome"] == "fail" and v["status"] == "fail"
    # a hostile record (not a mapping, bad intervals) falls back to the plain rule
    for bad in ("x", {"criteria": "x"}, {"criteria": [{"metric": "average_robustness_corr",
                                                        "interval": [float("nan"), 1]}]}):
        v = report_verdict({**report, "sequential": bad})
        assert v["criteria"][0]["outcome"] == "pass"       # 0.62 >= 0.5, no interval
