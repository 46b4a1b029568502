"""Test plans (IEEE-P3): parsing and validation with precise, field-named errors.

A plan is YAML or JSON. Every problem found is reported at once, each naming its field
(e.g. ``corruptions[2].severities[0]: must be an integer in 1..5, got 0``). Domain code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from fortis.services.common.errors import FieldViolation, InvalidArgument
from fortis.services.perturbation.catalogue import ATTACKS, validate_params
from fortis.services.perturbation.corruptions import CORRUPTIONS
from fortis.services.perturbation.registry import PERTURBATIONS
from fortis.services.perturbation.registry import validate_params as validate_perturbation_params

DATASETS = ("fashion-mnist", "imagenet-photos", "manifest")
TASKS = ("classification", "detection", "segmentation")
CORRECTNESS_MODES = ("top1", "topk", "threshold")
MAX_PLAN_BYTES = 1_000_000


@dataclass(frozen=True, kw_only=True)
class Role:
    name: str = ""
    organisation: str = ""


@dataclass(frozen=True, kw_only=True)
class TargetRef:
    name: str
    task: str = "classification"
    endpoint: str = ""
    credentials_ref: str = ""


@dataclass(frozen=True, kw_only=True)
class DatasetRef:
    source: str
    split: str = "test"
    limit: int = 100
    offset: int = 0
    label_map: Mapping[int, int] = field(default_factory=dict)
    path: str = ""          # source "manifest": a JSON-lines file on the evaluation service's disk


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
    limit: int = 0          # attack only the first N images (0 = all)


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
    #: IEEE-C4 / IEEE-C5 service-type parameters (IEEE-P3), as plain mappings validated by
    #: fortis.services.scoring.correctness (DetectionCriterion / SegmentationCriterion).
    detection: Mapping[str, Any] = field(default_factory=dict)
    segmentation: Mapping[str, Any] = field(default_factory=dict)
    raw: Mapping[str, Any]


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
                self.bad(where, f"unknown field; allowed: {', '.join(sorted(allowed))}")

    def string(self, doc: Mapping[str, Any], key: str, path: str, *, required: bool = False,
               default: str = "", choices: tuple[str, ...] | None = None) -> str:
        p = f"{path}.{key}" if path else key
        if key not in doc or doc[key] is None:
            if required:
                self.bad(p, "required")
            return default
        v = doc[key]
        if not isinstance(v, str) or (required and not v.strip()):
            self.bad(p, f"must be a non-empty string, got {v!r}")
            return default
        if choices and v not in choices:
            self.bad(p, f"must be one of {', '.join(choices)}, got {v!r}")
            return default
        return v

    def integer(self, doc: Mapping[str, Any], key: str, path: str, *, default: int,
                lo: int, hi: int) -> int:
        p = f"{path}.{key}" if path else key
        if key not in doc:
            return default
        v = doc[key]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            self.bad(p, f"must be an integer in {lo}..{hi}, got {v!r}")
            return default
        return v


def parse_plan_text(text: str, fmt: str = "") -> dict[str, Any]:
    """YAML or JSON text -> document (``fmt``: "yaml", "json" or "" to detect)."""
    if not text or not text.strip():
        raise InvalidArgument("plan", "the plan is empty")
    if len(text.encode()) > MAX_PLAN_BYTES:
        raise InvalidArgument("plan", f"the plan is larger than {MAX_PLAN_BYTES} bytes")
    fmt = fmt or ("json" if text.lstrip().startswith("{") else "yaml")
    try:
        doc = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        if isinstance(exc, json.JSONDecodeError):
            where = f" at line {exc.lineno}, column {exc.colno}"
        raise InvalidArgument("plan", f"not valid {fmt.upper()}{where}: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument("plan", f"the plan must be a mapping at the top level, got {type(doc).__name__}")
    return doc


def validate_plan(doc: Mapping[str, Any]) -> Plan:
    """Check a plan document; raise one InvalidArgument listing every problem."""
    v = _V()
    v.unknown(doc, "", {"name", "seed", "roles", "target", "dataset", "correctness",
                        "corruptions", "attacks", "execution", "description", "degradation",
                        "detection", "segmentation"})
    name = v.string(doc, "name", "", required=True)
    seed = v.integer(doc, "seed", "", default=0, lo=0, hi=2**63 - 1)

    roles = v.mapping(doc.get("roles"), "roles", required=False)
    v.unknown(roles, "roles", {"requester", "tester", "provider"})
    role_objs = {}
    for r in ("requester", "tester", "provider"):
        rd = v.mapping(roles.get(r), f"roles.{r}", required=False)
        v.unknown(rd, f"roles.{r}", {"name", "organisation"})
        role_objs[r] = Role(name=v.string(rd, "name", f"roles.{r}"),
                            organisation=v.string(rd, "organisation", f"roles.{r}"))

    t = v.mapping(doc.get("target"), "target")
    v.unknown(t, "target", {"name", "task", "endpoint", "credentials_ref"})
    target = TargetRef(name=v.string(t, "name", "target", required=True),
                       task=v.string(t, "task", "target", default="classification", choices=TASKS),
                       endpoint=v.string(t, "endpoint", "target"),
                       credentials_ref=v.string(t, "credentials_ref", "target"))

    d = v.mapping(doc.get("dataset"), "dataset")
    v.unknown(d, "dataset", {"source", "split", "limit", "offset", "label_map", "path"})
    label_map: dict[int, int] = {}
    lm = d.get("label_map") or {}
    if not isinstance(lm, Mapping):
        v.bad("dataset.label_map", "must be a mapping of dataset label -> service label")
    else:
        for k, val in lm.items():
            try:
                label_map[int(k)] = int(val)
            except (TypeError, ValueError):
                v.bad(f"dataset.label_map.{k}", f"labels must be integers, got {k!r}: {val!r}")
    dataset = DatasetRef(source=v.string(d, "source", "dataset", required=True, choices=DATASETS),
                         split=v.string(d, "split", "dataset", default="test", choices=("test", "train")),
                         limit=v.integer(d, "limit", "dataset", default=100, lo=1, hi=100_000),
                         offset=v.integer(d, "offset", "dataset", default=0, lo=0, hi=10_000_000),
                         label_map=label_map, path=v.string(d, "path", "dataset"))
    if dataset.source == "manifest" and not dataset.path:
        v.bad("dataset.path", "source 'manifest' needs the path of a JSON-lines manifest")
    task = target.task
    det_d: dict[str, Any] = {}
    seg_d: dict[str, Any] = {}
    if task == "detection":
        det_d = dict(v.mapping(doc.get("detection"), "detection", required=False))
        try:
            from fortis.services.scoring.correctness import DetectionCriterion
            DetectionCriterion.from_dict(det_d)
        except InvalidArgument as exc:
            v.problems += exc.violations
    elif "detection" in doc:
        v.bad("detection", f"only for detection targets; this plan's target.task is {task}")
    if task == "segmentation":
        seg_d = dict(v.mapping(doc.get("segmentation"), "segmentation"))
        try:
            from fortis.services.scoring.correctness import SegmentationCriterion
            SegmentationCriterion.from_dict(seg_d)
        except InvalidArgument as exc:
            v.problems += exc.violations
    elif "segmentation" in doc:
        v.bad("segmentation", f"only for segmentation targets; this plan's target.task is {task}")
    if task != "classification" and dataset.source != "manifest":
        v.bad("dataset.source", f"a {task} plan needs ground truth: use source 'manifest' "
              "(boxes or masks per image)")

    c = v.mapping(doc.get("correctness"), "correctness", required=False)
    v.unknown(c, "correctness", {"mode", "k", "threshold"})
    correctness = {"mode": v.string(c, "mode", "correctness", default="top1", choices=CORRECTNESS_MODES),
                   "k": v.integer(c, "k", "correctness", default=5, lo=1, hi=1000),
                   "threshold": c.get("threshold", 0.5)}
    th = correctness["threshold"]
    if isinstance(th, bool) or not isinstance(th, int | float) or not 0 <= th < 1:
        v.bad("correctness.threshold", f"must be a number in [0, 1), got {th!r}")

    corruptions: list[CorruptionTest] = []
    cl = doc.get("corruptions") or []
    if not isinstance(cl, list):
        v.bad("corruptions", "must be a list")
        cl = []
    seen: set[str] = set()
    for i, item in enumerate(cl):
        p = f"corruptions[{i}]"
        if isinstance(item, str):
            item = {"id": item}
        it = v.mapping(item, p)
        v.unknown(it, p, {"id", "severities", "params"})
        cid = v.string(it, "id", p, required=True)
        spec = PERTURBATIONS.get(cid) if cid else None
        if cid and spec is None:
            v.bad(f"{p}.id", f"unknown corruption '{cid}'; known: {', '.join(CORRUPTIONS)}, "
                  "or a style (see `fortis perturbations`)")
        elif spec is not None and (spec.level_kind != "severity" or spec.needs_model):
            v.bad(f"{p}.id", f"'{cid}' is a {spec.kind} with {spec.level_kind}s, not severities "
                  "1..5; only corruptions and styles go under corruptions")
            spec = None
        cparams = it.get("params") or {}
        if not isinstance(cparams, dict):
            v.bad(f"{p}.params", "must be a mapping")
            cparams = {}
        elif spec is not None:
            try:
                cparams = validate_perturbation_params(spec, cparams, f"{p}.params")
            except InvalidArgument as exc:
                for fv in exc.violations:
                    v.bad(fv.field, fv.description)
        if cid in seen:
            v.bad(f"{p}.id", f"corruption '{cid}' is listed twice")
        seen.add(cid)
        sev = it.get("severities", [1, 2, 3, 4, 5])
        if not isinstance(sev, list) or not sev:
            v.bad(f"{p}.severities", "must be a non-empty list of integers in 1..5")
            sev = []
        for j, s in enumerate(sev):
            if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= 5:
                v.bad(f"{p}.severities[{j}]", f"must be an integer in 1..5, got {s!r}")
        if len(set(sev)) != len(sev):
            v.bad(f"{p}.severities", "severities repeat")
        corruptions.append(CorruptionTest(id=cid, severities=tuple(sorted(
            s for s in sev if isinstance(s, int) and not isinstance(s, bool))), params=cparams))

    attacks: list[AttackTest] = []
    al = doc.get("attacks") or []
    if not isinstance(al, list):
        v.bad("attacks", "must be a list")
        al = []
    seen = set()
    for i, item in enumerate(al):
        p = f"attacks[{i}]"
        it = v.mapping(item, p)
        v.unknown(it, p, {"id", "params", "surrogate", "limit", "name"})
        aid = v.string(it, "id", p, required=True)
        params = v.mapping(it.get("params", {}), f"{p}.params", required=False)
        spec = ATTACKS.get(aid)
        label = v.string(it, "name", p, default=aid)
        if aid and spec is None:
            v.bad(f"{p}.id", f"unknown attack '{aid}'; known: {', '.join(ATTACKS)}")
        elif spec is not None:
            try:
                params = validate_params(spec, params, f"{p}.params")
            except InvalidArgument as exc:
                v.problems += exc.violations
            prop = params.get("property") if isinstance(params, Mapping) else None
            if aid == "pertknob" and isinstance(prop, str) and (
                    prop not in PERTURBATIONS or PERTURBATIONS[prop].kind != "property"):
                v.bad(f"{p}.params.property", f"'{prop}' is not a PER-1 safety property; see "
                      "`fortis perturbations --kind property`")
            if spec.kind == "transfer" and not it.get("surrogate"):
                v.bad(f"{p}.surrogate", f"{aid} is a transfer attack: name the surrogate model")
        if label in seen:
            v.bad(f"{p}.name", f"attack name '{label}' is used twice; give each a distinct name")
        seen.add(label)
        attacks.append(AttackTest(id=aid, name=label, params=dict(params),
                                  surrogate=v.string(it, "surrogate", p),
                                  limit=v.integer(it, "limit", p, default=0, lo=0, hi=100_000)))

    degradation: list[DegradationTest] = []
    dl = doc.get("degradation") or []
    if not isinstance(dl, list):
        v.bad("degradation", "must be a list")
        dl = []
    seen = set()
    for i, item in enumerate(dl):
        p = f"degradation[{i}]"
        if isinstance(item, str):
            item = {"id": item}
        it = v.mapping(item, p)
        v.unknown(it, p, {"id", "levels", "surrogate"})
        did = v.string(it, "id", p, required=True)
        dspec = PERTURBATIONS.get(did) if did else None
        if did and (dspec is None or dspec.kind != "degradation"):
            v.bad(f"{p}.id", f"'{did}' is not an incremental degradation operator (DEG-1); "
                  "see `fortis perturbations --kind degradation`")
            dspec = None
        if did in seen:
            v.bad(f"{p}.id", f"operator '{did}' is listed twice")
        seen.add(did)
        lv = it.get("levels", list(range(1, 31)))
        if not isinstance(lv, list) or not lv:
            v.bad(f"{p}.levels", "must be a non-empty list of integers in 1..30")
            lv = []
        for j, x in enumerate(lv):
            if isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= 30:
                v.bad(f"{p}.levels[{j}]", f"must be an integer in 1..30, got {x!r}")
        if len(set(map(str, lv))) != len(lv):
            v.bad(f"{p}.levels", "levels repeat")
        sur = v.string(it, "surrogate", p)
        if dspec is not None and dspec.needs_model and not sur:
            v.bad(f"{p}.surrogate", f"{did} is white-box: name the surrogate model whose gradient it follows")
        if dspec is not None and not dspec.needs_model and sur:
            v.bad(f"{p}.surrogate", f"{did} uses no model")
        degradation.append(DegradationTest(id=did, surrogate=sur, levels=tuple(sorted(
            x for x in lv if isinstance(x, int) and not isinstance(x, bool)))))

    e = v.mapping(doc.get("execution"), "execution", required=False)
    v.unknown(e, "execution", {"batch_size"})
    batch = v.integer(e, "batch_size", "execution", default=64, lo=1, hi=1024)

    if task != "classification":
        for i in range(len(attacks)):
            v.bad(f"attacks[{i}].id", f"attacks judge class labels; not available for a {task} "
                  "target yet")
        for i in range(len(degradation)):
            v.bad(f"degradation[{i}].id", f"degradation profiles follow class labels; not "
                  f"available for a {task} target")
        for i, ct in enumerate(corruptions):
            cs = PERTURBATIONS.get(ct.id)
            if cs is not None and cs.family == "geometric":
                v.bad(f"corruptions[{i}].id", f"{ct.id} moves the objects but not the ground "
                      f"truth; geometric corruptions are for classification plans only")
    if not corruptions and not attacks and not degradation:
        v.bad("corruptions", "the plan tests nothing: list at least one corruption, attack or "
              "degradation operator")
    if v.problems:
        raise InvalidArgument.from_violations(v.problems)
    return Plan(name=name, seed=seed, requester=role_objs["requester"], tester=role_objs["tester"],
                provider=role_objs["provider"], target=target, dataset=dataset,
                correctness=correctness, corruptions=tuple(corruptions), attacks=tuple(attacks),
                batch_size=batch, raw=dict(doc), degradation=tuple(degradation),
                detection=det_d, segmentation=seg_d)


def load_plan(text: str, fmt: str = "") -> Plan:
    return validate_plan(parse_plan_text(text, fmt))
