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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

import numpy as np
from fortis.core.task import Task

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


Answers: TypeAlias = ClassificationAnswers | DetectionAnswers | SegmentationAnswers

#: The answers type of each task.
ANSWER_TYPES: Final[Mapping[Task, type[Answers]]] = {
    Task.CLASSIFICATION: ClassificationAnswers,
    Task.DETECTION: DetectionAnswers,
    Task.SEGMENTATION: SegmentationAnswers,
}
