"""IEEE Std 3129-2023 4.7.6.3 prediction correctness for semantic segmentation (IEEE-C5):
per-class IoU and mIoU on hand-built maps (the maps are in tests/unit/scoring_cases.py),
ignore label, absent classes, score maps, label mappings (IEEE-P6), vectorisation."""

from __future__ import annotations

import numpy as np
import pytest
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.correctness import (
    LabelMapping,
    SegmentationCriterion,
    SegmentationPrediction,
    masks_from_scores,
    segmentation_correct,
    segmentation_iou,
    segmentation_miou,
)
from fortis.services.scoring.correctness import segmentation as crs

from tests.unit.scoring_cases import SEG_CRIT, SEG_GT, SEG_PRED, fields

# ---------------------------------------------------------------- IEEE-C5 segmentation -----


class TestSegmentation:
    CRIT = SEG_CRIT

    def test_hand_built_iou_and_miou(self) -> None:
        iou = segmentation_iou(SEG_PRED, SEG_GT, self.CRIT)
        np.testing.assert_allclose(iou, [[0.6, 0.4]])
        assert segmentation_miou(SEG_PRED, SEG_GT, self.CRIT).tolist() == [pytest.approx(0.5)]
        assert segmentation_correct(SEG_PRED, SEG_GT, self.CRIT).tolist() == [True]

    def test_miou_must_exceed_the_threshold(self) -> None:
        """IEEE-C5: correct iff mIoU *exceeds* the agreed threshold: 0.5 is not > 0.5."""
        crit = SegmentationCriterion(classes=(1, 2), miou_threshold=0.5)
        assert segmentation_correct(SEG_PRED, SEG_GT, crit).tolist() == [False]

    def test_column_order_follows_the_plan(self) -> None:
        iou = segmentation_iou(SEG_PRED, SEG_GT, SegmentationCriterion(classes=(2, 1)))
        np.testing.assert_allclose(iou, [[0.4, 0.6]])

    def test_ignore_label(self) -> None:
        # without an ignore label, 255 is just another class: the two ignored pixels the
        # prediction called 2 now count against class 2 -> 2 / 7
        crit = SegmentationCriterion(classes=(1, 2), ignore_label=None)
        np.testing.assert_allclose(segmentation_iou(SEG_PRED, SEG_GT, crit), [[0.6, 2 / 7]])
        with pytest.raises(InvalidArgument) as exc:
            SegmentationCriterion(classes=(1, 255), ignore_label=255)
        assert fields(exc.value) == ["segmentation.ignore_label"]

    def test_class_absent_from_both_is_skipped(self) -> None:
        # class 3 is neither predicted nor present: left out of the mean (still 0.5)
        crit = SegmentationCriterion(classes=(1, 2, 3), miou_threshold=0.45)
        iou = segmentation_iou(SEG_PRED, SEG_GT, crit)
        assert np.isnan(iou[0, 2])
        assert segmentation_miou(SEG_PRED, SEG_GT, crit).tolist() == [pytest.approx(0.5)]

    def test_class_in_one_of_them_counts_as_zero(self) -> None:
        crit = SegmentationCriterion(classes=(1, 2, 3), miou_threshold=0.3)
        pred = SEG_PRED.copy()
        pred[3, 3] = 3                                   # a false class-3 pixel
        iou = segmentation_iou(pred, SEG_GT, crit)[0]
        assert iou[2] == 0.0
        # class 2 lost one predicted pixel: truth 3, pred 3, both 2 -> 2 / 4
        np.testing.assert_allclose(iou, [0.6, 0.5, 0.0])
        assert segmentation_miou(pred, SEG_GT, crit)[0] == pytest.approx(1.1 / 3)
        gt_only = SEG_GT.copy()
        gt_only[0, 3] = 3                                # a missed class-3 pixel
        assert segmentation_iou(SEG_PRED, gt_only, crit)[0, 2] == 0.0

    def test_all_classes_absent(self) -> None:
        """No class of interest in prediction or truth: mIoU undefined (NaN); the image is
        judged by all_absent (default 'correct')."""
        bg = np.zeros((4, 4), dtype=np.int64)
        crit = SegmentationCriterion(classes=(1, 2))
        assert np.isnan(segmentation_miou(bg, bg, crit)[0])
        assert segmentation_correct(bg, bg, crit).tolist() == [True]
        strict = SegmentationCriterion(classes=(1, 2), all_absent="incorrect")
        assert segmentation_correct(bg, bg, strict).tolist() == [False]
        # a class of interest predicted on a background image: IoU 0, never "absent"
        fp = bg.copy()
        fp[0, 0] = 1
        assert segmentation_correct(fp, bg, crit).tolist() == [False]
        # all pixels ignored: nothing to judge either
        ign = np.full((4, 4), 255)
        assert segmentation_correct(SEG_PRED, ign, crit).tolist() == [True]

    def test_score_maps_reduce_by_argmax(self) -> None:
        """IEEE-C5: per pixel top-1 (C2 Alternative 1) from per-class scores."""
        c = 3
        onehot = np.eye(c)[np.clip(SEG_PRED, 0, c - 1)]              # (H, W, C)
        chw = onehot.transpose(2, 0, 1)
        assert np.array_equal(masks_from_scores(chw[None], layout="nchw")[0],
                              np.clip(SEG_PRED, 0, 2))
        p_hwc = SegmentationPrediction(scores=onehot, layout="hwc")
        p_chw = SegmentationPrediction(scores=chw, layout="chw")
        assert np.array_equal(p_hwc.label_map(), p_chw.label_map())
        tie = np.zeros((1, 2, 1, 1))
        assert masks_from_scores(tie).tolist() == [[[0]]]            # ties: lower class
        with pytest.raises(InvalidArgument):
            SegmentationPrediction(mask=SEG_PRED, scores=chw).label_map()

    def test_batch_every_image_and_mixed_sizes(self) -> None:
        """Three images in one stacked batch, and a list with different sizes: each image is
        judged on its own (no 'first element only')."""
        good = SEG_GT.copy()
        good[3, :2] = 0                                  # the truth's ignore pixels
        bad = np.zeros_like(SEG_GT)
        preds = np.stack([good, bad, SEG_PRED])
        truths = np.stack([SEG_GT, SEG_GT, SEG_GT])
        assert segmentation_correct(preds, truths, self.CRIT).tolist() == [True, False, True]
        big_t = np.kron(SEG_GT, np.ones((2, 2), dtype=np.int64))     # 8 x 8
        big_p = np.kron(SEG_PRED, np.ones((2, 2), dtype=np.int64))
        out = segmentation_miou([SEG_PRED, big_p, bad], [SEG_GT, big_t, SEG_GT], self.CRIT)
        np.testing.assert_allclose(out, [0.5, 0.5, 0.0])

    def test_segmentation_is_vectorised(self, monkeypatch: pytest.MonkeyPatch) -> None:
        calls = {"n": 0}
        real = crs._seg_iou_block

        def count(*a: object) -> np.ndarray:
            calls["n"] += 1
            return real(*a)  # type: ignore[arg-type]

        monkeypatch.setattr(crs, "_seg_iou_block", count)
        rng = np.random.default_rng(0)
        maps = [rng.integers(0, 4, (16, 16)) for _ in range(500)]
        segmentation_correct(maps, maps[::-1], self.CRIT)
        assert calls["n"] == 1                           # one stacked call for 500 images

    @pytest.mark.parametrize(("classes", "lo", "hi"), [
        ((1, 2, 3), -2, 6),                      # few classes (confusion path), negative labels
        (tuple(range(0, 60, 3)), -1, 70),        # 20 classes: three-bincount path
        (tuple(range(300)), 0, 400),             # wide slot dtype
        ((5, 70000), 69990, 70010),              # labels too large for a lookup table
    ])
    def test_kernel_equals_a_per_class_loop(self, classes: tuple[int, ...], lo: int,
                                            hi: int) -> None:
        rng = np.random.default_rng(1)
        p = rng.integers(lo, hi, (40, 9, 7))
        t = rng.integers(lo, hi, (40, 9, 7))
        t[:, 0] = 999                            # the ignore label
        crit = SegmentationCriterion(classes=classes, ignore_label=999)
        got = segmentation_iou(p, t, crit)
        valid = t != 999
        ref = np.full(got.shape, np.nan)
        for k, c in enumerate(classes):
            inter = ((p == c) & (t == c) & valid).sum(axis=(1, 2))
            union = (((p == c) | (t == c)) & valid).sum(axis=(1, 2))
            ref[:, k] = np.where(union > 0, inter / np.maximum(union, 1), np.nan)
        assert np.array_equal(got, ref, equal_nan=True)
        assert not np.isnan(got).all()

    def test_errors(self) -> None:
        with pytest.raises(InvalidArgument) as exc:
            segmentation_iou([SEG_PRED[:3]], [SEG_GT], self.CRIT, image_ids=["im"])
        assert fields(exc.value) == ["predictions['im']"] and "shape" in exc.value.message
        with pytest.raises(InvalidArgument) as exc:
            segmentation_iou(SEG_PRED.astype(float), SEG_GT, self.CRIT)
        assert fields(exc.value) == ["predictions[0]"]

    def test_label_mapping(self) -> None:
        """IEEE-P6: dataset labels 10/20/0 -> service 1/2/0 (one-to-one); 255 passes."""
        ds = np.select([SEG_GT == 1, SEG_GT == 2, SEG_GT == 0], [10, 20, 0], SEG_GT)
        lm = LabelMapping({0: 0, 10: 1, 20: 2})
        np.testing.assert_allclose(segmentation_iou(SEG_PRED, ds, self.CRIT, label_mapping=lm),
                                   [[0.6, 0.4]])
        with pytest.raises(InvalidArgument) as exc:
            segmentation_iou(SEG_PRED, ds, self.CRIT, label_mapping=LabelMapping({0: 0, 10: 1}))
        assert fields(exc.value) == ["dataset.label_map"] and "20" in exc.value.message
        with pytest.raises(InvalidArgument) as exc:
            segmentation_iou(SEG_PRED, ds, self.CRIT,
                             label_mapping=LabelMapping({0: 0, 10: [1, 2], 20: 2}))
        assert fields(exc.value) == ["dataset.label_map"]

    @pytest.mark.parametrize(("d", "field"), [
        ({"miou_threshold": 0.5}, "segmentation.classes"),
        ({"classes": []}, "segmentation.classes"),
        ({"classes": [1, 1]}, "segmentation.classes"),
        ({"classes": [1], "miou_threshold": 1.0}, "segmentation.miou_threshold"),
        ({"classes": [1], "ignore_label": "x"}, "segmentation.ignore_label"),
        ({"classes": [1], "all_absent": "skip"}, "segmentation.all_absent"),
        ({"classes": [1], "colour": 1}, "segmentation.colour"),
    ])
    def test_criterion_invalid(self, d: dict, field: str) -> None:
        with pytest.raises(InvalidArgument) as exc:
            SegmentationCriterion.from_dict(d)
        assert field in fields(exc.value)

    def test_criterion_round_trip(self) -> None:
        c = SegmentationCriterion.from_dict({"classes": [3, 1], "miou_threshold": 0.6,
                                             "ignore_label": None, "all_absent": "incorrect"})
        assert c.classes == (3, 1) and SegmentationCriterion.from_dict(c.to_dict()) == c
