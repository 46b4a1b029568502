"""A report's example images (IEEE-A1..A8, DEG-4 failure points): a caller's PNG bytes,
bounded, decoded and re-encoded before they reach the page, with the amplified difference,
the rule's verdicts and what the page draws on them (detection boxes, segmentation masks).
Pure code, no gRPC; a bad example raises ``InvalidArgument`` naming it
(``parts.examples[3].perturbed_png``)."""

from __future__ import annotations

import base64
import io
import math
import struct
import warnings
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
from fortis.core.task import Task
from fortis.report.v1 import report_pb2
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.limits import (
    MAX_EXAMPLE_BOXES,
    MAX_EXAMPLE_MASK_CLASSES,
    MAX_EXAMPLE_PNG_BYTES,
    MAX_EXAMPLE_SIDE,
    MAX_REPORT_EXAMPLES,
)
from PIL import Image

__all__ = ["MAX_EXAMPLES", "example_images"]

#: Example images are caller bytes put into a page (RenderReport is a public RPC): at most
#: this many, each PNG at most this many bytes and pixels on a side, read from the header
#: before anything is decoded.
MAX_EXAMPLES: Final = MAX_REPORT_EXAMPLES      # services/common/limits.py
_PNG_SIGNATURE: Final = b"\x89PNG\r\n\x1a\n"
_EXAMPLE_KINDS: Final = {report_pb2.EXAMPLE_KIND_CORRUPTION: "corruption",
                         report_pb2.EXAMPLE_KIND_ATTACK: "attack",
                         report_pb2.EXAMPLE_KIND_DEGRADATION: "degradation"}
_EXAMPLE_TEXT: Final = 4096
_GREY_MODES: Final = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "F"})


def _decode_png(data: bytes, field: str) -> np.ndarray:
    """A caller's PNG as uint8 H x W (grey) or H x W x 3 (RGB), checked in this order: its
    size in bytes, the PNG signature, the IHDR header's width and height (before any
    decoding: no decompression bomb), then a full decode (Pillow, PNG only, its
    decompression-bomb guard as an error). Anything else names ``field``."""
    if not data:
        raise InvalidArgument(field, "a PNG image is required")
    if len(data) > MAX_EXAMPLE_PNG_BYTES:
        raise InvalidArgument(field, f"{len(data)} bytes; at most {MAX_EXAMPLE_PNG_BYTES} "
                                     "are accepted")
    if len(data) < 33 or data[:8] != _PNG_SIGNATURE or data[12:16] != b"IHDR":
        raise InvalidArgument(field, "not a PNG image (no PNG signature and IHDR header)")
    width, height = struct.unpack(">II", data[16:24])
    if not (0 < width <= MAX_EXAMPLE_SIDE and 0 < height <= MAX_EXAMPLE_SIDE):
        raise InvalidArgument(field, f"the header declares {width}x{height} pixels; at most "
                                     f"{MAX_EXAMPLE_SIDE}x{MAX_EXAMPLE_SIDE} are accepted")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=["PNG"]) as im:
                if im.size != (width, height):
                    raise ValueError(f"decoded size {im.size} is not the header's")
                im.load()
                arr = np.asarray(im.convert("L" if im.mode in _GREY_MODES else "RGB"))
    except Exception as exc:     # hostile bytes: any decoder failure is the caller's
        raise InvalidArgument(field, f"not a valid PNG image: {type(exc).__name__}: "
                                     f"{str(exc)[:200]}") from None
    return np.ascontiguousarray(arr, dtype=np.uint8)


def _png_uri(image: np.ndarray) -> str:
    """A ``data:image/png;base64,...`` URI of an image this module decoded (re-encoded, so
    nothing but a valid PNG reaches the page)."""
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG", compress_level=6)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _difference(original: np.ndarray, perturbed: np.ndarray) -> np.ndarray:
    """|perturbed - original| per pixel and channel, amplified so the largest difference is
    255 (all black when the two are the same); RGB when either image is."""
    o, p = original.astype(np.int16), perturbed.astype(np.int16)
    if o.ndim != p.ndim:
        o = o if o.ndim == 3 else np.repeat(o[:, :, None], 3, axis=2)
        p = p if p.ndim == 3 else np.repeat(p[:, :, None], 3, axis=2)
    d = np.abs(p - o)
    top = int(d.max()) if d.size else 0
    if top == 0:
        return np.zeros(d.shape, dtype=np.uint8)
    return np.rint(d.astype(np.float64) * (255.0 / top)).astype(np.uint8)


def _example_text(value: str, field: str) -> str | None:
    if len(value) > _EXAMPLE_TEXT:
        raise InvalidArgument(field, f"{len(value)} characters; at most {_EXAMPLE_TEXT}")
    return value or None


_VERDICTS: Final = {report_pb2.EXAMPLE_VERDICT_UNSPECIFIED: None,
                    report_pb2.EXAMPLE_VERDICT_CORRECT: "correct",
                    report_pb2.EXAMPLE_VERDICT_INCORRECT: "incorrect"}


def _example_boxes(boxes: Sequence[report_pb2.ExampleBox], field: str) -> list[dict[str, Any]]:
    """Boxes to draw: at most :data:`MAX_EXAMPLE_BOXES`, finite, x_max >= x_min and y_max >=
    y_min; ``{box: [x_min, y_min, x_max, y_max], label, score (None: not given)}``."""
    if len(boxes) > MAX_EXAMPLE_BOXES:
        raise InvalidArgument(field, f"{len(boxes)} boxes; at most {MAX_EXAMPLE_BOXES} are "
                                     "accepted")
    out = []
    for n, b in enumerate(boxes):
        xyxy = [float(b.x_min), float(b.y_min), float(b.x_max), float(b.y_max)]
        if not all(math.isfinite(v) for v in xyxy) or xyxy[2] < xyxy[0] or xyxy[3] < xyxy[1]:
            raise InvalidArgument(f"{field}[{n}]", f"a box needs finite x_min <= x_max and "
                                                   f"y_min <= y_max, got {xyxy}")
        score = float(b.score) if b.HasField("score") else None
        if score is not None and not math.isfinite(score):
            raise InvalidArgument(f"{field}[{n}].score", "must be finite")
        out.append({"box": xyxy, "label": _example_text(b.label, f"{field}[{n}].label") or "",
                    "score": score})
    return out


def _example_mask(data: bytes, field: str, shape: tuple[int, ...], classes: int) -> str | None:
    """A class-slot mask (0: no class of interest, k: the k-th): an 8-bit grey PNG the
    images' size with no value above ``classes``, re-encoded; None when not given."""
    if not data:
        return None
    mask = _decode_png(data, field)
    if mask.ndim != 2:
        raise InvalidArgument(field, "an 8-bit grey PNG (one value per pixel) is needed")
    if mask.shape != tuple(shape[:2]):
        raise InvalidArgument(field, f"{mask.shape[1]}x{mask.shape[0]} pixels; the images are "
                                     f"{shape[1]}x{shape[0]}")
    top = int(mask.max()) if mask.size else 0
    if top > classes:
        raise InvalidArgument(field, f"value {top} but {classes} mask_classes")
    return _png_uri(mask)


def _example_marks(e: report_pb2.ExampleImage, path: str, shape: tuple[int, ...],
                   task: str | None) -> dict[str, Any]:
    """How the rule judged an example's answers (both keys when either is judged) and what
    the page draws on it: boxes in a detection report, masks in a segmentation report
    (masks and boxes another task's example carries are refused: nothing draws them)."""
    if len(e.mask_classes) > MAX_EXAMPLE_MASK_CLASSES:
        raise InvalidArgument(f"{path}.mask_classes", f"{len(e.mask_classes)} classes; at "
                                                      f"most {MAX_EXAMPLE_MASK_CLASSES} are "
                                                      "accepted")
    classes = [_example_text(c, f"{path}.mask_classes[{n}]") or ""
               for n, c in enumerate(e.mask_classes)]
    out: dict[str, Any] = {}
    verdicts = (_VERDICTS.get(e.original_verdict), _VERDICTS.get(e.perturbed_verdict))
    if any(verdicts):
        out["original_verdict"], out["perturbed_verdict"] = verdicts
    for side in ("truth", "original", "perturbed"):
        boxes = _example_boxes(getattr(e, f"{side}_boxes"), f"{path}.{side}_boxes")
        if boxes and task != Task.DETECTION:
            raise InvalidArgument(f"{path}.{side}_boxes", f"boxes are drawn in detection "
                                                          f"reports; this target's task is {task}")
        if task == Task.DETECTION:
            out[f"{side}_boxes"] = boxes
    for side in ("truth", "original", "perturbed"):
        mask = _example_mask(getattr(e, f"{side}_mask_png"), f"{path}.{side}_mask_png", shape,
                             len(classes))
        if mask is not None and task != Task.SEGMENTATION:
            raise InvalidArgument(f"{path}.{side}_mask_png", f"masks are drawn in segmentation "
                                                             f"reports; this target's task is "
                                                             f"{task}")
        if task == Task.SEGMENTATION:
            out[f"{side}_mask"] = mask
    if task == Task.SEGMENTATION:
        out["mask_classes"] = classes
    return out


def example_images(examples: Sequence[report_pb2.ExampleImage],
                   task: str | None = None) -> list[dict[str, Any]]:
    """The report's example images: corruptions per severity (IEEE-A1..A6), attack original /
    adversarial / amplified difference (IEEE-A7, A8), DEG-4 failure points. Each:
    ``{kind, setting, level (None for attacks), image_id, target, original, perturbed,
    difference (data URIs of PNGs), original_answer, perturbed_answer, note}``; when the
    rule's verdicts are given, ``original_verdict`` and ``perturbed_verdict`` ("correct" /
    "incorrect" by the plan's rule, None: not judged); in a detection report (``task``)
    ``truth_boxes``, ``original_boxes``, ``perturbed_boxes`` ([{box: pixel xyxy, label,
    score}]); in a segmentation report ``truth_mask``, ``original_mask``, ``perturbed_mask``
    (data URIs of 8-bit PNGs, 0: no class of interest, k: ``mask_classes[k - 1]``; None: not
    given) and ``mask_classes``. The bytes are a caller's: bounded, decoded and re-encoded
    (``_decode_png``); a bad one raises InvalidArgument naming it
    (``parts.examples[3].perturbed_png``)."""
    if len(examples) > MAX_EXAMPLES:
        raise InvalidArgument("parts.examples", f"{len(examples)} examples; at most "
                                                f"{MAX_EXAMPLES} are accepted")
    out = []
    for n, e in enumerate(examples):
        path = f"parts.examples[{n}]"
        kind = _EXAMPLE_KINDS.get(e.kind)
        if kind is None:
            raise InvalidArgument(f"{path}.kind", f"must be a known ExampleKind; got {e.kind}")
        if not e.setting:
            raise InvalidArgument(f"{path}.setting", "the example's setting is required")
        original = _decode_png(e.original_png, f"{path}.original_png")
        perturbed = _decode_png(e.perturbed_png, f"{path}.perturbed_png")
        if original.shape[:2] != perturbed.shape[:2]:
            raise InvalidArgument(f"{path}.perturbed_png",
                                  f"{perturbed.shape[1]}x{perturbed.shape[0]} pixels; the "
                                  f"original is {original.shape[1]}x{original.shape[0]} "
                                  "(the two must be the same size)")
        out.append({
            "kind": kind, "setting": _example_text(e.setting, f"{path}.setting"),
            "level": None if kind == "attack" else int(e.level),
            "image_id": _example_text(e.image_id, f"{path}.image_id"),
            "target": _example_text(e.target, f"{path}.target"),
            "original": _png_uri(original), "perturbed": _png_uri(perturbed),
            "difference": _png_uri(_difference(original, perturbed)),
            "original_answer": _example_text(e.original_answer, f"{path}.original_answer"),
            "perturbed_answer": _example_text(e.perturbed_answer, f"{path}.perturbed_answer"),
            "note": _example_text(e.note, f"{path}.note"),
            **_example_marks(e, path, original.shape, task),
        })
    return out
