"""The perturbation engine and query client on detection / segmentation answers (issue 11):
raw predictions decoded for the judges (``proxy_client.decode_answer``), and one attack call
over images of different sizes (one run per size, results in place)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from fortis.common.v1 import common_pb2
from fortis.services.common.codec import fill_tensor
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
