"""The perturbation engine and query client on detection / segmentation answers:
raw predictions decoded for the judges (``proxy_client.decode_answer``), and one attack call
over images of different sizes (one run per size, results in place)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from fortis.common.v1 import common_pb2
from fortis.core.tensors import fill_tensor
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.engine import AttackItem, run_attack
from fortis.services.perturbation.judges import BoxAnswer, MaskAnswer
from fortis.services.perturbation.proxy_client import decode_answer


def test_decode_detection_and_segmentation_answers():
    p = common_pb2.Prediction()
    b = p.detection.boxes.add()
    b.x_min, b.y_min, b.x_max, b.y_max, b.label, b.score = 1, 2, 11, 12, 3, 0.75
    a = decode_answer(p, "detection", 0)
    assert isinstance(a, BoxAnswer)
    np.testing.assert_array_equal(a.boxes, [[1, 2, 11, 12]])
    assert a.labels.tolist() == [3] and a.scores.tolist() == [0.75]
    s = common_pb2.Prediction()
    fill_tensor(s.segmentation.class_map, np.array([[0, 1], [1, 1]], np.int32))
    fg = np.array([[0.1, 0.8], [0.6, 0.9]], np.float16)
    fill_tensor(s.segmentation.probabilities, np.stack([1 - fg, fg], axis=-1))
    m = decode_answer(s, "segmentation", 1)
    assert isinstance(m, MaskAnswer) and m.class_map.tolist() == [[0, 1], [1, 1]]
    assert m.probabilities is not None and m.probabilities.dtype == np.float32
    assert m.probabilities.shape == (2, 2, 2)
    with pytest.raises(InvalidArgument) as e:
        decode_answer(s, "detection", 4)
    assert e.value.violations[0].field == "predictions[4]"
    bad = common_pb2.Prediction()
    fill_tensor(bad.segmentation.class_map, np.zeros((2, 2), np.int32))
    fill_tensor(bad.segmentation.probabilities, np.zeros((3, 2, 2), np.float32))
    with pytest.raises(InvalidArgument) as e:
        decode_answer(bad, "segmentation", 2)
    assert e.value.violations[0].field == "predictions[2].segmentation.probabilities"


class _Detector:
    """A detector that finds the 'object' (the bright square) while its mean stays > 100."""

    task, signal = "detection", "boxes"

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[int, ...], list[str]]] = []

    def predictions(self, images: np.ndarray, ids: Sequence[str]) -> list[BoxAnswer]:
        self.calls.append((images.shape, list(ids)))
        out = []
        for im in images:
            v = float(im[4:12, 4:12].mean())
            s = np.array([min(1.0, v / 200.0)]) if v > 100 else np.zeros(0)
            out.append(BoxAnswer(boxes=np.array([[4.0, 4.0, 12.0, 12.0]])[:len(s)],
                                 labels=np.zeros(len(s), np.int64), scores=s))
        return out


def _img(h: int, w: int) -> np.ndarray:
    x = np.full((h, w, 3), 60, np.uint8)
    x[4:12, 4:12] = 140
    return x


def test_one_attack_call_over_images_of_different_sizes():
    items = [AttackItem(image_id="a", image=_img(16, 16)),
             AttackItem(image_id="b", image=_img(16, 24)),
             AttackItem(image_id="c", image=_img(16, 16))]
    crit = {"kind": "object_missed", "detection": {"iou_threshold": 0.5,
                                                   "score_threshold": 0.6}}
    q = _Detector()
    res = run_attack("square", {"epsilon": 0.2, "max_queries": 40}, 5, items, query=q,
                     criterion=crit)
    assert [r.adversarial.shape for r in res] == [(16, 16, 3), (16, 24, 3), (16, 16, 3)]
    # one run per size, in order of first appearance; never mixed shapes in one call
    assert {tuple(ids) for _, ids in q.calls} <= {("a", "c"), ("a",), ("c",), ("b",)}
    assert all(r.queries <= 40 and r.linf <= 0.2 + 1e-9 for r in res)
    assert all(r.signal == "boxes" and "IEEE-C4" in r.criterion for r in res)
    # the same call again: the same adversarials (seeded per run)
    again = run_attack("square", {"epsilon": 0.2, "max_queries": 40}, 5, items,
                       query=_Detector(), criterion=crit)
    for r, s in zip(res, again, strict=True):
        np.testing.assert_array_equal(r.adversarial, s.adversarial)


class _Brightness:
    """A classifier of brightness: class 0 below a mean of 140, 1 below 180, else 2."""

    task, signal = "classification", "scores"

    def scores(self, images: np.ndarray, ids: Sequence[str]) -> np.ndarray:
        m = images.reshape(len(images), -1).mean(axis=1)
        cls = np.where(m < 140, 0, np.where(m < 180, 1, 2))
        return np.eye(3)[cls] * 0.8 + 0.1 / 3

    def labels(self, images: np.ndarray, ids: Sequence[str]) -> np.ndarray:
        return np.asarray(self.scores(images, ids).argmax(axis=1))


def test_pertknob_takes_the_plans_per2_criterion():
    """PertKnob searches the smallest property level meeting the plan's criterion (PER-2):
    untargeted stops at class 1, targeted class 2 needs a brighter image; a criterion of
    another task is refused."""
    items = [AttackItem(image_id="a", image=np.full((8, 8, 3), 100, np.uint8), labels=(0,))]
    params = {"property": "per_brightness", "cells": 64, "max_queries": 20}
    q = _Brightness()
    plain = run_attack("pertknob", params, 1, items, query=q)[0]
    tgt = run_attack("pertknob", params, 1, items, query=q,
                     criterion={"kind": "targeted_misclassification", "target_label": 2})[0]
    assert plain.success and tgt.success
    assert q.labels(plain.adversarial[None], ["a"])[0] == 1
    assert q.labels(tgt.adversarial[None], ["a"])[0] == 2
    assert tgt.l2 > plain.l2 and "targeted misclassification as class 2" in tgt.criterion
    with pytest.raises(InvalidArgument):            # a segmentation criterion on a classifier
        run_attack("pertknob", params, 1, items, query=q,
                   criterion={"kind": "miou_below", "segmentation": {"classes": [1]}})


def test_ground_truth_without_objects_reaches_the_perturbation_service():
    """A detection image whose ground truth has no box is judged as scoring judges it (correct
    while no box is kept), not against the clean answer's detection: the runner's reference
    travels as ``no_objects`` and comes back as an empty reference."""
    from fortis.perturbation.v1 import perturbation_pb2 as ppb
    from fortis.services.evaluation.convert import fill_reference
    from fortis.services.perturbation.servicer import _objects

    empty, none, some = ppb.LabeledImage(), ppb.LabeledImage(), ppb.LabeledImage()
    fill_reference(empty, {"boxes": np.zeros((0, 4)), "labels": []})
    fill_reference(none, None)
    fill_reference(some, {"boxes": [[1, 2, 5, 6]], "labels": [3]})
    ref = _objects(empty, "images[0]")
    assert ref is not None and len(ref.boxes) == 0
    assert _objects(none, "images[1]") is None                  # the clean answer's
    got = _objects(some, "images[2]")
    assert got is not None and got.labels.tolist() == [3] and not some.no_objects
    np.testing.assert_array_equal(got.boxes, [[1, 2, 5, 6]])


def test_segmentation_predict_batches_stay_under_the_message_limit():
    """Class maps with per-pixel probabilities double a segmentation answer (8 bytes per
    pixel): a Predict batch is split so its answers stay under half the message limit."""
    from fortis.services.common.limits import MAX_ANSWER_BYTES_PER_CALL, request_batches

    parts = request_batches([(512, 512, 3)] * 40, max_images=64, task="segmentation")
    assert parts == [(0, 16), (16, 32), (32, 40)]
    assert all((e - s) * 512 * 512 * 8 <= MAX_ANSWER_BYTES_PER_CALL for s, e in parts)
    assert request_batches([(5000, 5000, 3)] * 2, max_images=64, task="segmentation") == \
        [(0, 1), (1, 2)]
    assert request_batches([(28, 28, 1)] * 5, max_images=2) == [(0, 2), (2, 4), (4, 5)]
    assert request_batches([], max_images=8, task="detection") == []


def test_batches_never_pass_the_request_limits():
    """An attack's query of images x rows per image, or a plan's largest batch of large
    images, is split at the per-request image count and the request's byte bound, whatever
    the caller's own limit (1,150 Fashion-MNIST rows of NES used to be one refused call)."""
    from fortis.services.common.limits import (
        MAX_IMAGE_BYTES_PER_CALL,
        MAX_IMAGES_PER_REQUEST,
        byte_batches,
        request_batches,
    )

    rows = request_batches([(28, 28, 1)] * 1150)
    assert rows == [(0, MAX_IMAGES_PER_REQUEST), (MAX_IMAGES_PER_REQUEST, 1150)]
    big = request_batches([(224, 224, 3)] * 1024, max_images=1024)
    assert len(big) > 1 and big[-1][1] == 1024
    assert all((e - s) * 224 * 224 * 3 <= MAX_IMAGE_BYTES_PER_CALL for s, e in big)
    assert [e - s for s, e in byte_batches([10] * 10, max_images=4)] == [4, 4, 2]
    huge = MAX_IMAGE_BYTES_PER_CALL + 1          # alone in its request: the server names it
    assert byte_batches([huge, 1, 1]) == [(0, 1), (1, 3)]
