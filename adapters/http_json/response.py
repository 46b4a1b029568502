"""Reading a service's JSON answer into a Fortis ``Prediction``: the pure half of the adapter.

The JMESPath expressions of a ``Profile`` find the items, labels, scores, boxes and masks; the
declarative transforms below (score scales, box formats, polygons, COCO RLE and PNG masks,
proto3 JSON numbers) turn them into Fortis's units. Everything here is a function of its
arguments, tested without a server; ``ValueError`` names what does not fit the profile, and
the backend turns it into a ``TargetResponseError`` naming the image.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import cv2
import numpy as np
from fortis.adapters.http_json.profile import BoxSpec, MaskSpec, Profile
from fortis.common.v1 import common_pb2
from fortis.core.task import Task
from fortis.core.tensors import fill_tensor

# ---------------------------------------------------------------------------------------------
# Pure transforms
# ---------------------------------------------------------------------------------------------

def scale_score(value: float, scale: float) -> float:
    """A service score on a 0-``scale`` range as a confidence in [0, 1].

    Raises ``ValueError`` when the result is outside [0, 1] (beyond rounding), which usually
    means the profile's ``score_scale`` is wrong."""
    if not math.isfinite(value):
        raise ValueError(f"score {value!r} is not a finite number")
    s = value / scale
    if s < -1e-6 or s > 1.0 + 1e-6:
        raise ValueError(f"score {value:g} is outside 0-{scale:g} (score_scale {scale:g})")
    return min(max(s, 0.0), 1.0)


def box_to_pixels(fmt: str, values: Sequence[float], width: int, height: int
                  ) -> tuple[float, float, float, float]:
    """Four numbers in box format ``fmt`` as pixel (x_min, y_min, x_max, y_max)."""
    if len(values) != 4:
        raise ValueError(f"a {fmt} box needs 4 numbers, got {len(values)}")
    a, b, c, d = (float(v) for v in values)
    if fmt == "normalized_ltwh":
        if c < 0 or d < 0:
            raise ValueError(f"negative box width/height ({c:g}, {d:g})")
        return a * width, b * height, (a + c) * width, (b + d) * height
    if fmt == "normalized_xyxy":
        return a * width, b * height, c * width, d * height
    if fmt == "pixel_xywh":
        if c < 0 or d < 0:
            raise ValueError(f"negative box width/height ({c:g}, {d:g})")
        return a, b, a + c, b + d
    if fmt == "pixel_xyxy":
        return a, b, c, d
    raise ValueError(f"unknown box format '{fmt}'")


def polygon_to_box(points: Sequence[tuple[float, float]], *, normalized: bool, width: int,
                   height: int) -> tuple[float, float, float, float]:
    """The pixel bounding box (x_min, y_min, x_max, y_max) of a polygon's vertices."""
    if not points:
        raise ValueError("a polygon needs at least one vertex")
    xs = [float(p[0]) for p in points]
    ys = [float(p[1]) for p in points]
    sx, sy = (width, height) if normalized else (1, 1)
    return min(xs) * sx, min(ys) * sy, max(xs) * sx, max(ys) * sy


def check_box(box: tuple[float, float, float, float], width: int, height: int, *,
              tolerance_px: float = 1.0) -> tuple[float, float, float, float]:
    """``box`` clipped to the image; ``ValueError`` when it lies outside (beyond the tolerance)
    or is inverted."""
    x0, y0, x1, y1 = box
    if not all(math.isfinite(v) for v in box):
        raise ValueError(f"box {box} has a non-finite coordinate")
    if x1 < x0 or y1 < y0:
        raise ValueError(f"box ({x0:g}, {y0:g}, {x1:g}, {y1:g}) is inverted (x_max < x_min or "
                         "y_max < y_min)")
    t = tolerance_px
    if x0 < -t or y0 < -t or x1 > width + t or y1 > height + t:
        raise ValueError(f"box ({x0:g}, {y0:g}, {x1:g}, {y1:g}) lies outside the {width}x{height} "
                         "image")
    return (min(max(x0, 0.0), width), min(max(y0, 0.0), height),
            min(max(x1, 0.0), width), min(max(y1, 0.0), height))


def coco_rle_counts(counts: str | bytes) -> list[int]:
    """Run lengths of a compressed COCO RLE string (the ``counts`` of pycocotools' encode)."""
    s = counts.decode("ascii") if isinstance(counts, bytes) else counts
    out: list[int] = []
    p = 0
    while p < len(s):
        x, k, more = 0, 0, True
        while more:
            if p >= len(s):
                raise ValueError("compressed RLE string ends in the middle of a number")
            c = ord(s[p]) - 48
            if c < 0 or c > 63:
                raise ValueError(f"character {s[p]!r} is not in the COCO RLE alphabet")
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and (c & 0x10):
                x |= -1 << (5 * k)
        if len(out) > 2:
            x += out[-2]
        out.append(x)
    return out


def decode_coco_rle(rle: Mapping[str, Any]) -> np.ndarray:
    """A COCO run-length encoding ``{"size": [h, w], "counts": [...] | "..."}`` as a bool HxW
    mask. Runs alternate 0, 1, 0, ... over the pixels in column-major (Fortran) order."""
    size = rle.get("size")
    if (not isinstance(size, list | tuple) or len(size) != 2
            or not all(isinstance(v, int | float) and v >= 0 for v in size)):
        raise ValueError(f"RLE 'size' must be [height, width], got {size!r}")
    h, w = int(size[0]), int(size[1])
    raw = rle.get("counts")
    if isinstance(raw, str | bytes):
        counts = coco_rle_counts(raw)
    elif isinstance(raw, list) and all(isinstance(v, int | float) for v in raw):
        counts = [int(v) for v in raw]
    else:
        raise ValueError("RLE 'counts' must be a list of run lengths or a compressed string")
    if any(c < 0 for c in counts):
        raise ValueError("RLE has a negative run length")
    if sum(counts) != h * w:
        raise ValueError(f"RLE runs cover {sum(counts)} pixels, the {h}x{w} size needs {h * w}")
    flat = np.repeat(np.arange(len(counts), dtype=np.uint8) % 2, counts).astype(bool)
    return flat.reshape((w, h)).T.copy()


def decode_png_mask(data: str) -> np.ndarray:
    """A base64 PNG (a ``data:`` URI prefix is allowed) as a 2-D integer array."""
    text = data.split(",", 1)[1] if data.startswith("data:") else data
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("mask is not valid base64") from None
    arr = cv2.imdecode(np.frombuffer(raw, dtype=np.uint8), cv2.IMREAD_UNCHANGED)
    if arr is None:
        raise ValueError(f"mask is not a decodable PNG ({len(raw)} bytes)")
    if arr.ndim == 3:
        if arr.shape[2] == 4:
            arr = arr[:, :, :3]
        if not all(np.array_equal(arr[:, :, 0], arr[:, :, c]) for c in range(1, arr.shape[2])):
            raise ValueError("mask PNG has colour channels that differ; expected a grey image")
        arr = arr[:, :, 0]
    return np.asarray(arr)


def compose_class_map(masks: Sequence[tuple[int, np.ndarray, float]], height: int, width: int,
                      background: int = 0) -> np.ndarray:
    """Per-object binary masks (label, mask, score) painted into one int32 class map; where
    masks overlap the higher score wins."""
    out = np.full((height, width), background, dtype=np.int32)
    for label, mask, _ in sorted(masks, key=lambda m: m[2]):
        out[np.asarray(mask).astype(bool)] = label
    return out


def number(value: Any, *, what: str, missing_zero: bool = True) -> float:
    """A JSON value as a float: proto3 JSON leaves out zeros (absent -> 0 unless
    ``missing_zero`` is false), and writes 64-bit numbers and NaN/Infinity as strings."""
    if value is None:
        if missing_zero:
            return 0.0
        raise ValueError(f"{what} is missing")
    if isinstance(value, bool):
        raise ValueError(f"{what} is a boolean, expected a number")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise ValueError(f"{what} is {value!r}, expected a number")


# ---------------------------------------------------------------------------------------------
# Answers -> predictions
# ---------------------------------------------------------------------------------------------

def _box_of(spec: BoxSpec, item: Any, width: int, height: int, missing_zero: bool
            ) -> tuple[float, float, float, float]:
    raw = spec.path.search(item)
    if raw is None:
        raise ValueError(f"no box at '{spec.path_text}'")
    if spec.format.endswith("polygon"):
        if not isinstance(raw, list) or not raw:
            raise ValueError(f"box '{spec.path_text}' is {raw!r}, expected a list of vertices")
        points: list[tuple[float, float]] = []
        if spec.keys:
            kx, ky = spec.keys
            for i, v in enumerate(raw):
                if not isinstance(v, dict):
                    raise ValueError(f"vertex {i} is {v!r}, expected an object with {kx}/{ky}")
                points.append((
                    number(v.get(kx), what=f"vertex {i} '{kx}'", missing_zero=missing_zero),
                    number(v.get(ky), what=f"vertex {i} '{ky}'", missing_zero=missing_zero)))
        elif all(isinstance(v, list) and len(v) == 2 for v in raw):
            points = [(number(v[0], what="vertex x"), number(v[1], what="vertex y")) for v in raw]
        elif len(raw) % 2 == 0 and all(isinstance(v, int | float) for v in raw):
            points = [(float(raw[i]), float(raw[i + 1])) for i in range(0, len(raw), 2)]
        else:
            raise ValueError(f"box '{spec.path_text}' is not a list of vertices")
        return polygon_to_box(points, normalized=spec.format.startswith("normalized"),
                              width=width, height=height)
    if spec.keys:
        if not isinstance(raw, dict):
            raise ValueError(f"box '{spec.path_text}' is {raw!r}, expected an object with "
                             f"{', '.join(spec.keys)}")
        values = [number(raw.get(k), what=f"box '{k}'", missing_zero=missing_zero)
                  for k in spec.keys]
    elif isinstance(raw, list) and len(raw) == 4:
        values = [number(v, what="box coordinate", missing_zero=False) for v in raw]
    else:
        raise ValueError(f"box '{spec.path_text}' is {raw!r}, expected 4 numbers (or set box.keys)")
    return box_to_pixels(spec.format, values, width, height)


def _mask_of(spec: MaskSpec, doc: Any) -> np.ndarray:
    raw = spec.path.search(doc)
    if raw is None:
        raise ValueError(f"no mask at '{spec.path_text}'")
    if spec.format == "coco_rle":
        if not isinstance(raw, dict):
            raise ValueError(f"mask '{spec.path_text}' is not a COCO RLE object (size, counts)")
        return decode_coco_rle(raw)
    if not isinstance(raw, str):
        raise ValueError(f"mask '{spec.path_text}' is not a base64 PNG string")
    return decode_png_mask(raw)


def _items_of(p: Profile, doc: Any) -> list[Any]:
    assert p.items is not None
    raw = p.items.search(doc)
    if raw is None:
        if p.missing_items == "empty":
            return []
        keys = f"; the answer has keys {sorted(doc)[:12]}" if isinstance(doc, dict) else ""
        raise ValueError(f"items path '{p.items_text}' not found in the answer{keys}")
    if not isinstance(raw, list):
        raise ValueError(f"items path '{p.items_text}' gave {type(raw).__name__}, expected a list")
    if p.instances is None:
        return raw
    out: list[Any] = []
    for item in raw:
        inst = p.instances.search(item) or []
        if not isinstance(inst, list):
            raise ValueError("instances path did not give a list")
        for x in inst:
            ctx = dict(x) if isinstance(x, dict) else {"value": x}
            ctx["parent"] = item
            out.append(ctx)
    return out


def _score_of(p: Profile, item: Any, i: int) -> float | None:
    if p.score is None:
        return None
    raw = p.score.search(item)
    v = number(raw, what=f"item {i} score '{p.score_text}'",
               missing_zero=p.missing_numbers == "zero")
    try:
        return scale_score(v, p.score_scale)
    except ValueError as exc:
        raise ValueError(f"item {i}: {exc}; is score_scale right?") from None


def _label_of(p: Profile, item: Any, i: int) -> tuple[int, str] | None:
    assert p.label is not None
    raw = p.label.search(item)
    if raw is None:
        raise ValueError(f"item {i} has no label at '{p.label_text}'")
    try:
        return p.label_of(raw)
    except ValueError as exc:
        raise ValueError(f"item {i}: {exc}") from None


def prediction_from_answer(p: Profile, doc: Any, width: int, height: int
                           ) -> common_pb2.Prediction:
    """The Prediction for one image from its part of the service's JSON answer.

    ``ValueError`` names what does not fit the profile."""
    if p.error is not None:
        err = p.error.search(doc)
        if err not in (None, "", {}, [], 0):
            text = err if isinstance(err, str) else json.dumps(err)[:300]
            raise ValueError(f"the service reported an error: {text}")
    missing_zero = p.missing_numbers == "zero"
    if p.task == Task.SEGMENTATION and p.mask is not None and p.mask.kind == "class_map":
        m = _mask_of(p.mask, doc)
        if m.shape != (height, width):
            raise ValueError(f"class map is {m.shape[1]}x{m.shape[0]}, the image is "
                             f"{width}x{height}")
        pred = common_pb2.Prediction()
        fill_tensor(pred.segmentation.class_map, m.astype(np.int32))   # in place (codec)
        return pred
    items = _items_of(p, doc)
    if p.task == Task.CLASSIFICATION:
        best: dict[tuple[int, str], float | None] = {}
        for i, item in enumerate(items):
            lab = _label_of(p, item, i)
            s = _score_of(p, item, i)
            if lab is None or (s is not None and s < p.min_score):
                continue
            prev = best.get(lab)
            if lab not in best or (s is not None and (prev is None or s > prev)):
                best[lab] = s
        if p.output == "full_scores":
            for idx, name in enumerate(p.labels):
                best.setdefault((idx, name), 0.0)
        ranked = list(best.items())
        if p.score is not None:
            ranked.sort(key=lambda kv: -(kv[1] or 0.0))
        if p.output == "label_only":
            ranked = [(k, None) for k, _ in ranked[:1]]
        elif p.output == "top_k" and p.top_k:
            ranked = ranked[:p.top_k]
        classes = []
        for (idx, name), s in ranked:
            c = common_pb2.ClassScore(label=idx, name=name)
            if s is not None:
                c.score = s
            classes.append(c)
        return common_pb2.Prediction(classification=common_pb2.Classification(classes=classes))
    if p.task == Task.DETECTION:
        assert p.box is not None
        boxes = []
        for i, item in enumerate(items):
            lab = _label_of(p, item, i)
            s = _score_of(p, item, i)
            if lab is None or (s is not None and s < p.min_score):
                continue
            try:
                raw_box = _box_of(p.box, item, width, height, missing_zero)
                x0, y0, x1, y1 = check_box(raw_box, width, height, tolerance_px=p.box.tolerance_px)
            except ValueError as exc:
                raise ValueError(f"item {i} ({lab[1]}): {exc} (box format {p.box.format})"
                                 ) from None
            boxes.append(common_pb2.BoundingBox(x_min=x0, y_min=y0, x_max=x1, y_max=y1,
                                                label=lab[0], name=lab[1],
                                                score=1.0 if s is None else s))
        return common_pb2.Prediction(detection=common_pb2.Detection(boxes=boxes))
    assert p.mask is not None
    masks: list[tuple[int, np.ndarray, float]] = []
    for i, item in enumerate(items):
        lab = _label_of(p, item, i)
        s = _score_of(p, item, i)
        if lab is None or (s is not None and s < p.min_score):
            continue
        try:
            m = _mask_of(p.mask, item)
        except ValueError as exc:
            raise ValueError(f"item {i} ({lab[1]}): {exc}") from None
        if m.shape != (height, width):
            raise ValueError(f"item {i} ({lab[1]}): mask is {m.shape[1]}x{m.shape[0]}, the image "
                             f"is {width}x{height}")
        masks.append((lab[0], m > 0, 1.0 if s is None else s))
    cmap = compose_class_map(masks, height, width, p.background)
    pred = common_pb2.Prediction()
    fill_tensor(pred.segmentation.class_map, cmap)         # in place (codec)
    return pred
