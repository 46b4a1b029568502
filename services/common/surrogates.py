"""Tenant surrogate definitions (IEEE-A7 transfer attacks, IEEE-P6 label mapping): the one
schema the plan's ``surrogates`` section, the operator's ``--surrogate-dir`` manifests and
RunAttackRequest.surrogate_models share, with field-named checks. Pure shared code.

A definition names an uploaded model (TorchScript or ONNX), the input it takes, the
normalisation Fortis applies to images x in [0, 1] before it ((x - mean) / std), its own class
names, and ``label_map``: surrogate class -> target class, each side by index or by name;
several surrogate classes may map to one target class. Without ``label_map`` every surrogate
class maps to the target class of the same name. :func:`resolve_label_map` turns it into index
pairs once the target's labels are known (the evaluation service knows them from
GetTargetInfo); the perturbation service receives the resolved pairs
(:class:`SurrogateSpec`) and never needs the target's names.

A surrogate of a detector or a segmenter (``task: detection | segmentation``; IEEE-A7 on
IEEE-C4 / C5 targets) also declares where its outputs are (``outputs``, :class:`SurrogateOutputs`:
positions in the model's output tuple), because no output convention is shared by detectors
or segmenters::

    task: detection                       # boxes N x K x 4 xyxy, scores N x K,
    outputs:                              # and labels N x K or class logits N x K x C
      boxes: {output: 0, units: pixels}   # pixels of the declared input, or normalised
      scores: {output: 1, kind: probability}          # or logit
      labels: {output: 2}                 # or class_logits: {output: 2}; neither: one class

    task: segmentation
    outputs:
      mask: {output: 0, kind: class_logits}   # N x C x h x w; or probability / logit of the
                                              # foreground, N x 1 x h x w (labels: 2 names)

A bare number is the output alone (``boxes: 0``). The declared positions are checked here;
the shapes behind them when the model is loaded (the perturbation service runs it on a
blank image of the declared input size).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from fortis.core.task import TASKS, Task
from fortis.services.common.blob_checks import is_blob_id
from fortis.services.common.errors import FieldViolation, InvalidArgument
from fortis.services.common.limits import (
    MAX_CLASS_LABEL,
    MAX_SURROGATE_CLASSES,
    MAX_SURROGATE_LABEL_CHARS,
    MAX_SURROGATE_NORM,
    MAX_SURROGATE_OUTPUT,
    MAX_SURROGATE_SIDE,
    MIN_SURROGATE_STD,
)

__all__ = ["BUILTIN_SURROGATE_NAMES", "BUILTIN_SURROGATE_TASKS", "FORMATS", "MASK_KINDS",
           "SURROGATE_TASKS", "SurrogateDefinition", "SurrogateOutputs", "SurrogateSpec",
           "check_name", "check_outputs", "parse_definition", "resolve_label_map", "spec_of"]

#: The built-in models' names (fortis.adapters.builtin.BUILTIN_MODELS; a test keeps the two
#: equal): a tenant's surrogate may not take one.
BUILTIN_SURROGATE_NAMES: Final = ("fmnist-cnn", "fmnist-surrogate", "fmnist-mlp",
                                  "fmnist-cnn-at", "mobilenet-v2", "efficientnet-lite0",
                                  "mtcnn-surrogate", "u2netp-surrogate")
#: The task of the built-in models that are not classifiers (surrogates of a detector or a
#: segmenter, with a ``task_loss``: fortis.adapters.vision_targets.surrogates); every other
#: built-in and every tenant surrogate is a classifier. A transfer attack is crafted on a
#: surrogate of the target's task (the plan validator checks it).
BUILTIN_SURROGATE_TASKS: Final[Mapping[str, Task]] = {"mtcnn-surrogate": Task.DETECTION,
                                                      "u2netp-surrogate": Task.SEGMENTATION}
#: Model file formats ("" = detected from the content: a zip archive is TorchScript).
FORMATS: Final = ("torchscript", "onnx")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_KEYS: Final = frozenset({"name", "model", "format", "input", "mean", "std", "labels",
                          "label_map", "task", "outputs"})
#: What a surrogate does (a transfer attack on a target is crafted on one of its task).
SURROGATE_TASKS: Final = TASKS
#: What a segmenter surrogate's mask output holds: per-pixel class logits (N x C x h x w), or
#: the foreground's probability or logit (N x 1 x h x w; its labels: background, foreground).
MASK_KINDS: Final = ("class_logits", "probability", "logit")
#: The outputs each task declares.
_OUTPUT_KEYS: Final[Mapping[Task, tuple[str, ...]]] = {
    Task.DETECTION: ("boxes", "scores", "labels", "class_logits"), Task.SEGMENTATION: ("mask",)}


@dataclass(frozen=True, kw_only=True)
class SurrogateOutputs:
    """Where a detector's or segmenter's outputs are: positions in the model's output tuple
    (None: not given) and how the values read (module doc)."""

    boxes: int | None = None
    #: boxes are fractions of the input's width and height (else pixels of the input)
    boxes_normalised: bool = False
    scores: int | None = None
    #: scores are logits (else probabilities)
    scores_are_logits: bool = False
    labels: int | None = None
    class_logits: int | None = None
    mask: int | None = None
    mask_kind: str = ""

    def positions(self) -> dict[str, int]:
        """The declared outputs by name."""
        return {k: int(v) for k in ("boxes", "scores", "labels", "class_logits", "mask")
                if (v := getattr(self, k)) is not None}

    def key(self) -> tuple[Any, ...]:
        return (self.boxes, self.boxes_normalised, self.scores, self.scores_are_logits,
                self.labels, self.class_logits, self.mask, self.mask_kind)


def check_outputs(task: str, outputs: SurrogateOutputs, n_labels: int, path: str,
                  bad: Any) -> None:
    """The outputs a surrogate of ``task`` with ``n_labels`` classes must declare, each
    problem naming ``path.outputs.<name>`` (or ``path.task`` / ``path.labels``)."""
    if task not in SURROGATE_TASKS:
        bad(FieldViolation(f"{path}.task", f"must be one of {', '.join(SURROGATE_TASKS)}, got "
                                           f"{_short(task)}"))
        return
    task = Task(task)                       # a request's spec carries the name, checked above
    pos = outputs.positions()
    where = f"{path}.outputs"
    if task == Task.CLASSIFICATION:
        if pos or outputs.mask_kind:
            bad(FieldViolation(where, "only for detection and segmentation surrogates: a "
                                      "classifier's one output is its logits"))
        return
    allowed = _OUTPUT_KEYS[task]
    for k in pos:
        if k not in allowed:
            bad(FieldViolation(f"{where}.{k}", f"not an output of a {task} surrogate "
                                               f"(it declares {', '.join(allowed)})"))
    for k, v in pos.items():
        if not 0 <= v <= MAX_SURROGATE_OUTPUT:
            bad(FieldViolation(f"{where}.{k}", f"output position must be an integer in "
                                               f"0..{MAX_SURROGATE_OUTPUT}, got {v}"))
    seen: dict[int, str] = {}
    for k, v in pos.items():
        if v in seen:
            bad(FieldViolation(f"{where}.{k}", f"output {v} is already the {seen[v]}"))
        seen.setdefault(v, k)
    if task == Task.DETECTION:
        for k in ("boxes", "scores"):
            if k not in pos:
                bad(FieldViolation(f"{where}.{k}", "required for a detection surrogate: "
                                                   "{output: N}"))
        if "labels" in pos and "class_logits" in pos:
            bad(FieldViolation(f"{where}.class_logits", "give labels or class_logits, not "
                                                        "both"))
        if "labels" not in pos and "class_logits" not in pos and n_labels != 1:
            bad(FieldViolation(where, f"a detector of {n_labels} classes says each box's "
                                      "class: declare labels (N x K) or class_logits "
                                      "(N x K x C); only a one-class detector needs neither"))
        if outputs.mask_kind:
            bad(FieldViolation(f"{where}.mask", "a detection surrogate has no mask output"))
        return
    if "mask" not in pos:
        bad(FieldViolation(f"{where}.mask", "required for a segmentation surrogate: {output: "
                                            "N, kind: class_logits | probability | logit}"))
    if outputs.mask_kind not in MASK_KINDS:
        bad(FieldViolation(f"{where}.mask.kind", f"must be one of {', '.join(MASK_KINDS)}"))
    elif outputs.mask_kind != "class_logits" and n_labels != 2:
        bad(FieldViolation(f"{path}.labels", f"a foreground {outputs.mask_kind} has two "
                                             "classes: name the background, then the "
                                             "foreground"))
    elif outputs.mask_kind == "class_logits" and n_labels < 2:
        bad(FieldViolation(f"{path}.labels", "per-pixel class logits need at least two "
                                             "classes"))


@dataclass(frozen=True, kw_only=True)
class SurrogateDefinition:
    """A surrogate as written (plan or manifest): ``label_map`` still by index or name."""

    name: str
    model: str                       # blob id (plans) or file name (operator manifests)
    format: str = ""                 # "", "torchscript" or "onnx"
    height: int = 0
    width: int = 0
    channels: int = 0
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    labels: tuple[str, ...] = ()
    #: (surrogate label, target label) as written: an int index or a name each; empty: by name.
    label_map: tuple[tuple[int | str, int | str], ...] = ()
    #: classification, detection or segmentation
    task: Task = Task.CLASSIFICATION
    #: a detector's or segmenter's outputs (empty for a classifier)
    outputs: SurrogateOutputs = field(default_factory=SurrogateOutputs)


@dataclass(frozen=True, kw_only=True)
class SurrogateSpec:
    """A surrogate ready to load: ``mapping`` holds (surrogate index, target index) pairs and
    ``target_classes`` the width of the mapped logits (RunAttackRequest.surrogate_models)."""

    name: str
    model: str
    format: str = ""
    height: int
    width: int
    channels: int
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    labels: tuple[str, ...]
    mapping: tuple[tuple[int, int], ...]
    target_classes: int
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: a request's task name as sent (:meth:`check` refuses one that is not a task)
    task: str = Task.CLASSIFICATION
    outputs: SurrogateOutputs = field(default_factory=SurrogateOutputs)

    def key(self) -> tuple[Any, ...]:
        """What identifies the loaded model (cache key, with the tenant and the blob)."""
        return (self.name, self.model, self.format, self.height, self.width, self.channels,
                self.mean, self.std, self.labels, self.mapping, self.target_classes,
                self.task, self.outputs.key())

    def mapped_targets(self) -> frozenset[int]:
        """The target classes some surrogate class maps to."""
        return frozenset(t for _, t in self.mapping)

    def check(self, path: str) -> None:
        """Every bound of the schema (a spec built from a request, not from a plan);
        InvalidArgument naming ``path.<field>``."""
        problems: list[FieldViolation] = []
        bad = problems.append
        check_name(self.name, f"{path}.name", bad)
        if self.format not in ("", *FORMATS):
            bad(FieldViolation(f"{path}.format", f"one of {', '.join(FORMATS)}"))
        for key, v, lo, hi in (("height", self.height, 1, MAX_SURROGATE_SIDE),
                               ("width", self.width, 1, MAX_SURROGATE_SIDE)):
            if not lo <= v <= hi:
                bad(FieldViolation(f"{path}.{key}", f"must be an integer in {lo}..{hi}, got {v}"))
        if self.channels not in (1, 3):
            bad(FieldViolation(f"{path}.channels", f"must be 1 or 3, got {self.channels}"))
        _check_norm(self.mean, self.std, self.channels, path, bad, mean_key="mean",
                    std_key="std")
        _check_labels(self.labels, f"{path}.labels", bad)
        if not 1 <= self.target_classes <= MAX_CLASS_LABEL:
            bad(FieldViolation(f"{path}.target_classes",
                               f"must be in 1..{MAX_CLASS_LABEL}, got {self.target_classes}"))
        if not self.mapping:
            bad(FieldViolation(f"{path}.label_map", "map at least one surrogate class to a "
                                                   "target class (IEEE-P6)"))
        for j, (s, t) in enumerate(self.mapping):
            if not 0 <= s < len(self.labels):
                bad(FieldViolation(f"{path}.label_map[{j}].surrogate_label",
                                   f"{s} is not one of the surrogate's {len(self.labels)} "
                                   "classes"))
            if not 0 <= t < self.target_classes:
                bad(FieldViolation(f"{path}.label_map[{j}].target_label",
                                   f"{t} is outside the target's {self.target_classes} classes"))
        if len({s for s, _ in self.mapping}) != len(self.mapping):
            bad(FieldViolation(f"{path}.label_map", "a surrogate class is mapped twice"))
        check_outputs(self.task, self.outputs, len(self.labels), path, bad)
        if problems:
            raise InvalidArgument.from_violations(problems[:100])


def check_name(name: str, field_name: str, bad: Any) -> None:
    """A surrogate's name: the charset, and not a built-in's."""
    if not isinstance(name, str) or not _NAME.match(name):
        bad(FieldViolation(field_name, "use 1 to 64 letters, digits, '-', '_' or '.', starting "
                                       "with a letter or digit"))
    elif name in BUILTIN_SURROGATE_NAMES:
        bad(FieldViolation(field_name, f"'{name}' is a built-in model's name; choose another"))


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(float(x))


def _check_norm(mean: Sequence[Any], std: Sequence[Any], channels: int, path: str, bad: Any,
                *, mean_key: str, std_key: str) -> None:
    for key, values, lo in ((mean_key, mean, -MAX_SURROGATE_NORM),
                            (std_key, std, MIN_SURROGATE_STD)):
        if len(values) not in (0, 1, channels):
            bad(FieldViolation(f"{path}.{key}", f"give one value per input channel "
                                                f"({channels}), or one for all"))
            continue
        for j, x in enumerate(values):
            if not _finite(x) or not lo <= float(x) <= MAX_SURROGATE_NORM:
                what = "a positive" if key == std_key else "a"
                bad(FieldViolation(f"{path}.{key}[{j}]", f"must be {what} finite number in "
                                   f"[{lo:g}, {MAX_SURROGATE_NORM:g}], got {_short(x)}"))


def _check_labels(labels: Sequence[Any], path: str, bad: Any) -> None:
    if not labels:
        bad(FieldViolation(path, "list the surrogate's class names in its output order"))
        return
    if len(labels) > MAX_SURROGATE_CLASSES:
        bad(FieldViolation(path, f"{len(labels):,} classes; at most {MAX_SURROGATE_CLASSES:,}"))
        return
    seen: set[str] = set()
    for j, x in enumerate(labels):
        if not isinstance(x, str) or not x.strip() or len(x) > MAX_SURROGATE_LABEL_CHARS:
            bad(FieldViolation(f"{path}[{j}]", f"must be a non-empty name of at most "
                                               f"{MAX_SURROGATE_LABEL_CHARS} characters"))
        elif x in seen:
            bad(FieldViolation(f"{path}[{j}]", f"'{_short(x, 60)}' is listed twice"))
        else:
            seen.add(x)


def _short(v: Any, limit: int = 80) -> str:
    r = repr(v)
    return r if len(r) <= limit else r[:limit] + "..."


def _int(doc: Mapping[str, Any], key: str, path: str, lo: int, hi: int, bad: Any) -> int:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        bad(FieldViolation(f"{path}.{key}", f"must be an integer in {lo}..{hi}, got {_short(v)}"))
        return 0
    return v


def parse_definition(doc: Any, path: str, *, model_kind: str = "blob") -> tuple[
        SurrogateDefinition | None, list[FieldViolation]]:
    """One surrogate definition (a plan entry or a manifest) -> (definition or None, problems),
    each problem naming ``path.<field>``. ``model_kind``: "blob" (an uploaded model's id,
    plans) or "file" (a file name in the operator's folder, manifests)."""
    problems: list[FieldViolation] = []
    bad = problems.append
    if not isinstance(doc, Mapping):
        return None, [FieldViolation(path, f"must be a mapping, got {type(doc).__name__}")]
    for k in doc:
        if k not in _KEYS:
            bad(FieldViolation(f"{path}.{str(k)[:60]}",
                               f"unknown field; allowed: {', '.join(sorted(_KEYS))}"))
    name = doc.get("name")
    if name is None:
        bad(FieldViolation(f"{path}.name", "required"))
    else:
        check_name(name, f"{path}.name", bad)
    model = doc.get("model")
    if model_kind == "blob":
        if not is_blob_id(model):
            bad(FieldViolation(f"{path}.model", "the id ('sha256:' and 64 lowercase hex "
                                                "digits) of a model uploaded by this tenant "
                                                "(fortis upload --kind model)"))
    elif not isinstance(model, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}",
                                                        model):
        bad(FieldViolation(f"{path}.model", "the name of a model file in the same folder "
                                            "(no path)"))
    fmt = doc.get("format", "") or ""
    if fmt not in ("", *FORMATS):
        bad(FieldViolation(f"{path}.format", f"must be one of {', '.join(FORMATS)}, got "
                                             f"{_short(fmt)}"))
        fmt = ""
    inp = doc.get("input")
    height = width = channels = 0
    if not isinstance(inp, Mapping):
        bad(FieldViolation(f"{path}.input", "required: {height: H, width: W, channels: 1 or 3}"))
    else:
        for k in inp:
            if k not in ("height", "width", "channels"):
                bad(FieldViolation(f"{path}.input.{str(k)[:60]}",
                                   "unknown field; allowed: channels, height, width"))
        height = _int(inp, "height", f"{path}.input", 1, MAX_SURROGATE_SIDE, bad)
        width = _int(inp, "width", f"{path}.input", 1, MAX_SURROGATE_SIDE, bad)
        channels = _int(inp, "channels", f"{path}.input", 1, 3, bad)
        if channels == 2:
            bad(FieldViolation(f"{path}.input.channels", "must be 1 (grey) or 3 (RGB)"))
    mean, std = doc.get("mean", []), doc.get("std", [])
    if not isinstance(mean, list):
        bad(FieldViolation(f"{path}.mean", "must be a list of numbers, one per channel"))
        mean = []
    if not isinstance(std, list):
        bad(FieldViolation(f"{path}.std", "must be a list of numbers, one per channel"))
        std = []
    if channels in (1, 3):
        _check_norm(mean, std, channels, path, bad, mean_key="mean", std_key="std")
    labels = doc.get("labels")
    if not isinstance(labels, list):
        bad(FieldViolation(f"{path}.labels", "required: the surrogate's class names in its "
                                             "output order"))
        labels = []
    else:
        _check_labels(labels, f"{path}.labels", bad)
    pairs: list[tuple[int | str, int | str]] = []
    lm = doc.get("label_map")
    if lm is not None:
        if not isinstance(lm, Mapping):
            bad(FieldViolation(f"{path}.label_map", "must be a mapping of surrogate label -> "
                                                    "target label (index or name)"))
        elif len(lm) > MAX_SURROGATE_CLASSES:
            bad(FieldViolation(f"{path}.label_map", f"{len(lm):,} entries; at most "
                                                    f"{MAX_SURROGATE_CLASSES:,}"))
        else:
            for k, val in lm.items():
                where = f"{path}.label_map.{str(k)[:60]}"
                for x in (k, val):
                    if isinstance(x, bool) or not isinstance(x, int | str) or \
                            (isinstance(x, int) and x < 0) or \
                            (isinstance(x, str) and not 0 < len(x) <= MAX_SURROGATE_LABEL_CHARS):
                        bad(FieldViolation(where, "labels are class indices (>= 0) or names"))
                        break
                else:
                    pairs.append((k, val))
    task_name = doc.get("task", Task.CLASSIFICATION)
    if task_name not in SURROGATE_TASKS:
        bad(FieldViolation(f"{path}.task", f"must be one of {', '.join(SURROGATE_TASKS)}, got "
                                           f"{_short(task_name)}"))
        task_name = Task.CLASSIFICATION
    task = Task(task_name)
    outputs = _parse_outputs(doc.get("outputs"), task, f"{path}.outputs", bad)
    if not problems:
        check_outputs(task, outputs, len(labels), path, bad)
    if problems:
        return None, problems
    return SurrogateDefinition(
        name=str(name), model=str(model), format=str(fmt), height=height, width=width,
        channels=channels, mean=tuple(float(x) for x in mean),
        std=tuple(float(x) for x in std), labels=tuple(str(x) for x in labels),
        label_map=tuple(pairs), task=task, outputs=outputs), []


#: Per declared output: its options and their choices (the first the default).
_OUTPUT_OPTIONS: Final[Mapping[str, tuple[str, tuple[str, ...]] | None]] = {
    "boxes": ("units", ("pixels", "normalised")), "scores": ("kind", ("probability", "logit")),
    "labels": None, "class_logits": None, "mask": ("kind", MASK_KINDS)}


def _parse_outputs(raw: Any, task: Task, where: str, bad: Any) -> SurrogateOutputs:
    """The plan's ``outputs`` section (module doc) as typed positions; the combinations are
    checked by :func:`check_outputs`."""
    if raw is None:
        return SurrogateOutputs()
    if not isinstance(raw, Mapping):
        bad(FieldViolation(where, "must be a mapping of output name -> {output: N, ...}"))
        return SurrogateOutputs()
    allowed = _OUTPUT_KEYS.get(task, ())
    got: dict[str, Any] = {}
    for k, entry in raw.items():
        p = f"{where}.{str(k)[:60]}"
        if k not in _OUTPUT_OPTIONS or (allowed and k not in allowed):
            bad(FieldViolation(p, f"unknown output; a {task} surrogate declares "
                                  f"{', '.join(allowed) or 'none (its one output is its logits)'}"))
            continue
        option = _OUTPUT_OPTIONS[k]
        item = {"output": entry} if isinstance(entry, int) and not isinstance(entry, bool) \
            else entry
        if not isinstance(item, Mapping):
            bad(FieldViolation(p, "must be the output's position, or {output: N"
                                  + (f", {option[0]}: {' | '.join(option[1])}" if option
                                     else "") + "}"))
            continue
        keys = {"output", *([option[0]] if option else [])}
        for extra in item:
            if extra not in keys:
                bad(FieldViolation(f"{p}.{str(extra)[:60]}", f"unknown field; allowed: "
                                                            f"{', '.join(sorted(keys))}"))
        pos = item.get("output")
        if isinstance(pos, bool) or not isinstance(pos, int) \
                or not 0 <= pos <= MAX_SURROGATE_OUTPUT:
            bad(FieldViolation(f"{p}.output", f"must be an integer in 0..{MAX_SURROGATE_OUTPUT}"
                                              f" (the output's position), got {_short(pos)}"))
            continue
        got[k] = pos
        if option:
            name, choices = option
            value = item.get(name, choices[0] if k != "mask" else None)
            if value not in choices:
                bad(FieldViolation(f"{p}.{name}", f"must be one of {', '.join(choices)}, got "
                                                  f"{_short(value)}"))
                continue
            got[f"{k}.{name}"] = value
    return SurrogateOutputs(
        boxes=got.get("boxes"), boxes_normalised=got.get("boxes.units") == "normalised",
        scores=got.get("scores"), scores_are_logits=got.get("scores.kind") == "logit",
        labels=got.get("labels"), class_logits=got.get("class_logits"), mask=got.get("mask"),
        mask_kind=str(got.get("mask.kind") or ""))


def _index(x: int | str, names: Sequence[str], lookup: Mapping[str, int]) -> int | None:
    """A label written as an index or a name -> its index (None: no such label). A string of
    digits that names no label is read as an index (JSON keys are strings)."""
    if isinstance(x, int):
        return x if 0 <= x < len(names) else None
    if x in lookup:
        return lookup[x]
    if x.isdigit():
        i = int(x)
        return i if i < len(names) else None
    return None


def resolve_label_map(defn: SurrogateDefinition, target_labels: Sequence[str],
                      path: str) -> tuple[tuple[tuple[int, int], ...], list[FieldViolation]]:
    """(surrogate index, target index) pairs of ``defn`` against the target's labels, and the
    problems (naming ``path.label_map.<key>``): unknown surrogate or target labels, a
    surrogate class mapped twice, or no class mapped at all."""
    problems: list[FieldViolation] = []
    s_lookup = {n: i for i, n in enumerate(defn.labels)}
    t_lookup = {n: i for i, n in enumerate(target_labels)}
    out: dict[int, int] = {}
    if not defn.label_map:
        out = {i: t_lookup[n] for i, n in enumerate(defn.labels) if n in t_lookup}
        if not out:
            problems.append(FieldViolation(f"{path}.label_map", "no surrogate label is also a "
                                           "target label by name: give a label_map (IEEE-P6)"))
        return tuple(sorted(out.items())), problems
    for k, v in defn.label_map:
        where = f"{path}.label_map.{str(k)[:60]}"
        s = _index(k, defn.labels, s_lookup)
        t = _index(v, target_labels, t_lookup)
        if s is None:
            problems.append(FieldViolation(where, f"{_short(k, 60)} is not one of the "
                                           f"surrogate's {len(defn.labels)} labels"))
        elif s in out:
            problems.append(FieldViolation(where, "this surrogate label is mapped twice"))
        if t is None:
            problems.append(FieldViolation(where, f"{_short(v, 60)} is not one of the target's "
                                           f"{len(target_labels)} labels"))
        if s is not None and t is not None and s not in out:
            out[s] = t
    return tuple(sorted(out.items())), problems


def spec_of(defn: SurrogateDefinition, target_labels: Sequence[str], path: str) -> SurrogateSpec:
    """``defn`` resolved against the target's labels; InvalidArgument naming the fields."""
    mapping, problems = resolve_label_map(defn, target_labels, path)
    if problems:
        raise InvalidArgument.from_violations(problems[:100])
    return SurrogateSpec(name=defn.name, model=defn.model, format=defn.format,
                         height=defn.height, width=defn.width, channels=defn.channels,
                         mean=defn.mean, std=defn.std, labels=defn.labels, mapping=mapping,
                         target_classes=max(1, len(target_labels)), task=defn.task,
                         outputs=defn.outputs)
