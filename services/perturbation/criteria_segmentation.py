"""The segmentation criterion of ``criteria.py`` (IEEE-C5): the mIoU over the classes of
interest at or below a threshold, with the soft mIoU of per-pixel probabilities as margin.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from fortis.core.task import Task
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.criteria_base import (
    Criterion,
    _check_iou_open,
    signed_margins,
)


@dataclass(frozen=True)
class MIoUBelow(Criterion):
    """IEEE-C5: the mIoU over ``classes`` between the answer and the reference mask is at or
    below ``miou_threshold`` (the image is no longer correct); reference pixels equal to
    ``ignore_label`` are left out; an undefined mIoU is met iff ``all_absent_incorrect``."""

    classes: tuple[int, ...]
    miou_threshold: float = 0.5
    ignore_label: int | None = 255
    all_absent_incorrect: bool = False
    task: Task = field(default=Task.SEGMENTATION, init=False)

    def __post_init__(self) -> None:
        cl = tuple(self.classes)
        if not cl or not all(isinstance(c, int | np.integer) and not isinstance(c, bool)
                             and c >= 0 for c in cl) or len(set(cl)) != len(cl):
            raise InvalidArgument("criterion.classes", "must be distinct class ids >= 0 (at "
                                  "least one)")
        object.__setattr__(self, "classes", tuple(int(c) for c in cl))
        _check_iou_open(self.miou_threshold, "criterion.miou_threshold")

    def describe(self) -> str:
        return (f"IEEE-C5 mIoU over classes {list(self.classes)} at or below "
                f"{self.miou_threshold:g}")

    def mask_margins(self, maps: np.ndarray, refs: np.ndarray,
                     probabilities: np.ndarray | None = None) -> np.ndarray:
        """(n, H, W) answers against (n, H, W) references -> (n,) margins, < 0 exactly when
        met. ``probabilities`` (n, H, W, C) adds the soft mIoU (module docstring)."""
        from fortis.core.matching import iou_per_class, mean_iou, miou_correct
        classes = np.array(self.classes, dtype=np.int64)
        order = np.argsort(classes)
        iou = iou_per_class(np.asarray(maps), np.asarray(refs), classes[order],
                            self.ignore_label)
        miou = mean_iou(iou)
        met = ~miou_correct(miou, self.miou_threshold, not self.all_absent_incorrect)
        value = np.where(np.isnan(miou), 1.0, miou) - self.miou_threshold
        if probabilities is not None:
            value = value + np.nan_to_num(self.soft_miou(probabilities, refs), nan=0.0)
        return signed_margins(value, met)

    def soft_miou(self, probabilities: np.ndarray, refs: np.ndarray) -> np.ndarray:
        """(n, H, W, C) per-pixel probabilities against (n, H, W) references -> (n,) mean
        over the classes of interest of sum(p r) / sum(p + r - p r) (NaN where no class has
        mass in either)."""
        p = np.asarray(probabilities, dtype=np.float32)
        r = np.asarray(refs)
        valid = np.ones(r.shape, bool) if self.ignore_label is None else r != self.ignore_label
        n = p.shape[0]
        out = np.zeros((n, len(self.classes)))
        vf = valid.reshape(n, -1).astype(np.float32)
        for j, c in enumerate(self.classes):
            pc = p[..., c].reshape(n, -1) * vf if c < p.shape[-1] else np.zeros_like(vf)
            rc = (r == c).reshape(n, -1).astype(np.float32) * vf
            inter = (pc * rc).sum(axis=1, dtype=np.float64)
            union = (pc + rc).sum(axis=1, dtype=np.float64) - inter
            with np.errstate(invalid="ignore", divide="ignore"):
                out[:, j] = np.where(union > 1e-9, inter / np.maximum(union, 1e-9), np.nan)
        with np.errstate(invalid="ignore"):
            return np.asarray(np.nanmean(np.where(np.isnan(out), np.nan, out), axis=1)
                              if out.size else np.full(n, np.nan))
