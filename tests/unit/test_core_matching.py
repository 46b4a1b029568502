"""The domain kernel (``fortis.core``): the IEEE-C4 matching rule checked against a plain-Python
reference of its documented wording (random tie-heavy batches, chunk borders, rank limits,
score thresholds), the box helpers, the task enum and the answers shared by the evaluation
and scoring services."""

from __future__ import annotations

import numpy as np
import pytest
from fortis.core import matching as core_matching
from fortis.core.answers import (
    ANSWER_TYPES,
    ClassAnswers,
    ClassificationAnswers,
    DetectionAnswers,
    SegmentationAnswers,
)
from fortis.core.boxes import iou_xyxy, pair_iou, rows_to_xyxy
from fortis.core.matching import match_batch, rank_limit
from fortis.core.task import TASKS, Task
from fortis.services.common.matching import match_objects

# ---------------------------------------------------------------- reference -----------------


def ref_iou(a: list[float], b: list[float]) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1])
    return inter / (union - inter)


def ref_match(g_boxes: list[list[float]], g_labels: list[set[int]], p_boxes: list[list[float]],
              p_labels: list[int], p_scores: list[float], *, iou_threshold: float,
              limit: int | None, score_threshold: float | None = None) -> list[int]:
    """Plain-Python reading of the documented greedy one-to-one IEEE-C4 matching of one
    image: the box index matched to each object (-1: none)."""
    keep = [j for j in range(len(p_boxes))
            if score_threshold is None or p_scores[j] >= score_threshold]
    pairs = []
    for i, gb in enumerate(g_boxes):
        for j in keep:
            v = ref_iou(gb, p_boxes[j])
            if v > iou_threshold:
                pairs.append((v, p_scores[j], j, i))
    pairs.sort(key=lambda x: (-x[0], -x[1], x[2], x[3]))
    matched: dict[int, int] = {}
    used: set[int] = set()
    rank = [0] * len(g_boxes)
    for _v, _s, j, i in pairs:
        if i in matched or j in used:
            continue
        ok = p_labels[j] in g_labels[i] and (limit is None or rank[i] < limit)
        rank[i] += 1
        if ok:
            matched[i] = j
            used.add(j)
    return [matched.get(i, -1) for i in range(len(g_boxes))]


def _random_batch(rng: np.random.Generator, n: int) -> list[tuple[np.ndarray, ...]]:
    """Integer-grid boxes on a small canvas, scores on a coarse grid: many exact IoU and
    score ties. Objects may accept one or two classes."""
    out = []
    for _ in range(n):
        def boxes(k: int) -> np.ndarray:
            xy = rng.integers(0, 8, (k, 2))
            wh = rng.integers(1, 6, (k, 2))
            return np.c_[xy, xy + wh].astype(float)
        g, p = int(rng.integers(0, 5)), int(rng.integers(0, 8))
        acc = np.full((g, 2), -1, np.int64)
        acc[:, 0] = rng.integers(0, 3, g)
        two = rng.random(g) < 0.3
        acc[two, 1] = rng.integers(0, 3, int(two.sum()))
        out.append((boxes(g), acc, boxes(p), rng.integers(0, 3, p),
                    rng.integers(1, 4, p) / 4))
    return out


def _flat(images: list[tuple[np.ndarray, ...]]) -> dict[str, np.ndarray]:
    return {"object_boxes": np.concatenate([x[0] for x in images]),
            "object_labels": np.concatenate([x[1] for x in images]),
            "object_counts": np.array([len(x[0]) for x in images]),
            "boxes": np.concatenate([x[2] for x in images]),
            "labels": np.concatenate([x[3] for x in images]),
            "scores": np.concatenate([x[4] for x in images]),
            "counts": np.array([len(x[2]) for x in images])}


def _expected(images: list[tuple[np.ndarray, ...]], **rule: object) -> list[int]:
    """The reference's matched box per object, as rows of the flat batch."""
    out, base = [], 0
    for gb, acc, pb, pl, ps in images:
        m = ref_match(gb.tolist(), [set(a[a >= 0].tolist()) for a in acc], pb.tolist(),
                      pl.tolist(), ps.tolist(), **rule)  # type: ignore[arg-type]
        out += [j + base if j >= 0 else -1 for j in m]
        base += len(pb)
    return out


RULES = [
    {"iou_threshold": 0.0, "limit": 1},
    {"iou_threshold": 0.3, "limit": 1},
    {"iou_threshold": 0.1, "limit": 2},
    {"iou_threshold": 0.25, "limit": None},
    {"iou_threshold": 0.0, "limit": None, "score_threshold": 0.5},
    {"iou_threshold": 0.2, "limit": 3, "score_threshold": 0.5},
]


class TestMatchBatch:
    @pytest.mark.parametrize("rule", RULES)
    def test_batch_equals_the_python_reference(self, rule: dict,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
        """Exactness on 600 random tie-heavy images, in one chunk and in chunks of 17 pairs
        (so chunk borders are crossed): every object's matched box is the reference's."""
        images = _random_batch(np.random.default_rng(7), 600)
        want = _expected(images, **rule)
        kw = {"iou_threshold": rule["iou_threshold"], "rank_limit": rule["limit"],
              "score_threshold": rule.get("score_threshold")}
        m = match_batch(**_flat(images), **kw)
        assert m.matched.tolist() == want
        assert m.found.tolist() == [j >= 0 for j in want]
        assert 0 < m.found.sum() < len(want)
        monkeypatch.setattr(core_matching, "_PAIR_CHUNK", 17)
        assert match_batch(**_flat(images), **kw).matched.tolist() == want

    def test_one_image_is_a_batch_of_one(self) -> None:
        """The per-image form (used by the attack criteria) gives the reference's verdicts
        image by image, in each mode."""
        images = _random_batch(np.random.default_rng(11), 200)
        for mode, limit in (("top1", 1), ("topk", 2), ("threshold", None)):
            for gb, acc, pb, pl, ps in images:
                labels = acc[:, 0]
                want = ref_match(gb.tolist(), [{int(x)} for x in labels], pb.tolist(),
                                 pl.tolist(), ps.tolist(), iou_threshold=0.2, limit=limit,
                                 score_threshold=0.5)
                got = match_objects(gb, labels, pb, pl, ps, iou_threshold=0.2,
                                    score_threshold=0.5, mode=mode, k=2)
                assert got.tolist() == [j >= 0 for j in want]

    def test_keep_and_missing_scores(self) -> None:
        """Boxes outside ``keep`` take no part; a box without a score (NaN) ranks last among
        equal IoUs and never passes a score threshold."""
        obj = np.array([[0, 0, 10, 10]], float)
        boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 10]], float)
        args = (obj, [1], [1], boxes, [1, 1])
        m = match_batch(*args, [np.nan, 0.2], [2], iou_threshold=0.5)
        assert m.matched.tolist() == [1]                       # NaN ranks below 0.2
        m = match_batch(*args, [np.nan, 0.2], [2], iou_threshold=0.5, keep=[True, False])
        assert m.matched.tolist() == [0] and m.kept.tolist() == [True, False]
        m = match_batch(*args, [np.nan, 0.2], [2], iou_threshold=0.5, score_threshold=0.1)
        assert m.kept.tolist() == [False, True] and m.matched.tolist() == [1]
        m = match_batch(*args, None, [2], iou_threshold=0.5)   # no scores: index order
        assert m.matched.tolist() == [0]

    def test_boxes_of_one_image_never_match_another(self) -> None:
        m = match_batch([[0, 0, 10, 10]], [1], [1, 0], [[0, 0, 10, 10]], [1], [0.9], [0, 1],
                        iou_threshold=0.5)
        assert m.found.tolist() == [False]

    def test_matching_is_vectorised_not_per_image(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Throughput by construction (no timed assertion): 2,000 images are matched with
        one IoU evaluation and one chunk, not one call per image."""
        images = _random_batch(np.random.default_rng(1), 2000)
        calls = {"iou": 0, "chunk": 0}
        real_iou, real_chunk = core_matching.pair_iou, core_matching._match_chunk

        def count_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            calls["iou"] += 1
            return real_iou(a, b)

        def count_chunk(*args: object) -> None:
            calls["chunk"] += 1
            real_chunk(*args)  # type: ignore[arg-type]

        monkeypatch.setattr(core_matching, "pair_iou", count_iou)
        monkeypatch.setattr(core_matching, "_match_chunk", count_chunk)
        m = match_batch(**_flat(images), iou_threshold=0.2)
        assert m.found.shape == (sum(len(x[0]) for x in images),)
        assert calls == {"iou": 1, "chunk": 1}

    def test_rank_limit(self) -> None:
        assert [rank_limit("top1", 5), rank_limit("topk", 3), rank_limit("threshold", 3)] \
            == [1, 3, None]


# ---------------------------------------------------------------- boxes ---------------------


class TestBoxes:
    def test_iou_values(self) -> None:
        a = [[0, 0, 10, 10]]
        assert iou_xyxy(a, [[10, 0, 20, 10]])[0, 0] == 0.0        # touching edge
        assert iou_xyxy(a, [[0, 0, 10, 5]])[0, 0] == 0.5          # contained, half the area
        assert iou_xyxy(a, [[5, 0, 15, 10]])[0, 0] == pytest.approx(50 / 150)
        assert iou_xyxy(a, [[3, 3, 3, 3]])[0, 0] == 0.0           # zero-area box

    def test_pair_iou_is_the_diagonal_of_the_pairwise_iou(self) -> None:
        rng = np.random.default_rng(0)
        xy = rng.uniform(0, 20, (50, 2))
        a = np.c_[xy, xy + rng.uniform(0, 10, (50, 2))]
        xy = rng.uniform(0, 20, (50, 2))
        b = np.c_[xy, xy + rng.uniform(0, 10, (50, 2))]
        np.testing.assert_array_equal(pair_iou(a, b), np.diagonal(iou_xyxy(a, b)))

    def test_formats_and_problems(self) -> None:
        xyxy, problems = rows_to_xyxy(np.array([[5.0, 5, 4, 2]]), "cxcywh", None)
        assert xyxy.tolist() == [[3.0, 4.0, 7.0, 6.0]] and problems == []
        xyxy, problems = rows_to_xyxy(np.array([[0.5, 0, 1, 1]]), "xyxyn", np.array([[10, 20]]))
        assert xyxy.tolist() == [[5.0, 0.0, 10.0, 20.0]] and problems == []
        _, problems = rows_to_xyxy(np.array([[0, 0, 1, 1], [5, 5, 1, 1]], float), "xyxy", None)
        assert [r for r, _ in problems] == [1] and "is it 'xywh'" in problems[0][1]
        _, problems = rows_to_xyxy(np.array([[0, 0, 2, 1]], float), "xyxyn", np.array([[4, 4]]))
        assert "must be in [0, 1]" in problems[0][1]
        _, problems = rows_to_xyxy(np.array([[0, np.nan, 2, 1]]), "xyxy", None)
        assert "finite" in problems[0][1]


# ---------------------------------------------------------------- tasks and answers ---------


def test_task_values_are_the_strings_they_replace() -> None:
    assert [str(t) for t in TASKS] == ["classification", "detection", "segmentation"]
    assert Task.DETECTION == "detection" and Task("segmentation") is Task.SEGMENTATION
    assert {"detection": 1}[Task.DETECTION] == 1 and f"{Task.CLASSIFICATION}" == "classification"


def test_one_answers_type_per_task_for_both_services() -> None:
    """One definition: the evaluation service's name and the scoring service's are the same
    classes; ``n`` counts the images whether or not per-image errors are recorded."""
    from fortis.services.evaluation import answers as evaluation_answers
    from fortis.services.scoring import evaluation_data
    assert ClassAnswers is ClassificationAnswers
    assert evaluation_answers.ClassAnswers is evaluation_data.ClassificationAnswers
    assert evaluation_answers.DetectionAnswers is evaluation_data.DetectionAnswers
    assert evaluation_answers.SegmentationAnswers is evaluation_data.SegmentationAnswers
    assert ANSWER_TYPES[Task.DETECTION] is DetectionAnswers
    scored = ClassificationAnswers(labels=np.zeros((3, 2), np.int64))
    recorded = ClassAnswers.from_rows([[1, 2], [3]], [[0.5, 0.25], None], ["", "timeout"])
    assert scored.n == 3 and scored.errors == () and recorded.n == 2
    assert recorded.scores is not None and np.isnan(recorded.scores[1]).all()
    det = DetectionAnswers(boxes=np.zeros((1, 4)), labels=np.zeros(1, np.int64),
                           scores=np.ones(1), counts=np.array([0, 1]))
    assert det.n == 2 and DetectionAnswers.failed(4, "down").n == 4
    seg = SegmentationAnswers(class_maps=np.zeros((5, 2, 2), np.int64))
    assert seg.n == 5 and SegmentationAnswers.failed(2, "down").n == 2
