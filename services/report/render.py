"""``report.html``: one self-contained page from the report document, by Jinja2 templates.

The page is IEEE-P4's human-readable report: inline CSS and inline SVG charts, no scripts, no
external resources, and a Content-Security-Policy that forbids loading any. The templates
(``templates/*.html.j2``, shipped in the package and loaded with ``PackageLoader``) are
rendered with autoescaping on, so every name, plan line or error text from the caller is text,
never markup; this module only shapes the document into rows and chart coordinates the
templates draw. :func:`write_report` writes ``report.json`` and ``report.html`` atomically.
Pure domain code (no gRPC).
"""

from __future__ import annotations

import functools
import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import jinja2

__all__ = ["render_html", "report_json", "write_report"]

#: The page's table of contents: every anchor is a section the template always renders.
_NAV: Final = (("summary", "Summary"), ("tests", "Tests"), ("corruptions", "Corruptions"),
               ("attacks", "Attacks"), ("worst-case", "Worst case"),
               ("degradation", "Degradation"), ("ranking", "Ranking"), ("ledger", "Ledger"),
               ("environment", "Environment"), ("plan", "Plan"), ("repeat", "Repeat"))

# --------------------------------------------------------------------------------------------
# filters: how a value reads on the page (None -> "n/a", rates as percentages)
# --------------------------------------------------------------------------------------------


def _txt(value: Any) -> str:
    """Any value as text; ``None`` becomes ``n/a``, floats six significant digits."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list | tuple):
        return ", ".join("n/a" if v is None else str(v) for v in value)
    return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _pct(value: Any) -> str:
    return f"{100.0 * value:.2f}%" if _is_number(value) else "n/a"


def _ci(ci: Any) -> str:
    if not isinstance(ci, Sequence) or isinstance(ci, str) or len(ci) != 2 or None in ci:
        return "n/a"
    return f"[{_pct(ci[0])}, {_pct(ci[1])}]"


def _num(value: Any, digits: int = 1) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _txt(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}f}" if math.isfinite(value) else "n/a"


def _party(value: Any) -> Any:
    """A role as 'name (organisation)' when it is a {name, organisation} record."""
    if isinstance(value, Mapping):
        name = value.get("name") or ""
        org = value.get("organisation") or value.get("organization") or ""
        if name or org:
            return f"{name} ({org})" if name and org else (name or org)
        return None
    return value


def _json_text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _nested_list(value: Any) -> bool:
    """A list shown as an ordered list (it holds mappings or lists), not as one line."""
    return isinstance(value, list | tuple) and any(isinstance(v, Mapping | list | tuple)
                                                   for v in value)


@functools.cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("fortis.services.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(txt=_txt, pct=_pct, ci=_ci, num=_num, party=_party, json_text=_json_text)
    env.tests["nested_list"] = _nested_list
    return env


# --------------------------------------------------------------------------------------------
# views: the document shaped into what the tables and charts show
# --------------------------------------------------------------------------------------------


def _severity_keys(node: Mapping[str, Any]) -> list[str]:
    keys = [k for k in node if k.lstrip("-").isdigit() and isinstance(node[k], Mapping)]
    return sorted(keys, key=int)


def _chart(name: str, node: Mapping[str, Any], accuracy: Any) -> dict[str, Any]:
    """Coordinates of one robustness-vs-severity chart (95 % CI bars, dashed clean accuracy)."""
    sevs = _severity_keys(node)
    w, h, left, right, top, bottom = 260, 170, 38, 12, 14, 30
    pw, ph = w - left - right, h - top - bottom

    def x(n: int) -> float:
        return left + (pw / 2 if len(sevs) == 1 else pw * n / (len(sevs) - 1))

    def y(v: float) -> float:
        return top + ph * (1.0 - max(0.0, min(1.0, v)))

    bars, points = [], []
    for n, s in enumerate(sevs):
        r, ci = node[s].get("robustness"), node[s].get("ci95")
        if not _is_number(r):
            continue
        if isinstance(ci, Sequence) and len(ci) == 2 and all(_is_number(v) for v in ci):
            bars.append({"x": f"{x(n):.1f}", "y1": f"{y(ci[0]):.1f}", "y2": f"{y(ci[1]):.1f}"})
        points.append({"x": f"{x(n):.1f}", "y": f"{y(r):.1f}", "label": s, "value": r})
    return {
        "name": name, "w": w, "h": h, "left": left, "right": w - right, "top": top,
        "bottom": top + ph, "mid_x": f"{left + pw / 2:.1f}",
        "grid": [{"y": f"{y(t):.1f}", "label_y": f"{y(t) + 3:.1f}", "label": f"{int(t * 100)}%"}
                 for t in (0.0, 0.25, 0.5, 0.75, 1.0)],
        "accuracy": accuracy,
        "accuracy_y": f"{y(accuracy):.1f}" if _is_number(accuracy) else None,
        "ticks": [{"x": f"{x(n):.1f}", "label": s} for n, s in enumerate(sevs)],
        "bars": bars, "points": points,
        "polyline": " ".join(f"{p['x']},{p['y']}" for p in points),
    }


def _corruptions(corruptions: Mapping[str, Any], accuracy: Any) -> dict[str, Any]:
    nodes = {name: node for name, node in corruptions.items() if isinstance(node, Mapping)}
    sevs = sorted({s for node in nodes.values() for s in _severity_keys(node)}, key=int)
    rows = []
    for name, node in nodes.items():
        mean = node.get("mean")
        rows.append({"name": name,
                     "cells": [node.get(s) if isinstance(node.get(s), Mapping) else None
                               for s in sevs],
                     "mean": mean.get("robustness") if isinstance(mean, Mapping) else mean,
                     "chart": _chart(name, node, accuracy)})
    return {"severities": sevs, "rows": rows}


def _attacks(attacks: Mapping[str, Any], tests: Sequence[Mapping[str, Any]]) -> list[Any]:
    by_id = {t.get("id"): t for t in tests}
    rows = []
    for name, node in attacks.items():
        if not isinstance(node, Mapping):
            continue
        t = by_id.get(name, {})
        rows.append({"name": name, "node": node, "kind": node.get("kind", t.get("kind")),
                     "epsilon": t.get("epsilon"), "norm": t.get("norm"),
                     "criterion": t.get("criterion"), "signal": t.get("signal_note")})
    return rows


def _by_level(rows: Any) -> dict[str, Mapping[str, Any]]:
    return {str(r.get("level")): r for r in rows or [] if isinstance(r, Mapping)}


def _degradation(degradation: Any) -> list[dict[str, Any]]:
    if not isinstance(degradation, Mapping):
        return []
    out = []
    for op, prof in degradation.items():
        if not isinstance(prof, Mapping):
            continue
        rank, prob = _by_level(prof.get("rank")), _by_level(prof.get("probability"))
        changes = {str(r.get("level")): r.get("change") for r in prof.get("changes") or []
                   if isinstance(r, Mapping)}
        rows = []
        for lv, a in _by_level(prof.get("accuracy")).items():
            change = changes.get(lv)
            rows.append({"level": lv, "accuracy": a.get("value"), "ci95": a.get("ci95"),
                         "rank": rank.get(lv, {}).get("value"),
                         "probability": prob.get(lv, {}).get("value"),
                         "changed": change.get("fraction_of_pixels_changed")
                         if isinstance(change, Mapping) else None})
        fps = [{"threshold": float(t),
                "level": fp.get("level") if isinstance(fp, Mapping) else None,
                "example": fp.get("example_image") if isinstance(fp, Mapping) else None}
               for t, fp in (prof.get("failure_points") or {}).items()]
        out.append({"name": op, "m": prof.get("m"), "m_used": prof.get("m_used"), "rows": rows,
                    "failure_points": fps})
    return out


def _query_errors(qe: Any) -> list[dict[str, Any]]:
    if not isinstance(qe, Mapping) or not qe.get("total"):
        return []
    return [{"name": name, "node": node,
             "examples": [x for x in (node.get("examples") or [])[:3] if isinstance(x, Mapping)]}
            for name, node in (qe.get("settings") or {}).items() if isinstance(node, Mapping)]


def _ranking(ranking: Any) -> dict[str, Any]:
    ranking = ranking if isinstance(ranking, Mapping) else {}
    k = ranking.get("drr_k") or 5
    rows = []
    if ranking.get("applicable"):
        for name, r in (ranking.get("settings") or {}).items():
            if isinstance(r, Mapping):
                at = r.get("ndcg_at") or []
                rows.append({"name": name, "ndcg_1": r.get("ndcg_1"),
                             "ndcg_5": at[4] if len(at) > 4 else None,
                             "drr": r.get(f"drr_{k}"), "m": r.get("m")})
    return {"rows": rows, "k": k, "reason": ranking.get("reason"),
            "gamma_b": ranking.get("gamma_b"), "gamma_a": ranking.get("gamma_a")}


def render_html(report: Mapping[str, Any]) -> str:
    """One self-contained HTML page for the report document (inline CSS and SVG, no scripts,
    no external resources; every piece of caller text escaped, nulls shown as ``n/a``)."""
    target = report.get("target") or {}
    tester = report.get("tester") or {}
    metrics = report.get("metrics") or {}
    evaluation = report.get("evaluation") or {}
    tests = [t for t in report.get("tests") or [] if isinstance(t, Mapping)]
    accuracy = metrics.get("accuracy") or {}
    return _environment().get_template("report.html.j2").render(
        report=report, target=target, tester=tester, roles=tester.get("roles") or {},
        metrics=metrics, evaluation=evaluation, tests=tests, accuracy=accuracy,
        metrics_used=[m for m in report.get("metrics_used") or [] if isinstance(m, Mapping)],
        repeat=report.get("repeat") or {},
        date=evaluation.get("ended_at") or evaluation.get("started_at"),
        corruptions=_corruptions(metrics.get("corruptions") or {}, accuracy.get("value")),
        attacks=_attacks(metrics.get("attacks") or {}, tests),
        degradation=_degradation(metrics.get("degradation")),
        query_errors=_query_errors(metrics.get("query_errors")),
        ranking=_ranking(metrics.get("ranking")),
        nav=_NAV,
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
    HTML page prints such a number as "n/a" (issue 9: an Inf anywhere in the report parts a
    caller sends used to fail json.dumps, INTERNAL)."""
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
