"""IEEE-A2 blur corruptions: defocus_blur, glass_blur, motion_blur (the ImageNet-C one-sided
line of Gaussian taps, ``imagenet_c_motion_blur``), zoom_blur and gaussian_blur; plus the two
resampling helpers snow shares: ``one_sided_motion_blur`` and ``clipped_zoom``."""

from __future__ import annotations

import functools
import math

import cv2
import numpy as np
from fortis.services.perturbation.corruptions.pixels import gauss, plane, to_u8
from fortis.services.perturbation.spec import hwc

# Severity tables (index 0 = severity 1). ImageNet-C values from imagecorruptions 1.1.2.

#: IEEE-A2 gaussian_blur: sigma in pixels.
GAUSSIAN_BLUR_SIGMA = (1, 2, 3, 4, 6)
#: IEEE-A2 glass_blur: (sigma in pixels, max swap distance delta in pixels, iterations).
GLASS_BLUR_PARAMS = ((0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2))
#: IEEE-A2 defocus_blur: (disk radius in pixels, sigma of the anti-aliasing Gaussian).
DEFOCUS_BLUR_PARAMS = ((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5))
#: IEEE-A2 motion_blur: (radius in pixels, sigma of the Gaussian tap weights); the kernel is a
#: one-sided line of 2*radius+1 taps at an angle drawn uniformly in [-45, 45) degrees.
MOTION_BLUR_PARAMS = ((10, 3), (15, 5), (15, 8), (15, 12), (20, 15))
MOTION_BLUR_ANGLE_RANGE = (-45.0, 45.0)
#: IEEE-A2 zoom_blur: zoom factors as numpy.arange(start, stop, step); the output is the mean of
#: the image and its copies zoomed about the centre by each factor.
ZOOM_BLUR_RANGES = ((1, 1.11, 0.01), (1, 1.16, 0.01), (1, 1.21, 0.02), (1, 1.26, 0.02),
                    (1, 1.31, 0.03))


def _motion_taps(radius: int, sigma: float, angle_deg: float, h: int,
                 w: int) -> list[tuple[int, int, float]]:
    """Taps (dy, dx, weight) of the reference one-sided motion blur (ImageMagick-style):
    out(p) = sum_i weight_i * img(p - (dy_i, dx_i)).

    Tap i (i = 0 .. 2*radius) has weight exp(-i^2 / 2 sigma^2) and samples the pixel
    round(i) steps back along the angle. Taps that leave an h x w image are dropped (as the
    reference does) and the kept weights renormalised to sum to 1; taps landing on the same
    offset are merged.
    """
    width = 2 * radius + 1
    a = math.radians(angle_deg)
    p0, p1 = width * math.sin(a), width * math.cos(a)
    hyp = math.hypot(p0, p1)
    merged: dict[tuple[int, int], float] = {}
    for i in range(width):
        dy = -math.ceil(i * p0 / hyp - 0.5)
        dx = -math.ceil(i * p1 / hyp - 0.5)
        if abs(dy) >= h or abs(dx) >= w:
            break
        merged[(dy, dx)] = merged.get((dy, dx), 0.0) + math.exp(-(i * i) / (2.0 * sigma ** 2))
    total = sum(merged.values())
    return [(dy, dx, wt / total) for (dy, dx), wt in merged.items()]


def one_sided_motion_blur(x: np.ndarray, radius: int, sigma: float, angle_deg: float) -> np.ndarray:
    """Motion blur of a float32 HxW or HxWxC image (edge pixels replicated outside), as a
    weighted sum of shifted views of one padded copy."""
    h, w = x.shape[:2]
    taps = _motion_taps(radius, sigma, angle_deg, h, w)
    top = max(0, max(dy for dy, _, _ in taps))
    bottom = max(0, -min(dy for dy, _, _ in taps))
    left = max(0, max(dx for _, dx, _ in taps))
    right = max(0, -min(dx for _, dx, _ in taps))
    padded = cv2.copyMakeBorder(x, top, bottom, left, right, cv2.BORDER_REPLICATE)
    if x.ndim == 3 and padded.ndim == 2:
        padded = padded[:, :, None]
    out: np.ndarray | None = None
    for dy, dx, wt in taps:
        view = padded[top - dy:top - dy + h, left - dx:left - dx + w]
        out = view * np.float32(wt) if out is None else cv2.scaleAdd(view, wt, out, dst=out)
    assert out is not None
    return out.reshape(x.shape)


def _zoom_grid(n: int, zoom: float) -> tuple[int, int, float]:
    """The reference's ``clipped_zoom`` along one axis of length n: it crops the central
    ``ch = ceil(n / zoom)`` samples (first one ``top = (n - ch) // 2``) and up-samples them to
    ``size = round(ch * zoom)`` samples with ``scipy.ndimage.zoom(order=1)``, whose grid maps
    the first and last samples onto each other: output i samples ``top + i * step``.
    Returns (top, size, step)."""
    ch = math.ceil(n / zoom)
    size = round(ch * zoom)
    step = (ch - 1) / (size - 1) if size > 1 else 0.0
    return (n - ch) // 2, size, step


def clipped_zoom(x: np.ndarray, zoom: float, crop: bool = True) -> np.ndarray:
    """Zoom an HxWxC float image in by ``zoom`` (>= 1) on the reference's grid (``_zoom_grid``),
    exactly: separable linear interpolation at those sample positions (all inside the image,
    so no border rule is needed). ``crop``: keep the first H rows and W columns (the reference
    may produce a row/column more; snow crops only after its motion blur).

    That grid is up to ~1 px off-centre and its scale up to 0.3% off ``zoom`` at 224 px, and it
    sets the interpolation phases, which decide how much the snow layer's noise is smoothed
    before its threshold; so snow uses this exact version.
    """
    assert zoom >= 1.0
    out = x
    for axis, n in ((0, x.shape[0]), (1, x.shape[1])):
        top, size, step = _zoom_grid(n, zoom)
        m = n if crop else size
        pos = top + step * np.arange(m)
        i0 = np.minimum(np.floor(pos).astype(np.intp), n - 1)
        i1 = np.minimum(i0 + 1, n - 1)
        shape = (m, 1, 1) if axis == 0 else (1, m, 1)
        f = (pos - i0).astype(x.dtype).reshape(shape)
        out = np.take(out, i0, axis=axis) * (1 - f) + np.take(out, i1, axis=axis) * f
    return out


@functools.lru_cache(maxsize=1024)
def _zoom_matrices(h: int, w: int, zrange: tuple[float, float, float]) -> tuple[np.ndarray, ...]:
    """Inverse affine maps (output -> input) of zoom_blur's layers on the reference's grid."""
    mats = []
    for z in np.arange(*zrange):
        ty, _, sy = _zoom_grid(h, float(z))
        tx, _, sx = _zoom_grid(w, float(z))
        mats.append(np.array([[sx, 0.0, tx], [0.0, sy, ty]], dtype=np.float64))
    return tuple(mats)


# IEEE-A2 blur

def gaussian_blur(x: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    return gauss(x, sigma)


def glass_blur(x: np.ndarray, params: tuple[float, int, int],
               rng: np.random.Generator) -> np.ndarray:
    """IEEE-A2 b): blur, then ``iterations`` passes of random local pixel moves, then blur.

    Reference (imagecorruptions 1.1.2, as used to build ImageNet-C): each pass visits every
    pixel (h, w) with delta < h <= H - delta (same for w), in raster order from the
    bottom-right, draws ``dx, dy`` uniform in [-delta, delta) and runs
    ``x[h, w], x[h', w'] = x[h', w'], x[h, w]`` with (h', w') = (h + dy, w + dx). On numpy
    pixel *views* that statement is not a swap: the second assignment writes back the value
    just stored, so each visited pixel takes the *current* value of (h', w'), which is already
    this pass's new value when (h', w') was visited earlier. That is reproduced exactly (same
    draws, same order -> same result), vectorised: the pixel visited at step k copies from the
    step-j pixel when j < k, else from the value before the pass; following those links to
    their end by pointer doubling gives every pixel's source in O(log chain) numpy steps.
    """
    sigma, delta, iterations = params
    h, w, c = x.shape
    # The reference quantises to uint8 (truncation) between the two blurs. Blur the exact levels
    # k/255 in float64, as it does: in flat areas the blurred value is a whole level, and float32
    # noise would put it on the other side of the truncation.
    exact = np.rint(x.astype(np.float64) * 255.0) / 255.0
    y = np.floor(np.clip(gauss(exact, sigma), 0.0, 1.0) * 255.0) / 255.0
    y = np.ascontiguousarray(y, dtype=np.float32)
    hs = np.arange(h - delta, delta, -1)      # delta < h <= H - delta, descending
    ws = np.arange(w - delta, delta, -1)
    if hs.size and ws.size:
        pos = (hs[:, None] * w + ws[None, :]).ravel()     # flat positions in visiting order
        n = pos.size
        step = np.arange(n)
        visited_at = np.full(h * w, n, dtype=np.int64)    # n = not visited in a pass
        visited_at[pos] = step
        source = np.arange(h * w)                         # original pixel now at each position
        for _ in range(iterations):
            # reference: dx, dy = randint(-delta, delta, size=2) per pixel, in visiting order
            offsets = rng.integers(-delta, delta, size=(n, 2))
            src = pos + offsets[:, 1] * w + offsets[:, 0]
            j = visited_at[src]
            link = np.where(j < step, j, step)           # earlier step: copy its new value
            while True:
                nxt = link[link]
                if np.array_equal(nxt, link):
                    break
                link = nxt
            source[pos] = source[src[link]]               # right side is the pre-pass state
        y = y.reshape(h * w, c)[source].reshape(h, w, c)
    return gauss(y, sigma)


@functools.cache
def _disk(radius: float, alias_blur: float) -> np.ndarray:
    """Gaussian-aliased disk kernel of the reference (L = -8..8 for radius <= 8), with the
    weights below 1e-12 of the largest set to 0 (with alias sigma 0.1 they are ~1e-22 and
    less, some float32 denormals, which slow filtering ~6x) and cropped to the rest."""
    half = 8 if radius <= 8 else math.floor(radius)
    ksize = (3, 3) if radius <= 8 else (5, 5)
    coords = np.arange(-half, half + 1)
    xx, yy = np.meshgrid(coords, coords)
    disk = ((xx ** 2 + yy ** 2) <= radius ** 2).astype(np.float32)
    disk /= disk.sum()
    kernel = cv2.GaussianBlur(disk, ksize=ksize, sigmaX=alias_blur)
    kernel[kernel < 1e-12 * kernel.max()] = 0.0
    live = np.flatnonzero(kernel.max(axis=0) > 0)
    r = max(int(half - live.min()), int(live.max() - half))   # symmetric: keep it centred
    return np.ascontiguousarray(kernel[half - r:half + r + 1, half - r:half + r + 1])


def defocus_blur(x: np.ndarray, params: tuple[float, float],
                 rng: np.random.Generator) -> np.ndarray:
    radius, alias_blur = params
    h, w, c = x.shape
    kernel = _disk(min(radius, max(1, min(h, w) // 2)), alias_blur)
    return hwc(cv2.filter2D(x, -1, kernel), c)


def imagenet_c_motion_blur(x: np.ndarray, params: tuple[int, float],
                           rng: np.random.Generator) -> np.ndarray:
    """ImageNet-C motion blur: the one-sided line of Gaussian-weighted taps (ImageMagick's) at
    an angle drawn in MOTION_BLUR_ANGLE_RANGE (not the PER-1 ``per_motion_blur``, a centred
    uniform line at a fixed angle whose length follows epsilon)."""
    radius, sigma = params
    angle = rng.uniform(*MOTION_BLUR_ANGLE_RANGE)
    return one_sided_motion_blur(x, radius, sigma, angle)


def zoom_blur(img: np.ndarray, zrange: tuple[float, float, float],
              rng: np.random.Generator) -> np.ndarray:
    h, w, c = img.shape
    src = plane(img)
    acc = src.astype(np.float32)
    mats = _zoom_matrices(h, w, tuple(zrange))
    for m in mats:
        layer = cv2.warpAffine(src, m, (w, h), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                               borderMode=cv2.BORDER_REPLICATE)
        cv2.accumulate(layer, acc)
    return to_u8(acc, 1.0 / (len(mats) + 1))


# IEEE-A3 weather
