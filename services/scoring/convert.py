"""The one place where ``fortis.scoring.v1`` messages meet the scoring domain: a ScoreEvaluation
stream becomes an :class:`~fortis.services.scoring.evaluation_data.EvaluationSetup` and its
settings (tensors decoded with ``tensors.tensor_to_array``, enums read into the criteria's
strings), and the metric trees of ``evaluation_scoring.score_evaluation`` become the typed
ScoreEvaluationResponse. Conversion only: protobuf, no gRPC.

Every problem raises :class:`InvalidArgument` naming the request field as the caller wrote it
(``setup.correctness.k``, ``setting[3].classification.labels.data``); settings are numbered
from 0 in the order they arrive after the setup.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Final

import numpy as np
from fortis.core.criteria import CorrectnessRule
from fortis.core.task import Task
from fortis.core.tensors import tensor_to_array
from fortis.scoring.v1 import scoring_pb2 as pb
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.correctness import (
    DetectionCriterion,
    Detections,
    SegmentationCriterion,
)
from fortis.services.scoring.evaluation_data import (
    Answers,
    ClassificationAnswers,
    ClassificationTruth,
    Criterion,
    DetectionAnswers,
    DetectionTruth,
    EvaluationSetup,
    QueryOutcomes,
    SegmentationAnswers,
    SegmentationTruth,
    SettingData,
    Truth,
)

__all__ = ["read_evaluation", "response_from_scores", "setting_from_message",
           "setup_from_message"]

#: Most settings one ScoreEvaluation stream may carry (75 is a large plan).
MAX_SETTINGS: Final = 10_000

_MODES: Final = {pb.CORRECTNESS_MODE_UNSPECIFIED: "top1", pb.CORRECTNESS_MODE_TOP1: "top1",
                 pb.CORRECTNESS_MODE_TOPK: "topk", pb.CORRECTNESS_MODE_THRESHOLD: "threshold"}
_AGGREGATES: Final = {pb.AGGREGATE_MODE_UNSPECIFIED: "all", pb.AGGREGATE_MODE_ALL: "all",
                      pb.AGGREGATE_MODE_AT_LEAST: "at_least"}
_ABSENT: Final = {pb.ALL_ABSENT_POLICY_UNSPECIFIED: "correct",
                  pb.ALL_ABSENT_POLICY_CORRECT: "correct",
                  pb.ALL_ABSENT_POLICY_INCORRECT: "incorrect"}
_BOX_FORMATS: Final = {pb.BOX_FORMAT_UNSPECIFIED: "xyxy", pb.BOX_FORMAT_XYXY: "xyxy",
                       pb.BOX_FORMAT_XYWH: "xywh", pb.BOX_FORMAT_CXCYWH: "cxcywh",
                       pb.BOX_FORMAT_XYXY_NORMALISED: "xyxyn",
                       pb.BOX_FORMAT_XYWH_NORMALISED: "xywhn",
                       pb.BOX_FORMAT_CXCYWH_NORMALISED: "cxcywhn"}
_KINDS: Final = {pb.SETTING_KIND_CLEAN: "clean", pb.SETTING_KIND_CORRUPTION: "corruption",
                 pb.SETTING_KIND_TRANSFER_ATTACK: "transfer_attack",
                 pb.SETTING_KIND_QUERY_ATTACK: "query_attack",
                 pb.SETTING_KIND_DEGRADATION: "degradation"}
_KIND_ENUM: Final = {v: k for k, v in _KINDS.items()}
#: The criterion field that goes with each truth field.
_CRITERION_OF: Final = {Task.CLASSIFICATION: "correctness",
                        Task.DETECTION: "detection_criterion",
                        Task.SEGMENTATION: "segmentation_criterion"}


def _enum(table: Mapping[int, str], value: int, field: str) -> str:
    """An enum's domain string; a number the contract does not define gets the field named
    (the criteria then list the allowed values)."""
    out = table.get(value)
    if out is None:
        raise InvalidArgument(field, f"unknown enum value {value}")
    return out


# -- requests -> domain ---------------------------------------------------------------------

def read_evaluation(requests: Iterable[pb.ScoreEvaluationRequest]
                    ) -> tuple[EvaluationSetup, list[SettingData]]:
    """A ScoreEvaluation stream: the setup first, then one setting per message."""
    setup: EvaluationSetup | None = None
    settings: list[SettingData] = []
    for n, req in enumerate(requests):
        part = req.WhichOneof("part")
        if part == "setup":
            if setup is not None:
                raise InvalidArgument("setup", f"given again in message {n}: only the first "
                                               "message carries the setup")
            setup = setup_from_message(req.setup)
        elif setup is None:
            raise InvalidArgument("setup", "the first message must carry the setup")
        elif part == "setting":
            if len(settings) >= MAX_SETTINGS:
                raise InvalidArgument("setting", f"more than {MAX_SETTINGS} settings")
            settings.append(setting_from_message(req.setting, len(settings),
                                                 len(setup.image_ids)))
        else:
            raise InvalidArgument(f"setting[{len(settings)}]", f"message {n} carries neither "
                                                               "setup nor setting")
    if setup is None:
        raise InvalidArgument("setup", "empty stream: the first message must carry the setup")
    return setup, settings


def setup_from_message(msg: pb.ScoringSetup, field: str = "setup") -> EvaluationSetup:
    ids = tuple(msg.image_ids)
    m = len(ids)
    if m == 0:
        raise InvalidArgument(f"{field}.image_ids", "at least one image is needed (M >= 1)")
    which = msg.WhichOneof("truth")
    if which is None:
        raise InvalidArgument(f"{field}.truth", "set classification, detection or "
                                                "segmentation ground truth")
    task = Task(which)                  # the truth's oneof fields are named after the tasks
    crit_field = _CRITERION_OF[task]
    given = msg.WhichOneof("criterion")
    if given != crit_field:
        raise InvalidArgument(f"{field}.{crit_field}", f"required with {task} ground truth"
                                                       + (f" (got {given})" if given else ""))
    truth: Truth
    criterion: Criterion
    if task == Task.CLASSIFICATION:
        truth = _class_truth(msg.classification, m, f"{field}.classification")
        c = msg.correctness
        criterion = CorrectnessRule.from_dict(
            {"mode": _enum(_MODES, c.mode, f"{field}.correctness.mode"), "k": c.k or 5,
             "threshold": c.threshold}, prefix=f"{field}.correctness")
    elif task == Task.DETECTION:
        truth = _detection_truth(msg.detection, m, f"{field}.detection")
        d = msg.detection_criterion
        f = f"{field}.detection_criterion"
        crit: dict[str, Any] = {"mode": _enum(_MODES, d.mode, f"{f}.mode"), "k": d.k or 5,
                                "iou_threshold": d.iou_threshold,
                                "aggregate": _enum(_AGGREGATES, d.aggregate, f"{f}.aggregate"),
                                "q": d.q or 1}
        if d.HasField("confidence_threshold"):
            crit["confidence_threshold"] = d.confidence_threshold
        criterion = DetectionCriterion.from_dict(crit, prefix=f)
    else:
        truth = _segmentation_truth(msg.segmentation, m, f"{field}.segmentation")
        s = msg.segmentation_criterion
        f = f"{field}.segmentation_criterion"
        criterion = SegmentationCriterion.from_dict(
            {"classes": list(s.classes), "miou_threshold": s.miou_threshold,
             "ignore_label": s.ignore_label if s.HasField("ignore_label") else None,
             "all_absent": _enum(_ABSENT, s.all_absent, f"{f}.all_absent")}, prefix=f)
    if msg.ranking.num_classes < 0:
        raise InvalidArgument(f"{field}.ranking.num_classes", "must be >= 0")
    return EvaluationSetup(image_ids=ids, truth=truth, criterion=criterion,
                           ranking_enabled=msg.ranking.enabled,
                           ranking_reason=msg.ranking.reason,
                           num_classes=msg.ranking.num_classes, field=field)


def _class_truth(msg: pb.ClassificationTruth, m: int, field: str) -> ClassificationTruth:
    sets = msg.labels
    if len(sets) != m:
        raise InvalidArgument(f"{field}.labels", f"{len(sets)} label sets for {m} images")
    width = max((len(s.labels) for s in sets), default=1)
    out = np.full((m, max(width, 1)), -1, dtype=np.int64)
    for i, s in enumerate(sets):
        if not s.labels or min(s.labels) < 0:
            raise InvalidArgument(f"{field}.labels[{i}]", "needs at least one label, each >= 0")
        out[i, :len(s.labels)] = s.labels
    return ClassificationTruth(labels=out)


def _detection_truth(msg: pb.DetectionTruth, m: int, field: str) -> DetectionTruth:
    if len(msg.images) != m:
        raise InvalidArgument(f"{field}.images", f"{len(msg.images)} entries for {m} images")
    images = []
    for i, im in enumerate(msg.images):
        f = f"{field}.images[{i}]"
        boxes = tensor_to_array(im.boxes, f"{f}.boxes") if im.HasField("boxes") \
            else np.zeros((0, 4))
        if boxes.ndim != 2 or boxes.shape[1] != 4:
            raise InvalidArgument(f"{f}.boxes", f"must be [n, 4], got {list(boxes.shape)}")
        if len(im.labels) != len(boxes):
            raise InvalidArgument(f"{f}.labels", f"{len(im.labels)} labels for {len(boxes)} "
                                                 "boxes")
        if im.width < 0 or im.height < 0:
            raise InvalidArgument(f"{f}.width", "width and height must be >= 0")
        images.append(Detections(
            boxes=boxes, labels=np.asarray(im.labels, dtype=np.int64),
            box_format=_enum(_BOX_FORMATS, im.box_format, f"{f}.box_format"),
            label_base=im.label_base,
            image_size=(im.width, im.height) if im.width and im.height else None))
    return DetectionTruth(images=tuple(images))


def _segmentation_truth(msg: pb.SegmentationTruth, m: int, field: str) -> SegmentationTruth:
    f = f"{field}.class_maps"
    if not msg.HasField("class_maps"):
        raise InvalidArgument(f, "required: [M, height, width] class maps")
    maps = tensor_to_array(msg.class_maps, f)
    if maps.ndim != 3 or maps.shape[0] != m:
        raise InvalidArgument(f"{f}.shape", f"must be [{m}, height, width], got "
                                            f"{list(maps.shape)}")
    if not np.issubdtype(maps.dtype, np.integer):
        raise InvalidArgument(f"{f}.dtype", f"class maps must be integers, got {maps.dtype}")
    return SegmentationTruth(class_maps=maps)


def _tensor(msg: Any, name: str, field: str, *, required: bool) -> np.ndarray | None:
    if not msg.HasField(name):
        if required:
            raise InvalidArgument(f"{field}.{name}", "required")
        return None
    return tensor_to_array(getattr(msg, name), f"{field}.{name}")


def _answers(msg: pb.SettingAnswers, field: str) -> Answers | None:
    which = msg.WhichOneof("answers")
    f = f"{field}.{which}"
    if which == Task.CLASSIFICATION:
        c = msg.classification
        labels = _tensor(c, "labels", f, required=True)
        assert labels is not None
        return ClassificationAnswers(labels=labels,
                                     scores=_tensor(c, "scores", f, required=False))
    if which == Task.DETECTION:
        d = msg.detection
        counts = _tensor(d, "counts", f, required=True)
        assert counts is not None
        if not np.issubdtype(counts.dtype, np.integer):
            raise InvalidArgument(f"{f}.counts", f"must be integers, got {counts.dtype}")
        boxes = _tensor(d, "boxes", f, required=False)
        boxes = np.zeros((0, 4)) if boxes is None else boxes
        labels = _tensor(d, "labels", f, required=False)
        scores = _tensor(d, "scores", f, required=False)
        # no scores sent: NaN, "no score" to the matching (a confidence threshold refuses it)
        return DetectionAnswers(boxes=boxes,
                                labels=np.zeros(0, np.int64) if labels is None else labels,
                                scores=np.full(len(boxes), np.nan) if scores is None else scores,
                                counts=counts)
    if which == Task.SEGMENTATION:
        maps = _tensor(msg.segmentation, "class_maps", f, required=True)
        assert maps is not None
        return SegmentationAnswers(class_maps=maps)
    return None


def setting_from_message(msg: pb.SettingAnswers, index: int, m: int) -> SettingData:
    """One setting; ``m`` is the number of images of the setup (bounds ``image_index``)."""
    field = f"setting[{index}]"
    kind = _KINDS.get(msg.kind)
    if kind is None:
        raise InvalidArgument(f"{field}.kind", "must be CLEAN, CORRUPTION, TRANSFER_ATTACK, "
                                               f"QUERY_ATTACK or DEGRADATION, got {msg.kind}")
    index_arr = None
    if msg.image_index:
        index_arr = np.asarray(msg.image_index, dtype=np.int64)
        if index_arr.min() < 0 or index_arr.max() >= m:
            raise InvalidArgument(f"{field}.image_index", f"indices must lie in [0, {m - 1}]")
    query = None
    if msg.HasField("query_attack"):
        q = msg.query_attack
        query = QueryOutcomes(success=np.asarray(q.success, dtype=bool),
                              queries=np.asarray(q.queries, dtype=np.int64) if q.queries
                              else None, budget=int(q.query_budget))
    linf = l2 = None
    if msg.HasField("sizes") and (msg.sizes.linf or msg.sizes.l2):
        linf = np.asarray(msg.sizes.linf, dtype=np.float64)
        l2 = np.asarray(msg.sizes.l2, dtype=np.float64)
    fraction = None
    if msg.HasField("fraction_of_pixels_changed"):
        fraction = float(msg.fraction_of_pixels_changed)
        if not math.isfinite(fraction):
            raise InvalidArgument(f"{field}.fraction_of_pixels_changed", "must be a number")
    excluded = None
    if msg.excluded:
        n = m if index_arr is None else int(index_arr.size)
        if len(msg.excluded) != n:
            raise InvalidArgument(f"{field}.excluded", f"{len(msg.excluded)} entries for {n} "
                                                       "covered images (or none)")
        if kind not in ("transfer_attack", "query_attack"):
            raise InvalidArgument(f"{field}.excluded", "only an attack leaves images out")
        excluded = np.asarray(msg.excluded, dtype=bool)
    return SettingData(kind=kind, name=msg.name, level=msg.level, image_index=index_arr,
                       errors=tuple(msg.errors), answers=_answers(msg, field), query=query,
                       linf=linf, l2=l2, fraction_changed=fraction, excluded=excluded,
                       excluded_reason=msg.excluded_reason if excluded is not None else "",
                       field=field)


# -- metric trees -> response ---------------------------------------------------------------

def _rate(value: Any, ci95: Any, m: Any, correct: Any) -> pb.Rate:
    """A Rate; interval and numerator only alongside a value (IEEE-M8)."""
    r = pb.Rate(m=int(m or 0))
    if value is not None:
        r.value = float(value)
        if ci95:
            r.ci95_low, r.ci95_high = float(ci95[0]), float(ci95[1])
        if correct is not None:
            r.correct = int(correct)
    return r


def _average(node: Mapping[str, Any], m: Any = None, definition: str = "") -> pb.Average:
    a = pb.Average(n=int(node.get("n") or 0), definition=node.get("definition") or definition)
    if node.get("value") is not None:
        a.value = float(node["value"])
    m = node.get("m", m)
    if m is not None:
        a.m = int(m)
    return a


def _opt(msg: Any, **values: Any) -> None:
    """Set the optional scalar fields whose value is not None."""
    for k, v in values.items():
        if v is not None:
            setattr(msg, k, v)


def _worst(node: Mapping[str, Any]) -> pb.WorstCase:
    return pb.WorstCase(rate=_rate(node.get("value"), node.get("ci95"), node.get("m"),
                                   node.get("correct")),
                        n_settings=int(node.get("n_settings") or 0), over=node.get("over") or "")


def _attack(name: str, a: Mapping[str, Any]) -> pb.AttackMetrics:
    out = pb.AttackMetrics(
        name=name, kind=pb.ATTACK_SCORING_QUERY if a["kind"] == "query" else
        pb.ATTACK_SCORING_TRANSFER,
        robustness_adv=_rate(a["robustness_adv"], a["ci95"], a["m"], a["correct"]),
        success=_rate(a["success_rate"], a["success_rate_ci95"], a["success_rate_n"],
                      a["successes"]),
        errors=int(a["errors"]), error_images=list(a["error_images"]),
        clean_mismatches=int(a["clean_mismatches"]), excluded=int(a.get("excluded") or 0),
        excluded_reason=str(a.get("excluded_reason") or ""))
    _opt(out, mean_queries=a.get("mean_queries"), median_queries=a.get("median_queries"),
         mean_queries_successful=a.get("mean_queries_successful"),
         query_budget=a.get("query_budget"), mean_linf=a.get("mean_linf"),
         max_linf=a.get("max_linf"), mean_l2=a.get("mean_l2"),
         mean_l2_successful=a.get("mean_l2_successful"),
         median_l2_successful=a.get("median_l2_successful"),
         fooling_rate=a.get("fooling_rate"), fooling_threshold=a.get("fooling_threshold"),
         never_fooled=a.get("never_fooled"),
         unsuccessful_mean_l2=a.get("unsuccessful_mean_l2"),
         unsuccessful_max_linf=a.get("unsuccessful_max_linf"))
    out.success_by_queries.extend(pb.QueryCurvePoint(queries=int(q), success_rate=float(r))
                                  for q, r in a.get("success_by_queries") or ())
    return out


_SEVERITY_AVG: Final = ("mean over the corruptions at this severity of their robustness "
                        "(IEEE-M7)")


def ieee_message(t: Mapping[str, Any]) -> pb.IeeeMetrics:
    """The IEEE-M1..M8 tree of ``ieee.compute_ieee_metrics`` (plus attack distances)."""
    m = int(t["m"])
    acc = t["accuracy"]
    out = pb.IeeeMetrics(m=m, accuracy=_rate(acc["value"], acc["ci95"], acc["m"],
                                             acc["correct"]))
    for name, node in t["corruptions"].items():
        out.corruptions.append(pb.CorruptionMetrics(
            name=name, mean_robustness=float(node["mean"]["robustness"]),
            severities=[pb.SeverityRobustness(severity=int(s), robustness=_rate(
                node[str(s)]["robustness"], node[str(s)]["ci95"], node[str(s)]["m"],
                node[str(s)]["correct"])) for s in node["mean"]["severities"]]))
    out.average_robustness_corr.CopyFrom(_average(t["average_robustness_corr"]))
    out.worstcase_robustness_corr.CopyFrom(_worst(t["worstcase_robustness_corr"]))
    worst_by = t["worstcase_robustness_corr_by_severity"]
    for s, avg in t["average_robustness_corr_by_severity"].items():
        w = worst_by[s]
        out.by_severity.append(pb.SeveritySummary(
            severity=int(s), average=_average(avg, m, _SEVERITY_AVG),
            worst_case=_rate(w["value"], w["ci95"], w["m"], w["correct"]),
            n_settings=int(w["n_settings"])))
    out.attacks.extend(_attack(name, a) for name, a in t["attacks"].items())
    adv = t["average_robustness_adv"]
    out.average_robustness_adv.CopyFrom(_average(adv))
    for name, n in (adv.get("m_per_attack") or {}).items():
        out.m_per_attack[name] = int(n)
    out.worstcase_robustness_adv.CopyFrom(_worst(t["worstcase_robustness_adv"]))
    return out


def ranking_message(r: Mapping[str, Any]) -> pb.Ranking:
    """RANK-1..3. A position no image reached has no mean: NaN in ``ndcg_at``."""
    out = pb.Ranking(applicable=bool(r["applicable"]), reason=r.get("reason") or "",
                     gamma_b=float(r.get("gamma_b") or 0.0),
                     gamma_a=float(r.get("gamma_a") or 0.0), drr_k=int(r.get("drr_k") or 0))
    for name, s in r.get("settings", {}).items():
        sr = pb.SettingRanking(name=name, kind=_KIND_ENUM[s["kind"]], m=int(s["m"]),
                               ndcg_at=[math.nan if v is None else float(v)
                                        for v in s.get("ndcg_at") or []],
                               drr_n=int(s.get("drr_n") or 0), applicable=bool(s["applicable"]))
        _opt(sr, ndcg_1=s.get("ndcg_1"), drr=s.get("drr_5"))
        out.settings.append(sr)
    return out


def _point(row: Mapping[str, Any], **extra: Any) -> pb.ProfilePoint:
    p = pb.ProfilePoint(level=int(row["level"]), reason=row.get("reason") or "", **extra)
    _opt(p, value=row.get("value"))
    return p


def degradation_message(name: str, p: Mapping[str, Any]) -> pb.DegradationProfile:
    """DEG-2..4 of one operator (the ``degradation_profile`` catalogue tree)."""
    out = pb.DegradationProfile(name=name, m=int(p["m"]), m_used=int(p["m_used"]),
                                applicable=bool(p["applicable"]), reason=p.get("reason") or "")
    for row in p["accuracy"]:
        pt = _point(row, n=int(row["m"]))
        if row.get("value") is not None:
            pt.correct = int(row["correct"])
            pt.ci95_low, pt.ci95_high = (float(x) for x in row["ci95"])
        out.accuracy.append(pt)
    for row in p["rank"]:
        pt = _point(row, n=int(row["n"]), censored=int(row["censored"]))
        _opt(pt, at_least=row.get("at_least"))
        out.rank.append(pt)
    out.probability.extend(_point(row, n=int(row["n"]), missing=int(row["missing"]))
                           for row in p["probability"])
    for t in p["thresholds"]:
        fp = p["failure_points"].get(str(t))
        if fp is None:
            out.failure_points.append(pb.FailurePoint(threshold=float(t), reached=False))
            continue
        f = pb.FailurePoint(threshold=float(t), reached=True, level=int(fp["level"]),
                            accuracy=float(fp["accuracy"]), ci95_low=float(fp["ci95"][0]),
                            ci95_high=float(fp["ci95"][1]),
                            example_image=str(fp["example_image"]))
        change = fp.get("change")
        if isinstance(change, Mapping) and change.get("fraction_of_pixels_changed") is not None:
            f.fraction_of_pixels_changed = float(change["fraction_of_pixels_changed"])
        out.failure_points.append(f)
    for row in p.get("changes") or []:
        change = row.get("change")
        if isinstance(change, Mapping) and change.get("fraction_of_pixels_changed") is not None:
            out.fraction_of_pixels_changed[int(row["level"])] = float(
                change["fraction_of_pixels_changed"])
    return out


def query_errors_message(q: Mapping[str, Any]) -> pb.QueryErrors:
    return pb.QueryErrors(total=int(q["total"]), settings=[
        pb.SettingErrors(name=name, errors=int(s["errors"]), of=int(s["of"]),
                         examples=[f"{e['image_id']}: {e['error']}" for e in s["examples"]])
        for name, s in q["settings"].items()])


def verdicts_message(v: Mapping[str, Any]) -> pb.SettingVerdicts:
    """One setting's per-image verdicts, packed 8 to a byte (10,000 images x 75 settings
    make about 94 KB)."""
    correct = np.asarray(v["correct"], dtype=bool).reshape(-1)
    return pb.SettingVerdicts(kind=_KIND_ENUM[v["kind"]], name=str(v["name"]),
                              level=int(v["level"]), count=int(correct.size),
                              correct=np.packbits(correct).tobytes())


def response_from_scores(scores: Mapping[str, Any]) -> pb.ScoreEvaluationResponse:
    """The typed response of ``evaluation_scoring.score_evaluation``'s result."""
    return pb.ScoreEvaluationResponse(
        ieee=ieee_message(scores["ieee"]), ranking=ranking_message(scores["ranking"]),
        degradation=[degradation_message(name, p) for name, p in scores["degradation"].items()],
        query_errors=query_errors_message(scores["query_errors"]),
        verdicts=[verdicts_message(v) for v in scores.get("verdicts", ())])
