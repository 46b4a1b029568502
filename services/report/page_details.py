"""The report page's remaining sections: degradation profiles, ranking (NDCG, DRR),
failed queries, and the target, roles, tests and evaluation tables. Pure code, no gRPC."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from fortis.services.report import figures
from fortis.services.report.page_results import worst_first
from fortis.services.report.page_values import (
    as_list,
    as_map,
    chart_dict,
    int_key,
    is_interval,
    is_number,
    level_sorted,
    num,
    txt,
)

#: Bounds that keep the page readable and fast to render.
_MAX_NDCG_LINES: Final = 10
_MAX_PROFILE_FIGURES: Final = 20
_NDCG_TABLE_ROWS: Final = 10

# --------------------------------------------------------------------------------------------
# degradation, ranking, query errors
# --------------------------------------------------------------------------------------------


def _by_level(rows: Any) -> dict[str, Mapping[str, Any]]:
    return {str(r.get("level")): r for r in rows or [] if isinstance(r, Mapping)}


def degradation_profiles(degradation: Any,
                         examples: Mapping[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    if not isinstance(degradation, Mapping):
        return []
    out: list[dict[str, Any]] = []
    for op, prof in degradation.items():
        if not isinstance(prof, Mapping):
            continue
        rank, prob = _by_level(prof.get("rank")), _by_level(prof.get("probability"))
        changes = {str(r.get("level")): r.get("change") for r in prof.get("changes") or []
                   if isinstance(r, Mapping)}
        rows: list[dict[str, Any]] = []
        accuracy = _by_level(prof.get("accuracy"))
        for lv in level_sorted(accuracy):
            a, change = accuracy[lv], changes.get(lv)
            ci = a.get("ci95")
            rows.append({"level": lv, "accuracy": a.get("value"), "ci95": ci,
                         "rank": rank.get(lv, {}).get("value"),
                         "probability": prob.get(lv, {}).get("value"),
                         "changed": change.get("fraction_of_pixels_changed")
                         if isinstance(change, Mapping) else None})
        fps: list[dict[str, Any]] = sorted(({"threshold": float(t),
                       "level": fp.get("level") if isinstance(fp, Mapping) else None,
                       "example": fp.get("example_image") if isinstance(fp, Mapping) else None}
                      for t, fp in as_map(prof.get("failure_points")).items()
                      if is_number(_float(t))), key=lambda f: -f["threshold"])
        chart = figures.degradation_profile(
            op, [(int_key(r["level"]), r["accuracy"],
                  *(r["ci95"] if is_interval(r["ci95"]) else (None, None)), r["probability"])
                 for r in rows if int_key(r["level"]) is not None],
            [(f["threshold"], f["level"]) for f in fps]) \
            if len(out) < _MAX_PROFILE_FIGURES else None
        exs = sorted(examples.get(op) or [], key=lambda e: (int_key(e["level_key"]) or 0))
        out.append({"name": op, "m": prof.get("m"), "m_used": prof.get("m_used"),
                    "rows": rows, "failure_points": fps, "figure": chart_dict(chart),
                    "examples": exs, "reason": prof.get("reason")})
    return out


def _float(text: Any) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def query_error_rows(qe: Any) -> list[dict[str, Any]]:
    if not isinstance(qe, Mapping) or not qe.get("total"):
        return []
    return [{"name": name, "node": node,
             "examples": [x for x in (node.get("examples") or [])[:3] if isinstance(x, Mapping)]}
            for name, node in (qe.get("settings") or {}).items() if isinstance(node, Mapping)]


def ranking_section(ranking: Any) -> dict[str, Any]:
    ranking = as_map(ranking)
    k = ranking.get("drr_k") or 5
    rows: list[dict[str, Any]] = []
    if ranking.get("applicable"):
        for name, r in as_map(ranking.get("settings")).items():
            if isinstance(r, Mapping):
                at = [v for v in as_list(r.get("ndcg_at"))]
                rows.append({"name": name, "ndcg_1": r.get("ndcg_1"),
                             "ndcg_5": at[4] if len(at) > 4 else None,
                             "drr": r.get(f"drr_{k}"), "m": r.get("m"), "ndcg_at": at})
    rows.sort(key=lambda r: worst_first(r["ndcg_1"], r["name"]))
    curves = [(r["name"], r["ndcg_at"]) for r in rows if r["ndcg_at"]][:_MAX_NDCG_LINES]
    chart = figures.ndcg_curves(curves, sum(1 for r in rows if r["ndcg_at"]))
    return {"rows": rows, "head": rows[:_NDCG_TABLE_ROWS], "rest": rows[_NDCG_TABLE_ROWS:],
            "k": k, "reason": ranking.get("reason"), "gamma_b": ranking.get("gamma_b"),
            "gamma_a": ranking.get("gamma_a"), "figure": chart_dict(chart)}


# --------------------------------------------------------------------------------------------
# target, roles, tests
# --------------------------------------------------------------------------------------------

#: Readable names of the service-type parameters (IEEE-P3, IEEE-C1..C5).
_PARAM_NAMES: Final = {
    "mode": "correctness mode", "k": "k (top-k)", "threshold": "confidence threshold",
    "iou_threshold": "IoU threshold", "confidence_threshold": "confidence threshold (lower "
    "scores dropped first)", "aggregate": "aggregation over objects (IEEE-C3)",
    "q": "q (at least q objects)", "classes": "classes of interest",
    "miou_threshold": "mIoU threshold", "ignore_label": "ignored label",
    "all_absent": "verdict when no class of interest is present",
    "label_sets": "acceptable label sets", "labels": "labels",
}
_RULE_NAMES: Final = {"correctness": "Classification correctness (IEEE-C1/C2)",
                      "detection": "Detection correctness (IEEE-C3/C4)",
                      "segmentation": "Segmentation correctness (IEEE-C5)"}
#: Fields each correctness mode uses (the others are not shown).
_MODE_FIELDS: Final = {"top1": ("mode",), "topk": ("mode", "k"),
                       "threshold": ("mode", "threshold")}


def _param_rows(rule: str, params: Mapping[str, Any], prefix: str = "") -> list[Any]:
    out: list[dict[str, Any]] = []
    mode = params.get("mode")
    for key, value in params.items():
        if rule == "correctness" and mode in _MODE_FIELDS and key in ("k", "threshold") \
                and key not in _MODE_FIELDS[mode]:
            continue
        if rule == "detection" and key == "k" and mode != "topk":
            continue
        if isinstance(value, Mapping):
            if key == "aggregate" and value.get("mode") != "at_least":
                value = {k: v for k, v in value.items() if k != "q"}
            out += _param_rows(rule, value, f"{prefix}{_PARAM_NAMES.get(key, key)}: ")
            continue
        if value is None:
            continue
        out.append({"name": prefix + _PARAM_NAMES.get(key, key), "key": key, "value": value})
    return out


def service_parameter_rows(report: Mapping[str, Any],
                           target: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Named rows per rule: the typed rule the evaluation used, else the plan's; other
    service parameters of the plan as given."""
    typed = as_map(target.get("service_type_parameters"))
    given = as_map(report.get("service_parameters"))
    out = []
    for rule in ("correctness", "detection", "segmentation"):
        params = as_map(typed.get(rule)) or as_map(given.get(rule))
        if params:
            out.append({"title": _RULE_NAMES[rule], "rows": _param_rows(rule, params)})
    other = {k: v for k, v in given.items() if k not in _RULE_NAMES}
    if other:
        out.append({"title": "Other service parameters (as the plan gives them)",
                    "rows": [{"name": _PARAM_NAMES.get(k, k), "key": k, "value": v}
                             for k, v in other.items()]})
    return out


def role_rows(tester: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One roles table (IEEE-P1): the tester's name/organisation is the roles' tester."""
    roles = as_map(tester.get("roles"))
    out = []
    for key, label in (("requester", "Test requester"), ("tester", "Tester"),
                       ("provider", "Service provider")):
        party = as_map(roles.get(key))
        name = party.get("name")
        org = party.get("organisation") or party.get("organization")
        if key == "tester" and not (name or org):
            name, org = tester.get("name"), tester.get("organization")
        out.append({"role": label, "name": name, "organisation": org})
    return out


def _level_table(parameters: Any) -> dict[str, Any] | None:
    """Per-level parameters as a table: levels in numeric order, one named column each."""
    params = as_map(parameters)
    levels = level_sorted(k for k, v in params.items() if isinstance(v, Mapping))
    if not levels:
        return None
    columns: list[str] = []
    for lv in levels:
        columns += [str(c) for c in params[lv] if str(c) not in columns]
    return {"columns": columns,
            "rows": [{"level": lv, "cells": [params[lv].get(c) for c in columns]}
                     for lv in levels]}


def test_rows(tests: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for t in tests:
        kind = t.get("kind")
        params = t.get("parameters")
        table = _level_table(params) if kind in ("corruption", "degradation") else None
        flat = {} if table is not None else {
            k: v for k, v in sorted(as_map(params).items()) if not isinstance(v, Mapping)}
        bits = [str(t.get("family") or kind or "")]
        if t.get("severities"):
            bits.append("severities " + txt(t.get("severities")))
        if t.get("levels"):
            bits.append("levels " + txt(t.get("levels")))
        if t.get("epsilon") is not None:
            bits.append(f"epsilon {txt(t.get('epsilon'))}"
                        + (f" ({t.get('norm')})" if t.get("norm") else ""))
        if t.get("query_budget") is not None:
            bits.append(f"budget {txt(t.get('query_budget'))} queries")
        if t.get("surrogate"):
            bits.append(f"surrogate {t.get('surrogate')}")
        out.append({"t": t, "summary": ", ".join(b for b in bits if b), "table": table,
                    "flat": flat, "overrides": as_map(t.get("params"))})
    return out


def evaluation_rows(evaluation: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The run's facts with times in ISO form only (the JSON keeps epoch seconds too)."""
    ds = as_map(evaluation.get("dataset"))
    rows: list[tuple[str, Any]] = [
        ("Evaluation id", evaluation.get("id")),
        ("Started", evaluation.get("started_at")), ("Ended", evaluation.get("ended_at")),
        ("Duration", f"{num(evaluation.get('duration_s'), 1)} s"),
        ("Images (M)", evaluation.get("images")),
        ("Dataset", f"{txt(ds.get('source'))} ({txt(ds.get('split'))}), offset "
                    f"{txt(ds.get('offset'))}, limit {txt(ds.get('limit'))}" if ds else None),
        ("Resumed", evaluation.get("resumed_count"))]
    skip = {"id", "started", "finished", "started_at", "ended_at", "duration_s", "images",
            "dataset", "resumed_count"}
    rows += [(k, v) for k, v in evaluation.items() if k not in skip]
    return rows
