"""Example images for the report: what a QA lead looks at to see what was tested.

- Corruptions and styles (IEEE-A1..A6): ONE sample image (the first the target got right on
  the clean pass, else the first image), each corruption at each severity of the plan.
- Attacks (IEEE-A7, IEEE-A8): per attack, the first image it fooled (else the first it
  attacked): the clean image and the adversarial the target received, read back from the
  chunk's stored artifact (``RunContext.load_adversarials``, CAN-9).
- Degradation (DEG-4): per operator, each failure point that has a level: its example image
  at that level.

Each answer shown carries the verdict of the plan's correctness rule (IEEE-C1/C2, IEEE-C4,
IEEE-C5) as the scoring service judged it (``ScoreEvaluationResponse.verdicts``): the page
marks an answer that fails the rule, never one that merely differs from the clean answer,
and the rule has one implementation. Detection examples carry the ground-truth boxes and the
target's boxes (labels and scores) and segmentation examples the ground truth and the
target's class maps, for the report service to draw.

Nothing here queries the target: every answer shown is read from the answers the stages
recorded (the proxy's ledger stays exactly what the stages sent). Corrupted and degraded
images are made again through the perturbation port with the plan's seed and the stage's
exact arguments; its per-image seeding (``common.seeding.rng_for(seed, ..., image_id)``)
makes them the very images the target received. That is a call to the perturbation
service, not to the target.

Bounded (:data:`MAX_EXAMPLES`) and best effort: an example that cannot be made is logged and
left out; the evaluation never fails because of one. Domain code, no gRPC.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import structlog
from fortis.core.task import Task
from fortis.services.common.limits import MAX_EXAMPLE_MASK_CLASSES, MAX_REPORT_EXAMPLES
from fortis.services.common.matching import iou_per_class, mean_iou, to_xyxy
from fortis.services.evaluation.answers import (
    Answers,
    ClassAnswers,
    DetectionAnswers,
    SegmentationAnswers,
)
from fortis.services.evaluation.convert import setting_verdicts
from fortis.services.evaluation.plan import AttackTest, DegradationTest, Plan
from fortis.services.evaluation.ports import Example, ExampleBox, Setting
from fortis.services.evaluation.stages.base import RunContext, chunks

__all__ = ["MAX_BOXES", "MAX_EXAMPLES", "answer_boxes", "answer_text", "build_examples",
           "class_slots", "clean_right", "truth_boxes"]

log = structlog.get_logger("fortis.evaluation.examples")

#: At most this many examples per report (the report service refuses more).
MAX_EXAMPLES = MAX_REPORT_EXAMPLES
#: After this many examples could not be made, stop trying (a perturbation service that is
#: down must not hold the report up once per corruption and severity).
_MAX_FAILURES = 5
#: Boxes drawn per answer: the highest-scoring ones (a detector answering hundreds of boxes
#: would bury the image; the report service takes at most ``MAX_EXAMPLE_BOXES``).
MAX_BOXES = 50


def answer_text(answers: Answers | None, row: int, labels: Sequence[str]) -> str:
    """One recorded answer in words: "Trouser (0.97)" (top label and its score), "Trouser"
    (labels-only target), "2 boxes" (detection), "mask: 34% foreground" (segmentation);
    "no answer (...)" for a failed query."""
    if answers is None or not 0 <= row < answers.n:
        return "not recorded"
    if answers.errors[row]:
        return f"no answer ({answers.errors[row][:120]})"
    if isinstance(answers, ClassAnswers):
        lab = int(answers.labels[row, 0])
        if lab < 0:
            return "no label"
        name = labels[lab] if lab < len(labels) else str(lab)
        if answers.scores is not None:
            score = float(answers.scores[row, 0])
            if np.isfinite(score):
                return f"{name} ({score:.2f})"
        return name
    if isinstance(answers, DetectionAnswers):
        k = int(answers.counts[row])
        return f"{k} box" if k == 1 else f"{k} boxes"
    if isinstance(answers, SegmentationAnswers):
        if answers.class_maps is None:
            return "no mask"
        mask = np.asarray(answers.class_maps[row])
        valid = mask >= 0
        if not valid.any():
            return "no mask"
        return f"mask: {100.0 * float((mask[valid] > 0).mean()):.0f}% foreground"
    return "not recorded"


def clean_right(answers: Answers | None, row: int, truth: Sequence[int],
                correctness: Mapping[str, Any]) -> bool:
    """Whether a classification answer is right under the plan's rule (IEEE-C1/C2: top-1,
    top-k, or a true label's score above the threshold); a detection / segmentation answer
    counts as right when it was answered (the example only needs a sample image)."""
    if answers is None or not 0 <= row < answers.n or answers.errors[row]:
        return False
    if not isinstance(answers, ClassAnswers):
        return True
    ranked = [int(x) for x in answers.labels[row] if x >= 0]
    mode = str(correctness.get("mode", "top1"))
    if mode == "topk":
        return bool(set(ranked[:int(correctness.get("k", 5))]) & set(truth))
    if mode == "threshold" and answers.scores is not None:
        th = float(correctness.get("threshold", 0.5))
        scores = answers.scores[row]
        return any(lab in truth and float(scores[j]) > th for j, lab in enumerate(ranked))
    return bool(ranked) and ranked[0] in truth


def _row(setting: Setting | None, index: int) -> int:
    """The row of dataset image ``index`` in a setting's answers (-1: not in it)."""
    if setting is None:
        return -1
    if not setting.image_index:
        return index
    try:
        return setting.image_index.index(index)
    except ValueError:
        return -1


def _percent(x: float) -> str:
    return f"{100.0 * x:g}%"


def _label(labels: Sequence[str], label: int) -> str:
    return labels[label] if 0 <= label < len(labels) else str(label)


def answer_boxes(answers: Answers | None, row: int, labels: Sequence[str]) -> tuple[ExampleBox, ...]:
    """A detection answer's boxes as drawn: pixel xyxy, the label's name and the score, the
    :data:`MAX_BOXES` highest-scoring first; () for anything else."""
    if not isinstance(answers, DetectionAnswers) or not 0 <= row < answers.n \
            or answers.errors[row]:
        return ()
    start = int(np.sum(answers.counts[:row]))
    stop = start + int(answers.counts[row])
    scores = np.asarray(answers.scores[start:stop], dtype=np.float64)
    order = np.argsort(-np.where(np.isnan(scores), -np.inf, scores), kind="stable")[:MAX_BOXES]
    out = []
    for j in order.tolist():
        x1, y1, x2, y2 = (float(v) for v in answers.boxes[start + j])
        sc = float(scores[j])
        out.append(ExampleBox(box=(x1, y1, x2, y2), label=_label(labels, int(answers.labels[start + j])),
                              score=sc if np.isfinite(sc) else None))
    return tuple(out)


def truth_boxes(truth: Mapping[str, Any] | None, labels: Sequence[str]) -> tuple[ExampleBox, ...]:
    """An image's ground-truth objects (the manifest's boxes in their format, labels from
    ``label_base``) as drawn: pixel xyxy and the target's name of the class."""
    if not isinstance(truth, Mapping):
        return ()
    size = truth.get("image_size")
    xyxy = to_xyxy(truth.get("boxes") or [], str(truth.get("box_format") or "xyxy"),
                   image_size=tuple(size) if size is not None else None)
    base = int(truth.get("label_base") or 0)
    labs = list(truth.get("labels") or [0] * len(xyxy))
    return tuple(ExampleBox(box=(float(a), float(b), float(c), float(d)),
                            label=_label(labels, int(lab) - base))
                 for (a, b, c, d), lab in zip(xyxy.tolist(), labs, strict=True))


def class_slots(class_map: np.ndarray | None, classes: Sequence[int],
                ignore: int | None = None) -> np.ndarray | None:
    """A class map as the page draws it: 0 where no class of interest is (and where the
    ground truth is ``ignore``d), k where ``classes[k - 1]`` is; uint8 (None beyond 255
    classes of interest: an 8-bit PNG carries it)."""
    if class_map is None or not 0 < len(classes) <= MAX_EXAMPLE_MASK_CLASSES:
        return None
    m = np.asarray(class_map)
    out = np.zeros(m.shape, np.uint8)
    for k, c in enumerate(classes, start=1):
        out[m == c] = k
    if ignore is not None:
        out[m == ignore] = 0
    return out


def _fit(mask: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray | None:
    """``mask`` on an image's pixel grid (nearest neighbour), e.g. a ground truth of another
    size; None stays None."""
    if mask is None or mask.ndim != 2:
        return None
    h, w = shape[:2]
    if mask.shape == (h, w):
        return mask
    rows = np.minimum((np.arange(h) * mask.shape[0]) // max(h, 1), mask.shape[0] - 1)
    cols = np.minimum((np.arange(w) * mask.shape[1]) // max(w, 1), mask.shape[1] - 1)
    return np.asarray(mask[rows[:, None], cols[None, :]])


class _Builder:
    """Collects examples up to the bound, isolating each one's failure."""

    def __init__(self, ctx: RunContext, settings: Sequence[Setting], target: str,
                 verdicts: Mapping[tuple[str, str, int], np.ndarray],
                 truths: Sequence[Any] | None) -> None:
        self.ctx = ctx
        self.plan: Plan = ctx.plan
        self.task = ctx.plan.target.task
        self.labels = tuple(ctx.target.labels)
        self.target = target
        self.settings = {(s.kind, s.name, s.level): s for s in settings}
        self.clean = self.settings.get(("clean", "", 0))
        self.verdicts = verdicts
        if truths is None:
            truths = [ctx.truths.get(i) for i, _, _ in ctx.images] if ctx.truths else None
        self.truths = list(truths) if truths is not None else None
        self.out: list[Example] = []
        self.failures = 0
        self.left_out = 0

    def full(self) -> bool:
        return len(self.out) >= MAX_EXAMPLES or self.failures >= _MAX_FAILURES

    def add(self, what: str, make: Callable[[], Example | None]) -> None:
        if self.full():
            self.left_out += 1
            return
        try:
            ex = make()
        except Exception as exc:     # never fail the evaluation for an example
            self.failures += 1
            log.warning("example_failed", evaluation_id=self.ctx.evaluation_id, example=what,
                        error=f"{type(exc).__name__}: {str(exc)[:300]}")
            return
        if ex is not None:
            self.out.append(ex)

    def answer(self, setting: Setting | None, index: int) -> str:
        """The answer in words; a detection answer with its best two boxes ("2 boxes: face
        0.99, face 0.41"), a segmentation answer with its mIoU."""
        row = _row(setting, index)
        answers = setting.answers if setting else None
        text = answer_text(answers, row, self.labels)
        boxes = answer_boxes(answers, row, self.labels)
        if boxes:
            named = [b.label + (f" {b.score:.2f}" if b.score is not None else "")
                     for b in boxes[:2]]
            text += ": " + ", ".join(named) + (", ..." if len(boxes) > 2 else "")
        miou = self._miou(setting, index)
        return text if miou is None else f"{text}, mIoU {miou:.2f}"

    def verdict(self, setting: Setting | None, index: int) -> bool | None:
        """How the scoring service judged the setting's answer on image ``index`` (None:
        no verdicts, e.g. a scoring service that sends none)."""
        if setting is None:
            return None
        v = self.verdicts.get((setting.kind, setting.name, setting.level))
        row = _row(setting, index)
        if v is None or not 0 <= row < len(v):
            return None
        return bool(v[row])

    def right(self, setting: Setting | None, index: int) -> bool:
        judged = self.verdict(setting, index)
        if judged is not None:
            return judged
        row = _row(setting, index)
        truth = self.ctx.images[index][2]
        return clean_right(setting.answers if setting else None, row, truth,
                           self.plan.correctness)

    # -- what the page draws on an example ------------------------------------------------------

    def _truth(self, index: int) -> Any:
        return self.truths[index] if self.truths is not None and index < len(self.truths) \
            else None

    def _class_map(self, setting: Setting | None, index: int) -> np.ndarray | None:
        a = setting.answers if setting else None
        row = _row(setting, index)
        if not isinstance(a, SegmentationAnswers) or a.class_maps is None \
                or not 0 <= row < a.n or a.errors[row]:
            return None
        return np.asarray(a.class_maps[row])

    def _seg_rule(self) -> tuple[list[int], int | None]:
        seg = self.plan.segmentation or {}
        ignore = seg.get("ignore_label", 255)
        return [int(c) for c in seg.get("classes") or []], \
            int(ignore) if ignore is not None else None

    def _miou(self, setting: Setting | None, index: int) -> float | None:
        """The answer's mIoU over the classes of interest (IEEE-C5, the shared
        ``common.matching`` arithmetic the scoring service judges with), for the words
        under a segmentation example; None elsewhere or when undefined."""
        if self.task != Task.SEGMENTATION:
            return None
        pred, truth = self._class_map(setting, index), self._truth(index)
        if pred is None or truth is None or np.shape(truth) != pred.shape:
            return None
        classes, ignore = self._seg_rule()
        if not classes:
            return None
        m = float(mean_iou(iou_per_class(pred[None], np.asarray(truth)[None],
                                         np.array(sorted(set(classes)), np.int64), ignore))[0])
        return m if np.isfinite(m) else None

    def marks(self, setting: Setting | None, index: int, image: np.ndarray) -> dict[str, Any]:
        """An example's verdicts and, for detection and segmentation, what is drawn on it:
        the ground truth and the clean and perturbed answers (``setting``'s recorded answer;
        none for a query attack, whose stage records its outcome only)."""
        out: dict[str, Any] = {"original_correct": self.verdict(self.clean, index),
                               "perturbed_correct": self.verdict(setting, index)}
        if self.task == Task.DETECTION:
            out["truth_boxes"] = truth_boxes(self._truth(index), self.labels)
            out["original_boxes"] = answer_boxes(self.clean.answers if self.clean else None,
                                                 _row(self.clean, index), self.labels)
            out["perturbed_boxes"] = answer_boxes(setting.answers if setting else None,
                                                  _row(setting, index), self.labels)
        elif self.task == Task.SEGMENTATION:
            classes, ignore = self._seg_rule()
            truth = self._truth(index)
            shape = image.shape
            out["truth_mask"] = _fit(class_slots(np.asarray(truth) if truth is not None
                                                 else None, classes, ignore), shape)
            out["original_mask"] = _fit(class_slots(self._class_map(self.clean, index),
                                                    classes), shape)
            out["perturbed_mask"] = _fit(class_slots(self._class_map(setting, index),
                                                     classes), shape)
            out["mask_classes"] = tuple(_label(self.labels, c) for c in classes)
        return out

    # -- (a) corruptions and styles ------------------------------------------------------------

    def sample(self) -> int:
        """The first image the target got right on the clean pass, else the first."""
        return next((i for i in range(len(self.ctx.images)) if self.right(self.clean, i)), 0)

    def corruptions(self) -> None:
        if not self.plan.corruptions or not self.ctx.images:
            return
        index = self.sample()
        image_id, image, _ = self.ctx.images[index]
        right = self.right(self.clean, index)
        for ct in self.plan.corruptions:
            for sev in ct.severities:
                self.add(f"{ct.id}@{sev}", partial(self._corruption, index, image_id, image,
                                                   ct.id, sev, dict(ct.params), right))

    def _corruption(self, index: int, image_id: str, image: np.ndarray, cid: str, sev: int,
                    params: dict[str, Any], right: bool) -> Example | None:
        setting = self.settings.get(("corruption", cid, sev))
        if setting is None:
            log.info("example_skipped", example=f"{cid}@{sev}", reason="no recorded answers")
            return None
        # exactly the stage's call (CorruptionStage._item): same id, severity, seed, params
        out = self.ctx.perturbation.perturb(cid, sev, self.plan.seed, [(image_id, image)],
                                            params or None)
        note = "sample image: the first the target got right on the clean images" if right \
            else "sample image: the first image (the target got none right on the clean images)"
        return Example(kind="corruption", setting=cid, level=sev, image_id=image_id,
                       original=image, perturbed=np.asarray(out[0]),
                       original_answer=self.answer(self.clean, index),
                       perturbed_answer=self.answer(setting, index), note=note,
                       target=self.target, **self.marks(setting, index, image))

    # -- (b) attacks ---------------------------------------------------------------------------

    def attacks(self) -> None:
        for at in self.plan.attacks:
            self.add(at.name, partial(self._attack, at))

    def _attack(self, at: AttackTest) -> Example | None:
        setting = self.settings.get(("transfer_attack", at.name, 0)) or \
            self.settings.get(("query_attack", at.name, 0))
        if setting is None:
            log.info("example_skipped", example=at.name, reason="no recorded setting")
            return None
        n_images = len(self.ctx.images)
        n = min(n_images, at.limit) if at.limit else n_images
        attacked = list(setting.image_index) if setting.image_index else list(range(n))
        if not attacked:
            return None
        query = setting.kind == "query_attack"
        fooled = [i for k, i in enumerate(attacked)
                  if (query and k < len(setting.success) and setting.success[k])
                  or (not query and self._transfer_fooled(setting, i))]
        index = fooled[0] if fooled else attacked[0]
        bs = self.plan.batch_size
        c = index // bs
        a, b = chunks(n, bs)[c]
        image_id, image, _ = self.ctx.images[index]
        kept = self.ctx.load_adversarials(at.name, c, self.ctx.ids[a:b])
        if kept is None:
            log.info("example_skipped", example=at.name, reason=f"no stored adversarials of chunk {c}")
            return None
        adversarial = np.asarray(kept[0][index - a])
        k = attacked.index(index)
        size = ""
        if k < len(setting.linf) and k < len(setting.l2):
            size = f"; L-inf {setting.linf[k]:.4f}, L2 {setting.l2[k]:.3f} (pixels in [0, 1])"
        if query:
            queries = setting.queries[k] if k < len(setting.queries) else 0
            ok = k < len(setting.success) and setting.success[k]
            # a query attack's stage records its verdict, not the answer to the final image
            perturbed = f"fooled after {queries} queries" if ok else \
                f"not fooled within {queries} queries"
        else:
            perturbed = self.answer(setting, index)
        why = f"the first image {at.name} fooled" if fooled else \
            f"{at.name} fooled none of its {len(attacked)} images: the first it attacked"
        return Example(kind="attack", setting=at.name, level=0, image_id=image_id,
                       original=image, perturbed=adversarial,
                       original_answer=self.answer(self.clean, index),
                       perturbed_answer=perturbed, note=why + size, target=self.target,
                       **self.marks(setting, index, image))

    def _transfer_fooled(self, setting: Setting, index: int) -> bool:
        """A transfer attack fooled the target on an image: right on the clean image, wrong
        on the adversarial (IEEE-M3), by the scoring service's verdicts; without them, for
        detection / segmentation, the answer changed."""
        a = setting.answers
        judged = self.verdict(setting, index) is not None
        if judged or a is None or isinstance(a, ClassAnswers):
            return self.right(self.clean, index) and not self.right(setting, index)
        return self.answer(setting, index) != self.answer(self.clean, index)

    # -- (c) degradation failure points --------------------------------------------------------

    def degradation(self, metrics: Any) -> None:
        tests = {dt.id: dt for dt in self.plan.degradation}
        index_of = {image_id: k for k, (image_id, _, _) in enumerate(self.ctx.images)}
        for profile in getattr(metrics, "degradation", None) or ():
            dt = tests.get(profile.name)
            if dt is None:
                continue
            points: dict[tuple[int, str], list[Any]] = {}
            for fp in profile.failure_points:
                if fp.reached and fp.level > 0 and fp.example_image:
                    points.setdefault((int(fp.level), str(fp.example_image)), []).append(fp)
            for (level, image_id), fps in points.items():
                index = index_of.get(image_id)
                if index is None:
                    log.info("example_skipped", example=f"{dt.id}@{level}",
                             reason=f"image {image_id!r} not in the dataset selection")
                    continue
                self.add(f"{dt.id}@{level}", partial(self._degradation, dt, level, index, fps))

    def _degradation(self, dt: DegradationTest, level: int, index: int,
                     fps: Sequence[Any]) -> Example | None:
        setting = self.settings.get(("degradation", dt.id, level))
        if setting is None:
            log.info("example_skipped", example=f"{dt.id}@{level}", reason="no recorded answers")
            return None
        image_id, image, labels = self.ctx.images[index]
        # exactly the stage's call (DegradationStage._item)
        out = self.ctx.perturbation.perturb(
            dt.id, level, self.plan.seed, [(image_id, image)], surrogate=dt.surrogate,
            labels=[labels[0]] if dt.surrogate else None)
        below = " and ".join(_percent(float(fp.threshold)) for fp in fps)
        note = (f"failure point (DEG-4): accuracy first below {below} at level {level} "
                f"({float(fps[0].accuracy):.2f}); an image the target got wrong there")
        return Example(kind="degradation", setting=dt.id, level=level, image_id=image_id,
                       original=image, perturbed=np.asarray(out[0]),
                       original_answer=self.answer(self.clean, index),
                       perturbed_answer=self.answer(setting, index), note=note,
                       target=self.target, **self.marks(setting, index, image))


def build_examples(ctx: RunContext, settings: Sequence[Setting], metrics: Any, *,
                   target: str = "", truths: Sequence[Any] | None = None) -> list[Example]:
    """The report's example images of a finished run: corruptions at each severity
    on one sample image (IEEE-A1..A6), one original / adversarial pair per attack (IEEE-A7,
    A8), and the image of each DEG-4 failure point with a level. ``settings``: the stages'
    recorded settings; ``metrics``: the scoring service's answer (its per-image verdicts
    and its degradation profiles' failure points); ``target``: the target that answered
    (multi-target plans; "" for the plan's); ``truths``: detection / segmentation ground
    truth per image, in the order of ``ctx.images`` (the scoring setup's; default: the
    context's). At most :data:`MAX_EXAMPLES`; never raises (what cannot be made is logged)."""
    try:
        verdicts = setting_verdicts(metrics)
    except Exception as exc:      # never fail the evaluation for an example
        log.warning("example_verdicts_unreadable", evaluation_id=ctx.evaluation_id,
                    error=f"{type(exc).__name__}: {str(exc)[:300]}")
        verdicts = {}
    b = _Builder(ctx, settings, target, verdicts, truths)
    for part, run in (("corruptions", b.corruptions), ("attacks", b.attacks),
                      ("degradation", lambda: b.degradation(metrics))):
        try:
            run()
        except Exception as exc:      # never fail the evaluation for an example
            log.warning("examples_failed", evaluation_id=ctx.evaluation_id, part=part,
                        error=f"{type(exc).__name__}: {str(exc)[:300]}")
    if b.left_out:
        log.info("examples_left_out", evaluation_id=ctx.evaluation_id, left_out=b.left_out,
                 kept=len(b.out), failures=b.failures)
    return b.out
