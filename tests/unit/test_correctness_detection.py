"""IEEE Std 3129-2023 4.7.6.3 prediction correctness for object detection (IEEE-C4, with
IEEE-C3 over the objects and the IEEE-P3 thresholds): box formats and IoU, the three C2
alternatives with IoU in place of confidence, one-to-one matching, label bases and mappings
(IEEE-P6), the plan's detection section. Hand-built cases; also two common detection metric
bugs: 0- vs 1-indexed labels, normalised vs pixel boxes."""

from __future__ import annotations

import numpy as np
import pytest
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring import correctness as cr
from fortis.services.scoring.correctness import (
    AggregationRule,
    DetectionBatch,
    DetectionCriterion,
    Detections,
    LabelMapping,
    box_iou,
    detection_correct,
    match_detections,
    to_xyxy,
)

from tests.unit.scoring_cases import OBJ, THRESH, TOP1, det, fields, gt, inside

# ---------------------------------------------------------------- boxes and IoU ------------


class TestBoxes:
    IMG = (200, 100)  # width, height

    def test_all_formats_give_the_same_pixel_box(self) -> None:
        """IEEE-C4 inputs: one box (x1=20, y1=10, x2=60, y2=30) in every supported format."""
        w, h = self.IMG
        forms = {
            "xyxy": [20, 10, 60, 30],
            "xywh": [20, 10, 40, 20],
            "cxcywh": [40, 20, 40, 20],
            "xyxyn": [20 / w, 10 / h, 60 / w, 30 / h],
            "xywhn": [20 / w, 10 / h, 40 / w, 20 / h],
            "cxcywhn": [40 / w, 20 / h, 40 / w, 20 / h],
        }
        assert set(forms) == set(cr.BOX_FORMATS)
        for fmt, box in forms.items():
            out = to_xyxy([box], fmt, image_size=self.IMG)
            np.testing.assert_allclose(out, [[20, 10, 60, 30]], err_msg=fmt)

    @pytest.mark.parametrize("fmt", ["xyxy", "xywh", "cxcywh"])
    def test_normalised_and_pixel_give_the_same_verdict(self, fmt: str) -> None:
        """DESIGN 5: normalised vs pixel boxes. The same answer, once in pixels and once
        normalised by the image size, is judged the same (and a wrong size would not be)."""
        w, h = 640, 480
        truth = gt([[100, 100, 200, 300], [400, 50, 600, 150]], [3, 7], image_size=(w, h))
        pix = np.array([[105, 110, 205, 290], [390, 60, 610, 160], [0, 0, 50, 50]], float)
        as_fmt = to_xyxy(pix, "xyxy")
        if fmt == "xywh":
            as_fmt = np.c_[pix[:, :2], pix[:, 2:] - pix[:, :2]]
        elif fmt == "cxcywh":
            as_fmt = np.c_[(pix[:, :2] + pix[:, 2:]) / 2, pix[:, 2:] - pix[:, :2]]
        norm = as_fmt / np.array([w, h, w, h])
        labels, scores = [3, 7, 1], [0.9, 0.8, 0.3]
        p_pix = Detections(boxes=as_fmt, labels=labels, scores=scores, box_format=fmt)
        p_norm = Detections(boxes=norm, labels=labels, scores=scores, box_format=fmt + "n")
        for crit in (THRESH, TOP1, DetectionCriterion(mode="topk", k=2, iou_threshold=0.7)):
            a = match_detections(truth, p_pix, crit)
            b = match_detections(truth, p_norm, crit)   # converted with the truth's image size
            assert a.correct == b.correct
            np.testing.assert_array_equal(a.object_correct, b.object_correct)
            np.testing.assert_allclose(a.iou, b.iou)
        assert match_detections(truth, p_norm, THRESH).correct
        # the same normalised numbers read with a wrong image size miss both objects
        wrong = Detections(boxes=norm, labels=labels, scores=scores, box_format=fmt + "n",
                           image_size=(h, w))
        assert not match_detections(truth, wrong, THRESH).object_correct.any()

    def test_normalised_needs_image_size(self) -> None:
        with pytest.raises(InvalidArgument) as exc:
            to_xyxy([[0.1, 0.1, 0.2, 0.2]], "xyxyn")
        assert fields(exc.value) == ["boxes.image_size"]
        with pytest.raises(InvalidArgument) as exc:
            detection_correct([gt([OBJ], [0])], [det([[0.1, 0.1, 0.2, 0.2]], [0], [0.9],
                                                     box_format="xyxyn")], THRESH)
        assert fields(exc.value) == ["predictions[0].image_size"]

    def test_pixel_boxes_declared_normalised_are_rejected(self) -> None:
        with pytest.raises(InvalidArgument) as exc:
            to_xyxy([[0.1, 0.1, 0.5, 0.5], [12, 30, 50, 60]], "xyxyn", image_size=(100, 100))
        assert fields(exc.value) == ["boxes[1]"]
        assert "[0, 1]" in exc.value.message and "normalised" in exc.value.message

    @pytest.mark.parametrize(("box", "fmt", "why"), [
        ([5, 5, 5, 9], "xyxy", "zero-area"),          # x2 == x1
        ([5, 5, 9, 5], "xyxy", "zero-area"),          # y2 == y1
        ([5, 5, 0, 4], "xywh", "zero-area"),          # width 0
        ([10, 10, 40, 5], "xyxy", "negative"),        # xywh given as xyxy: y2 < y1
        ([10, 10, -4, 6], "xywh", "negative"),
        ([0, 0, float("nan"), 4], "xyxy", "finite"),
        ([0, 0, float("inf"), 4], "xyxy", "finite"),
    ])
    def test_degenerate_boxes_rejected_with_the_box_named(self, box: list[float], fmt: str,
                                                          why: str) -> None:
        """IEEE-C4: a zero-area box has no IoU; it is an input error, never a silent miss."""
        with pytest.raises(InvalidArgument) as exc:
            to_xyxy([[0, 0, 1, 1], box], fmt)
        assert fields(exc.value) == ["boxes[1]"] and why in exc.value.message
        # in a batch the error names the image, the field and the box
        with pytest.raises(InvalidArgument) as exc:
            detection_correct([gt([OBJ], [0]), gt([OBJ], [0])],
                              [det([OBJ], [0], [0.9]),
                               det([[0, 0, 1, 1], box], [0, 0], [0.9, 0.9], box_format=fmt)],
                              THRESH, image_ids=["a", "b"])
        assert fields(exc.value) == ["predictions['b'].boxes[1]"]
        with pytest.raises(InvalidArgument) as exc:
            detection_correct([gt([box], [0], box_format=fmt)], [det([OBJ], [0], [0.9])], THRESH)
        assert fields(exc.value) == ["truths[0].boxes[0]"]

    def test_xyxy_hint_for_swapped_format(self) -> None:
        with pytest.raises(InvalidArgument) as exc:
            to_xyxy([[10, 10, 40, 5]], "xyxy")
        assert "xywh" in exc.value.message

    def test_shape_and_format_errors(self) -> None:
        with pytest.raises(InvalidArgument) as exc:
            to_xyxy([[1, 2, 3]], "xyxy")
        assert fields(exc.value) == ["boxes"]
        with pytest.raises(InvalidArgument) as exc:
            to_xyxy([[1, 2, 3, 4]], "yolo")
        assert fields(exc.value) == ["boxes.box_format"]
        with pytest.raises(InvalidArgument) as exc:
            DetectionBatch.from_images([det([OBJ], [0, 1])], field="p")
        assert fields(exc.value) == ["p[0].labels"]
        with pytest.raises(InvalidArgument) as exc:
            DetectionBatch.from_images([det([OBJ], [0], [0.5, 0.4])], field="p")
        assert fields(exc.value) == ["p[0].scores"]
        with pytest.raises(InvalidArgument) as exc:
            DetectionBatch.from_images([det([OBJ], [0], label_base=2)], field="p")
        assert fields(exc.value) == ["p[0].label_base"]
        with pytest.raises(InvalidArgument) as exc:
            DetectionBatch.from_images([det([OBJ], [0.5])], field="p")  # type: ignore[list-item]
        assert fields(exc.value) == ["p.labels"]

    def test_iou_edge_cases(self) -> None:
        a = [[0, 0, 10, 10]]
        assert box_iou(a, [[10, 0, 20, 10]])[0, 0] == 0.0        # touching edge
        assert box_iou(a, [[10, 10, 20, 20]])[0, 0] == 0.0       # touching corner
        assert box_iou(a, [[0, 0, 10, 10]])[0, 0] == 1.0         # identical
        assert box_iou(a, [[0, 0, 10, 5]])[0, 0] == 0.5          # contained, half the area
        assert box_iou(a, [[5, 0, 15, 10]])[0, 0] == pytest.approx(50 / 150)
        assert box_iou(a, [[20, 20, 30, 30]])[0, 0] == 0.0       # disjoint
        assert box_iou([[0, 0, 10, 10], [0, 0, 10, 5]], [[0, 0, 10, 5]]).shape == (2, 1)

    def test_touching_boxes_never_match_even_at_threshold_zero(self) -> None:
        """IoU > threshold is strict: a box that only touches the object (IoU 0) is no
        candidate, even with iou_threshold = 0 (the literal "any overlap" reading)."""
        touch = det([[10, 0, 20, 10]], [0], [0.9])
        for mode in ("top1", "topk", "threshold"):
            crit = DetectionCriterion(mode=mode, iou_threshold=0.0)
            assert not match_detections(gt([OBJ], [0]), touch, crit).correct
            assert match_detections(gt([OBJ], [0]), det([[9, 0, 20, 10]], [0], [0.9]),
                                    crit).correct

    def test_iou_threshold_is_strict(self) -> None:
        half = det([inside(5)], [0], [0.9])                      # IoU exactly 0.5
        assert not match_detections(gt([OBJ], [0]), half, THRESH).correct
        assert match_detections(gt([OBJ], [0]), half,
                                DetectionCriterion(iou_threshold=0.49)).correct


# ---------------------------------------------------------------- IEEE-C4 alternatives -----


class TestDetectionAlternatives:
    """IEEE-C4: the three alternatives of C2 with IoU in place of confidence, the class
    label agreeing. One object of class 2; predictions ranked by IoU:
    p0 class 5 IoU 0.9, p1 class 2 IoU 0.8, p2 class 2 IoU 0.6."""

    TRUTH = gt([OBJ], [2])
    PRED = det([inside(9), inside(8), inside(6)], [5, 2, 2], [0.9, 0.5, 0.99])

    def test_top1_by_iou(self) -> None:
        # the highest-IoU box says class 5: wrong, although a class-2 box overlaps well
        m = match_detections(self.TRUTH, self.PRED, DetectionCriterion(mode="top1",
                                                                       iou_threshold=0.5))
        assert not m.correct and m.matched.tolist() == [-1]
        # once the class-5 box is gone, the top-1 is p1
        m = match_detections(self.TRUTH, det([inside(8), inside(6)], [2, 2], [0.5, 0.99]),
                             DetectionCriterion(mode="top1", iou_threshold=0.5))
        assert m.correct and m.matched.tolist() == [0]

    def test_topk_by_iou(self) -> None:
        assert match_detections(self.TRUTH, self.PRED,
                                DetectionCriterion(mode="topk", k=2, iou_threshold=0.5)).correct
        m = match_detections(self.TRUTH, self.PRED,
                             DetectionCriterion(mode="topk", k=2, iou_threshold=0.5))
        assert m.matched.tolist() == [1]       # the highest-IoU box of the right class
        # class 2 only at rank 3 -> not within the top 2
        pred = det([inside(9), inside(8.5), inside(8)], [5, 4, 2], [0.9, 0.9, 0.9])
        assert not match_detections(self.TRUTH, pred,
                                    DetectionCriterion(mode="topk", k=2, iou_threshold=0.5)).correct
        assert match_detections(self.TRUTH, pred,
                                DetectionCriterion(mode="topk", k=3, iou_threshold=0.5)).correct

    def test_threshold_by_iou(self) -> None:
        assert match_detections(self.TRUTH, self.PRED, THRESH).correct
        # sigma = 0.85: only the wrong-class box exceeds it
        assert not match_detections(self.TRUTH, self.PRED,
                                    DetectionCriterion(iou_threshold=0.85)).correct
        # sigma = 0.7: p1 (0.8) of the right class exceeds it
        m = match_detections(self.TRUTH, self.PRED, DetectionCriterion(iou_threshold=0.7))
        assert m.correct and m.matched.tolist() == [1]

    def test_iou_threshold_applies_to_top1_and_topk(self) -> None:
        # top-1 candidate must exceed the IoU threshold too: 0.6 < 0.7
        pred = det([inside(6)], [2], [0.9])
        for mode in ("top1", "topk"):
            assert not match_detections(self.TRUTH, pred,
                                        DetectionCriterion(mode=mode, iou_threshold=0.7)).correct
            assert match_detections(self.TRUTH, pred,
                                    DetectionCriterion(mode=mode, iou_threshold=0.5)).correct

    def test_right_box_wrong_class_is_incorrect_in_every_mode(self) -> None:
        pred = det([OBJ], [3], [0.99])
        for mode in ("top1", "topk", "threshold"):
            assert not match_detections(self.TRUTH, pred, DetectionCriterion(mode=mode)).correct

    def test_confidence_threshold_drops_low_scores_first(self) -> None:
        """IEEE-P3: the plan's detection confidence threshold is a minimum (score >= it)."""
        pred = det([inside(9), inside(8)], [2, 5], [0.3, 0.9])
        assert match_detections(self.TRUTH, pred, TOP1).correct
        crit = DetectionCriterion(mode="top1", iou_threshold=0.5, confidence_threshold=0.5)
        m = match_detections(self.TRUTH, pred, crit)
        assert not m.correct and m.kept.tolist() == [False, True]
        # top-1 with the filter: the class-5 box is now the best remaining one
        edge = DetectionCriterion(mode="threshold", confidence_threshold=0.3)
        assert match_detections(self.TRUTH, pred, edge).correct      # 0.3 >= 0.3 kept

    def test_confidence_threshold_needs_scores(self) -> None:
        crit = DetectionCriterion(confidence_threshold=0.5)
        with pytest.raises(InvalidArgument) as exc:
            detection_correct([self.TRUTH], [det([OBJ], [2])], crit, image_ids=["x"])
        assert fields(exc.value) == ["predictions['x'].scores[0]"]


# ---------------------------------------------------------------- one-to-one matching ------


class TestOneToOne:
    """A prediction never matches two objects: greedy one-to-one matching by IoU (module
    docstring of ``correctness``), as COCO does."""

    # two touching objects of class 1, side by side
    TWO = gt([[0, 0, 10, 10], [10, 0, 20, 10]], [1, 1])

    def test_one_box_over_two_objects_matches_only_one(self) -> None:
        wide = det([[0, 0, 14, 10]], [1], [0.9])            # IoU 10/14 with A, 4/14 with B
        crit = DetectionCriterion(iou_threshold=0.2)
        m = match_detections(self.TWO, wide, crit)
        assert m.object_correct.tolist() == [True, False]
        assert m.matched.tolist() == [0, -1]
        assert not m.correct                                      # C3 "all" (default)
        at_least_1 = DetectionCriterion(iou_threshold=0.2, aggregate=AggregationRule(
            mode="at_least", q=1))
        assert match_detections(self.TWO, wide, at_least_1).correct

    def test_two_boxes_match_two_objects(self) -> None:
        boxes = det([[0, 0, 14, 10], [9, 0, 20, 10]], [1, 1], [0.9, 0.8])
        m = match_detections(self.TWO, boxes, DetectionCriterion(iou_threshold=0.2))
        assert m.correct and m.matched.tolist() == [0, 1]

    def test_taken_box_is_not_the_next_objects_top1(self) -> None:
        # p0 overlaps A best (0.9) and B too (0.6 > its other box's 0.55): p0 goes to A;
        # B's best *available* box is p1, of the right class -> correct under top-1
        truth = gt([[0, 0, 10, 10], [0, 0, 10, 6]], [1, 1])
        pred = det([[0, 0, 10, 9], [0, 0, 10, 3.3]], [1, 1], [0.9, 0.9])
        iou = box_iou(np.asarray(truth.boxes), np.asarray(pred.boxes))
        assert iou[0, 0] > iou[1, 0] > iou[1, 1] > 0.5
        m = match_detections(truth, pred, TOP1)
        assert m.matched.tolist() == [0, 1] and m.correct

    def test_wrong_class_box_is_not_taken(self) -> None:
        # a "cat" box overlapping a dog (more) and a cat: the dog is wrong under top-1, but
        # the box stays available and matches the cat
        dog, cat = 0, 1
        truth = gt([[0, 0, 10, 10], [4, 0, 14, 10]], [dog, cat])
        pred = det([[1, 0, 11, 10]], [cat], [0.9])
        m = match_detections(truth, pred, DetectionCriterion(mode="top1", iou_threshold=0.3))
        assert m.object_correct.tolist() == [False, True]

    def test_duplicate_detections_do_not_double_count(self) -> None:
        truth = gt([[0, 0, 10, 10], [50, 50, 60, 60]], [1, 1])
        dup = det([[0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10]], [1, 1, 1], [0.9, 0.8, 0.7])
        m = match_detections(truth, dup, THRESH)
        assert m.object_correct.tolist() == [True, False]


# ---------------------------------------------------------------- IEEE-C3 over objects -----


class TestObjectsAggregation:
    TRUTH = gt([[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10]], [0, 1, 2])
    PRED = det([[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10]], [0, 1, 9], [0.9] * 3)

    def test_all_vs_at_least_q(self) -> None:
        """IEEE-C3: 2 of the 3 objects are right."""
        def crit(mode: str, q: int = 1) -> DetectionCriterion:
            return DetectionCriterion(aggregate=AggregationRule(mode=mode, q=q))
        assert not match_detections(self.TRUTH, self.PRED, crit("all")).correct
        assert match_detections(self.TRUTH, self.PRED, crit("at_least", 2)).correct
        assert not match_detections(self.TRUTH, self.PRED, crit("at_least", 3)).correct
        assert match_detections(self.TRUTH, self.PRED, crit("at_least", 1)).correct

    def test_q_is_capped_at_the_number_of_objects(self) -> None:
        crit = DetectionCriterion(aggregate=AggregationRule(mode="at_least", q=3))
        one = gt([OBJ], [4])
        assert match_detections(one, det([OBJ], [4], [0.9]), crit).correct
        assert not match_detections(one, det([OBJ], [3], [0.9]), crit).correct

    def test_image_without_objects(self) -> None:
        """No ground-truth object: correct iff nothing survives the confidence threshold."""
        empty = gt([], [])
        assert match_detections(empty, det([], []), THRESH).correct
        assert not match_detections(empty, det([OBJ], [1], [0.4]), THRESH).correct
        crit = DetectionCriterion(confidence_threshold=0.5)
        assert match_detections(empty, det([OBJ], [1], [0.4]), crit).correct

    def test_no_predictions_for_objects(self) -> None:
        assert not match_detections(self.TRUTH, det([], [], []), THRESH).correct


# ---------------------------------------------------------------- labels: base and mapping --


class TestDetectionLabels:
    def test_zero_vs_one_indexed_labels(self) -> None:
        """DESIGN 5: COCO-style 1-indexed ground truth against a 0-indexed service gives the
        same verdicts as both 0-indexed; forgetting the base would flip them."""
        boxes = [[0, 0, 10, 10], [20, 0, 30, 10]]
        pred = det(boxes, [0, 4], [0.9, 0.9])                       # 0-indexed service
        truth0 = gt(boxes, [0, 4])
        truth1 = gt(boxes, [1, 5], label_base=1)
        a = match_detections(truth0, pred, THRESH)
        b = match_detections(truth1, pred, THRESH)
        assert a.correct and b.correct
        assert not match_detections(gt(boxes, [1, 5]), pred, THRESH).correct  # base forgotten
        pred1 = det(boxes, [1, 5], [0.9, 0.9], label_base=1)        # both 1-indexed
        assert match_detections(truth1, pred1, THRESH).correct
        assert match_detections(truth0, pred1, THRESH).correct      # each side declares its base
        # a 1-indexed service read as 0-indexed: every class off by one
        assert not match_detections(truth0, det(boxes, [1, 5], [0.9, 0.9]), THRESH).correct

    def test_label_below_base_is_an_error(self) -> None:
        with pytest.raises(InvalidArgument) as exc:
            detection_correct([gt([OBJ], [0], label_base=1)], [det([OBJ], [0], [0.9])], THRESH,
                              image_ids=["im"])
        assert fields(exc.value) == ["truths['im'].labels[0]"]
        assert "0-indexed" in exc.value.message
        with pytest.raises(InvalidArgument) as exc:
            detection_correct([gt([OBJ], [1])], [det([OBJ], [0], [0.9], label_base=1)], THRESH)
        assert fields(exc.value) == ["predictions[0].labels[0]"]

    def test_label_mapping_one_to_one_and_one_to_many(self) -> None:
        """IEEE-P6 for detection: dataset labels (as written) -> service labels (as written)."""
        truth = gt([[0, 0, 10, 10], [20, 0, 30, 10]], [1, 3], label_base=1)   # COCO ids
        pred = det([[0, 0, 10, 10], [20, 0, 30, 10]], [0, 7], [0.9, 0.9])
        one = LabelMapping({1: 0, 3: 2})
        m = match_detections(truth, pred, THRESH, label_mapping=one)
        assert m.object_correct.tolist() == [True, False]
        many = LabelMapping({1: 0, 3: [2, 7]})       # "vehicle" -> car or truck
        assert match_detections(truth, pred, THRESH, label_mapping=many).correct

    def test_unmapped_label_names_the_mapping_field(self) -> None:
        truth = gt([OBJ], [9])
        with pytest.raises(InvalidArgument) as exc:
            match_detections(truth, det([OBJ], [0], [0.9]), THRESH,
                             label_mapping=LabelMapping({1: 0}, field="dataset.label_map"))
        assert fields(exc.value) == ["dataset.label_map"] and "9" in exc.value.message

    def test_mapping_below_prediction_base(self) -> None:
        with pytest.raises(InvalidArgument) as exc:
            match_detections(gt([OBJ], [1]), det([OBJ], [1], [0.9], label_base=1), THRESH,
                             label_mapping=LabelMapping({1: 0}))
        assert fields(exc.value) == ["dataset.label_map"]

    def test_float_class_column_accepted_when_integral(self) -> None:
        pred = Detections(boxes=np.array([OBJ]), labels=np.array([2.0]), scores=[0.9])
        assert match_detections(gt([OBJ], [2]), pred, THRESH).correct


class TestDetectionCriterion:
    def test_from_dict(self) -> None:
        c = DetectionCriterion.from_dict({"mode": "topk", "k": 3, "iou_threshold": 0.4,
                                          "confidence_threshold": 0.25, "aggregate": "at_least",
                                          "q": 2})
        assert (c.mode, c.k, c.iou_threshold, c.confidence_threshold) == ("topk", 3, 0.4, 0.25)
        assert c.aggregate == AggregationRule(mode="at_least", q=2)
        assert DetectionCriterion.from_dict(c.to_dict()) == c
        assert DetectionCriterion.from_dict(None) == DetectionCriterion()

    @pytest.mark.parametrize(("d", "field"), [
        ({"mode": "best"}, "detection.mode"),
        ({"k": 0}, "detection.k"),
        ({"iou_threshold": 1.0}, "detection.iou_threshold"),
        ({"iou_threshold": -0.1}, "detection.iou_threshold"),
        ({"confidence_threshold": float("nan")}, "detection.confidence_threshold"),
        ({"aggregate": "most"}, "detection.aggregate"),
        ({"q": 0}, "detection.q"),
        ({"sigma": 0.5}, "detection.sigma"),
    ])
    def test_invalid(self, d: dict, field: str) -> None:
        with pytest.raises(InvalidArgument) as exc:
            DetectionCriterion.from_dict(d)
        assert field in fields(exc.value)
