"""Acceptance criteria of a test plan: the grammar, shared by plan validation (the
evaluation service) and the verdict (the report service). Pure data and functions, no gRPC.

A plan declares::

    acceptance:
      accuracy: ">= 0.9"
      average_robustness_corr: ">= 0.6"
      corruptions.fog.mean: ">= 0.5"
      corruptions.gaussian_noise.3: ">= 0.7"
      attacks.square.success_rate: "<= 0.3"
      sequential: true            # optional: stop each setting once its criteria are decided

Each key is a metric path (:data:`GLOBAL_METRICS`, ``corruptions.<id>.<mean|severity>``,
``attacks.<name>.<metric>`` with :data:`ATTACK_METRICS`), each value ``"<op> <number>"`` with
``op`` one of ``>=``, ``<=``, ``>``, ``<`` and the number a finite rate or count (a rate may be
written as a percentage, ``"90%"``). How a criterion is judged against a measured value and its
95 % interval is the report service's business (``services/report/verdict.py``).

``sequential`` (``true``, or ``{unreferenced: run | skip}``) makes every rate criterion
sequential: the evaluation sends the images in a seeded random order and stops the settings a
criterion reads as soon as an anytime-valid 95 % confidence sequence decides it (IEEE-M8 holds
at the stopping time; ``services/evaluation/sequential.py``). A criterion may also be written
``{rule: ">= 0.9", sequential: false}`` to opt out (or in) alone. ``unreferenced`` says what
happens to the settings no criterion reads: ``run`` them on every image (the default) or
``skip`` them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from fortis.services.common.errors import FieldViolation

__all__ = ["ATTACK_METRICS", "GLOBAL_METRICS", "MAX_CRITERIA", "OPERATORS", "Criterion",
           "SequentialPolicy", "parse_acceptance", "parse_criterion", "parse_sequential"]

#: Metrics of the whole evaluation (report.json ``metrics.<name>``).
GLOBAL_METRICS: Final = ("accuracy", "average_robustness_corr", "average_robustness_adv",
                         "worstcase_robustness_corr", "worstcase_robustness_adv")
#: Metrics of one attack (report.json ``metrics.attacks.<name>``); the first two are rates.
ATTACK_METRICS: Final = ("success_rate", "robustness_adv", "mean_queries", "median_queries")
#: Rates (judged in [0, 1]); the others are counts.
RATE_METRICS: Final = frozenset(GLOBAL_METRICS) | {"success_rate", "robustness_adv", "mean",
                                                   "severity"}
OPERATORS: Final = (">=", "<=", ">", "<")
MAX_CRITERIA: Final = 100
_RULE = re.compile(r"^\s*(>=|<=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(%?)\s*$")


@dataclass(frozen=True, kw_only=True)
class Criterion:
    """One acceptance criterion: ``metric`` (the plan's key) ``op`` ``threshold``.

    ``scope`` is "global", "corruption" or "attack"; ``setting`` the corruption id or attack
    name; ``measure`` the metric (for corruptions "mean" or "severity" with ``severity``)."""

    metric: str
    op: str
    threshold: float
    scope: str
    setting: str = ""
    measure: str = ""
    severity: int = 0
    #: Judged by an anytime-valid confidence sequence, its settings stopped once decided.
    sequential: bool = False

    @property
    def is_rate(self) -> bool:
        return (self.measure or self.metric) in RATE_METRICS

    def holds(self, value: float) -> bool:
        """Whether ``value`` meets the criterion."""
        t = self.threshold
        return {">=": value >= t, "<=": value <= t, ">": value > t, "<": value < t}[self.op]

    @property
    def text(self) -> str:
        return f"{self.metric} {self.op} {self.threshold:g}"


def parse_criterion(metric: str, rule: Any) -> Criterion | str:
    """The criterion of one plan entry, or the reason it is not one."""
    if not isinstance(rule, str):
        return (f"must be a string such as \">= 0.9\" (an operator {', '.join(OPERATORS)} and "
                f"a number), got {type(rule).__name__}")
    m = _RULE.match(rule[:100])
    if m is None:
        return f"must be an operator ({', '.join(OPERATORS)}) and a number, e.g. \">= 0.9\""
    threshold = float(m.group(2)) / (100.0 if m.group(3) else 1.0)
    if not math.isfinite(threshold):
        return "the number must be finite"
    parts = metric.split(".")
    if len(parts) == 1:
        if metric not in GLOBAL_METRICS:
            return f"unknown metric; use one of {', '.join(GLOBAL_METRICS)}, " \
                   "corruptions.<id>.<mean|severity> or attacks.<name>.<metric>"
        c = Criterion(metric=metric, op=m.group(1), threshold=threshold, scope="global")
    elif parts[0] == "corruptions" and len(parts) >= 3:
        last, setting = parts[-1], ".".join(parts[1:-1])
        if last == "mean":
            c = Criterion(metric=metric, op=m.group(1), threshold=threshold, scope="corruption",
                          setting=setting, measure="mean")
        elif last.isdigit() and 1 <= int(last) <= 5:
            c = Criterion(metric=metric, op=m.group(1), threshold=threshold, scope="corruption",
                          setting=setting, measure="severity", severity=int(last))
        else:
            return "a corruption's criterion ends in .mean or a severity 1..5"
    elif parts[0] == "attacks" and len(parts) >= 3:
        last, setting = parts[-1], ".".join(parts[1:-1])
        if last not in ATTACK_METRICS:
            return f"an attack's criterion ends in one of {', '.join(ATTACK_METRICS)}"
        c = Criterion(metric=metric, op=m.group(1), threshold=threshold, scope="attack",
                      setting=setting, measure=last)
    else:
        return "unknown metric; use one of " + ", ".join(GLOBAL_METRICS) + \
               ", corruptions.<id>.<mean|severity> or attacks.<name>.<metric>"
    if c.is_rate and not 0.0 <= threshold <= 1.0:
        return f"{c.measure or c.metric} is a rate: the threshold must be in 0..1 (or 0%..100%)"
    if not c.is_rate and threshold < 0:
        return "a query count threshold must not be negative"
    return c


@dataclass(frozen=True, kw_only=True)
class SequentialPolicy:
    """The plan's ``acceptance.sequential``: whether criteria are sequential by default, and
    what becomes of the settings no criterion reads (``run`` on every image, or ``skip``)."""

    enabled: bool = False
    unreferenced: str = "run"


#: The choices of ``acceptance.sequential.unreferenced``.
UNREFERENCED: Final = ("run", "skip")


def parse_sequential(raw: Any, path: str = "acceptance"
                     ) -> tuple[SequentialPolicy, list[FieldViolation]]:
    """``acceptance.sequential``: ``true`` / ``false`` or ``{unreferenced: run | skip}``."""
    if not isinstance(raw, Mapping) or "sequential" not in raw:
        return SequentialPolicy(), []
    value, field = raw["sequential"], f"{path}.sequential"
    if isinstance(value, bool):
        return SequentialPolicy(enabled=value), []
    if isinstance(value, Mapping):
        extra = [str(k)[:40] for k in value if k != "unreferenced"]
        if extra:
            return SequentialPolicy(), [FieldViolation(f"{field}.{extra[0]}", "unknown key; "
                                                       "the only key is unreferenced")]
        how = value.get("unreferenced", "run")
        if how not in UNREFERENCED:
            return SequentialPolicy(), [FieldViolation(
                f"{field}.unreferenced", f"must be one of {', '.join(UNREFERENCED)}")]
        return SequentialPolicy(enabled=True, unreferenced=str(how)), []
    return SequentialPolicy(), [FieldViolation(field, "must be true, false or "
                                                      "{unreferenced: run | skip}")]


def _rule_of(rule: Any, default: bool, field: str
             ) -> tuple[Any, bool, FieldViolation | None]:
    """A criterion's rule text and whether it is sequential: ``">= 0.9"`` (the section's
    default) or ``{rule: ">= 0.9", sequential: bool}``."""
    if not isinstance(rule, Mapping):
        return rule, default, None
    extra = [str(k)[:40] for k in rule if k not in ("rule", "sequential")]
    if extra:
        return None, False, FieldViolation(f"{field}.{extra[0]}", "unknown key; use rule and "
                                                                  "sequential")
    seq = rule.get("sequential", default)
    if not isinstance(seq, bool):
        return None, False, FieldViolation(f"{field}.sequential", "must be true or false")
    if "rule" not in rule:
        return None, False, FieldViolation(f"{field}.rule", "required, e.g. \">= 0.9\"")
    return rule["rule"], seq, None


def parse_acceptance(raw: Any, *, corruptions: Collection[str], attacks: Collection[str],
                     path: str = "acceptance") -> tuple[tuple[Criterion, ...], list[FieldViolation]]:
    """The plan's ``acceptance`` section: its criteria and every problem, each naming its
    field (``acceptance.attacks.sq.success_rate: no attack named 'sq' in the plan``).
    The ``sequential`` key is the section's policy (:func:`parse_sequential`), not a
    criterion."""
    problems: list[FieldViolation] = []
    if raw is None:
        return (), problems
    if not isinstance(raw, Mapping):
        return (), [FieldViolation(path, "must be a mapping of metric -> \">= number\"")]
    if len(raw) > MAX_CRITERIA:
        return (), [FieldViolation(path, f"{len(raw):,} criteria; at most {MAX_CRITERIA}")]
    policy, problems = parse_sequential(raw, path)
    out: list[Criterion] = []
    for key, given in raw.items():
        if key == "sequential":
            continue
        field = f"{path}.{str(key)[:120]}"
        if not isinstance(key, str) or not key:
            problems.append(FieldViolation(path, "every key must be a metric name"))
            continue
        rule, seq, bad = _rule_of(given, policy.enabled, field)
        if bad is not None:
            problems.append(bad)
            continue
        c = parse_criterion(key, rule)
        if isinstance(c, str):
            problems.append(FieldViolation(field, c))
            continue
        if c.scope == "corruption" and c.setting not in corruptions:
            problems.append(FieldViolation(field, f"the plan tests no corruption "
                                                  f"{c.setting[:60]!r}"))
            continue
        if c.scope == "attack" and c.setting not in attacks:
            problems.append(FieldViolation(field, f"no attack named {c.setting[:60]!r} in the "
                                                  "plan (use the attack's name)"))
            continue
        if seq and c.is_rate:   # a count (queries) has no confidence sequence: judged whole
            c = replace(c, sequential=True)
        out.append(c)
    return tuple(out), problems
