"""PER-1 weather properties (seed 004, Eq. 10 and II-B-5): ``per_fog`` (the shared
diamond-square map, ``corruptions/plasma.py``, with strength and decay following epsilon),
``per_snow`` (motion-blurred disk flakes) and ``per_frost`` (a dendritic procedural texture,
``dendritic_frost_texture``). Different algorithms from the ImageNet-C corruptions ``fog``,
``snow`` and ``frost`` (``corruptions``), hence the names. Every random pattern is drawn before
epsilon is looked at, the same draws at every epsilon (PER-3)."""

from __future__ import annotations

import math

import cv2
import numpy as np
from fortis.services.perturbation.corruptions.plasma import diamond_square, plasma_mapsize
from fortis.services.perturbation.properties.knobs import (
    Params,
    angle_param,
    centred_line_kernel,
    lerp,
)
from fortis.services.perturbation.properties.tables import (
    FOG_DECAY,
    FOG_MAX_STRENGTH,
    FROST_BRANCHES,
    FROST_CANVAS,
    FROST_DEPTH,
    FROST_HAZE_DECAY,
    FROST_IMAGE_WEIGHT,
    FROST_NEEDLE,
    FROST_SEEDS,
    FROST_TEXTURE_MAX,
    FROST_TINT,
    SNOW_ANGLE_DEG,
    SNOW_MAX_FLAKES,
    SNOW_RADIUS2_FRAC,
    SNOW_SIDE_FRAC,
    SNOW_STREAK_FRAC,
)
from fortis.services.perturbation.spec import hwc


def _plasma_draws(mapsize: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The uniform draws of one diamond-square map in [-1, 1], one (3, n, n) array per level
    (centres, then the two diamond sets), drawn before the map is built so that one set of
    draws gives a coherent map at every decay, i.e. at every epsilon."""
    out: list[np.ndarray] = []
    step = mapsize
    while step >= 2:
        n = mapsize // step
        out.append(rng.uniform(-1.0, 1.0, size=(3, n, n)))
        step //= 2
    return out


def _unit_plasma(mapsize: int, decay: float, draws: list[np.ndarray]) -> np.ndarray:
    """The diamond-square map (``diamond_square``: the perturbation at wibble w is
    w * w * draw, as the code's ``plasma_fractal``) of these draws, mapped to [0, 1]."""
    m = diamond_square(mapsize, decay, lambda level, n, wibble: draws[level] * (wibble * wibble))
    m -= m.min()
    top = m.max()
    return m / top if top > 0 else m


def per_fog(x: np.ndarray, eps: float, rng: np.random.Generator, p: Params) -> np.ndarray:
    h, w, _ = x.shape
    size = plasma_mapsize(h, w)
    draws = _plasma_draws(size, rng)
    strength = eps * FOG_MAX_STRENGTH
    plasma = _unit_plasma(size, lerp(FOG_DECAY, eps), draws)[:h, :w, None].astype(np.float32)
    max_val = float(x.max())
    return (x + strength * plasma) * max_val / (max_val + strength) if max_val + strength > 0 \
        else x.copy()


def _snow_flake(h: int, w: int, angle_deg: float) -> np.ndarray:
    """One motion-blurred flake (float, peak <= 1), as the code's snow.py builds it: a disk of
    squared radius 0.1 * min(H, W) on a square of side min(H, W) // 10, blurred by a line of
    0.9 * (side // 2) px; padded so the streak is not cut."""
    m = min(h, w)
    side = max(3, int(m * SNOW_SIDE_FRAC))
    radius = min(math.sqrt(SNOW_RADIUS2_FRAC * m), side / 2.0)
    kernel = centred_line_kernel(max(1.0, SNOW_STREAK_FRAC * (side // 2)), angle_deg)
    pad = kernel.shape[0] // 2
    n = side + 2 * pad
    yy, xx = np.mgrid[0:n, 0:n].astype(np.float32)
    c = (n - 1) / 2.0
    disk = ((yy - c) ** 2 + (xx - c) ** 2 <= radius ** 2).astype(np.float32)
    if kernel.shape == (1, 1):
        return disk
    return cv2.filter2D(disk, -1, kernel, borderType=cv2.BORDER_CONSTANT)


def per_snow(x: np.ndarray, eps: float, rng: np.random.Generator, p: Params) -> np.ndarray:
    h, w, _ = x.shape
    flake = _snow_flake(h, w, angle_param(p, SNOW_ANGLE_DEG))
    fh, fw = flake.shape
    ys = rng.integers(0, max(1, h - fh + 1), size=SNOW_MAX_FLAKES)
    xs = rng.integers(0, max(1, w - fw + 1), size=SNOW_MAX_FLAKES)
    n = int(math.ceil(eps * SNOW_MAX_FLAKES - 1e-9))
    layer = np.zeros((h, w), np.float32)
    for y, xx in zip(ys[:n], xs[:n], strict=True):
        y1, x1 = min(h, y + fh), min(w, xx + fw)
        layer[y:y1, xx:x1] += flake[:y1 - y, :x1 - xx]
    return x + layer[:, :, None]


def _dendrite_segments(h: int, w: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The ice crystals of a frost texture on an h x w canvas: segments (n, 2, 2) as (x, y)
    end points and their brightness (n,), generated level by level (vectorised).

    Level 0: FROST_SEEDS needles, positions pushed towards the borders (frost grows from the
    window frame), uniform angles, length U(FROST_NEEDLE) * canvas. Each needle of level k
    carries FROST_BRANCHES pairs of side branches at +-60 degrees (+- N(0, 8) degrees) at
    evenly spaced points t; a branch is U(0.6, 1) * 0.45 * (1 - t) of its parent's length.
    The number and order of draws depend only on the canvas size (never on epsilon)."""
    n = FROST_SEEDS
    v = rng.uniform(-1.0, 1.0, size=(n, 2))
    pos = 0.5 + 0.5 * np.sign(v) * np.abs(v) ** 0.6
    x0, y0 = pos[:, 0] * w, pos[:, 1] * h
    ang = rng.uniform(0.0, 2.0 * math.pi, n)
    ln = rng.uniform(FROST_NEEDLE[0], FROST_NEEDLE[1], n) * max(h, w)
    segs, levels = [], []
    for depth in range(FROST_DEPTH + 1):
        x1, y1 = x0 + ln * np.cos(ang), y0 + ln * np.sin(ang)
        segs.append(np.stack([np.stack([x0, y0], 1), np.stack([x1, y1], 1)], 1))
        levels.append(rng.uniform(0.35, 1.0, size=x0.size) * (0.8 ** depth))
        if depth == FROST_DEPTH:
            break
        t = (np.arange(FROST_BRANCHES) + 1.0) / (FROST_BRANCHES + 1.0)          # (B,)
        side = np.array([-1.0, 1.0])                                           # (2,)
        jitter = rng.normal(0.0, math.radians(8.0), size=(x0.size, FROST_BRANCHES, 2))
        shrink = rng.uniform(0.6, 1.0, size=(x0.size, FROST_BRANCHES, 2))
        bx = x0[:, None, None] + (t * ln[:, None])[:, :, None] * np.cos(ang)[:, None, None]
        by = y0[:, None, None] + (t * ln[:, None])[:, :, None] * np.sin(ang)[:, None, None]
        ang = (ang[:, None, None] + side * math.radians(60.0) + jitter).ravel()
        ln = (0.45 * (1.0 - t)[None, :, None] * ln[:, None, None] * shrink).ravel()
        x0 = np.broadcast_to(bx, shrink.shape).ravel()
        y0 = np.broadcast_to(by, shrink.shape).ravel()
    return np.concatenate(segs), np.concatenate(levels)


def dendritic_frost_texture(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """A procedural frost texture, HxWx3 float32 in [0, 1] (see FROST_* above)."""
    scale = FROST_CANVAS / max(h, w)
    ch, cw = max(1, round(h * scale)), max(1, round(w * scale))
    haze = _unit_plasma(FROST_CANVAS, FROST_HAZE_DECAY, _plasma_draws(FROST_CANVAS, rng))[:ch, :cw]
    segs, levels = _dendrite_segments(ch, cw, rng)
    noise = rng.random((ch, cw), dtype=np.float32)
    canvas = np.zeros((ch, cw), np.uint8)
    pts = np.rint(segs * 16.0).astype(np.int32)           # 4 fractional bits
    buckets = np.minimum((levels * 4).astype(int), 3)
    for b in range(4):                                      # dim crystals first
        sel = pts[buckets == b]
        if len(sel):
            cv2.polylines(canvas, list(sel), False, 255.0 * (b + 1) / 4, 1, cv2.LINE_AA, 4)
    crystals = canvas.astype(np.float32) / 255.0
    glow = cv2.GaussianBlur(crystals, (0, 0), 2.0)
    grain = cv2.GaussianBlur(noise, (3, 3), 0.7)
    yy, xx = np.mgrid[0:ch, 0:cw].astype(np.float32)
    r2 = ((yy - (ch - 1) / 2) / max(ch / 2, 1)) ** 2 + ((xx - (cw - 1) / 2) / max(cw / 2, 1)) ** 2
    edge = 0.65 + 0.45 * np.clip(r2, 0.0, 1.5)
    frost = np.clip(edge * (0.55 * haze.astype(np.float32) + 0.7 * crystals + 1.2 * glow)
                    + 0.15 * grain - 0.05, 0.0, 1.0)
    interp = cv2.INTER_AREA if (ch > h or cw > w) else cv2.INTER_LINEAR
    frost = cv2.resize(frost, (w, h), interpolation=interp).reshape(h, w, 1)
    return np.clip(frost * np.array(FROST_TINT, np.float32), 0.0, 1.0)


def per_frost(x: np.ndarray, eps: float, rng: np.random.Generator, p: Params) -> np.ndarray:
    h, w, c = x.shape
    tex = dendritic_frost_texture(h, w, rng)
    if c == 1:
        tex = hwc(cv2.cvtColor(tex, cv2.COLOR_RGB2GRAY), 1)
    return lerp(FROST_IMAGE_WEIGHT, eps) * x + eps * FROST_TEXTURE_MAX * tex
