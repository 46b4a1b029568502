"""Domain objects of the evaluation service -> the scoring and report services' messages.

Protobuf only (no gRPC); used by ``clients.py``. The plan's criteria sections (already
validated by core/criteria) become the typed criterion messages; recorded answers
become tensors; the facts of a run become the report's typed parts (the report service
writes the prose).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from fortis.core.strategy import OUTPUT_KINDS, TASK_TYPES
from fortis.core.task import Task
from fortis.core.tensors import array_to_tensor, fill_tensor
from fortis.perturbation.v1 import perturbation_pb2 as ppb
from fortis.report.v1 import report_pb2 as rpb
from fortis.scoring.v1 import scoring_pb2 as spb
from fortis.services.common.limits import (
    MAX_EXAMPLE_PNG_BYTES,
    MAX_EXAMPLE_SIDE,
    MAX_REPORT_EXAMPLES,
)
from fortis.services.common.result_tree import fill_message
from fortis.services.evaluation.answers import ClassAnswers, DetectionAnswers, SegmentationAnswers
from fortis.services.evaluation.ports import (
    Example,
    ExampleBox,
    ReportInput,
    ScoringSetup,
    Setting,
    Summary,
)
from google.protobuf import timestamp_pb2
from PIL import Image

__all__ = ["attack_criterion", "correctness_rule", "detection_criterion", "example_image",
           "example_images", "fill_reference", "png_bytes", "report_parts", "scoring_setup",
           "segmentation_criterion", "setting", "setting_verdicts", "summary"]

_MODES = {"top1": spb.CORRECTNESS_MODE_TOP1, "topk": spb.CORRECTNESS_MODE_TOPK,
          "threshold": spb.CORRECTNESS_MODE_THRESHOLD}
_AGG = {"all": spb.AGGREGATE_MODE_ALL, "at_least": spb.AGGREGATE_MODE_AT_LEAST}
_ABSENT = {"correct": spb.ALL_ABSENT_POLICY_CORRECT, "incorrect": spb.ALL_ABSENT_POLICY_INCORRECT}
_BOX = {"xyxy": spb.BOX_FORMAT_XYXY, "xywh": spb.BOX_FORMAT_XYWH, "cxcywh": spb.BOX_FORMAT_CXCYWH,
        "xyxyn": spb.BOX_FORMAT_XYXY_NORMALISED, "xywhn": spb.BOX_FORMAT_XYWH_NORMALISED,
        "cxcywhn": spb.BOX_FORMAT_CXCYWH_NORMALISED}
_KINDS = {"clean": spb.SETTING_KIND_CLEAN, "corruption": spb.SETTING_KIND_CORRUPTION,
          "transfer_attack": spb.SETTING_KIND_TRANSFER_ATTACK,
          "query_attack": spb.SETTING_KIND_QUERY_ATTACK,
          "degradation": spb.SETTING_KIND_DEGRADATION}
_TEST_KINDS = {"corruption": rpb.TEST_KIND_CORRUPTION, "style": rpb.TEST_KIND_STYLE,
               "degradation": rpb.TEST_KIND_DEGRADATION,
               "transfer_attack": rpb.TEST_KIND_TRANSFER_ATTACK,
               "score_attack": rpb.TEST_KIND_SCORE_ATTACK,
               "decision_attack": rpb.TEST_KIND_DECISION_ATTACK}


# -- criteria ----------------------------------------------------------------------------------

def correctness_rule(d: Mapping[str, Any]) -> spb.CorrectnessRule:
    return spb.CorrectnessRule(mode=_MODES[d.get("mode", "top1")], k=int(d.get("k", 5)),
                               threshold=float(d.get("threshold", 0.5)))


def detection_criterion(d: Mapping[str, Any]) -> spb.DetectionCriterion:
    c = spb.DetectionCriterion(mode=_MODES[d.get("mode", "threshold")], k=int(d.get("k", 5)),
                               iou_threshold=float(d.get("iou_threshold", 0.5)),
                               aggregate=_AGG[d.get("aggregate", "all")], q=int(d.get("q", 1)))
    if d.get("confidence_threshold") is not None:
        c.confidence_threshold = float(d["confidence_threshold"])
    return c


def segmentation_criterion(d: Mapping[str, Any]) -> spb.SegmentationCriterion:
    c = spb.SegmentationCriterion(classes=[int(x) for x in d["classes"]],
                                  miou_threshold=float(d.get("miou_threshold", 0.5)),
                                  all_absent=_ABSENT[d.get("all_absent", "correct")])
    ign = d.get("ignore_label", 255)
    if ign is not None:
        c.ignore_label = int(ign)
    return c


# -- attacks -----------------------------------------------------------------------------------

_CRITERION_KINDS = {
    "misclassification": ppb.CRITERION_KIND_MISCLASSIFICATION,
    "targeted_misclassification": ppb.CRITERION_KIND_TARGETED_MISCLASSIFICATION,
    "confident_misclassification": ppb.CRITERION_KIND_CONFIDENT_MISCLASSIFICATION,
    "top_k_misclassification": ppb.CRITERION_KIND_TOP_K_MISCLASSIFICATION,
    "original_class_probability": ppb.CRITERION_KIND_ORIGINAL_CLASS_PROBABILITY,
    "target_class_prob_boost": ppb.CRITERION_KIND_TARGET_CLASS_PROB_BOOST,
    "object_missed": ppb.CRITERION_KIND_OBJECT_MISSED,
    "object_relabelled": ppb.CRITERION_KIND_OBJECT_RELABELLED,
    "miou_below": ppb.CRITERION_KIND_MIOU_BELOW}


def attack_criterion(d: Mapping[str, Any]) -> ppb.AttackCriterion:
    """An attack's criterion from the validated plan (``plan.AttackTest.criterion``: kind,
    target_label, threshold, k, detection / segmentation parameters) as the request's
    AttackCriterion."""
    msg = ppb.AttackCriterion(kind=_CRITERION_KINDS.get(d.get("kind") or "", 0),
                              k=int(d.get("k") or 0))
    if d.get("target_label") is not None:
        msg.target_label = int(d["target_label"])
    if d.get("threshold") is not None:
        msg.threshold = float(d["threshold"])
    det = d.get("detection")
    if det:
        msg.detection.iou_threshold = float(det.get("iou_threshold", 0.5))
        msg.detection.min_objects = int(det.get("min_objects", 0))
        msg.detection.mode = str(det.get("mode", "threshold"))
        msg.detection.k = int(det.get("k", 5))
        if det.get("score_threshold") is not None:
            msg.detection.score_threshold = float(det["score_threshold"])
    seg = d.get("segmentation")
    if seg:
        g = msg.segmentation
        g.classes.extend(int(c) for c in seg["classes"])
        g.miou_threshold = float(seg.get("miou_threshold", 0.5))
        g.all_absent_incorrect = bool(seg.get("all_absent_incorrect", False))
        if seg.get("ignore_label") is not None:
            g.ignore_label = int(seg["ignore_label"])
    return msg


def fill_reference(li: ppb.LabeledImage, ref: Any) -> None:
    """An image's detection objects (``{"boxes": (k, 4) pixel xyxy, "labels": (k,)}``) or
    segmentation mask ((H, W) ints) into its LabeledImage; None: nothing (the clean answer's
    reference)."""
    if ref is None:
        return
    if isinstance(ref, Mapping):
        boxes = np.asarray(ref["boxes"], dtype=np.float64).reshape(-1, 4)
        li.no_objects = not len(boxes)
        for (x1, y1, x2, y2), lab in zip(boxes.tolist(), ref["labels"], strict=True):
            b = li.objects.add()
            b.x_min, b.y_min, b.x_max, b.y_max, b.label = x1, y1, x2, y2, int(lab)
        return
    fill_tensor(li.mask, np.asarray(ref, dtype=np.int32))


# -- scoring -----------------------------------------------------------------------------------

def scoring_setup(s: ScoringSetup) -> spb.ScoringSetup:
    msg = spb.ScoringSetup(image_ids=list(s.image_ids), ranking=spb.RankingOptions(
        enabled=s.ranking, reason=s.ranking_reason, num_classes=s.num_classes))
    if s.task == Task.CLASSIFICATION:
        msg.classification.labels.extend(spb.LabelSet(labels=[int(x) for x in lab]) for lab in s.truth)
        msg.correctness.CopyFrom(correctness_rule(s.criterion))
    elif s.task == Task.DETECTION:
        for t in s.truth:
            w, h = (t.get("image_size") or [0, 0])[:2]
            img = msg.detection.images.add(
                labels=[int(x) for x in t["labels"]], box_format=_BOX[t.get("box_format", "xyxy")],
                label_base=int(t.get("label_base", 0)), width=int(w), height=int(h))
            boxes = np.asarray(t["boxes"], dtype=np.float64).reshape(-1, 4)
            if len(boxes):            # no objects: boxes stay unset (a tensor has no empty shape)
                img.boxes.CopyFrom(array_to_tensor(boxes))
        msg.detection_criterion.CopyFrom(detection_criterion(s.criterion))
    else:
        msg.segmentation.class_maps.CopyFrom(
            array_to_tensor(np.stack([np.asarray(t, dtype=np.int64) for t in s.truth])))
        msg.segmentation_criterion.CopyFrom(segmentation_criterion(s.criterion))
    return msg


def setting(s: Setting) -> spb.SettingAnswers:
    msg = spb.SettingAnswers(kind=_KINDS[s.kind], name=s.name, level=s.level,
                             image_index=list(s.image_index))
    a = s.answers
    if isinstance(a, ClassAnswers):
        msg.errors.extend(a.errors)
        msg.classification.labels.CopyFrom(array_to_tensor(a.labels.astype(np.int64)))
        if a.scores is not None:
            msg.classification.scores.CopyFrom(array_to_tensor(a.scores.astype(np.float32)))
    elif isinstance(a, DetectionAnswers):
        msg.errors.extend(a.errors)
        d = msg.detection
        if len(a.boxes):              # no boxes at all: boxes/labels/scores stay unset
            d.boxes.CopyFrom(array_to_tensor(a.boxes.astype(np.float32).reshape(-1, 4)))
            d.labels.CopyFrom(array_to_tensor(a.labels.astype(np.int64)))
            d.scores.CopyFrom(array_to_tensor(a.scores.astype(np.float32)))
        d.counts.CopyFrom(array_to_tensor(a.counts.astype(np.int64)))
    elif isinstance(a, SegmentationAnswers):
        msg.errors.extend(a.errors)
        if a.class_maps is not None:
            msg.segmentation.class_maps.CopyFrom(array_to_tensor(a.class_maps.astype(np.int64)))
    if s.kind == "query_attack":
        msg.query_attack.CopyFrom(spb.QueryAttackOutcomes(
            success=list(s.success), queries=list(s.queries), query_budget=s.query_budget))
    if s.linf or s.l2:
        msg.sizes.CopyFrom(spb.PerturbationSizes(linf=list(s.linf), l2=list(s.l2)))
    if s.fraction_changed is not None:
        msg.fraction_of_pixels_changed = s.fraction_changed
    if any(s.excluded):
        msg.excluded.extend(s.excluded)
        msg.excluded_reason = s.excluded_reason
    return msg


def summary(resp: spb.ScoreEvaluationResponse) -> Summary:
    ieee = resp.ieee

    def val(x: Any) -> float | None:
        return float(x.value) if x.HasField("value") else None
    return Summary(accuracy=val(ieee.accuracy),
                   average_robustness_corr=val(ieee.average_robustness_corr),
                   average_robustness_adv=val(ieee.average_robustness_adv), m=int(ieee.m))


# -- report ------------------------------------------------------------------------------------

def _ts(t: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(t * 1e9))
    return ts


def named_value(name: str, value: Any) -> ppb.NamedValue:
    """A validated plan parameter as a typed NamedValue (bool, int, float, text, numbers)."""
    if isinstance(value, bool):
        return ppb.NamedValue(name=name, flag=value)
    if isinstance(value, int):
        return ppb.NamedValue(name=name, integer=value)
    if isinstance(value, float):
        return ppb.NamedValue(name=name, number=value)
    if isinstance(value, list | tuple) and all(isinstance(x, int | float) and not isinstance(x, bool)
                                              for x in value):
        return ppb.NamedValue(name=name, numbers=ppb.NumberList(values=[float(x) for x in value]))
    return ppb.NamedValue(name=name, text=value if isinstance(value, str) else repr(value))


def _level_rows(info: Any, levels: Sequence[int]) -> list[Any]:
    """The catalogue's level-table rows of the levels run (as the perturbation service
    described them)."""
    if info is None:
        return []
    rows = {int(r.level): r for r in getattr(info, "level_table", [])}
    return [rows[lv] for lv in levels if lv in rows]


def setting_verdicts(metrics: Any) -> dict[tuple[str, str, int], np.ndarray]:
    """The scoring service's per-image verdicts (``ScoreEvaluationResponse.verdicts``) by
    setting ``(kind, name, level)``: (n,) bool over the setting's covered images. Empty
    when the answer carries none (e.g. an older scoring service)."""
    out: dict[tuple[str, str, int], np.ndarray] = {}
    names = {v: k for k, v in _KINDS.items()}
    for v in getattr(metrics, "verdicts", None) or ():
        kind = names.get(v.kind)
        if kind is None or v.count < 0 or len(v.correct) != -(-v.count // 8):
            continue
        bits = np.unpackbits(np.frombuffer(v.correct, dtype=np.uint8), count=v.count)
        out[(kind, v.name, int(v.level))] = bits.astype(bool)
    return out


def _without_verdicts(metrics: Any) -> Any:
    """The scoring answer as the report gets it: the per-image verdicts stay here (the
    examples carry the few the page shows)."""
    if not isinstance(metrics, spb.ScoreEvaluationResponse) or not metrics.verdicts:
        return metrics
    out = spb.ScoreEvaluationResponse()
    out.CopyFrom(metrics)
    out.ClearField("verdicts")
    return out


def report_parts(r: ReportInput) -> rpb.ReportParts:
    plan, t = r.plan, r.target
    target = rpb.TargetReport(
        name=plan.target.name, model_name=t.name, task=TASK_TYPES.get(t.task, 0),
        endpoint=plan.target.endpoint, output_kind=OUTPUT_KINDS.get(t.output_kind, 0),
        top_k=t.top_k, labels_count=len(t.labels), version=t.version,
        input_height=t.input_height, input_width=t.input_width, input_channels=t.input_channels)
    if plan.target.task == Task.CLASSIFICATION:
        target.correctness.CopyFrom(correctness_rule(plan.correctness))
    elif plan.target.task == Task.DETECTION:
        target.detection.CopyFrom(detection_criterion(plan.detection))
    else:
        target.segmentation.CopyFrom(segmentation_criterion(plan.segmentation))
    parts = rpb.ReportParts(
        plan_text=r.plan_text, target=target,
        roles=rpb.Roles(**{k: rpb.Party(name=getattr(plan, k).name,
                                        organisation=getattr(plan, k).organisation)
                           for k in ("requester", "tester", "provider")}),
        environment=rpb.Environment(seed=int(plan.seed), **dict(r.environment)),
        metrics=_without_verdicts(r.metrics),
        ledger=rpb.LedgerSummary(sessions=dict(r.ledger.sessions),
                                 total_queries=sum(r.ledger.sessions.values()),
                                 aborted_attempt_sessions=dict(r.ledger.aborted),
                                 aborted_attempt_queries=sum(r.ledger.aborted.values())),
        evaluation=rpb.EvaluationInfo(
            evaluation_id=r.evaluation_id, start_time=_ts(r.started), end_time=_ts(r.finished),
            images=r.images, resumed_count=r.resumed_count,
            dataset=rpb.DatasetInfo(source=plan.dataset.source, split=plan.dataset.split,
                                    offset=plan.dataset.offset, limit=plan.dataset.limit)))
    for test in r.tests:
        msg = parts.tests.add(name=test.name, kind=_TEST_KINDS[test.kind],
                              perturbation_id=test.perturbation_id, family=test.family,
                              refs=list(test.refs), levels=list(test.levels),
                              surrogate=test.surrogate, norm=test.norm, images=test.images)
        msg.level_parameters.extend(_level_rows(test.catalogue_info, test.levels))
        if test.catalogue_info is not None and test.catalogue_info.HasField("characterisation"):
            msg.characterisation.CopyFrom(test.catalogue_info.characterisation)
        msg.params.extend(named_value(k, v) for k, v in test.params.items())
        if test.epsilon is not None:
            msg.epsilon = test.epsilon
        if test.query_budget is not None:
            msg.query_budget = test.query_budget
        msg.signal = test.signal
        msg.criterion = test.criterion
    parts.examples.extend(example_images(r.examples))
    for f in r.failed:
        assert f.failure is not None
        parts.failed_settings.add(
            kind=f.kind, name=f.name, level=f.level,
            code=f.failure.code, message=f.failure.message,
            images_done=f.failure.images_done, images_planned=f.failure.images_planned)
    if r.canary is not None:    # CAN-1..4 per attack (canary_metrics.py): Compute's results
        _typed_part(parts.canary, r.canary, "canary")
    if r.sequential is not None:    # sequential acceptance (sequential.py)
        _typed_part(parts.sequential, r.sequential, "sequential")
    if r.benchmark:     # multi-target plans (CAN-5/7/8/10): Compute results
        _typed_part(parts.benchmark, r.benchmark, "benchmark")
    if r.estimate is not None:
        _estimate_part(parts.estimate, r.estimate)
    if r.outcomes is not None:      # per-image outcomes for paired comparisons
        parts.outcomes.image_ids.extend(r.outcomes.image_ids)
        parts.outcomes.settings.extend(
            rpb.SettingOutcomes(kind=k, name=n, level=lv, outcomes=o)
            for k, n, lv, o in r.outcomes.settings)
    return parts


_ESTIMATE_KINDS = {"fixed": rpb.ESTIMATE_KIND_FIXED, "upper_bound": rpb.ESTIMATE_KIND_UPPER_BOUND}


def _estimate_part(msg: rpb.EstimateReport, e: Mapping[str, Any]) -> None:
    """The query estimate beside the ledger's counts (``estimate.report_section``)."""
    msg.SetInParent()
    msg.fixed, msg.upper_bound = int(e["fixed"]), int(e["upper_bound"])
    if e.get("expected") is not None:
        msg.expected = int(e["expected"])
    msg.total_actual = int(e["total_actual"])
    msg.per_setting.extend(rpb.EstimatedSetting(
        stage=str(r["stage"]), setting=str(r["setting"]), kind=_ESTIMATE_KINDS[str(r["kind"])],
        estimated=int(r["estimated"]), actual=int(r["actual"])) for r in e["per_setting"])


def _typed_part(msg: rpb.CanaryMetrics | rpb.BenchmarkResults | rpb.SequentialResults,
                data: Mapping[str, Any], path: str) -> None:
    """A results tree as its typed part; keys the contract does not describe (a newer scoring
    service's) are left out and named in the part's notes rather than failing the run."""
    msg.SetInParent()
    unknown: list[str] = []
    fill_message(msg, data, path, unknown)
    if unknown:
        msg.notes.append("left out of the report (not in its contract): "
                         + ", ".join(unknown[:20]))


# -- example images ----------------------------------------------------------------------------

#: The report service's bounds on example images (``services/report/convert.py``, which a
#: service may not import): each PNG at most 1 MiB and 4096 x 4096 pixels, at most 200.
EXAMPLE_PNG_BYTES = MAX_EXAMPLE_PNG_BYTES
EXAMPLE_MAX_SIDE = MAX_EXAMPLE_SIDE
EXAMPLE_COUNT = MAX_REPORT_EXAMPLES
#: Every example PNG of one report together. RenderReport's messages are bounded (64 MiB):
#: its answer carries each image twice (report.json and report.html), base64, plus the
#: difference images, so about 4 x this.
EXAMPLES_TOTAL_BYTES = 8 << 20
_EXAMPLE_KINDS = {"corruption": rpb.EXAMPLE_KIND_CORRUPTION, "attack": rpb.EXAMPLE_KIND_ATTACK,
                  "degradation": rpb.EXAMPLE_KIND_DEGRADATION}
_EXAMPLE_TEXT = 1000


def png_bytes(image: np.ndarray) -> bytes:
    """Lossless PNG of a uint8 H x W (x 1 | 3) image: grayscale for one channel, RGB for
    three. Deterministic (Pillow, fixed compression, no metadata): the same image gives the
    same bytes."""
    arr = np.asarray(image)
    if arr.dtype != np.uint8:
        arr = np.clip(np.rint(arr), 0, 255).astype(np.uint8)
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] == 3)):
        raise ValueError(f"an image of shape {arr.shape}: H x W x 1 or 3 expected")
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(arr)).save(buf, format="PNG", compress_level=6)
    return buf.getvalue()


def _shrunk(image: np.ndarray, factor: int) -> np.ndarray:
    """``image`` reduced ``factor`` times on each side (box filter); itself for 1."""
    if factor == 1:
        return image
    arr = np.asarray(image)
    grey = arr.ndim == 3 and arr.shape[2] == 1
    pil = Image.fromarray(np.ascontiguousarray(arr[:, :, 0] if grey else arr))
    w, h = pil.size
    out = np.asarray(pil.resize((max(1, -(-w // factor)), max(1, -(-h // factor))),
                                Image.Resampling.BOX))
    return out[:, :, None] if grey else out


_VERDICTS = {None: rpb.EXAMPLE_VERDICT_UNSPECIFIED, True: rpb.EXAMPLE_VERDICT_CORRECT,
             False: rpb.EXAMPLE_VERDICT_INCORRECT}
#: An example is shown reduced, rather than left out, down to this many pixels on its longer
#: side when the report's byte budget runs short.
_MIN_REDUCED_SIDE = 32


def _boxes(boxes: Sequence[ExampleBox], factor: int) -> list[rpb.ExampleBox]:
    out = []
    for b in boxes:
        x1, y1, x2, y2 = (float(v) / factor for v in b.box)
        msg = rpb.ExampleBox(x_min=x1, y_min=y1, x_max=x2, y_max=y2, label=b.label[:200])
        if b.score is not None and np.isfinite(b.score):
            msg.score = float(b.score)
        out.append(msg)
    return out


def _mask_png(mask: np.ndarray | None, factor: int, shape: tuple[int, ...]) -> bytes:
    """A class-slot map reduced as its images are (every ``factor``-th pixel: no new
    values), as an 8-bit grey PNG; b"" when absent or not on the image's grid."""
    if mask is None:
        return b""
    m = np.asarray(mask)
    if m.ndim != 2 or m.dtype != np.uint8:
        return b""
    m = m[::factor, ::factor]
    return png_bytes(m) if m.shape == tuple(shape[:2]) else b""


def _size(msg: rpb.ExampleImage) -> int:
    return len(msg.original_png) + len(msg.perturbed_png) + len(msg.truth_mask_png) + \
        len(msg.original_mask_png) + len(msg.perturbed_mask_png)


def example_image(e: Example, *, factor: int = 1) -> rpb.ExampleImage | None:
    """An example as the report's ExampleImage: both images as PNG within the report
    service's bounds, reduced ``factor`` times at least. An image over them is shown reduced
    (both alike, with the boxes and masks drawn on them, and the note says so); an example
    whose two images differ in size, or that cannot be encoded, is None."""
    original, perturbed = np.asarray(e.original), np.asarray(e.perturbed)
    if original.shape[:2] != perturbed.shape[:2] or original.ndim < 2:
        return None
    h, w = original.shape[:2]
    factor = max(1, factor, -(-max(h, w) // EXAMPLE_MAX_SIDE))
    while factor <= 64:
        small = _shrunk(original, factor)
        o, p = png_bytes(small), png_bytes(_shrunk(perturbed, factor))
        if len(o) <= EXAMPLE_PNG_BYTES and len(p) <= EXAMPLE_PNG_BYTES:
            note = e.note
            if factor > 1:
                note += (f"{'; ' if note else ''}shown reduced {factor} times "
                         f"(the target received {w}x{h} pixels)")
            return rpb.ExampleImage(
                kind=_EXAMPLE_KINDS[e.kind], setting=e.setting[:_EXAMPLE_TEXT],
                level=int(e.level), image_id=e.image_id[:_EXAMPLE_TEXT],
                original_png=o, perturbed_png=p,
                original_answer=e.original_answer[:_EXAMPLE_TEXT],
                perturbed_answer=e.perturbed_answer[:_EXAMPLE_TEXT],
                note=note[:_EXAMPLE_TEXT], target=e.target[:_EXAMPLE_TEXT],
                original_verdict=_VERDICTS[e.original_correct],
                perturbed_verdict=_VERDICTS[e.perturbed_correct],
                truth_boxes=_boxes(e.truth_boxes, factor),
                original_boxes=_boxes(e.original_boxes, factor),
                perturbed_boxes=_boxes(e.perturbed_boxes, factor),
                truth_mask_png=_mask_png(e.truth_mask, factor, small.shape),
                original_mask_png=_mask_png(e.original_mask, factor, small.shape),
                perturbed_mask_png=_mask_png(e.perturbed_mask, factor, small.shape),
                mask_classes=[c[:200] for c in e.mask_classes])
        factor *= 2
    return None


def _reduction(msg: rpb.ExampleImage, e: Example) -> int:
    """How many times ``msg`` shows ``e``'s images reduced."""
    with Image.open(io.BytesIO(msg.original_png)) as im:
        shown = im.size[0]
    return max(1, round(np.asarray(e.original).shape[1] / max(shown, 1)))


def _encoded(e: Example, factor: int) -> rpb.ExampleImage | None:
    try:
        return example_image(e, factor=factor)
    except (ValueError, KeyError, OSError):
        return None


def _side(e: Example) -> int:
    return int(max(np.asarray(e.original).shape[:2], default=0))


def example_images(examples: Sequence[Example]) -> list[rpb.ExampleImage]:
    """The examples that fit the report, in their order: at most :data:`EXAMPLE_COUNT` and
    :data:`EXAMPLES_TOTAL_BYTES` of PNG together. Attacks first, then failure points, each
    at full size unless what is left of the budget needs it reduced; then the corruption
    sweep, all its examples reduced alike (2, 4, ... times, down to a 32-pixel side) until
    they fit together, so every setting the report's tables list keeps its picture (the
    same clean photo on every cell used to crowd out the last corruptions). One that cannot
    be made, or fits in no size, is left out."""
    first = {"attack": 0, "degradation": 1}
    order = sorted(range(len(examples)), key=lambda k: (first.get(examples[k].kind, 2), k))
    kept: dict[int, rpb.ExampleImage] = {}
    total = 0
    for k in [k for k in order if examples[k].kind in first][:EXAMPLE_COUNT]:
        e, factor = examples[k], 1
        while (msg := _encoded(e, factor)) is not None:
            if total + _size(msg) <= EXAMPLES_TOTAL_BYTES:
                total += _size(msg)
                kept[k] = msg
                break
            factor = 2 * _reduction(msg, e)
            if _side(e) // factor < _MIN_REDUCED_SIDE:
                break
    sweep = [k for k in order if examples[k].kind not in first][:EXAMPLE_COUNT - len(kept)]
    factor = 1
    while sweep:
        msgs = {k: _encoded(examples[k], factor) for k in sweep}
        size = sum(_size(m) for m in msgs.values() if m is not None)
        if total + size <= EXAMPLES_TOTAL_BYTES or \
                max(_side(examples[k]) for k in sweep) // (2 * factor) < _MIN_REDUCED_SIDE:
            break
        factor *= 2
    for k in sweep:
        msg = msgs[k]
        if msg is not None and total + _size(msg) <= EXAMPLES_TOTAL_BYTES:
            total += _size(msg)
            kept[k] = msg
    return [kept[k] for k in sorted(kept)]
