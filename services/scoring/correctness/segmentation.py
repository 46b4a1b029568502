"""Semantic-segmentation correctness (IEEE Std 3129-2023 IEEE-C5, IEEE-P3, IEEE-P6). Domain
code: no gRPC.

Per pixel top-1 (IEEE-C2 Alternative 1): an ``(H, W)`` integer label map, or per-class score
maps reduced by argmax (ties go to the lower class index). For each class of interest c:
IoU_c = |pred == c and truth == c| / |pred == c or truth == c| over the pixels whose ground
truth is not the ``ignore_label`` (e.g. 255; the prediction at those pixels is ignored too). A
class absent from both prediction and ground truth (union 0) is left out of the mean; a class
present in only one of them has IoU 0 and counts. The image is correct iff the mean IoU over
the remaining classes *exceeds* (>) ``miou_threshold``. If every class of interest is absent
from both, the mIoU is undefined (NaN) and the image is judged by ``all_absent``:
``"correct"`` (default: the service rightly found none of the classes of interest, and M stays
the same for every setting, which IEEE-M4/M5 need) or ``"incorrect"``. A failed query makes
the image incorrect.

Vectorised: same-size images go through as one stack, in chunks of bounded size; per-class
IoUs come from bincounts over (image, truth slot, prediction slot), with no loop over classes
or images (``services/common/matching.py``: the one definition the perturbation service's
IEEE-C5 attack criterion uses too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
from fortis.core.criteria import ALL_ABSENT_POLICIES, SegmentationCriterion
from fortis.services.common.arrays import chunk_slices
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.matching import iou_per_class as _seg_iou_block
from fortis.services.common.matching import mean_iou, miou_correct
from fortis.services.scoring.correctness.common import (
    LabelMapping,
    image_name,
    rows_per_chunk,
)

__all__ = [
    "ALL_ABSENT_POLICIES",
    "SCORE_LAYOUTS",
    "SegmentationCriterion",
    "SegmentationPrediction",
    "masks_from_scores",
    "segmentation_correct",
    "segmentation_iou",
    "segmentation_miou",
]

#: Score-map layouts of a segmentation service (per image; a batch adds a leading N).
SCORE_LAYOUTS: Final = ("chw", "hwc")


@dataclass(frozen=True, kw_only=True, eq=False)
class SegmentationPrediction:
    """One answer of a segmentation service: an ``(H, W)`` integer label ``mask``, or per-class
    ``scores`` in ``layout`` ``"chw"`` (C, H, W) or ``"hwc"`` (H, W, C) reduced by argmax
    (IEEE-C5: per-pixel top-1). ``error``: the query failed (the image is incorrect)."""

    mask: npt.ArrayLike | None = None
    scores: npt.ArrayLike | None = None
    layout: str = "chw"
    error: str | None = None

    def label_map(self, *, field: str = "prediction") -> np.ndarray:
        if (self.mask is None) == (self.scores is None):
            raise InvalidArgument(field, "give exactly one of mask and scores")
        if self.mask is not None:
            return np.asarray(self.mask)
        return masks_from_scores(np.asarray(self.scores)[None], layout="n" + self.layout,
                                 field=f"{field}.scores")[0]


def masks_from_scores(scores: npt.ArrayLike, *, layout: str = "nchw",
                      field: str = "scores") -> np.ndarray:
    """Per-class score maps ``(N, C, H, W)`` (``nchw``) or ``(N, H, W, C)`` (``nhwc``) ->
    ``(N, H, W)`` int64 label maps by per-pixel argmax (ties: lower class index)."""
    sc = np.asarray(scores)
    if layout not in ("nchw", "nhwc"):
        raise InvalidArgument(f"{field}.layout", f"must be nchw or nhwc; got {layout!r}")
    if sc.ndim != 4 or sc.size == 0:
        raise InvalidArgument(field, f"must be 4-D {layout}, got shape {sc.shape}")
    if np.issubdtype(sc.dtype, np.floating) and np.isnan(sc).any():
        raise InvalidArgument(field, "scores contain NaN")
    return np.asarray(sc.argmax(axis=1 if layout == "nchw" else 3)).astype(np.int64)


def _mask_list(masks: npt.ArrayLike | Sequence[npt.ArrayLike], field: str) -> list[np.ndarray]:
    if isinstance(masks, np.ndarray):
        if masks.ndim == 2:
            return [masks]
        if masks.ndim == 3:
            return list(masks)
        raise InvalidArgument(field, f"must be (H, W) or (N, H, W) label maps, got shape "
                                     f"{masks.shape}")
    if not isinstance(masks, Sequence):
        raise InvalidArgument(field, "must be an array of label maps or a list of them")
    return [np.asarray(m) for m in masks]


def _stacked(masks: npt.ArrayLike | Sequence[npt.ArrayLike]) -> np.ndarray | None:
    if isinstance(masks, np.ndarray) and masks.ndim == 3:
        return masks
    return None


def segmentation_iou(
    predictions: npt.ArrayLike | Sequence[npt.ArrayLike],
    truths: npt.ArrayLike | Sequence[npt.ArrayLike],
    criterion: SegmentationCriterion,
    *,
    label_mapping: LabelMapping | None = None,
    image_ids: Sequence[str] | None = None,
    field: str = "predictions",
) -> np.ndarray:
    """Per-image, per-class IoU ``(N, Y)`` (columns in ``criterion.classes`` order; NaN where
    the class is absent from both prediction and ground truth). ``predictions`` and
    ``truths``: ``(N, H, W)`` integer label maps, one ``(H, W)`` map, or sequences of
    ``(H, W)`` maps (sizes may differ between images, never between an image's prediction and
    truth). ``label_mapping`` (IEEE-P6, one-to-one only) maps ground-truth labels to service
    labels; ``ignore_label`` pixels are left out. Three bincounts per chunk: no per-class loop."""
    classes = np.array(criterion.classes, dtype=np.int64)
    order = np.argsort(classes)
    cs = classes[order]
    y = len(cs)
    if label_mapping is not None and not label_mapping.one_to_one:
        raise InvalidArgument(label_mapping.field, "a segmentation label mapping must map each "
                                                   "dataset label to exactly one service label")
    ps, ts = _stacked(predictions), _stacked(truths)
    if ps is not None and ts is not None and ps.shape == ts.shape:
        _check_int(ps, field, image_ids, None)
        _check_int(ts, "truths", image_ids, None)
        out = np.empty((len(ps), y))
        for ch in chunk_slices(len(ps), rows_per_chunk(ps.shape[1] * ps.shape[2] + y + 2)):
            out[ch] = _seg_iou_block(ps[ch], _mapped(ts[ch], label_mapping, criterion), cs,
                                     criterion.ignore_label)
    else:
        pl, tl = _mask_list(predictions, field), _mask_list(truths, "truths")
        if len(pl) != len(tl):
            raise InvalidArgument(field, f"{len(pl)} predictions for {len(tl)} truths")
        groups: dict[tuple[int, ...], list[int]] = {}
        for n, (pm, tm) in enumerate(zip(pl, tl, strict=True)):
            _check_int(pm, field, image_ids, n)
            _check_int(tm, "truths", image_ids, n)
            if pm.shape != tm.shape or pm.ndim != 2:
                raise InvalidArgument(f"{field}[{image_name(image_ids, n)}]",
                                      f"label map of shape {pm.shape} for a ground truth of "
                                      f"shape {tm.shape} (both must be the same (H, W))")
            groups.setdefault(pm.shape, []).append(n)
        out = np.empty((len(pl), y))
        for shape, members in groups.items():       # same-size images go through as one stack
            for ch in chunk_slices(len(members), rows_per_chunk(int(np.prod(shape)) + y + 2)):
                rows = members[ch]
                out[rows] = _seg_iou_block(
                    np.stack([pl[r] for r in rows]),
                    _mapped(np.stack([tl[r] for r in rows]), label_mapping, criterion), cs,
                    criterion.ignore_label)
    inverse = np.empty(y, dtype=np.int64)
    inverse[order] = np.arange(y)
    return np.asarray(out[:, inverse])


def _check_int(m: np.ndarray, field: str, image_ids: Sequence[str] | None, n: int | None) -> None:
    if m.dtype.kind not in "iu":
        where = field if n is None else f"{field}[{image_name(image_ids, n)}]"
        raise InvalidArgument(where, f"label maps must be integers, got dtype {m.dtype} (give "
                                     "per-class scores as SegmentationPrediction.scores)")


def _mapped(truth: np.ndarray, mapping: LabelMapping | None,
            crit: SegmentationCriterion) -> np.ndarray:
    if mapping is None:
        return truth
    return mapping.map_array(truth, where="truths", ignore=crit.ignore_label)[..., 0]


def segmentation_miou(
    predictions: npt.ArrayLike | Sequence[npt.ArrayLike],
    truths: npt.ArrayLike | Sequence[npt.ArrayLike],
    criterion: SegmentationCriterion,
    *,
    label_mapping: LabelMapping | None = None,
    image_ids: Sequence[str] | None = None,
    field: str = "predictions",
) -> np.ndarray:
    """Per-image mIoU over the classes of interest present in prediction or truth (N,);
    NaN when none is (IEEE-C5)."""
    return mean_iou(segmentation_iou(predictions, truths, criterion,
                                     label_mapping=label_mapping, image_ids=image_ids,
                                     field=field))


def segmentation_correct(
    predictions: npt.ArrayLike | Sequence[npt.ArrayLike],
    truths: npt.ArrayLike | Sequence[npt.ArrayLike],
    criterion: SegmentationCriterion,
    *,
    label_mapping: LabelMapping | None = None,
    failed: npt.ArrayLike | None = None,
    image_ids: Sequence[str] | None = None,
    field: str = "predictions",
) -> np.ndarray:
    """IEEE-C5 for N images -> (N,) bool: mIoU over the classes of interest > threshold;
    all classes absent -> ``criterion.all_absent``; ``failed`` images are incorrect."""
    miou = segmentation_miou(predictions, truths, criterion, label_mapping=label_mapping,
                             image_ids=image_ids, field=field)
    ok = miou_correct(miou, criterion.miou_threshold, criterion.all_absent == "correct")
    if failed is not None:
        ok &= ~np.asarray(failed, dtype=bool).reshape(len(ok))
    return np.asarray(ok, dtype=bool)
