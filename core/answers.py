"""What a target answered for a batch of images, as arrays: one type per task, shared by the
evaluation service (which records answers) and the scoring service (which judges them).

- :class:`ClassificationAnswers` (also :data:`ClassAnswers`): ranked labels ``[n, k]``
  (int64, best first, -1 padded) and their scores ``[n, k]`` (float32, NaN padded; ``None``
  for a labels-only target). Every label and score the target returned is kept, so ranking
  and degradation profiles work on full score vectors.
- :class:`DetectionAnswers`: the boxes of all images stacked ``[R, 4]`` (pixel xyxy), their
  labels and scores ``[R]`` (NaN where the target gave none), and ``counts[n]``: image n owns
  that many consecutive rows (IEEE-C4).
- :class:`SegmentationAnswers`: class maps ``[n, H, W]`` (int64; a failed answer is -1).

Each carries ``errors``: per image, why its query failed ("" = answered). The scoring
service receives the errors of a setting beside its answers, so there ``errors`` is empty;
:attr:`n` counts the images either way. Built by keyword; plain frozen records (no
validation: whoever builds them from a message or a recording checks the shapes).

Each converts itself from and to the target's answers, ``fortis.common.v1.Prediction``
messages, one per image (the way KServe keeps conversion on its request type):
``from_proto(predictions)`` keeps a prediction of another task, or a class map it cannot use,
as that image's error; ``to_proto()`` gives an empty prediction (no result) for a failed
image, so ``from_proto(a.to_proto())`` is ``a`` for every answered image.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

import numpy as np
from fortis.client.errors import InvalidArgument
from fortis.common.v1 import common_pb2
from fortis.core.task import Task
from fortis.core.tensors import fill_tensor, tensor_to_array

__all__ = ["ANSWER_TYPES", "Answers", "ClassAnswers", "ClassificationAnswers",
           "DetectionAnswers", "SegmentationAnswers"]


def _pad_stack(rows: Sequence[np.ndarray], k: int, fill: Any, dtype: Any) -> np.ndarray:
    out = np.full((len(rows), k), fill, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


@dataclass(frozen=True, kw_only=True, eq=False)
class ClassificationAnswers:
    """Classification answers of n images."""

    labels: np.ndarray                 # [n, k] int64, best first, -1 padded
    scores: np.ndarray | None = None   # [n, k] float32, NaN padded; None: labels only
    errors: tuple[str, ...] = ()       # per image, "" = answered; () = not recorded here

    @property
    def n(self) -> int:
        return len(self.errors) if self.errors else len(self.labels)

    @classmethod
    def from_rows(cls, labels: Sequence[Sequence[int]], scores: Sequence[Sequence[float] | None],
                  errors: Sequence[str]) -> ClassificationAnswers:
        """From per-image ranked labels and scores (None = that answer has no scores)."""
        k = max([len(x) for x in labels] + [1])
        lab = _pad_stack([np.asarray(x, dtype=np.int64) for x in labels], k, -1, np.int64)
        has_scores = any(s is not None and len(s) for s in scores)
        sc = None
        if has_scores:
            sc = _pad_stack([np.asarray(s if s is not None else [], dtype=np.float32)
                             for s in scores], k, np.nan, np.float32)
        return cls(labels=lab, scores=sc, errors=tuple(errors))

    @classmethod
    def failed(cls, n: int, message: str) -> ClassificationAnswers:
        return cls(labels=np.full((n, 1), -1, dtype=np.int64), scores=None,
                   errors=(message,) * n)

    def top1(self) -> np.ndarray:
        return self.labels[:, 0]

    @classmethod
    def from_proto(cls, preds: Sequence[common_pb2.Prediction]) -> ClassificationAnswers:
        """From the target's predictions, one per image (ranked labels and, where every class
        of an answer has one, scores)."""
        labels, scores, errs = [], [], []
        for p in preds:
            cls_ = p.classification.classes
            labels.append([int(c.label) for c in cls_])
            has = bool(cls_) and all(c.HasField("score") for c in cls_)
            scores.append([float(c.score) for c in cls_] if has else None)
            errs.append("" if p.WhichOneof("result") == "classification" else
                        f"expected a classification answer, got {p.WhichOneof('result') or 'nothing'}")
        return cls.from_rows(labels, scores, errs)

    def to_proto(self) -> list[common_pb2.Prediction]:
        """One prediction per image: its ranked labels (padding dropped) with their scores
        (none for a labels-only answer); a failed image's has no result."""
        out = []
        for i in range(self.n):
            p = common_pb2.Prediction()
            out.append(p)
            if self.errors and self.errors[i]:
                continue
            p.classification.SetInParent()
            row = self.labels[i]
            keep = row >= 0
            if self.scores is None:
                for label in row[keep]:
                    p.classification.classes.add(label=int(label))
            else:
                for label, score in zip(row[keep], self.scores[i][keep], strict=True):
                    p.classification.classes.add(label=int(label), score=float(score))
        return out


#: The evaluation service's name for :class:`ClassificationAnswers`.
ClassAnswers = ClassificationAnswers


@dataclass(frozen=True, kw_only=True, eq=False)
class DetectionAnswers:
    """Detection answers of n images, boxes stacked: image n owns ``counts[n]`` rows."""

    boxes: np.ndarray        # [R, 4] pixel xyxy
    labels: np.ndarray       # [R] int64
    scores: np.ndarray       # [R] float, NaN where the target gave no score
    counts: np.ndarray       # [n] int64
    errors: tuple[str, ...] = ()

    @property
    def n(self) -> int:
        return len(self.errors) if self.errors else len(self.counts)

    @classmethod
    def failed(cls, n: int, message: str) -> DetectionAnswers:
        return cls(boxes=np.zeros((0, 4), np.float32), labels=np.zeros(0, np.int64),
                   scores=np.zeros(0, np.float32), counts=np.zeros(n, np.int64),
                   errors=(message,) * n)

    @classmethod
    def from_proto(cls, preds: Sequence[common_pb2.Prediction]) -> DetectionAnswers:
        """From the target's predictions, one per image (boxes in pixel xyxy)."""
        boxes: list[list[float]] = []
        labels: list[int] = []
        scores: list[float] = []
        counts: list[int] = []
        errs: list[str] = []
        for p in preds:
            if p.WhichOneof("result") != "detection":
                counts.append(0)
                errs.append(f"expected a detection answer, got {p.WhichOneof('result') or 'nothing'}")
                continue
            bs = p.detection.boxes
            boxes += [[b.x_min, b.y_min, b.x_max, b.y_max] for b in bs]
            labels += [int(b.label) for b in bs]
            scores += [float(b.score) for b in bs]
            counts.append(len(bs))
            errs.append("")
        return cls(boxes=np.asarray(boxes, np.float32).reshape(-1, 4),
                   labels=np.asarray(labels, np.int64), scores=np.asarray(scores, np.float32),
                   counts=np.asarray(counts, np.int64), errors=tuple(errs))

    def to_proto(self) -> list[common_pb2.Prediction]:
        """One prediction per image with its ``counts[n]`` boxes; a failed image's has no
        result."""
        out = []
        ends = np.cumsum(self.counts)
        for i in range(self.n):
            p = common_pb2.Prediction()
            out.append(p)
            if self.errors and self.errors[i]:
                continue
            p.detection.SetInParent()
            for r in range(int(ends[i] - self.counts[i]), int(ends[i])):
                x0, y0, x1, y1 = (float(v) for v in self.boxes[r])
                p.detection.boxes.add(x_min=x0, y_min=y0, x_max=x1, y_max=y1,
                                      label=int(self.labels[r]), score=float(self.scores[r]))
        return out


@dataclass(frozen=True, kw_only=True, eq=False)
class SegmentationAnswers:
    """Segmentation answers of n images (one size)."""

    class_maps: np.ndarray | None    # [n, H, W] int64, -1 = failed; None until a size is known
    errors: tuple[str, ...] = ()
    shapes: tuple[tuple[int, int], ...] = field(default=())   # answered sizes, per image

    @property
    def n(self) -> int:
        if self.errors:
            return len(self.errors)
        return len(self.class_maps) if self.class_maps is not None else len(self.shapes)

    @classmethod
    def failed(cls, n: int, message: str) -> SegmentationAnswers:
        return cls(class_maps=None, errors=(message,) * n, shapes=((0, 0),) * n)

    @classmethod
    def from_proto(cls, preds: Sequence[common_pb2.Prediction]) -> SegmentationAnswers:
        """From the target's predictions, one per image. A class map that is not a valid
        [height, width] tensor is that image's error (its message names the field); the maps
        are stacked when every answered image has one size (else ``class_maps`` is None and
        ``shapes`` says which sizes came)."""
        maps: list[np.ndarray | None] = []
        shapes: list[tuple[int, int]] = []
        errs: list[str] = []
        for k, p in enumerate(preds):
            m = None
            err = ""
            if p.WhichOneof("result") != "segmentation":
                err = f"expected a segmentation answer, got {p.WhichOneof('result') or 'nothing'}"
            else:
                try:
                    m = tensor_to_array(p.segmentation.class_map,
                                        f"predictions[{k}].segmentation.class_map")
                    if m.ndim != 2:
                        err, m = f"class_map must be [height, width], got {list(m.shape)}", None
                except InvalidArgument as exc:
                    err = str(exc)
            maps.append(None if m is None else m.astype(np.int64))
            shapes.append((0, 0) if m is None else (int(m.shape[0]), int(m.shape[1])))
            errs.append(err)
        sizes = {s for s in shapes if s != (0, 0)}
        stacked = None
        if len(sizes) == 1:
            h, w = sizes.pop()
            stacked = np.stack([m if m is not None and m.shape == (h, w)
                                else np.full((h, w), -1, np.int64) for m in maps])
        return cls(class_maps=stacked, errors=tuple(errs), shapes=tuple(shapes))

    def to_proto(self) -> list[common_pb2.Prediction]:
        """One prediction per image with its class map (int64); a failed image's, or one
        whose map is not held (answers of several sizes), has no result."""
        out = []
        for i in range(self.n):
            p = common_pb2.Prediction()
            out.append(p)
            if (self.errors and self.errors[i]) or self.class_maps is None:
                continue
            fill_tensor(p.segmentation.class_map, self.class_maps[i].astype(np.int64))
        return out


Answers: TypeAlias = ClassificationAnswers | DetectionAnswers | SegmentationAnswers

#: The answers type of each task.
ANSWER_TYPES: Final[Mapping[Task, type[Answers]]] = {
    Task.CLASSIFICATION: ClassificationAnswers,
    Task.DETECTION: DetectionAnswers,
    Task.SEGMENTATION: SegmentationAnswers,
}
