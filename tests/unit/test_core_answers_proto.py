"""The answer types' conversion from and to the target's ``fortis.common.v1.Prediction``
messages (``from_proto`` / ``to_proto``): round trips, and the per-image errors a wrong or
malformed answer gives (the texts the evaluation service recorded before)."""

from __future__ import annotations

import numpy as np
import pytest
from fortis.common.v1 import common_pb2
from fortis.core.answers import (
    ANSWER_TYPES,
    ClassificationAnswers,
    DetectionAnswers,
    SegmentationAnswers,
)
from fortis.core.task import Task
from fortis.core.tensors import fill_tensor


def _same(a, b) -> None:
    assert type(a) is type(b) and a.errors == b.errors
    for name in ("labels", "scores", "boxes", "counts", "class_maps"):
        x, y = getattr(a, name, None), getattr(b, name, None)
        if x is None or y is None:
            assert x is None and y is None, name
        else:
            assert x.dtype == y.dtype, name
            np.testing.assert_array_equal(x, y, err_msg=name)


def test_classification_round_trip_keeps_ranks_scores_and_padding():
    a = ClassificationAnswers.from_rows([[3, 1, 2], [7], []], [[0.6, 0.3, 0.1], [0.9], []],
                                        ["", "", ""])
    preds = a.to_proto()
    assert [p.WhichOneof("result") for p in preds] == ["classification"] * 3
    assert [c.label for c in preds[0].classification.classes] == [3, 1, 2]
    assert [c.label for c in preds[1].classification.classes] == [7]   # padding dropped
    _same(ClassificationAnswers.from_proto(preds), a)


def test_classification_labels_only_round_trip_has_no_scores():
    a = ClassificationAnswers.from_rows([[4], [2]], [None, None], ["", ""])
    preds = a.to_proto()
    assert not any(c.HasField("score") for p in preds for c in p.classification.classes)
    b = ClassificationAnswers.from_proto(preds)
    assert b.scores is None
    _same(b, a)


def test_detection_round_trip_keeps_each_images_boxes():
    a = DetectionAnswers(boxes=np.array([[1, 2, 11, 12], [0, 0, 5, 5], [3, 3, 9, 9]], np.float32),
                         labels=np.array([3, 1, 2], np.int64),
                         scores=np.array([0.75, 0.5, 0.25], np.float32),
                         counts=np.array([2, 0, 1], np.int64), errors=("", "", ""))
    preds = a.to_proto()
    assert [len(p.detection.boxes) for p in preds] == [2, 0, 1]
    assert preds[1].WhichOneof("result") == "detection"         # answered: no objects
    _same(DetectionAnswers.from_proto(preds), a)


def test_segmentation_round_trip_of_one_size():
    maps = np.arange(2 * 3 * 4, dtype=np.int64).reshape(2, 3, 4) % 5
    a = SegmentationAnswers(class_maps=maps, errors=("", ""), shapes=((3, 4), (3, 4)))
    b = SegmentationAnswers.from_proto(a.to_proto())
    _same(b, a)
    assert b.shapes == a.shapes


@pytest.mark.parametrize("task", list(Task))
def test_a_failed_image_has_no_result_and_reads_back_as_failed(task):
    a = ANSWER_TYPES[task].failed(2, "target down")
    preds = a.to_proto()
    assert len(preds) == 2 and all(p.WhichOneof("result") is None for p in preds)
    b = ANSWER_TYPES[task].from_proto(preds)
    assert b.n == 2
    assert b.errors == (f"expected a {task} answer, got nothing",) * 2


def test_an_answer_of_another_task_is_that_images_error():
    other = common_pb2.Prediction()
    other.segmentation.SetInParent()
    good = ClassificationAnswers.from_rows([[1]], [[0.9]], [""]).to_proto()[0]
    a = ClassificationAnswers.from_proto([good, other])
    assert a.errors == ("", "expected a classification answer, got segmentation")
    d = DetectionAnswers.from_proto([other])
    assert d.errors == ("expected a detection answer, got segmentation",)
    assert d.counts.tolist() == [0] and d.boxes.shape == (0, 4)


def test_a_malformed_class_map_names_its_field_and_keeps_the_others():
    good = common_pb2.Prediction()
    fill_tensor(good.segmentation.class_map, np.ones((2, 3), np.int32))
    short = common_pb2.Prediction()
    fill_tensor(short.segmentation.class_map, np.ones((2, 3), np.int32))
    short.segmentation.class_map.data = short.segmentation.class_map.data[:-1]
    flat = common_pb2.Prediction()
    fill_tensor(flat.segmentation.class_map, np.ones((6,), np.int32))
    a = SegmentationAnswers.from_proto([good, short, flat])
    assert a.errors == (
        "",
        "predictions[1].segmentation.class_map.data: 23 bytes do not match shape [2, 3] of "
        "D_TYPE_INT32",
        "class_map must be [height, width], got [6]")
    assert a.shapes == ((2, 3), (0, 0), (0, 0))
    assert a.class_maps is not None and a.class_maps.dtype == np.int64
    np.testing.assert_array_equal(a.class_maps[0], np.ones((2, 3)))
    np.testing.assert_array_equal(a.class_maps[1:], np.full((2, 2, 3), -1))


def test_class_maps_of_several_sizes_are_not_stacked():
    preds = []
    for shape in ((2, 3), (4, 4)):
        p = common_pb2.Prediction()
        fill_tensor(p.segmentation.class_map, np.zeros(shape, np.int32))
        preds.append(p)
    a = SegmentationAnswers.from_proto(preds)
    assert a.class_maps is None and a.shapes == ((2, 3), (4, 4)) and a.errors == ("", "")
    assert [p.WhichOneof("result") for p in a.to_proto()] == [None, None]
