"""Detection and segmentation example images drawn as people read them (IEEE-C4, IEEE-C5).

The report document keeps the facts of an example: the images the target received, the
ground truth, the target's boxes (label and score) or class maps, and the plan's rule's
verdicts. The page shows them drawn on the images, at one display size (the longer side
:data:`DISPLAY_SIDE` pixels, so labels stay legible whatever the image size):

- detection: the target's boxes solid in :data:`ANSWER_COLOUR`, each with a tag "label
  score"; the ground-truth boxes dashed in :data:`TRUTH_COLOUR`, tagged with their label on
  the ground-truth panel;
- segmentation: the target's mask filled half-transparent in a colour per class of interest
  (:data:`CLASS_COLOURS`, the first one :data:`ANSWER_COLOUR`) with a solid outline; the
  ground truth's outline in :data:`TRUTH_COLOUR` (on the ground-truth panel its area is
  tinted too).

Whether an answer passes the rule is the page's frame and words around the image, not
pixels of it. Pure domain code: numpy and Pillow, no gRPC; the images come from data URIs
this service wrote (``example_images._png_uri``), and anything that does not decode is not
drawn.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
from PIL import Image, ImageDraw, ImageFont

__all__ = ["ANSWER_COLOUR", "CLASS_COLOURS", "DISPLAY_SIDE", "TRUTH_COLOUR", "decode_uri",
           "draw", "png_uri"]

#: Longer side of a drawn image, pixels.
DISPLAY_SIDE: Final = 256
#: The target's answer: boxes and the first class of interest's mask.
ANSWER_COLOUR: Final = (255, 40, 200)
#: The ground truth: dashed boxes, mask outlines.
TRUTH_COLOUR: Final = (0, 200, 255)
#: Mask fill per class of interest (value k uses entry k - 1, cycling).
CLASS_COLOURS: Final = ((255, 40, 200), (255, 128, 0), (255, 230, 0), (120, 220, 40),
                        (150, 90, 255), (255, 60, 60))
_LINE: Final = 2
_DASH: Final = (7, 4)
_FILL_ALPHA: Final = 0.4
_FONT_SIZE: Final = 13
_URI_PREFIX: Final = "data:image/png;base64,"


def decode_uri(uri: Any) -> np.ndarray | None:
    """A PNG data URI as uint8 H x W (grey) or H x W x 3; None when it is not one."""
    if not isinstance(uri, str) or not uri.startswith(_URI_PREFIX):
        return None
    try:
        data = base64.b64decode(uri[len(_URI_PREFIX):], validate=True)
        with Image.open(io.BytesIO(data), formats=["PNG"]) as im:
            im.load()
            arr = np.asarray(im.convert("L" if im.mode in ("1", "L", "I", "I;16") else "RGB"))
    except (binascii.Error, OSError, ValueError, Image.DecompressionBombError):
        return None
    return np.ascontiguousarray(arr, dtype=np.uint8)


def png_uri(image: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buf, format="PNG", compress_level=6)
    return _URI_PREFIX + base64.b64encode(buf.getvalue()).decode("ascii")


def _font() -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=_FONT_SIZE)
    except (OSError, TypeError, ValueError):      # Pillow built without FreeType
        return ImageFont.load_default()


def _scaled(image: np.ndarray) -> tuple[Image.Image, float]:
    """The image as RGB at the display size, and its scale factor."""
    arr = image if image.ndim == 3 else np.repeat(image[:, :, None], 3, axis=2)
    pil = Image.fromarray(np.ascontiguousarray(arr[:, :, :3]))
    h, w = arr.shape[:2]
    scale = DISPLAY_SIDE / max(h, w, 1)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    resample = Image.Resampling.LANCZOS if scale < 1 else Image.Resampling.BICUBIC
    return pil.resize(size, resample), scale


def _mask_at(mask: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """A class-slot mask at the display size (nearest neighbour: no new values)."""
    return np.asarray(Image.fromarray(mask).resize(size, Image.Resampling.NEAREST))


def _outline(mask: np.ndarray) -> np.ndarray:
    """Pixels of ``mask`` (bool) on its border, about :data:`_LINE` pixels thick."""
    inner = mask.copy()
    for _ in range(_LINE):
        shrunk = inner.copy()
        shrunk[1:, :] &= inner[:-1, :]
        shrunk[:-1, :] &= inner[1:, :]
        shrunk[:, 1:] &= inner[:, :-1]
        shrunk[:, :-1] &= inner[:, 1:]
        inner = shrunk
    return mask & ~inner


def _dashed_rect(d: ImageDraw.ImageDraw, box: Sequence[float], colour: tuple[int, int, int]
                 ) -> None:
    x1, y1, x2, y2 = box
    on, off = _DASH
    for a, b, horizontal, fixed in ((x1, x2, True, y1), (x1, x2, True, y2),
                                    (y1, y2, False, x1), (y1, y2, False, x2)):
        t = a
        while t < b:
            e = min(t + on, b)
            seg = [(t, fixed), (e, fixed)] if horizontal else [(fixed, t), (fixed, e)]
            d.line(seg, fill=colour, width=_LINE)
            t = e + off


def _tag(d: ImageDraw.ImageDraw, font: Any, xy: tuple[float, float], text: str,
         colour: tuple[int, int, int], width: int) -> None:
    """A filled label above ``xy`` (inside the box when there is no room above)."""
    left, top, right, bottom = d.textbbox((0, 0), text, font=font)
    tw, th = right - left + 4, bottom - top + 3
    x = min(max(0.0, xy[0]), max(0.0, width - tw))
    y = xy[1] - th if xy[1] - th >= 0 else xy[1] + 1
    d.rectangle([x, y, x + tw, y + th], fill=colour)
    d.text((x + 2 - left, y + 1 - top), text, fill=(0, 0, 0), font=font)


def _box_text(b: Mapping[str, Any]) -> str:
    label = str(b.get("label") or "")
    score = b.get("score")
    if isinstance(score, (int, float)):
        return f"{label} {score:.2f}".strip()
    return label


def draw(image: np.ndarray, *, boxes: Sequence[Mapping[str, Any]] = (),
         truth_boxes: Sequence[Mapping[str, Any]] = (), mask: np.ndarray | None = None,
         truth_mask: np.ndarray | None = None, truth_labels: bool = False) -> np.ndarray:
    """``image`` at the display size with the target's ``boxes`` / ``mask`` and the ground
    truth's ``truth_boxes`` / ``truth_mask`` drawn (module docstring); ``truth_labels``: tag
    the ground-truth boxes and tint the ground-truth mask (the ground-truth panel, where no
    answer is drawn). Boxes are pixel xyxy of ``image``; masks class-slot maps of its size."""
    pil, scale = _scaled(np.asarray(image))
    size = pil.size
    arr = np.asarray(pil).astype(np.float64)
    if mask is not None and mask.shape == image.shape[:2]:
        m = _mask_at(mask, size)
        for k in range(1, int(m.max()) + 1 if m.size else 1):
            area = m == k
            if not area.any():
                continue
            colour = np.array(CLASS_COLOURS[(k - 1) % len(CLASS_COLOURS)], np.float64)
            arr[area] = (1 - _FILL_ALPHA) * arr[area] + _FILL_ALPHA * colour
            arr[_outline(area)] = colour
    if truth_mask is not None and truth_mask.shape == image.shape[:2]:
        t = _mask_at(truth_mask, size)
        colour = np.array(TRUTH_COLOUR, np.float64)
        for k in range(1, int(t.max()) + 1 if t.size else 1):
            area = t == k
            if not area.any():
                continue
            if truth_labels:
                arr[area] = (1 - _FILL_ALPHA) * arr[area] + _FILL_ALPHA * colour
            arr[_outline(area)] = colour
    out = Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8))
    d = ImageDraw.Draw(out)
    font = _font()
    w = size[0]

    def at(b: Mapping[str, Any]) -> list[float] | None:
        xyxy = b.get("box")
        if not isinstance(xyxy, Sequence) or len(xyxy) != 4:
            return None
        try:
            return [float(v) * scale for v in xyxy]
        except (TypeError, ValueError):
            return None

    for b in truth_boxes:
        xy = at(b)
        if xy is None:
            continue
        _dashed_rect(d, xy, TRUTH_COLOUR)
        if truth_labels and b.get("label"):
            _tag(d, font, (xy[0], xy[1]), str(b["label"]), TRUTH_COLOUR, w)
    for b in boxes:
        xy = at(b)
        if xy is None:
            continue
        d.rectangle(xy, outline=ANSWER_COLOUR, width=_LINE)
        text = _box_text(b)
        if text:
            _tag(d, font, (xy[0], xy[1]), text, ANSWER_COLOUR, w)
    return np.asarray(out)
