"""Test plans (IEEE-P3): parsing and validation with precise, field-named errors.

A plan is YAML or JSON. Every problem found is reported at once, each naming its field
(e.g. ``corruptions[2].severities[0]: must be an integer in 1..5, got 0``). What the plan may
name -- perturbations, attacks and their parameter schemas -- comes from a :class:`Catalogue`
the evaluation service learned from the perturbation service's List RPCs, and the correctness
criteria from the shared contract data in ``services/common/criteria.py``; this module imports
no other service. Each section has its own validator; :func:`validate_plan` runs them all.
Domain code.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from fortis.core.task import TASKS, Task
from fortis.services.common.acceptance import Criterion, parse_acceptance
from fortis.services.common.blobs import is_blob_id
from fortis.services.common.criteria import (
    ATTACK_CRITERIA,
    CORRECTNESS_MODES,
    PROBABILITY_CRITERIA,
    TARGETED_CRITERIA,
    TARGETED_DEFAULT,
    CorrectnessRule,
    DetectionCriterion,
    SegmentationCriterion,
)
from fortis.services.common.errors import FieldViolation, InvalidArgument
from fortis.services.common.limits import (
    MAX_BATCH_SIZE,
    MAX_DATASET_IMAGES,
    MAX_DATASET_OFFSET,
    MAX_ENSEMBLE,
    MAX_LABEL_MAP,
    MAX_PLAN_ATTACKS,
    MAX_PLAN_DEPTH,
    MAX_PLAN_STRING_CHARS,
    MAX_RANK,
    MAX_SEED,
    MAX_SURROGATES,
)
from fortis.services.common.params import validate_params
from fortis.services.common.surrogates import (
    BUILTIN_SURROGATE_NAMES,
    BUILTIN_SURROGATE_TASKS,
    SurrogateDefinition,
    SurrogateSpec,
    parse_definition,
    resolve_label_map,
    spec_of,
)
from fortis.services.evaluation.ports import Catalogue, TargetDescription

DATASETS = ("fashion-mnist", "imagenet-photos", "manifest", "uploads")
from fortis.services.common.limits import MAX_PLAN_BYTES  # noqa: E402 - re-exported

#: Nesting depth of a plan document (docs/limits.md).
MAX_DEPTH = MAX_PLAN_DEPTH
#: An evaluation id (as ``service.check_evaluation_id`` accepts).
_EVALUATION_ID = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,99}$")
#: An attack's name in the plan: it becomes part of proxy session ids and artifact file names.
_SETTING_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,59}$")
__all__ = ["CORRECTNESS_MODES", "DATASETS", "MAX_MEMBERS", "MAX_PLAN_BYTES", "TASKS",
           "AttackTest", "CorruptionTest", "DatasetRef", "DegradationTest", "Member", "Plan",
           "Role", "TargetRef", "crafted_on",
           "check_against_target", "check_surrogate_labels", "load_plan", "parse_plan_text",
           "surrogate_specs", "validate_plan"]


@dataclass(frozen=True, kw_only=True)
class Role:
    name: str = ""
    organisation: str = ""


@dataclass(frozen=True, kw_only=True)
class TargetRef:
    name: str
    task: Task = Task.CLASSIFICATION
    endpoint: str = ""
    credentials_ref: str = ""


@dataclass(frozen=True, kw_only=True)
class Member:
    """One model of a multi-target plan (CANARY benchmark, CAN-7): a target on this server,
    the surrogate that stands for it when transfer attacks are crafted (its white-box twin;
    "" = attacks are not crafted on it) and, for CAN-5, the member it is the defended version
    of."""

    name: str
    surrogate: str = ""
    defends: str = ""


#: Models in one multi-target plan (each runs every test of the plan).
MAX_MEMBERS = 8


def crafted_on(attack: str, surrogate: str) -> str:
    """The setting name of a multi-target plan's transfer attack crafted on one model's
    surrogate (CAN-7): ``<attack>.<surrogate>``, e.g. ``pgd.fmnist-cnn-at`` (it names proxy
    sessions and artifacts, so it keeps their charset)."""
    return f"{attack}.{surrogate}"


@dataclass(frozen=True, kw_only=True)
class DatasetRef:
    source: str
    split: str = "test"
    limit: int = 100
    offset: int = 0
    label_map: Mapping[int, int] = field(default_factory=dict)
    path: str = ""          # source "manifest": a JSON-lines file on the evaluation service's disk
    manifest: str = ""      # source "uploads": "sha256:..." of the tenant's uploaded manifest


@dataclass(frozen=True, kw_only=True)
class CorruptionTest:
    """One severity-graded perturbation of the plan: a corruption (IEEE-A1..A5) or a style
    change (IEEE-A6), at the listed severities, with optional parameters."""

    id: str
    severities: tuple[int, ...]
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class DegradationTest:
    """An incremental degradation operator (DEG-1) at the listed levels (1..30), scored as
    degradation profiles with failure points (DEG-2..DEG-4). White-box operators (model
    gradient descent) name the surrogate whose gradient they follow."""

    id: str
    levels: tuple[int, ...]
    surrogate: str = ""


@dataclass(frozen=True, kw_only=True)
class AttackTest:
    id: str
    name: str               # distinct label in the report (default: the id)
    params: Mapping[str, Any]
    surrogate: str = ""
    #: Further surrogates crafted on together with ``surrogate`` (the plan's ``surrogate: [a,
    #: b, ...]``: an IEEE-A7 model ensemble whose first is the primary).
    ensemble: tuple[str, ...] = ()
    limit: int = 0          # attack only the first N images (0 = all)
    #: The success criterion as plain data (RunAttackRequest.criterion): ``kind`` (see
    #: ``common.criteria.ATTACK_CRITERIA``), ``target_label`` (the plan's ``targeted:
    #: {label: N}``), ``threshold``, ``k``, and for detection / segmentation targets the
    #: IEEE-C4 / C5 parameters taken from the plan's ``detection`` / ``segmentation``
    #: sections (one definition with scoring).
    criterion: Mapping[str, Any] = field(default_factory=dict)
    #: CAN-6 evaluation example selection (``select_budget: true`` or its settings: factor,
    #: max_steps, images, alpha; ``selection.py``); empty: the plan's epsilon as given.
    select_budget: Mapping[str, Any] = field(default_factory=dict)

    @property
    def targeted(self) -> bool:
        return self.criterion.get("kind") in TARGETED_CRITERIA

    @property
    def criterion_kind(self) -> str:
        return str(self.criterion.get("kind") or "")


@dataclass(frozen=True, kw_only=True)
class Plan:
    name: str
    seed: int
    requester: Role
    tester: Role
    provider: Role
    target: TargetRef
    dataset: DatasetRef
    correctness: Mapping[str, Any]
    corruptions: tuple[CorruptionTest, ...]
    attacks: tuple[AttackTest, ...]
    batch_size: int
    degradation: tuple[DegradationTest, ...] = ()
    #: IEEE-C4 / IEEE-C5 service-type parameters (IEEE-P3), validated by
    #: services/common/criteria (DetectionCriterion / SegmentationCriterion).
    detection: Mapping[str, Any] = field(default_factory=dict)
    segmentation: Mapping[str, Any] = field(default_factory=dict)
    #: The tenant's own surrogates (IEEE-A7, IEEE-P6): uploaded models the attacks may name.
    surrogates: tuple[SurrogateDefinition, ...] = ()
    #: Acceptance criteria: the report's verdict and ``fortis run``'s exit code.
    acceptance: tuple[Criterion, ...] = ()
    #: CANARY metrics per attack in the report (CAN-1..CAN-4), the plan's ``canary: true``.
    canary: bool = False
    #: Multi-target plans (the plan's ``targets:``; CAN-5/7/8): every model, the first being
    #: ``target``. Empty for a single-target plan.
    members: tuple[Member, ...] = ()
    #: CAN-10 fast mode: a finished multi-target evaluation of this tenant whose models this
    #: plan's target is ranked against, without re-running them (``baseline: {evaluation:}``).
    baseline: str = ""
    raw: Mapping[str, Any]

    @property
    def is_benchmark(self) -> bool:
        """A multi-target plan or a fast-mode ranking against a baseline (CANARY)."""
        return len(self.members) > 1 or bool(self.baseline)


class _V:
    """Collects violations while walking the document."""

    def __init__(self) -> None:
        self.problems: list[FieldViolation] = []

    def bad(self, path: str, msg: str) -> None:
        self.problems.append(FieldViolation(path, msg))

    def mapping(self, doc: Any, path: str, *, required: bool = True) -> Mapping[str, Any]:
        if doc is None and not required:
            return {}
        if not isinstance(doc, Mapping):
            self.bad(path, f"must be a mapping, got {type(doc).__name__}")
            return {}
        return doc

    def unknown(self, doc: Mapping[str, Any], path: str, allowed: set[str]) -> None:
        for k in doc:
            if k not in allowed:
                where = f"{path}.{k}" if path else str(k)
                self.bad(where[:200], f"unknown field; allowed: {', '.join(sorted(allowed))}")

    def string(self, doc: Mapping[str, Any], key: str, path: str, *, required: bool = False,
               default: str = "", choices: tuple[str, ...] | None = None) -> str:
        p = f"{path}.{key}" if path else key
        if key not in doc or doc[key] is None:
            if required:
                self.bad(p, "required")
            return default
        v = doc[key]
        if not isinstance(v, str) or (required and not v.strip()):
            self.bad(p, f"must be a non-empty string, got {_short(v)}")
            return default
        if len(v) > MAX_PLAN_STRING_CHARS:
            self.bad(p, f"{len(v):,} characters; at most {MAX_PLAN_STRING_CHARS:,}")
            return default
        if choices and v not in choices:
            self.bad(p, f"must be one of {', '.join(choices)}, got {_short(v)}")
            return default
        return v

    def integer(self, doc: Mapping[str, Any], key: str, path: str, *, default: int,
                lo: int, hi: int) -> int:
        p = f"{path}.{key}" if path else key
        if key not in doc:
            return default
        v = doc[key]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            self.bad(p, f"must be an integer in {lo}..{hi}, got {_short(v)}")
            return default
        return v

    def levels(self, doc: Mapping[str, Any], key: str, path: str, *, lo: int, hi: int,
               default: list[int]) -> tuple[int, ...]:
        """A non-empty list of distinct integers in lo..hi, sorted."""
        raw = doc.get(key, default)
        if not isinstance(raw, list) or not raw:
            self.bad(f"{path}.{key}", f"must be a non-empty list of integers in {lo}..{hi}")
            return ()
        ok = []
        for j, x in enumerate(raw):
            if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
                self.bad(f"{path}.{key}[{j}]", f"must be an integer in {lo}..{hi}, got {_short(x)}")
            else:
                ok.append(x)
        if len(set(ok)) != len(ok):
            self.bad(f"{path}.{key}", f"{key} repeat")
        return tuple(sorted(set(ok)))

    def items(self, doc: Mapping[str, Any], key: str) -> list[Any]:
        raw = doc.get(key) or []
        if not isinstance(raw, list):
            self.bad(key, "must be a list")
            return []
        return raw


def _short(v: Any, limit: int = 80) -> str:
    r = repr(v)
    return r if len(r) <= limit else r[:limit] + "..."


def _depth(doc: Any, limit: int) -> int:
    """Nesting depth of a parsed document, stopping once past ``limit``."""
    stack = [(doc, 1)]
    worst = 0
    while stack:
        node, d = stack.pop()
        worst = max(worst, d)
        if worst > limit:
            return worst
        if isinstance(node, Mapping):
            stack += [(v, d + 1) for v in node.values()]
        elif isinstance(node, list):
            stack += [(v, d + 1) for v in node]
    return worst


class _AliasRefused(Exception):
    """An anchor or alias met while composing a YAML plan (carries where, never the text)."""

    def __init__(self, what: str, mark: Any) -> None:
        super().__init__(what)
        self.what = what
        self.mark = mark


class _PlanLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses anchors (``&a``) and aliases (``*a``, and so ``<<:``
    merges) as it composes, before anything is built or expanded.

    Why: a 563-byte plan of nested aliases ("billion laughs") cost +792 MB and a 72 MB
    error string. A plan never needs them: the refusal is cheap (checked per node) and the
    document is never expanded.
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _AliasRefused("aliases (*name)", event.start_mark)
        if getattr(event, "anchor", None) is not None:
            raise _AliasRefused("anchors (&name)", event.start_mark)
        return super().compose_node(parent, index)


def _load_yaml(text: str) -> Any:
    loader = _PlanLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def parse_plan_text(text: str, fmt: str = "") -> dict[str, Any]:
    """YAML or JSON text -> document (``fmt``: "yaml", "json" or "" to detect).

    Bounded before anything is built: the size (``MAX_PLAN_BYTES``), YAML
    anchors and aliases refused while composing (no expansion), the depth (``MAX_DEPTH``).
    Every error is InvalidArgument on ``plan`` with a short message quoting no plan text.
    """
    if not text or not text.strip():
        raise InvalidArgument("plan", "the plan is empty")
    if len(text.encode()) > MAX_PLAN_BYTES:
        raise InvalidArgument("plan", f"the plan is larger than {MAX_PLAN_BYTES} bytes")
    fmt = fmt or ("json" if text.lstrip().startswith("{") else "yaml")
    try:
        doc = json.loads(text) if fmt == "json" else _load_yaml(text)
    except RecursionError:
        raise InvalidArgument("plan", f"nested more than {MAX_DEPTH} levels deep") from None
    except _AliasRefused as exc:
        raise InvalidArgument("plan", f"YAML {exc.what} are not accepted (at line "
                              f"{exc.mark.line + 1}, column {exc.mark.column + 1}): write each "
                              "value out in full") from None
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        if isinstance(exc, json.JSONDecodeError):
            where = f" at line {exc.lineno}, column {exc.colno}"
            problem = exc.msg[:200]
        else:
            problem = str(getattr(exc, "problem", None) or "syntax error")[:200]
        raise InvalidArgument("plan", f"not valid {fmt.upper()}{where}: {problem}") from None
    except ValueError as exc:   # e.g. an integer past Python's digit limit: quote none of it
        raise InvalidArgument("plan", f"not valid {fmt.upper()}: a value could not be read "
                              f"({type(exc).__name__}, e.g. a number of over 4300 digits)") from None
    if not isinstance(doc, dict):
        raise InvalidArgument("plan", f"the plan must be a mapping at the top level, got {type(doc).__name__}")
    if _depth(doc, MAX_DEPTH) > MAX_DEPTH:
        raise InvalidArgument("plan", f"nested more than {MAX_DEPTH} levels deep")
    return doc


# -- sections ----------------------------------------------------------------------------------

def _roles(v: _V, doc: Mapping[str, Any]) -> dict[str, Role]:
    roles = v.mapping(doc.get("roles"), "roles", required=False)
    v.unknown(roles, "roles", {"requester", "tester", "provider"})
    out = {}
    for r in ("requester", "tester", "provider"):
        rd = v.mapping(roles.get(r), f"roles.{r}", required=False)
        v.unknown(rd, f"roles.{r}", {"name", "organisation"})
        out[r] = Role(name=v.string(rd, "name", f"roles.{r}"),
                      organisation=v.string(rd, "organisation", f"roles.{r}"))
    return out


def _members(v: _V, doc: Mapping[str, Any]) -> tuple[TargetRef, list[Member]]:
    """``targets:`` (a multi-target plan) instead of ``target:``; the first is the primary."""
    if "target" in doc:
        v.bad("targets", "give either target (one model) or targets (several), not both")
    items = v.items(doc, "targets")
    if not items:
        v.bad("targets", "must list at least one target")
        return TargetRef(name=""), []
    if len(items) > MAX_MEMBERS:
        v.bad("targets", f"{len(items):,} targets; at most {MAX_MEMBERS} in one plan")
        items = items[:MAX_MEMBERS]
    members: list[Member] = []
    refs: list[TargetRef] = []
    for i, item in enumerate(items):
        p = f"targets[{i}]"
        t = v.mapping(item, p)
        v.unknown(t, p, {"name", "task", "endpoint", "credentials_ref", "surrogate", "defends"})
        ref = TargetRef(name=v.string(t, "name", p, required=True),
                        task=Task(v.string(t, "task", p, default=Task.CLASSIFICATION,
                                           choices=TASKS)),
                        endpoint=v.string(t, "endpoint", p),
                        credentials_ref=v.string(t, "credentials_ref", p))
        sur = t.get("surrogate")
        if sur is not None and not isinstance(sur, str):
            v.bad(f"{p}.surrogate", "must be the name of one surrogate model")
            sur = ""
        members.append(Member(name=ref.name, surrogate=sur or "",
                              defends=v.string(t, "defends", p)))
        refs.append(ref)
    names = [m.name for m in members]
    for i, m in enumerate(members):
        if m.name and names.index(m.name) != i:
            v.bad(f"targets[{i}].name", f"target {_short(m.name)} is listed twice")
        if m.defends and m.defends not in names:
            v.bad(f"targets[{i}].defends", f"{_short(m.defends)} is not one of the plan's targets")
        if m.defends and m.defends == m.name:
            v.bad(f"targets[{i}].defends", "a model cannot be its own baseline")
        if refs[i].task != refs[0].task:
            v.bad(f"targets[{i}].task", f"every target of one plan has the same task "
                  f"({refs[0].task})")
    return refs[0], members


def _target(v: _V, doc: Mapping[str, Any]) -> TargetRef:
    t = v.mapping(doc.get("target"), "target")
    v.unknown(t, "target", {"name", "task", "endpoint", "credentials_ref"})
    return TargetRef(name=v.string(t, "name", "target", required=True),
                     task=Task(v.string(t, "task", "target", default=Task.CLASSIFICATION,
                                        choices=TASKS)),
                     endpoint=v.string(t, "endpoint", "target"),
                     credentials_ref=v.string(t, "credentials_ref", "target"))


def _dataset(v: _V, doc: Mapping[str, Any], task: Task) -> DatasetRef:
    d = v.mapping(doc.get("dataset"), "dataset")
    v.unknown(d, "dataset", {"source", "split", "limit", "offset", "label_map", "path",
                             "manifest"})
    label_map: dict[int, int] = {}
    lm = d.get("label_map") or {}
    if not isinstance(lm, Mapping):
        v.bad("dataset.label_map", "must be a mapping of dataset label -> service label")
    elif len(lm) > MAX_LABEL_MAP:
        v.bad("dataset.label_map", f"{len(lm):,} entries; at most {MAX_LABEL_MAP:,}")
    else:
        for k, val in lm.items():
            try:
                label_map[int(k)] = int(val)
            except (TypeError, ValueError, OverflowError):
                v.bad(f"dataset.label_map.{str(k)[:40]}", f"labels must be integers, got {_short(k)}: {_short(val)}")
    dataset = DatasetRef(source=v.string(d, "source", "dataset", required=True, choices=DATASETS),
                         split=v.string(d, "split", "dataset", default="test", choices=("test", "train")),
                         limit=v.integer(d, "limit", "dataset", default=100, lo=1,
                                                 hi=MAX_DATASET_IMAGES),
                         offset=v.integer(d, "offset", "dataset", default=0, lo=0,
                                                   hi=MAX_DATASET_OFFSET),
                         label_map=label_map, path=v.string(d, "path", "dataset"),
                         manifest=v.string(d, "manifest", "dataset"))
    if dataset.source == "manifest" and not dataset.path:
        v.bad("dataset.path", "source 'manifest' needs the path of a JSON-lines manifest")
    if dataset.source == "uploads" and not is_blob_id(dataset.manifest):
        # uploaded data is named by content id, never by a server path
        v.bad("dataset.manifest", "source 'uploads' needs the id ('sha256:' and 64 lowercase "
              "hex digits) of an uploaded manifest (fortis upload-dataset)")
    if dataset.source != "uploads" and dataset.manifest:
        v.bad("dataset.manifest", "only source 'uploads' takes a manifest id")
    if task != Task.CLASSIFICATION and dataset.source not in ("manifest", "uploads"):
        v.bad("dataset.source", f"a {task} plan needs ground truth: use source 'manifest' "
              "or 'uploads' (boxes or masks per image)")
    return dataset


def _criteria(v: _V, doc: Mapping[str, Any], task: Task
              ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(correctness, detection, segmentation) sections, each checked by the shared criteria
    (IEEE-C1/C2, C4, C5)."""
    def check(build: Callable[[], Any]) -> None:
        try:
            build()
        except InvalidArgument as exc:
            v.problems.extend(exc.violations)

    det: dict[str, Any] = {}
    seg: dict[str, Any] = {}
    if task == Task.DETECTION:
        det = dict(v.mapping(doc.get("detection"), "detection", required=False))
        check(lambda: DetectionCriterion.from_dict(det))
    elif "detection" in doc:
        v.bad("detection", f"only for detection targets; this plan's target.task is {task}")
    if task == Task.SEGMENTATION:
        seg = dict(v.mapping(doc.get("segmentation"), "segmentation"))
        check(lambda: SegmentationCriterion.from_dict(seg))
    elif "segmentation" in doc:
        v.bad("segmentation", f"only for segmentation targets; this plan's target.task is {task}")
    c = dict(v.mapping(doc.get("correctness"), "correctness", required=False))
    check(lambda: CorrectnessRule.from_dict(c))
    correctness = {"mode": c.get("mode", "top1"), "k": c.get("k", 5),
                   "threshold": c.get("threshold", 0.5)}
    return correctness, det, seg


def _corruptions(v: _V, doc: Mapping[str, Any], cat: Catalogue) -> list[CorruptionTest]:
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
            v.bad(f"{p}.id", f"unknown corruption {_short(cid)}; known: {known}, or a style "
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


def _attack_criterion(v: _V, it: Mapping[str, Any], p: str, task: Task, spec: Any,
                      det: Mapping[str, Any], seg: Mapping[str, Any]) -> dict[str, Any]:
    """An attack's ``targeted`` and ``criterion`` fields -> its criterion as plain data, each
    problem naming its field. Detection / segmentation parameters come from the plan's
    sections (the IEEE-C4 / C5 rule scoring applies)."""
    out: dict[str, Any] = {}
    kinds = ATTACK_CRITERIA.get(task, ())
    t = v.mapping(it.get("targeted"), f"{p}.targeted", required=False)
    v.unknown(t, f"{p}.targeted", {"label"})
    if t:
        label = t.get("label")
        if isinstance(label, bool) or not isinstance(label, int) or label < 0:
            v.bad(f"{p}.targeted.label", f"must be a class id >= 0, got {_short(label)}")
        elif task not in TARGETED_DEFAULT:
            v.bad(f"{p}.targeted", f"a {task} target has no targeted criterion (IEEE-C5 "
                  "defines none); drop it")
        else:
            out["target_label"] = int(label)
    c = v.mapping(it.get("criterion"), f"{p}.criterion", required=False)
    v.unknown(c, f"{p}.criterion", {"kind", "threshold", "k"})
    kind = v.string(c, "kind", f"{p}.criterion", choices=kinds) if "kind" in c else ""
    if not kind:
        kind = TARGETED_DEFAULT.get(task, "") if "target_label" in out else kinds[0]
    if kind in TARGETED_CRITERIA and "target_label" not in out and not t:
        v.bad(f"{p}.targeted", f"criterion {kind} needs the target class: targeted: {{label: N}}")
    if kind not in TARGETED_CRITERIA and "target_label" in out:
        v.bad(f"{p}.criterion.kind", f"{kind} is untargeted; drop targeted or choose a "
              "targeted kind")
    if "threshold" in c:
        th = c["threshold"]
        if isinstance(th, bool) or not isinstance(th, int | float) or not 0.0 <= th <= 1.0:
            v.bad(f"{p}.criterion.threshold", f"must be a probability in [0, 1], got {_short(th)}")
        else:
            out["threshold"] = float(th)
    if "k" in c:
        out["k"] = v.integer(c, "k", f"{p}.criterion", default=5, lo=1, hi=MAX_RANK)
    out["kind"] = kind
    if spec is not None:
        if kind in TARGETED_CRITERIA and not spec.targeted:
            v.bad(f"{p}.targeted", f"{spec.id} has no targeted variant")
        if kind not in TARGETED_CRITERIA and not spec.untargeted:
            v.bad(f"{p}.targeted", f"{spec.id} is targeted only: give targeted: {{label: N}}")
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
    return out


def _attacks(v: _V, doc: Mapping[str, Any], cat: Catalogue, task: Task = Task.CLASSIFICATION,
             det: Mapping[str, Any] | None = None,
             seg: Mapping[str, Any] | None = None, *, benchmark: bool = False) -> list[AttackTest]:
    out: list[AttackTest] = []
    seen: set[str] = set()
    items = v.items(doc, "attacks")
    if len(items) > MAX_PLAN_ATTACKS:
        v.bad("attacks", f"{len(items):,} attacks; at most {MAX_PLAN_ATTACKS} in one plan")
        items = items[:MAX_PLAN_ATTACKS]
    for i, item in enumerate(items):
        p = f"attacks[{i}]"
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
            v.bad(f"{p}.id", f"unknown attack {_short(aid)}; known: {', '.join(cat.attacks)}")
        elif spec is not None:
            try:
                params = validate_params(spec, params, f"{p}.params")
            except InvalidArgument as exc:
                v.problems.extend(exc.violations)
            prop = params.get("property") if isinstance(params, Mapping) else None
            if aid == "pertknob" and isinstance(prop, str) and (
                    prop not in cat.perturbations or cat.perturbations[prop].kind != "property"):
                v.bad(f"{p}.params.property", f"{_short(prop)} is not a PER-1 safety property; "
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
        crit = _attack_criterion(v, it, p, task, spec, det or {}, seg or {})
        names = _surrogate_names(v, it.get("surrogate"), f"{p}.surrogate")
        if spec is not None and spec.needs_surrogate:
            _check_surrogate_tasks(v, names, it.get("surrogate"), f"{p}.surrogate", task, doc)
        if len(names) > 1 and spec is not None and not spec.needs_surrogate:
            v.bad(f"{p}.surrogate", f"{aid} is not a transfer attack: it takes one surrogate, "
                  "not an ensemble")
        if label in seen:
            v.bad(f"{p}.name", f"attack name {_short(label)} is used twice; give each a distinct name")
        seen.add(label)
        select = _select_budget(v, it.get("select_budget"), f"{p}.select_budget", spec,
                                params)
        out.append(AttackTest(id=aid, name=label, params=dict(params), select_budget=select,
                              surrogate=names[0] if names else "", ensemble=tuple(names[1:]),
                              limit=v.integer(it, "limit", p, default=0, lo=0,
                                                    hi=MAX_DATASET_IMAGES),
                              criterion=crit))
    return out


def _select_budget(v: _V, raw: Any, p: str, spec: Any, params: Any) -> dict[str, Any]:
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
                  f"{lo}, {hi}], got {_short(x)}")
            continue
        out[key] = kind(x)
    return out


def _check_surrogate_tasks(v: _V, names: list[str], raw: Any, p: str, task: Task,
                           doc: Mapping[str, Any]) -> None:
    """A transfer attack is crafted on surrogates of the target's task (IEEE-A7 on IEEE-C4 /
    C5 targets: a detector's or segmenter's ``task_loss``): each name whose task is known --
    a built-in (``BUILTIN_SURROGATE_TASKS``; the others classify) or one of the plan's own
    surrogates (its ``task``, classification by default) -- must match; an operator's
    surrogate is checked when it runs."""
    raw_own = doc.get("surrogates")
    own = {str(d["name"]): Task(d["task"]) if d.get("task") in TASKS else Task.CLASSIFICATION
           for d in (raw_own if isinstance(raw_own, list) else [])
           if isinstance(d, Mapping) and isinstance(d.get("name"), str)}
    for j, name in enumerate(names):
        if name in BUILTIN_SURROGATE_TASKS:
            known = BUILTIN_SURROGATE_TASKS[name]
        elif name in own:
            known = own[name]
        elif name in BUILTIN_SURROGATE_NAMES:
            known = Task.CLASSIFICATION
        else:
            continue
        if known != task:
            fitting = [n for n in BUILTIN_SURROGATE_NAMES
                       if BUILTIN_SURROGATE_TASKS.get(n, Task.CLASSIFICATION) == task]
            where = f"{p}[{j}]" if isinstance(raw, list) else p
            v.bad(where, f"{_short(name, 60)} is a {known} surrogate; a transfer attack on a "
                  f"{task} target is crafted on a {task} surrogate (built-in: "
                  f"{', '.join(fitting) or 'none'}; or one of the plan's surrogates with "
                  f"task: {task})")


def _surrogate_names(v: _V, raw: Any, p: str) -> list[str]:
    """An attack's ``surrogate``: a name, or a list of names (an ensemble, the first the
    primary: IEEE-A7)."""
    if raw is None:
        return []
    items = raw if isinstance(raw, list) else [raw]
    if isinstance(raw, list) and not 1 <= len(raw) <= 1 + MAX_ENSEMBLE:
        v.bad(p, f"an ensemble lists 1 to {1 + MAX_ENSEMBLE} surrogates, got {len(raw)}")
        return []
    out: list[str] = []
    for j, x in enumerate(items):
        where = f"{p}[{j}]" if isinstance(raw, list) else p
        if not isinstance(x, str) or not x.strip() or len(x) > MAX_PLAN_STRING_CHARS:
            v.bad(where, f"must be a surrogate's name, got {_short(x)}")
        elif x in out:
            v.bad(where, f"'{_short(x, 60)}' is already in the ensemble")
        else:
            out.append(x)
    return out


def _surrogates(v: _V, doc: Mapping[str, Any]) -> list[SurrogateDefinition]:
    """The tenant's own surrogates (IEEE-A7, IEEE-P6; schema: services/common/surrogates.py):
    uploaded models by id, never a path on the server."""
    raw = doc.get("surrogates")
    if raw is None:
        return []
    if not isinstance(raw, list):
        v.bad("surrogates", "must be a list of surrogate definitions")
        return []
    if len(raw) > MAX_SURROGATES:
        v.bad("surrogates", f"{len(raw)} surrogates; at most {MAX_SURROGATES}")
        raw = raw[:MAX_SURROGATES]
    out: list[SurrogateDefinition] = []
    for k, item in enumerate(raw):
        defn, problems = parse_definition(item, f"surrogates[{k}]")
        v.problems.extend(problems)
        if defn is None:
            continue
        if any(d.name == defn.name for d in out):
            v.bad(f"surrogates[{k}].name", f"'{defn.name}' is defined twice")
            continue
        out.append(defn)
    return out


def surrogate_specs(plan: Plan, target_labels: list[str] | tuple[str, ...]
                    ) -> dict[str, SurrogateSpec]:
    """The plan's surrogates resolved against the target's labels (IEEE-P6), by name."""
    return {d.name: spec_of(d, target_labels, f"surrogates[{k}]")
            for k, d in enumerate(plan.surrogates)}


def check_surrogate_labels(plan: Plan, target_labels: list[str] | tuple[str, ...],
                           images: Any, n_images: int) -> None:
    """Every image a transfer attack covers must have a true label that each of its tenant
    surrogates maps a class to (IEEE-P6), or the surrogate has no loss to follow."""
    specs = surrogate_specs(plan, target_labels)
    index = {d.name: k for k, d in enumerate(plan.surrogates)}
    v = _V()
    for at in plan.attacks:
        n = min(n_images, at.limit) if at.limit else n_images
        for name in (at.surrogate, *at.ensemble):
            if name not in specs:
                continue
            mapped = specs[name].mapped_targets()
            for image_id, _, labels in list(images)[:n]:
                if labels and int(labels[0]) not in mapped:
                    lab = int(labels[0])
                    shown = target_labels[lab] if 0 <= lab < len(target_labels) else lab
                    v.bad(f"surrogates[{index[name]}].label_map", f"image '{image_id}' has "
                          f"target label {lab} ({shown}), which no class of surrogate "
                          f"'{name}' maps to")
                    break
    if v.problems:
        raise InvalidArgument.from_violations(v.problems[:100])


def _degradation(v: _V, doc: Mapping[str, Any], cat: Catalogue) -> list[DegradationTest]:
    out: list[DegradationTest] = []
    seen: set[str] = set()
    for i, item in enumerate(v.items(doc, "degradation")):
        p = f"degradation[{i}]"
        it = v.mapping({"id": item} if isinstance(item, str) else item, p)
        v.unknown(it, p, {"id", "levels", "surrogate"})
        did = v.string(it, "id", p, required=True)
        spec = cat.perturbations.get(did) if did else None
        if did and (spec is None or spec.kind != "degradation"):
            v.bad(f"{p}.id", f"{_short(did)} is not an incremental degradation operator (DEG-1); "
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


def _task_limits(v: _V, task: Task, corruptions: list[CorruptionTest], attacks: list[AttackTest],
                 degradation: list[DegradationTest], cat: Catalogue) -> None:
    """What detection and segmentation plans cannot do (query attacks can: ``_attacks``
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


def _baseline(v: _V, doc: Mapping[str, Any], members: list[Member]) -> str:
    """CAN-10 fast mode: ``baseline: {evaluation: ID}`` with one target and its surrogate."""
    if "baseline" not in doc:
        return ""
    b = v.mapping(doc.get("baseline"), "baseline")
    v.unknown(b, "baseline", {"evaluation"})
    eid = v.string(b, "evaluation", "baseline", required=True)
    if eid and not _EVALUATION_ID.fullmatch(eid):
        v.bad("baseline.evaluation", "not an evaluation id (letters, digits, '-', '_', '.')")
    if len(members) != 1 or not members[0].surrogate:
        v.bad("baseline", "fast mode ranks one new model: list exactly one entry under "
              "targets, with its surrogate")
    return eid


def validate_plan(doc: Mapping[str, Any], catalogue: Catalogue) -> Plan:
    """Check a plan document against the catalogue; raise one InvalidArgument listing every
    problem."""
    v = _V()
    v.unknown(doc, "", {"name", "seed", "roles", "target", "dataset", "correctness",
                        "corruptions", "attacks", "execution", "description", "degradation",
                        "detection", "segmentation", "surrogates", "acceptance", "canary",
                        "targets", "baseline"})
    name = v.string(doc, "name", "", required=True)
    seed = v.integer(doc, "seed", "", default=0, lo=0, hi=MAX_SEED)
    roles = _roles(v, doc)
    members: list[Member] = []
    if "targets" in doc:
        target, members = _members(v, doc)
    else:
        target = _target(v, doc)
    baseline = _baseline(v, doc, members)
    dataset = _dataset(v, doc, target.task)
    correctness, det, seg = _criteria(v, doc, target.task)
    corruptions = _corruptions(v, doc, catalogue)
    attacks = _attacks(v, doc, catalogue, target.task, det, seg,
                       benchmark=len(members) > 1 or bool(baseline))
    if len(members) > 1 or "baseline" in doc:
        for i, a in enumerate(attacks):
            if a.select_budget:
                v.bad(f"attacks[{i}].select_budget", "budget selection (CAN-6) runs on one "
                      "target; not in a multi-target plan (every model must see the same "
                      "examples)")
    for i, m in enumerate(members):     # a model's white-box twin does the target's task
        if m.surrogate:
            _check_surrogate_tasks(v, [m.surrogate], m.surrogate, f"targets[{i}].surrogate",
                                   target.task, doc)
    surrogates = _surrogates(v, doc)
    attack_names = {a.name for a in attacks}
    for a in attacks:       # multi-target plans: a transfer attack per model surrogate (CAN-7)
        entry = catalogue.attacks.get(a.id)
        if members and entry is not None and entry.needs_surrogate and not a.surrogate:
            expanded = {crafted_on(a.name, m.surrogate) for m in members if m.surrogate}
            for name in sorted(expanded & attack_names):
                v.bad("attacks", f"attack name {_short(name)} is also the name of "
                      f"{a.name} crafted on a model's surrogate; rename it")
            attack_names |= expanded
    acceptance, problems = parse_acceptance(
        doc.get("acceptance"), corruptions={c.id for c in corruptions}, attacks=attack_names)
    v.problems.extend(problems)
    canary = doc.get("canary", False)
    if not isinstance(canary, bool):
        v.bad("canary", f"must be true or false, got {_short(canary)}")
        canary = False
    degradation = _degradation(v, doc, catalogue)
    e = v.mapping(doc.get("execution"), "execution", required=False)
    v.unknown(e, "execution", {"batch_size"})
    batch = v.integer(e, "batch_size", "execution", default=64, lo=1, hi=MAX_BATCH_SIZE)
    _task_limits(v, target.task, corruptions, attacks, degradation, catalogue)
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
                acceptance=acceptance, canary=canary, members=tuple(members), baseline=baseline)


def check_against_target(plan: Plan, target: TargetDescription, catalogue: Catalogue) -> None:
    """What only the target's description can tell (GetTargetInfo): its task, and for each
    attack whether the target gives the signal it needs (IEEE-A8: a score-based attack needs
    scores; a label-only target takes decision-based attacks only), whether its criterion can
    be judged (criteria on class probabilities need scores) and whether a targeted class is
    one of the target's labels. One InvalidArgument listing every problem by field."""
    v = _V()
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
