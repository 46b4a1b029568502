"""Detection and segmentation answers of an Open Inference Protocol model, read from its output
tensors into Fortis's answer types (``DetectionAnswers``: pixel xyxy boxes of the image as
sent, what IEEE-C4 matching reads; class maps at the image's size, judged per IEEE-C5). Pure functions of the tensors and the options;
``TargetResponseError`` names the output tensor (and the image and row) that does not fit.

Detection follows what OIP detectors commonly emit -- the TensorFlow Object Detection API's
``detection_boxes`` / ``detection_classes`` / ``detection_scores`` / ``num_detections``, which
Triton's EfficientNMS and BatchedNMS plugins also use -- with a fixed number K of rows per image:

    boxes   [N, K, 4]   (or [K, 4] for one image)  in ``box_format``, pixel or normalised
    scores  [N, K]      in [0, 1]                  (optional unless named)
    classes [N, K]      integer-valued, any numeric datatype (TF gives FP32); -1 = padding
    count   [N] or [N, 1]  valid rows per image    (optional; else -1 classes mark padding)

Pixel boxes are in the model input's frame (the ``resize`` size the adapter sent, else the
image's own) and are scaled back to the image; normalised boxes are fractions of it.

Segmentation: a class map ``[N, H, W]`` (integer-valued), a one-channel mask ``[N, 1, H, W]``
(integer classes, or a float foreground probability cut at ``mask_threshold``), or a score map
``[N, C, H, W]`` (``mask_layout=hwc``: ``[N, H, W, C]``) argmaxed over C. The map must be the
model input's size, the image's size, or a uniform scaling of the input (a stride-s output);
it is resized to the image with nearest neighbour.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import cv2
import numpy as np
from fortis.adapters.kserve_v2.codec import OutTensor
from fortis.adapters.kserve_v2.options import DetectionFormat, KServeOptions
from fortis.adapters.target_errors import TargetResponseError
from fortis.core.answers import DetectionAnswers
from fortis.core.boxes import rows_to_xyxy

#: Output tensor names tried, in order, when the URL names none (TF OD API / Triton NMS first).
DETECTION_OUTPUTS: dict[str, tuple[str, ...]] = {
    "boxes": ("detection_boxes", "boxes", "bboxes"),
    "scores": ("detection_scores", "scores"),
    "classes": ("detection_classes", "classes", "labels"),
    "count": ("num_detections", "num_dets", "count"),
}
#: Most detection rows per image, and most pixels of a class map: beyond these an answer is
#: refused before anything is allocated from its shape.
MAX_DETECTIONS = 100_000
MAX_MASK_PIXELS = 64 * 1024 * 1024
_SCORE_TOLERANCE = 1e-4

Size = tuple[int, int]  # (height, width)


def _find(
    outputs: Sequence[OutTensor], explicit: str, role: str, option: str, required: bool
) -> OutTensor | None:
    by_name = {o.name: o for o in outputs}
    names = list(by_name)
    if explicit:
        if explicit not in by_name:
            raise TargetResponseError(
                f"no output '{explicit}' ({option}) in the answer (outputs: {names})"
            )
        return by_name[explicit]
    for cand in DETECTION_OUTPUTS[role]:
        if cand in by_name:
            return by_name[cand]
    if required:
        raise TargetResponseError(
            f"the answer has no {role} output (looked for "
            f"{', '.join(DETECTION_OUTPUTS[role])}; outputs: {names}); "
            f"name it with {option}=NAME"
        )
    return None


def _rows(out: OutTensor, n: int, width: int | None) -> np.ndarray:
    """``out`` as float64 [n, K] (width None) or [n, K, width]; a batch dimension may be left
    out for one image."""
    shape = out.shape
    tail = () if width is None else (width,)
    want = f"[{n}, K{', ' + str(width) if width else ''}]"
    if len(shape) == 2 + len(tail) and shape[0] == n and shape[2:] == tail:
        k = shape[1]
    elif n == 1 and len(shape) == 1 + len(tail) and shape[1:] == tail:
        k = shape[0]
    elif width is None and len(shape) == 3 and shape[0] == n and shape[2] == 1:
        k = shape[1]  # [N, K, 1]
    elif n == 1 and shape == (0,):
        k = 0  # one image, nothing found: []
    else:
        raise TargetResponseError(
            f"output '{out.name}' has shape {list(shape)} for {n} image(s); expected {want}"
        )
    if k > MAX_DETECTIONS:
        raise TargetResponseError(
            f"output '{out.name}' has {k} rows per image; at most {MAX_DETECTIONS} are read"
        )
    data = np.asarray(out.data, dtype=np.float64)
    return data.reshape((n, k) + tail)


def _counts(out: OutTensor, n: int, k: int) -> np.ndarray:
    shape = out.shape
    if math.prod(shape) != n or not (len(shape) <= 1 or (len(shape) == 2 and shape[0] == n)):
        raise TargetResponseError(
            f"output '{out.name}' has shape {list(shape)} for {n} "
            f"image(s); expected [{n}] or [{n}, 1] detection counts"
        )
    c = np.asarray(out.data, dtype=np.float64).reshape(n)
    for i, v in enumerate(c.tolist()):
        if not math.isfinite(v) or v != int(v):
            raise TargetResponseError(
                f"output '{out.name}': image {i}'s count {v!r} is not a whole number"
            )
        if v < 0:
            raise TargetResponseError(
                f"output '{out.name}': image {i}'s count {int(v)} is negative"
            )
        if v > k:
            raise TargetResponseError(
                f"output '{out.name}': image {i}'s count {int(v)} exceeds "
                f"the {k} rows the box tensor holds"
            )
    return c.astype(np.int64)


def decode_detections(
    outputs: Sequence[OutTensor],
    opts: DetectionFormat,
    image_sizes: Sequence[Size],
    frames: Sequence[Size],
    n_classes: int = 0,
) -> DetectionAnswers:
    """The detections of ``len(image_sizes)`` images. ``frames``: per image, the size its
    pixel boxes refer to (the model input). ``n_classes``: the label set's size (0 = not
    known: any class id >= 0 is kept)."""
    n = len(image_sizes)
    boxes_t = _find(outputs, opts.boxes_output, "boxes", "boxes_output", True)
    assert boxes_t is not None
    scores_t = _find(
        outputs, opts.scores_output, "scores", "scores_output", bool(opts.scores_output)
    )
    classes_t = _find(
        outputs, opts.classes_output, "classes", "classes_output", bool(opts.classes_output)
    )
    count_t = _find(outputs, opts.count_output, "count", "count_output", bool(opts.count_output))
    boxes = _rows(boxes_t, n, 4)
    k = boxes.shape[1]
    scores = classes = None
    for t in (scores_t, classes_t):
        if t is not None:
            rows = _rows(t, n, None)
            if rows.shape[1] != k:
                raise TargetResponseError(
                    f"output '{t.name}' has {rows.shape[1]} rows per image "
                    f"but '{boxes_t.name}' has {k}"
                )
            if t is scores_t:
                scores = rows
            else:
                classes = rows
    valid = np.ones((n, k), dtype=bool)
    if count_t is not None:
        counts = _counts(count_t, n, k)
        valid &= np.arange(k)[None, :] < counts[:, None]
    elif classes is not None:
        valid &= classes != -1  # -1 class = a padding row
    out_boxes: list[np.ndarray] = []
    out_labels: list[np.ndarray] = []
    out_scores: list[np.ndarray] = []
    per_image: list[int] = []
    for i in range(n):
        rows = np.flatnonzero(valid[i])
        s = scores[i, rows] if scores is not None else np.full(len(rows), np.nan)
        if scores is not None and scores_t is not None:
            _check_scores(scores_t, i, rows, s)
        lab = (
            _labels(classes_t, i, rows, classes[i, rows], opts.label_offset, n_classes)
            if classes is not None and classes_t is not None
            else np.zeros(len(rows), np.int64)
        )
        xyxy = _pixel_boxes(boxes_t, i, rows, boxes[i, rows], opts, image_sizes[i], frames[i])
        h, w = image_sizes[i]
        xyxy[:, 0::2] = np.clip(xyxy[:, 0::2], 0.0, float(w))
        xyxy[:, 1::2] = np.clip(xyxy[:, 1::2], 0.0, float(h))
        keep = (xyxy[:, 2] > xyxy[:, 0]) & (xyxy[:, 3] > xyxy[:, 1])  # empty once clipped
        if scores is not None and opts.min_score > 0:
            keep &= s >= opts.min_score
        order = np.argsort(-np.nan_to_num(s[keep], nan=0.0), kind="stable")
        out_boxes.append(xyxy[keep][order])
        out_labels.append(lab[keep][order])
        out_scores.append(np.clip(s[keep][order], 0.0, 1.0))
        per_image.append(int(keep.sum()))
    return DetectionAnswers(
        boxes=np.concatenate(out_boxes).astype(np.float32).reshape(-1, 4),
        labels=np.concatenate(out_labels).astype(np.int64),
        scores=np.concatenate(out_scores).astype(np.float32),
        counts=np.asarray(per_image, np.int64),
        errors=("",) * n,
    )


def _check_scores(t: OutTensor, i: int, rows: np.ndarray, s: np.ndarray) -> None:
    bad = ~np.isfinite(s) | (s < -_SCORE_TOLERANCE) | (s > 1 + _SCORE_TOLERANCE)
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise TargetResponseError(
            f"output '{t.name}': image {i} row {int(rows[j])}: score "
            f"{float(s[j])!r} is not a confidence in [0, 1]"
        )


def _labels(
    t: OutTensor, i: int, rows: np.ndarray, c: np.ndarray, offset: int, n_classes: int
) -> np.ndarray:
    whole = np.isfinite(c) & (c == np.round(c))
    if not whole.all():
        j = int(np.flatnonzero(~whole)[0])
        raise TargetResponseError(
            f"output '{t.name}': image {i} row {int(rows[j])}: class "
            f"{float(c[j])!r} is not a whole number"
        )
    lab = c.astype(np.int64) - offset
    bad = (lab < 0) | ((lab >= n_classes) if n_classes else False)
    if np.any(bad):
        j = int(np.flatnonzero(bad)[0])
        span = f"0..{n_classes - 1}" if n_classes else ">= 0"
        raise TargetResponseError(
            f"output '{t.name}': image {i} row {int(rows[j])}: class "
            f"{int(c[j])} (label_offset {offset}) is not in the label "
            f"set ({span})"
        )
    return lab


def _pixel_boxes(
    t: OutTensor,
    i: int,
    rows: np.ndarray,
    raw: np.ndarray,
    opts: DetectionFormat,
    image: Size,
    frame: Size,
) -> np.ndarray:
    """Rows of ``t`` for image i as pixel xyxy of the image."""
    b = raw[:, [1, 0, 3, 2]] if opts.box_format == "yxyx" else raw
    fmt = "xyxy" if opts.box_format == "yxyx" else opts.box_format
    h, w = image
    if opts.box_normalised:
        fmt += "n"
        wh = np.tile(np.asarray([[w, h]], np.float64), (len(b), 1))
    else:
        wh = None
    xyxy, problems = rows_to_xyxy(b, fmt, wh)
    # Zero-area rows are dropped (a detector's collapsed box); anything else is a wrong format.
    problems = [(r, p) for r, p in problems if not p.startswith("zero-area")]
    if problems:
        r, what = problems[0]
        raise TargetResponseError(
            f"output '{t.name}': image {i} row {int(rows[r])}: {what} "
            f"(box_format={opts.box_format}, box_coords="
            f"{'normalised' if opts.box_normalised else 'pixel'})"
        )
    xyxy = np.array(xyxy, dtype=np.float64)
    if not opts.box_normalised and frame != image and frame[0] > 0 and frame[1] > 0:
        xyxy[:, 0::2] *= w / frame[1]
        xyxy[:, 1::2] *= h / frame[0]
    return xyxy


def decode_class_maps(
    out: OutTensor,
    opts: KServeOptions,
    image_sizes: Sequence[Size],
    frames: Sequence[Size],
    n_classes: int = 0,
) -> list[np.ndarray]:
    """int32 class maps, one per image at its size, from the segmentation output ``out``."""
    n = len(image_sizes)
    shape = out.shape
    if len(shape) >= 1 and shape[0] == n and len(shape) in (3, 4):
        per = shape[1:]
    elif n == 1 and len(shape) == 2:
        per = shape
    else:
        raise TargetResponseError(
            f"output '{out.name}' has shape {list(shape)} for {n} image(s); "
            f"expected [{n}, H, W] class maps or [{n}, C, H, W] scores"
        )
    if len(per) == 2:
        c, (mh, mw) = 0, per
    elif opts.mask_layout == "chw":
        c, mh, mw = per
    else:
        mh, mw, c = per
    if mh < 1 or mw < 1 or mh * mw > MAX_MASK_PIXELS or (c and c > 100_000):
        raise TargetResponseError(
            f"output '{out.name}': a {mh}x{mw} map of {c or 1} channel(s) "
            f"is not a usable mask (at most {MAX_MASK_PIXELS} pixels)"
        )
    data = np.asarray(out.data).reshape((n, *per))
    maps: list[np.ndarray] = []
    for i in range(n):
        m = data[i]
        if c == 0 or c == 1:
            m = m.reshape(mh, mw)
            if c == 1 and m.dtype.kind == "f" and not _whole(m):
                if not (np.isfinite(m).all() and m.min() >= -1e-4 and m.max() <= 1 + 1e-4):
                    raise TargetResponseError(
                        f"output '{out.name}': image {i}'s one-channel "
                        "mask is neither whole class ids nor a "
                        "foreground probability in [0, 1]"
                    )
                cls = (m > opts.mask_threshold).astype(np.int64)
            else:
                if not _whole(m):
                    raise TargetResponseError(
                        f"output '{out.name}': image {i}'s class map holds "
                        "values that are not whole class ids (a score map "
                        "needs a channel axis: [N, C, H, W])"
                    )
                cls = m.astype(np.int64)
        else:
            scores = m if opts.mask_layout == "chw" else np.moveaxis(m, -1, 0)
            if scores.dtype.kind == "f" and not np.isfinite(scores).all():
                raise TargetResponseError(
                    f"output '{out.name}': image {i}'s score map holds NaN or infinite values"
                )
            cls = np.argmax(scores, axis=0).astype(np.int64)
        bad = (cls < 0) | ((cls >= n_classes) if n_classes else False)
        if np.any(bad):
            v = int(cls[np.unravel_index(int(np.flatnonzero(bad)[0]), cls.shape)])
            span = f"0..{n_classes - 1}" if n_classes else ">= 0"
            raise TargetResponseError(
                f"output '{out.name}': image {i}'s class map holds class "
                f"{v}, not in the label set ({span})"
            )
        maps.append(_to_image(out.name, i, cls, image_sizes[i], frames[i]))
    return maps


def _whole(m: np.ndarray) -> bool:
    if m.dtype.kind in "iub":
        return True
    return bool(np.isfinite(m).all() and (m == np.round(m)).all())


def _to_image(name: str, i: int, cls: np.ndarray, image: Size, frame: Size) -> np.ndarray:
    """A class map at the image's size: as it is when it already is; else resized (nearest)
    when it is the model input's size or a uniform scaling of it (same aspect ratio within a
    pixel)."""
    mh, mw = cls.shape
    h, w = image
    if (mh, mw) != (h, w):
        fh, fw = frame
        same_frame = (mh, mw) == (fh, fw)
        scaled = (
            fh > 0 and fw > 0 and abs(mh * fw / fh - mw) <= 1.0 and abs(mw * fh / fw - mh) <= 1.0
        )
        if not (same_frame or scaled):
            raise TargetResponseError(
                f"output '{name}': image {i}'s {mh}x{mw} map fits neither "
                f"the {h}x{w} image nor the {fh}x{fw} model input"
            )
        cls = cv2.resize(cls.astype(np.int32), (w, h), interpolation=cv2.INTER_NEAREST)
    return np.ascontiguousarray(cls, dtype=np.int32)
