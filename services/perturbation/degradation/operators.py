"""The fifteen DEG-1 operators' per-level tables and steps (but model gradient descent, in
``gradient.py``): each step takes the contiguous uint8 H x W x C working image of level L-1 and
returns level L's. Validation helpers shared by the package live here too."""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.spec import ApplyContext, hwc

# ---------------------------------------------------------------------------------------------
# Per-level parameters (DEG-1), visible. Index 0 of a per-level table = level 1.
# ---------------------------------------------------------------------------------------------

#: Levels 1..30 (level 0 = the original image).
MAX_LEVEL = 30
LEVELS: tuple[int, ...] = tuple(range(1, MAX_LEVEL + 1))

#: Random lines: lines added per level, line thickness (px), colours of the two operators.
LINES_PER_LEVEL = 1
LINE_THICKNESS = 1
LINE_COLOURS = {"black_lines": 0, "white_lines": 255}
#: Random boxes: boxes per level = (h + w) // BOX_DIVISOR; side lengths uniform in BOX_SIDE (px).
BOX_DIVISOR = 10
BOX_SIDE = (2, 5)
#: Global blur: uniform (box) filters per level and their size (px).
GLOBAL_BLUR_FILTERS_PER_LEVEL = 1
GLOBAL_BLUR_KERNEL = 5
#: Local blur: rectangles per level = h + w; side lengths uniform in LOCAL_BLUR_SIDE (px).
LOCAL_BLUR_SIDE = (2, 10)
#: Random noise: pixels set to a random colour per level = w * h // NOISE_DIVISOR.
NOISE_DIVISOR = 50
#: Random pixel exchange: random pairs swapped per level = w * h // PIXEL_EXCHANGE_DIVISOR.
PIXEL_EXCHANGE_DIVISOR = 20
#: Adjacent pixel exchange: pixels swapped with an 8-neighbour per level = w * h // 20.
ADJACENT_EXCHANGE_DIVISOR = 20
#: White fog: pixels per level = w * h // FOG_DIVISOR, each channel + FOG_INCREMENT (clipped).
FOG_DIVISOR = 5
FOG_INCREMENT = 20
#: Fades: multiplier per level (values rounded to nearest, clipped to 0..255).
FADE_TO_BLACK_FACTOR = 0.9
FADE_TO_WHITE_FACTOR = 1.1
FADE_TO_GREY_SATURATION_FACTOR = 0.9
FADE_TO_GREY_SATURATION_RATIO = (9, 10)  # the same factor, for exact integer arithmetic
#: Posterise: bins per channel at level L = 32 - L (31 at level 1 .. 2 at level 30).
POSTERISE_BINS: tuple[int, ...] = tuple(32 - level for level in LEVELS)
#: JPEG: quality at level L = 32 - L (31 at level 1 .. 2 at level 30).
JPEG_QUALITY: tuple[int, ...] = tuple(32 - level for level in LEVELS)
#: Model gradient descent: grey levels each pixel moves per level, against the sign of the
#: gradient of log p(true class). Measured with the project's ``fmnist-surrogate`` on the 181 of
#: the first 200 Fashion-MNIST test images it classifies correctly at level 0 (2 CPU threads):
#:   step 1: surrogate accuracy 0.98 at level 1, 0.87 at 4, 0.51 at 10, 0.10 at 20, 0.04 at 30
#:           (the fmnist-cnn target, attacked by transfer: 0.99, 0.98, 0.91, 0.75, 0.56);
#:   step 2: 0.96 at level 1, 0.54 at 5, 0.11 at 10, 0.00 from level 21 -- most of the profile
#:           squeezed into the first third of the 30 levels.
#: Step 1 spreads the surrogate's profile over all 30 levels, from right to mostly wrong.
GRADIENT_STEP = 1

#: The operators, in the paper's order (section 1.2).
OPERATOR_IDS: tuple[str, ...] = (
    "black_lines", "white_lines", "random_boxes", "global_blur", "local_blur", "random_noise",
    "random_pixel_exchange", "adjacent_pixel_exchange", "white_fog", "fade_to_black",
    "fade_to_white", "fade_to_grey", "posterise", "jpeg_recompress", "model_gradient_descent",
)

StepFn = Callable[[np.ndarray, int, np.random.Generator, ApplyContext], np.ndarray]


# ---------------------------------------------------------------------------------------------
# Per-level counts (image's own w, h; at least 1)
# ---------------------------------------------------------------------------------------------

def per_level_count(operator_id: str, height: int, width: int) -> int:
    """How many items the operator adds or changes at one level of an h x w image (DEG-1).

    black/white_lines: lines; random_boxes: boxes (h+w)//10; local_blur: rectangles h+w;
    random_noise: pixels w*h//50; random_pixel_exchange: pairs w*h//20;
    adjacent_pixel_exchange: first pixels w*h//20; white_fog: pixels w*h//5; global_blur:
    filters (1). Always >= 1. Other operators change every pixel: ``InvalidArgument``.
    """
    h, w = int(height), int(width)
    counts = {
        "black_lines": LINES_PER_LEVEL,
        "white_lines": LINES_PER_LEVEL,
        "random_boxes": (h + w) // BOX_DIVISOR,
        "global_blur": GLOBAL_BLUR_FILTERS_PER_LEVEL,
        "local_blur": h + w,
        "random_noise": w * h // NOISE_DIVISOR,
        "random_pixel_exchange": w * h // PIXEL_EXCHANGE_DIVISOR,
        "adjacent_pixel_exchange": w * h // ADJACENT_EXCHANGE_DIVISOR,
        "white_fog": w * h // FOG_DIVISOR,
    }
    if operator_id not in counts:
        raise InvalidArgument("operator_id", f"'{operator_id}' has no per-level count; "
                              f"counted operators: {', '.join(counts)}")
    return max(1, counts[operator_id])


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def check_level(level: object, field: str) -> int:
    if isinstance(level, bool) or not isinstance(level, int | np.integer) \
            or not 0 <= int(level) <= MAX_LEVEL:
        raise InvalidArgument(field, f"must be an integer in 0..{MAX_LEVEL}, got {level!r}")
    return int(level)


def check_rng(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


def _random_positions(n_pixels: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` distinct flat pixel indices, uniform (without replacement)."""
    return rng.choice(n_pixels, size=min(count, n_pixels), replace=False)


def _flat(img: np.ndarray) -> np.ndarray:
    """H x W x C -> (H*W) x C view of a contiguous image."""
    return img.reshape(-1, img.shape[2])


# ---------------------------------------------------------------------------------------------
# The operators: one level each, on a contiguous uint8 H x W x C (C = 1 or 3) working image.
# Each returns the next level's image (a new array or the same one modified in place: the
# caller always passes its own working copy).
# ---------------------------------------------------------------------------------------------

def _line_endpoints(h: int, w: int,
                    rng: np.random.Generator) -> tuple[tuple[int, int], tuple[int, int]]:
    """(x, y) start on the left or top edge, end on the right or bottom edge (1/2 each)."""
    u = rng.random(2)
    start = (0, int(rng.integers(0, h))) if u[0] < 0.5 else (int(rng.integers(0, w)), 0)
    end = (w - 1, int(rng.integers(0, h))) if u[1] < 0.5 else (int(rng.integers(0, w)), h - 1)
    return start, end


def lines(colour: int) -> StepFn:
    def step(img: np.ndarray, level: int, rng: np.random.Generator,
             ctx: ApplyContext) -> np.ndarray:
        h, w, c = img.shape
        for _ in range(LINES_PER_LEVEL):
            start, end = _line_endpoints(h, w, rng)
            cv2.line(img, start, end, (colour,) * c, LINE_THICKNESS, lineType=cv2.LINE_AA)
        return img
    return step


def _random_rects(h: int, w: int, count: int, side: tuple[int, int],
                  rng: np.random.Generator) -> np.ndarray:
    """``count`` x (y, x, height, width): sides uniform in side[0]..side[1] (clipped to the
    image), top-left uniform so that the rectangle lies inside the image."""
    sides = rng.integers(side[0], side[1] + 1, size=(count, 2))
    rh = np.minimum(sides[:, 0], h)
    rw = np.minimum(sides[:, 1], w)
    ys = rng.integers(0, h - rh + 1)
    xs = rng.integers(0, w - rw + 1)
    return np.stack([ys, xs, rh, rw], axis=1)


def random_boxes(img: np.ndarray, level: int, rng: np.random.Generator,
                 ctx: ApplyContext) -> np.ndarray:
    h, w, _ = img.shape
    for y, x, rh, rw in _random_rects(h, w, per_level_count("random_boxes", h, w), BOX_SIDE,
                                      rng).tolist():
        img[y:y + rh, x:x + rw] = 0
    return img


def global_blur(img: np.ndarray, level: int, rng: np.random.Generator,
                ctx: ApplyContext) -> np.ndarray:
    k = GLOBAL_BLUR_KERNEL
    for _ in range(GLOBAL_BLUR_FILTERS_PER_LEVEL):
        img = hwc(cv2.blur(img, (k, k)), img.shape[2])
    return img


def local_blur(img: np.ndarray, level: int, rng: np.random.Generator,
               ctx: ApplyContext) -> np.ndarray:
    h, w, _ = img.shape
    for y, x, rh, rw in _random_rects(h, w, per_level_count("local_blur", h, w),
                                      LOCAL_BLUR_SIDE, rng).tolist():
        patch = img[y:y + rh, x:x + rw]
        patch[...] = np.rint(patch.mean(axis=(0, 1), dtype=np.float64)).astype(np.uint8)
    return img


def random_noise(img: np.ndarray, level: int, rng: np.random.Generator,
                 ctx: ApplyContext) -> np.ndarray:
    h, w, c = img.shape
    idx = _random_positions(h * w, per_level_count("random_noise", h, w), rng)
    _flat(img)[idx] = rng.integers(0, 256, size=(len(idx), c), dtype=np.uint8)
    return img


def _exchange_pairs(h: int, w: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """w*h//20 disjoint pairs of flat positions (2 x count drawn without replacement)."""
    n = per_level_count("random_pixel_exchange", h, w)
    if 2 * n > h * w:  # a 1x1 image: the only "pair" is the pixel with itself
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    idx = rng.choice(h * w, size=2 * n, replace=False)
    return idx[:n], idx[n:]


def random_pixel_exchange(img: np.ndarray, level: int, rng: np.random.Generator,
                          ctx: ApplyContext) -> np.ndarray:
    h, w, _ = img.shape
    a, b = _exchange_pairs(h, w, rng)
    flat = _flat(img)
    flat[a], flat[b] = flat[b].copy(), flat[a].copy()
    return img


#: The 8 neighbours (dy, dx) of a pixel.
_NEIGHBOURS = np.array([(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)])


def _adjacent_pairs(h: int, w: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """w*h//20 distinct first pixels and, for each, a partner uniform among its in-image
    8-neighbours (rejection sampling over the 8 offsets). Flat indices, in draw order."""
    if h * w < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    first = _random_positions(h * w, per_level_count("adjacent_pixel_exchange", h, w), rng)
    y, x = np.divmod(first, w)
    offsets = _NEIGHBOURS[rng.integers(0, 8, size=len(first))]
    while True:
        ny, nx = y + offsets[:, 0], x + offsets[:, 1]
        bad = (ny < 0) | (ny >= h) | (nx < 0) | (nx >= w)
        if not bad.any():
            break
        offsets[bad] = _NEIGHBOURS[rng.integers(0, 8, size=int(bad.sum()))]
    return first, ny * w + nx


def adjacent_pixel_exchange(img: np.ndarray, level: int, rng: np.random.Generator,
                            ctx: ApplyContext) -> np.ndarray:
    h, w, _ = img.shape
    a, b = _adjacent_pairs(h, w, rng)
    perm = list(range(h * w))  # perm[i] = where the pixel now at i came from
    for i, j in zip(a.tolist(), b.tolist(), strict=True):
        perm[i], perm[j] = perm[j], perm[i]
    return np.ascontiguousarray(_flat(img)[np.asarray(perm)].reshape(img.shape))


def white_fog(img: np.ndarray, level: int, rng: np.random.Generator,
              ctx: ApplyContext) -> np.ndarray:
    h, w, _ = img.shape
    idx = _random_positions(h * w, per_level_count("white_fog", h, w), rng)
    flat = _flat(img)
    flat[idx] = np.minimum(flat[idx].astype(np.int16) + FOG_INCREMENT, 255).astype(np.uint8)
    return img


def fade(factor: float) -> StepFn:
    def step(img: np.ndarray, level: int, rng: np.random.Generator,
             ctx: ApplyContext) -> np.ndarray:
        return np.clip(np.rint(img * factor), 0, 255).astype(np.uint8)
    return step


def fade_to_grey(img: np.ndarray, level: int, rng: np.random.Generator,
                 ctx: ApplyContext) -> np.ndarray:
    if img.shape[2] == 1:
        return img  # a grey image has no saturation to fade
    # RGB -> HSV, S x 0.9, HSV -> RGB in closed form: with H and V fixed every channel is
    # V - S*V*k (k in [0, 1] set by the hue), so scaling S scales each channel's distance to V.
    v = img.max(axis=2, keepdims=True).astype(np.int32)
    dist = v - img.astype(np.int32)
    num, den = FADE_TO_GREY_SATURATION_RATIO
    return (v - dist * num // den).astype(np.uint8)


def posterise(img: np.ndarray, level: int, rng: np.random.Generator,
              ctx: ApplyContext) -> np.ndarray:
    b = POSTERISE_BINS[level - 1]
    idx = np.minimum(img.astype(np.int32) * b // 255, b - 1)   # bin i: [i*255/b, (i+1)*255/b)
    lut = np.rint((np.arange(b) + 1) * 255.0 / b).astype(np.uint8)   # bin i -> (i+1)*255/b
    return lut[idx]


def jpeg_recompress(img: np.ndarray, level: int, rng: np.random.Generator,
                    ctx: ApplyContext) -> np.ndarray:
    c = img.shape[2]
    src = img[:, :, 0] if c == 1 else np.ascontiguousarray(img[:, :, ::-1])  # RGB -> BGR
    ok, buf = cv2.imencode(".jpg", src, [int(cv2.IMWRITE_JPEG_QUALITY),
                                         JPEG_QUALITY[level - 1]])
    if not ok:  # pragma: no cover - OpenCV always encodes a valid uint8 image
        raise RuntimeError("JPEG encoding failed")
    dec: np.ndarray | None = cv2.imdecode(buf, cv2.IMREAD_GRAYSCALE if c == 1
                                          else cv2.IMREAD_COLOR)
    if dec is None:  # pragma: no cover - OpenCV decodes what it encoded
        raise RuntimeError("JPEG decoding failed")
    return hwc(dec, 1) if c == 1 else np.ascontiguousarray(dec[:, :, ::-1])  # BGR -> RGB
