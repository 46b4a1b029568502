"""From recorded predictions to the IEEE metrics tree. Domain code: no gRPC.

Applies the plan's correctness rule (IEEE-C1/C2) to every recorded answer and hands the
Clean/Corr/Adv result matrices to ``ieee.compute_classification_metrics``. Query attacks
(IEEE-A8) are untargeted top-1 attacks: an image stays correct (Adv_Result = 1) when it was
right on the clean image and the attack did not mislead the target within its budget. An
attack limited by the plan to a subset of the images is scored over that subset only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.ieee import (
    AttackImageOutcome,
    ClassPrediction,
    CorrectnessRule,
    compute_classification_metrics,
    is_correct,
)


@dataclass(frozen=True, kw_only=True)
class TestRecord:
    kind: str                                  # "clean" | "corruption" | "attack"
    perturbation_id: str = ""                  # corruption id or attack name
    severity: int = 0
    predictions: Mapping[str, ClassPrediction] = field(default_factory=dict)
    queries: Mapping[str, int] = field(default_factory=dict)       # attacks, from the ledger
    success: Mapping[str, bool] = field(default_factory=dict)      # query attacks
    query_budget: int = 0
    image_ids: tuple[str, ...] = ()     # attacks: the images covered (plan limit); () = all


def score_classification(rule: CorrectnessRule, labels: Mapping[str, Sequence[int]],
                         tests: Sequence[TestRecord]) -> dict[str, Any]:
    image_ids = list(labels)
    clean_tests = [t for t in tests if t.kind == "clean"]
    if len(clean_tests) != 1:
        raise InvalidArgument("tests", f"exactly one test of kind 'clean' is needed, got {len(clean_tests)}")
    clean_pred = clean_tests[0].predictions
    missing = [i for i in image_ids if i not in clean_pred]
    if missing:
        raise InvalidArgument("tests[clean].predictions", f"no clean prediction for image '{missing[0]}'")
    clean = {i: is_correct(clean_pred[i], labels[i], rule) for i in image_ids}
    corruptions: dict[str, dict[int, dict[str, bool]]] = {}
    attacks: dict[str, list[AttackImageOutcome]] = {}
    budgets: dict[str, int | None] = {}
    coverage: dict[str, list[str]] = {}
    for n, t in enumerate(tests):
        if t.kind == "clean":
            continue
        if t.kind == "corruption":
            if not 1 <= t.severity <= 5:
                raise InvalidArgument(f"tests[{n}].severity", f"must be in 1..5, got {t.severity}")
            corruptions.setdefault(t.perturbation_id, {})[t.severity] = {
                i: is_correct(p, labels[i], rule) for i, p in t.predictions.items() if i in labels}
        elif t.kind == "attack":
            cover = [i for i in t.image_ids] if t.image_ids else image_ids
            unknown = [i for i in cover if i not in labels]
            if unknown:
                raise InvalidArgument(f"tests[{n}].image_ids", f"image '{unknown[0]}' has no label")
            coverage[t.perturbation_id] = cover
            outs = []
            for i in cover:
                if t.query_budget or t.success:
                    # query attack: judged by the target's answers during the attack (IEEE-M6)
                    if i not in t.success:
                        raise InvalidArgument(f"tests[{n}].success", f"no outcome for image '{i}'")
                    ok = clean[i] and not t.success[i]
                    outs.append(AttackImageOutcome(image_id=i, correct=ok, initially_correct=clean[i],
                                                   success=bool(t.success[i]) if clean[i] else None,
                                                   queries=t.queries.get(i)))
                else:           # transfer attack: judged on the target's answer to the adversarial
                    p = t.predictions.get(i)
                    if p is None:
                        raise InvalidArgument(f"tests[{n}].predictions", f"no prediction for image '{i}'")
                    ok = is_correct(p, labels[i], rule)
                    outs.append(AttackImageOutcome(image_id=i, correct=ok, initially_correct=clean[i],
                                                   success=None, queries=None, error=p.error))
            attacks[t.perturbation_id] = outs
            budgets[t.perturbation_id] = t.query_budget or None
        else:
            raise InvalidArgument(f"tests[{n}].kind", f"must be clean, corruption or attack, got '{t.kind}'")
    # Corruption settings with images missing: fill as incorrect would hide a bug; refuse.
    for name, sevs in corruptions.items():
        for sev, res in sevs.items():
            lacking = [i for i in image_ids if i not in res]
            if lacking:
                raise InvalidArgument(f"tests[{name}@{sev}].predictions", f"no prediction for image '{lacking[0]}'")
    return compute_classification_metrics(clean=clean, corruptions=corruptions, attacks=attacks,
                                          attack_budgets=budgets, image_ids=image_ids,
                                          attack_coverage=coverage)
