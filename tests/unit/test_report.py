"""The IEEE 3129 4.6 report (IEEE-P1, P3, P4): report.json keys and a self-contained,
escaped report.html, built from a real metrics tree (IEEE-M1..M8)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fortis.services.common.errors import InvalidArgument
from fortis.services.report.render import (
    SCHEMA_VERSION,
    build_report,
    render_html,
    write_report,
)
from fortis.services.scoring.ieee import AttackImageOutcome, compute_classification_metrics

IDS = [f"img{i}" for i in range(6)]
CORRUPTIONS = ["gaussian_noise", "motion_blur"]
ATTACKS = ["square_linf", "fgsm_surrogate"]

PLAN_TEXT = """\
# evaluation plan </title><script>alert("pwned")</script>
target:
  name: "mobilenet <b>v2</b>"
  endpoint: https://user:hunter2@vision.example.com/v1/predict
seed: 1234
corruptions: [gaussian_noise, motion_blur]
attacks: [square_linf, fgsm_surrogate]
"""

PLAN = {
    "target": {"name": "mobilenet <b>v2</b>", "task_type": "classification"},
    "seed": 1234,
    "roles": {"requester": "Acme Retail", "tester": "QA Lab", "provider": "Vision Inc."},
    "image_source": {"kind": "dataset", "name": "fashion-mnist test", "count": 6},
    "correctness": {"mode": "top1"},
    "corruptions": [{"id": c, "severities": [1, 2, 3]} for c in CORRUPTIONS],
    "attacks": [{"id": "square_linf", "epsilon": 0.03, "query_budget": 500},
                {"id": "fgsm_surrogate", "epsilon": 0.03}],
}


def _metrics() -> dict:
    clean = {i: n != 5 for n, i in enumerate(IDS)}
    corruptions = {
        c: {s: {i: (n + s + k) % 4 != 0 for n, i in enumerate(IDS)} for s in (1, 2, 3)}
        for k, c in enumerate(CORRUPTIONS)
    }
    square = [AttackImageOutcome(image_id=i, correct=n % 2 == 0 and n != 5,
                                 initially_correct=n != 5, success=(n % 2 == 1) if n != 5
                                 else None, queries=10 * (n + 1) if n != 5 else None)
              for n, i in enumerate(IDS)]
    fgsm = [AttackImageOutcome(image_id=i, correct=n < 3, initially_correct=n != 5,
                               success=None, queries=None) for n, i in enumerate(IDS)]
    return compute_classification_metrics(
        clean=clean, corruptions=corruptions,
        attacks={"square_linf": square, "fgsm_surrogate": fgsm},
        attack_budgets={"square_linf": 500, "fgsm_surrogate": None}, image_ids=IDS)


def _report(**over: object) -> dict:
    kw: dict = {
        "plan": PLAN,
        "plan_text": PLAN_TEXT,
        "target": {"name": "mobilenet <b>v2</b>", "task_type": "classification",
                   "endpoint": "https://user:hunter2@vision.example.com/v1/predict",
                   "output_kind": "top-k scores", "labels": list(range(10)),
                   "version": "2024-05", "api_key": "sk-SECRET", "credentials_ref": "vault:x"},
        "tester": {"name": "Dana <QA>", "organization": "QA Lab"},
        "environment": {"seeds": {"plan": 1234}},
        "metrics": _metrics(),
        "tests": [
            *({"id": c, "kind": "corruption", "severities": [1, 2, 3],
               "parameters": {"family": "noise"}} for c in CORRUPTIONS),
            {"id": "square_linf", "kind": "attack", "epsilon": 0.03, "norm": "Linf",
             "query_budget": 500, "ieee_ref": "IEEE-A8 Square"},
            {"id": "fgsm_surrogate", "kind": "attack", "epsilon": 0.03, "norm": "Linf"},
        ],
        "ledger": {"total_queries": 1234,
                   "sessions": {"s1": {"clean": 6, "corruption": 36, "attack": 1192}}},
        "evaluation": {"id": "ev-42", "started_at": "2025-01-02T10:00:00+00:00",
                       "ended_at": "2025-01-02T10:05:30+00:00"},
    }
    kw.update(over)
    return build_report(**kw)


REQUIRED_TOP = {"schema_version", "plan", "plan_text", "target", "tester", "environment",
                "metrics", "tests", "ledger", "evaluation", "repeat"}


def _get(tree: dict, dotted: str) -> object:
    node: object = tree
    for part in dotted.split("."):
        assert isinstance(node, dict) and part in node, f"missing {dotted} (at {part})"
        node = node[part]
    return node


def test_build_report_has_every_required_key() -> None:
    r = _report()
    assert REQUIRED_TOP <= set(r)
    assert r["schema_version"] == SCHEMA_VERSION == "fortis.report/v1"
    assert r["plan_text"] == PLAN_TEXT  # exact text (IEEE-P4: repeatable)
    for key in ("name", "task_type", "endpoint", "output_kind", "labels_count", "version"):
        assert key in r["target"], key
    assert r["target"]["labels_count"] == 10
    assert set(r["tester"]["roles"]) == {"requester", "tester", "provider"}  # IEEE-P1
    assert r["tester"]["roles"]["provider"] == "Vision Inc."
    for key in ("python", "torch", "numpy", "fortis", "platform", "seeds"):
        assert key in r["environment"], key
    assert r["environment"]["seeds"] == {"plan": 1234}
    assert r["evaluation"]["duration_s"] == 330.0
    assert "fortis run" in r["repeat"]["command"]
    assert r["repeat"]["seeds_in_plan"] is True
    assert r["service_parameters"]["correctness"] == {"mode": "top1"}


def test_tests_entries_carry_ieee_p4_items() -> None:
    tests = {t["id"]: t for t in _report()["tests"]}
    assert set(tests) == set(CORRUPTIONS) | set(ATTACKS)
    for t in tests.values():
        for key in ("id", "kind", "ieee_ref", "image_source", "parameters", "severities",
                    "epsilon", "query_budget", "steps", "metrics"):
            assert key in t, (t["id"], key)
        assert t["steps"] and t["metrics"] and t["ieee_ref"]
        assert t["image_source"]["name"] == "fashion-mnist test"  # from the plan
    assert tests["gaussian_noise"]["severities"] == [1, 2, 3]
    assert tests["square_linf"]["query_budget"] == 500
    assert tests["square_linf"]["ieee_ref"] == "IEEE-A8 Square"


def test_secrets_stay_out_of_the_report() -> None:
    r = _report()
    assert "api_key" not in r["target"]
    assert r["target"]["credentials_ref"] == "vault:x"
    assert "hunter2" not in r["target"]["endpoint"]
    assert r["target"]["endpoint"] == "https://***@vision.example.com/v1/predict"


METRIC_KEYS = [
    "metrics.accuracy.value", "metrics.accuracy.ci95", "metrics.accuracy.m",
    "metrics.average_robustness_corr", "metrics.worstcase_robustness_corr",
    "metrics.average_robustness_adv", "metrics.worstcase_robustness_adv",
    *(f"metrics.corruptions.{c}.{s}.{k}" for c in CORRUPTIONS for s in "123"
      for k in ("robustness", "ci95")),
    *(f"metrics.attacks.{a}.{k}" for a in ATTACKS
      for k in ("robustness_adv", "success_rate", "mean_queries", "median_queries",
                "query_budget")),
]


def test_write_report_json_round_trip(tmp_path: Path) -> None:
    json_path, html_path = write_report(_report(), tmp_path / "out")
    assert json_path.name == "report.json" and html_path.name == "report.html"
    text = json_path.read_text(encoding="utf-8")
    data = json.loads(text)
    assert REQUIRED_TOP <= set(data)
    for dotted in METRIC_KEYS:
        _get(data, dotted)
    # indent 2, sorted keys
    assert text == json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    assert data["metrics"]["accuracy"]["value"] == pytest.approx(5 / 6)
    assert data["metrics"]["attacks"]["square_linf"]["query_budget"] == 500
    assert data["metrics"]["attacks"]["fgsm_surrogate"]["mean_queries"] is None
    assert data["plan_text"] == PLAN_TEXT


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.ids: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += attrs
        self.ids += [v for k, v in attrs if k == "id" and v]


def _html() -> str:
    return render_html(_report())


def test_html_is_self_contained() -> None:
    page = _html()
    p = _Collector()
    p.feed(page)
    assert "script" not in p.tags and "link" not in p.tags and "img" not in p.tags
    for name, value in p.attrs:
        if name in ("src", "href", "action", "xmlns", "srcset", "data"):
            assert value is not None and not re.match(r"\s*(https?:)?//", value), (name, value)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert not re.search(r"url\(\s*['\"]?\s*(https?:)?//", page, re.I)
    assert "@import" not in page
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    # the only http(s) text comes from the (escaped) plan/target text, never markup
    assert "http://" not in page
    scrubbed = page.replace("https://***@vision.example.com/v1/predict", "")
    scrubbed = scrubbed.replace("https://user:hunter2@vision.example.com/v1/predict", "")
    assert "https://" not in scrubbed


def test_html_without_urls_in_user_text_has_none_at_all() -> None:
    r = _report(plan_text="seed: 1\n", target={"name": "local", "task_type": "classification",
                                                 "endpoint": "127.0.0.1:8500"})
    page = render_html(r)
    assert "http://" not in page and "https://" not in page


def test_html_escapes_user_text() -> None:
    page = _html()
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;" in page
    assert "</title><script>" not in page
    assert "mobilenet &lt;b&gt;v2&lt;/b&gt;" in page
    assert "Dana &lt;QA&gt;" in page
    p = _Collector()
    p.feed(page)
    assert "b" not in p.tags  # the <b> in the target name was not rendered as markup


def test_html_sections_and_names() -> None:
    page = _html()
    p = _Collector()
    p.feed(page)
    for anchor in ("summary", "service-parameters", "tests", "corruptions", "attacks",
                   "worst-case", "ledger", "environment", "plan", "repeat", "metrics-used"):
        assert anchor in p.ids, anchor
    for name in CORRUPTIONS + ATTACKS:
        assert name in page, name
    assert page.count("<svg") == len(CORRUPTIONS)  # one chart per corruption
    assert "<polyline" in page
    assert "fortis run plan.yaml" in page
    assert "<pre>" in page
    assert "Vision Inc." in page and "Acme Retail" in page
    assert "83.33%" in page  # accuracy 5/6
    assert "1234" in page  # ledger total and seed


def test_nulls_are_shown_as_na() -> None:
    metrics = compute_classification_metrics(
        clean={"a": True}, corruptions={}, attacks={}, attack_budgets={}, image_ids=["a"])
    page = render_html(_report(metrics=metrics, tests=[]))
    assert "n/a" in page
    assert "None" not in re.sub(r"<[^>]+>", "", page)
    assert "No corruptions were tested" in page and "No adversarial attacks" in page


def test_transfer_attack_queries_na_in_html() -> None:
    page = _html()
    row = re.search(r"<tr><th>fgsm_surrogate</th>.*?</tr>", page)
    assert row is not None and "n/a" in row.group(0)


@pytest.mark.parametrize(("tests", "field"), [
    ([{"kind": "attack"}], "tests[0].id"),
    ([{"id": "x", "kind": "style"}], "tests[0].kind"),
])
def test_bad_tests_rejected(tests: list, field: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        _report(tests=tests)
    assert exc.value.violations[0].field == field


def test_a_single_string_step_is_one_step_not_one_per_letter():
    from fortis.services.report import render
    assert render._as_list("send each image") == ["send each image"]
    assert render._as_list(("a", "b")) == ["a", "b"]
    assert render._party({"name": "QA", "organisation": "Acme"}) == "QA (Acme)"
