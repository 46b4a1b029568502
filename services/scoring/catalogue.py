"""The scoring service's metric catalogue: every metric family callable by name.

``ListMetrics`` and ``fortis score --list`` read it; ``Compute`` and ``fortis score FILE`` run
one entry on *arrays* (numeric inputs: probability matrices, labels, images -- tensors on the
wire, numpy here) and *params* (JSON: thresholds, options, structured inputs). Adding a metric
needs no change to the contract, as for perturbation ids. Pure computation, no gRPC.

Conventions shared by every entry: probability matrices are M x C float (NaN = a class the
target did not return), label vectors M int, images N x H x W x C uint8 or float in [0, 1];
results are JSON-able trees in which "not applicable"/"not available" is an explicit
``None`` with a reason, never 0. Every numeric parameter has a documented bound
(``limits.PARAM_BOUNDS``, shown by ListMetrics) checked before any work, the arrays of one call
are bounded together, and long entries stop when ``should_stop`` says so.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fortis.services.common.errors import FieldViolation, InvalidArgument
from fortis.services.common.stopping import StopCheck, never
from fortis.services.scoring.limits import check_array_elements, check_params, describe

Arrays = Mapping[str, np.ndarray]
Params = Mapping[str, Any]


@dataclass(frozen=True, kw_only=True)
class Input:
    name: str
    kind: str                  # "array" | "param"
    description: str
    required: bool = True


@dataclass(frozen=True, kw_only=True)
class MetricSpec:
    id: str
    refs: tuple[str, ...]
    description: str
    inputs: tuple[Input, ...]
    run: Callable[..., dict[str, Any]]      # (arrays, params[, should_stop=] if stoppable)
    params: tuple[str, ...] = field(default_factory=tuple)   # optional params passed through
    stoppable: bool = False                 # run takes should_stop=

    def as_dict(self) -> dict[str, Any]:
        def text(i: Input) -> str:
            bound = describe(self.id, i.name) if i.kind == "param" else ""
            return f"{i.description} ({bound})" if bound else i.description
        return {"id": self.id, "refs": list(self.refs), "description": self.description,
                "inputs": [{"name": i.name, "kind": i.kind, "description": text(i),
                            "required": i.required} for i in self.inputs]}


def _a(name: str, description: str, required: bool = True) -> Input:
    return Input(name=name, kind="array", description=description, required=required)


def _p(name: str, description: str, required: bool = False) -> Input:
    return Input(name=name, kind="param", description=description, required=required)


def _opt(arrays: Arrays, name: str) -> np.ndarray | None:
    return arrays.get(name)


def _integer(value: Any, field: str) -> int:
    """A count, label or size read from params. Params are JSON, and over gRPC a
    google.protobuf.Struct whose numbers are all doubles, so an integer may arrive as 3.0;
    an integral number becomes an int, anything else is refused naming the field."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise InvalidArgument(field, f"must be an integer, got {value!r}")


def _integers(params: Params, keys: tuple[str, ...], prefix: str = "params") -> dict[str, Any]:
    """``params`` with the listed keys (where present and not null) read by :func:`_integer`."""
    return {k: (_integer(v, f"{prefix}.{k}") if k in keys and v is not None else v)
            for k, v in params.items()}


def _label_tree(value: Any, field: str) -> Any:
    """A label, a list of acceptable labels or a list of label sets, with integral labels
    as ints (other shapes are left to the correctness code to refuse)."""
    if isinstance(value, list):
        return [_label_tree(v, f"{field}[{n}]") for n, v in enumerate(value)]
    return _integer(value, field) if isinstance(value, numbers.Real) else value


# -- adapters ---------------------------------------------------------------------------------

def _ndcg(arrays: Arrays, params: Params) -> dict[str, Any]:
    from fortis.services.scoring.ranking import ndcg_batch
    params = _integers(params, ("positions", "max_k1", "max_k2"))
    return ndcg_batch(arrays["perturbed_probs"], benign_logits=_opt(arrays, "benign_logits"),
                      benign_probs=_opt(arrays, "benign_probs"),
                      **{k: params[k] for k in ("gamma_b", "gamma_a", "positions", "max_k1", "max_k2")
                         if k in params})


def _drr(arrays: Arrays, params: Params) -> dict[str, Any]:
    from fortis.services.scoring.ranking import drr_batch
    params = _integers(params, ("k",))
    return drr_batch(arrays["perturbed_probs"], arrays["benign_class"],
                     **{k: params[k] for k in ("k",) if k in params})


def _levels(arrays: Arrays, prefix: str) -> dict[int, np.ndarray] | None:
    out: dict[int, np.ndarray] = {}
    for name, arr in arrays.items():
        if name.startswith(prefix + "@"):
            lv = name[len(prefix) + 1:]
            if not lv.isdigit():
                raise InvalidArgument(f"arrays.{name}", f"level after '@' must be an integer, got '{lv}'")
            out[int(lv)] = arr
    return out or None


def _profile(arrays: Arrays, params: Params) -> dict[str, Any]:
    from fortis.services.scoring.profiles import FAILURE_THRESHOLDS, degradation_profile
    true = arrays["true_labels"]
    params = _integers(params, ("num_classes",))
    ids = params.get("image_ids") or [f"img-{i}" for i in range(len(true))]
    changes = params.get("changes")
    if isinstance(changes, Mapping):
        changes = {int(k): v for k, v in changes.items()}
    return degradation_profile(image_ids=list(ids), true_labels=true,
                               labels=_levels(arrays, "labels"), probs=_levels(arrays, "probs"),
                               changes=changes,
                               thresholds=tuple(params.get("thresholds", FAILURE_THRESHOLDS)),
                               num_classes=params.get("num_classes"))


def _capability(arrays: Arrays, params: Params) -> dict[str, Any]:
    from fortis.services.scoring.canary import model_capability
    return model_capability(arrays["labels"], arrays["clean"])


def _attack_effect(arrays: Arrays, params: Params) -> dict[str, Any]:
    from fortis.services.scoring.canary import attack_effect
    transfer = None
    others = sorted({n.split("@", 1)[1] for n in arrays if n.startswith(("other_clean@", "other_adversarial@"))})
    if others:
        transfer = {}
        for name in others:
            for part in ("clean", "adversarial"):
                if f"other_{part}@{name}" not in arrays:
                    raise InvalidArgument(f"arrays.other_{part}@{name}", "give both other_clean@NAME and other_adversarial@NAME")
            transfer[name] = {"clean": arrays[f"other_clean@{name}"],
                              "adversarial": arrays[f"other_adversarial@{name}"]}
    return attack_effect(arrays["labels"], arrays["clean"], arrays["adversarial"],
                         target_labels=_opt(arrays, "target_labels"), transfer=transfer)


def _attack_cost(arrays: Arrays, params: Params) -> dict[str, Any]:
    from fortis.services.scoring.canary import attack_cost
    if "kind" not in params:
        raise InvalidArgument("params.kind", "required: white-box, transfer, score, decision or black-box")
    return attack_cost(kind=params["kind"], seconds=_opt(arrays, "seconds"),
                       qnc_forward=_opt(arrays, "qnc_forward"), qnc_backward=_opt(arrays, "qnc_backward"),
                       include=_opt(arrays, "include"), ctc_peers=params.get("ctc_peers"))


def _perturbation_cost(arrays: Arrays, params: Params) -> dict[str, Any]:
    from fortis.services.scoring.canary import perturbation_cost
    return perturbation_cost(arrays["clean"], arrays["adversarial"], include=_opt(arrays, "include"),
                             **{k: params[k] for k in ("change_tolerance", "l0_denominator") if k in params})


def _defence(arrays: Arrays, params: Params) -> dict[str, Any]:
    from fortis.services.scoring.canary import defence_effect
    return defence_effect(arrays["labels"], baseline_clean=arrays["baseline_clean"],
                          defended_clean=arrays["defended_clean"],
                          baseline_adv=_opt(arrays, "baseline_adv"), defended_adv=_opt(arrays, "defended_adv"),
                          baseline_attack=params.get("baseline_attack"),
                          defended_attack=params.get("defended_attack"))


def _matrix(arrays: Arrays, params: Params) -> Any:
    from fortis.services.scoring.twoway import DataMatrix
    for key in ("attacks", "models"):
        if not isinstance(params.get(key), list):
            raise InvalidArgument(f"params.{key}", "required: a list of names")
    return DataMatrix(attacks=params["attacks"], models=params["models"], values=arrays["values"],
                      metric=str(params.get("metric", "MR")),
                      higher_is_more_effective=bool(params.get("higher_is_more_effective", True)))


def _twoway(arrays: Arrays, params: Params) -> dict[str, Any]:
    from fortis.services.scoring.twoway import transfer_heatmap, transfer_summary, two_way
    data = _matrix(arrays, params)
    out = {"two_way": two_way(data).to_dict(), "transfer": transfer_summary(data).to_dict()}
    if params.get("heatmaps", True):
        out["heatmaps"] = {a: transfer_heatmap(data, a, render_svg=bool(params.get("svg", False))).to_dict()
                           for a in data.attacks}
    return out


def _fast_rank(arrays: Arrays, params: Params) -> dict[str, Any]:
    from fortis.services.scoring.twoway import fast_rank_attack, fast_rank_model
    data = _matrix(arrays, params)
    name, kind = params.get("new_name"), params.get("new_kind")
    if not isinstance(name, str) or not name:
        raise InvalidArgument("params.new_name", "required: the new model's or attack's name")
    if kind == "model":
        if "white_box" not in arrays:
            raise InvalidArgument("arrays.white_box", "required for a new model: K values of each attack crafted and evaluated on it")
        return fast_rank_model(data, name, white_box=arrays["white_box"],
                               crafted_on_new=_opt(arrays, "crafted_on_new"),
                               evaluated_on_new=_opt(arrays, "evaluated_on_new")).to_dict()
    if kind == "attack":
        if "new_values" not in arrays:
            raise InvalidArgument("arrays.new_values", "required for a new attack: its M x M matrix")
        return fast_rank_attack(data, name, values=arrays["new_values"]).to_dict()
    raise InvalidArgument("params.new_kind", f"must be 'model' or 'attack', got {kind!r}")


def _irt(arrays: Arrays, params: Params, should_stop: StopCheck = never) -> dict[str, Any]:
    from fortis.services.common.seeding import rng_for
    from fortis.services.scoring.irt import IRTConfig, Metric, two_layer_irt
    subjects = params.get("subjects")
    if not isinstance(subjects, list) or not subjects:
        raise InvalidArgument("params.subjects", "required: the names of the models (or attacks) scored")
    items = params.get("metrics")
    if not isinstance(items, list) or not items:
        raise InvalidArgument("params.metrics", "required: [{name, category, values, higher_is_better}]")
    metrics = []
    for i, m in enumerate(items):
        if not isinstance(m, Mapping) or not {"name", "category", "values", "higher_is_better"} <= set(m):
            raise InvalidArgument(f"params.metrics[{i}]", "needs name, category, values, higher_is_better")
        metrics.append(Metric(name=str(m["name"]), category=str(m["category"]),
                              values=[float("nan") if v is None else float(v) for v in m["values"]],
                              higher_is_better=bool(m["higher_is_better"])))
    params = _integers(params, ("chain_length", "burn_in", "seed"))
    steps = ("step_theta", "step_a", "step_b", "step_c")
    cfg = IRTConfig(**{k: params[k] for k in ("chain_length", "burn_in") if k in params},
                    **{k: float(params[k]) for k in steps if params.get(k) is not None})
    rng = rng_for(params.get("seed", 0), "irt")
    return two_layer_irt([str(x) for x in subjects], metrics, rng, cfg,
                         should_stop=should_stop).to_dict()


def _pertknob_stats(arrays: Arrays, params: Params) -> dict[str, Any]:
    """PER-4 statistics over recorded PertKnob results (the search runs in the perturbation
    service as the ``pertknob`` attack; this entry only reads its results)."""
    from fortis.services.scoring.pertknob import STATUSES, SearchRecord, property_robustness
    rows = params.get("results")
    if not isinstance(rows, list):
        raise InvalidArgument("params.results", "required: [{status, l2, epsilon, queries}] per image")
    results = []
    for i, r in enumerate(rows):
        if not isinstance(r, Mapping) or r.get("status") not in STATUSES:
            raise InvalidArgument(f"params.results[{i}].status", f"one of {', '.join(STATUSES)}")
        results.append(SearchRecord(status=r["status"], epsilon=r.get("epsilon"), l2=r.get("l2"),
                                    queries=int(r.get("queries", 0))))
    return property_robustness(results, threshold=params.get("threshold")).to_dict()


def _test_records(params: Params, pred: Callable[[Any, str], Any]) -> list[Any]:
    from fortis.services.scoring.outcomes import TestRecord
    tests = params.get("tests")
    if not isinstance(tests, list) or not tests:
        raise InvalidArgument("params.tests", "required: [{kind, perturbation_id, severity, predictions}]")
    out = []
    for n, t in enumerate(tests):
        f = f"params.tests[{n}]"
        if not isinstance(t, Mapping) or t.get("kind") not in ("clean", "corruption", "attack"):
            raise InvalidArgument(f"{f}.kind", "must be clean, corruption or attack")
        preds = t.get("predictions") or {}
        if not isinstance(preds, Mapping):
            raise InvalidArgument(f"{f}.predictions", "must map image id -> prediction")
        out.append(TestRecord(
            kind=t["kind"], perturbation_id=str(t.get("perturbation_id", "")),
            severity=_integer(t.get("severity", 0), f"{f}.severity"),
            predictions={str(i): pred(p, f"{f}.predictions.{i}") for i, p in preds.items()},
            queries={str(k): _integer(v, f"{f}.queries.{k}")
                     for k, v in (t.get("queries") or {}).items()},
            success={str(k): bool(v) for k, v in (t.get("success") or {}).items()},
            query_budget=_integer(t.get("query_budget", 0), f"{f}.query_budget"),
            image_ids=tuple(str(x) for x in t.get("image_ids") or ())))
    return out


def _mapping(params: Params) -> Any:
    from fortis.services.scoring.correctness import LabelMapping
    lm = params.get("label_map")
    if isinstance(lm, Mapping):
        lm = {k: _label_tree(v, f"params.label_map.{k}") for k, v in lm.items()}
    return LabelMapping.from_dict(lm, field="params.label_map") if lm else None


def _class_pred(p: Any, f: str) -> Any:
    from fortis.services.scoring.ieee import ClassPrediction

    def one(x: Any) -> ClassPrediction:
        if not isinstance(x, Mapping):
            raise InvalidArgument(f, "a prediction is {labels, scores, error}")
        sc = x.get("scores")
        return ClassPrediction(labels=tuple(_integer(v, f"{f}.labels")
                                            for v in x.get("labels") or ()),
                               scores=tuple(float(v) for v in sc) if sc else None,
                               error=x.get("error") or None)
    return [one(x) for x in p] if isinstance(p, list) else one(p)


def _ieee_classification(arrays: Arrays, params: Params) -> dict[str, Any]:
    from fortis.services.scoring.correctness import AggregationRule
    from fortis.services.scoring.ieee import CorrectnessRule
    from fortis.services.scoring.outcomes import score_classification
    rule = params.get("rule") or {}
    if not isinstance(rule, Mapping):
        raise InvalidArgument("params.rule", "must be a mapping {mode, k, threshold, aggregate, q}")
    rule_d = _integers(rule, ("k", "q"), "params.rule")
    agg = AggregationRule.from_dict(rule_d, prefix="params.rule")
    rule = CorrectnessRule.from_dict({k: v for k, v in rule_d.items() if k in ("mode", "k", "threshold")})
    labels = params.get("labels")
    if not isinstance(labels, Mapping) or not labels:
        raise InvalidArgument("params.labels", "required: image id -> label(s)")
    return score_classification(rule, {str(k): _label_tree(v, f"params.labels.{k}")
                                       for k, v in labels.items()},
                                _test_records(params, _class_pred), aggregate=agg,
                                label_mapping=_mapping(params))


def _detections(x: Any, f: str) -> Any:
    from fortis.services.scoring.correctness import Detections
    if not isinstance(x, Mapping):
        raise InvalidArgument(f, "detections are {boxes, labels, scores, box_format, label_base, image_size}")
    size = x.get("image_size")
    return Detections(boxes=np.asarray(x.get("boxes") or np.zeros((0, 4)), dtype=np.float64).reshape(-1, 4),
                      labels=np.asarray(_label_tree(list(x.get("labels") or []), f"{f}.labels"),
                                        dtype=np.int64),
                      scores=None if x.get("scores") is None else np.asarray(x["scores"], dtype=np.float64),
                      box_format=str(x.get("box_format", "xyxy")),
                      label_base=_integer(x.get("label_base", 0), f"{f}.label_base"),
                      image_size=tuple(size) if size else None, error=x.get("error") or None)


def _ieee_detection(arrays: Arrays, params: Params) -> dict[str, Any]:
    from fortis.services.scoring.correctness import DetectionCriterion
    from fortis.services.scoring.outcomes import score_detection
    crit_d = params.get("criterion")
    if isinstance(crit_d, Mapping):
        crit_d = _integers(crit_d, ("k", "q"), "params.criterion")
    crit = DetectionCriterion.from_dict(crit_d, prefix="params.criterion")
    truths = params.get("truths")
    if not isinstance(truths, Mapping) or not truths:
        raise InvalidArgument("params.truths", "required: image id -> ground-truth detections")
    return score_detection(crit, {str(k): _detections(v, f"params.truths.{k}") for k, v in truths.items()},
                           _test_records(params, _detections), label_mapping=_mapping(params))


def _ieee_segmentation(arrays: Arrays, params: Params) -> dict[str, Any]:
    from fortis.services.scoring.correctness import SegmentationCriterion, SegmentationPrediction
    from fortis.services.scoring.outcomes import TestRecord, score_segmentation
    crit_d = params.get("criterion") or {}
    if isinstance(crit_d, Mapping):
        crit_d = {**_integers(crit_d, ("ignore_label",), "params.criterion"),
                  **({"classes": _label_tree(crit_d["classes"], "params.criterion.classes")}
                     if isinstance(crit_d.get("classes"), list) else {})}
    crit = SegmentationCriterion.from_dict(crit_d, prefix="params.criterion")
    truth = arrays["truth"]
    if truth.ndim != 3:
        raise InvalidArgument("arrays.truth", f"must be N x H x W label maps, got shape {list(truth.shape)}")
    ids = [str(i) for i in params.get("image_ids") or [f"img-{n}" for n in range(truth.shape[0])]]
    if len(ids) != truth.shape[0]:
        raise InvalidArgument("params.image_ids", f"{len(ids)} ids for {truth.shape[0]} truth maps")
    tests = params.get("tests")
    if not isinstance(tests, list) or not tests:
        raise InvalidArgument("params.tests", "required: [{kind, perturbation_id, severity}], masks in arrays masks@<index>")
    records = []
    for n, t in enumerate(tests):
        masks = arrays.get(f"masks@{n}")
        if masks is None or masks.shape != truth.shape:
            raise InvalidArgument(f"arrays.masks@{n}", f"required: N x H x W predicted label maps like arrays.truth {list(truth.shape)}")
        records.append(TestRecord(kind=str(t.get("kind")), perturbation_id=str(t.get("perturbation_id", "")),
                                  severity=_integer(t.get("severity", 0), f"params.tests[{n}].severity"),
                                  predictions={i: SegmentationPrediction(mask=masks[k]) for k, i in enumerate(ids)}))
    return score_segmentation(crit, {i: truth[k] for k, i in enumerate(ids)}, records,
                              label_mapping=_mapping(params))


_PROBS = "M x C probabilities (NaN = class not returned), or M labels for a labels-only target"

METRICS: dict[str, MetricSpec] = {m.id: m for m in (
    MetricSpec(id="ieee.classification", refs=("IEEE-M1", "IEEE-M7", "IEEE-C1", "IEEE-C2", "IEEE-C3", "IEEE-P6"),
               description="IEEE accuracy, robustness per setting, averages and worst case with 95% CIs, "
                           "re-scored from recorded classification answers",
               inputs=(_p("rule", "{mode: top1|topk|threshold, k, threshold, aggregate: all|at_least, q}"),
                       _p("labels", "image id -> label, [acceptable labels] or [[label set], ...]", True),
                       _p("tests", "[{kind: clean|corruption|attack, perturbation_id, severity, predictions: "
                                   "{image id: {labels, scores, error}}, success, queries, query_budget}]", True),
                       _p("label_map", "dataset label -> service label(s) (IEEE-P6)")),
               run=_ieee_classification),
    MetricSpec(id="ieee.detection", refs=("IEEE-M1", "IEEE-M7", "IEEE-C4"),
               description="IEEE metrics for an object detector: ground-truth boxes matched by IoU with "
                           "class agreement, then Q-of-s over the objects",
               inputs=(_p("criterion", "{mode: threshold|top1|topk, k, iou_threshold, confidence_threshold, aggregate, q}"),
                       _p("truths", "image id -> {boxes, labels, box_format, label_base, image_size}", True),
                       _p("tests", "[{kind, perturbation_id, severity, predictions: {image id: {boxes, labels, "
                                   "scores, box_format, label_base, image_size, error}}}]", True),
                       _p("label_map", "dataset label -> service label(s)")),
               run=_ieee_detection),
    MetricSpec(id="ieee.segmentation", refs=("IEEE-M1", "IEEE-M7", "IEEE-C5"),
               description="IEEE metrics for a segmenter: an image is correct iff the mIoU over the "
                           "classes of interest exceeds the threshold",
               inputs=(_a("truth", "N x H x W ground-truth label maps"),
                       _a("masks@I", "N x H x W predicted label maps of test I"),
                       _p("criterion", "{classes, miou_threshold, ignore_label, all_absent}", True),
                       _p("tests", "[{kind, perturbation_id, severity}] in the order of masks@0, masks@1, ...", True),
                       _p("image_ids", "N image ids"), _p("label_map", "dataset label -> service label")),
               run=_ieee_segmentation),
    MetricSpec(id="ndcg", refs=("RANK-1", "RANK-3"),
               description="NDCG per rank position and NDCG@1 of perturbed vs benign outputs (Brama et al.)",
               inputs=(_a("perturbed_probs", "M x C post-softmax probabilities on the perturbed images"),
                       _a("benign_logits", "M x C pre-softmax outputs on the benign images", False),
                       _a("benign_probs", "M x C probabilities on the benign images (if no logits)", False),
                       _p("gamma_b", "benign probability floor (default 0.01)"),
                       _p("gamma_a", "perturbed probability floor (default 0.001)"),
                       _p("positions", "rank positions reported (default 10)")),
               run=_ndcg),
    MetricSpec(id="drr", refs=("RANK-2", "RANK-3"),
               description="defence reciprocal rank DRR@k of the benign class in the perturbed output",
               inputs=(_a("perturbed_probs", "M x C probabilities on the perturbed images"),
                       _a("benign_class", "M benign (clean-predicted) classes"),
                       _p("k", "cut-off (default 5)")),
               run=_drr),
    MetricSpec(id="degradation_profile", refs=("DEG-2", "DEG-3", "DEG-4"),
               description="accuracy, mean true-label rank and probability per level on the images "
                           "correct at level 0, with failure points at 90/50/10%",
               inputs=(_a("true_labels", "M true labels"),
                       _a("labels@L", "M x K ranked labels at level L (L = 0, 1, ...; -1 padded)", False),
                       _a("probs@L", "M x C probabilities at level L", False),
                       _p("image_ids", "M image ids (default img-0 ..)"),
                       _p("changes", "{level: change made at that level} (e.g. fraction of pixels changed)"),
                       _p("thresholds", "failure thresholds (default [0.9, 0.5, 0.1])"),
                       _p("num_classes", "the target's number of classes")),
               run=_profile),
    MetricSpec(id="canary.model_capability", refs=("CAN-1",),
               description="CA, CF (macro F1), CC (mean true-class confidence)",
               inputs=(_a("labels", "N true labels"), _a("clean", _PROBS)),
               run=_capability),
    MetricSpec(id="canary.attack_effect", refs=("CAN-2",),
               description="MR, TAS, AIAC, ARTC, OTR on the images the model got right "
                           "(ACAMC needs a white-box model: in-process only)",
               inputs=(_a("labels", "N true labels"), _a("clean", _PROBS),
                       _a("adversarial", "the model's answers on the adversarial examples"),
                       _a("target_labels", "N targets of a targeted attack", False),
                       _a("other_clean@NAME", "another model's answers on the clean images (OTR)", False),
                       _a("other_adversarial@NAME", "that model's answers on the adversarial examples", False)),
               run=_attack_effect),
    MetricSpec(id="canary.attack_cost", refs=("CAN-3",),
               description="CTC (seconds and grade among peers), QNC-F, QNC-B from the ledger",
               inputs=(_p("kind", "white-box, transfer, score, decision or black-box", True),
                       _a("seconds", "N seconds per example", False),
                       _a("qnc_forward", "N forward queries per example (ledger)", False),
                       _a("qnc_backward", "N backward queries per example", False),
                       _a("include", "N booleans: the examples averaged over", False),
                       _p("ctc_peers", "{attack: mean seconds} of other attacks, for the grade")),
               run=_attack_cost),
    MetricSpec(id="canary.perturbation_cost", refs=("CAN-4",),
               description="AMD, AED, APCR, AED-FD low/high (Haar DWT), ALMS (MS-GMSD); ADMS "
                           "(DISTS) not available without user-supplied weights",
               inputs=(_a("clean", "N x H x W x C clean images"), _a("adversarial", "N x H x W x C adversarial images"),
                       _a("include", "N booleans: the examples averaged over", False),
                       _p("change_tolerance", "a value counts as changed above this (default 0)"),
                       _p("l0_denominator", "'size' (default) or 'nonzero'")),
               run=_perturbation_cost),
    MetricSpec(id="canary.defence_effect", refs=("CAN-5",),
               description="AV/FV/CV, RR/SR, ACV, ARAC/AITC between a baseline and a defended model",
               inputs=(_a("labels", "N true labels"), _a("baseline_clean", _PROBS), _a("defended_clean", _PROBS),
                       _a("baseline_adv", "baseline's answers on its adversarial examples", False),
                       _a("defended_adv", "defended model's answers on its adversarial examples", False),
                       _p("baseline_attack", "baseline attack metrics (MR, AMD, ...)"),
                       _p("defended_attack", "defended attack metrics")),
               run=_defence),
    MetricSpec(id="twoway", refs=("CAN-7",),
               description="two-way evaluation of a K attacks x M models x M models matrix: models "
                           "ranked by robustness, attacks by effectiveness, transfer heat maps",
               inputs=(_a("values", "K x M x M metric values (crafted on model i, evaluated on j; NaN = not run)"),
                       _p("attacks", "K attack names", True), _p("models", "M model names", True),
                       _p("metric", "the metric's name (default MR)"),
                       _p("higher_is_more_effective", "default true"),
                       _p("heatmaps", "include heat maps (default true)"),
                       _p("svg", "render each heat map as SVG (default false)")),
               run=_twoway),
    MetricSpec(id="twoway.fast_rank", refs=("CAN-10",),
               description="rank a new model or attack against a stored baseline matrix without re-running it",
               inputs=(_a("values", "baseline K x M x M matrix"),
                       _p("attacks", "K attack names", True), _p("models", "M model names", True),
                       _p("metric", "the metric's name"), _p("higher_is_more_effective", "default true"),
                       _p("new_name", "the new entry's name", True), _p("new_kind", "'model' or 'attack'", True),
                       _a("white_box", "new model: K values (crafted and evaluated on it)", False),
                       _a("crafted_on_new", "new model: K x M (crafted on it, evaluated on each baseline model)", False),
                       _a("evaluated_on_new", "new model: K x M (crafted on each baseline model, evaluated on it)", False),
                       _a("new_values", "new attack: M x M", False)),
               run=_fast_rank),
    MetricSpec(id="irt", refs=("CAN-8",),
               description="two-layer IRT 3PL scores (Metropolis-Hastings within Gibbs, seeded) of "
                           "models or attacks from their metrics, min-max normalised",
               inputs=(_p("subjects", "names of the models or attacks scored", True),
                       _p("metrics", "[{name, category, values (one per subject, null = missing), higher_is_better}]", True),
                       _p("seed", "sampler seed (default 0)"),
                       _p("chain_length", "MH chain length L (default 7000)"),
                       _p("burn_in", "discarded steps (default 3000)"),
                       _p("step_theta", "proposal scale C_theta (default 1)"),
                       _p("step_a", "C_a (default 0.3)"), _p("step_b", "C_b (default 0.3)"),
                       _p("step_c", "C_c (default 0.03)")),
               run=_irt, stoppable=True),
    MetricSpec(id="pertknob.robustness", refs=("PER-4",),
               description="per-property robustness from PertKnob results: mean and median minimal "
                           "L2, share never fooled, fooling rate at threshold T",
               inputs=(_p("results", "[{status, epsilon, l2, queries}] per image (PER-3 search results)", True),
                       _p("threshold", "T for the fooling rate (default: the mean minimal L2)")),
               run=_pertknob_stats),
)}


def register(spec: MetricSpec) -> None:
    """Add an entry (used by the modules that define further metric families)."""
    if spec.id in METRICS:
        raise RuntimeError(f"metric '{spec.id}' registered twice")
    METRICS[spec.id] = spec


def metric_spec(metric_id: str) -> MetricSpec:
    spec = METRICS.get(metric_id)
    if spec is None:
        raise InvalidArgument("metric", f"unknown metric '{metric_id}'; known: {', '.join(sorted(METRICS))}")
    return spec


def _check_inputs(spec: MetricSpec, arrays: Arrays, params: Params) -> None:
    problems: list[FieldViolation] = []
    array_names = {i.name for i in spec.inputs if i.kind == "array"}
    param_names = {i.name for i in spec.inputs if i.kind == "param"}
    patterns = {n.split("@")[0] for n in array_names if "@" in n}
    for name in arrays:
        if name not in array_names and name.split("@")[0] not in patterns:
            problems.append(FieldViolation(f"arrays.{name}", f"not an input of {spec.id}; inputs: "
                                           f"{', '.join(sorted(array_names))}"))
    for name in params:
        if name not in param_names:
            problems.append(FieldViolation(f"params.{name}", f"not a parameter of {spec.id}; "
                                           f"parameters: {', '.join(sorted(param_names)) or 'none'}"))
    for i in spec.inputs:
        if i.required and "@" not in i.name:
            if (i.kind == "array" and i.name not in arrays) or (i.kind == "param" and i.name not in params):
                problems.append(FieldViolation(f"{i.kind}s.{i.name}", "required"))
    if problems:
        raise InvalidArgument.from_violations(problems)


def compute(metric_id: str, arrays: Arrays, params: Params | None = None, *,
            should_stop: StopCheck | None = None) -> dict[str, Any]:
    """Run one catalogue entry; returns a JSON-able tree (NaN/inf become None). Parameters
    and array sizes are checked against ``limits`` before any work; ``should_stop`` (default:
    never) is handed to the entries that can run long."""
    spec = metric_spec(metric_id)
    params = dict(params or {})
    _check_inputs(spec, arrays, params)
    check_params(spec.id, params)
    check_array_elements((name, a.shape) for name, a in arrays.items())
    stop = {"should_stop": should_stop} if spec.stoppable and should_stop is not None else {}
    try:
        result = spec.run(arrays, params, **stop)
    except (TypeError, KeyError) as exc:
        raise InvalidArgument("params", f"{spec.id}: bad inputs ({exc})") from None
    return jsonable(result)


def jsonable(x: Any) -> Any:
    """Plain JSON types; non-finite floats -> None."""
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, np.generic):
        return jsonable(x.item())
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if x is None or isinstance(x, bool | int | str):
        return x
    if hasattr(x, "as_dict"):
        return jsonable(x.as_dict())
    return repr(x)


def list_metrics() -> list[dict[str, Any]]:
    return [m.as_dict() for m in METRICS.values()]
