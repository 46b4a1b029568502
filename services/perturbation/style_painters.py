"""The four classical styles of ``styles.py`` (IEEE-A6: sketch, oil_painting, cubist,
mondrian): their per-severity tables and the numpy + OpenCV code that paints them. No network,
no weights; randomness only from the generator passed in. Domain code: no gRPC.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import cv2
import numpy as np
from fortis.services.common.errors import InvalidArgument

# ---------------------------------------------------------------------------------------------
# Severity tables (index 0 = severity 1). Lengths are fractions of the shorter side m.
# ---------------------------------------------------------------------------------------------

#: IEEE-A6 sketch: (sigma of the colour-dodge blur / m, line darkening gamma, pencil shading
#: strength, share of the original colour kept). Grey = luminance; lines = ((grey + p) /
#: (blur(grey) + p)) ** gamma, clipped to 1 (a colour dodge: white paper where the image is
#: flat, dark strokes on the dark side of edges; p = SKETCH_PAPER keeps flat black areas paper
#: white), darkened where the image is dark by a hatching texture (Gaussian grain streaked at
#: 45 degrees over 0.04 m); result = keep * image + (1 - keep) * sketch. Severity 5 is a pure
#: grey pencil drawing.
SKETCH_PARAMS = ((0.008, 1.5, 0.20, 0.70),
                 (0.012, 2.0, 0.28, 0.50),
                 (0.016, 2.5, 0.34, 0.30),
                 (0.022, 2.8, 0.38, 0.12),
                 (0.030, 3.0, 0.40, 0.00))
SKETCH_HATCH_LENGTH = 0.04
SKETCH_PAPER = 0.05
SKETCH_HATCH_ANGLE_DEG = 45.0

#: IEEE-A6 oil_painting: (brush radius / m, impasto relief strength, saturation boost).
#: A Kuwahara filter (each pixel takes the mean colour of whichever of its four (r+1) x (r+1)
#: corner windows has the least luminance variance: flat strokes, sharp edges), then a light
#: from the top-left on the fine relief of the result (Sobel of its lightly smoothed
#: luminance, clipped to +-0.3) gives the strokes body, and HSV saturation is raised
#: (x (1 + boost)) as in oil colours.
OIL_PARAMS = ((0.007, 0.20, 0.05),
              (0.010, 0.30, 0.10),
              (0.016, 0.40, 0.15),
              (0.022, 0.50, 0.20),
              (0.031, 0.60, 0.25))

#: IEEE-A6 cubist ("Picasso"): (facets, straight cuts, share of the facet's own texture kept
#: (the rest is its flat mean colour), max shift of a facet's content / m, outline thickness
#: / m, shading strength, earth-palette share). Facet seeds are drawn with probability
#: proportional to local edge strength + its mean (more, smaller facets on the subject), and the
#: Voronoi cells are cut by straight lines across the image; each facet shows the image
#: displaced by its own random offset (several viewpoints at once), is lit by a linear ramp in a
#: random direction plus a brightness offset U(-0.08, 0.08) (planes), and its colour moves by
#: the earth share towards the analytic-cubist palette (CUBIST_EARTH: brown - ochre - cream by
#: luminance); outlines are dark brown (a line thinner than 1 px is drawn 1 px wide with that
#: opacity, so small images are not buried under outlines).
CUBIST_PARAMS = ((80, 2, 0.85, 0.010, 0.002, 0.08, 0.10),
                 (110, 4, 0.60, 0.020, 0.004, 0.14, 0.25),
                 (130, 6, 0.40, 0.035, 0.007, 0.20, 0.40),
                 (110, 8, 0.20, 0.050, 0.010, 0.25, 0.55),
                 (80, 10, 0.00, 0.070, 0.013, 0.30, 0.70))
CUBIST_EARTH = ((0.16, 0.12, 0.09), (0.70, 0.56, 0.34), (0.93, 0.89, 0.78))   # dark, mid, light
CUBIST_BRIGHTNESS_JITTER = 0.08
CUBIST_MIN_FACET_AREA = 30     # px: at most H*W/30 facets (small images)
CUBIST_OUTLINE_RGB = (0.12, 0.09, 0.07)

#: IEEE-A6 mondrian: (rectangles, black line thickness / m, palette purity). The image is cut
#: recursively, always splitting the rectangle with the most detail (area * (std of luminance +
#: 0.05)) across its longer side (either if nearly square, by the rng) at the strongest edge of
#: its central half (edge profile times U(0.5, 1)), so the partition follows the content. Each
#: rectangle's colour = purity * its palette colour + (1 - purity) * its mean colour; palette:
#: chromatic means (HSV saturation >= 0.3, value >= 0.25) go to the nearest of red, yellow, blue
#: by hue; others to white, light grey or black by luminance (MONDRIAN_LUMA). A line thinner
#: than 1 px (small images) is drawn 1 px wide with that opacity.
MONDRIAN_PARAMS = ((300, 0.005, 0.25),
                   (150, 0.008, 0.50),
                   (70, 0.011, 0.75),
                   (32, 0.015, 0.90),
                   (14, 0.020, 1.00))
MONDRIAN_PALETTE: Mapping[str, tuple[float, float, float]] = MappingProxyType({
    "white": (0.95, 0.94, 0.90), "grey": (0.78, 0.78, 0.76), "black": (0.08, 0.08, 0.08),
    "red": (0.83, 0.10, 0.09), "yellow": (0.98, 0.80, 0.10), "blue": (0.10, 0.24, 0.60)})
MONDRIAN_HUES = (("red", 0.0), ("yellow", 50.0), ("blue", 225.0))   # degrees
MONDRIAN_LUMA = (0.55, 0.40)   # white above the first, light grey above the second, else black
MONDRIAN_LINE_RGB = (0.05, 0.05, 0.05)

#: IEEE-A6 neural_style: blend weight of the model's stylised image (1 - w: the original).
NEURAL_BLEND = (0.2, 0.4, 0.6, 0.8, 1.0)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

Params = Mapping[str, Any]


def check_severity(level: object) -> int:
    """IEEE-M7: an integer severity 1..5 (not a bool); raises InvalidArgument on ``severity``."""
    if isinstance(level, bool) or not isinstance(level, int | np.integer | float | np.floating) \
            or not math.isfinite(float(level)) or float(level) != int(level) \
            or not 1 <= int(level) <= 5:
        raise InvalidArgument("severity", f"must be an integer in 1..5, got {level!r}")
    return int(level)


def _luma(x: np.ndarray) -> np.ndarray:
    """HxW luminance (Rec. 601, as OpenCV) of an HxWx3 float image."""
    return cv2.cvtColor(x, cv2.COLOR_RGB2GRAY)


def _px(frac: float, m: int, minimum: float = 1.0) -> float:
    return max(minimum, frac * m)


def _blur_reflect(x: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian blur with a reflected border and OpenCV's own kernel size (the styles' soft
    look; not the corruptions' skimage-compatible ``pixels.gauss``)."""
    out = cv2.GaussianBlur(x, (0, 0), sigmaX=sigma, sigmaY=sigma, borderType=cv2.BORDER_REFLECT)
    return out.reshape(x.shape)


def _streak(n: np.ndarray, length: float, angle_deg: float) -> np.ndarray:
    """Blur an HxW float field along a line (motion blur) of ``length`` px."""
    r = max(1, int(round(length / 2)))
    k = np.zeros((2 * r + 1, 2 * r + 1), np.float32)
    a = math.radians(angle_deg)
    for t in np.linspace(-r, r, 4 * r + 1):
        k[int(round(r - t * math.sin(a))), int(round(r + t * math.cos(a)))] = 1.0
    return cv2.filter2D(n, -1, k / k.sum(), borderType=cv2.BORDER_REFLECT)


# ---------------------------------------------------------------------------------------------
# Styles: float32 HxWx3 image in [0, 1], severity parameters, rng, params -> float image
# ---------------------------------------------------------------------------------------------

def _sketch(x: np.ndarray, prm: tuple[float, ...], rng: np.random.Generator,
            params: Params) -> np.ndarray:
    sigma_f, gamma, shading, keep = prm
    h, w, _ = x.shape
    m = min(h, w)
    grain = rng.standard_normal((h, w), dtype=np.float32)
    g = _luma(x)
    blur = _blur_reflect(g, _px(sigma_f, m, 0.5))
    lines = np.clip((g + SKETCH_PAPER) / (blur + SKETCH_PAPER), 0.0, 1.0) ** gamma
    hatch = _streak(grain, _px(SKETCH_HATCH_LENGTH, m, 3.0), SKETCH_HATCH_ANGLE_DEG)
    hatch = np.clip(0.5 + hatch / (4.0 * float(hatch.std()) + 1e-6), 0.0, 1.0)
    tone = _blur_reflect(g, _px(3 * sigma_f, m, 1.0))
    sketch = np.clip(lines * (1.0 - shading * (1.0 - tone) * (0.4 + 0.6 * hatch)), 0.0, 1.0)
    return keep * x + (1.0 - keep) * sketch[:, :, None]


def _kuwahara(x: np.ndarray, r: int) -> np.ndarray:
    """Kuwahara filter of an HxWx3 float image, radius r (windows of (r+1) x (r+1) px),
    with integral images (O(1) per pixel whatever r) and a reflected border."""
    h, w, _ = x.shape
    pad = np.pad(x, ((r, r), (r, r), (0, 0)), mode="symmetric").astype(np.float64)
    lum = _luma(np.ascontiguousarray(pad, dtype=np.float32)).astype(np.float64)

    def integral(a: np.ndarray) -> np.ndarray:
        out = np.zeros((a.shape[0] + 1, a.shape[1] + 1) + a.shape[2:])
        out[1:, 1:] = a.cumsum(0).cumsum(1)
        return out

    s_rgb, s_l, s_l2 = integral(pad), integral(lum), integral(lum * lum)
    n = float((r + 1) ** 2)
    best_var: np.ndarray | None = None
    best = np.zeros((h, w, 3))
    for oy, ox in ((0, 0), (0, r), (r, 0), (r, r)):      # the four corner windows
        def box(s: np.ndarray, oy: int = oy, ox: int = ox) -> np.ndarray:
            y1, x1 = oy + r + 1, ox + r + 1
            return s[y1:y1 + h, x1:x1 + w] - s[oy:oy + h, x1:x1 + w] \
                - s[y1:y1 + h, ox:ox + w] + s[oy:oy + h, ox:ox + w]
        mean_l = box(s_l) / n
        var = box(s_l2) / n - mean_l * mean_l
        mean = box(s_rgb) / n
        if best_var is None:
            best_var, best = var, mean
        else:
            better = var < best_var
            best_var = np.where(better, var, best_var)
            best = np.where(better[:, :, None], mean, best)
    return best.astype(np.float32)


def _oil_painting(x: np.ndarray, prm: tuple[float, ...], rng: np.random.Generator,
                  params: Params) -> np.ndarray:
    radius_f, relief, boost = prm
    h, w, _ = x.shape
    paint = _kuwahara(x, int(round(_px(radius_f, min(h, w)))))
    if min(h, w) >= 3:
        lum = _blur_reflect(_luma(paint), 0.8)
        gx = cv2.Sobel(lum, cv2.CV_32F, 1, 0, ksize=3)
        gy = cv2.Sobel(lum, cv2.CV_32F, 0, 1, ksize=3)
        paint = paint * (1.0 + relief * np.clip(-(gx + gy), -0.3, 0.3))[:, :, None]
    hsv = cv2.cvtColor(np.clip(paint, 0.0, 1.0).astype(np.float32), cv2.COLOR_RGB2HSV)
    hsv[:, :, 1] = np.clip(hsv[:, :, 1] * (1.0 + boost), 0.0, 1.0)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


def _voronoi_labels(h: int, w: int, seeds_y: np.ndarray, seeds_x: np.ndarray) -> np.ndarray:
    """HxW int32 label of the nearest seed (1..n, Euclidean, OpenCV's distance transform)."""
    src = np.ones((h, w), np.uint8)
    src[seeds_y, seeds_x] = 0
    _, labels = cv2.distanceTransformWithLabels(src, cv2.DIST_L2, cv2.DIST_MASK_5,
                                                labelType=cv2.DIST_LABEL_PIXEL)
    return labels


def _cubist(x: np.ndarray, prm: tuple[float, ...], rng: np.random.Generator,
            params: Params) -> np.ndarray:
    n_f, cuts_f, keep, shift_f, edge_f, shade, earth = prm
    h, w, _ = x.shape
    m = min(h, w)
    n_seeds = max(1, min(int(n_f), (h * w) // CUBIST_MIN_FACET_AREA))
    n_cuts = int(cuts_f)
    # seeds: where the image has detail, plus a uniform share
    g = _luma(x)
    grad = np.abs(cv2.Sobel(g, cv2.CV_32F, 1, 0, ksize=3)) + np.abs(cv2.Sobel(g, cv2.CV_32F, 0, 1,
                                                                            ksize=3))
    grad = _blur_reflect(grad, _px(0.02, m))
    weight = (grad + grad.mean() + 1e-6).ravel().astype(np.float64)
    flat = rng.choice(h * w, size=n_seeds, p=weight / weight.sum())
    labels = _voronoi_labels(h, w, flat // w, flat % w).astype(np.int64)
    # straight cuts across the image
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    cut_pts = rng.random((n_cuts, 2)) * np.array([w, h])
    cut_ang = rng.uniform(0.0, math.pi, n_cuts)
    for (px, py), a in zip(cut_pts, cut_ang, strict=True):
        side = ((xx - px) * math.sin(a) - (yy - py) * math.cos(a)) > 0
        labels = labels * 2 + side
    _, lab = np.unique(labels, return_inverse=True)
    lab = lab.reshape(h, w)
    n = int(lab.max()) + 1
    # per facet: displaced content, flat mean colour, shading ramp, colour shift
    shift = rng.uniform(-1.0, 1.0, size=(n, 2)) * _px(shift_f, m, 0.0)
    ramp_ang = rng.uniform(0.0, 2.0 * math.pi, n)
    offset = rng.uniform(-CUBIST_BRIGHTNESS_JITTER, CUBIST_BRIGHTNESS_JITTER, size=n)
    map_x = (xx + shift[lab, 0]).astype(np.float32)
    map_y = (yy + shift[lab, 1]).astype(np.float32)
    moved = cv2.remap(x, map_x, map_y, cv2.INTER_LINEAR,
                      borderMode=cv2.BORDER_REFLECT).reshape(x.shape)
    flat_lab = lab.ravel()
    counts = np.maximum(np.bincount(flat_lab, minlength=n), 1)
    means = np.stack([np.bincount(flat_lab, weights=moved[:, :, c].ravel(), minlength=n)
                      for c in range(3)], axis=1) / counts[:, None]
    facet = keep * moved + (1.0 - keep) * means[lab].astype(np.float32)
    proj = xx * np.cos(ramp_ang)[lab] + yy * np.sin(ramp_ang)[lab]
    p_mean = np.bincount(flat_lab, weights=proj.ravel(), minlength=n) / counts
    p_sq = np.bincount(flat_lab, weights=(proj.ravel() ** 2), minlength=n) / counts
    p_std = np.sqrt(np.maximum(p_sq - p_mean ** 2, 0.0)) + 1e-3
    ramp = np.clip((proj - p_mean[lab]) / (2.0 * p_std[lab]), -1.0, 1.0).astype(np.float32)
    out = facet * (1.0 + shade * ramp)[:, :, None] + offset[lab].astype(np.float32)[:, :, None]
    out = (1.0 - earth) * out + earth * _earth(np.clip(_luma(out.astype(np.float32)), 0.0, 1.0))
    # bold outlines on facet borders
    border = np.zeros((h, w), np.uint8)
    border[:, :-1] |= (lab[:, :-1] != lab[:, 1:]).astype(np.uint8)
    border[:-1, :] |= (lab[:-1, :] != lab[1:, :]).astype(np.uint8)
    t_px = edge_f * m                 # thinner than a pixel: a 1-px line, that opaque
    t = max(1, int(round(t_px)))
    alpha = np.float32(min(1.0, t_px))
    if t > 1:
        border = np.asarray(cv2.dilate(border, cv2.getStructuringElement(cv2.MORPH_ELLIPSE,
                                                                         (t, t))), np.uint8)
    ink = np.array(CUBIST_OUTLINE_RGB, np.float32)
    return np.where(border[:, :, None] > 0, alpha * ink + (1 - alpha) * out, out)


def _earth(y: np.ndarray) -> np.ndarray:
    """HxWx3 colour of luminance y on the brown - ochre - cream ramp of CUBIST_EARTH."""
    dark, mid, light = (np.array(c, np.float32) for c in CUBIST_EARTH)
    lo = np.clip(y * 2.0, 0.0, 1.0)[:, :, None]
    hi = np.clip(y * 2.0 - 1.0, 0.0, 1.0)[:, :, None]
    return np.where(y[:, :, None] < 0.5, dark + (mid - dark) * lo, mid + (light - mid) * hi)


def _palette_colour(rgb: np.ndarray) -> np.ndarray:
    """The Mondrian palette colour of one mean colour (see MONDRIAN_PARAMS)."""
    hsv = cv2.cvtColor(rgb.reshape(1, 1, 3).astype(np.float32), cv2.COLOR_RGB2HSV)[0, 0]
    hue, sat, val = float(hsv[0]), float(hsv[1]), float(hsv[2])
    if sat >= 0.3 and val >= 0.25:
        name = min(MONDRIAN_HUES, key=lambda nh: min(abs(hue - nh[1]), 360 - abs(hue - nh[1])))[0]
    else:
        y = float(0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2])
        name = "white" if y > MONDRIAN_LUMA[0] else "grey" if y > MONDRIAN_LUMA[1] else "black"
    return np.array(MONDRIAN_PALETTE[name], np.float32)


def _mondrian(x: np.ndarray, prm: tuple[float, ...], rng: np.random.Generator,
              params: Params) -> np.ndarray:
    n_f, line_f, purity = prm
    h, w, _ = x.shape
    m = min(h, w)
    t_px = line_f * m
    t = max(1, int(round(t_px)))
    alpha = np.float32(min(1.0, t_px))
    g = _luma(x).astype(np.float64)
    ii = cv2.integral(g)                   # (h+1) x (w+1) sums, for O(1) statistics
    ii2 = cv2.integral(g * g)
    gx = np.abs(np.diff(g, axis=1, append=g[:, -1:]))
    gy = np.abs(np.diff(g, axis=0, append=g[-1:, :]))
    min_side = t + 2                     # a rectangle keeps >= 2 px of colour inside its lines

    def score(r: tuple[int, int, int, int]) -> float:
        y0, x0, y1, x1 = r
        area = (y1 - y0) * (x1 - x0)
        s = ii[y1, x1] - ii[y0, x1] - ii[y1, x0] + ii[y0, x0]
        s2 = ii2[y1, x1] - ii2[y0, x1] - ii2[y1, x0] + ii2[y0, x0]
        var = max(s2 / area - (s / area) ** 2, 0.0)
        return area * (math.sqrt(var) + 0.05)

    heap: list[tuple[float, int, tuple[int, int, int, int]]] = []
    done: list[tuple[int, int, int, int]] = []
    order = 0
    heapq.heappush(heap, (-score((0, 0, h, w)), order, (0, 0, h, w)))
    while heap and len(heap) + len(done) < int(n_f):
        _, _, r = heapq.heappop(heap)
        y0, x0, y1, x1 = r
        rh, rw = y1 - y0, x1 - x0
        can_rows, can_cols = rh >= 2 * min_side, rw >= 2 * min_side
        pick = rng.random()          # drawn for every split, used when nearly square
        jitter = rng.uniform(0.5, 1.0, size=max(rh, rw))
        if not (can_rows or can_cols):
            done.append(r)
            continue
        if can_rows and can_cols:
            ratio = rh / rw
            cut_rows = ratio > 1.25 or (ratio >= 0.8 and pick < 0.5)
        else:
            cut_rows = can_rows
        if cut_rows:
            lo, hi = y0 + max(min_side, rh // 4), y1 - max(min_side, rh // 4)
            profile = gy[lo:hi + 1, x0:x1].mean(axis=1) if hi >= lo else np.zeros(0)
        else:
            lo, hi = x0 + max(min_side, rw // 4), x1 - max(min_side, rw // 4)
            profile = gx[y0:y1, lo:hi + 1].mean(axis=0) if hi >= lo else np.zeros(0)
        if profile.size == 0:
            done.append(r)
            continue
        cut = lo + int(np.argmax((profile + 1e-3) * jitter[:profile.size]))
        halves = ((y0, x0, cut, x1), (cut, x0, y1, x1)) if cut_rows else \
            ((y0, x0, y1, cut), (y0, cut, y1, x1))
        for half in halves:
            order += 1
            heapq.heappush(heap, (-score(half), order, half))
    rects = done + [r for _, _, r in heap]
    paint = np.empty_like(x)            # each rectangle's colour, lines not drawn yet
    inside = np.zeros((h, w), bool)      # True where a rectangle's colour shows (not a line)
    a, b = t // 2, t - t // 2            # line halves on each side of a cut
    for y0, x0, y1, x1 in rects:
        mean = x[y0:y1, x0:x1].reshape(-1, 3).mean(axis=0)
        paint[y0:y1, x0:x1] = purity * _palette_colour(mean) + (1.0 - purity) * mean
        iy0, ix0 = y0 + (b if y0 > 0 else a), x0 + (b if x0 > 0 else a)
        iy1, ix1 = y1 - (a if y1 < h else b), x1 - (a if x1 < w else b)
        if iy1 <= iy0 or ix1 <= ix0:      # tiny images: keep at least the colour
            iy0, ix0, iy1, ix1 = y0, x0, y1, x1
        inside[iy0:iy1, ix0:ix1] = True
    line = np.array(MONDRIAN_LINE_RGB, np.float32)
    return np.where(inside[:, :, None], paint, alpha * line + (1 - alpha) * paint)

