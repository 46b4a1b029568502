"""A plan's test settings: the corruptions and styles at their severities (IEEE-A1..A6), the
attacks with their parameters, surrogates and budget selection (IEEE-A7, IEEE-A8, CAN-6), the
incremental degradation operators (DEG-1), and what detection and segmentation plans cannot
run. Every name is checked against the :class:`Catalogue`. Domain code.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from fortis.core.task import Task
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.limits import MAX_DATASET_IMAGES, MAX_PLAN_ATTACKS
from fortis.services.common.params import validate_params
from fortis.services.evaluation.plan_criteria import attack_criterion
from fortis.services.evaluation.plan_fields import Fields, short
from fortis.services.evaluation.plan_model import AttackTest, CorruptionTest, DegradationTest
from fortis.services.evaluation.plan_targets import check_surrogate_tasks, surrogate_names
from fortis.services.evaluation.ports import Catalogue

__all__ = ["check_task_limits", "parse_attacks", "parse_corruptions", "parse_degradation"]

#: An attack's name in the plan: it becomes part of proxy session ids and artifact file names.
_SETTING_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,59}$")


def parse_corruptions(v: Fields, doc: Mapping[str, Any], cat: Catalogue) -> list[CorruptionTest]:
    out: list[CorruptionTest] = []
    seen: set[str] = set()
    for i, item in enumerate(v.items(doc, "corruptions")):
        p = f"corruptions[{i}]"
        it = v.mapping({"id": item} if isinstance(item, str) else item, p)
        v.unknown(it, p, {"id", "severities", "params"})
        cid = v.string(it, "id", p, required=True)
        spec = cat.perturbations.get(cid) if cid else None
        if cid and spec is None:
            known = ", ".join(k for k, e in cat.perturbations.items() if e.kind == "corruption")
            v.bad(f"{p}.id", f"unknown corruption {short(cid)}; known: {known}, or a style "
                  "(see `fortis perturbations`)")
        elif spec is not None and (spec.level_kind != "severity" or spec.needs_model):
            v.bad(f"{p}.id", f"'{cid}' is a {spec.kind} with {spec.level_kind}s, not severities "
                  "1..5; only corruptions and styles go under corruptions")
            spec = None
        params = it.get("params") or {}
        if not isinstance(params, dict):
            v.bad(f"{p}.params", "must be a mapping")
            params = {}
        elif spec is not None:
            try:
                params = validate_params(spec, params, f"{p}.params")
            except InvalidArgument as exc:
                v.problems.extend(exc.violations)
        if cid in seen:
            v.bad(f"{p}.id", f"corruption '{cid}' is listed twice")
        seen.add(cid)
        out.append(CorruptionTest(id=cid, params=params,
                                  severities=v.levels(it, "severities", p, lo=1, hi=5,
                                                      default=[1, 2, 3, 4, 5])))
    return out


def parse_attacks(v: Fields, doc: Mapping[str, Any], cat: Catalogue,
                  task: Task = Task.CLASSIFICATION, det: Mapping[str, Any] | None = None,
                  seg: Mapping[str, Any] | None = None, *,
                  benchmark: bool = False) -> list[AttackTest]:
    out: list[AttackTest] = []
    seen: set[str] = set()
    items = v.items(doc, "attacks")
    if len(items) > MAX_PLAN_ATTACKS:
        v.bad("attacks", f"{len(items):,} attacks; at most {MAX_PLAN_ATTACKS} in one plan")
        items = items[:MAX_PLAN_ATTACKS]
    for i, item in enumerate(items):
        out.append(_attack(v, item, f"attacks[{i}]", doc, cat, task, det or {}, seg or {},
                           benchmark=benchmark, seen=seen))
    return out


def _attack(v: Fields, item: Any, p: str, doc: Mapping[str, Any], cat: Catalogue, task: Task,
            det: Mapping[str, Any], seg: Mapping[str, Any], *, benchmark: bool,
            seen: set[str]) -> AttackTest:
    """One entry of ``attacks`` (``seen``: the names of the entries before it)."""
    it = v.mapping(item, p)
    v.unknown(it, p, {"id", "params", "surrogate", "limit", "name", "targeted",
                      "criterion", "select_budget"})
    aid = v.string(it, "id", p, required=True)
    params: Mapping[str, Any] = v.mapping(it.get("params", {}), f"{p}.params", required=False)
    spec = cat.attacks.get(aid)
    label = v.string(it, "name", p, default=aid)
    if label and not _SETTING_NAME.match(label):
        v.bad(f"{p}.name", "use at most 60 letters, digits, '-', '_' or '.' (it names the "
              "attack's proxy sessions and files)")
    if aid and spec is None:
        v.bad(f"{p}.id", f"unknown attack {short(aid)}; known: {', '.join(cat.attacks)}")
    elif spec is not None:
        params = _check_attack_spec(v, it, p, aid, spec, params, cat, task, benchmark=benchmark)
    crit = attack_criterion(v, it, p, task, spec, det, seg)
    names = _attack_surrogates(v, it, p, aid, spec, task, doc)
    if label in seen:
        v.bad(f"{p}.name", f"attack name {short(label)} is used twice; give each a distinct name")
    seen.add(label)
    select = _select_budget(v, it.get("select_budget"), f"{p}.select_budget", spec,
                            params)
    return AttackTest(id=aid, name=label, params=dict(params), select_budget=select,
                      surrogate=names[0] if names else "", ensemble=tuple(names[1:]),
                      limit=v.integer(it, "limit", p, default=0, lo=0, hi=MAX_DATASET_IMAGES),
                      criterion=crit)


def _check_attack_spec(v: Fields, it: Mapping[str, Any], p: str, aid: str, spec: Any,
                       params: Mapping[str, Any], cat: Catalogue, task: Task, *,
                       benchmark: bool) -> Mapping[str, Any]:
    """What the catalogue says of a known attack: its parameters (returned as validated),
    the property a ``pertknob`` search varies, whether it takes a surrogate, and whether it
    attacks targets of the plan's task."""
    try:
        params = validate_params(spec, params, f"{p}.params")
    except InvalidArgument as exc:
        v.problems.extend(exc.violations)
    prop = params.get("property") if isinstance(params, Mapping) else None
    if aid == "pertknob" and isinstance(prop, str) and (
            prop not in cat.perturbations or cat.perturbations[prop].kind != "property"):
        v.bad(f"{p}.params.property", f"{short(prop)} is not a PER-1 safety property; "
              "see `fortis perturbations --kind property`")
    if spec.needs_surrogate and not it.get("surrogate") and not benchmark:
        v.bad(f"{p}.surrogate", f"{aid} is a transfer attack: name the surrogate model"
              " (or list targets with their surrogates: it is then crafted on each)")
    if spec.uses_surrogate and not it.get("surrogate") and not benchmark:
        v.bad(f"{p}.surrogate", f"{aid} is a query attack with a transfer-based prior: "
              "name the local surrogate model it takes the prior from")
    if it.get("surrogate") and not (spec.needs_surrogate or spec.uses_surrogate):
        v.bad(f"{p}.surrogate", f"{aid} takes no surrogate model")
    if task not in spec.tasks:
        v.bad(f"{p}.id", f"{aid} does not attack {task} targets (it attacks: "
              f"{', '.join(spec.tasks)})")
    return params


def _attack_surrogates(v: Fields, it: Mapping[str, Any], p: str, aid: str, spec: Any,
                       task: Task, doc: Mapping[str, Any]) -> list[str]:
    """The attack's ``surrogate`` names (an ensemble only for a transfer attack), each of the
    target's task."""
    names = surrogate_names(v, it.get("surrogate"), f"{p}.surrogate")
    if spec is not None and spec.needs_surrogate:
        check_surrogate_tasks(v, names, it.get("surrogate"), f"{p}.surrogate", task, doc)
    if len(names) > 1 and spec is not None and not spec.needs_surrogate:
        v.bad(f"{p}.surrogate", f"{aid} is not a transfer attack: it takes one surrogate, "
              "not an ensemble")
    return names


def _select_budget(v: Fields, raw: Any, p: str, spec: Any, params: Any) -> dict[str, Any]:
    """CAN-6 settings of one attack: ``true`` (the defaults) or a mapping of factor (1 < f
    <= 4), max_steps (1..6), images (1..1024), alpha (0 < a < 1); only for a transfer attack
    bounded by an epsilon."""
    if raw is None or raw is False:
        return {}
    if spec is not None and (not spec.needs_surrogate or not isinstance(params, Mapping)
                             or not isinstance(params.get("epsilon"), int | float)):
        v.bad(p, "budget selection (CAN-6) is for transfer attacks bounded by an epsilon")
        return {}
    if raw is True:
        return {"enabled": True}
    if not isinstance(raw, Mapping):
        v.bad(p, "must be true or a mapping of factor, max_steps, images, alpha")
        return {}
    v.unknown(raw, p, {"factor", "max_steps", "images", "alpha"})
    out: dict[str, Any] = {"enabled": True}
    for key, lo, hi, kind in (("factor", 1.0, 4.0, float), ("alpha", 0.0, 1.0, float),
                              ("max_steps", 1, 6, int), ("images", 1, 1024, int)):
        if key not in raw:
            continue
        x = raw[key]
        ok = not isinstance(x, bool) and isinstance(x, int | float) and math.isfinite(x) and (
            lo < x <= hi if kind is float else (float(x).is_integer() and lo <= x <= hi))
        if not ok:
            v.bad(f"{p}.{key}", f"must be {'a number in (' if kind is float else 'an integer in ['}"
                  f"{lo}, {hi}], got {short(x)}")
            continue
        out[key] = kind(x)
    return out



def parse_degradation(v: Fields, doc: Mapping[str, Any], cat: Catalogue) -> list[DegradationTest]:
    out: list[DegradationTest] = []
    seen: set[str] = set()
    for i, item in enumerate(v.items(doc, "degradation")):
        p = f"degradation[{i}]"
        it = v.mapping({"id": item} if isinstance(item, str) else item, p)
        v.unknown(it, p, {"id", "levels", "surrogate"})
        did = v.string(it, "id", p, required=True)
        spec = cat.perturbations.get(did) if did else None
        if did and (spec is None or spec.kind != "degradation"):
            v.bad(f"{p}.id", f"{short(did)} is not an incremental degradation operator (DEG-1); "
                  "see `fortis perturbations --kind degradation`")
            spec = None
        if did in seen:
            v.bad(f"{p}.id", f"operator '{did}' is listed twice")
        seen.add(did)
        levels = v.levels(it, "levels", p, lo=1, hi=30, default=list(range(1, 31)))
        sur = v.string(it, "surrogate", p)
        if spec is not None and spec.needs_model and not sur:
            v.bad(f"{p}.surrogate", f"{did} is white-box: name the surrogate model whose gradient it follows")
        if spec is not None and not spec.needs_model and sur:
            v.bad(f"{p}.surrogate", f"{did} uses no model")
        out.append(DegradationTest(id=did, surrogate=sur, levels=levels))
    return out


def check_task_limits(v: Fields, task: Task, corruptions: list[CorruptionTest], attacks: list[AttackTest],
                 degradation: list[DegradationTest], cat: Catalogue) -> None:
    """What detection and segmentation plans cannot do (query attacks can: ``parse_attacks``
    checks each attack's task types and refuses transfer attacks there)."""
    if task == Task.CLASSIFICATION:
        return
    for i in range(len(degradation)):
        v.bad(f"degradation[{i}].id", f"degradation profiles follow class labels; not "
              f"available for a {task} target")
    for i, ct in enumerate(corruptions):
        cs = cat.perturbations.get(ct.id)
        if cs is not None and cs.family == "geometric":
            v.bad(f"corruptions[{i}].id", f"{ct.id} moves the objects but not the ground "
                  "truth; geometric corruptions are for classification plans only")

