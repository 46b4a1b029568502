"""The evaluation report of IEEE Std 3129-2023 section 4.6 (IEEE-P4), as JSON and HTML.

Pure domain code (no gRPC). :func:`build_report` assembles one plain, JSON-able dict;
:func:`render_html` turns it into ONE self-contained HTML file (inline CSS and inline SVG
charts; no scripts, no external resources, a Content-Security-Policy that forbids loading
any); :func:`write_report` writes ``report.json`` and ``report.html``.

``report.json`` top-level keys (``schema_version`` ``fortis.report/v1``):

    schema_version      "fortis.report/v1"
    plan                the parsed plan                                        IEEE-P3
    plan_text           the plan exactly as submitted                          IEEE-P4 (repeat)
    target              name, task_type, endpoint, output_kind, labels_count, version (+ other
                        non-secret keys); user:password in an endpoint URL is redacted
    tester              the tester record + roles {requester, tester, provider}  IEEE-P1
    environment         python, torch, numpy, fortis versions, platform, seeds
    service_parameters  service-type parameters and the correctness rule       IEEE-P3, C1/C2
    metrics_used        the metric names and where the standard defines them   IEEE-P4
    metrics             the tree of fortis.services.scoring.ieee               IEEE-M1..M8
    tests               one entry per corruption/attack: id, kind, ieee_ref, image_source,
                        parameters, severities, epsilon, norm, query_budget, steps, metrics
    ledger              query totals per session/stage, as the proxy recorded them
    evaluation          id, started_at, ended_at, duration_s, ...
    repeat              command, plan_file, seeds, instructions                IEEE-P4
"""

from __future__ import annotations

import datetime as _dt
import html
import importlib.metadata
import json
import math
import os
import platform
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from fortis.services.common.errors import InvalidArgument

__all__ = ["SCHEMA_VERSION", "build_report", "render_html", "write_report"]

SCHEMA_VERSION = "fortis.report/v1"

#: Keys never copied from the target record into a report (credentials stay out of it).
_SECRET_KEY = re.compile(r"(password|passwd|secret|token|api[_-]?key|credential|^auth)",
                         re.IGNORECASE)

_TARGET_ALIASES = {
    "name": ("name", "id"),
    "task_type": ("task_type", "task", "type"),
    "endpoint": ("endpoint", "address", "url"),
    "output_kind": ("output_kind", "output"),
    "labels_count": ("labels_count", "label_count", "num_labels", "num_classes"),
    "version": ("version", "model_version"),
}

_DEFAULT_REF = {
    "corruption": "IEEE 3129 4.7.2, 4.7.4, 5.2/5.3, Annex A.1 (IEEE-A1..A6, IEEE-M2/M4/M7)",
    "attack": "IEEE 3129 4.7.3, 4.7.5, 5.4, Annex A.2 (IEEE-A7/A8, IEEE-M3/M5/M6)",
    "degradation": "Swingler 2022, incremental degradation operators (DEG-1..DEG-5)",
}
_DEFAULT_METRICS = {
    "corruption": ["Robustness_Corr", "Average_Robustness_Corr", "WorstCase_Robustness_Corr"],
    "attack": ["Robustness_Adv", "Average_Robustness_Adv", "WorstCase_Robustness_Adv",
               "attack success rate", "mean queries", "median queries"],
    "degradation": ["accuracy per level", "mean true-label rank per level",
                    "mean true-label probability per level", "failure points at 90/50/10%"],
}
_DEFAULT_STEPS = {
    "corruption": ["Apply the corruption alone (IEEE-P5) at each listed severity to each of the "
                   "M clean images, seeded from the plan",
                   "Send every corrupted image to the target through the proxy (one query per "
                   "image)",
                   "Judge each answer with the plan's correctness rule; Corr_Result(i, j)"],
    "attack": ["Run the attack on each clean image within the Lp bound epsilon fixed in the "
               "plan (IEEE-A9), seeded from the plan",
               "Query attacks stop at the first success or at the budget Q_m; every query "
               "goes through the proxy, which counts it",
               "Judge the adversarial image the target received; Adv_Result(i, j)"],
    "degradation": ["Apply the operator incrementally (level L = the operator applied L times) "
                    "to each clean image at its model input size, seeded from the plan",
                    "Send each degraded image to the target through the proxy (one query per "
                    "image and level)",
                    "Profile accuracy, true-label rank and probability against level on the "
                    "images correct at level 0; failure points at 90/50/10%"],
}

METRICS_USED = [
    {"name": "Accuracy", "ref": "IEEE 3129 4.7.1 eq. (1), IEEE-M1"},
    {"name": "Robustness_Corr (per corruption and severity)",
     "ref": "IEEE 3129 4.7.2 eq. (2), 5.2, IEEE-M2/M7"},
    {"name": "Average_Robustness_Corr", "ref": "IEEE 3129 4.7.2 eq. (3), IEEE-M2"},
    {"name": "WorstCase_Robustness_Corr", "ref": "IEEE 3129 4.7.4 eq. (6), IEEE-M4"},
    {"name": "Robustness_Adv", "ref": "IEEE 3129 4.7.3 eq. (4), IEEE-M3"},
    {"name": "Average_Robustness_Adv", "ref": "IEEE 3129 4.7.3 eq. (5), IEEE-M3"},
    {"name": "WorstCase_Robustness_Adv", "ref": "IEEE 3129 4.7.5 eq. (7), IEEE-M5"},
    {"name": "Attack success rate, mean/median queries, budget Q_m",
     "ref": "IEEE 3129 5.4, IEEE-M6"},
    {"name": "95 % Wilson confidence interval for every rate", "ref": "IEEE-M8"},
]


# --------------------------------------------------------------------------------------------
# build
# --------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A JSON-able copy: mappings -> dicts with str keys, sequences -> lists, NaN/inf -> None,
    numpy scalars -> Python numbers, anything else -> str."""
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [_plain(v) for v in items]
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        try:
            return _plain(value.item())
        except (TypeError, ValueError):
            pass
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy array
        return _plain(value.tolist())
    if isinstance(value, _dt.datetime | _dt.date):
        return value.isoformat()
    return str(value)


def _redact_url(endpoint: Any) -> Any:
    """Drop ``user:password@`` from an endpoint URL."""
    if not isinstance(endpoint, str) or "@" not in endpoint or "://" not in endpoint:
        return endpoint
    parts = urlsplit(endpoint)
    if parts.username is None and parts.password is None:
        return endpoint
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, "***@" + host, parts.path, parts.query, parts.fragment))


def _target(target: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    used: set[str] = set()
    for key, aliases in _TARGET_ALIASES.items():
        out[key] = None
        for alias in aliases:
            if target.get(alias) is not None:
                out[key] = _plain(target[alias])
                used.add(alias)
                break
    if out["labels_count"] is None and isinstance(target.get("labels"), Sequence):
        out["labels_count"] = len(target["labels"])
    used.add("labels")
    out["endpoint"] = _redact_url(out["endpoint"])
    for key, value in target.items():
        if key in used or key in out:
            continue
        if _SECRET_KEY.search(str(key)) and not str(key).endswith(("_ref", "_reference")):
            continue
        out[str(key)] = _plain(value)
    return out


def _tester(tester: Mapping[str, Any], plan: Mapping[str, Any]) -> dict[str, Any]:
    out = _plain(dict(tester))
    roles_in = tester.get("roles") or plan.get("roles") or {}
    roles = {role: _plain(roles_in.get(role)) if isinstance(roles_in, Mapping) else None
             for role in ("requester", "tester", "provider")}
    for role in ("requester", "provider"):
        if roles[role] is None and tester.get(role) is not None:
            roles[role] = _plain(tester[role])
    if roles["tester"] is None:
        roles["tester"] = _plain(tester.get("name"))
    out["roles"] = roles
    return out


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _environment(environment: Mapping[str, Any], plan: Mapping[str, Any]) -> dict[str, Any]:
    fortis_version: str | None
    try:
        from fortis import __version__ as fortis_version
    except ImportError:  # pragma: no cover - the SDK package is part of the distribution
        fortis_version = _version("fortis")
    np_version = sys.modules["numpy"].__version__ if "numpy" in sys.modules else _version("numpy")
    detected = {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "numpy": np_version,
        "fortis": fortis_version,
        "platform": platform.platform(),
    }
    out = {**detected, **_plain(dict(environment))}
    if out.get("seeds") is None:
        if plan.get("seeds") is not None:
            out["seeds"] = _plain(plan["seeds"])
        elif plan.get("seed") is not None:
            out["seeds"] = {"seed": _plain(plan["seed"])}
        else:
            out["seeds"] = None
    return out


def _tests(tests: Sequence[Mapping[str, Any]], plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    default_source = plan.get("image_source", plan.get("images"))
    out: list[dict[str, Any]] = []
    for n, test in enumerate(tests):
        if not isinstance(test, Mapping):
            raise InvalidArgument(f"tests[{n}]", "must be a mapping")
        test_id = test.get("id")
        if not isinstance(test_id, str) or not test_id:
            raise InvalidArgument(f"tests[{n}].id", "each test needs a non-empty id")
        kind = test.get("kind")
        if kind not in ("corruption", "attack", "degradation"):
            raise InvalidArgument(f"tests[{n}].kind",
                                  f"must be 'corruption', 'attack' or 'degradation'; got {kind!r}")
        entry: dict[str, Any] = {
            "id": test_id,
            "kind": kind,
            "ieee_ref": test.get("ieee_ref") or _DEFAULT_REF[kind],
            "image_source": _plain(test.get("image_source", default_source)),
            "parameters": _plain(test.get("parameters") or {}),
            "severities": _plain(test.get("severities")),
            "epsilon": _plain(test.get("epsilon")),
            "norm": _plain(test.get("norm")),
            "query_budget": _plain(test.get("query_budget")),
            "steps": _as_list(test.get("steps") or _DEFAULT_STEPS[kind]),
            "metrics": _as_list(test.get("metrics") or _DEFAULT_METRICS[kind]),
        }
        for key, value in test.items():
            entry.setdefault(str(key), _plain(value))
        out.append(entry)
    return out


def _parse_time(value: Any) -> _dt.datetime | None:
    if isinstance(value, _dt.datetime):
        return value
    if isinstance(value, str):
        try:
            return _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


def _evaluation(evaluation: Mapping[str, Any]) -> dict[str, Any]:
    out = _plain(dict(evaluation))
    if out.get("duration_s") is None:
        start, end = _parse_time(evaluation.get("started_at")), _parse_time(
            evaluation.get("ended_at"))
        if start is not None and end is not None:
            try:
                out["duration_s"] = (end - start).total_seconds()
            except TypeError:  # naive vs aware
                out["duration_s"] = None
        else:
            out["duration_s"] = None
    return out


def _extra_metrics_used(metrics: Mapping[str, Any]) -> list[dict[str, str]]:
    """The metric families beyond IEEE 3129 that this evaluation computed."""
    out: list[dict[str, str]] = []
    rk = metrics.get("ranking") if isinstance(metrics, Mapping) else None
    if isinstance(rk, Mapping) and rk.get("applicable"):
        out.append({"name": "NDCG@k and NDCG@1 of each setting's answers against the clean answers",
                    "ref": "Brama, Dery, Grinshpoun (RANK-1)"})
        out.append({"name": "Defense reciprocal rank DRR@5", "ref": "Brama, Dery, Grinshpoun (RANK-2)"})
    if isinstance(metrics, Mapping) and metrics.get("degradation"):
        out.append({"name": "Degradation profiles (accuracy, true-label rank and probability per "
                            "level) and failure points at 90/50/10%",
                    "ref": "Swingler 2022 (DEG-2..DEG-4)"})
    attacks = metrics.get("attacks") if isinstance(metrics, Mapping) else None
    if isinstance(attacks, Mapping) and any(
            isinstance(a, Mapping) and a.get("median_l2_successful") is not None for a in attacks.values()):
        out.append({"name": "Minimal perturbation L2 of the images misled (mean, median)",
                    "ref": "Zhong, Hu, Chen 2020 (PER-3, PER-4)"})
    return out


def build_report(*, plan: Mapping[str, Any], plan_text: str, target: Mapping[str, Any],
                 tester: Mapping[str, Any], environment: Mapping[str, Any],
                 metrics: Mapping[str, Any], tests: Sequence[Mapping[str, Any]],
                 ledger: Mapping[str, Any], evaluation: Mapping[str, Any]) -> dict[str, Any]:
    """Assemble the IEEE 3129 4.6 report (IEEE-P1, P3, P4; metrics IEEE-M1..M8).

    Everything is copied into plain JSON-able values. ``environment`` overrides the versions
    detected here; seeds come from ``environment['seeds']`` or the plan. ``evaluation`` may
    carry ``plan_file`` (the name the repeat command uses, default ``plan.yaml``) and
    ``repeat_command`` (to override the command itself).
    """
    if not isinstance(plan_text, str):
        raise InvalidArgument("plan_text", "must be the plan's text")
    env = _environment(environment, plan)
    plan_file = str(evaluation.get("plan_file") or "plan.yaml")
    command = str(evaluation.get("repeat_command") or f"fortis run {plan_file}")
    service_parameters = _plain(plan.get("service_parameters")
                                or plan.get("service_type_parameters") or {})
    if "correctness" not in service_parameters and plan.get("correctness") is not None:
        service_parameters["correctness"] = _plain(plan["correctness"])
    return {
        "schema_version": SCHEMA_VERSION,
        "plan": _plain(plan),
        "plan_text": plan_text,
        "target": _target(target),
        "tester": _tester(tester, plan),
        "environment": env,
        "service_parameters": service_parameters,
        "metrics_used": [dict(m) for m in METRICS_USED] + _extra_metrics_used(metrics),
        "metrics": _plain(metrics),
        "tests": _tests(tests, plan),
        "ledger": _plain(dict(ledger)),
        "evaluation": _evaluation(evaluation),
        "repeat": {
            "command": command,
            "plan_file": plan_file,
            "seeds": env.get("seeds"),
            "seeds_in_plan": True,
            "instructions": [
                f"Save the report's plan_text verbatim as {plan_file} (it is also shown in full "
                "in this report).",
                "Install the versions listed under environment (python, torch, numpy, fortis).",
                f"Run: {command}",
                "Every random operation is seeded from the seeds in the plan, so the same plan "
                "and versions reproduce the same corrupted and adversarial images; a "
                "non-deterministic target can still answer differently.",
            ],
        },
    }


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------

_CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:2em auto;
max-width:72em;padding:0 1em;color:#1d2430;line-height:1.4}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.25em;border-bottom:2px solid #d0d7e2;
padding-bottom:.2em;margin-top:1.8em}h3{font-size:1.05em;margin-bottom:.3em}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:.92em}
th,td{border:1px solid #d0d7e2;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#eef2f7}td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f5f7fa;border:1px solid #d0d7e2;padding:.8em;overflow-x:auto;
white-space:pre-wrap;word-break:break-word;font-size:.88em}
.charts{display:flex;flex-wrap:wrap;gap:1em}.chart{border:1px solid #d0d7e2;padding:.4em}
.chart figcaption{font-size:.85em;text-align:center}.muted{color:#66707d}
.big{font-size:1.3em;font-weight:600}code{background:#f5f7fa;padding:0 .25em}
nav a{margin-right:.8em}
"""

_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def _e(value: Any) -> str:
    """Escape any value as HTML text; ``None`` becomes ``n/a``."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return html.escape(f"{value:.6g}")
    if isinstance(value, list | tuple):
        return html.escape(", ".join("n/a" if v is None else str(v) for v in value))
    return html.escape(str(value), quote=True)


def _pct(value: Any) -> str:
    if value is None or not isinstance(value, int | float) or isinstance(value, bool):
        return "n/a"
    return f"{100.0 * value:.2f}%"


def _ci(ci: Any) -> str:
    if not isinstance(ci, Sequence) or isinstance(ci, str) or len(ci) != 2 or None in ci:
        return "n/a"
    return f"[{_pct(ci[0])}, {_pct(ci[1])}]"


def _as_list(value: Any) -> list[Any]:
    """Steps and metrics are lists; a single string is one item (not one item per letter)."""
    if isinstance(value, str):
        return [value]
    return list(_plain(value))


def _party(value: Any) -> Any:
    """A role as 'name (organisation)' when it is a {name, organisation} record."""
    if isinstance(value, Mapping):
        name = value.get("name") or ""
        org = value.get("organisation") or value.get("organization") or ""
        if name or org:
            return f"{name} ({org})" if name and org else (name or org)
    return value


def _num(value: Any, digits: int = 1) -> str:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return "n/a" if value is None else _e(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}f}"


def _kv(mapping: Any, depth: int = 0) -> str:
    """A key/value table for any nested mapping (escaped)."""
    if not isinstance(mapping, Mapping):
        return _value(mapping, depth)
    if not mapping:
        return '<span class="muted">none</span>'
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_value(v, depth + 1)}</td></tr>"
                   for k, v in mapping.items())
    return f'<table class="kv">{rows}</table>'


def _value(value: Any, depth: int) -> str:
    if isinstance(value, Mapping):
        return _kv(value, depth) if depth < 6 else _e(json.dumps(value, sort_keys=True))
    if isinstance(value, list | tuple) and any(isinstance(v, Mapping | list | tuple)
                                               for v in value):
        if depth >= 6:
            return _e(json.dumps(value, sort_keys=True, default=str))
        return "<ol>" + "".join(f"<li>{_value(v, depth + 1)}</li>" for v in value) + "</ol>"
    return _e(value)


def _severity_keys(node: Mapping[str, Any]) -> list[str]:
    keys = [k for k in node if k.lstrip("-").isdigit() and isinstance(node[k], Mapping)]
    return sorted(keys, key=int)


def _svg_chart(name: str, node: Mapping[str, Any], accuracy: float | None) -> str:
    """Inline SVG: robustness vs severity with 95 % CI bars; dashed line = clean accuracy."""
    sevs = _severity_keys(node)
    w, h, left, right, top, bottom = 260, 170, 38, 12, 14, 30
    pw, ph = w - left - right, h - top - bottom

    def x(n: int) -> float:
        return left + (pw / 2 if len(sevs) == 1 else pw * n / (len(sevs) - 1))

    def y(v: float) -> float:
        return top + ph * (1.0 - max(0.0, min(1.0, v)))

    parts = [f'<svg width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
             f'aria-label="Robustness of {_e(name)} by severity">',
             f"<title>{_e(name)}: robustness vs severity</title>"]
    for t in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{left}" y1="{y(t):.1f}" x2="{w - right}" y2="{y(t):.1f}" '
                     f'stroke="#e3e8ef" stroke-width="1"/>')
        parts.append(f'<text x="{left - 4}" y="{y(t) + 3:.1f}" font-size="9" '
                     f'text-anchor="end" fill="#66707d">{int(t * 100)}%</text>')
    parts.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="#8a94a3"/>')
    parts.append(f'<line x1="{left}" y1="{top + ph}" x2="{w - right}" y2="{top + ph}" '
                 f'stroke="#8a94a3"/>')
    if isinstance(accuracy, int | float):
        parts.append(f'<line x1="{left}" y1="{y(accuracy):.1f}" x2="{w - right}" '
                     f'y2="{y(accuracy):.1f}" stroke="#2e8540" stroke-dasharray="4 3">'
                     f"<title>clean accuracy {_pct(accuracy)}</title></line>")
    points = []
    for n, s in enumerate(sevs):
        r = node[s].get("robustness")
        parts.append(f'<text x="{x(n):.1f}" y="{h - 14}" font-size="9" text-anchor="middle" '
                     f'fill="#66707d">{_e(s)}</text>')
        if not isinstance(r, int | float):
            continue
        ci = node[s].get("ci95")
        if isinstance(ci, Sequence) and len(ci) == 2 and None not in ci:
            parts.append(f'<line x1="{x(n):.1f}" y1="{y(ci[0]):.1f}" x2="{x(n):.1f}" '
                         f'y2="{y(ci[1]):.1f}" stroke="#9db4d6" stroke-width="3"/>')
        points.append((x(n), y(r), s, r))
    if len(points) > 1:
        coords = " ".join(f"{px:.1f},{py:.1f}" for px, py, _, _ in points)
        parts.append(f'<polyline points="{coords}" fill="none" stroke="#1f5fa8" '
                     f'stroke-width="2"/>')
    for px, py, s, r in points:
        parts.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3.5" fill="#1f5fa8">'
                     f"<title>severity {_e(s)}: {_pct(r)}</title></circle>")
    parts.append(f'<text x="{left + pw / 2:.1f}" y="{h - 2}" font-size="9" '
                 f'text-anchor="middle" fill="#66707d">severity</text>')
    parts.append("</svg>")
    return "".join(parts)


def _metric_row(label: str, node: Any, key: str = "value") -> str:
    node = node if isinstance(node, Mapping) else {}
    return (f"<tr><th>{_e(label)}</th><td class='num'>{_pct(node.get(key))}</td>"
            f"<td class='num'>{_ci(node.get('ci95'))}</td>"
            f"<td class='num'>{_num(node.get('correct'))}</td>"
            f"<td class='num'>{_num(node.get('m'))}</td></tr>")


_METRIC_HEAD = ("<tr><th>metric</th><th>value</th><th>95% CI</th><th>correct</th>"
                "<th>M</th></tr>")


def _section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}"><h2>{_e(title)}</h2>{body}</section>'


def render_html(report: Mapping[str, Any]) -> str:
    """One self-contained HTML page for ``report`` (inline CSS and SVG, no scripts, no
    external resources; every piece of user text escaped, nulls shown as ``n/a``)."""
    target = report.get("target") or {}
    tester = report.get("tester") or {}
    metrics = report.get("metrics") or {}
    evaluation = report.get("evaluation") or {}
    tests = [t for t in report.get("tests") or [] if isinstance(t, Mapping)]
    tests_by_id = {t.get("id"): t for t in tests}
    accuracy = metrics.get("accuracy") or {}
    corruptions = metrics.get("corruptions") or {}
    attacks = metrics.get("attacks") or {}
    date = evaluation.get("ended_at") or evaluation.get("started_at")
    sections: list[str] = []

    # summary ---------------------------------------------------------------------------
    roles = tester.get("roles") or {}
    summary = (
        "<table>"
        f"<tr><th>Target</th><td>{_e(target.get('name'))} "
        f"({_e(target.get('task_type'))}, version {_e(target.get('version'))})</td></tr>"
        f"<tr><th>Tester</th><td>{_e(tester.get('name'))}"
        f"{' &mdash; ' + _e(tester.get('organization')) if tester.get('organization') else ''}"
        "</td></tr>"
        f"<tr><th>Test requester</th><td>{_e(_party(roles.get('requester')))}</td></tr>"
        f"<tr><th>Service provider</th><td>{_e(_party(roles.get('provider')))}</td></tr>"
        f"<tr><th>Evaluation</th><td>{_e(evaluation.get('id'))}</td></tr>"
        f"<tr><th>Date</th><td>{_e(date)}</td></tr>"
        f"<tr><th>Images (M)</th><td>{_num(accuracy.get('m', metrics.get('m')))}</td></tr>"
        f"<tr><th>Accuracy</th><td><span class='big'>{_pct(accuracy.get('value'))}</span> "
        f"95% CI {_ci(accuracy.get('ci95'))}</td></tr>"
        f"<tr><th>Average_Robustness_Corr</th>"
        f"<td>{_pct((metrics.get('average_robustness_corr') or {}).get('value'))}</td></tr>"
        f"<tr><th>Average_Robustness_Adv</th>"
        f"<td>{_pct((metrics.get('average_robustness_adv') or {}).get('value'))}</td></tr>"
        "</table>")
    sections.append(_section("summary", "Summary", summary))

    sections.append(_section("target", "Target service", _kv(target)))
    sections.append(_section("tester", "Tester and roles (IEEE-P1)", _kv(tester)))
    sections.append(_section("service-parameters", "Service-type parameters",
                             _kv(report.get("service_parameters") or {})))

    used = "".join(f"<tr><td>{_e(m.get('name'))}</td><td>{_e(m.get('ref'))}</td></tr>"
                   for m in report.get("metrics_used") or [] if isinstance(m, Mapping))
    sections.append(_section("metrics-used", "Metrics used",
                             f"<table><tr><th>metric</th><th>definition</th></tr>{used}"
                             "</table>"))

    # tests (IEEE-P4) -------------------------------------------------------------------
    blocks = []
    for t in tests:
        steps = "".join(f"<li>{_e(s)}</li>" for s in t.get("steps") or [])
        test_rows = "".join(
            f"<tr><th>{_e(label)}</th><td>{body}</td></tr>" for label, body in [
                ("kind", _e(t.get("kind"))),
                ("IEEE reference", _e(t.get("ieee_ref"))),
                ("image source", _value(t.get("image_source"), 1)),
                ("severities", _e(t.get("severities"))),
                ("epsilon (Lp bound)", _e(t.get("epsilon"))),
                ("norm", _e(t.get("norm"))),
                ("query budget Q_m", _e(t.get("query_budget"))),
                ("parameters", _kv(t.get("parameters") or {}, 1)),
                ("metrics", _e(t.get("metrics"))),
                ("steps", f"<ol>{steps}</ol>"),
            ])
        blocks.append(f"<h3>{_e(t.get('id'))}</h3><table>{test_rows}</table>")
    sections.append(_section("tests", "Tests performed (IEEE-P4)",
                             "".join(blocks) or "<p class='muted'>none</p>"))

    # corruptions -----------------------------------------------------------------------
    if corruptions:
        all_sevs = sorted({s for node in corruptions.values() if isinstance(node, Mapping)
                           for s in _severity_keys(node)}, key=int)
        head = ("<tr><th>corruption</th>" + "".join(f"<th>severity {_e(s)}</th>"
                                                     for s in all_sevs)
                + "<th>mean</th></tr>")
        rows: list[str] = []
        charts: list[str] = []
        for name, node in corruptions.items():
            if not isinstance(node, Mapping):
                continue
            cells = []
            for s in all_sevs:
                cell = node.get(s)
                if isinstance(cell, Mapping):
                    cells.append(f"<td class='num'>{_pct(cell.get('robustness'))}<br>"
                                 f"<span class='muted'>{_ci(cell.get('ci95'))}</span></td>")
                else:
                    cells.append("<td class='num muted'>n/a</td>")
            mean = node.get("mean")
            mean_v = mean.get("robustness") if isinstance(mean, Mapping) else mean
            rows.append(f"<tr><th>{_e(name)}</th>{''.join(cells)}"
                        f"<td class='num'>{_pct(mean_v)}</td></tr>")
            charts.append(f"<figure class='chart'>{_svg_chart(name, node, accuracy.get('value'))}"
                          f"<figcaption>{_e(name)}</figcaption></figure>")
        body = (f"<table>{head}{''.join(rows)}</table>"
                "<p class='muted'>Robustness_Corr per severity with its 95% Wilson interval. "
                "Charts: robustness vs severity, bars = 95% CI, dashed line = clean accuracy."
                f"</p><div class='charts'>{''.join(charts)}</div>")
    else:
        body = "<p class='muted'>No corruptions were tested.</p>"
    sections.append(_section("corruptions", "Corruption robustness (IEEE-M2, M7)", body))

    # attacks ---------------------------------------------------------------------------
    if attacks:
        head = ("<tr><th>attack</th><th>kind</th><th>epsilon</th><th>Robustness_Adv</th>"
                "<th>95% CI</th><th>success rate</th><th>95% CI</th><th>mean queries</th>"
                "<th>median queries</th><th>budget Q_m</th><th>errors</th></tr>")
        rows = []
        for name, a in attacks.items():
            if not isinstance(a, Mapping):
                continue
            t = tests_by_id.get(name, {})
            eps = t.get("epsilon")
            eps_s = _e(eps) + (f" ({_e(t.get('norm'))})" if t.get("norm") else "")
            rows.append(
                f"<tr><th>{_e(name)}</th><td>{_e(a.get('kind', t.get('kind')))}</td>"
                f"<td>{eps_s}</td><td class='num'>{_pct(a.get('robustness_adv'))}</td>"
                f"<td class='num'>{_ci(a.get('ci95'))}</td>"
                f"<td class='num'>{_pct(a.get('success_rate'))}</td>"
                f"<td class='num'>{_ci(a.get('success_rate_ci95'))}</td>"
                f"<td class='num'>{_num(a.get('mean_queries'))}</td>"
                f"<td class='num'>{_num(a.get('median_queries'))}</td>"
                f"<td class='num'>{_num(a.get('query_budget'))}</td>"
                f"<td class='num'>{_num(a.get('errors'))}</td></tr>")
        body = (f"<table>{head}{''.join(rows)}</table><p class='muted'>Success rate and "
                "queries are over the images the target got right before the attack; queries "
                "are counted by the proxy.</p>")
    else:
        body = "<p class='muted'>No adversarial attacks were tested.</p>"
    sections.append(_section("attacks", "Adversarial robustness (IEEE-M3, M6)", body))

    # aggregate / worst case ------------------------------------------------------------
    rows = [_metric_row("Accuracy (IEEE-M1)", accuracy),
            _metric_row("Average_Robustness_Corr (IEEE-M2)",
                        metrics.get("average_robustness_corr")),
            _metric_row("WorstCase_Robustness_Corr (IEEE-M4)",
                        metrics.get("worstcase_robustness_corr"))]
    for s, node in (metrics.get("worstcase_robustness_corr_by_severity") or {}).items():
        rows.append(_metric_row(f"WorstCase_Robustness_Corr at severity {s}", node))
    rows += [_metric_row("Average_Robustness_Adv (IEEE-M3)",
                         metrics.get("average_robustness_adv")),
             _metric_row("WorstCase_Robustness_Adv (IEEE-M5)",
                         metrics.get("worstcase_robustness_adv"))]
    sections.append(_section(
        "worst-case", "Aggregate and worst-case metrics (IEEE-M4, M5)",
        f"<table>{_METRIC_HEAD}{''.join(rows)}</table><p class='muted'>Averages are means "
        "of rates measured on the same images; no confidence interval is given for them.</p>"))

    # degradation profiles (DEG-2..DEG-4) -----------------------------------------------
    degradation = metrics.get("degradation")
    if isinstance(degradation, Mapping) and degradation:
        parts: list[str] = []
        for op, prof in degradation.items():
            if not isinstance(prof, Mapping):
                continue
            acc = {str(r.get("level")): r for r in prof.get("accuracy") or [] if isinstance(r, Mapping)}
            rank = {str(r.get("level")): r for r in prof.get("rank") or [] if isinstance(r, Mapping)}
            prob = {str(r.get("level")): r for r in prof.get("probability") or [] if isinstance(r, Mapping)}
            chg = {str(r.get("level")): r.get("change") for r in prof.get("changes") or []
                   if isinstance(r, Mapping)}
            head = ("<tr><th>level</th><th>accuracy</th><th>95% CI</th><th>mean rank</th>"
                    "<th>mean p(true)</th><th>pixels changed</th></tr>")
            rows = []
            for lv, a in acc.items():
                c = chg.get(lv)
                frac = c.get("fraction_of_pixels_changed") if isinstance(c, Mapping) else None
                rk = rank.get(lv, {})
                rows.append(f"<tr><th>{_e(lv)}</th><td class='num'>{_pct(a.get('value'))}</td>"
                            f"<td class='num'>{_ci(a.get('ci95'))}</td>"
                            f"<td class='num'>{_num(rk.get('value'), 2)}</td>"
                            f"<td class='num'>{_num(prob.get(lv, {}).get('value'), 3)}</td>"
                            f"<td class='num'>{_pct(frac)}</td></tr>")
            fps = []
            for t, fp in (prof.get("failure_points") or {}).items():
                where = (f"level {_e(fp.get('level'))} (example {_e(fp.get('example_image'))})"
                         if isinstance(fp, Mapping) else "never")
                fps.append(f"below {_pct(float(t))}: {where}")
            parts.append(f"<h3>{_e(op)}</h3><p>{_e(prof.get('m_used'))} of {_e(prof.get('m'))} images "
                         f"correct at level 0. Failure points: {'; '.join(fps) or 'n/a'}.</p>"
                         f"<table>{head}{''.join(rows)}</table>")
        sections.append(_section("degradation", "Degradation profiles (DEG-2..DEG-4)",
                                 "".join(parts)))

    # failed queries -------------------------------------------------------------------
    qe = metrics.get("query_errors")
    if isinstance(qe, Mapping) and qe.get("total"):
        rows = []
        for name, node in (qe.get("settings") or {}).items():
            if not isinstance(node, Mapping):
                continue
            ex = "; ".join(f"{_e(x.get('image_id'))}: {_e(x.get('error'))}"
                           for x in (node.get("examples") or [])[:3] if isinstance(x, Mapping))
            rows.append(f"<tr><th>{_e(name)}</th><td class='num'>{_num(node.get('errors'), 0)} of "
                        f"{_num(node.get('of'), 0)}</td><td>{ex}</td></tr>")
        sections.append(_section(
            "query-errors", "Failed queries",
            "<p>Queries the target failed (unreachable after the proxy's retries, refused, or "
            "answered unusably). Each counts as an incorrect answer; every one is in the ledger."
            f"</p><table><tr><th>setting</th><th>failed</th><th>examples</th></tr>{''.join(rows)}</table>"))

    # ranking metrics (RANK-1..RANK-3) --------------------------------------------------
    ranking = metrics.get("ranking")
    if isinstance(ranking, Mapping):
        if ranking.get("applicable") and ranking.get("settings"):
            head = ("<tr><th>setting</th><th>NDCG@1</th><th>NDCG@5</th><th>DRR@5</th>"
                    "<th>images</th></tr>")
            rows = []
            for name, r in ranking["settings"].items():
                if not isinstance(r, Mapping):
                    continue
                at = r.get("ndcg_at") or []
                n5 = at[4] if len(at) > 4 else None
                rows.append(f"<tr><th>{_e(name)}</th><td class='num'>{_num(r.get('ndcg_1'), 3)}</td>"
                            f"<td class='num'>{_num(n5, 3)}</td><td class='num'>{_num(r.get('drr_5'), 3)}</td>"
                            f"<td class='num'>{_num(r.get('m'), 0)}</td></tr>")
            body = (f"<table>{head}{''.join(rows)}</table><p class='muted'>Each setting's answers "
                    "against the clean answers (Brama et al.): 1 = the same ranking of classes; "
                    f"gamma_b = {_e(ranking.get('gamma_b'))}, gamma_a = {_e(ranking.get('gamma_a'))}, "
                    "from the top scores the target returned.</p>")
        else:
            body = f"<p class='muted'>Not applicable: {_e(ranking.get('reason'))}</p>"
        sections.append(_section("ranking", "Ranking metrics: NDCG and DRR (RANK-1..RANK-3)", body))

    sections.append(_section("ledger", "Query ledger", _kv(report.get("ledger") or {})))
    sections.append(_section("evaluation", "Evaluation run", _kv(evaluation)))
    sections.append(_section("environment", "Environment", _kv(report.get("environment") or {})))
    sections.append(_section("plan", "Test plan (full text)",
                             f"<pre>{_e(report.get('plan_text', ''))}</pre>"))

    repeat = report.get("repeat") or {}
    steps = "".join(f"<li>{_e(s)}</li>" for s in repeat.get("instructions") or [])
    sections.append(_section(
        "repeat", "How to repeat this evaluation",
        f"<p>Command: <code>{_e(repeat.get('command'))}</code></p><ol>{steps}</ol>"
        f"<p>Seeds: {_value(repeat.get('seeds'), 1)}</p>"))

    nav = "".join(f'<a href="#{a}">{_e(t)}</a>' for a, t in [
        ("summary", "Summary"), ("tests", "Tests"), ("corruptions", "Corruptions"),
        ("attacks", "Attacks"), ("worst-case", "Worst case"), ("degradation", "Degradation"),
        ("ranking", "Ranking"),
        ("ledger", "Ledger"),
        ("environment", "Environment"), ("plan", "Plan"), ("repeat", "Repeat")])
    title = f"Fortis robustness report: {target.get('name') or 'target'}"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
            f"<header><h1>{_e(title)}</h1><p class='muted'>IEEE Std 3129-2023 evaluation "
            f"report &middot; schema {_e(report.get('schema_version'))}</p>"
            f"<nav>{nav}</nav></header><main>{''.join(sections)}</main></body></html>\n")


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(report: Mapping[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """Write ``report.json`` (indent 2, sorted keys, strict JSON) and ``report.html`` into
    ``out_dir`` (created if needed); returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out_dir / "report.json", out_dir / "report.html"
    text = json.dumps(_plain(report), indent=2, sort_keys=True, allow_nan=False,
                      ensure_ascii=False)
    _atomic_write(json_path, text + "\n")
    _atomic_write(html_path, render_html(report))
    return json_path, html_path
