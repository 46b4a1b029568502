"""Test plans (IEEE-P3): parsing and validation with precise, field-named errors.

A plan is YAML or JSON. Every problem found is reported at once, each naming its field
(e.g. ``corruptions[2].severities[0]: must be an integer in 1..5, got 0``). What the plan may
name -- perturbations, attacks and their parameter schemas -- comes from a :class:`Catalogue`
the evaluation service learned from the perturbation service's List RPCs, and the correctness
criteria from the shared contract data in ``core/criteria.py``; this module imports
no other service. Each section has its own validator; :func:`validate_plan` runs them all, in
the order their problems are reported.

The sections live beside this module, which stays the one place callers import from:
``plan_text`` (text -> document, bounded), ``plan_model`` (the frozen records),
``plan_fields`` (the field-by-field reader that collects problems), ``plan_targets`` (roles,
targets, dataset, baseline, surrogates), ``plan_criteria`` (correctness, detection,
segmentation, attack criteria, acceptance) and ``plan_settings`` (corruptions, attacks,
degradation). Domain code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fortis.core.criteria import CORRECTNESS_MODES, PROBABILITY_CRITERIA
from fortis.core.task import TASKS
from fortis.services.common.acceptance import parse_sequential
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.limits import MAX_BATCH_SIZE, MAX_SEED
from fortis.services.common.surrogates import resolve_label_map
from fortis.services.evaluation.plan_criteria import parse_acceptance_section, parse_criteria
from fortis.services.evaluation.plan_fields import Fields, short
from fortis.services.evaluation.plan_model import (
    DATASETS,
    MAX_MEMBERS,
    AttackTest,
    CorruptionTest,
    DatasetRef,
    DegradationTest,
    Member,
    Plan,
    Role,
    TargetRef,
    crafted_on,
)
from fortis.services.evaluation.plan_settings import (
    check_task_limits,
    parse_attacks,
    parse_corruptions,
    parse_degradation,
)
from fortis.services.evaluation.plan_targets import (
    check_surrogate_labels,
    check_surrogate_tasks,
    parse_baseline,
    parse_dataset,
    parse_members,
    parse_roles,
    parse_surrogates,
    parse_target,
    surrogate_specs,
)
from fortis.services.evaluation.plan_text import MAX_DEPTH as MAX_DEPTH  # read by docs/limits.md
from fortis.services.evaluation.plan_text import MAX_PLAN_BYTES, parse_plan_text
from fortis.services.evaluation.ports import Catalogue, TargetDescription

__all__ = ["CORRECTNESS_MODES", "DATASETS", "MAX_MEMBERS", "MAX_PLAN_BYTES", "TASKS",
           "AttackTest", "CorruptionTest", "DatasetRef", "DegradationTest", "Member", "Plan",
           "Role", "TargetRef", "crafted_on",
           "check_against_target", "check_surrogate_labels", "load_plan", "parse_plan_text",
           "surrogate_specs", "validate_plan"]


def validate_plan(doc: Mapping[str, Any], catalogue: Catalogue) -> Plan:
    """Check a plan document against the catalogue; raise one InvalidArgument listing every
    problem."""
    v = Fields()
    v.unknown(doc, "", {"name", "seed", "roles", "target", "dataset", "correctness",
                        "corruptions", "attacks", "execution", "description", "degradation",
                        "detection", "segmentation", "surrogates", "acceptance", "canary",
                        "targets", "baseline"})
    name = v.string(doc, "name", "", required=True)
    seed = v.integer(doc, "seed", "", default=0, lo=0, hi=MAX_SEED)
    roles = parse_roles(v, doc)
    members: list[Member] = []
    if "targets" in doc:
        target, members = parse_members(v, doc)
    else:
        target = parse_target(v, doc)
    baseline = parse_baseline(v, doc, members)
    dataset = parse_dataset(v, doc, target.task)
    correctness, det, seg = parse_criteria(v, doc, target.task)
    corruptions = parse_corruptions(v, doc, catalogue)
    attacks = parse_attacks(v, doc, catalogue, target.task, det, seg,
                            benchmark=len(members) > 1 or bool(baseline))
    _check_benchmark(v, doc, attacks, members, target)
    surrogates = parse_surrogates(v, doc)
    attack_names = _attack_names(v, attacks, members, catalogue)
    acceptance = parse_acceptance_section(v, doc, {c.id for c in corruptions}, attack_names)
    sequential, _ = parse_sequential(doc.get("acceptance"))   # its problems: acceptance's
    if sequential.enabled and (len(members) > 1 or baseline):
        v.bad("acceptance.sequential", "sequential acceptance stops one model's settings; a "
              "multi-target plan ranks models on the same images: drop it")
    canary = _canary(v, doc)
    degradation = parse_degradation(v, doc, catalogue)
    batch = _batch_size(v, doc)
    check_task_limits(v, target.task, corruptions, attacks, degradation, catalogue)
    if not corruptions and not attacks and not degradation:
        v.bad("corruptions", "the plan tests nothing: list at least one corruption, attack or "
              "degradation operator")
    if v.problems:
        raise InvalidArgument.from_violations(v.problems[:100])
    return Plan(name=name, seed=seed, requester=roles["requester"], tester=roles["tester"],
                provider=roles["provider"], target=target, dataset=dataset,
                correctness=correctness, corruptions=tuple(corruptions), attacks=tuple(attacks),
                batch_size=batch, raw=dict(doc), degradation=tuple(degradation),
                detection=det, segmentation=seg, surrogates=tuple(surrogates),
                acceptance=acceptance, canary=canary, members=tuple(members), baseline=baseline,
                sequential=sequential)


def _check_benchmark(v: Fields, doc: Mapping[str, Any], attacks: list[AttackTest],
                     members: list[Member], target: TargetRef) -> None:
    """What a multi-target or fast-mode plan cannot do: select budgets per target (every model
    must see the same examples); and each model's white-box twin does the target's task."""
    if len(members) > 1 or "baseline" in doc:
        for i, a in enumerate(attacks):
            if a.select_budget:
                v.bad(f"attacks[{i}].select_budget", "budget selection (CAN-6) runs on one "
                      "target; not in a multi-target plan (every model must see the same "
                      "examples)")
    for i, m in enumerate(members):
        if m.surrogate:
            check_surrogate_tasks(v, [m.surrogate], m.surrogate, f"targets[{i}].surrogate",
                                  target.task, doc)


def _attack_names(v: Fields, attacks: list[AttackTest], members: list[Member],
                  catalogue: Catalogue) -> set[str]:
    """Every setting name the plan's attacks run under: multi-target plans run a transfer
    attack per model surrogate (CAN-7), named by :func:`crafted_on`, which must not clash
    with a name the plan gives."""
    attack_names = {a.name for a in attacks}
    for a in attacks:
        entry = catalogue.attacks.get(a.id)
        if members and entry is not None and entry.needs_surrogate and not a.surrogate:
            expanded = {crafted_on(a.name, m.surrogate) for m in members if m.surrogate}
            for name in sorted(expanded & attack_names):
                v.bad("attacks", f"attack name {short(name)} is also the name of "
                      f"{a.name} crafted on a model's surrogate; rename it")
            attack_names |= expanded
    return attack_names


def _canary(v: Fields, doc: Mapping[str, Any]) -> bool:
    """The plan's ``canary: true`` (CANARY metrics per attack in the report)."""
    canary = doc.get("canary", False)
    if not isinstance(canary, bool):
        v.bad("canary", f"must be true or false, got {short(canary)}")
        canary = False
    return canary


def _batch_size(v: Fields, doc: Mapping[str, Any]) -> int:
    """The plan's ``execution: {batch_size}``."""
    e = v.mapping(doc.get("execution"), "execution", required=False)
    v.unknown(e, "execution", {"batch_size"})
    return v.integer(e, "batch_size", "execution", default=64, lo=1, hi=MAX_BATCH_SIZE)


def check_against_target(plan: Plan, target: TargetDescription, catalogue: Catalogue) -> None:
    """What only the target's description can tell (GetTargetInfo): its task, and for each
    attack whether the target gives the signal it needs (IEEE-A8: a score-based attack needs
    scores; a label-only target takes decision-based attacks only), whether its criterion can
    be judged (criteria on class probabilities need scores) and whether a targeted class is
    one of the target's labels. One InvalidArgument listing every problem by field."""
    v = Fields()
    if target.task != plan.target.task:
        v.bad("target.task", f"plan says {plan.target.task} but target '{plan.target.name}' is "
              f"{target.task}")
    labels_only = target.output_kind == "label_only"
    if plan.correctness.get("mode") == "threshold" and labels_only:
        v.bad("correctness.mode", "threshold needs a score-returning target; this one returns "
              "labels only")
    n_labels = len(target.labels)
    for i, at in enumerate(plan.attacks):
        entry = catalogue.attacks.get(at.id)
        if entry is not None and entry.kind == "score" and labels_only:
            v.bad(f"attacks[{i}].id", f"{at.id} is score-based, but target '{plan.target.name}' "
                  "returns labels only (output kind label_only): use a decision-based attack")
        if at.criterion_kind in PROBABILITY_CRITERIA and labels_only:
            v.bad(f"attacks[{i}].criterion.kind", f"{at.criterion_kind} is judged on class "
                  f"probabilities; target '{plan.target.name}' returns labels only")
        k = at.criterion.get("k", 5)
        if at.criterion_kind == "top_k_misclassification" and target.output_kind == "top_k" \
                and target.top_k and int(k) > target.top_k:
            v.bad(f"attacks[{i}].criterion.k", f"top-{k} misclassification cannot be judged on "
                  f"target '{plan.target.name}', which returns its top {target.top_k} classes "
                  "only")
        tl = at.criterion.get("target_label")
        if tl is not None and n_labels and int(tl) >= n_labels:
            v.bad(f"attacks[{i}].targeted.label", f"class {tl} is outside the target's "
                  f"{n_labels} labels")
    for k, sd in enumerate(plan.surrogates):     # IEEE-P6: the label map, by index or name
        v.problems.extend(resolve_label_map(sd, target.labels, f"surrogates[{k}]")[1])
    if v.problems:
        raise InvalidArgument.from_violations(v.problems[:100])


def load_plan(text: str, catalogue: Catalogue, fmt: str = "") -> Plan:
    return validate_plan(parse_plan_text(text, fmt), catalogue)
