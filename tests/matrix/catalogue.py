"""The catalogue matrix, generated from the registries (never hand-listed).

Every perturbation (corruptions, styles, incremental degradation operators, PER-1 properties
through PertKnob) and every attack (transfer and query) x each task it declares x each target
signal it supports (classification: full scores, top-k, labels; detection: boxes;
segmentation: masks with per-pixel probabilities, masks alone) x each batch size (the plan's
default, 1, the largest allowed) is one **cell**: a setting of a plan run through the real
services (``start_stack``: perturbation, proxy, scoring, report, evaluation in one process on
loopback) against a real model served by the proxy. A cell's parameters are the entry's
defaults; what an entry requires and has no default for is filled by rule
(:func:`required_params`: an epsilon of 0.1 in [0, 1] pixel scale for L-inf, the same
image-wide for L2, 1% of the pixels for L0; a property for PertKnob). A profile may cap the
query budget of slow targets (stated in its ``notes``).

Each cell checks (:func:`check_cell`):

- the evaluation SUCCEEDED and the setting ran (it is not among the report's failed settings,
  and has its results);
- no image exceeded Q_m: every query-attack chunk session's per-image attempts and answered
  queries, read from the proxy's ledger, are at most the attack's budget (IEEE-M6);
- the stored uint8 adversarials respect the bound (IEEE-A9): every image of an attack with a
  bound that is not minimal-norm (``AttackSpec.minimal_norm``), the successful ones of a
  minimal-norm attack;
- every reported success is re-judged by the target model itself on the stored uint8 image
  the target received: a query attack's flagged images meet the criterion (classification:
  the top-1 label leaves the image's label set, or equals the target class; detection and
  segmentation: the scoring service's IEEE-C4 / C5 rule calls the answer incorrect); a
  transfer attack's count of successes equals the images right on the clean image and wrong
  on the adversarial;
- the report rendered (report.html names the setting).

Cells are grouped into one evaluation per (target, batch size, group): a setting that fails
is listed by the report (partial results) and fails its cell alone.
"""

from __future__ import annotations

import io
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

API_KEY = "matrix-key"
TENANT = "matrix"

#: Batch sizes of a cell: the plan's default (no ``execution``), 1, the largest allowed.
BATCHES = ("default", "1", "max")
#: The class targeted variants aim at (Fashion-MNIST "Trouser": three of the first twelve test
#: images are trousers, so the images a targeted attack leaves out are exercised too).
TARGET_CLASS = 1


@dataclass(frozen=True)
class TargetKind:
    """A target the matrix runs against: its task, the signal it gives, its TargetConfig
    spec, and the surrogate of transfer attacks on its task."""

    key: str
    task: str
    signal: str
    spec: str
    surrogate: str


TARGETS: tuple[TargetKind, ...] = (
    TargetKind("cnn", "classification", "scores", "builtin:fmnist-cnn", "fmnist-surrogate"),
    TargetKind("cnn-top3", "classification", "top_k", "builtin:fmnist-cnn?output=top_k&top_k=3",
               "fmnist-surrogate"),
    TargetKind("cnn-label", "classification", "labels", "builtin:fmnist-cnn?output=label_only",
               "fmnist-surrogate"),
    TargetKind("haar", "detection", "boxes", "builtin:haar-face", "mtcnn-surrogate"),
    TargetKind("u2netp", "segmentation", "probabilities", "builtin:u2netp", "u2netp-surrogate"),
    TargetKind("u2netp-masks", "segmentation", "masks", "builtin:u2netp?output=masks",
               "u2netp-surrogate"),
)


@dataclass(frozen=True)
class Profile:
    """How much of the matrix to run and at what size.

    ``images``: images per (task, batch label); ``max_queries``: a cap on Q_m per task (None:
    the attack's default); ``severities`` / ``levels``: of corruptions / degradation
    (None: the plan's defaults); ``targets`` / ``batches``: which to run; ``only``: a filter on
    cells (None: all); ``param_caps``: a cap on any attack parameter of that name whose
    default is larger (iterations of the optimisation attacks in the quick slice);
    ``attack_limits``: the images an attack covers (its plan ``limit``), for the slowest."""

    name: str
    images: Mapping[str, Mapping[str, int]]
    max_queries: Mapping[str, int | None]
    severities: Mapping[str, tuple[int, ...] | None]
    levels: tuple[int, ...] | None
    targets: tuple[str, ...]
    batches: tuple[str, ...]
    only: Callable[[Cell], bool] | None = None
    notes: tuple[str, ...] = ()
    param_caps: Mapping[str, int] = field(default_factory=dict)
    attack_limits: Mapping[str, int] = field(default_factory=dict)


FULL = Profile(
    name="full",
    images={"classification": {"default": 70, "1": 6, "max": 70},
            "detection": {"default": 3, "1": 3, "max": 3},
            "segmentation": {"default": 2, "1": 2, "max": 2}},
    max_queries={"classification": None, "detection": 200, "segmentation": 12},
    severities={"classification": None, "detection": None, "segmentation": (1, 3, 5)},
    levels=(1, 10, 30),
    targets=tuple(t.key for t in TARGETS), batches=BATCHES,
    attack_limits={"cw_l2": 16, "ead": 16},
    notes=("C&W L2 and EAD at their defaults (1,000 steps x 9 binary-search steps, ~16 s an "
           "image here) on the first 16 images only","Fashion-MNIST: 70 images at the default and the largest batch (two chunks of 64 "
           "+ 6 at the default), 6 at batch 1; every attack at its default parameters and "
           "Q_m", "detection (OpenCV Haar faces): 3 photos of three sizes, one without a face; "
           "Q_m capped at 200", "segmentation (U2-Net-p, ~0.3 s an answer here): 2 images, "
           "Q_m capped at 12, corruptions at severities 1, 3, 5",
           "degradation operators at levels 1, 10, 30 (level L is L applications)"))


def quick_profile() -> Profile:
    """The slice ``make test`` runs (``tests/e2e/test_catalogue_matrix.py``): every entry of
    every registry once against the full-score classifier at the default batch, with small
    budgets; every query attack once on the label-only or top-k classifier at batch 1; every
    query attack on the detector at the largest batch; a few on the segmenter."""
    seg_attacks = {"square", "hsja", "simba", "boundary", "pertknob"}

    def only(c: Cell) -> bool:
        if c.target == "cnn":
            return c.batch == "default"
        if c.target in ("cnn-label", "cnn-top3"):
            wanted = "cnn-label" if c.kind == "decision" else "cnn-top3"
            return c.batch == "1" and c.group == "attacks" and c.kind != "transfer" \
                and c.target == wanted
        if c.target == "haar":
            if c.kind == "property":
                return c.batch == "max" and c.entry in ("per_brightness", "per_fog",
                                                        "per_rotation")
            return c.batch == "max" and (c.group == "attacks" or c.entry in (
                "gaussian_noise", "fog", "oil_painting", "rotate"))
        if c.target == "u2netp":
            return c.batch == "default" and (c.entry in seg_attacks or c.entry in (
                "fgsm", "contrast", "per_brightness"))
        if c.target == "u2netp-masks":
            return c.batch == "1" and c.entry in ("hsja", "square")
        return False

    return Profile(
        name="quick",
        images={"classification": {"default": 12, "1": 3, "max": 12},
                "detection": {"default": 3, "1": 3, "max": 3},
                "segmentation": {"default": 1, "1": 1, "max": 1}},
        max_queries={"classification": 40, "detection": 20, "segmentation": 4},
        severities={"classification": (3,), "detection": (3,), "segmentation": (3,)},
        levels=(2,), targets=tuple(t.key for t in TARGETS), batches=BATCHES, only=only,
        param_caps={"steps": 20, "binary_search_steps": 2, "epochs": 5, "generations": 5,
                    "rotation_steps": 7},
        notes=("a slice of the matrix: budgets capped (Q_m 40 / 20 / 4), iterations capped, "
               "one severity, one degradation level; bench/matrix.py runs the whole matrix "
               "at the defaults",))


# --------------------------------------------------------------------------------------------
# cells, from the registries
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One cell: a registry entry as one setting of a plan on one target at one batch size.
    ``group``: "perturb" (corruptions, styles, degradation) or "attacks" (attacks and
    properties); ``kind``: the entry's kind (corruption, style, degradation, property,
    transfer, score, decision); ``name``: the setting's name in the plan; ``item``: the
    plan entry."""

    group: str
    kind: str
    entry: str
    name: str
    target: str
    batch: str
    item: Mapping[str, Any] = field(hash=False, compare=False)

    @property
    def id(self) -> str:
        return f"{self.target}/{self.batch}/{self.name}"


def required_params(spec: Any, shape: tuple[int, ...]) -> dict[str, Any] | None:
    """Values for the parameters an attack requires and has no default for (None: one this
    rule does not know, so the cell cannot be generated: a test fails on it)."""
    pixels = int(np.prod(shape))
    out: dict[str, Any] = {}
    for p in spec.params:
        if p.default is not None:
            continue
        if p.name == "epsilon":
            norm = spec.norm
            out["epsilon"] = (0.1 if norm == "linf" else
                              round(0.1 * math.sqrt(pixels), 3) if norm in ("l2", "l1") else
                              max(1, int(shape[0] * shape[1]) // 100))
        elif p.name == "property":
            out["property"] = "per_brightness"
        else:
            return None
    return out


def _supports(spec: Any, t: TargetKind) -> bool:
    """Whether an attack runs against this target: its task types, and a score-based attack
    needs scores (IEEE-A8: a labels-only target takes decision-based attacks only)."""
    if not spec.supports_task(t.task):
        return False
    return not (spec.kind == "score" and t.signal == "labels")


def generate(profile: Profile, shapes: Mapping[str, tuple[int, ...]],
             style_model: str) -> list[Cell]:
    """Every cell of the profile, from the perturbation and attack registries. ``shapes``:
    the largest image shape per task (for the required epsilon); ``style_model``: the blob id
    of the uploaded model ``neural_style`` takes."""
    from fortis.services.perturbation.attacks.registry import ATTACKS
    from fortis.services.perturbation.registry import PERTURBATIONS

    out: list[Cell] = []
    for key in profile.targets:
        t = target_kind(key)
        cap = profile.max_queries.get(t.task)
        for batch in profile.batches:
            def add(group: str, kind: str, entry: str, item: dict[str, Any],
                    batch: str = batch, key: str = key) -> None:
                c = Cell(group, kind, entry, str(item.get("name") or item["id"]), key, batch,
                         item)
                if profile.only is None or profile.only(c):
                    out.append(c)

            for p in PERTURBATIONS.values():
                if p.kind in ("corruption", "style") and p.family == "geometric" \
                        and t.task != "classification":
                    # they move the objects but not the boxes or masks: a detection or
                    # segmentation plan refuses them (plan validation, by the same family)
                    continue
                if p.kind in ("corruption", "style"):
                    item: dict[str, Any] = {"id": p.id}
                    sev = profile.severities.get(t.task)
                    if sev:
                        item["severities"] = list(sev)
                    if p.id == "neural_style":
                        item["params"] = {"model": style_model}
                    add("perturb", p.kind, p.id, item)
                elif p.kind == "degradation" and t.task == "classification":
                    item = {"id": p.id}
                    if profile.levels:
                        item["levels"] = list(profile.levels)
                    if p.needs_model:
                        item["surrogate"] = t.surrogate
                    add("perturb", p.kind, p.id, item)
                elif p.kind == "property":
                    params: dict[str, Any] = {"property": p.id}
                    if cap:
                        params["max_queries"] = max(2, cap)
                    add("attacks", "property", p.id,
                        {"id": "pertknob", "name": f"pertknob-{p.id}", "params": params})
            for spec in ATTACKS.values():
                if spec.id == "pertknob" or not _supports(spec, t):
                    continue
                req = required_params(spec, shapes[t.task])
                if req is None:
                    raise AssertionError(f"{spec.id}: a required parameter the matrix has no "
                                         "rule for; add one to required_params")
                params = dict(req)
                if spec.is_query_attack and cap:
                    params["max_queries"] = cap
                for p in spec.params:
                    most = profile.param_caps.get(p.name)
                    if most is not None and isinstance(p.default, int) and p.default > most:
                        params[p.name] = most
                item = {"id": spec.id, "params": params}
                if spec.id in profile.attack_limits:
                    item["limit"] = profile.attack_limits[spec.id]
                if spec.needs_surrogate:
                    item["surrogate"] = t.surrogate
                elif spec.uses_surrogate and t.task == "classification":
                    item["surrogate"] = t.surrogate
                add("attacks", spec.kind, spec.id, item)
                if spec.targeted and t.key == "cnn" and batch == "default":
                    add("attacks", spec.kind, spec.id,
                        {**item, "name": f"{spec.id}-targeted",
                         "targeted": {"label": TARGET_CLASS}})
    return out


def target_kind(key: str) -> TargetKind:
    return next(t for t in TARGETS if t.key == key)


# --------------------------------------------------------------------------------------------
# data: images, ground truth and the model's own answers (the re-judge)
# --------------------------------------------------------------------------------------------


@dataclass
class TaskData:
    """A task's images (by id), ground truth, the plan's dataset and criterion sections, and
    the target model in this process (for re-judging)."""

    task: str
    images: dict[str, np.ndarray]
    truth: dict[str, Any]
    dataset: str                       # the plan's dataset line (its limit filled per plan)
    section: str                       # the plan's correctness / detection / segmentation
    judge: Callable[[str, np.ndarray, str, Mapping[str, Any]], bool]
    order: list[str]

    def shape(self) -> tuple[int, ...]:
        return max((im.shape for im in self.images.values()), key=lambda s: int(np.prod(s)))


def classification_data(n: int) -> TaskData:
    from fortis.adapters.builtin import load_model
    from fortis.adapters.torch_models.datasets import load_fashion_mnist

    images, labels = load_fashion_mnist("test", limit=n)
    ids = [f"fmnist-test-{k:05d}" for k in range(n)]
    model = load_model("fmnist-cnn")

    def judge(image_id: str, image: np.ndarray, target: str,
              criterion: Mapping[str, Any]) -> bool:
        """Whether the model's answer on ``image`` meets the attack's criterion (misled)."""
        top = int(model.predict_proba(image[None]).argmax(1)[0])
        goal = criterion.get("target_label")
        if goal is not None:
            return top == int(goal)
        return top not in data.truth[image_id]

    data = TaskData("classification", dict(zip(ids, images, strict=True)),
                    {i: (int(lab),) for i, lab in zip(ids, labels, strict=True)},
                    "dataset: {source: fashion-mnist, split: test, limit: LIMIT}",
                    "correctness: {mode: top1}", judge, ids)
    return data


def detection_data(root: Path) -> TaskData:
    from fortis.adapters.vision_targets.haar import HaarFaceTarget
    from fortis.core.criteria import DetectionCriterion
    from fortis.services.scoring.correctness import detection_correct
    from fortis.services.scoring.correctness.boxes import Detections

    from tests.e2e.test_attacks_tasks import _detect, _detection_data

    images, truth = _detection_data(root)
    model = HaarFaceTarget()
    scores = [_detect(model, im)[1] for im in images.values()]
    conf = round(float(min(s.min() for s in scores if len(s))) - 0.01, 4)
    rule = {"mode": "threshold", "iou_threshold": 0.5, "confidence_threshold": conf}
    crit = DetectionCriterion.from_dict(rule)

    def correct(image_id: str, img: np.ndarray) -> bool:
        boxes, sc = _detect(model, img)
        t = truth[image_id]
        size = (img.shape[1], img.shape[0])
        return bool(detection_correct(
            [Detections(boxes=t, labels=np.zeros(len(t), np.int64), image_size=size)],
            [Detections(boxes=boxes, labels=np.zeros(len(boxes), np.int64), scores=sc,
                        image_size=size)], crit)[0])

    return TaskData("detection", images, truth,
                    "dataset: {source: manifest, path: manifest.jsonl, limit: LIMIT}",
                    f"detection: {{mode: threshold, iou_threshold: 0.5, "
                    f"confidence_threshold: {conf}, aggregate: all}}",
                    lambda i, img, target, criterion: not correct(i, img), list(images))


def segmentation_data(root: Path) -> TaskData:
    import cv2
    from fortis.adapters.vision_targets.u2netp import U2NetpTarget
    from fortis.core.criteria import SegmentationCriterion
    from fortis.services.scoring.correctness.segmentation import (
        segmentation_correct,
        segmentation_miou,
    )

    from tests.e2e.test_attacks_tasks import _segment, _segmentation_data

    images, truth = _segmentation_data(root)
    # a second image (the first mirrored), so batch 1 makes two chunks
    (name, img), = images.items()
    images[f"{name}-mirror"] = np.ascontiguousarray(img[:, ::-1])
    truth[f"{name}-mirror"] = np.ascontiguousarray(truth[name][:, ::-1])
    cv2.imwrite(str(root / f"{name}-mirror.png"),
                cv2.cvtColor(images[f"{name}-mirror"], cv2.COLOR_RGB2BGR))
    cv2.imwrite(str(root / f"{name}-mirror-mask.png"), truth[f"{name}-mirror"].astype(np.uint8))
    with (root / "manifest.jsonl").open("a") as fh:
        fh.write(json.dumps({"id": f"{name}-mirror", "image": f"{name}-mirror.png",
                             "mask": f"{name}-mirror-mask.png"}) + "\n")
    model = U2NetpTarget()
    base = SegmentationCriterion(classes=(1,), miou_threshold=0.5)
    miou = min(float(segmentation_miou([_segment(model, images[i])], [truth[i]], base)[0])
               for i in images)
    threshold = round(miou - 0.01, 4)
    crit = SegmentationCriterion(classes=(1,), miou_threshold=threshold)

    def misled(image_id: str, img: np.ndarray, target: str,
               criterion: Mapping[str, Any]) -> bool:
        return not bool(segmentation_correct([_segment(model, img)], [truth[image_id]],
                                             crit)[0])

    return TaskData("segmentation", images, truth,
                    "dataset: {source: manifest, path: manifest.jsonl, limit: LIMIT}",
                    f"segmentation: {{classes: [1], miou_threshold: {threshold}}}", misled,
                    list(images))


# --------------------------------------------------------------------------------------------
# running: one evaluation per (target, batch, group)
# --------------------------------------------------------------------------------------------


@dataclass
class CellResult:
    cell: Cell
    problems: list[str]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


def plan_text(cells: Sequence[Cell], t: TargetKind, data: TaskData, n: int,
              batch: str) -> str:
    corruptions = [c.item for c in cells if c.kind in ("corruption", "style")]
    degradation = [c.item for c in cells if c.kind == "degradation"]
    attacks = [c.item for c in cells if c.group == "attacks"]
    lines = [f"name: matrix-{t.key}-{batch}", "seed: 20261128",
             f"target: {{name: {t.key}, task: {t.task}}}",
             data.dataset.replace("LIMIT", str(n)), data.section]
    for key, items in (("corruptions", corruptions), ("degradation", degradation),
                       ("attacks", attacks)):
        if items:
            lines.append(f"{key}:")
            lines += [f"  - {json.dumps(dict(i))}" for i in items]
    if batch != "default":
        from fortis.services.common.limits import MAX_BATCH_SIZE

        lines.append(f"execution: {{batch_size: {1 if batch == '1' else MAX_BATCH_SIZE}}}")
    return "\n".join(lines) + "\n"


class Matrix:
    """The matrix of one profile on one in-process stack (every service, every target)."""

    def __init__(self, profile: Profile, root: Path, *,
                 log: Callable[[str], None] = lambda s: None) -> None:
        from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

        self.profile, self.root, self.log = profile, root, log
        data_root = root / "data"
        data_root.mkdir(parents=True, exist_ok=True)
        tasks = {target_kind(k).task for k in profile.targets}
        self.data: dict[str, TaskData] = {}
        n_cls = max(profile.images["classification"].values())
        if "classification" in tasks:
            self.data["classification"] = classification_data(n_cls)
        if "detection" in tasks:
            self.data["detection"] = detection_data(_fresh(data_root / "detection"))
        if "segmentation" in tasks:
            self.data["segmentation"] = segmentation_data(_fresh(data_root / "segmentation"))
        self.roots = {"detection": data_root / "detection",
                      "segmentation": data_root / "segmentation"}
        # one stack per data root (a manifest path is relative to the stack's data root)
        self.stacks: dict[str, Any] = {}
        for task in tasks:
            targets = [TargetConfig.parse(f"{t.key}={t.spec}") for t in TARGETS
                       if t.key in profile.targets and t.task == task]
            self.stacks[task] = start_stack(StackSettings(
                state_dir=root / f"state-{task}", api_keys={API_KEY: TENANT},
                # u2netp's surrogate is its own weights: the operator grants it
                whitebox_grants={TENANT: frozenset({"*"})},
                data_root=self.roots.get(task), targets=targets, metrics_port=0,
                metrics_host="127.0.0.1"))
        self.style_model = self._upload_style_model()
        shapes = {task: d.shape() for task, d in self.data.items()}
        self.cells = generate(profile, shapes, self.style_model)
        #: The finished evaluation of each group, by (target, batch, group): its checks can
        #: be asked again (the tests show they fail on a tampered result).
        self.runs: dict[tuple[str, str, str], _Run] = {}

    def close(self) -> None:
        for s in self.stacks.values():
            s.stop(0)

    def _upload_style_model(self) -> str:
        """A small TorchScript style network (a fixed colour transform), uploaded to each
        stack's tenant: ``neural_style`` takes the tenant's own model."""
        import torch
        from fortis.client import FortisClient

        class Sepia(torch.nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                m = torch.tensor([[0.39, 0.77, 0.19], [0.35, 0.69, 0.17], [0.27, 0.53, 0.13]])
                return torch.einsum("ij,njhw->nihw", m, x).clamp(0.0, 1.0)

        path = self.root / "sepia.pt"
        torch.jit.save(torch.jit.script(Sepia()), str(path))
        blob = ""
        for stack in self.stacks.values():
            with FortisClient(stack.address, api_key=API_KEY) as fc:
                blob = fc.upload(path, kind="model").blob_id
        return blob

    def groups(self) -> list[tuple[TargetKind, str, str, list[Cell]]]:
        out: dict[tuple[str, str, str], list[Cell]] = {}
        for c in self.cells:
            out.setdefault((c.target, c.batch, c.group), []).append(c)
        return [(target_kind(k[0]), k[1], k[2], v) for k, v in out.items()]

    def run(self, on_result: Callable[[CellResult], None] | None = None) -> list[CellResult]:
        results: list[CellResult] = []
        for t, batch, group, cells in self.groups():
            got = self.run_group(t, batch, group, cells)
            for r in got:
                if on_result is not None:
                    on_result(r)
            results += got
        return results

    def run_group(self, t: TargetKind, batch: str, group: str,
                  cells: Sequence[Cell]) -> list[CellResult]:
        from fortis.client import FortisClient

        data = self.data[t.task]
        n = min(self.profile.images[t.task][batch], len(data.order))
        text = plan_text(cells, t, data, n, batch)
        stack = self.stacks[t.task]
        t0 = time.monotonic()
        self.log(f"{t.key} batch={batch} {group}: {len(cells)} cells on {n} images ...")
        with FortisClient(stack.address, api_key=API_KEY) as fc:
            try:
                ev = fc.wait(fc.submit(text).evaluation_id, timeout_s=6 * 3600)
            except Exception as exc:  # noqa: BLE001 - a refused plan fails its cells
                return [CellResult(c, [f"plan refused: {type(exc).__name__}: {exc}"])
                        for c in cells]
            if ev.state.value != "SUCCEEDED":
                return [CellResult(c, [f"evaluation {ev.state.value}: {ev.error}"])
                        for c in cells]
            eid = ev.evaluation_id
            out_dir = self.root / "reports" / f"{t.key}-{batch}-{group}"
            js, html = fc.write_report(eid, out_dir)
            report = json.loads(js.read_text())
            page = html.read_text()
            run = _Run(self, stack, t, data, eid, report, page, n)
            self.runs[(t.key, batch, group)] = run
            seconds = (time.monotonic() - t0) / max(1, len(cells))
            results = [CellResult(c, run.check(c), seconds) for c in cells]
        bad = sum(not r.ok for r in results)
        self.log(f"  {len(cells) - bad} ok, {bad} failing, {time.monotonic() - t0:.0f} s")
        return results


def _fresh(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


@dataclass
class _Run:
    """One finished evaluation of a group, and the checks of its cells."""

    m: Matrix
    stack: Any
    t: TargetKind
    data: TaskData
    eid: str
    report: dict[str, Any]
    page: str
    n: int

    def check(self, c: Cell) -> list[str]:
        problems: list[str] = []
        failed = {f["setting"]: f for f in self.report.get("failed_settings") or ()}
        mine = [f for s, f in failed.items() if s == c.name or s.startswith(f"{c.name}@")]
        if mine:
            return [f"failed: {f['code']}: {f['message'][:300]}" for f in mine]
        metrics = self.report["metrics"]
        if c.kind in ("corruption", "style"):
            if c.name not in metrics["corruptions"]:
                problems.append("no results in the report")
        elif c.kind == "degradation":
            if c.name not in (metrics.get("degradation") or {}):
                problems.append("no degradation profile in the report")
        else:
            node = metrics["attacks"].get(c.name)
            if node is None:
                return ["no results in the report"]
            problems += self._attack(c, node)
        if c.name not in self.page:
            problems.append("report.html does not name the setting")
        return problems

    # -- attacks --------------------------------------------------------------------------
    def _attack(self, c: Cell, node: Mapping[str, Any]) -> list[str]:
        from fortis.services.perturbation.attacks.registry import ATTACKS

        spec = ATTACKS[str(c.item["id"])]
        params = dict(c.item.get("params") or {})
        problems: list[str] = []
        covered = self._covered(c)
        if node.get("m") != len(covered):
            problems.append(f"covers {node.get('m')} images, not {len(covered)}")
        ids, adv = self._adversarials(c.name)
        if sorted(ids) != sorted(covered):
            problems.append(f"stored adversarials of {len(ids)} images, not {len(covered)}")
            return problems
        if spec.is_query_attack:
            budget = int(params.get("max_queries") or _default(spec, "max_queries"))
            problems += self._budget(c, budget)
        problems += self._bounds(c, spec, params, ids, adv)
        problems += self._successes(c, spec, node, ids, adv)
        return problems

    def _adversarials(self, name: str) -> tuple[list[str], list[np.ndarray]]:
        store = self.stack.manager.store.for_tenant(TENANT)
        ids: list[str] = []
        out: list[np.ndarray] = []
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
        for art in store.artifacts(self.eid):
            if not art.name.startswith(f"adversarial/{safe}-") or \
                    not art.name[len(f"adversarial/{safe}-"):-4].isdigit():
                continue
            with np.load(io.BytesIO(store.artifact(self.eid, art.name))) as z:
                chunk = [str(i) for i in z["image_ids"]]
                ids += chunk
                if "adversarial_uint8" in z.files:
                    out += list(z["adversarial_uint8"])
                else:
                    out += [z[f"adversarial_uint8_{k:05d}"] for k in range(len(chunk))]
        return ids, out

    def _budget(self, c: Cell, budget: int) -> list[str]:
        prefix = f"{self.eid}/attack/{c.name}/"
        sessions = [s for s in self.report["ledger"]["sessions"] if s.startswith(prefix)]
        if not sessions:
            return ["no proxy session of the attack in the ledger"]
        from fortis.client import FortisClient

        problems = []
        with FortisClient(self.stack.address, api_key=API_KEY) as fc:
            stats = [(sid, fc.session_stats(sid).raw) for sid in sessions]
        for sid, st in stats:
            worst = max((max(i.attempts, i.queries) for i in st.images), default=0)
            if worst > budget:
                problems.append(f"{sid}: an image got {worst} queries, Q_m is {budget}")
        return problems

    def _bounds(self, c: Cell, spec: Any, params: Mapping[str, Any], ids: Sequence[str],
                adv: Sequence[np.ndarray]) -> list[str]:
        norm = str(params.get("norm") or spec.norm)
        eps = params.get("epsilon", _default(spec, "epsilon"))
        if norm == "spatial" or eps is None or (spec.minimal_norm and not eps):
            return []
        flags = self._success_flags(c) if spec.minimal_norm else None
        problems = []
        for i, a in zip(ids, adv, strict=True):
            if flags is not None and not flags.get(i, False):
                continue
            size, limit = _size(self.data.images[i], a, norm, float(eps))
            if size > limit:
                problems.append(f"{i}: {norm} {size:.6g} > bound {limit:.6g}")
                if len(problems) >= 3:
                    break
        return problems

    def _success_flags(self, c: Cell) -> dict[str, bool]:
        """Per image id, the success a query attack's chunks recorded."""
        from fortis.services.evaluation.answers import unpack

        store = self.stack.manager.store.for_tenant(TENANT)
        out: dict[str, bool] = {}
        for key, _, done in store.items(self.eid):
            if done and key.startswith(f"attack/{c.name}/"):
                _, _, blob = store.item(self.eid, key)
                res = unpack(blob)
                if "success" not in res:
                    continue
                ids = self._chunk_ids(c, int(key.rsplit("/", 1)[1]))
                out.update(zip(ids, (bool(x) for x in res["success"]), strict=False))
        return out

    def _covered(self, c: Cell) -> list[str]:
        """The images an attack covers: the plan's, or its first ``limit``."""
        limit = int(c.item.get("limit") or self.n)
        return self.data.order[:min(self.n, limit)]

    def _chunk_ids(self, c: Cell, chunk: int) -> list[str]:
        size = _batch_size(c.batch, self.n)
        return self._covered(c)[chunk * size:(chunk + 1) * size]

    def _successes(self, c: Cell, spec: Any, node: Mapping[str, Any], ids: Sequence[str],
                   adv: Sequence[np.ndarray]) -> list[str]:
        criterion = dict(c.item.get("criterion") or {})
        if c.item.get("targeted"):
            criterion["target_label"] = int(c.item["targeted"]["label"])
        by_id = dict(zip(ids, adv, strict=True))
        if spec.is_query_attack:
            flags = self._success_flags(c)
            wrong = [i for i, s in flags.items() if s and not self.data.judge(
                i, by_id[i], self.t.key, criterion)]
            problems = [f"{len(wrong)} reported successes the model does not confirm "
                        f"(e.g. {wrong[:3]})"] if wrong else []
            credited = sum(1 for s in flags.values() if s)
            if node.get("successes") is not None and node["successes"] > credited:
                problems.append(f"the report counts {node['successes']} successes, the "
                                f"chunks flag {credited}")
            return problems
        # transfer: right on the clean image and misled on the adversarial, by the model;
        # a targeted attack leaves out the images of the target class (counted apart)
        goal = criterion.get("target_label")
        attacked = [i for i in ids if not self.data.judge(i, self.data.images[i], self.t.key, {})
                    and (goal is None or goal not in self.data.truth[i])]
        misled = sum(1 for i in attacked if self.data.judge(i, by_id[i], self.t.key, {}))
        left_out = len(ids) - len([i for i in ids if goal is None
                                   or goal not in self.data.truth[i]])
        if int(node.get("excluded") or 0) != left_out:
            return [f"the report leaves out {node.get('excluded')} images; {left_out} are of "
                    "the target class"]
        if node.get("successes") != misled:
            return [f"the report counts {node.get('successes')} successes; the model is "
                    f"misled on {misled} of the images it got right"]
        return []


def _default(spec: Any, name: str) -> Any:
    return next((p.default for p in spec.params if p.name == name), None)


def _batch_size(batch: str, n: int) -> int:
    from fortis.services.common.limits import MAX_BATCH_SIZE

    return {"default": 64, "1": 1, "max": MAX_BATCH_SIZE}[batch]


def _size(x: np.ndarray, a: np.ndarray, norm: str, eps: float) -> tuple[float, float]:
    """The perturbation's size in ``norm`` ([0, 1] scale) and the bound it must respect, with
    the uint8 rounding the attacks state (L-inf: floor(eps * 255) levels)."""
    d = (a.astype(np.float64) - x.astype(np.float64)) / 255.0
    if norm == "linf":
        return float(np.abs(d).max(initial=0.0)), math.floor(eps * 255 + 1e-6) / 255 + 1e-9
    if norm == "l2":
        return float(np.sqrt((d * d).sum())), eps + 1e-6
    if norm == "l1":
        return float(np.abs(d).sum()), eps + 1e-6
    changed = (a != x).reshape(a.shape[0], a.shape[1], -1).any(axis=-1)
    return float(changed.sum()), eps


def summary(results: Iterable[CellResult], seconds: float, profile: Profile) -> dict[str, Any]:
    rs = list(results)
    failures = [{"cell": r.cell.id, "kind": r.cell.kind, "problems": r.problems}
                for r in rs if not r.ok]
    by_target: dict[str, dict[str, int]] = {}
    for r in rs:
        d = by_target.setdefault(r.cell.target, {"cells": 0, "failing": 0})
        d["cells"] += 1
        d["failing"] += int(not r.ok)
    return {"profile": profile.name, "cells": len(rs), "failing": len(failures),
            "seconds": round(seconds, 1), "by_target": by_target, "failures": failures,
            "notes": list(profile.notes)}


def restrict(profile: Profile, *, targets: Sequence[str] | None = None,
             batches: Sequence[str] | None = None,
             entries: Sequence[str] | None = None) -> Profile:
    """The profile limited to some targets, batch sizes and entries (None: all)."""
    base = profile.only

    def only(c: Cell) -> bool:
        return (base is None or base(c)) and (entries is None or c.entry in entries
                                              or c.name in entries)
    return replace(profile, targets=tuple(targets or profile.targets),
                   batches=tuple(batches or profile.batches),
                   only=only if (entries or base) else None)
