"""From recorded predictions to the IEEE metrics tree. Domain code: no gRPC.

Applies the plan's correctness rule to every recorded answer, one whole test setting at a
time (vectorised: ``fortis.services.scoring.correctness``), and hands the Clean/Corr/Adv
result matrices to ``ieee.compute_ieee_metrics``. The same loop serves every service type;
only the judge differs:

- :func:`score_classification`: IEEE-C1/C2 per label set, IEEE-C3 over several label sets,
  IEEE-P6 label mapping;
- :func:`score_detection`: IEEE-C4 (boxes matched one-to-one by IoU, class agreeing) and
  IEEE-C3 over the objects;
- :func:`score_segmentation`: IEEE-C5 (mIoU over the classes of interest > threshold).

All three return the same tree (IEEE-M1..M7 with IEEE-M8 intervals). Query attacks (IEEE-A8)
are untargeted attacks: an image stays correct (Adv_Result = 1) when it was right on the
clean image and the attack did not mislead the target within its budget. An attack limited
by the plan to a subset of the images is scored over that subset only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.correctness import (
    AggregationRule,
    DetectionBatch,
    DetectionCriterion,
    Detections,
    LabelMapping,
    SegmentationCriterion,
    SegmentationPrediction,
    class_predictions_correct,
    class_truth_array,
    detection_correct,
    segmentation_correct,
)
from fortis.services.scoring.ieee import (
    AttackImageOutcome,
    ClassPrediction,
    CorrectnessRule,
    compute_ieee_metrics,
)

__all__ = ["TestRecord", "score_classification", "score_detection", "score_segmentation"]

P = TypeVar("P")

#: judge(indices into image_ids, predictions in that order, field) -> (n,) bool
Judge = Callable[[np.ndarray, list[P], str], np.ndarray]


@dataclass(frozen=True, kw_only=True)
class TestRecord(Generic[P]):
    """One test setting's recorded answers. ``predictions`` values are the task's prediction
    type: :class:`ClassPrediction` (or one per label set), :class:`Detections` or
    :class:`SegmentationPrediction`."""

    __test__ = False                           # not a pytest test class

    kind: str                                  # "clean" | "corruption" | "attack"
    perturbation_id: str = ""                  # corruption id or attack name
    severity: int = 0
    predictions: Mapping[str, P] = field(default_factory=dict)
    queries: Mapping[str, int] = field(default_factory=dict)       # attacks, from the ledger
    success: Mapping[str, bool] = field(default_factory=dict)      # query attacks
    query_budget: int = 0
    image_ids: tuple[str, ...] = ()     # attacks: the images covered (plan limit); () = all


def _error_of(p: Any) -> str | None:
    if isinstance(p, Sequence) and not isinstance(p, str):
        return next((e for e in (_error_of(x) for x in p) if e is not None), None)
    err = getattr(p, "error", None)
    return None if err is None else str(err)


def _score_tests(image_ids: list[str], tests: Sequence[TestRecord[P]],
                 judge: Judge[P]) -> dict[str, Any]:
    """The task-independent part: collect each setting's predictions in image order, judge
    them in one call, build Clean_Result / Corr_Result / Adv_Result, compute the tree."""
    index = {i: n for n, i in enumerate(image_ids)}
    all_idx = np.arange(len(image_ids))
    clean_tests = [t for t in tests if t.kind == "clean"]
    if len(clean_tests) != 1:
        raise InvalidArgument("tests", f"exactly one test of kind 'clean' is needed, got {len(clean_tests)}")
    clean_pred = clean_tests[0].predictions
    missing = [i for i in image_ids if i not in clean_pred]
    if missing:
        raise InvalidArgument("tests[clean].predictions", f"no clean prediction for image '{missing[0]}'")
    clean = judge(all_idx, [clean_pred[i] for i in image_ids], "tests[clean].predictions")
    clean_by_id = dict(zip(image_ids, clean.tolist(), strict=True))
    corruptions: dict[str, dict[int, np.ndarray]] = {}
    attacks: dict[str, list[AttackImageOutcome]] = {}
    budgets: dict[str, int | None] = {}
    coverage: dict[str, list[str]] = {}
    for n, t in enumerate(tests):
        if t.kind == "clean":
            continue
        if t.kind == "corruption":
            if not 1 <= t.severity <= 5:
                raise InvalidArgument(f"tests[{n}].severity", f"must be in 1..5, got {t.severity}")
            # Settings with images missing: filling them as incorrect would hide a bug; refuse.
            lacking = [i for i in image_ids if i not in t.predictions]
            if lacking:
                raise InvalidArgument(f"tests[{t.perturbation_id}@{t.severity}].predictions",
                                      f"no prediction for image '{lacking[0]}'")
            corruptions.setdefault(t.perturbation_id, {})[t.severity] = judge(
                all_idx, [t.predictions[i] for i in image_ids], f"tests[{n}].predictions")
        elif t.kind == "attack":
            cover = list(t.image_ids) if t.image_ids else image_ids
            unknown = [i for i in cover if i not in index]
            if unknown:
                raise InvalidArgument(f"tests[{n}].image_ids", f"image '{unknown[0]}' has no label")
            coverage[t.perturbation_id] = cover
            outs = []
            if t.query_budget or t.success:
                # query attack: judged by the target's answers during the attack (IEEE-M6)
                for i in cover:
                    if i not in t.success:
                        raise InvalidArgument(f"tests[{n}].success", f"no outcome for image '{i}'")
                    c = clean_by_id[i]
                    outs.append(AttackImageOutcome(
                        image_id=i, correct=c and not t.success[i], initially_correct=c,
                        success=bool(t.success[i]) if c else None, queries=t.queries.get(i)))
            else:           # transfer attack: judged on the target's answer to the adversarial
                lacking = [i for i in cover if i not in t.predictions]
                if lacking:
                    raise InvalidArgument(f"tests[{n}].predictions",
                                          f"no prediction for image '{lacking[0]}'")
                preds = [t.predictions[i] for i in cover]
                ok = judge(np.array([index[i] for i in cover], dtype=np.int64), preds,
                           f"tests[{n}].predictions")
                for i, p, c in zip(cover, preds, ok.tolist(), strict=True):
                    outs.append(AttackImageOutcome(image_id=i, correct=c,
                                                   initially_correct=clean_by_id[i],
                                                   success=None, queries=None, error=_error_of(p)))
            attacks[t.perturbation_id] = outs
            budgets[t.perturbation_id] = t.query_budget or None
        else:
            raise InvalidArgument(f"tests[{n}].kind", f"must be clean, corruption or attack, got '{t.kind}'")
    return compute_ieee_metrics(clean=clean, corruptions=dict(corruptions), attacks=attacks,
                                attack_budgets=budgets, image_ids=image_ids,
                                attack_coverage=coverage)


def score_classification(
    rule: CorrectnessRule,
    labels: Mapping[str, Sequence[int] | Sequence[Sequence[int]]],
    tests: Sequence[TestRecord[ClassPrediction]] | Sequence[TestRecord[Sequence[ClassPrediction]]],
    *,
    aggregate: AggregationRule | None = None,
    label_mapping: LabelMapping | Sequence[LabelMapping | None] | None = None,
) -> dict[str, Any]:
    """IEEE metrics of a classification service (IEEE-C1..C3, IEEE-P6, IEEE-M1..M8).

    ``labels[image]``: the acceptable labels of its one label set, or (IEEE-C3) a list of s
    label sets, each a list of acceptable labels; predictions are then a list of s
    :class:`ClassPrediction`, one per set, judged by ``rule`` and combined by ``aggregate``
    (default: all sets). ``label_mapping`` (IEEE-P6) maps dataset labels to service labels,
    one mapping for every set or one per set; an unmapped label raises
    :class:`InvalidArgument` naming the mapping's field.
    """
    image_ids = list(labels)
    truth = class_truth_array([labels[i] for i in image_ids], label_mapping=label_mapping,
                              image_ids=image_ids, field="labels")

    def judge(idx: np.ndarray, preds: list[Any], fld: str) -> np.ndarray:
        return class_predictions_correct(preds, truth[idx], rule, aggregate=aggregate,
                                         image_ids=[image_ids[k] for k in idx.tolist()],
                                         field=fld)

    return _score_tests(image_ids, tests, judge)


def score_detection(
    criterion: DetectionCriterion,
    truths: Mapping[str, Detections],
    tests: Sequence[TestRecord[Detections]],
    *,
    label_mapping: LabelMapping | None = None,
) -> dict[str, Any]:
    """IEEE metrics of an object-detection service (IEEE-C4 + C3 over objects, IEEE-M1..M8).

    ``truths[image]``: its ground-truth boxes and labels (``scores=None``); every test's
    predictions are :class:`Detections` (a failed query: ``error`` set). Each setting is
    judged as one vectorised batch of all its images (never only the first). The ground
    truth's ``image_size`` converts normalised predicted boxes that carry none.
    """
    image_ids = list(truths)
    truth_list = [truths[i] for i in image_ids]
    truth_batch = DetectionBatch.from_images(truth_list, field="truths", image_ids=image_ids)
    sizes = [t.image_size for t in truth_list]

    def judge(idx: np.ndarray, preds: list[Detections], fld: str) -> np.ndarray:
        ids = [image_ids[k] for k in idx.tolist()]
        pred_batch = DetectionBatch.from_images(preds, field=fld, image_ids=ids,
                                                image_sizes=[sizes[k] for k in idx.tolist()])
        t = truth_batch if len(idx) == len(image_ids) and (idx == np.arange(len(idx))).all() \
            else truth_batch.take(idx)
        return detection_correct(t, pred_batch, criterion, label_mapping=label_mapping)

    return _score_tests(image_ids, tests, judge)


def score_segmentation(
    criterion: SegmentationCriterion,
    truths: Mapping[str, np.ndarray],
    tests: Sequence[TestRecord[SegmentationPrediction]],
    *,
    label_mapping: LabelMapping | None = None,
) -> dict[str, Any]:
    """IEEE metrics of a semantic-segmentation service (IEEE-C5, IEEE-M1..M8).

    ``truths[image]``: its ``(H, W)`` integer ground-truth label map (``ignore_label`` pixels
    left out); predictions are :class:`SegmentationPrediction` (a label map or per-class
    scores). ``label_mapping`` (IEEE-P6, one-to-one) is applied to the ground truth once.
    """
    image_ids = list(truths)
    truth_maps: list[np.ndarray] = []
    for i in image_ids:
        t = np.asarray(truths[i])
        if t.ndim != 2 or not np.issubdtype(t.dtype, np.integer):
            raise InvalidArgument(f"truths[{i!r}]", f"must be an (H, W) integer label map, got "
                                                    f"shape {t.shape} dtype {t.dtype}")
        if label_mapping is not None:
            if not label_mapping.one_to_one:
                raise InvalidArgument(label_mapping.field, "a segmentation label mapping must "
                                      "map each dataset label to exactly one service label")
            t = label_mapping.map_array(t, where=f"truths[{i!r}]",
                                        ignore=criterion.ignore_label)[..., 0]
        truth_maps.append(t)

    def judge(idx: np.ndarray, preds: list[SegmentationPrediction], fld: str) -> np.ndarray:
        ids = [image_ids[k] for k in idx.tolist()]
        tm = [truth_maps[k] for k in idx.tolist()]
        masks: list[np.ndarray] = []
        failed = np.zeros(len(preds), dtype=bool)
        for n, (p, t) in enumerate(zip(preds, tm, strict=True)):
            if not isinstance(p, SegmentationPrediction):
                raise InvalidArgument(f"{fld}[{ids[n]!r}]", "must be a SegmentationPrediction")
            if p.error is not None:
                failed[n] = True
                masks.append(np.full(t.shape, -1, dtype=np.int64))
            else:
                masks.append(p.label_map(field=f"{fld}[{ids[n]!r}]"))
        return segmentation_correct(masks, tm, criterion, failed=failed, image_ids=ids,
                                    field=fld)

    return _score_tests(image_ids, tests, judge)
