"""Domain objects of the evaluation service -> the scoring and report services' messages.

Protobuf only (no gRPC); used by ``clients.py``. The plan's criteria sections (already
validated by services/common/criteria) become the typed criterion messages; recorded answers
become tensors; the facts of a run become the report's typed parts (the report service
writes the prose).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from fortis.common.v1 import common_pb2
from fortis.perturbation.v1 import perturbation_pb2 as ppb
from fortis.report.v1 import report_pb2 as rpb
from fortis.scoring.v1 import scoring_pb2 as spb
from fortis.services.common.codec import array_to_tensor, fill_tensor
from fortis.services.evaluation.answers import ClassAnswers, DetectionAnswers, SegmentationAnswers
from fortis.services.evaluation.ports import ReportInput, ScoringSetup, Setting, Summary
from google.protobuf import timestamp_pb2

__all__ = ["attack_criterion", "correctness_rule", "detection_criterion", "fill_reference",
           "report_parts", "scoring_setup", "segmentation_criterion", "setting", "summary"]

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
_TASKS = {"classification": common_pb2.TASK_TYPE_CLASSIFICATION,
          "detection": common_pb2.TASK_TYPE_DETECTION,
          "segmentation": common_pb2.TASK_TYPE_SEGMENTATION}
_OUTPUTS = {"full_scores": common_pb2.OUTPUT_KIND_FULL_SCORES,
            "top_k": common_pb2.OUTPUT_KIND_TOP_K_SCORES,
            "label_only": common_pb2.OUTPUT_KIND_LABEL_ONLY,
            "boxes": common_pb2.OUTPUT_KIND_BOXES, "masks": common_pb2.OUTPUT_KIND_MASKS}
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
    if s.task == "classification":
        msg.classification.labels.extend(spb.LabelSet(labels=[int(x) for x in lab]) for lab in s.truth)
        msg.correctness.CopyFrom(correctness_rule(s.criterion))
    elif s.task == "detection":
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


def report_parts(r: ReportInput) -> rpb.ReportParts:
    plan, t = r.plan, r.target
    target = rpb.TargetReport(
        name=plan.target.name, model_name=t.name, task=_TASKS.get(t.task, 0),
        endpoint=plan.target.endpoint, output_kind=_OUTPUTS.get(t.output_kind, 0),
        top_k=t.top_k, labels_count=len(t.labels), version=t.version,
        input_height=t.input_height, input_width=t.input_width, input_channels=t.input_channels)
    if plan.target.task == "classification":
        target.correctness.CopyFrom(correctness_rule(plan.correctness))
    elif plan.target.task == "detection":
        target.detection.CopyFrom(detection_criterion(plan.detection))
    else:
        target.segmentation.CopyFrom(segmentation_criterion(plan.segmentation))
    parts = rpb.ReportParts(
        plan_text=r.plan_text, target=target,
        roles=rpb.Roles(**{k: rpb.Party(name=getattr(plan, k).name,
                                        organisation=getattr(plan, k).organisation)
                           for k in ("requester", "tester", "provider")}),
        environment=rpb.Environment(seed=int(plan.seed), **dict(r.environment)),
        metrics=r.metrics,
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
    return parts
