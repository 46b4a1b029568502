"""One strategy per task: what a classification, detection or segmentation target means to
every service, in one record instead of an if/elif on :class:`~fortis.core.task.Task` in each.

A :class:`TaskStrategy` holds, for its task: its wire value (``fortis.common.v1.TaskType``)
and the requirement whose rule judges its answers, the answers type (:mod:`fortis.core.answers`),
the kind of ground truth an image has, the plan section holding the task's correctness rule
(IEEE-P3) and the rule's type (:mod:`fortis.core.criteria`, which validates it), the attack
success criteria a plan may name (the first is the default; IEEE-A8 / PER-2) and the target
output kinds with the signal an attack reads from each. :data:`STRATEGIES` has one per task;
:func:`strategy` looks one up.

What a service does with a task (the perturbation service's judges and attack criteria, the
scoring service's verdicts) stays in that service, keyed by the task where it needs a table:
core imports no service.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, TypeAlias

from fortis.client.errors import FieldViolation, InvalidArgument
from fortis.common.v1 import common_pb2
from fortis.core.answers import ANSWER_TYPES, Answers
from fortis.core.criteria import (
    ATTACK_CRITERIA,
    TARGETED_DEFAULT,
    CorrectnessRule,
    DetectionCriterion,
    SegmentationCriterion,
)
from fortis.core.task import Task

__all__ = ["OUTPUT_KINDS", "OUTPUT_KIND_NAMES", "STRATEGIES", "TASK_OF_TYPE", "TASK_TYPES", "Rule",
           "TaskStrategy", "strategy"]

#: A plan's correctness rule of one task (IEEE-C1/C2, C4, C5).
Rule: TypeAlias = CorrectnessRule | DetectionCriterion | SegmentationCriterion


@dataclass(frozen=True, kw_only=True, eq=False)   # one per task: compared by identity
class TaskStrategy:
    """What one task means, for every service.

    ``section``: the plan section holding the task's rule; the ``correctness`` section
    (``CorrectnessRule``) is shared: every plan may give it, whatever its task, while a
    detection or segmentation section belongs to that task alone (:attr:`own_section`).
    ``section_required``: whether a plan of this task must give it (segmentation: the
    classes of interest have no default). ``outputs``: each TargetInfo output kind a target
    of this task may have -> the signal an attack reads from it.
    """

    task: Task
    #: the task on the wire (``fortis.common.v1.TaskType``)
    task_type: common_pb2.TaskType
    #: the requirement whose rule judges an answer of this task
    rule_id: str
    answers: type[Answers]
    #: what an image's ground truth is: "label_sets" (IEEE-C1..C3), "boxes" (objects with
    #: classes, IEEE-C4) or "class_map" (a class per pixel, IEEE-C5)
    truth: str
    rule: type[Rule]
    section: str
    section_required: bool
    attack_criteria: tuple[str, ...]
    targeted_default: str | None
    outputs: Mapping[str, str]

    @property
    def own_section(self) -> bool:
        """Whether :attr:`section` is for this task's plans only."""
        return self.rule is not CorrectnessRule

    @property
    def default_attack_criterion(self) -> str:
        """The attack success criterion of a plan that names none (and no target class)."""
        return self.attack_criteria[0]

    def parse_rule(self, section: Mapping[str, Any] | None) -> Rule:
        """The plan's rule from its section (validated); :class:`InvalidArgument` names each
        bad field ``<section>.<key>``."""
        return self.rule.from_dict(section)

    def rule_violations(self, section: Mapping[str, Any] | None) -> list[FieldViolation]:
        """Every problem of the plan's section for this task ([] when it is valid)."""
        try:
            self.parse_rule(section)
        except InvalidArgument as exc:
            return list(exc.violations)
        return []


def _strategy(task: Task, task_type: common_pb2.TaskType, rule_id: str, truth: str,
              rule: type[Rule], section: str, outputs: Mapping[str, str], *,
              section_required: bool = False) -> TaskStrategy:
    return TaskStrategy(task=task, task_type=task_type, rule_id=rule_id,
                        answers=ANSWER_TYPES[task],
                        truth=truth, rule=rule, section=section,
                        section_required=section_required,
                        attack_criteria=tuple(ATTACK_CRITERIA[task]),
                        targeted_default=TARGETED_DEFAULT.get(task),
                        outputs=MappingProxyType(dict(outputs)))


#: The strategy of every task, in the order of :class:`Task`.
STRATEGIES: Final[Mapping[Task, TaskStrategy]] = MappingProxyType({s.task: s for s in (
    _strategy(Task.CLASSIFICATION, common_pb2.TASK_TYPE_CLASSIFICATION, "IEEE-C2",
              "label_sets", CorrectnessRule, "correctness",
              {"full_scores": "scores", "top_k": "top_k", "label_only": "labels"}),
    _strategy(Task.DETECTION, common_pb2.TASK_TYPE_DETECTION, "IEEE-C4",
              "boxes", DetectionCriterion, "detection", {"boxes": "boxes"}),
    _strategy(Task.SEGMENTATION, common_pb2.TASK_TYPE_SEGMENTATION, "IEEE-C5",
              "class_map", SegmentationCriterion, "segmentation",
              {"masks": "masks"}, section_required=True),
)})


#: Each task's wire value (``fortis.common.v1.TaskType``), and the task of each wire value.
TASK_TYPES: Final[Mapping[Task, int]] = MappingProxyType(
    {t: s.task_type for t, s in STRATEGIES.items()})
TASK_OF_TYPE: Final[Mapping[int, Task]] = MappingProxyType({v: t for t, v in TASK_TYPES.items()})
#: A target's output kind, by the name plans, profiles and the strategies' ``outputs`` use, on
#: the wire (``fortis.common.v1.OutputKind``); and the name of each wire value.
OUTPUT_KINDS: Final[Mapping[str, int]] = MappingProxyType({
    "full_scores": common_pb2.OUTPUT_KIND_FULL_SCORES,
    "top_k": common_pb2.OUTPUT_KIND_TOP_K_SCORES,
    "label_only": common_pb2.OUTPUT_KIND_LABEL_ONLY,
    "boxes": common_pb2.OUTPUT_KIND_BOXES,
    "masks": common_pb2.OUTPUT_KIND_MASKS,
})
OUTPUT_KIND_NAMES: Final[Mapping[int, str]] = MappingProxyType(
    {v: k for k, v in OUTPUT_KINDS.items()})


def strategy(task: Task | str) -> TaskStrategy:
    """The strategy of ``task`` (a :class:`Task` or its name); an unknown task is an
    :class:`InvalidArgument` naming ``task``."""
    try:
        return STRATEGIES[Task(task)]
    except (KeyError, ValueError):
        raise InvalidArgument("task", f"unknown task {task!r}") from None
