"""Task judges (``services/perturbation/judges.py``): how ``ctx.margin_query()`` /
``ctx.decision_query()`` read a classifier's full or top-k scores or labels, a detector's
boxes (IEEE-C4) and a segmenter's class maps and probabilities (IEEE-C5).

The detection and segmentation verdicts are cross-checked against the scoring service's
(``scoring.correctness.detection_correct`` / ``segmentation_correct``) on the same answers,
random ones included: an attack succeeds exactly when scoring would call its answer
incorrect. The matching rule is one function (``fortis.core.matching``, tested on its own in
test_core_matching.py); what these checks hold is what each service adds around it: the
objects of interest, the score threshold, IEEE-C3 over the objects, images without objects
and the sign of the margins."""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest
from fortis.core.criteria import DetectionCriterion, SegmentationCriterion
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.attacks.base import AttackContext
from fortis.services.perturbation.attacks.registry import ATTACKS
from fortis.services.perturbation.criteria import (
    MIoUBelow,
    Misclassification,
    ObjectMissed,
    ObjectRelabelled,
    TargetedMisclassification,
    criterion_from_spec,
)
from fortis.services.perturbation.engine import check_attack_fits
from fortis.services.perturbation.judges import (
    BoxAnswer,
    BoxReference,
    DetectionJudge,
    MaskAnswer,
    SegmentationJudge,
)
from fortis.services.scoring.correctness import detection_correct
from fortis.services.scoring.correctness.boxes import Detections
from fortis.services.scoring.correctness.segmentation import segmentation_correct

# -- fake targets: answers looked up by the image's first pixel --------------------------------


class _Client:
    """A query client whose answer to an image is ``table[key]``, the key written in the
    image's first pixel (``_images``); counts rows."""

    def __init__(self, table: dict[int, Any], *, task: str = "classification",
                 signal: str = "scores", k: int = 0) -> None:
        self.table, self.task, self.signal, self.k = table, task, signal, k
        self.rows = 0

    def _look(self, images: np.ndarray) -> list[Any]:
        self.rows += len(images)
        return [self.table[int(im[0, 0, 0]) + 256 * int(im[0, 0, 1])] for im in images]

    def scores(self, images: np.ndarray, ids: Sequence[str]) -> np.ndarray:
        s = np.array(self._look(images), dtype=np.float64)
        if self.k:                           # top-k: the classes not returned score 0
            cut = np.sort(s, axis=1)[:, -self.k][:, None]
            s = np.where(s >= cut, s, 0.0)
        return s

    def labels(self, images: np.ndarray, ids: Sequence[str]) -> np.ndarray:
        return np.array([int(np.argmax(a)) for a in self._look(images)])

    def predictions(self, images: np.ndarray, ids: Sequence[str]) -> list[Any]:
        return self._look(images)


def _images(*firsts: int, shape: tuple[int, int, int] = (4, 4, 3)) -> np.ndarray:
    out = np.zeros((len(firsts), *shape), np.uint8)
    for i, f in enumerate(firsts):
        out[i, 0, 0, :2] = (f % 256, f // 256)
    return out


def _ctx(client: _Client, images: np.ndarray, crit: Any, *, labels: Sequence[int] = (),
         references: tuple[Any, ...] = (), attack: str = "square") -> AttackContext:
    n = len(images)
    lab = np.array(list(labels) or [0] * n, dtype=np.int64)
    return AttackContext(spec=ATTACKS[attack], images=images, labels=lab,
                         image_ids=tuple(f"im{i}" for i in range(n)),
                         label_sets=tuple((int(x),) for x in lab),
                         params=MappingProxyType({}), seed=1, criterion=crit, query=client,
                         references=references)


# -- classification ----------------------------------------------------------------------------

SCORES = {0: [0.7, 0.2, 0.1], 1: [0.3, 0.6, 0.1], 2: [0.1, 0.2, 0.7], 3: [0.45, 0.1, 0.45]}


def test_classification_full_scores_margins_and_decisions():
    client = _Client(SCORES)
    x = _images(0, 1, 2, 3)
    ctx = _ctx(client, x, Misclassification(), labels=[0, 0, 0, 0])
    m = ctx.margin_query()(x, np.arange(4))
    np.testing.assert_allclose(m[:3], [0.5, -0.3, -0.6])
    assert m[3] >= 0                     # a tie is not a misclassification: margin >= 0
    assert ctx.decision_query()(x, np.arange(4)).tolist() == [False, True, True, False]
    assert ctx.signal == "scores" and ctx.used_signal() in ("scores", "labels")


def test_classification_top_k_scores_missing_classes_score_zero():
    client = _Client({0: [0.5, 0.3, 0.2], 1: [0.2, 0.3, 0.5]}, signal="top_k", k=1)
    x = _images(0, 1)
    ctx = _ctx(client, x, Misclassification(), labels=[0, 0])
    np.testing.assert_allclose(ctx.margin_query()(x, np.arange(2)), [0.5, -0.5])
    assert ctx.signal == "top_k" and ctx.used_signal() == "top_k"


def test_classification_targeted_margins_reach_the_target_class():
    client = _Client(SCORES)
    x = _images(0, 1, 2)
    ctx = _ctx(client, x, TargetedMisclassification(2), labels=[0, 0, 0], attack="hsja")
    m = ctx.margin_query()(x, np.arange(3))
    assert (m < 0).tolist() == [False, False, True]
    np.testing.assert_allclose(m, [0.6, 0.5, -0.5])
    assert ctx.decision_query()(x, np.arange(3)).tolist() == [False, False, True]


def test_labels_only_target_score_attacks_refused_decision_attacks_work():
    client = _Client(SCORES, signal="labels")
    x = _images(0, 1)
    with pytest.raises(InvalidArgument) as e:
        check_attack_fits(ATTACKS["square"], "classification", "labels", Misclassification())
    assert e.value.violations[0].field == "attack_id" and "square" in str(e.value) and "label" in str(e.value)
    check_attack_fits(ATTACKS["hsja"], "classification", "labels", Misclassification())
    ctx = _ctx(client, x, Misclassification(), labels=[0, 0], attack="hsja")
    assert ctx.decision_query()(x, np.arange(2)).tolist() == [False, True]
    assert ctx.used_signal() == "labels"
    with pytest.raises(InvalidArgument):            # a margin needs scores
        ctx.margin_query()(x, np.arange(2))


# -- detection (IEEE-C4) ----------------------------------------------------------------------

FACE = np.array([[10.0, 10.0, 30.0, 30.0]])


def _box(b: Sequence[float], label: int, score: float) -> BoxAnswer:
    return BoxAnswer(boxes=np.array([b], float), labels=np.array([label]),
                     scores=np.array([score]))


NONE = BoxAnswer(boxes=np.zeros((0, 4)), labels=np.zeros(0, np.int64), scores=np.zeros(0))
DET = {0: _box([10, 10, 30, 30], 0, 0.9),          # the face, found
       1: NONE,                                     # disappears
       2: _box([10, 10, 30, 30], 1, 0.9),          # changes label
       3: _box([18, 10, 38, 30], 0, 0.9),          # slides off: IoU 0.43 < 0.5
       4: _box([10, 10, 30, 30], 0, 0.4),          # below the confidence threshold
       5: _box([10, 10, 30, 30], 0, 0.5),          # at the threshold: kept (>=)
       6: _box([10, 10, 30, 30], 3, 0.8),          # relabelled as class 3
       7: _box([10, 10, 30, 30], 3, 0.3)}          # class 3 but too weak


def _scoring_correct(answers: Sequence[BoxAnswer], refs: Sequence[BoxReference],
                     rule: DetectionCriterion) -> np.ndarray:
    truths = [Detections(boxes=r.boxes.reshape(-1, 4), labels=r.labels, image_size=(200, 200))
              for r in refs]
    preds = [Detections(boxes=a.boxes.reshape(-1, 4), labels=a.labels, scores=a.scores,
                        image_size=(200, 200)) for a in answers]
    return detection_correct(truths, preds, rule)


def test_detection_object_missed_margins_and_scoring_agree():
    crit = ObjectMissed(iou_threshold=0.5, score_threshold=0.5)
    x = _images(*DET)
    ref = BoxReference.of(FACE, [0])
    client = _Client(DET, task="detection", signal="boxes")
    ctx = _ctx(client, x, crit, references=(ref,) * len(DET))
    m = ctx.margin_query()(x, np.arange(len(DET)))
    # found with score 0.9, IoU 1: best matching score - threshold = 0.4
    assert m[0] == pytest.approx(0.4)
    assert (m < 0).tolist() == [False, True, True, True, True, False, True, True]
    assert m[4] == pytest.approx(-0.1) and m[5] >= 0
    rule = DetectionCriterion.from_dict({"mode": "threshold", "iou_threshold": 0.5,
                                         "confidence_threshold": 0.5})
    ok = _scoring_correct(list(DET.values()), [ref] * len(DET), rule)
    np.testing.assert_array_equal(m < 0, ~ok)
    np.testing.assert_array_equal(ctx.decision_query()(x, np.arange(len(DET))), ~ok)
    assert ctx.used_signal() == "boxes"


def test_detection_targeted_relabel():
    crit = ObjectRelabelled(3, threshold=0.5, iou_threshold=0.5)
    x = _images(0, 6, 7, 1)
    ctx = _ctx(DETC := _Client(DET, task="detection", signal="boxes"), x, crit,
               references=(BoxReference.of(FACE, [0]),) * 4, attack="hsja")
    m = ctx.margin_query()(x, np.arange(4))
    assert (m < 0).tolist() == [False, True, False, False]
    assert m[1] == pytest.approx(-0.3)          # threshold - the target box's score
    assert m[2] == pytest.approx(0.2)
    assert DETC.rows == 4


def test_detection_reference_from_the_clean_answer_and_clean_first():
    crit = ObjectMissed(iou_threshold=0.5)
    x = _images(0, 1)
    client = _Client(DET, task="detection", signal="boxes")
    judge = DetectionJudge(client, crit, x, ["a", "b"], [None, None])
    # the first query of an image must be the clean image (the reference is its answer)
    with pytest.raises(RuntimeError, match="clean"):
        judge.margins(x[::-1].copy(), np.arange(2))
    judge = DetectionJudge(client, crit, x, ["a", "b"], [None, None])
    m0 = judge.margins(x, np.arange(2))
    assert m0[0] > 0 and m0[1] > 0               # image b: nothing detected clean, nothing now
    adv = _images(1, 0)                          # a loses its face; b gains one
    m1 = judge.margins(adv, np.arange(2))
    assert m1[0] < 0 and m1[1] < 0               # b: a box where there was none (scoring)


def test_detection_one_box_never_finds_two_objects():
    """Scoring's matching is one-to-one: two overlapping faces and one box between them
    leave one face missed (the attack has succeeded under ``aggregate: all``)."""
    ref = BoxReference.of([[10, 10, 30, 30], [12, 10, 32, 30]], [0, 0])
    ans = _box([11, 10, 31, 30], 0, 0.9)
    crit = ObjectMissed(iou_threshold=0.5)
    x = _images(0)
    m = DetectionJudge(_Client({0: ans}, task="detection"), crit, x, ["a"], [ref]).margins(
        x, np.array([0]))
    rule = DetectionCriterion.from_dict({"iou_threshold": 0.5})
    assert not _scoring_correct([ans], [ref], rule)[0] and m[0] < 0


@pytest.mark.parametrize("mode", ["threshold", "top1", "topk"])
@pytest.mark.parametrize("aggregate", ["all", "at_least"])
def test_detection_random_answers_match_scoring(mode: str, aggregate: str):
    """Random objects and answers (overlapping boxes, several classes, scores around the
    threshold): the judge's verdict (its IEEE-C3 count, empty images and margin signs around
    the shared matching) is the scoring service's on every image."""
    rng = np.random.default_rng(3)
    rule_d = {"mode": mode, "k": 2, "iou_threshold": 0.3, "confidence_threshold": 0.4,
              "aggregate": aggregate, "q": 2}
    rule = DetectionCriterion.from_dict(rule_d)
    crit = criterion_from_spec("detection", {"kind": "object_missed", "detection": {
        "iou_threshold": 0.3, "score_threshold": 0.4, "mode": mode, "k": 2,
        "min_objects": 2 if aggregate == "at_least" else 0}})
    answers, refs = [], []
    for _ in range(300):
        s = int(rng.integers(0, 4))
        c = rng.uniform(20, 80, (s, 2))
        ob = np.concatenate([c - 10, c + 10], axis=1)
        refs.append(BoxReference.of(ob, rng.integers(0, 2, s)))
        p = int(rng.integers(0, 5))
        src = ob[rng.integers(0, s, p)] if s else rng.uniform(20, 80, (p, 4))
        jit = src + rng.normal(0, 4, (p, 4))
        jit[:, 2:] = np.maximum(jit[:, 2:], jit[:, :2] + 1)
        answers.append(BoxAnswer(boxes=jit, labels=rng.integers(0, 2, p),
                                 scores=rng.choice([0.3, 0.4, 0.6, 0.9], p)))
    table = dict(enumerate(answers))
    x = _images(*table)
    judge = DetectionJudge(_Client(table, task="detection"), crit, x,
                           [str(i) for i in table], refs)
    m = judge.margins(x, np.arange(len(x)))
    ok = _scoring_correct(answers, refs, rule)
    assert 0.1 < ok.mean() < 0.9                  # both verdicts occur
    np.testing.assert_array_equal(m < 0, ~ok)


# -- segmentation (IEEE-C5) -------------------------------------------------------------------


def _seg_scoring(maps: np.ndarray, refs: np.ndarray, crit: MIoUBelow) -> np.ndarray:
    rule = SegmentationCriterion(classes=crit.classes, miou_threshold=crit.miou_threshold,
                                 ignore_label=crit.ignore_label,
                                 all_absent="incorrect" if crit.all_absent_incorrect
                                 else "correct")
    return segmentation_correct(list(maps), list(refs), rule)


def test_segmentation_random_masks_match_scoring():
    rng = np.random.default_rng(5)
    crit = MIoUBelow(classes=(1, 2), miou_threshold=0.5, ignore_label=255)
    n = 200
    refs = rng.integers(0, 3, (n, 12, 12))
    refs[rng.random((n, 12, 12)) < 0.05] = 255
    refs[:10] = 0                                # classes absent from the reference
    flip = rng.random((n, 1, 1)) * 0.9
    maps = np.where(rng.random((n, 12, 12)) < flip, rng.integers(0, 3, (n, 12, 12)), refs)
    maps[:5] = 0                                  # ... and from the answer: all absent
    maps = np.where(maps == 255, 0, maps)
    table = {i: MaskAnswer(class_map=maps[i]) for i in range(n)}
    x = _images(*range(n))
    judge = SegmentationJudge(_Client(table, task="segmentation"), crit, x,
                              [str(i) for i in range(n)], list(refs))
    m = judge.margins(x, np.arange(n))
    ok = _seg_scoring(maps, refs, crit)
    assert 0.2 < ok.mean() < 0.9
    np.testing.assert_array_equal(m < 0, ~ok)
    assert judge.signal() == "masks"


def test_segmentation_probability_loss_sees_progress_below_a_pixel_flip():
    ref = np.zeros((8, 8), np.int64)
    ref[2:6, 2:6] = 1
    crit = MIoUBelow(classes=(1,), miou_threshold=0.5)

    def answer(p_fg: float) -> MaskAnswer:
        fg = np.where(ref == 1, p_fg, 0.05).astype(np.float32)
        return MaskAnswer(class_map=(fg > 0.5).astype(np.int64),
                          probabilities=np.stack([1 - fg, fg], axis=-1))

    table = {0: answer(0.95), 1: answer(0.75), 2: answer(0.55), 3: answer(0.45)}
    x = _images(0, 1, 2, 3)
    judge = SegmentationJudge(_Client(table, task="segmentation"), crit, x,
                              ["a", "b", "c", "d"], [ref] * 4)
    m = judge.margins(x, np.arange(4))
    assert m[0] > m[1] > m[2] > 0 > m[3]         # same class map for 0-2, margins fall
    assert judge.signal() == "probabilities"
    np.testing.assert_array_equal(
        m < 0, ~_seg_scoring(np.stack([a.class_map for a in table.values()]),
                             np.stack([ref] * 4), crit))
    # the same answers without probabilities: the mIoU margin, same verdicts
    masks = {k: MaskAnswer(class_map=a.class_map) for k, a in table.items()}
    judge2 = SegmentationJudge(_Client(masks, task="segmentation"), crit, x,
                               ["a", "b", "c", "d"], [ref] * 4)
    m2 = judge2.margins(x, np.arange(4))
    np.testing.assert_allclose(m2[:3], 0.5)
    np.testing.assert_array_equal(m2 < 0, m < 0)


def test_segmentation_reference_from_the_clean_answer():
    a = np.zeros((6, 6), np.int64)
    a[1:4, 1:4] = 1
    b = np.zeros((6, 6), np.int64)
    table = {0: MaskAnswer(class_map=a), 1: MaskAnswer(class_map=b)}
    crit = MIoUBelow(classes=(1,), miou_threshold=0.5)
    x = _images(0)
    judge = SegmentationJudge(_Client(table, task="segmentation"), crit, x, ["a"], [None])
    assert judge.margins(x, np.array([0]))[0] == pytest.approx(0.5)
    assert judge.margins(_images(1), np.array([0]))[0] < 0


def test_criteria_on_the_wrong_task_refused_with_the_field():
    with pytest.raises(InvalidArgument) as e:
        criterion_from_spec("segmentation", {"kind": "object_missed"})
    assert e.value.violations[0].field == "criterion.kind"
    with pytest.raises(InvalidArgument) as e:
        criterion_from_spec("detection", {"kind": "misclassification"})
    assert e.value.violations[0].field == "criterion.kind"
    with pytest.raises(InvalidArgument) as e:
        criterion_from_spec("segmentation", {"segmentation": {}})
    assert e.value.violations[0].field == "criterion.segmentation.classes"
    with pytest.raises(InvalidArgument) as e:
        SegmentationJudge(_Client({}), Misclassification(), _images(0), ["a"], [None])
    assert e.value.violations[0].field == "criterion"
