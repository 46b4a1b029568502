"""``report.html``: one self-contained page from the report document, by Jinja2 templates.

The page is IEEE-P4's human-readable report, laid out for a QA lead who reads it in a minute:
the verdict against the plan's acceptance criteria, the key figures with their 95 % intervals
(IEEE-M8), the worst corruption and the most effective attack come first (in the first
screen); then the results (corruptions, attacks, CANARY metrics, benchmark across models,
degradation, ranking), each with its figures and example images, tables sorted worst first;
the test definitions (collapsed), the target and roles, the plan and how to repeat it last.

Inline CSS (with a print stylesheet), figures as ``data:`` images (:mod:`.figures`,
matplotlib SVG), no scripts, no external resources, and a Content-Security-Policy that
forbids loading any. The templates (``templates/*.html.j2``, shipped in the package and
loaded with ``PackageLoader``) are rendered with autoescaping on, so every name, plan line or
error text from the caller is text, never markup; example images are accepted only as
base64 ``data:image/...`` URIs. The sections shape the document into the rows, cards and
figures the templates draw: :mod:`.page_summary` (verdict, key figures), :mod:`.page_results`
(corruptions, example images, attacks), :mod:`.page_canary` (CANARY, benchmark),
:mod:`.page_details` (degradation, ranking, failed queries, target, tests), all reading
values through :mod:`.page_values`; this module assembles the page. :func:`write_report`
writes ``report.json`` and ``report.html`` atomically. Pure domain code (no gRPC).
"""

from __future__ import annotations

import functools
import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import jinja2
from fortis.services.report.page_canary import benchmark_section, canary_section
from fortis.services.report.page_details import (
    degradation_profiles,
    evaluation_rows,
    query_error_rows,
    ranking_section,
    role_rows,
    service_parameter_rows,
    test_rows,
)
from fortis.services.report.page_estimate import estimate_section
from fortis.services.report.page_results import (
    attack_figures,
    attack_rows,
    corruption_section,
    example_groups,
    rule_words,
)
from fortis.services.report.page_summary import key_figures, sequential_section, verdict_section
from fortis.services.report.page_values import (
    as_list,
    as_map,
    ci_text,
    is_interval,
    is_number,
    json_text,
    nested_list,
    num,
    pct,
    pct_short,
    shade,
    sig,
    txt,
)

__all__ = ["render_html", "report_json", "write_report"]

#: Table of contents, in page order: (anchor, label). Only the sections a report renders are
#: listed, so no entry links to a missing anchor.
_SECTIONS: Final = (("summary", "Summary"), ("corruptions", "Corruptions"),
                    ("attacks", "Attacks"), ("canary", "CANARY"),
                    ("benchmark", "Benchmark"), ("degradation", "Degradation"),
                    ("worst-case", "Worst case"), ("ranking", "Ranking"),
                    ("query-errors", "Failed queries"), ("tests", "Tests"),
                    ("target", "Target"), ("ledger", "Ledger"),
                    ("environment", "Environment"), ("plan", "Plan"), ("repeat", "Repeat"))


def _party(value: Any) -> Any:
    """A role as 'name (organisation)' when it is a {name, organisation} record."""
    if isinstance(value, Mapping):
        name = value.get("name") or ""
        org = value.get("organisation") or value.get("organization") or ""
        if name or org:
            return f"{name} ({org})" if name and org else (name or org)
        return None
    return value


@functools.cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("fortis.services.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(txt=txt, pct=pct, pct_short=pct_short, ci=ci_text, num=num, sig=sig,
                       party=_party, json_text=json_text, shade=shade)
    env.tests["nested_list"] = nested_list
    env.tests["interval"] = is_interval
    return env



# --------------------------------------------------------------------------------------------
# the page
# --------------------------------------------------------------------------------------------


def _scope(corruptions: Any, attacks: Any, degradation: Any, ranking: Any) -> list[str]:
    """What this evaluation did not measure, said once in the summary."""
    out = []
    if not corruptions["rows"]:
        out.append("No corruptions were tested.")
    if not attacks:
        out.append("No adversarial attacks were tested.")
    if not degradation:
        out.append("No degradation operators were tested.")
    if not ranking["rows"]:
        out.append(f"Ranking metrics (NDCG, DRR): Not applicable: {txt(ranking['reason'])}")
    return out


def render_html(report: Mapping[str, Any]) -> str:
    """One self-contained HTML page for the report document (inline CSS, figures as data:
    images, no scripts, no external resources; every piece of caller text escaped, nulls
    shown as ``n/a``)."""
    target = as_map(report.get("target"))
    tester = as_map(report.get("tester"))
    metrics = as_map(report.get("metrics"))
    evaluation = as_map(report.get("evaluation"))
    tests = [t for t in as_list(report.get("tests")) if isinstance(t, Mapping)]
    accuracy = as_map(metrics.get("accuracy"))
    examples = example_groups(report.get("examples"), rule_words(target))
    corruptions = corruption_section(as_map(metrics.get("corruptions")), accuracy.get("value"),
                                     examples)
    attacks = attack_rows(as_map(metrics.get("attacks")), tests, examples.get("attack") or {})
    degradation = degradation_profiles(metrics.get("degradation"),
                                       examples.get("degradation") or {})
    ranking = ranking_section(metrics.get("ranking"))
    query_errors = query_error_rows(metrics.get("query_errors"))
    canary = canary_section(report.get("canary"), [a["name"] for a in attacks])
    benchmark = benchmark_section(report.get("benchmark"))
    worst = corruptions["rows"][0] if corruptions["rows"] else None
    strongest = attacks[0] if attacks and is_number(attacks[0]["node"].get("success_rate")) \
        else None
    present = {"summary": True, "corruptions": bool(corruptions["rows"]),
               "attacks": bool(attacks), "canary": canary is not None,
               "benchmark": benchmark is not None, "degradation": bool(degradation),
               "worst-case": True, "ranking": bool(ranking["rows"]),
               "query-errors": bool(query_errors), "tests": bool(tests), "target": True,
               "ledger": True, "environment": True, "plan": True, "repeat": True}
    return _environment().get_template("report.html.j2").render(
        report=report, target=target, tester=tester, metrics=metrics, evaluation=evaluation,
        accuracy=accuracy, verdict=verdict_section(report.get("verdict")),
        sequential=sequential_section(report.get("sequential")),
        failed=[f for f in as_list(report.get("failed_settings")) if isinstance(f, Mapping)],
        cards=key_figures(metrics, accuracy), worst=worst, strongest=strongest,
        scope=_scope(corruptions, attacks, degradation, ranking),
        metrics_used=[m for m in as_list(report.get("metrics_used")) if isinstance(m, Mapping)],
        repeat=as_map(report.get("repeat")),
        date=evaluation.get("ended_at") or evaluation.get("started_at"),
        corruptions=corruptions, attacks=attacks,
        attack_figures=attack_figures(attacks, accuracy.get("value")),
        canary=canary, benchmark=benchmark, degradation=degradation,
        query_errors=query_errors, ranking=ranking, tests=test_rows(tests),
        service_parameters=service_parameter_rows(report, target), roles=role_rows(tester),
        evaluation_rows=evaluation_rows(evaluation), ledger=as_map(report.get("ledger")),
        estimate=estimate_section(report.get("estimate")),
        present=present, nav=[(a, label) for a, label in _SECTIONS if present.get(a)],
        title=f"Fortis robustness report: {target.get('name') or 'target'}") + "\n"


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float as None: strict JSON has no NaN/Infinity, and the
    HTML page prints such a number as "n/a". Without this, an Inf anywhere in the report parts
    a caller sends would fail json.dumps (INTERNAL)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def report_json(report: Mapping[str, Any]) -> str:
    """``report.json``'s text: indent 2, sorted keys, strict JSON (a number that is not finite
    is null), UTF-8 as is."""
    return json.dumps(_finite(report), indent=2, sort_keys=True, allow_nan=False,
                      ensure_ascii=False)


def write_report(report: Mapping[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """Write ``report.json`` and ``report.html`` into ``out_dir`` (created if needed);
    returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out_dir / "report.json", out_dir / "report.html"
    _atomic_write(json_path, report_json(report) + "\n")
    _atomic_write(html_path, render_html(report))
    return json_path, html_path
