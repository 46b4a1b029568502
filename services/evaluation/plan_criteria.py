"""A plan's criteria: the correctness rule and the detection / segmentation parameters
(IEEE-C1/C2, C4, C5, checked by the shared ``core/criteria.py``), each attack's
success criterion, and the acceptance criteria that decide the report's verdict. Domain code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from fortis.core.criteria import TARGETED_CRITERIA, CorrectnessRule
from fortis.core.strategy import STRATEGIES, strategy
from fortis.core.task import Task
from fortis.services.common.acceptance import Criterion, parse_acceptance
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.limits import MAX_RANK
from fortis.services.evaluation.plan_fields import Fields, short

__all__ = ["attack_criterion", "parse_acceptance_section", "parse_criteria"]


def parse_criteria(v: Fields, doc: Mapping[str, Any], task: Task
              ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(correctness, detection, segmentation) sections, each checked by the shared criteria
    (IEEE-C1/C2, C4, C5)."""
    def check(build: Callable[[], Any]) -> None:
        try:
            build()
        except InvalidArgument as exc:
            v.problems.extend(exc.violations)

    sections: dict[str, dict[str, Any]] = {s.section: {} for s in STRATEGIES.values()
                                           if s.own_section}
    for other in STRATEGIES.values():
        if not other.own_section:
            continue            # the correctness section: every plan may give it (below)
        name = other.section
        if other.task == task:
            sections[name] = dict(v.mapping(doc.get(name), name, required=other.section_required))
            check(partial(other.parse_rule, sections[name]))
        elif name in doc:
            v.bad(name, f"only for {other.task} targets; this plan's target.task is {task}")
    c = dict(v.mapping(doc.get("correctness"), "correctness", required=False))
    check(lambda: CorrectnessRule.from_dict(c))
    correctness = {"mode": c.get("mode", "top1"), "k": c.get("k", 5),
                   "threshold": c.get("threshold", 0.5)}
    return correctness, sections["detection"], sections["segmentation"]



def attack_criterion(v: Fields, it: Mapping[str, Any], p: str, task: Task, spec: Any,
                     det: Mapping[str, Any], seg: Mapping[str, Any]) -> dict[str, Any]:
    """An attack's ``targeted`` and ``criterion`` fields -> its criterion as plain data, each
    problem naming its field. Detection / segmentation parameters come from the plan's
    sections (the IEEE-C4 / C5 rule scoring applies)."""
    out: dict[str, Any] = {}
    t = _targeted(v, it, p, task, out)
    kind = _criterion_fields(v, it, p, task, t, out)
    if spec is not None:
        _check_variants(v, p, kind, spec)
    _task_parameters(task, det, seg, out)
    return out


def _targeted(v: Fields, it: Mapping[str, Any], p: str, task: Task,
              out: dict[str, Any]) -> Mapping[str, Any]:
    """The attack's ``targeted: {label: N}`` (sets ``out["target_label"]``); the section as
    given, for the checks that depend on whether it was there."""
    t = v.mapping(it.get("targeted"), f"{p}.targeted", required=False)
    v.unknown(t, f"{p}.targeted", {"label"})
    if t:
        label = t.get("label")
        if isinstance(label, bool) or not isinstance(label, int) or label < 0:
            v.bad(f"{p}.targeted.label", f"must be a class id >= 0, got {short(label)}")
        elif strategy(task).targeted_default is None:
            v.bad(f"{p}.targeted", f"a {task} target has no targeted criterion (IEEE-C5 "
                  "defines none); drop it")
        else:
            out["target_label"] = int(label)
    return t


def _criterion_fields(v: Fields, it: Mapping[str, Any], p: str, task: Task,
                      t: Mapping[str, Any], out: dict[str, Any]) -> str:
    """The attack's ``criterion: {kind, threshold, k}`` (sets ``out``'s ``threshold``, ``k``
    and ``kind``, in that order); the kind defaults from whether the attack is targeted."""
    st = strategy(task)
    kinds = st.attack_criteria
    c = v.mapping(it.get("criterion"), f"{p}.criterion", required=False)
    v.unknown(c, f"{p}.criterion", {"kind", "threshold", "k"})
    kind = v.string(c, "kind", f"{p}.criterion", choices=kinds) if "kind" in c else ""
    if not kind:
        kind = ((st.targeted_default or "") if "target_label" in out
                else st.default_attack_criterion)
    if kind in TARGETED_CRITERIA and "target_label" not in out and not t:
        v.bad(f"{p}.targeted", f"criterion {kind} needs the target class: targeted: {{label: N}}")
    if kind not in TARGETED_CRITERIA and "target_label" in out:
        v.bad(f"{p}.criterion.kind", f"{kind} is untargeted; drop targeted or choose a "
              "targeted kind")
    if "threshold" in c:
        th = c["threshold"]
        if isinstance(th, bool) or not isinstance(th, int | float) or not 0.0 <= th <= 1.0:
            v.bad(f"{p}.criterion.threshold", f"must be a probability in [0, 1], got {short(th)}")
        else:
            out["threshold"] = float(th)
    if "k" in c:
        out["k"] = v.integer(c, "k", f"{p}.criterion", default=5, lo=1, hi=MAX_RANK)
    out["kind"] = kind
    return kind


def _check_variants(v: Fields, p: str, kind: str, spec: Any) -> None:
    """Whether the catalogue's attack has the targeted or untargeted variant ``kind`` needs."""
    if kind in TARGETED_CRITERIA and not spec.targeted:
        v.bad(f"{p}.targeted", f"{spec.id} has no targeted variant")
    if kind not in TARGETED_CRITERIA and not spec.untargeted:
        v.bad(f"{p}.targeted", f"{spec.id} is targeted only: give targeted: {{label: N}}")


def _task_parameters(task: Task, det: Mapping[str, Any], seg: Mapping[str, Any],
                     out: dict[str, Any]) -> None:
    """The IEEE-C4 / C5 parameters of a detection or segmentation criterion, from the plan's
    ``detection`` / ``segmentation`` sections (one definition with scoring)."""
    if task == Task.DETECTION:
        d = {"iou_threshold": float(det.get("iou_threshold", 0.5)),
             "min_objects": int(det.get("q", 1)) if det.get("aggregate") == "at_least" else 0,
             "mode": str(det.get("mode") or "threshold"), "k": int(det.get("k", 5))}
        if det.get("confidence_threshold") is not None:
            d["score_threshold"] = float(det["confidence_threshold"])
        out["detection"] = d
    elif task == Task.SEGMENTATION:
        out["segmentation"] = {"classes": list(seg.get("classes") or []),
                               "miou_threshold": float(seg.get("miou_threshold", 0.5)),
                               "ignore_label": seg.get("ignore_label", 255),
                               "all_absent_incorrect": seg.get("all_absent") == "incorrect"}


def parse_acceptance_section(v: Fields, doc: Mapping[str, Any], corruptions: set[str],
                             attacks: set[str]) -> tuple[Criterion, ...]:
    """The plan's ``acceptance`` criteria (the report's verdict), naming only settings the
    plan runs: its corruption ids and attack names (multi-target expansions included)."""
    acceptance, problems = parse_acceptance(doc.get("acceptance"), corruptions=corruptions,
                                            attacks=attacks)
    v.problems.extend(problems)
    return acceptance
