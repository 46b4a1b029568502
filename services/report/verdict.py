"""The verdict of an evaluation against the acceptance criteria its plan declares.

Policy (stated in every criterion's sentence and in docs/pipelines.md):

- The **point estimate decides** pass or fail: ``accuracy = 0.924`` meets ``>= 0.9``.
- The **95 % Wilson interval** the report gives with every rate (IEEE-M8: a smaller M is honest
  about its uncertainty) says whether that outcome is **conclusive** (the whole interval lies on
  the same side of the threshold) or **inconclusive** (the interval straddles the threshold:
  more images could change the outcome).
- Metrics without an interval (averages of rates, query counts, the mean over a corruption's
  severities) are judged on their value alone: confidence ``no_ci``.
- A criterion whose metric depends on a setting that failed to run (the report's
  ``failed_settings``: the attack or corruption it names, or any attack / corruption for the
  averages and worst cases over them) is ``not_evaluated``: it does not fail the verdict, but
  the status says the evaluation is ``incomplete`` and ``--strict`` fails it.
- A criterion whose metric the evaluation did not produce otherwise is ``missing`` and fails.

``passed`` is false iff some criterion fails or is missing; ``strict_passed`` (``--strict``)
also requires every criterion that has an interval to be conclusive and every criterion to be
evaluated. A plan without criteria gives status ``no_criteria`` and passes.

The verdict document (``report.json`` ``verdict``)::

    {"status": "pass" | "fail" | "incomplete" | "no_criteria", "passed": bool,
     "strict_passed": bool, "not_evaluated": int,
     "criteria": [{"metric", "op", "threshold", "value": float | null,
                   "ci95": [lo, hi] | null,
                   "outcome": "pass" | "fail" | "missing" | "not_evaluated",
                   "confidence": "conclusive" | "inconclusive" | "no_ci", "text"}]}

Pure domain code: dicts in, dicts out; no gRPC.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from fortis.services.common.acceptance import Criterion, parse_acceptance
from fortis.services.common.errors import InvalidArgument

__all__ = ["POLICY", "criteria_of_plan", "report_verdict", "verdict"]

#: One paragraph for readers of the verdict (report, CLI, JUnit properties).
POLICY: Final = ("The point estimate decides pass or fail; the 95% Wilson interval (IEEE-M8) "
                 "says whether that is conclusive (the whole interval on the same side of the "
                 "threshold) or inconclusive (it straddles the threshold); averages and query "
                 "counts have no interval. A metric the evaluation did not produce fails; one "
                 "that depends on a setting that failed to run is not evaluated. --strict also "
                 "fails inconclusive and not evaluated criteria.")


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def _interval(value: Any) -> list[float] | None:
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2:
        return None
    lo, hi = _finite(value[0]), _finite(value[1])
    if lo is None or hi is None or lo > hi:
        return None
    return [lo, hi]


def _node(tree: Any, *keys: str) -> Mapping[str, Any]:
    for k in keys:
        if not isinstance(tree, Mapping):
            return {}
        tree = tree.get(k)
    return tree if isinstance(tree, Mapping) else {}


def measured(c: Criterion, metrics: Mapping[str, Any]) -> tuple[float | None, list[float] | None]:
    """The value of ``c``'s metric in a report's ``metrics`` tree and its 95 % interval (None
    where the tree has none)."""
    if c.scope == "global":
        node = _node(metrics, c.metric)
        return _finite(node.get("value")), _interval(node.get("ci95"))
    if c.scope == "corruption":
        node = _node(metrics, "corruptions", c.setting,
                     "mean" if c.measure == "mean" else str(c.severity))
        return _finite(node.get("robustness")), _interval(node.get("ci95"))
    node = _node(metrics, "attacks", c.setting)
    if c.measure == "success_rate":
        return _finite(node.get("success_rate")), _interval(node.get("success_rate_ci95"))
    if c.measure == "robustness_adv":
        return _finite(node.get("robustness_adv")), _interval(node.get("ci95"))
    return _finite(node.get(c.measure)), None          # mean_queries, median_queries


def _num(c: Criterion, v: float) -> str:
    return f"{v:.3f}" if c.is_rate else f"{v:.1f}"


def _judge(c: Criterion, value: float | None, ci: list[float] | None, *,
           interval_words: str = "95% CI", seen: str = "",
           by_interval: bool = False) -> dict[str, Any]:
    entry: dict[str, Any] = {"metric": c.metric, "op": c.op, "threshold": c.threshold,
                             "value": value, "ci95": ci}
    rule = f"{c.op} {c.threshold:g}"
    if value is None:
        entry.update(outcome="missing", confidence="no_ci",
                     text=f"{c.metric}: the evaluation produced no value for this metric (no "
                          f"images scored, or the setting did not run), so '{rule}' fails.")
        return entry
    ok = c.holds(value)
    if by_interval and ci is not None and c.holds(ci[0]) == c.holds(ci[1]):
        ok = c.holds(ci[0])     # an interval wholly on one side decides (sequential)
    entry["outcome"] = "pass" if ok else "fail"
    shown = f"{c.metric} = {_num(c, value)}{seen}"
    if ci is None:
        entry["confidence"] = "no_ci"
        entry["text"] = (f"{shown} {'meets' if ok else 'fails'} {rule}; it has no confidence "
                         "interval (an average or a count), so the point estimate alone "
                         "decides.")
        return entry
    shown += f" ({interval_words} {_num(c, ci[0])}-{_num(c, ci[1])})"
    side = "above" if c.op in (">=", ">") else "below"
    if c.holds(ci[0]) == ok and c.holds(ci[1]) == ok:
        entry["confidence"] = "conclusive"
        entry["text"] = (f"{shown} meets {rule}: the whole interval is {side} "
                         f"{c.threshold:g}, so the pass is conclusive." if ok else
                         f"{shown} fails {rule}: the whole interval is on the wrong side of "
                         f"{c.threshold:g}, so the failure is conclusive.")
    else:
        entry["confidence"] = "inconclusive"
        entry["text"] = (f"{shown} meets {rule} on the point estimate, but the interval "
                         f"straddles {c.threshold:g}: inconclusive (fails with --strict)." if ok
                         else f"{shown} fails {rule} on the point estimate; the interval "
                         f"straddles {c.threshold:g}, so the failure is inconclusive (more "
                         "images could change it).")
    return entry


def _blocked_by(c: Criterion, failed: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The failed settings ``c``'s metric depends on (see the module docstring)."""
    attacks = [f for f in failed if str(f.get("kind", "")).endswith("_attack")]
    corruptions = [f for f in failed if f.get("kind") == "corruption"]
    if c.scope == "attack":
        return [f for f in attacks if f.get("name") == c.setting]
    if c.scope == "corruption":
        return [f for f in corruptions if f.get("name") == c.setting
                and (c.measure == "mean" or f.get("level") == c.severity)]
    if c.metric.endswith("_adv"):
        return attacks
    if c.metric.endswith("_corr"):
        return corruptions
    return []


def _not_evaluated(c: Criterion, blocked: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    names = ", ".join(str(f.get("setting") or f.get("name")) for f in blocked[:5])
    more = f" and {len(blocked) - 5} more" if len(blocked) > 5 else ""
    first = blocked[0]
    return {"metric": c.metric, "op": c.op, "threshold": c.threshold, "value": None,
            "ci95": None, "outcome": "not_evaluated", "confidence": "no_ci",
            "text": f"{c.metric}: not evaluated: {names}{more} failed to run "
                    f"({first.get('code', 'error')}: {str(first.get('message', ''))[:200]}); "
                    f"'{c.op} {c.threshold:g}' fails with --strict."}


def _sequential_interval(c: Criterion, sequential: Mapping[str, Any] | None
                         ) -> tuple[list[float] | None, Mapping[str, Any]] | None:
    """A sequential criterion's time-uniform interval at its stopping time, and its record
    (report.json ``sequential.criteria``); None when ``c`` was not judged sequentially."""
    if not c.sequential or not isinstance(sequential, Mapping):
        return None
    for entry in sequential.get("criteria") or ():
        if isinstance(entry, Mapping) and entry.get("metric") == c.metric:
            return _interval(entry.get("interval")), entry
    return None


def _judge_sequential(c: Criterion, value: float | None, ci: list[float] | None,
                      entry: Mapping[str, Any]) -> dict[str, Any]:
    """A sequential criterion: judged as any other, on its time-uniform interval (a
    confidence sequence covers at the data-dependent stopping time, where a Wilson interval
    would not); a conclusive interval decides by its side."""
    seen = f" on {entry.get('images')} of {entry.get('population')} images (sequential)"
    out = _judge(c, value, ci, interval_words="time-uniform 95% CI", seen=seen,
                 by_interval=True)
    out.update(interval="time-uniform", images=entry.get("images"),
               population=entry.get("population"))
    return out


def verdict(criteria: Iterable[Criterion], metrics: Mapping[str, Any],
            failed: Sequence[Mapping[str, Any]] = (), *,
            sequential: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The verdict (module docstring) of ``criteria`` on a report's ``metrics`` tree: the point
    estimate decides, the 95 % Wilson interval (IEEE-M8) says whether it is conclusive;
    criteria on ``failed`` settings (the report's ``failed_settings``) are not evaluated.
    A sequential criterion (report.json ``sequential``) is judged on its time-uniform
    interval at the stopping time instead of the Wilson interval."""
    judged = []
    for c in criteria:
        blocked = _blocked_by(c, failed)
        seq = None if blocked else _sequential_interval(c, sequential)
        if blocked:
            judged.append(_not_evaluated(c, blocked))
        elif seq is not None:
            judged.append(_judge_sequential(c, measured(c, metrics)[0], *seq))
        else:
            judged.append(_judge(c, *measured(c, metrics)))
    if not judged:
        return {"status": "no_criteria", "passed": True, "strict_passed": True,
                "not_evaluated": 0, "criteria": []}
    open_ = sum(j["outcome"] == "not_evaluated" for j in judged)
    passed = all(j["outcome"] in ("pass", "not_evaluated") for j in judged)
    strict = passed and not open_ and all(j["confidence"] != "inconclusive" for j in judged)
    status = "fail" if not passed else "incomplete" if open_ else "pass"
    return {"status": status, "passed": passed, "strict_passed": strict,
            "not_evaluated": open_, "criteria": judged}


def _plan_names(plan: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """The corruption ids and attack names a plan document tests (as plan validation names
    them: an attack's ``name``, else its ``id``)."""
    corruptions: set[str] = set()
    attacks: set[str] = set()
    for item in plan.get("corruptions") or ():
        cid = item.get("id") if isinstance(item, Mapping) else item
        if isinstance(cid, str):
            corruptions.add(cid)
    # multi-target plans (CAN-7): an attack without a surrogate runs as ``<name>.<surrogate>``
    # per model surrogate (the evaluation's ``plan.crafted_on``)
    surrogates = [t.get("surrogate") for t in plan.get("targets") or ()
                  if isinstance(t, Mapping) and isinstance(t.get("surrogate"), str)]
    for item in plan.get("attacks") or ():
        if isinstance(item, Mapping):
            name = item.get("name") or item.get("id")
            if isinstance(name, str):
                attacks.add(name)
                if not item.get("surrogate"):
                    attacks.update(f"{name}.{s}" for s in surrogates)
    return corruptions, attacks


def criteria_of_plan(plan: Mapping[str, Any], *, acceptance: Any = None,
                     path: str = "plan.acceptance") -> tuple[Criterion, ...]:
    """The acceptance criteria of a plan document (``acceptance`` overrides the plan's own).
    Raises InvalidArgument naming every bad criterion (``path.<metric>``)."""
    raw = plan.get("acceptance") if acceptance is None else acceptance
    corruptions, attacks = _plan_names(plan)
    criteria, problems = parse_acceptance(raw, corruptions=corruptions, attacks=attacks,
                                          path=path)
    if problems:
        raise InvalidArgument.from_violations(problems)
    return criteria


def report_verdict(report: Mapping[str, Any], *, acceptance: Any = None,
                   path: str = "plan.acceptance") -> dict[str, Any]:
    """The verdict of a finished report document (``report.json``), recomputed from its plan's
    criteria (or ``acceptance``) and its metrics: ``fortis gate`` re-checks offline."""
    plan = report.get("plan")
    metrics = report.get("metrics")
    if not isinstance(plan, Mapping):
        raise InvalidArgument("plan", "the report has no plan document")
    if not isinstance(metrics, Mapping):
        raise InvalidArgument("metrics", "the report has no metrics tree")
    failed = [f for f in report.get("failed_settings") or () if isinstance(f, Mapping)]
    sequential = report.get("sequential")
    return verdict(criteria_of_plan(plan, acceptance=acceptance, path=path), metrics, failed,
                   sequential=sequential if isinstance(sequential, Mapping) else None)
