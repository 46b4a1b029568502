"""The detection/segmentation readers of the Open Inference Protocol adapter on hostile output
tensors (NaN boxes, wrong shapes, counts past the tensor, negative counts, huge dimensions,
wrong datatypes, classes outside the label set) and the task options of the target URL: each
is a ``TargetResponseError`` / ``InvalidArgument`` naming the output tensor or the option.
The answers of well-formed tensors are checked against a real MLServer in
tests/integration/test_kserve_v2_tasks_mlserver.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fortis.adapters.kserve_v2 import OutTensor, TargetResponseError, parse_url
from fortis.adapters.kserve_v2.tasks import decode_class_maps, decode_detections
from fortis.services.common.errors import InvalidArgument

DET = "kserve+http://h:1/m?task=detection"
SEG = "kserve+http://h:1/m?task=segmentation"


def _t(
    name: str, arr: np.ndarray, datatype: str = "FP32", shape: tuple[int, ...] | None = None
) -> OutTensor:
    a = np.asarray(arr)
    return OutTensor(name, datatype, tuple(a.shape) if shape is None else shape, a.ravel())


def _tf(boxes, classes, scores, counts) -> list[OutTensor]:
    return [
        _t("detection_boxes", np.asarray(boxes, np.float32)),
        _t("detection_classes", np.asarray(classes, np.float32)),
        _t("detection_scores", np.asarray(scores, np.float32)),
        _t("num_detections", np.asarray(counts, np.float32)),
    ]


TF = f"{DET}&box_format=yxyx&box_coords=normalised&label_offset=1"


def test_tf_object_detection_tensors_become_pixel_boxes_of_the_image():
    boxes = [
        [[0.1, 0.2, 0.5, 0.6], [0.0, 0.0, 1.0, 1.0], [0, 0, 0, 0]],
        [[0.5, 0.5, 1.0, 1.0], [0, 0, 0, 0], [0, 0, 0, 0]],
    ]
    det = decode_detections(
        _tf(boxes, [[1, 3, 0], [2, 0, 0]], [[0.6, 0.9, 0], [0.7, 0, 0]], [2, 1]),
        parse_url(TF).detection,
        [(100, 200), (50, 40)],
        [(100, 200), (50, 40)],
        3,
    )
    assert det.counts.tolist() == [2, 1]
    # best score first; yxyx normalised -> xyxy pixels of each image's own size
    np.testing.assert_allclose(
        det.boxes, [[0, 0, 200, 100], [40, 10, 120, 50], [20, 25, 40, 50]], atol=1e-4
    )
    assert det.labels.tolist() == [2, 0, 1] and np.allclose(det.scores, [0.9, 0.6, 0.7])


def test_pixel_boxes_in_the_resized_frame_are_scaled_back_and_padding_rows_dropped():
    opts = parse_url(f"{DET}&box_format=cxcywh&min_score=0.5")
    outs = [
        _t("boxes", np.asarray([[[32, 24, 16, 8], [1, 1, 1, 1], [5, 5, 2, 2]]], np.float32)),
        _t("labels", np.asarray([[4, -1, 1]]), "INT64"),
        _t("scores", np.asarray([[0.8, 0.99, 0.1]], np.float32)),
    ]
    det = decode_detections(outs, opts.detection, [(96, 128)], [(48, 64)])
    # the -1 row is padding, the 0.1 row is under min_score; 2x scale from 48x64 to 96x128
    assert det.counts.tolist() == [1] and det.labels.tolist() == [4]
    np.testing.assert_allclose(det.boxes, [[48, 40, 80, 56]])


@pytest.mark.parametrize(
    ("outs", "words"),
    [
        (_tf([[[np.nan, 0, 1, 1]]], [[1]], [[0.5]], [1]), ("detection_boxes", "row 0", "finite")),
        (_tf([[[0, 0, 1, 1]]], [[1]], [[np.nan]], [1]), ("detection_scores", "[0, 1]")),
        (_tf([[[0, 0, 1, 1]]], [[1]], [[7.5]], [1]), ("detection_scores", "7.5")),
        (_tf([[[0, 0, 1, 1]]], [[1.5]], [[0.5]], [1]), ("detection_classes", "whole number")),
        (_tf([[[0, 0, 1, 1]]], [[9]], [[0.5]], [1]), ("detection_classes", "class 9", "0..2")),
        (
            _tf([[[0, 0, 1, 1]]], [[1]], [[0.5]], [2]),
            ("num_detections", "count 2 exceeds", "1 rows"),
        ),
        (_tf([[[0, 0, 1, 1]]], [[1]], [[0.5]], [-1]), ("num_detections", "negative")),
        (_tf([[[0, 0, 1, 1]]], [[1]], [[0.5]], [np.inf]), ("num_detections", "whole number")),
        (_tf([[[0, 0, 1, 1]]], [[1]], [[0.5]], [[1, 1]]), ("num_detections", "shape [1, 2]")),
        (
            _tf([[[0, 0, 1]]], [[1]], [[0.5]], [1]),
            ("detection_boxes", "shape [1, 1, 3]", "[1, K, 4]"),
        ),
        (_tf([[[0, 0, 1, 1]]], [[1, 1]], [[0.5]], [1]), ("detection_classes", "2 rows")),
        (_tf([[[0, 0, 2, 1]]], [[1]], [[0.5]], [1]), ("detection_boxes", "[0, 1]", "normalised")),
        (_tf([[[0.5, 0.5, 0.1, 0.1]]], [[1]], [[0.5]], [1]), ("detection_boxes", "negative")),
        (
            [_t("detection_scores", np.zeros((1, 1), np.float32))],
            ("no boxes output", "boxes_output"),
        ),
        (
            [_t("detection_boxes", np.zeros(0, np.float32), shape=(1, 10**9, 4))],
            ("detection_boxes", "1000000000 rows"),
        ),
    ],
)
def test_hostile_detection_tensors_name_the_output(outs, words):
    with pytest.raises(TargetResponseError) as ei:
        decode_detections(outs, parse_url(TF).detection, [(10, 10)], [(10, 10)], 3)
    for w in words:
        assert w in ei.value.message, ei.value.message


def test_named_outputs_must_be_answered():
    opts = parse_url(f"{DET}&boxes_output=out0&scores_output=out9")
    with pytest.raises(TargetResponseError, match=r"no output 'out9' \(scores_output\)"):
        decode_detections(
            [_t("out0", np.zeros((1, 1, 4), np.float32))], opts.detection, [(4, 4)], [(4, 4)]
        )


def test_class_maps_from_maps_score_maps_and_a_stride_two_output():
    m = np.asarray([[[0, 1], [2, 1]]], np.int64)  # [1, 2, 2]
    (got,) = decode_class_maps(_t("seg", m, "INT64"), parse_url(SEG), [(4, 4)], [(2, 2)], 3)
    assert got.dtype == np.int32 and got.tolist() == [
        [0, 0, 1, 1],
        [0, 0, 1, 1],
        [2, 2, 1, 1],
        [2, 2, 1, 1],
    ]
    logits = np.zeros((2, 3, 3, 5), np.float32)  # [N, C, H, W]
    logits[0, 2] = 1.0
    logits[1, 1, 0, 0] = 5.0
    a, b = decode_class_maps(_t("logits", logits), parse_url(SEG), [(3, 5)] * 2, [(3, 5)] * 2)
    assert (a == 2).all() and b[0, 0] == 1 and (b.ravel()[1:] == 0).all()
    hwc = np.moveaxis(logits, 1, -1)
    a2, b2 = decode_class_maps(
        _t("logits", hwc), parse_url(f"{SEG}&mask_layout=hwc"), [(3, 5)] * 2, [(3, 5)] * 2
    )
    assert np.array_equal(a, a2) and np.array_equal(b, b2)
    prob = np.asarray([[[[0.2, 0.9]]]], np.float32)  # [1, 1, 1, 2]
    (fg,) = decode_class_maps(
        _t("p", prob), parse_url(f"{SEG}&mask_threshold=0.5"), [(1, 2)], [(1, 2)]
    )
    assert fg.tolist() == [[0, 1]]


@pytest.mark.parametrize(
    ("out", "words"),
    [
        (_t("seg", np.full((1, 2, 2), 0.5, np.float32)), ("'seg'", "not whole class ids")),
        (_t("seg", np.asarray([[[0, 7]]]), "INT64"), ("'seg'", "class 7", "0..2")),
        (_t("seg", np.asarray([[[0, -3]]]), "INT64"), ("'seg'", "class -3")),
        (_t("seg", np.full((1, 3, 2, 2), np.nan, np.float32)), ("'seg'", "NaN")),
        (_t("seg", np.full((1, 1, 2, 2), 3.5, np.float32)), ("'seg'", "foreground probability")),
        (_t("seg", np.zeros((1, 3, 5), np.int64), "INT64"), ("'seg'", "3x5 map", "4x4 image")),
        (
            _t("seg", np.zeros((2, 4, 4), np.int64), "INT64"),
            ("'seg'", "shape [2, 4, 4]", "1 image"),
        ),
        (
            _t("seg", np.zeros(0, np.int64), "INT64", (1, 100_000, 100_000)),
            ("'seg'", "not a usable mask"),
        ),
        (_t("seg", np.zeros(0, np.int64), "INT64", (1, 0, 4)), ("'seg'", "not a usable mask")),
    ],
)
def test_hostile_segmentation_tensors_name_the_output(out, words):
    with pytest.raises(TargetResponseError) as ei:
        decode_class_maps(out, parse_url(SEG), [(4, 4)], [(4, 4)], 3)
    for w in words:
        assert w in ei.value.message, ei.value.message


@pytest.mark.parametrize(
    ("query", "option"),
    [
        ("task=ocr", "task"),
        ("task=detection&box_format=ltrb", "box_format"),
        ("task=detection&box_format=xyxyn", "box_format"),
        ("task=detection&box_coords=percent", "box_coords"),
        ("task=detection&label_offset=one", "label_offset"),
        ("task=detection&min_score=nan", "min_score"),
        ("task=detection&min_score=1.5", "min_score"),
        ("task=segmentation&mask_layout=whc", "mask_layout"),
        ("task=segmentation&mask_threshold=-1", "mask_threshold"),
        ("box_format=xywh", "box_format"),  # a detection option without task=detection
        ("task=segmentation&count_output=n", "count_output"),
        ("task=detection&output=logits", "output"),
        ("task=detection&output_name=boxes", "output_name"),
    ],
)
def test_bad_task_options_name_the_option(query, option):
    with pytest.raises(InvalidArgument) as ei:
        parse_url(f"kserve+grpc://h:1/m?{query}")
    assert f"kserve option '{option}'" in str(ei.value)


def test_task_options_parse():
    o = parse_url(f"{TF}&min_score=0.25&count_output=n&boxes_output=b").detection
    assert (parse_url(TF).task, o.box_format, o.box_normalised, o.label_offset, o.min_score) == (
        "detection",
        "yxyx",
        True,
        1,
        0.25,
    )
    assert (o.count_output, o.boxes_output, o.scores_output) == ("n", "b", "")
    assert parse_url("kserve+http://h:1/m").task == "classification"
    assert math.isclose(parse_url(f"{SEG}&mask_threshold=0.3").mask_threshold, 0.3)
