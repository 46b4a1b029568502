"""PertKnob as an attack (PER-3, seed 004; Zhong et al., DSN 2020): the smallest epsilon of a
real-world safety property (PER-1) at which the target's answer meets the success criterion,
searched over [0, 1] in k cells by bisection or linear scan within Q_m queries per image
(IEEE-M6), every query through the proxy and charged to its image. Reports the minimal L2
(PER-4 statistics are the scoring service's, over these results). The search itself is
``pertknob_search.py``.

The criterion is the plan's (PER-2, seed 004 Table I: misclassification by default,
confident / top-k misclassification, original-class probability, target-class boost,
targeted misclassification; for detectors the object of interest no longer detected as its
class or relabelled; PER-5: classifiers, detectors and cloud APIs alike, and segmenters by
the IEEE-C5 mIoU), judged on each answer by ``ctx.decision_query()`` (``judges.py``), so
criteria that need probabilities work on score-returning targets and are refused, naming
the criterion, on label-only ones. Registry entry: :data:`SPEC`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from fortis.core.task import Task
from fortis.services.common.errors import BudgetExhausted, InvalidArgument
from fortis.services.common.params import Param
from fortis.services.perturbation.criteria import Criterion, Reference
from fortis.services.perturbation.pertknob_search import (
    KnobConfig,
    pertknob,
    property_perturbation,
)
from fortis.services.perturbation.registry import PERTURBATIONS

from .base import (
    STOP_ALREADY_MISCLASSIFIED,
    STOP_BUDGET,
    STOP_ITERATIONS,
    STOP_PROXY_BUDGET,
    STOP_SUCCESS,
    AttackContext,
    AttackResult,
    AttackSpec,
    make_result,
)

#: KnobResult.status -> the attack's stop reason.
_STOP = {"found": STOP_SUCCESS, "already_met": STOP_ALREADY_MISCLASSIFIED,
         "budget_exhausted": STOP_BUDGET}


@dataclass(frozen=True)
class _Judged(Criterion):
    """The search's criterion when the judge has already decided: each "prediction" is the
    decision query's answer (the attack's criterion, any task)."""

    label: str = ""

    @property
    def name(self) -> str:
        return self.label

    def is_met(self, prediction: Any, ref: Reference) -> bool:
        return bool(prediction)


def run(ctx: AttackContext) -> list[AttackResult]:
    """One image at a time, so each query is charged to its own image id; a proxy refusal
    stops that image (``budget_exhausted_by_proxy``) and the batch goes on."""
    p = ctx.params
    spec = PERTURBATIONS.get(p["property"])
    if spec is None or spec.kind != "property":
        raise InvalidArgument("params.property", f"'{p['property']}' is not a PER-1 property; "
                              "see `fortis perturbations --kind property`")
    cfg = KnobConfig(mode=p["mode"], cells=int(p["cells"]), budget=int(p["max_queries"]))
    perturb = property_perturbation(spec.id)
    decide = ctx.decision_query()
    judged = _Judged(ctx.criterion.name)
    spent = ctx.spent()
    out: list[AttackResult] = []
    for n, image_id in enumerate(ctx.image_ids):
        x = ctx.images[n]
        sent = [0]
        # Q_m across resumed attempts: a killed attempt's unanswered rows count
        left = cfg.budget - (int(spent[n]) if spent is not None else 0) if cfg.budget else None
        if left is not None and left < 1:
            out.append(make_result(n, x, x, success=False, queries=0, initially_correct=None,
                                   stop_reason=STOP_BUDGET))
            continue

        def ask(imgs: Sequence[np.ndarray], n: int = n, sent: list[int] = sent) -> list[bool]:
            met = decide(np.stack(imgs), np.full(len(imgs), n, dtype=np.int64))
            sent[0] += len(imgs)
            return [bool(v) for v in np.asarray(met).reshape(-1)]

        try:
            r = pertknob(x, perturb, judged, ask,
                         rng=ctx.derive_rng("pertknob", spec.id, image_id),
                         reference=Reference(label=int(ctx.labels[n])),
                         config=cfg if left == cfg.budget else replace(cfg, budget=left),
                         keep_images=True)
        except BudgetExhausted:
            out.append(make_result(n, x, x, success=False, queries=sent[0],
                                   initially_correct=None, stop_reason=STOP_PROXY_BUDGET))
            continue
        adv = r.perturbed if r.perturbed is not None else x
        # a search the budget cut after the criterion was met returns an image that fools
        # the target: a success, its epsilon an upper bound of the minimal one (PER-3)
        hit = r.status == "found" or (r.status == "budget_exhausted" and r.perturbed is not None)
        out.append(make_result(n, x, adv, success=hit, queries=r.queries,
                               initially_correct=r.status != "already_met",
                               stop_reason=_STOP.get(r.status, STOP_ITERATIONS)))
    return out


SPEC = AttackSpec(
    id="pertknob", minimal_norm=True, kind="decision", family="minimal-perturbation", norms=("l2",),
    refs=("PER-3", "PER-2", "PER-4", "IEEE-M6"), targeted=True,
    tasks=(Task.CLASSIFICATION, Task.DETECTION, Task.SEGMENTATION),
    description="PertKnob (Zhong et al.): the smallest epsilon of a real-world safety "
                "property (PER-1) that meets the plan's PER-2 criterion, searched over "
                "[0,1] in k cells by bisection or linear scan within Q_m queries; reports "
                "the minimal L2 (PER-4); every query through the proxy",
    params=(Param(name="property", type="string",
                  description="a PER-1 property id, e.g. per_brightness"),
            Param(name="mode", type="string", default="bisection", choices=("bisection", "linear"),
                  description="bisection (assumes the criterion is monotone in epsilon) or linear"),
            Param(name="cells", type="int", default=1000, description="k: epsilon grid cells",
                  minimum=1, maximum=1_000_000),
            Param(name="max_queries", type="int", default=64,
                  description="query budget Q_m per image, clean query included",
                  minimum=2, maximum=1_000_000)),
    run=run)
