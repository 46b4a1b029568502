"""ZOO, score-based, L2, untargeted and targeted (IEEE-A8, IEEE-A9, IEEE-M6; Chen, Zhang,
Sharma, Yi & Hsieh, "ZOO: Zeroth Order Optimization Based Black-box Attacks to Deep Neural
Networks without Training Substitute Models", AISec 2017).

ZOO-ADAM (the paper's Algorithm 2), per image: minimise the C&W objective ``||delta||_2^2 + c
* max(f(x + delta), -kappa)`` over ``delta`` one coordinate batch at a time. Each iteration
picks ``batch`` coordinates (``nb_parallel``: the authors' 128) of the attack space, asks the
``2 * batch`` points ``x + delta +- h e_j``, estimates each coordinate's derivative
``(F(+h) - F(-h)) / 2h`` of the objective and takes a coordinate-wise ADAM step (lr 0.01,
beta1 0.9, beta2 0.999, eps 1e-8; each coordinate keeps its own ADAM moments and step
count). ``f`` is the criterion's margin (``ctx.margin_query()``, < 0 = success): the paper's
``max_{i!=t} log F(x)_i - log F(x)_t`` in its black-box form on log-probabilities;
untargeted or, with a ``TargetedMisclassification`` criterion, targeted.

**Large images** (the paper, section 3.5-3.6): *attack-space dimension reduction*:
``delta = up(y)`` with ``y`` on a ``reduced x reduced`` grid (default 32; only when the image
is larger), *hierarchical attack*: the grid doubles (``y`` upsampled onto it) after
``hierarchy_iterations`` iterations each (the paper: 2000 and 10000 on ImageNet), and
*importance sampling*: once the attack works on a reduced grid, coordinates are drawn with
probability proportional to the absolute change of ``delta`` max-pooled over 8 x 8 regions
of the grid (plus a uniform floor so every coordinate keeps a chance).

Defaults (:data:`PAPER`): batch 128, lr 0.01, ``c`` = 10 (one binary-search step: the bound
is fixed by the plan, IEEE-A9, so the search over ``c`` for the smallest distortion is not
run), ``kappa`` = 0, reduced 32, hierarchy at 2000 / 10000 iterations.

Deviations, on purpose:

* The bound (IEEE-A9): ZOO is unbounded; here ``delta`` is projected onto the plan's L2 ball
  after every step and every point asked lies within it (projected, rounded towards ``x``),
  so every answer is a success check: an image stops at the call where one of its points
  has margin < 0 (the first success), and its returned adversarial is that point.
* ``h``: the paper's 1e-4 is far below a uint8 level: probes move a coordinate by ``h``
  = 1 level (``h_levels``), and the derivative divides by the change *actually sent* (after
  rounding, projection and clipping), 0 when neither probe moved.
* ``up`` is nearest-neighbour (the paper: bilinear), so a coordinate probe moves whole
  pixels by whole levels instead of being rounded away.
* The clean image is the first query (counted); an iteration asks ``2 * b`` points with ``b``
  the coordinates that fit in the remaining budget (Q_m is a hard cap).
* ``c`` = 10 because ``f`` is the criterion's margin on the scores the target returns
  (probabilities: in [-1, 1]) while the squared distance is in [0, 1] pixel scale.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from fortis.services.common.params import Param

from ._zo import (
    EPSILON_L2,
    ZoSearch,
    check_count,
    check_positive,
    chunks,
    nearest_upsample_index,
)
from .base import (
    MAX_QUERIES,
    AttackContext,
    AttackResult,
    AttackSpec,
    MarginQuery,
)

#: The authors' defaults (``l2_attack_black.py``; c: see the module docstring).
PAPER: dict[str, Any] = {"batch": 128, "learning_rate": 0.01, "const": 10.0, "confidence": 0.0,
                         "reduced": 32, "hierarchy_iterations": (2000, 10000),
                         "adam": (0.9, 0.999, 1e-8)}
IMPORTANCE_POOL = 8        # max-pool size of the importance map (the authors' 8 x 8)
IMPORTANCE_FLOOR = 0.01    # uniform share of the sampling probability
MAX_ITERATIONS = 1_000_000  # loop cap (Q_m ends it first: every iteration asks >= 2 points)


class _Space:
    """The attack space of one image shape: an ``rh x rw x C`` grid upsampled to ``H x W x C``
    by nearest neighbour (identity when ``rh, rw == H, W``)."""

    def __init__(self, shape: tuple[int, int, int], rh: int, rw: int) -> None:
        self.shape, self.rh, self.rw = shape, rh, rw
        h, w, c = shape
        self.rows, self.cols = nearest_upsample_index(rh, h), nearest_upsample_index(rw, w)
        self.dim = rh * rw * c
        self.full = rh == h and rw == w

    def up(self, y: np.ndarray) -> np.ndarray:
        """rows x rh x rw x C -> rows x H x W x C."""
        return y if self.full else y[:, self.rows][:, :, self.cols]

    def footprint(self, coords: np.ndarray) -> np.ndarray:
        """How many image values one grid coordinate moves (per coordinate index)."""
        c = self.shape[2]
        r, rest = np.divmod(coords, self.rw * c)
        col = rest // c
        return (np.bincount(self.rows, minlength=self.rh)[r]
                * np.bincount(self.cols, minlength=self.rw)[col])


def _grow(y: np.ndarray, old: _Space, new: _Space) -> np.ndarray:
    """``y`` on ``old``'s grid resampled (nearest) onto ``new``'s grid."""
    ri = nearest_upsample_index(old.rh, new.rh)
    ci = nearest_upsample_index(old.rw, new.rw)
    return y[:, ri][:, :, ci]


def zoo_attack(margin: MarginQuery, images: np.ndarray, labels: np.ndarray, *,
               epsilon: float, max_queries: int, rng: np.random.Generator,
               batch: int = 128, learning_rate: float = 0.01, const: float = 10.0,
               confidence: float = 0.0, h_levels: float = 1.0, reduced: int = 32,
               hierarchy_iterations: tuple[int, ...] = (2000, 10000),
               importance: bool = True,
               spent: np.ndarray | None = None) -> list[AttackResult]:
    """ZOO-ADAM within an L2 ball ``||(adv - x) / 255||_2 <= epsilon``; one
    :class:`AttackResult` per image, in order. ``margin``: the criterion's margin, < 0 =
    success. ``learning_rate`` in [0, 1] pixel scale; ``h_levels`` the probe in uint8
    levels; ``reduced`` the attack-space side for images larger than it (0 = none)."""
    zs = ZoSearch(margin, images, labels, norm="l2", epsilon=epsilon,
                  max_queries=max_queries, spent=spent)
    b = check_count(batch, "batch")
    lr = check_positive(learning_rate, "learning_rate") * 255.0
    c = check_positive(const, "const")
    kappa = check_positive(confidence, "confidence", allow_zero=True)
    h = check_positive(h_levels, "h_levels")
    red = check_count(reduced, "reduced", 0)
    if zs.n == 0:
        return []
    hh, ww, ch = zs.shape
    levels = [(hh, ww)]
    if red and max(hh, ww) > red:
        levels = []
        s = red
        while s < max(hh, ww):
            levels.append((min(hh, math.ceil(hh * s / max(hh, ww))),
                           min(ww, math.ceil(ww * s / max(hh, ww)))))
            s *= 2
        levels.append((hh, ww))
        levels = levels[:len(hierarchy_iterations) + 1]
    space = _Space(zs.shape, *levels[0])
    beta1, beta2, adam_eps = PAPER["adam"]
    zs.start()
    y = np.zeros((zs.n, space.dim), dtype=np.float32)       # the attack variable (levels)
    mom = np.zeros_like(y)
    vel = np.zeros_like(y)
    steps = np.zeros(y.shape, dtype=np.int64)
    level = 0
    for it in range(MAX_ITERATIONS):
        if level + 1 < len(levels) and it >= hierarchy_iterations[level]:
            new = _Space(zs.shape, *levels[level + 1])
            y = _grow(y.reshape(zs.n, space.rh, space.rw, ch), space, new).reshape(zs.n, -1)
            mom, vel = np.zeros_like(y), np.zeros_like(y)
            steps = np.zeros(y.shape, dtype=np.int64)
            space, level = new, level + 1
        active = zs.running()
        if not len(active):
            break
        for idx in chunks(active, 2 * min(b, space.dim), zs.d):
            _iteration(zs, idx, space, y, mom, vel, steps, rng=rng, b=b, lr=lr, c=c,
                       kappa=kappa, h=h, beta1=beta1, beta2=beta2, adam_eps=adam_eps,
                       importance=importance and not space.full)
    zs.finish(zs.running())
    return zs.results()


def _importance(space: _Space, y: np.ndarray) -> np.ndarray:
    """Sampling probabilities over grid coordinates (rows x dim): the absolute change
    max-pooled over ``IMPORTANCE_POOL`` regions, normalised, plus a uniform floor."""
    k = len(y)
    a = np.abs(y).reshape(k, space.rh, space.rw, -1)
    p = IMPORTANCE_POOL
    ph, pw = math.ceil(space.rh / p), math.ceil(space.rw / p)
    pad = np.zeros((k, ph * p, pw * p, a.shape[3]), dtype=np.float32)
    pad[:, :space.rh, :space.rw] = a
    pooled = pad.reshape(k, ph, p, pw, p, -1).max(axis=(2, 4))
    back = np.repeat(np.repeat(pooled, p, axis=1), p, axis=2)[:, :space.rh, :space.rw]
    w = back.reshape(k, -1).astype(np.float64)
    tot = w.sum(axis=1, keepdims=True)
    w = np.where(tot > 0, w / np.where(tot > 0, tot, 1.0), 1.0 / space.dim)
    return (1.0 - IMPORTANCE_FLOOR) * w + IMPORTANCE_FLOOR / space.dim


def _iteration(zs: ZoSearch, idx: np.ndarray, space: _Space, y: np.ndarray, mom: np.ndarray,
               vel: np.ndarray, steps: np.ndarray, *, rng: np.random.Generator, b: int,
               lr: float, c: float, kappa: float, h: float, beta1: float, beta2: float,
               adam_eps: float, importance: bool) -> None:
    k = len(idx)
    nb = np.minimum(min(b, space.dim), zs.remaining(idx) // 2)   # coordinates that fit
    live = nb > 0
    zs.finish(idx[~live])                                        # < 2 queries left
    idx, nb = idx[live], nb[live]
    k = len(idx)
    if not k:
        return
    bmax = int(nb.max())
    if importance:
        prob = _importance(space, y[idx])
        coords = np.stack([rng.choice(space.dim, size=bmax, replace=False, p=prob[j])
                           for j in range(k)])
    else:
        coords = np.argsort(rng.random((k, space.dim)), axis=1)[:, :bmax]
    valid = np.arange(bmax)[None, :] < nb[:, None]
    base = y[idx]                                                 # k x dim
    pert = np.zeros((2, k, bmax, space.dim), dtype=np.float32)
    rows = np.arange(k)[:, None]
    pert[0][rows, np.arange(bmax)[None, :], coords] = h
    pert[1][rows, np.arange(bmax)[None, :], coords] = -h
    cand = base[None, :, None, :] + pert                          # 2 x k x bmax x dim
    imgs = space.up(cand.reshape(-1, space.rh, space.rw, zs.shape[2]))
    imgs = imgs.reshape((2, k, bmax) + zs.shape) + zs.x[idx][None, :, None]
    sel = np.broadcast_to(valid[None], (2, k, bmax))
    owners = np.broadcast_to(idx[None, :, None], (2, k, bmax))[sel]
    sent = zs.feasible(imgs[sel], owners)
    m = zs.ask(sent, owners)
    if m is None:
        return
    mm = np.zeros((2, k, bmax))
    mm[sel] = m
    # objective on what was sent: ||delta||^2 ([0,1] scale) + c * max(f, -kappa)
    delta = np.zeros((2, k, bmax) + zs.shape, dtype=np.float32)
    delta[sel] = sent.astype(np.float32) - zs.x[owners]
    sq = (delta.reshape(2, k, bmax, -1) / 255.0) ** 2
    obj = sq.sum(axis=3) + c * np.maximum(mm, -kappa)
    # the change actually sent along the coordinate: mean over the pixels it moves
    foot = space.footprint(coords)                                # k x bmax
    if space.full:
        moved = delta.reshape(2, k, bmax, -1)[:, rows, np.arange(bmax)[None, :], coords]
    else:
        up_mask = space.up(np.eye(space.dim, dtype=np.float32)[coords.reshape(-1)]
                           .reshape(-1, space.rh, space.rw, zs.shape[2]))
        up_mask = up_mask.reshape(k, bmax, -1)
        moved = np.einsum("skbd,kbd->skb", delta.reshape(2, k, bmax, -1), up_mask) / foot
    diff = moved[0] - moved[1]
    ok = valid & (np.abs(diff) > 1e-6)
    g = np.where(ok, (obj[0] - obj[1]) / np.where(ok, diff, 1.0), 0.0).astype(np.float32)
    done = np.array([zs.done(int(i)) for i in idx], dtype=bool)
    ok &= ~done[:, None]
    r, j = np.nonzero(ok)
    if not len(r):
        return
    ii, cc, gg = idx[r], coords[r, j], g[r, j]
    mom[ii, cc] = beta1 * mom[ii, cc] + (1 - beta1) * gg
    vel[ii, cc] = beta2 * vel[ii, cc] + (1 - beta2) * gg * gg
    steps[ii, cc] += 1
    t = steps[ii, cc]
    mhat = mom[ii, cc] / (1 - beta1 ** t)
    vhat = vel[ii, cc] / (1 - beta2 ** t)
    y[ii, cc] -= (lr * mhat / (np.sqrt(vhat) + adam_eps)).astype(np.float32)
    # project the image perturbation onto the ball and the box, back onto the grid
    moved_rows = np.unique(ii)
    img = space.up(y[moved_rows].reshape(-1, space.rh, space.rw, zs.shape[2])) + zs.x[moved_rows]
    proj = zs.project(img, moved_rows) - zs.x[moved_rows]
    if space.full:
        y[moved_rows] = proj.reshape(len(moved_rows), -1)
    else:
        # the grid value: the mean of the (equal, before the box clip) pixels it drives
        ch = zs.shape[2]
        acc = np.zeros((space.rh, space.rw, len(moved_rows), ch), dtype=np.float32)
        np.add.at(acc, (space.rows[:, None], space.cols[None, :]), proj.transpose(1, 2, 0, 3))
        cnt = np.zeros((space.rh, space.rw), dtype=np.float32)
        np.add.at(cnt, (space.rows[:, None], space.cols[None, :]), 1.0)
        y[moved_rows] = (acc / cnt[:, :, None, None]).transpose(2, 0, 1, 3).reshape(
            len(moved_rows), -1)


def run(ctx: AttackContext) -> list[AttackResult]:
    p = ctx.params
    return zoo_attack(ctx.margin_query(), ctx.images, ctx.labels, epsilon=p["epsilon"],
                      max_queries=p["max_queries"], rng=ctx.rng(), batch=p["batch"],
                      learning_rate=p["learning_rate"], const=p["const"],
                      reduced=p["reduced"], importance=p["importance"], spent=ctx.spent())


SPEC = AttackSpec(
    id="zoo", kind="score", family="score-based", norms=("l2",),
    refs=("IEEE-A8", "IEEE-A9", "IEEE-M6"),
    description="ZOO-ADAM (Chen et al., AISec 2017): coordinate-wise finite differences and "
                "ADAM on the C&W objective, attack-space reduction, hierarchy and importance "
                "sampling for large images, within an L2 bound; untargeted or targeted",
    params=(EPSILON_L2, MAX_QUERIES,
            Param(name="batch", type="int", default=PAPER["batch"], minimum=1, maximum=100_000,
                  description="coordinates per iteration (2 queries each)"),
            Param(name="learning_rate", type="float", default=PAPER["learning_rate"],
                  minimum=1e-6, maximum=10.0, description="ADAM step, [0,1] pixel scale"),
            Param(name="const", type="float", default=PAPER["const"], minimum=1e-6,
                  maximum=1e6, description="c: weight of the margin against ||delta||^2"),
            Param(name="reduced", type="int", default=PAPER["reduced"], minimum=0,
                  maximum=4096, description="attack-space side for larger images (0: none)"),
            Param(name="importance", type="bool", default=True,
                  description="importance sampling of coordinates on a reduced space")),
    targeted=True, run=run)
