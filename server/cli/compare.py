"""``fortis compare A.json B.json``: what changed between two evaluations of the same plan
(e.g. two versions of a model: the same plan with another target), and whether each change is
significant.

Every metric with a rate is compared: accuracy (IEEE-M1), each corruption severity (IEEE-M2,
M7) and mean, the averages and worst cases (IEEE-M2..M5), each attack's robustness and success
rate (IEEE-M3, M6). The test, stated on every row:

- ``two-proportion z-test`` where both reports give the counts (correct of m): pooled
  p = (x_A + x_B) / (n_A + n_B), z = (p_B - p_A) / sqrt(p (1 - p) (1/n_A + 1/n_B)),
  two-sided p-value = erfc(|z| / sqrt 2); significant when p < alpha. The two evaluations are
  treated as independent samples; on the same images (a paired design) this overstates the
  variance when outcomes agree, so it errs on the side of "not significant".
- ``CI overlap`` where there are 95 % intervals but no counts: significant when the intervals
  do not overlap (a conservative test, roughly alpha 0.006 for equal widths).
- ``no test`` where neither exists (averages over settings, a corruption's mean over its
  severities: the severities share their images, so pooling their counts is not a test).

Warnings when the plans differ beyond ``target``/``targets``/``name``/``description`` or the
evaluations used different images (``evaluation.dataset``, the number of images). Rows are
sorted significant first, then by the size of the change. ``--fail-on-regression`` exits 4
when B is significantly worse than A on any metric (lower robustness or accuracy, higher
attack success rate).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from fortis.server.cli.report_doc import number as _f

__all__ = ["EXIT_REGRESSION", "cmd_compare", "compare_reports", "two_proportion_z"]

#: Exit code of ``--fail-on-regression`` when B is significantly worse on some metric.
EXIT_REGRESSION: Final = 4
_PLAN_IGNORED: Final = frozenset({"target", "targets", "name", "description"})
_AVERAGES: Final = ("average_robustness_corr", "average_robustness_adv")
_WORST: Final = ("worstcase_robustness_corr", "worstcase_robustness_adv")


def two_proportion_z(x1: int, n1: int, x2: int, n2: int) -> tuple[float, float]:
    """The pooled two-proportion z statistic of ``x2/n2`` against ``x1/n1`` and its two-sided
    p-value (z = 0, p = 1 when the pooled rate is 0 or 1: no variation to test)."""
    if n1 <= 0 or n2 <= 0:
        raise ValueError("both samples need at least one image")
    p = (x1 + x2) / (n1 + n2)
    se = math.sqrt(p * (1.0 - p) * (1.0 / n1 + 1.0 / n2))
    if se == 0.0:
        return 0.0, 1.0
    z = (x2 / n2 - x1 / n1) / se
    return z, math.erfc(abs(z) / math.sqrt(2.0))


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _ci(value: Any) -> list[float] | None:
    if isinstance(value, list | tuple) and len(value) == 2:
        lo, hi = _f(value[0]), _f(value[1])
        if lo is not None and hi is not None and lo <= hi:
            return [lo, hi]
    return None


def _node(tree: Any, *keys: str) -> Mapping[str, Any]:
    for k in keys:
        tree = tree.get(k) if isinstance(tree, Mapping) else None
    return tree if isinstance(tree, Mapping) else {}


#: A measured rate: (value, ci95, successes, trials); higher_is_better.
_Rate = tuple[float | None, list[float] | None, int | None, int | None]


def _rates(metrics: Mapping[str, Any]) -> Iterator[tuple[str, _Rate, bool]]:
    """Every (metric path, rate, higher is better) of a report's metrics tree."""
    acc = _node(metrics, "accuracy")
    yield "accuracy", (_f(acc.get("value")), _ci(acc.get("ci95")), _count(acc.get("correct")),
                       _count(acc.get("m"))), True
    for name in _AVERAGES:
        node = _node(metrics, name)
        if node:
            yield name, (_f(node.get("value")), None, None, None), True
    for name in _WORST:
        node = _node(metrics, name)
        if node:
            yield name, (_f(node.get("value")), _ci(node.get("ci95")),
                         _count(node.get("correct")), _count(node.get("m"))), True
    for cid, node in _node(metrics, "corruptions").items():
        if not isinstance(node, Mapping):
            continue
        for sev in sorted((k for k in node if str(k).isdigit()), key=int):
            s = _node(node, sev)
            yield f"corruptions.{cid}.{sev}", (_f(s.get("robustness")), _ci(s.get("ci95")),
                                               _count(s.get("correct")), _count(s.get("m"))), True
        mean = _node(node, "mean")
        if mean:
            yield f"corruptions.{cid}.mean", (_f(mean.get("robustness")), _ci(mean.get("ci95")),
                                              None, None), True
    for name, a in _node(metrics, "attacks").items():
        if not isinstance(a, Mapping):
            continue
        yield f"attacks.{name}.robustness_adv", (
            _f(a.get("robustness_adv")), _ci(a.get("ci95")), _count(a.get("correct")),
            _count(a.get("m"))), True
        yield f"attacks.{name}.success_rate", (
            _f(a.get("success_rate")), _ci(a.get("success_rate_ci95")),
            _count(a.get("successes")), _count(a.get("success_rate_n"))), False


def _row(metric: str, a: _Rate, b: _Rate, higher_better: bool, alpha: float) -> dict[str, Any]:
    (va, ca, xa, na), (vb, cb, xb, nb) = a, b
    row: dict[str, Any] = {"metric": metric, "a": va, "b": vb, "a_ci95": ca, "b_ci95": cb,
                           "difference": None, "test": "no test", "z": None, "p_value": None,
                           "significant": False, "change": "n/a", "regression": False}
    if va is None or vb is None:
        row["test"] = "missing in " + ("both" if va is None and vb is None else
                                       "A" if va is None else "B")
        return row
    row["difference"] = vb - va
    if (xa is not None and na and xb is not None and nb and xa <= na and xb <= nb):
        z, p = two_proportion_z(xa, na, xb, nb)
        row.update(test="two-proportion z-test", z=z, p_value=p, significant=p < alpha,
                   a_counts=[xa, na], b_counts=[xb, nb])
    elif ca is not None and cb is not None:
        row.update(test="CI overlap", significant=ca[1] < cb[0] or cb[1] < ca[0])
    better = (vb > va) if higher_better else (vb < va)
    row["change"] = "same" if vb == va else "better" if better else "worse"
    row["regression"] = bool(row["significant"] and row["change"] == "worse")
    return row


def _plan_without_target(report: Mapping[str, Any]) -> dict[str, Any]:
    plan = report.get("plan")
    return {k: v for k, v in plan.items() if k not in _PLAN_IGNORED} \
        if isinstance(plan, Mapping) else {}


def _side(report: Mapping[str, Any]) -> dict[str, Any]:
    return {"evaluation": _node(report, "evaluation").get("id"),
            "plan": _node(report, "plan").get("name"),
            "target": _node(report, "target").get("name"),
            "images": _node(report, "evaluation").get("images")}


def compare_reports(a: Mapping[str, Any], b: Mapping[str, Any], *,
                    alpha: float = 0.05) -> dict[str, Any]:
    """The comparison (module docstring) of two report documents, B against A."""
    if not 0.0 < alpha < 1.0:
        raise ValueError("alpha must be between 0 and 1")
    warnings: list[str] = []
    pa, pb = _plan_without_target(a), _plan_without_target(b)
    if pa != pb:
        keys = sorted(k for k in set(pa) | set(pb) if pa.get(k) != pb.get(k))
        warnings.append("the plans differ beyond the target: " + ", ".join(keys)[:300]
                        + " (the comparison may not be like for like)")
    da, db = _node(a, "evaluation").get("dataset"), _node(b, "evaluation").get("dataset")
    if da != db:
        warnings.append(f"the image sets differ: A {json.dumps(da)[:200]}, "
                        f"B {json.dumps(db)[:200]}")
    elif _node(a, "evaluation").get("images") != _node(b, "evaluation").get("images"):
        warnings.append("the evaluations scored different numbers of images")
    ma, mb = _node(a, "metrics"), _node(b, "metrics")
    ra = {name: (rate, hb) for name, rate, hb in _rates(ma)}
    rb = {name: (rate, hb) for name, rate, hb in _rates(mb)}
    rows = [_row(name, ra[name][0] if name in ra else (None, None, None, None),
                 rb[name][0] if name in rb else (None, None, None, None),
                 (ra.get(name) or rb[name])[1], alpha)
            for name in list(ra) + [n for n in rb if n not in ra]]
    rows.sort(key=lambda r: (not r["significant"], -abs(r["difference"] or 0.0), r["metric"]))
    return {"a": _side(a), "b": _side(b), "alpha": alpha, "warnings": warnings,
            "tests": {"two-proportion z-test": "pooled, two-sided, on correct/m counts; "
                      "significant when p < alpha",
                      "CI overlap": "significant when the 95% intervals do not overlap",
                      "no test": "no counts and no interval (averages, means over severities)"},
            "rows": rows, "regressions": sum(r["regression"] for r in rows)}


def _fmt(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _p(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}" if v >= 1e-4 else f"{v:.1e}"


def format_table(result: Mapping[str, Any]) -> str:
    """The comparison as a readable table."""
    a, b = result["a"], result["b"]
    lines = [f"A: {a['evaluation']} (target {a['target']}, plan {a['plan']}, "
             f"{a['images']} images)",
             f"B: {b['evaluation']} (target {b['target']}, plan {b['plan']}, "
             f"{b['images']} images)"]
    lines += [f"warning: {w}" for w in result["warnings"]]
    width = max([len(r["metric"]) for r in result["rows"]] + [6])
    lines.append(f"{'metric':<{width}}  {'A':>7}  {'B':>7}  {'B-A':>8}  {'p':>8}  "
                 f"{'test':<21}  result")
    for r in result["rows"]:
        diff = "-" if r["difference"] is None else f"{r['difference']:+.4f}"
        if r["significant"]:
            verdict = "SIGNIFICANT, " + r["change"]
        elif r["test"] in ("two-proportion z-test", "CI overlap") and r["change"] != "same":
            verdict = r["change"] + ", not significant"
        else:
            verdict = r["change"] + (" (untested)" if r["change"] in ("better", "worse") else "")
        lines.append(f"{r['metric']:<{width}}  {_fmt(r['a']):>7}  {_fmt(r['b']):>7}  "
                     f"{diff:>8}  {_p(r['p_value']):>8}  {r['test']:<21}  {verdict}")
    n_sig = sum(r["significant"] for r in result["rows"])
    lines.append(f"{n_sig} significant change(s) at alpha {result['alpha']:g}, "
                 f"{result['regressions']} of them worse in B (two-proportion z-test on "
                 "counts, else 95% CI overlap)")
    return "\n".join(lines)


def _load(path: str) -> dict[str, Any]:
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("metrics"), dict):
        raise ValueError("not a Fortis report.json (no metrics)")
    return doc


def cmd_compare(ns: argparse.Namespace) -> int:
    from fortis.server.cli.output import EXIT_BAD_INPUT, err

    reports = []
    for field, path in (("a", ns.a), ("b", ns.b)):
        try:
            reports.append(_load(path))
        except (OSError, ValueError) as exc:
            err(f"{field}: cannot read report {path}: {exc}")
            return EXIT_BAD_INPUT
    try:
        result = compare_reports(reports[0], reports[1], alpha=ns.alpha)
    except ValueError as exc:
        err(f"alpha: {exc}")
        return EXIT_BAD_INPUT
    print(json.dumps(result, indent=2) if ns.json else format_table(result))
    return EXIT_REGRESSION if ns.fail_on_regression and result["regressions"] else 0


def add_parser(sub: Any) -> None:
    sp = sub.add_parser("compare", help="what changed between two evaluations of the same plan "
                        "(report.json files), with a significance test per metric")
    sp.add_argument("a", help="report.json of the reference evaluation (A)")
    sp.add_argument("b", help="report.json of the new evaluation (B)")
    sp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    sp.add_argument("--alpha", type=float, default=0.05,
                    help="significance level of the two-proportion z-test (default 0.05)")
    sp.add_argument("--fail-on-regression", action="store_true",
                    help=f"exit {EXIT_REGRESSION} when B is significantly worse on any metric")
    sp.set_defaults(fn=cmd_compare)
