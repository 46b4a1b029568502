"""The IEEE 3129 4.6 report (IEEE-P1, P3, P4): report.json built from typed ReportParts
keeps its schema and metric tree (ints are ints, rates floats, unset = null), and report.html
is self-contained, escaped, and every link in it resolves within the page."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from fortis.report.v1 import report_pb2
from fortis.scoring.v1 import scoring_pb2
from fortis.services.common.errors import InvalidArgument
from fortis.services.report import prose, render
from fortis.services.report.convert import SCHEMA_VERSION, build_report
from fortis.services.report.render import render_html, report_json, write_report
from fortis.services.report.values import enum_text

from tests.unit.report_parts import (
    CORRUPTIONS,
    OPERATOR,
    PLAN_TEXT,
    QUERY,
    TRANSFER,
    M,
    make_parts,
    rate,
)

ATTACKS = [TRANSFER, QUERY]


def _report(parts: report_pb2.ReportParts | None = None) -> dict[str, Any]:
    return build_report(parts if parts is not None else make_parts())


REQUIRED_TOP = {"schema_version", "plan", "plan_text", "target", "tester", "environment",
                "service_parameters", "metrics_used", "metrics", "tests", "ledger", "evaluation",
                "repeat", "verdict", "examples", "failed_settings"}


def _get(tree: dict, dotted: str) -> object:
    node: object = tree
    for part in dotted.split("."):
        assert isinstance(node, dict) and part in node, f"missing {dotted} (at {part})"
        node = node[part]
    return node


def test_build_report_has_every_required_key() -> None:
    r = _report()
    assert set(r) == REQUIRED_TOP
    assert r["schema_version"] == SCHEMA_VERSION == "fortis.report/v1"
    assert r["plan_text"] == PLAN_TEXT  # exact text (IEEE-P4: repeatable)
    assert r["plan"]["seed"] == 1234 and r["plan"]["name"] == "hostile-demo"  # parsed YAML
    for key in ("name", "task_type", "endpoint", "output_kind", "labels_count", "version",
                "model_name", "top_k", "input", "service_type_parameters"):
        assert key in r["target"], key
    assert r["target"]["labels_count"] == 10
    assert r["target"]["task_type"] == "classification"
    assert r["target"]["output_kind"] == "full_scores"
    assert r["target"]["input"] == "28x28x1"
    # only the fields the rule's mode uses (top1 used to show k 5 and threshold 0.5)
    assert r["target"]["service_type_parameters"] == {"correctness": {"mode": "top1"}}
    assert set(r["tester"]["roles"]) == {"requester", "tester", "provider"}  # IEEE-P1
    assert r["tester"]["roles"]["provider"] == {"name": "Vision Inc.", "organisation": "Vision"}
    assert r["tester"]["name"] == "Dana <QA>" and r["tester"]["organization"] == "QA Lab"
    for key in ("python", "torch", "numpy", "fortis", "platform", "seed", "seeds"):
        assert key in r["environment"], key
    assert r["environment"]["seeds"] == {"seed": 1234}
    ev = r["evaluation"]
    assert ev["duration_s"] == 330.5
    assert ev["started_at"] == "2025-01-02T10:00:00+00:00"
    assert ev["ended_at"] == "2025-01-02T10:05:30+00:00"
    assert ev["started"] == 1735812000.0 and ev["finished"] == 1735812330.5
    assert ev["images"] == M and ev["id"] == "ev-42"
    assert ev["dataset"] == {"source": "fashion-mnist", "split": "test", "offset": 0, "limit": 6}
    assert "fortis run" in r["repeat"]["command"]
    assert r["repeat"]["seeds_in_plan"] is True
    assert r["service_parameters"]["correctness"] == {"mode": "top1"}  # as the plan wrote it
    assert r["ledger"]["total_queries"] == 1234 and "note" in r["ledger"]
    names = {m["name"] for m in r["metrics_used"]}
    assert "Accuracy" in names and "Defense reciprocal rank DRR@5" in names
    assert any("Degradation profiles" in n for n in names)
    assert any("Minimal perturbation L2" in n for n in names)


def test_tests_entries_carry_ieee_p4_items() -> None:
    tests = {t["id"]: t for t in _report()["tests"]}
    assert set(tests) == {*CORRUPTIONS, OPERATOR, *ATTACKS}
    for t in tests.values():
        for key in ("id", "kind", "ieee_ref", "image_source", "parameters", "severities",
                    "epsilon", "norm", "query_budget", "steps", "metrics"):
            assert key in t, (t["id"], key)
        assert t["steps"] and t["metrics"] and t["ieee_ref"]
        assert all(isinstance(s, str) and len(s) > 20 for s in t["steps"])
        assert t["image_source"].startswith("fashion-mnist (test), images 0..5 (M=6)")
    gn = tests["gaussian_noise"]
    assert gn["kind"] == "corruption" and gn["severities"] == [1, 2]
    assert gn["parameters"] == {"1": {"sigma": 0.08, "kernel": "w*h//50"},
                                "2": {"sigma": 0.16, "kernel": "w*h//50"}}
    assert gn["characterisation"] == {"scope": "global", "randomness": "stochastic",
                                      "domain": "pixel"}
    assert "apply gaussian_noise alone at each severity" in gn["steps"][0]
    deg = tests[OPERATOR]
    assert deg["kind"] == "degradation" and deg["levels"] == [1, 2]
    assert deg["severities"] is None and deg["parameters"]["2"] == {"sigmas": [1.0, 1.0]}
    sq = tests[QUERY]
    assert sq["kind"] == "attack" and sq["attack_kind"] == "score" and sq["attack"] == "square"
    assert sq["query_budget"] == 500 and isinstance(sq["query_budget"], int)
    # the plan's parameters keep their types (an int budget stays an int, no Struct doubles)
    assert sq["parameters"] == {"epsilon": 0.03, "max_queries": 500}
    assert isinstance(sq["parameters"]["max_queries"], int)
    assert sq["ieee_ref"] == "IEEE-A8" and sq["images_attacked"] == 4
    assert sq["image_source"].endswith("; the first 4 attacked (plan limit)")
    assert "attack success rate and queries (IEEE-M6)" in sq["metrics"]
    fg = tests[TRANSFER]
    assert fg["attack_kind"] == "transfer" and fg["query_budget"] is None
    assert fg["surrogate"] == "fmnist-surrogate" and fg["epsilon"] == 0.03
    assert "'fmnist-surrogate'" in fg["steps"][0]
    assert fg["metrics"] == ["Robustness_Adv (IEEE-M3)", "WorstCase_Robustness_Adv (IEEE-M5)"]


def test_secrets_stay_out_of_the_report() -> None:
    r = _report()
    assert "hunter2" not in r["target"]["endpoint"] and "sk-SECRET" not in r["target"]["endpoint"]
    assert r["target"]["endpoint"] == ("https://***@vision.example.com/v1/predict"
                                       "?api_key=***&region=eu")


METRIC_KEYS = [
    "metrics.m", "metrics.accuracy.value", "metrics.accuracy.ci95", "metrics.accuracy.m",
    "metrics.accuracy.correct",
    "metrics.average_robustness_corr.value", "metrics.average_robustness_corr.definition",
    "metrics.worstcase_robustness_corr.n_settings",
    "metrics.average_robustness_adv.m_per_attack", "metrics.worstcase_robustness_adv.over",
    *(f"metrics.average_robustness_corr_by_severity.{s}.value" for s in "12"),
    *(f"metrics.worstcase_robustness_corr_by_severity.{s}.{k}" for s in "12"
      for k in ("value", "ci95", "m", "correct", "n_settings")),
    *(f"metrics.corruptions.{c}.{s}.{k}" for c in CORRUPTIONS for s in "12"
      for k in ("robustness", "ci95", "m", "correct")),
    *(f"metrics.corruptions.{c}.mean.{k}" for c in CORRUPTIONS
      for k in ("robustness", "ci95", "severities")),
    *(f"metrics.ranking.{k}" for k in ("applicable", "gamma_b", "gamma_a", "drr_k", "settings")),
    *(f"metrics.degradation.{OPERATOR}.{k}" for k in (
        "m", "m_used", "applicable", "reason", "levels", "accuracy", "rank", "probability",
        "changes", "failure_points", "definitions")),
    "metrics.query_errors.total", "metrics.query_errors.settings",
]

ATTACK_KEYS = {"robustness_adv", "ci95", "m", "correct", "kind", "success_rate",
               "success_rate_ci95", "success_rate_n", "successes", "mean_queries",
               "median_queries", "mean_queries_successful", "query_budget", "errors",
               "error_images", "clean_mismatches", "mean_linf", "max_linf", "mean_l2",
               "mean_l2_successful", "median_l2_successful", "success_by_queries",
               "fooling_rate", "fooling_threshold", "never_fooled", "excluded",
               "excluded_reason", "unsuccessful_mean_l2", "unsuccessful_max_linf"}
INT_KEYS = {"m", "correct", "n", "n_settings", "success_rate_n", "successes", "query_budget",
            "excluded",
            "errors", "clean_mismatches", "drr_k", "drr_n", "m_used", "level", "censored",
            "missing", "total", "of", "total_queries", "aborted_attempt_queries", "images",
            "resumed_count", "seed", "labels_count", "top_k", "offset", "limit"}
FLOAT_KEYS = {"value", "robustness", "robustness_adv", "success_rate", "mean_queries",
              "median_queries", "mean_queries_successful", "mean_linf", "max_linf", "mean_l2",
              "mean_l2_successful", "median_l2_successful", "ndcg_1", "drr_5", "gamma_b",
              "gamma_a", "accuracy", "threshold", "fraction_of_pixels_changed", "at_least",
              "duration_s", "started", "finished", "fooling_rate", "fooling_threshold",
              "never_fooled"}


def _walk_types(node: Any, path: str = "") -> None:
    """Every integer-valued key is an int (never a float that happens to be whole), every rate
    a float; unset values are None."""
    if isinstance(node, dict):
        for k, v in node.items():
            where = f"{path}.{k}"
            if k in ("definitions", "plan"):  # prose and the caller's own document
                continue
            if k in INT_KEYS and not isinstance(v, dict | list):
                assert v is None or (isinstance(v, int) and not isinstance(v, bool)), (where, v)
            if k in FLOAT_KEYS and not isinstance(v, dict | list):
                assert v is None or isinstance(v, float), (where, v)
            if k == "ci95" or k == "success_rate_ci95":
                assert v is None or (len(v) == 2 and all(isinstance(x, float) for x in v)), where
            _walk_types(v, where)
    elif isinstance(node, list):
        for n, v in enumerate(node):
            _walk_types(v, f"{path}[{n}]")


def test_metric_tree_keeps_its_shape_and_types(tmp_path: Path) -> None:
    json_path, html_path = write_report(_report(), tmp_path / "out")
    assert json_path.name == "report.json" and html_path.name == "report.html"
    text = json_path.read_text(encoding="utf-8")
    data = json.loads(text)
    assert set(data) == REQUIRED_TOP
    for dotted in METRIC_KEYS:
        _get(data, dotted)
    # indent 2, sorted keys, strict JSON
    assert text == json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    assert text == report_json(_report()) + "\n"
    _walk_types(data)
    m = data["metrics"]
    assert m["accuracy"] == {"value": pytest.approx(5 / 6), "ci95": pytest.approx([5 / 6 - 0.2, 1]),
                             "m": 6, "correct": 5}
    assert set(m["corruptions"]["gaussian_noise"]) == {"1", "2", "mean"}
    assert m["corruptions"]["motion_blur"]["2"]["correct"] == 2
    assert m["corruptions"]["motion_blur"]["mean"]["severities"] == [1, 2]
    assert m["corruptions"]["motion_blur"]["mean"]["ci95"] is None
    assert m["average_robustness_corr"]["ci95"] is None  # averages: no interval (IEEE-M8)
    assert m["average_robustness_corr"]["m"] == M
    assert m["average_robustness_adv"]["m"] is None
    assert m["average_robustness_adv"]["m_per_attack"] == {TRANSFER: M, QUERY: 4}
    assert m["average_robustness_corr_by_severity"]["1"] == {
        "value": pytest.approx(3.5 / M), "ci95": None, "n": 2}
    assert "over" not in m["worstcase_robustness_corr"]
    for name in ATTACKS:
        assert set(m["attacks"][name]) == ATTACK_KEYS, name
    sq, fg = m["attacks"][QUERY], m["attacks"][TRANSFER]
    assert sq["kind"] == "query" and fg["kind"] == "transfer"
    assert sq["query_budget"] == 500 and sq["successes"] == 2 and sq["success_rate_n"] == 4
    assert sq["error_images"] == ["img3"] and sq["median_l2_successful"] == 0.85
    assert fg["mean_queries"] is None and fg["query_budget"] is None
    assert fg["mean_l2_successful"] is None
    # IEEE-M6 curve and PER-4 as the scoring service sent them; none for a transfer attack
    assert sq["success_by_queries"] == [[10, 0.25], [500, 0.5]]
    assert sq["fooling_rate"] == 0.25 and sq["never_fooled"] == 0.5
    assert fg["success_by_queries"] is None and fg["fooling_rate"] is None
    rk = m["ranking"]
    assert rk["applicable"] is True and rk["drr_k"] == 5
    assert set(rk["settings"]) == {f"{c}@{s}" for c in CORRUPTIONS for s in (1, 2)} | {TRANSFER}
    assert set(rk["settings"][TRANSFER]) == {"kind", "m", "ndcg_1", "ndcg_at", "drr_5",
                                             "drr_n", "applicable"}
    assert rk["settings"][TRANSFER]["kind"] == "attack"
    assert rk["settings"]["gaussian_noise@1"]["kind"] == "corruption"
    assert len(rk["settings"]["gaussian_noise@1"]["ndcg_at"]) == 10
    deg = m["degradation"][OPERATOR]
    assert deg["levels"] == [0, 1, 2] and deg["thresholds"] == [0.9, 0.5, 0.1]
    assert deg["accuracy"][1] == {"level": 1, "value": 0.8, "ci95": [0.5, 1.0], "m": 5,
                                  "correct": 4}
    assert deg["changes"] == [{"level": 1, "change": {"fraction_of_pixels_changed": 0.25}},
                              {"level": 2, "change": {"fraction_of_pixels_changed": 0.5}}]
    assert deg["failure_points"]["0.1"] is None
    assert deg["failure_points"]["0.5"]["level"] == 2
    assert deg["failure_points"]["0.5"]["example_image"] == "img4"
    assert deg["failure_points"]["0.9"]["change"] == {"fraction_of_pixels_changed": 0.25}
    assert m["query_errors"] == {"total": 1, "settings": {QUERY: {
        "errors": 1, "of": 4,
        "examples": [{"image_id": "img3", "error": "target unreachable <after retries>"}]}}}
    assert data["plan_text"] == PLAN_TEXT


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.ids: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += attrs
        self.ids += [v for k, v in attrs if k == "id" and v]

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(page: str) -> _Collector:
    p = _Collector()
    p.feed(page)
    return p


def _html(parts: report_pb2.ReportParts | None = None) -> str:
    return render_html(_report(parts))


def test_html_is_self_contained() -> None:
    page = _html()
    p = _parse(page)
    assert "script" not in p.tags and "link" not in p.tags
    # figures are <img> with data: URIs only (the CSP allows img-src data:)
    srcs = [v for k, v in p.attrs if k == "src"]
    assert srcs and all(v is not None and v.startswith("data:image/") for v in srcs), srcs
    for name, value in p.attrs:
        if name in ("src", "href", "action", "xmlns", "srcset", "data"):
            assert value is not None and not re.match(r"\s*(https?:)?//", value), (name, value)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert not re.search(r"url\(\s*['\"]?\s*(https?:)?//", page, re.I)
    assert "@import" not in page
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert 'font-family:-apple-system,"Segoe UI"' in page  # CSS is not entity-escaped
    # the only http(s) text comes from the (escaped) plan/target text, never markup
    assert "http://" not in page
    scrubbed = page.replace("https://***@vision.example.com/v1/predict?api_key=***&amp;region=eu",
                            "")
    scrubbed = scrubbed.replace(
        "https://user:hunter2@vision.example.com/v1/predict?api_key=sk-SECRET&amp;region=eu", "")
    assert "https://" not in scrubbed


def test_html_without_urls_in_user_text_has_none_at_all() -> None:
    parts = make_parts()
    parts.plan_text = "seed: 1\n"
    parts.target.endpoint = "127.0.0.1:8500"
    page = _html(parts)
    assert "http://" not in page and "https://" not in page


def test_html_escapes_user_text() -> None:
    page = _html(make_parts(transfer="<script>", query='q"><img src=x onerror=alert(1)>'))
    assert "<script" not in page.lower() and "<img src=x" not in page.lower()
    assert "&lt;script&gt;alert(&#34;pwned&#34;)&lt;/script&gt;" in page
    assert "</title><script>" not in page
    assert "mobilenet &lt;b&gt;v2&lt;/b&gt;" in page
    assert "Dana &lt;QA&gt;" in page
    assert "<tr><th>&lt;script&gt;</th>" in page  # the attack's row, its name as text
    assert "target unreachable &lt;after retries&gt;" in page
    p = _parse(page)
    assert "b" not in p.tags and "script" not in p.tags
    assert all(k != "onerror" for k, _ in p.attrs)  # the figures' <img> only, data: URIs
    assert all(v is not None and v.startswith("data:image/") for k, v in p.attrs if k == "src")
    assert "<script>" in "".join(p.text)  # shown to the reader, as text


def test_every_anchor_link_resolves_within_the_page() -> None:
    for parts in (make_parts(), _minimal_parts()):
        p = _parse(_html(parts))
        links = [v for k, v in p.attrs if k == "href"]
        assert links and all(v is not None and v.startswith("#") for v in links), links
        missing = [v for v in links if v is not None and v[1:] not in p.ids]
        assert not missing, missing
        assert len(p.ids) == len(set(p.ids))  # anchors are unique


def test_html_sections_and_names() -> None:
    page = _html()
    p = _parse(page)
    for anchor in ("summary", "target", "tester", "service-parameters", "metrics-used", "tests",
                   "corruptions", "attacks", "worst-case", "degradation", "query-errors",
                   "ranking", "ledger", "evaluation", "environment", "plan", "repeat"):
        assert anchor in p.ids, anchor
    for name in [*CORRUPTIONS, *ATTACKS, OPERATOR]:
        assert name in page, name
    # figures as data: images (the corruption overview, the degradation profile,
    # the NDCG curves); the per-corruption inline SVG charts are gone
    assert "<svg" not in page
    assert f'alt="Robustness against severity for {len(CORRUPTIONS)} corruption(s)' in page
    assert f'alt="Degradation profile of {OPERATOR}' in page and 'alt="NDCG@i curves' in page
    assert "fortis run plan.yaml" in page
    assert "<pre>" in page
    assert "Vision Inc." in page and "Acme Retail" in page
    assert "83.33%" in page  # accuracy 5/6
    assert "1234" in page  # ledger total and seed
    assert "Degradation profiles" in page and "Failed queries" in page and "NDCG" in page
    assert "below 50.00%: level 2 (example img4)" in page and "below 10.00%: never" in page
    assert "Robustness_Corr (IEEE-M2)" in page  # the prose of the tests


def _minimal_parts() -> report_pb2.ReportParts:
    """One clean image, nothing tested: every average and profile is unset."""
    parts = make_parts()
    del parts.tests[:]
    parts.metrics.CopyFrom(scoring_pb2.ScoreEvaluationResponse(
        ieee=scoring_pb2.IeeeMetrics(m=1, accuracy=rate(1, 1)),
        ranking=scoring_pb2.Ranking(applicable=False, reason="the target returns labels only")))
    return parts


def test_nulls_are_shown_as_na() -> None:
    r = _report(_minimal_parts())
    m = r["metrics"]
    assert m["average_robustness_corr"]["value"] is None  # not 0: nothing to average
    assert m["worstcase_robustness_adv"]["correct"] is None
    assert m["ranking"] == {"applicable": False, "reason": "the target returns labels only",
                            "settings": {}}
    assert "degradation" not in m
    assert m["query_errors"] == {"total": 0, "settings": {}}
    page = render_html(r)
    assert "n/a" in page
    assert "None" not in re.sub(r"<[^>]+>", "", page)
    assert "No corruptions were tested" in page and "No adversarial attacks" in page
    assert "No degradation operators were tested" in page
    assert "Not applicable: the target returns labels only" in page


def test_transfer_attack_queries_na_in_html() -> None:
    page = _html()
    row = re.search(rf"<tr><th>{TRANSFER}</th>.*?</tr>", page)
    assert row is not None and "n/a" in row.group(0)


def _without(field: str) -> report_pb2.ReportParts:
    parts = make_parts()
    parts.ClearField(field)
    return parts


def _mutate(fn: Any) -> report_pb2.ReportParts:
    parts = make_parts()
    fn(parts)
    return parts


@pytest.mark.parametrize(("parts", "field"), [
    (_without("metrics"), "parts.metrics"),
    (_without("evaluation"), "parts.evaluation"),
    (_without("target"), "parts.target"),
    (_without("plan_text"), "parts.plan_text"),
    (_mutate(lambda p: p.metrics.ClearField("ieee")), "parts.metrics.ieee"),
    (_mutate(lambda p: p.tests[0].ClearField("name")), "parts.tests[0].name"),
    (_mutate(lambda p: p.tests[3].ClearField("kind")), "parts.tests[3].kind"),
    (_mutate(lambda p: p.target.ClearField("name")), "parts.target.name"),
    (_mutate(lambda p: p.evaluation.ClearField("start_time")), "parts.evaluation.start_time"),
    (_mutate(lambda p: p.evaluation.ClearField("evaluation_id")),
     "parts.evaluation.evaluation_id"),
    (_mutate(lambda p: setattr(p.evaluation.end_time, "seconds", 1)),
     "parts.evaluation.end_time"),
    (_mutate(lambda p: p.metrics.ieee.accuracy.ClearField("ci95_high")),
     "parts.metrics.ieee.accuracy.ci95_high"),
    (_mutate(lambda p: p.metrics.ieee.attacks[1].success.ClearField("ci95_low")),
     "parts.metrics.ieee.attacks[1].success.ci95_low"),
    (_mutate(lambda p: p.metrics.degradation[0].ClearField("name")),
     "parts.metrics.degradation[0].name"),
    (_mutate(lambda p: setattr(p, "plan_text", "- just\n- a list\n")), "parts.plan_text"),
    (_mutate(lambda p: setattr(p, "plan_text", "a: [unclosed\n")), "parts.plan_text"),
    (_mutate(lambda p: setattr(p, "plan_text", "x: '" + "a" * (1 << 20) + "'\n")),
     "parts.plan_text"),
])
def test_bad_parts_rejected_naming_the_field(parts: report_pb2.ReportParts, field: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        build_report(parts)
    assert exc.value.violations[0].field == field


def test_a_plan_that_expands_through_aliases_is_refused() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, "
              f"*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 9)]
    parts = make_parts()
    parts.plan_text = "\n".join(lines) + "\n"
    with pytest.raises(InvalidArgument) as exc:
        build_report(parts)
    assert exc.value.violations[0].field == "parts.plan_text"


def test_json_plans_are_yaml_too() -> None:
    parts = make_parts()
    parts.plan_text = json.dumps({"name": "json-plan", "seed": 7, "attacks": []})
    r = build_report(parts)
    assert r["plan"] == {"name": "json-plan", "seed": 7, "attacks": []}


def test_enums_and_strings_read_the_same() -> None:
    rule = scoring_pb2.CorrectnessRule(mode=scoring_pb2.CORRECTNESS_MODE_TOPK)
    assert enum_text(rule, "mode") == "topk"
    assert enum_text(scoring_pb2.CorrectnessRule(), "mode") is None  # UNSPECIFIED
    assert enum_text(report_pb2.Party(name="QA"), "name") == "QA"
    assert enum_text(report_pb2.Party(), "name") is None


def test_prose_helpers() -> None:
    steps = prose.test_steps("corruption", "fog")
    assert len(steps) == 3 and steps[0].startswith("apply fog alone")
    assert prose.image_source(source="s", split="t", offset=10, m=5, covered=5) == (
        "s (t), images 10..14 (M=5)")
    assert render._party({"name": "QA", "organisation": "Acme"}) == "QA (Acme)"
    assert render._party({"name": "", "organisation": ""}) is None
