"""``fortis compare`` (server/cli/compare.py): the pooled two-proportion z-test
against a hand-computed example, the CI-overlap fallback, warnings when the plans or images
differ, the ordering, and the command's exit codes (through the CLI entry point)."""

from __future__ import annotations

import copy
import json
import math
import random

import pytest
from fortis.server.cli import main
from fortis.server.cli.compare import EXIT_REGRESSION, compare_reports, two_proportion_z
from statsmodels.stats import contingency_tables as contingency  # the dev extra's reference
from statsmodels.stats import multitest


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


def test_a_sequential_run_is_named_in_the_warnings():
    """A sequential run's stopped settings are over their first images only: said, so a
    reader does not take the two values for the same images'."""
    a, b = report(), report("model-b")
    b["sequential"] = {"settings": [{"setting": "fog@1", "stopped_early": True},
                                    {"setting": "square", "stopped_early": False}]}
    warnings = compare_reports(a, b)["warnings"]
    assert any(w.startswith("B is a sequential run: 1 setting(s)") and "fog@1" in w
               and "square" not in w for w in warnings), warnings
    for hostile in ("x", {"settings": "x"}, {"settings": [None, {"stopped_early": "yes"}]}):
        b["sequential"] = hostile
        assert not any("sequential" in w for w in compare_reports(a, b)["warnings"])


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


# -- the paired test on per-image outcomes -------------------------------------------------

def _rate_of(s: str) -> dict:
    ones, n = s.count("1"), s.count("1") + s.count("0")
    return {"value": ones / n, "ci95": [0.0, 1.0], "correct": ones, "m": n}


def outcome_report(target: str, ids: list[str], clean: str, fog1: str, sq: str) -> dict:
    """A report whose metrics are exactly what its outcomes count."""
    worst = _rate_of(fog1)
    attacked = [i for i, (c, a) in enumerate(zip(clean, sq, strict=True)) if c == "1" and a != "-"]
    succ = sum(sq[i] == "0" for i in attacked)
    return {
        "plan": {"name": "p", "seed": 1, "target": {"name": target},
                 "acceptance": {"accuracy": ">= 0.5", "attacks.square.success_rate": "<= 0.9"}},
        "target": {"name": target},
        "evaluation": {"id": f"ev-{target}", "images": len(ids), "dataset": {"limit": len(ids)}},
        "metrics": {
            "accuracy": _rate_of(clean),
            "worstcase_robustness_corr": worst,
            "corruptions": {"fog": {"1": {**_rate_of(fog1), "robustness": worst["value"]}}},
            "attacks": {"square": {"robustness_adv": _rate_of(sq)["value"], "ci95": [0, 1],
                                   "correct": sq.count("1"), "m": len(sq) - sq.count("-"),
                                   "success_rate": succ / len(attacked),
                                   "success_rate_ci95": [0, 1], "successes": succ,
                                   "success_rate_n": len(attacked)}},
        },
        "outcomes": {"image_ids": ids, "settings": [
            {"kind": "clean", "name": "", "level": 0, "outcomes": clean},
            {"kind": "corruption", "name": "fog", "level": 1, "outcomes": fog1},
            {"kind": "query_attack", "name": "square", "level": 0, "outcomes": sq}]},
    }


def _strings(seed: int, n: int, flips: float) -> tuple[str, str, str, str, str, str]:
    rng = random.Random(seed)
    a = [rng.random() < 0.8 for _ in range(n)]
    b = [x if rng.random() > flips else not x for x in a]
    fa = [x and rng.random() < 0.8 for x in a]
    fb = [x and y and rng.random() < 0.85 for x, y in zip(fa, b, strict=True)]   # B is worse under fog
    sa = [x and rng.random() < 0.6 if i < n // 2 else None for i, x in enumerate(a)]
    sb = [x and rng.random() < 0.6 if i < n // 2 else None for i, x in enumerate(b)]

    def enc(v: list) -> str:
        return "".join("-" if x is None else "1" if x else "0" for x in v)
    return enc(a), enc(b), enc(fa), enc(fb), enc(sa), enc(sb)


def test_paired_mcnemar_recomputed_and_holm():
    ids = [f"img-{i}" for i in range(400)]
    ca, cb, fa, fb, sa, sb = _strings(3, 400, 0.05)
    a = outcome_report("m-a", ids, ca, fa, sa)
    b = outcome_report("m-b", ids, cb, fb, sb)
    result = compare_reports(a, b)
    assert result["paired"] and result["warnings"] == []
    rows = {r["metric"]: r for r in result["rows"]}
    for metric, xa, xb in (("accuracy", ca, cb), ("corruptions.fog.1", fa, fb)):
        row = rows[metric]
        bb = sum(x == "1" and y == "0" for x, y in zip(xa, xb, strict=True))
        cc = sum(x == "0" and y == "1" for x, y in zip(xa, xb, strict=True))
        assert row["test"] == "McNemar exact (paired)"
        assert row["paired"] == {"images": 400, "a_not_b": bb, "b_not_a": cc}
        ref = contingency.mcnemar([[0, bb], [cc, 0]], exact=True).pvalue
        assert row["p_value"] == pytest.approx(ref, rel=1e-9)
    # the success rate: over the images both attacked (right on the clean image, covered)
    both = [i for i in range(400) if ca[i] == cb[i] == "1" and sa[i] != "-"]
    row = rows["attacks.square.success_rate"]
    assert row["test"] == "McNemar exact (paired)" and row["paired"]["images"] == len(both)
    # Holm over every row with a p-value, as statsmodels adjusts them
    fam = [r for r in result["rows"] if r["in_family"]]
    assert result["family"]["size"] == len(fam) == 5
    ref = multitest.multipletests([r["p_value"] for r in fam], method="holm")[1]
    assert [r["p_adjusted"] for r in fam] == pytest.approx(list(ref))
    assert all(r["significant"] == (r["p_adjusted"] < 0.05) for r in result["rows"])
    bh = compare_reports(a, b, family="bh")
    fam = [r for r in bh["rows"] if r["in_family"]]
    ref = multitest.multipletests([r["p_value"] for r in fam], method="fdr_bh")[1]
    assert [r["p_adjusted"] for r in fam] == pytest.approx(list(ref))


def test_paired_by_id_in_another_order_and_fallbacks():
    ids = [f"img-{i}" for i in range(200)]
    ca, cb, fa, fb, sa, sb = _strings(5, 200, 0.1)
    a = outcome_report("m-a", ids, ca, fa, sa)
    b = outcome_report("m-b", ids, cb, fb, sb)
    direct = {r["metric"]: r for r in compare_reports(a, b)["rows"]}
    # B's images in reverse order: matched by id, the same test
    rev = copy.deepcopy(b)
    rev["outcomes"]["image_ids"].reverse()
    for s in rev["outcomes"]["settings"]:
        s["outcomes"] = s["outcomes"][::-1]
    again = {r["metric"]: r for r in compare_reports(a, rev)["rows"]}
    for name, row in direct.items():
        assert again[name]["p_value"] == row["p_value"] and again[name]["test"] == row["test"]
    # other images: the z-test, saying why
    other = copy.deepcopy(b)
    other["outcomes"]["image_ids"][0] = "img-x"
    res = compare_reports(a, other)
    assert not res["paired"] and any("image ids differ" in w for w in res["warnings"])
    acc = {r["metric"]: r for r in res["rows"]}["accuracy"]
    assert acc["test"] == "two-proportion z-test"
    assert "image ids differ (199 in common of 200 and 200)" in acc["unpaired_because"]
    # outcomes that do not reproduce the report's counts: that row falls back
    off = copy.deepcopy(b)
    off["metrics"]["accuracy"]["correct"] -= 1
    acc = {r["metric"]: r for r in compare_reports(a, off)["rows"]}["accuracy"]
    assert acc["test"] == "two-proportion z-test"
    assert "B's outcomes" in acc["unpaired_because"] and "do not reproduce" in acc["unpaired_because"]
    # only one side with outcomes
    bare = copy.deepcopy(b)
    del bare["outcomes"]
    res = compare_reports(a, bare)
    assert "B carries no per-image outcomes" in res["warnings"][0]


def test_gate_family_metrics_and_acceptance(tmp_path, capsys):
    ids = [f"img-{i}" for i in range(400)]
    ca, cb, fa, fb, sa, sb = _strings(3, 400, 0.05)
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(outcome_report("m-a", ids, ca, fa, sa)))
    pb.write_text(json.dumps(outcome_report("m-b", ids, cb, fb, sb)))
    assert main(["compare", str(pa), str(pb), "--json"]) in (0, EXIT_REGRESSION)
    full = json.loads(capsys.readouterr().out)
    fog = {r["metric"]: r for r in full["rows"]}["corruptions.fog.1"]
    assert fog["regression"], "the fixture makes B worse under fog"
    assert main(["compare", str(pa), str(pb), "--fail-on-regression"]) == EXIT_REGRESSION
    out = capsys.readouterr().out
    assert "McNemar exact (paired)" in out and "Holm" in out
    # the family restricted to accuracy: a family of one, fog is not gated
    assert main(["compare", str(pa), str(pb), "--json", "--metrics", "accuracy"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["metric"]: r for r in doc["rows"]}
    assert doc["family"]["size"] == 1 and rows["accuracy"]["p_adjusted"] == rows["accuracy"]["p_value"]
    assert not rows["corruptions.fog.1"]["in_family"] and not rows["corruptions.fog.1"]["significant"]
    # the plan's acceptance criteria metrics: accuracy and the attack's success rate
    assert main(["compare", str(pa), str(pb), "--json", "--gate", "acceptance"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(r["metric"] for r in doc["rows"] if r["in_family"]) == [
        "accuracy", "attacks.square.success_rate"]
    # a glob that matches nothing is an error naming the option
    assert main(["compare", str(pa), str(pb), "--metrics", "nothing.*"]) == 2
    assert "--metrics: nothing.* matches no compared metric" in capsys.readouterr().err


def _hostile(doc: dict, path: str, value) -> dict:
    doc = copy.deepcopy(doc)
    node = doc["outcomes"]
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if k.isdigit() else node[k]
    last = keys[-1]
    if last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return doc


@pytest.mark.parametrize("path,value,message", [
    ("settings.0.outcomes", "1" * 9, "b: outcomes.settings[0].outcomes has 9 characters for 10 images"),
    ("settings.1.outcomes", 1101101101, "b: outcomes.settings[1].outcomes must be a string, not int"),
    ("settings.1.outcomes", "11011x1101", "may hold only '1', '0' and '-'"),
    ("settings.2.level", float("nan"), "b: outcomes.settings[2].level must be an integer"),
    ("settings.2.level", True, "b: outcomes.settings[2].level must be an integer"),
    ("settings.0.kind", "../../etc", "b: outcomes.settings[0].kind must be one of"),
    ("settings.0", ["clean"], "b: outcomes.settings[0] must be an object"),
    ("settings", {"a": 1}, "b: outcomes.settings must be a list"),
    ("image_ids", ["i0"] * 10, "b: outcomes.image_ids must be unique"),
    ("image_ids", list(range(10)), "b: outcomes.image_ids must be a list of strings"),
    ("settings.1.kind", "clean", "setting clean//0 given twice"),
])
def test_hostile_outcomes_are_precise_errors(tmp_path, capsys, path, value, message):
    ids = [f"i{i}" for i in range(10)]
    good = outcome_report("m", ids, "1101101101", "1001101001", "10-1--1-01")
    good["outcomes"]["settings"][1]["name"] = ""      # for the "given twice" case
    good["outcomes"]["settings"][1]["level"] = 0
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(outcome_report("m", ids, "1101101101", "1001101001", "10-1--1-01")))
    pb.write_text(json.dumps(_hostile(good, path, value)))
    assert main(["compare", str(pa), str(pb)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_hostile_files(tmp_path, capsys, monkeypatch):
    from fortis.server.cli import compare as compare_mod

    ids = [f"i{i}" for i in range(10)]
    pa = tmp_path / "a.json"
    pa.write_text(json.dumps(outcome_report("m", ids, "1101101101", "1001101001", "10-1--1-01")))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert main(["compare", str(pa), str(deep)]) == 2
    assert "b: cannot read report" in capsys.readouterr().err
    nan = tmp_path / "nan.json"
    nan.write_text('{"metrics": {"accuracy": {"value": NaN, "correct": 3, "m": 10}}, '
                   '"outcomes": {"image_ids": NaN, "settings": []}}')
    assert main(["compare", str(pa), str(nan)]) == 2
    assert "b: outcomes.image_ids must be a list of strings" in capsys.readouterr().err
    # more images than the bound (lowered here so the test stays small)
    monkeypatch.setattr(compare_mod, "MAX_OUTCOME_IMAGES", 5)
    assert main(["compare", str(pa), str(pa)]) == 2
    assert "a: outcomes.image_ids has 10 images, more than 5" in capsys.readouterr().err
    monkeypatch.setattr(compare_mod, "MAX_REPORT_BYTES", 100)
    assert main(["compare", str(pa), str(pa)]) == 2
    assert "more than 100 (not a report.json)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:      # argparse: a choice it does not know
        main(["compare", str(pa), str(pa), "--family", "bonferroni"])
    assert exc.value.code == 2 and "--family: invalid choice" in capsys.readouterr().err
