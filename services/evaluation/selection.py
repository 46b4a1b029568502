"""CAN-6, evaluation example selection (CANARY seed 003, section 3.2.1), for perturbation-
limited transfer attacks: the plan's epsilon is the pending point D~; the budget is raised
while the misclassification ratio (MR) rises significantly (the bound held the attack back),
else lowered while MR does not fall significantly (D~ spent budget for nothing, degrading the
examples); the attack is then run at the point where MR stops changing significantly.

MR is measured on the target, through the proxy, on the first ``images`` of the plan's
images: the clean images and the examples crafted at each point tried are sent in the
attack's own session ``<attack>.select`` (every query ledgered; the stage that calls
:func:`select_epsilon` owns the sending), and it is deterministic (the attack's seed is the
plan's). "Significantly": a pooled two-proportion z test at ``alpha`` on the counts (misled
/ right on the clean image), the test ``fortis compare`` states. The result is stored as a work item of the evaluation, so a resumed evaluation uses
the same epsilon (CAN-9). Domain code: the perturbation port only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fortis.services.evaluation.plan import AttackTest

__all__ = ["SELECT_DEFAULTS", "select_epsilon", "significant_change", "trace_text"]

#: ``select_budget: true`` means these; a mapping overrides any of them.
SELECT_DEFAULTS: Mapping[str, Any] = {"factor": 2.0, "max_steps": 3, "images": 64,
                                      "alpha": 0.05}


def significant_change(k1: int, n1: int, k2: int, n2: int, alpha: float) -> bool:
    """Pooled two-proportion z test, two-sided: is k1/n1 != k2/n2 at level ``alpha``?"""
    if n1 == 0 or n2 == 0:
        return False
    p = (k1 + k2) / (n1 + n2)
    se = math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))
    if se == 0:
        return False
    z = (k2 / n2 - k1 / n1) / se
    return math.erfc(abs(z) / math.sqrt(2)) < alpha


def select_epsilon(at: AttackTest, measure: Callable[[float], tuple[int, int]],
                   upper: float) -> tuple[float, list[dict[str, Any]]]:
    """The epsilon CAN-6 selects for ``at`` and the trace of the points tried.

    ``measure(eps) -> (misled, right)`` crafts on the surrogate at ``eps``; ``upper`` is the
    largest epsilon the attack's norm allows."""
    cfg = {**SELECT_DEFAULTS, **{k: v for k, v in at.select_budget.items() if k != "enabled"}}
    factor, steps, alpha = float(cfg["factor"]), int(cfg["max_steps"]), float(cfg["alpha"])
    d = float(at.params["epsilon"])
    k, n = measure(d)
    trace: list[dict[str, Any]] = [{"epsilon": d, "mr": k / n if n else None, "n": n,
                                    "decision": "start"}]
    if n == 0:                                  # nothing right: nothing to measure
        return d, trace
    moved = False
    for _ in range(steps):                      # more budget while MR rises significantly
        cand = min(d * factor, upper)
        if cand <= d:
            break
        k2, n2 = measure(cand)
        up = significant_change(k, n, k2, n2, alpha) and (k2 / max(n2, 1)) > (k / max(n, 1))
        trace.append({"epsilon": cand, "mr": k2 / n2 if n2 else None, "n": n2,
                      "decision": "raised: MR rose significantly" if up else
                      "kept: MR did not rise significantly"})
        if not up:
            break
        d, k, n, moved = cand, k2, n2, True
    if not moved:
        for _ in range(steps):                  # less budget while MR does not fall
            cand = d / factor
            k2, n2 = measure(cand)
            down = not (significant_change(k, n, k2, n2, alpha)
                        and (k2 / max(n2, 1)) < (k / max(n, 1)))
            trace.append({"epsilon": cand, "mr": k2 / n2 if n2 else None, "n": n2,
                          "decision": "lowered: MR did not fall significantly" if down else
                          "kept: MR fell significantly"})
            if not down:
                break
            d, k, n = cand, k2, n2
    return d, trace


def trace_text(trace: Sequence[Mapping[str, Any]]) -> str:
    """The trace in one line for the report."""
    return "; ".join(f"eps {t['epsilon']:.4g}: MR {t['mr']:.3f} of {t['n']} ({t['decision']})"
                     if t.get("mr") is not None else f"eps {t['epsilon']:.4g}: nothing right"
                     for t in trace)
