"""Detection boxes for IEEE-C4 (IEEE Std 3129-2023 4.7.6.3): formats, validation, IoU and the
flat batch layout the matching works on. Domain code: no gRPC.

Boxes are validated inputs in an explicit format (:data:`BOX_FORMATS`): pixel ``xyxy``
(x1, y1, x2, y2), pixel ``xywh`` (x1, y1, width, height), pixel ``cxcywh``, and the same
normalised to [0, 1] (``xyxyn``, ``xywhn``, ``cxcywhn``), converted with the image size
(width, height). Coordinates are continuous (COCO convention: area = w * h, no +1).
Non-finite coordinates, zero- or negative-area boxes and normalised coordinates outside
[0, 1] are rejected with :class:`InvalidArgument` naming the box. Labels carry an explicit
``label_base`` (0- or 1-indexed) on each side, so a 0- vs 1-indexed mix-up is visible, never
silent.

:class:`Detections` is one image's boxes as given; :class:`DetectionBatch` holds N images'
boxes validated and converted to pixel xyxy in one flat (CSR) layout, so the matching in
:mod:`fortis.services.scoring.correctness.detection` is vectorised over the whole batch. The
conversion and IoU arithmetic are the domain kernel's (:mod:`fortis.core.boxes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from fortis.core.boxes import iou_xyxy
from fortis.core.criteria import BOX_FORMATS
from fortis.services.common.errors import FieldViolation, InvalidArgument
from fortis.services.common.matching import check_image_size as _check_size
from fortis.services.common.matching import convert_box_rows as _convert_rows
from fortis.services.common.matching import to_xyxy
from fortis.services.scoring.correctness.common import (
    image_name,
    raise_violations,
)

__all__ = [
    "BOX_FORMATS",
    "DetectionBatch",
    "Detections",
    "box_iou",
    "to_xyxy",
]



@dataclass(frozen=True, kw_only=True, eq=False)
class Detections:
    """One image's boxes: ground truth (``scores=None``) or a detection service's answer.

    ``boxes``: ``(n, 4)`` in ``box_format`` (:data:`BOX_FORMATS`); ``labels``: ``(n,)``
    integer class labels, ``label_base`` 0 or 1 (0- or 1-indexed); ``scores``: ``(n,)``
    confidences or ``None``; ``image_size``: ``(width, height)`` in pixels, needed by the
    normalised formats (when ``None``, the ground truth's size is used for a prediction);
    ``error``: the query failed (the image is then incorrect). Validation happens when a
    batch is built (:meth:`DetectionBatch.from_images`), vectorised over all images.
    """

    boxes: npt.ArrayLike
    labels: npt.ArrayLike
    scores: npt.ArrayLike | None = None
    box_format: str = "xyxy"
    label_base: int = 0
    image_size: tuple[int, int] | None = None
    error: str | None = None


def box_iou(a: npt.ArrayLike, b: npt.ArrayLike, *, box_format: str = "xyxy",
            image_size: tuple[int, int] | None = None) -> np.ndarray:
    """Pairwise IoU ``(n, m)`` of two validated box sets in one format. Touching boxes (a
    shared edge, no shared area) have IoU exactly 0."""
    x = to_xyxy(a, box_format, image_size=image_size, field="a")
    y = to_xyxy(b, box_format, image_size=image_size, field="b")
    return iou_xyxy(x, y)


@dataclass(frozen=True, eq=False)
class DetectionBatch:
    """N images' boxes in one flat (CSR) layout, validated: the vectorised input of IEEE-C4.

    ``boxes`` ``(T, 4)`` pixel xyxy float64; ``labels`` ``(T,)`` int64 as written;
    ``scores`` ``(T,)`` float64 (NaN where an image gave none) or ``None``; image n owns rows
    ``offsets[n]:offsets[n + 1]``; ``label_base`` ``(N,)``; ``failed`` ``(N,)`` (query
    failed: no rows, judged incorrect); ``image_ids`` and ``field`` name things in errors.
    Build with :meth:`from_images` or :meth:`from_arrays`.
    """

    boxes: np.ndarray
    labels: np.ndarray
    scores: np.ndarray | None
    offsets: np.ndarray
    label_base: np.ndarray
    failed: np.ndarray
    image_ids: tuple[str, ...] | None = None
    field: str = "detections"

    @property
    def n_images(self) -> int:
        return len(self.offsets) - 1

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    def image_of_row(self) -> np.ndarray:
        return np.repeat(np.arange(self.n_images), self.counts)

    def where(self, row: int, what: str = "boxes") -> str:
        n = int(np.searchsorted(self.offsets, row, side="right") - 1)
        return f"{self.field}[{image_name(self.image_ids, n)}].{what}[{row - int(self.offsets[n])}]"

    @classmethod
    def from_arrays(cls, *, boxes: npt.ArrayLike, labels: npt.ArrayLike, counts: npt.ArrayLike,
                    scores: npt.ArrayLike | None = None, box_format: str = "xyxy",
                    label_base: int = 0, image_sizes: npt.ArrayLike | None = None,
                    failed: npt.ArrayLike | None = None, image_ids: Sequence[str] | None = None,
                    field: str = "detections") -> DetectionBatch:
        """Flat arrays (all images' boxes one after the other; ``counts[n]`` rows for image
        n) in one format and label base -> validated batch. ``image_sizes`` ``(N, 2)``
        (width, height) is needed by the normalised formats."""
        cnt = np.asarray(counts, dtype=np.int64)
        n = len(cnt)
        if cnt.ndim != 1 or (cnt < 0).any():
            raise InvalidArgument(f"{field}.counts", "must be (N,) non-negative integers")
        if box_format not in BOX_FORMATS:
            raise InvalidArgument(f"{field}.box_format",
                                  f"must be one of {', '.join(BOX_FORMATS)}; got {box_format!r}")
        if label_base not in (0, 1) or isinstance(label_base, bool):
            raise InvalidArgument(f"{field}.label_base", f"must be 0 or 1; got {label_base!r}")
        total = int(cnt.sum())
        b = np.asarray(boxes, dtype=np.float64)
        if b.size == 0:
            b = b.reshape(0, 4)
        if b.ndim != 2 or b.shape[1] != 4:
            raise InvalidArgument(f"{field}.boxes", f"must be (T, 4), got shape {b.shape}")
        lab = _int_labels(labels, f"{field}.labels")
        if len(b) != total or len(lab) != total:
            raise InvalidArgument(field, f"counts sum to {total} boxes but got {len(b)} boxes "
                                         f"and {len(lab)} labels")
        sc = None
        if scores is not None:
            sc = np.asarray(scores, dtype=np.float64).reshape(-1)
            if len(sc) != total:
                raise InvalidArgument(f"{field}.scores", f"{len(sc)} scores for {total} boxes")
        fl = np.zeros(n, bool) if failed is None else np.asarray(failed, dtype=bool).reshape(n)
        wh = None
        if box_format.endswith("n"):
            if image_sizes is None:
                raise InvalidArgument(f"{field}.image_sizes", f"normalised '{box_format}' boxes "
                                                              "need each image's (width, height)")
            sizes = np.asarray(image_sizes, dtype=np.float64).reshape(n, 2)
            if not (np.isfinite(sizes).all() and (sizes > 0).all()):
                raise InvalidArgument(f"{field}.image_sizes", "must be (N, 2) positive sizes")
            wh = np.repeat(sizes, cnt, axis=0)
        offsets = np.concatenate([[0], np.cumsum(cnt)]).astype(np.int64)
        batch = cls(np.zeros((0, 4)), lab, sc, offsets, np.full(n, label_base, np.int64), fl,
                    tuple(map(str, image_ids)) if image_ids is not None else None, field)
        xyxy, violations = _convert_rows(b, box_format, wh, batch.where)
        raise_violations(violations)
        return cls(xyxy, lab, sc, offsets, batch.label_base, fl, batch.image_ids, field)

    @classmethod
    def from_images(cls, images: Sequence[Detections], *, field: str = "detections",
                    image_ids: Sequence[str] | None = None,
                    image_sizes: Sequence[tuple[int, int] | None] | None = None) -> DetectionBatch:
        """One :class:`Detections` per image -> validated batch. Each image may use its own
        box format and label base. ``image_sizes[n]`` is used for an image whose
        ``image_size`` is ``None`` (e.g. the ground truth's size for a prediction)."""
        n = len(images)
        ids = tuple(map(str, image_ids)) if image_ids is not None else None
        counts: list[int] = []
        bases: list[int] = []
        fmt_code: list[int] = []
        failed = np.zeros(n, bool)
        sizes = np.full((n, 2), np.nan)
        box_parts: list[np.ndarray] = []
        label_parts: list[np.ndarray] = []
        score_parts: list[np.ndarray | None] = []
        any_scores = False
        violations: list[FieldViolation] = []
        codes = {f: c for c, f in enumerate(BOX_FORMATS)}

        def bad(i: int, what: str, description: str) -> None:
            violations.append(FieldViolation(f"{field}[{image_name(ids, i)}]{what}", description))
            counts.append(0)
            bases.append(0)
            fmt_code.append(0)

        # lean per-image loop: shapes only; values are validated below, vectorised
        for i, d in enumerate(images):
            if not isinstance(d, Detections):
                bad(i, "", "must be a Detections")
                continue
            if d.error is not None:
                failed[i] = True
                counts.append(0)
                bases.append(0)
                fmt_code.append(0)
                continue
            code = codes.get(d.box_format)
            if code is None:
                bad(i, ".box_format", f"must be one of {', '.join(BOX_FORMATS)}; "
                                      f"got {d.box_format!r}")
                continue
            if d.label_base not in (0, 1) or isinstance(d.label_base, bool):
                bad(i, ".label_base", f"must be 0 or 1; got {d.label_base!r}")
                continue
            b = d.boxes if isinstance(d.boxes, np.ndarray) and d.boxes.dtype == np.float64 \
                else np.asarray(d.boxes, dtype=np.float64)
            if b.ndim != 2 or b.shape[1] != 4:
                if b.size != 0:
                    bad(i, ".boxes", f"must be (n, 4), got shape {np.shape(d.boxes)}")
                    continue
                b = b.reshape(0, 4)
            m = len(b)
            lab = d.labels if isinstance(d.labels, np.ndarray) else np.asarray(d.labels)
            if lab.shape != (m,):
                if not (m == 0 and lab.size == 0):
                    bad(i, ".labels", f"{lab.size} labels for {m} boxes")
                    continue
                lab = lab.reshape(0)
            sc = None
            if d.scores is not None:
                sc = np.asarray(d.scores, dtype=np.float64)
                if sc.shape != (m,):
                    if not (m == 0 and sc.size == 0):
                        bad(i, ".scores", f"{sc.size} scores for {m} boxes")
                        continue
                    sc = sc.reshape(0)
                any_scores = True
            if code >= 3:                       # normalised: needs the image size
                size = _check_size(d.image_size if d.image_size is not None else
                                   (image_sizes[i] if image_sizes is not None else None))
                if size is None:
                    bad(i, ".image_size", f"normalised '{d.box_format}' boxes need "
                                          f"image_size (width, height) > 0")
                    continue
                sizes[i] = size
            counts.append(m)
            bases.append(d.label_base)
            fmt_code.append(code)
            box_parts.append(b)
            label_parts.append(lab)
            score_parts.append(sc)
        raise_violations(violations)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        raw = np.concatenate(box_parts) if box_parts else np.zeros((0, 4))
        labels = _int_labels(np.concatenate(label_parts) if label_parts else np.zeros(0, np.int64),
                             f"{field}.labels")
        scores = np.concatenate([x if x is not None else np.full(len(b), np.nan)
                                 for x, b in zip(score_parts, box_parts, strict=True)]) \
            if any_scores else None
        base_arr = np.asarray(bases, dtype=np.int64)
        batch = cls(raw, labels, scores, offsets, base_arr, failed, ids, field)
        row_fmt = np.repeat(np.asarray(fmt_code, dtype=np.int64), counts)
        row_wh = np.repeat(sizes, counts, axis=0)
        xyxy = np.empty_like(raw)
        for code in np.unique(row_fmt).tolist():
            rows = np.flatnonzero(row_fmt == code)
            fmt = BOX_FORMATS[code]
            conv, v = _convert_rows(raw[rows], fmt, row_wh[rows] if fmt.endswith("n") else None,
                                    lambda r, rows=rows: batch.where(int(rows[r])))
            violations += v
            xyxy[rows] = conv
        raise_violations(violations)
        return cls(xyxy, labels, scores, offsets, base_arr, failed, ids, field)

    def take(self, index: npt.ArrayLike) -> DetectionBatch:
        """The batch of images ``index`` (in that order)."""
        idx = np.asarray(index, dtype=np.int64)
        cnt = self.counts[idx]
        starts = self.offsets[:-1][idx]
        rows = np.repeat(starts - np.concatenate([[0], np.cumsum(cnt)[:-1]]), cnt) \
            + np.arange(int(cnt.sum()))
        ids = tuple(self.image_ids[i] for i in idx.tolist()) if self.image_ids is not None \
            else None
        return DetectionBatch(self.boxes[rows], self.labels[rows],
                              None if self.scores is None else self.scores[rows],
                              np.concatenate([[0], np.cumsum(cnt)]).astype(np.int64),
                              self.label_base[idx], self.failed[idx], ids, self.field)


def _int_labels(labels: npt.ArrayLike, field: str) -> np.ndarray:
    lab = np.asarray(labels).reshape(-1)
    if lab.size == 0:
        return np.zeros(0, np.int64)
    if np.issubdtype(lab.dtype, np.integer):
        return lab.astype(np.int64)
    if np.issubdtype(lab.dtype, np.floating) and np.isfinite(lab).all() \
            and (lab == np.round(lab)).all():
        return lab.astype(np.int64)                  # e.g. a detector's float class column
    raise InvalidArgument(field, f"class labels must be integers, got dtype {lab.dtype}")
