"""IEEE-A4 digital corruptions: contrast, saturate, pixelate (Pillow's BOX + NEAREST, bit for
bit), jpeg_compression and elastic_transform."""

from __future__ import annotations

import functools

import cv2
import numpy as np
from fortis.services.perturbation.corruptions.pixels import cv_any, plane
from fortis.services.perturbation.spec import hwc
from PIL import Image

# Severity tables (index 0 = severity 1). ImageNet-C values from imagecorruptions 1.1.2.

#: IEEE-A4 contrast: factor c in x' = (x - mean) * c + mean (per-channel mean).
CONTRAST_FACTOR = (0.4, 0.3, 0.2, 0.1, 0.05)
#: IEEE-A4 saturate: (multiplier, offset) applied to S of HSV: S' = clip(S*c0 + c1).
SATURATE_PARAMS = ((0.3, 0), (0.1, 0), (2, 0), (5, 0.1), (20, 0.2))
#: IEEE-A4 pixelate: down-sampling factor (box/area down, nearest up).
PIXELATE_FACTOR = (0.6, 0.5, 0.4, 0.3, 0.25)
#: IEEE-A4 jpeg_compression: JPEG quality.
JPEG_QUALITY = (25, 18, 15, 10, 7)
#: IEEE-A4 elastic_transform: alpha (displacement gain). Displacement field: uniform noise in
#: +-0.005*H, Gaussian-smoothed with sigma = 0.01*(H, W) (truncate 3), times alpha; bilinear
#: resampling with reflected borders.
ELASTIC_ALPHA = (250 * 0.05, 250 * 0.065, 250 * 0.085, 250 * 0.1, 250 * 0.12)


# IEEE-A4 digital

def contrast(img: np.ndarray, factor: float, rng: np.random.Generator) -> np.ndarray:
    c = img.shape[2]
    means = np.array(cv2.mean(img)[:c]) / 255.0                 # float64, as the reference
    levels = np.arange(256, dtype=np.float64)[:, None] / 255.0
    lut = np.rint(np.clip(((levels - means) * factor + means) * 255.0, 0.0, 255.0))
    return cv2.LUT(img, lut.astype(np.uint8).reshape(256, 1, c))


def saturate(x: np.ndarray, params: tuple[float, float], rng: np.random.Generator) -> np.ndarray:
    if x.shape[2] == 1:      # a grey pixel has no hue: the reference leaves it unchanged
        return x.copy()
    mult, offset = params
    hsv = cv2.cvtColor(x, cv2.COLOR_RGB2HSV)
    hsv[:, :, 1] = np.clip(hsv[:, :, 1] * mult + offset, 0.0, 1.0)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


@functools.lru_cache(maxsize=256)
def _pil_box_bounds(n_in: int, n_out: int) -> tuple[tuple[int, int], ...] | None:
    """(first input index, count) of the pixels Pillow's BOX filter averages for each output
    pixel along one axis (its ``precompute_coeffs``: box centred at (i + 0.5) * scale, pixels
    whose centre offset lies in (-scale/2, scale/2], equal weights); None if that is not one
    run of pixels (never seen)."""
    scale = n_in / n_out
    support = 0.5 * max(scale, 1.0)
    boxes = []
    for i in range(n_out):
        centre = (i + 0.5) * scale
        lo = max(0, int(centre - support + 0.5))
        hi = min(n_in, int(centre + support + 0.5))
        ones = [x for x in range(lo, hi) if -support < x - centre + 0.5 <= support]
        if not ones or ones != list(range(ones[0], ones[-1] + 1)):
            return None
        boxes.append((ones[0], len(ones)))
    return tuple(boxes)


@functools.lru_cache(maxsize=256)
def _pil_nearest_index(n_in: int, n_out: int) -> np.ndarray:
    """Source index of each output sample of Pillow's NEAREST resize from n_in to n_out,
    read off Pillow itself (OpenCV's nearest-neighbour grids differ at some sizes)."""
    row = Image.fromarray(np.arange(n_in, dtype=np.int32).reshape(1, n_in))       # mode "I"
    return np.asarray(row.resize((n_out, 1), Image.Resampling.NEAREST)).ravel().astype(np.intp)


@functools.lru_cache(maxsize=64)
def _pixelate_plan(n: int, factor: float) -> tuple[tuple[int, ...], tuple, tuple] | None:
    """For an n x n image: the box lengths, and the nearest-neighbour maps (OpenCV fixed-point)
    that pick each box's mean out of the stacked per-length mean images, first along x (to
    the small width), then along y fused with the up-sampling back to n x n. None where a box
    is longer than 3 pixels (Pillow is faster there)."""
    small = max(1, int(n * factor))
    boxes = _pil_box_bounds(n, small)
    if boxes is None or max(count for _, count in boxes) > 3:
        return None
    lengths = tuple(sorted({count for _, count in boxes}))
    offset, o = {}, 0
    for count in lengths:              # the mean images, stacked along the axis
        offset[count] = o
        o += n - count + 1
    pos = np.array([offset[count] + first for first, count in boxes], dtype=np.float32)
    near = _pil_nearest_index(small, n)
    rows = np.arange(n, dtype=np.float32)[:, None]
    hmap = cv2.convertMaps(np.ascontiguousarray(np.broadcast_to(pos[None, :], (n, small))),
                           np.ascontiguousarray(np.broadcast_to(rows, (n, small))),
                           cv2.CV_16SC2, nninterpolation=True)
    vmap = cv2.convertMaps(np.ascontiguousarray(np.broadcast_to(near[None, :], (n, n)),
                                                dtype=np.float32),
                           np.ascontiguousarray(np.broadcast_to(pos[near][:, None], (n, n))),
                           cv2.CV_16SC2, nninterpolation=True)
    return lengths, hmap, vmap


def _box_means(src: np.ndarray, n: int, axis: int) -> np.ndarray:
    """Means of n consecutive pixels along ``axis`` (1: x, 0: y) at every start, rounded half
    up as Pillow rounds them (uint8; the result is n - 1 shorter along that axis)."""
    if n == 1:
        return src
    if n == 2:          # (a + b) / 2, the 0.001 turns OpenCV's round-half-even into half-up
        a, b = (src[:, :-1], src[:, 1:]) if axis == 1 else (src[:-1], src[1:])
        return cv2.addWeighted(a, 0.5, b, 0.5, 1e-3)
    # n = 3: a sum of 3 over 3 is never a tie, so OpenCV's rounding is Pillow's
    out = cv2.boxFilter(src, -1, (n, 1) if axis == 1 else (1, n), anchor=(0, 0), normalize=True,
                        borderType=cv2.BORDER_REPLICATE)
    return out[:, :src.shape[1] - n + 1] if axis == 1 else out[:src.shape[0] - n + 1]


def pixelate(img: np.ndarray, factor: float, rng: np.random.Generator) -> np.ndarray:
    """Pillow's BOX down-sampling and NEAREST up-sampling, as the reference, bit for bit.

    OpenCV's own resizes are not equivalent: INTER_AREA weights the pixels a fractional box
    cuts by area (Pillow takes the pixels whose centres fall in the box) and its nearest grids
    differ from Pillow's at some sizes (4-5 grey levels on average at 0.6, 0.4, 0.3). Three
    routes, all giving Pillow's pixels (tests/unit: every square side up to 79 and more):

    * square images whose boxes hold at most 3 pixels (factors 0.6, 0.5, 0.4 at 224 px): the
      box means per length along x (rounded half up, as each of Pillow's two passes rounds),
      picked per output column with one nearest remap; the same along y, fused with the
      nearest up-sampling into a second remap (Pillow runs x first on square images);
    * square images divided exactly by 2 or 4 (0.25 at 224 px): Pillow's reduce() along x,
      then along y (its BOX passes, bit for bit, about twice as fast);
    * otherwise Pillow's resize itself (on oblong images it sometimes runs y first).
    """
    h, w, c = img.shape
    src = plane(img)
    plan = _pixelate_plan(w, factor) if h == w else None
    if plan is not None:
        lengths, (hmap, _), (vmap, _) = plan
        means = [_box_means(src, n, 1) for n in lengths]
        across = cv_any.remap(means[0] if len(means) == 1 else cv2.hconcat(means), hmap, None,
                           cv2.INTER_NEAREST)
        means = [_box_means(across, n, 0) for n in lengths]
        return cv_any.remap(means[0] if len(means) == 1 else cv2.vconcat(means), vmap, None,
                         cv2.INTER_NEAREST)
    sw, sh = max(1, int(w * factor)), max(1, int(h * factor))
    pil = Image.fromarray(src)
    n = w // sw
    if h == w and n * sw == w and n in (2, 4):
        # x n exactly: Pillow's NEAREST repeats each pixel n times, as OpenCV's does
        small = np.asarray(pil.reduce((n, 1)).reduce((1, n)))
        return cv2.resize(small, (w, h), interpolation=cv2.INTER_NEAREST)
    small_pil = pil.resize((sw, sh), Image.Resampling.BOX)
    return np.asarray(small_pil.resize((w, h), Image.Resampling.NEAREST))


def jpeg_compression(img: np.ndarray, quality: int, rng: np.random.Generator) -> np.ndarray:
    c = img.shape[2]
    src = img[:, :, 0] if c == 1 else cv2.cvtColor(img, cv2.COLOR_RGB2BGR)
    ok, buf = cv2.imencode(".jpg", src, [int(cv2.IMWRITE_JPEG_QUALITY), int(quality)])
    if not ok:  # pragma: no cover - OpenCV always encodes a valid uint8 image
        raise RuntimeError("JPEG encoding failed")
    if c == 1:
        out = cv2.imdecode(buf, cv2.IMREAD_GRAYSCALE)
    elif _IMREAD_RGB is not None:
        out = cv2.imdecode(buf, _IMREAD_RGB)
    else:                                                              # OpenCV < 4.10
        bgr = cv2.imdecode(buf, cv2.IMREAD_COLOR)
        out = None if bgr is None else cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    if out is None:  # pragma: no cover - OpenCV decodes what it encoded
        raise RuntimeError("JPEG decoding failed")
    return out


_IMREAD_RGB: int | None = getattr(cv2, "IMREAD_COLOR_RGB", None)


def elastic_transform(x: np.ndarray, alpha: float, rng: np.random.Generator) -> np.ndarray:
    h, w, c = x.shape
    sig_y, sig_x = 0.01 * h, 0.01 * w
    max_d = 0.005 * h
    kx = 2 * min(int(3 * sig_x + 0.5), w) + 1
    ky = 2 * min(int(3 * sig_y + 0.5), h) + 1

    def field() -> np.ndarray:
        noise = rng.uniform(-max_d, max_d, size=(h, w)).astype(np.float32)
        return cv2.GaussianBlur(noise, (kx, ky), sigmaX=sig_x, sigmaY=sig_y,
                                borderType=cv2.BORDER_REFLECT) * np.float32(alpha)

    dx = field()
    dy = field()
    gx, gy = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    return hwc(cv2.remap(x, gx + dx, gy + dy, interpolation=cv2.INTER_LINEAR,
                          borderMode=cv2.BORDER_REFLECT), c)
