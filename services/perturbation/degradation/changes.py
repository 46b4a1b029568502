"""DEG-1's resize-before-degradation helper and the DEG-4 change measures: the fraction of pixels
changed and the paper's "change made" per level (Tables 1-3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.degradation.operators import (
    FADE_TO_BLACK_FACTOR,
    FADE_TO_GREY_SATURATION_FACTOR,
    FADE_TO_WHITE_FACTOR,
    GLOBAL_BLUR_FILTERS_PER_LEVEL,
    GRADIENT_STEP,
    JPEG_QUALITY,
    LINES_PER_LEVEL,
    POSTERISE_BINS,
    check_level,
    per_level_count,
)
from fortis.services.perturbation.degradation.specs import spec_for
from fortis.services.perturbation.spec import check_image, hwc


def resize_to_model_input(image: np.ndarray, height: int, width: int,
                          channels: int) -> np.ndarray:
    """DEG-1: the image at the model's input size, to be degraded *after* resizing.

    Same conventions as the classifier's own preprocessing (``TorchClassifier``):
    ``cv2.INTER_AREA`` when shrinking both sides, ``cv2.INTER_LINEAR`` otherwise, aspect ratio
    not kept, no crop; grey -> RGB by repetition, RGB -> grey by ITU-R 601 luma
    (``cv2.COLOR_RGB2GRAY``); an alpha channel (HxWx4) is dropped. Returns a new uint8
    ``height x width x channels`` array (HxWx1 for grey), so that the model's preprocessing is
    then the identity and every degraded pixel is a pixel the model sees.
    """
    for name, value in (("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise InvalidArgument(name, f"must be a positive integer, got {value!r}")
    if isinstance(channels, bool) or channels not in (1, 3):
        raise InvalidArgument("channels", f"must be 1 or 3, got {channels!r}")
    if isinstance(image, np.ndarray) and image.ndim == 3 and image.shape[2] == 4:
        image = image[:, :, :3]
    img = check_image(image)
    img = np.ascontiguousarray(img[:, :, None] if img.ndim == 2 else img)
    h, w, c = img.shape
    if (h, w) != (height, width):
        shrink = height <= h and width <= w
        img = hwc(cv2.resize(img, (int(width), int(height)),
                              interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR), c)
    if c != channels:
        if channels == 3:
            img = np.repeat(img, 3, axis=2)
        else:
            img = hwc(cv2.cvtColor(np.ascontiguousarray(img), cv2.COLOR_RGB2GRAY), 1)
    return np.array(img, dtype=np.uint8, copy=True)


def fraction_changed(original: np.ndarray, degraded: np.ndarray) -> float:
    """DEG-4: the fraction of pixel positions (0..1) where any channel differs from the
    original -- the paper's "% of pixels changed" (Tables 1-3)."""
    a, b = check_image(original, "original"), check_image(degraded, "degraded")
    if a.shape != b.shape:
        raise InvalidArgument("degraded", f"shape {b.shape} differs from the original's {a.shape}")
    diff = a != b
    if diff.ndim == 3:
        diff = diff.any(axis=2)
    return float(diff.mean())


@dataclass(frozen=True, kw_only=True)
class LevelChange:
    """DEG-4: the change a degradation made at a level, as the paper's Tables 1-3 report it."""

    operator_id: str
    level: int
    fraction_changed: float     # pixel positions differing from the original, 0..1
    mean_abs_diff: float        # mean |degraded - original| over all values (0..255 scale)
    mean_before: float          # mean value of the original (0..255)
    mean_after: float           # mean value of the degraded image
    colours_before: int         # distinct colours (pixel values) in the original
    colours_after: int          # distinct colours in the degraded image
    change_made: str            # e.g. "10 lines", "224 boxes", "4 consecutive 5x5 blurs"

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _change_made(operator_id: str, level: int, h: int, w: int) -> str:
    n = level
    if operator_id in ("black_lines", "white_lines"):
        return f"{n * LINES_PER_LEVEL} randomly placed 1 pixel wide lines"
    if operator_id == "global_blur":
        return f"{n * GLOBAL_BLUR_FILTERS_PER_LEVEL} consecutive 5x5 uniform blurs"
    if operator_id == "model_gradient_descent":
        return f"{n} gradient steps of {GRADIENT_STEP} grey level(s)"
    if operator_id == "posterise":
        return f"posterised {n} times, down to {POSTERISE_BINS[n - 1]} bins per channel" \
            if n else "original"
    if operator_id == "jpeg_recompress":
        return f"JPEG re-encoded {n} times, down to quality {JPEG_QUALITY[n - 1]}" \
            if n else "original"
    if operator_id in ("fade_to_black", "fade_to_white", "fade_to_grey"):
        factor = {"fade_to_black": FADE_TO_BLACK_FACTOR, "fade_to_white": FADE_TO_WHITE_FACTOR,
                  "fade_to_grey": FADE_TO_GREY_SATURATION_FACTOR}[operator_id]
        what = "saturation" if operator_id == "fade_to_grey" else "values"
        return f"{what} multiplied by {factor} {n} times"
    noun = {"random_boxes": "boxes", "local_blur": "local blur boxes",
            "random_noise": "pixels set to a random colour",
            "random_pixel_exchange": "random pixel pairs swapped",
            "adjacent_pixel_exchange": "adjacent pixel swaps",
            "white_fog": "pixel fog increments"}[operator_id]
    return f"{n * per_level_count(operator_id, h, w)} {noun}"


def _colours(img: np.ndarray) -> int:
    flat = img.reshape(img.shape[0] * img.shape[1], -1)
    return int(len(np.unique(flat, axis=0)))


def level_change(operator_id: str, level: int, original: np.ndarray,
                 degraded: np.ndarray) -> LevelChange:
    """DEG-4: what ``operator_id`` changed by ``level`` (original -> degraded)."""
    spec_for(operator_id)
    lv = check_level(level, "level")
    frac = fraction_changed(original, degraded)
    a, b = original.astype(np.float64), degraded.astype(np.float64)
    h, w = original.shape[:2]
    return LevelChange(
        operator_id=operator_id, level=lv, fraction_changed=frac,
        mean_abs_diff=float(np.abs(a - b).mean()), mean_before=float(a.mean()),
        mean_after=float(b.mean()), colours_before=_colours(original),
        colours_after=_colours(degraded),
        change_made=_change_made(operator_id, lv, h, w) if lv else "original")
