"""Square Attack, L2 variant, score-based, untargeted and targeted (IEEE-A8, IEEE-A9, IEEE-M6).

Andriushchenko, Croce, Flammarion and Hein, "Square Attack: a query-efficient black-box
adversarial attack via random search", ECCV 2020 (authors' code: ``max-andr/square-attack``,
``square_attack_l2``). The L-inf variant is ``square.py``; this module shares its size
schedule (:func:`~.square.p_selection` over ``max(n_iters, max_queries)`` iterations, the
reference's 10,000 by default; success 0.85 / 0.86 at 500 / 1000 queries on the Fashion-MNIST
CNN, L2 2.0, against 0.81 / 0.87 with the schedule squeezed into the budget).

The authors' algorithm: initialise with a grid of ``H // 5``-sided "bumps" (two
pseudo-Gaussian half-squares of opposite sign, random sign per channel) scaled to the L2
sphere of radius ``epsilon``; then per iteration pick two windows of side
``s = round(sqrt(p * H * W))`` (odd, at least 3), move the energy of window 2 into window 1
(a fresh pseudo-Gaussian pattern plus the normalised old content, rescaled to the budget left
plus both windows' current energy), rescale the whole perturbation to the sphere, clip to the
image range, keep the candidate if the loss improves. Defaults: ``p_init`` 0.1 (the paper's
L2 value). Targeted: the same attack given ``TargetedMisclassification``.

Deviations, all on purpose:

* **The loss is the criterion's margin** (``ctx.margin_query()``) for both variants (the
  authors use the margin untargeted and cross-entropy targeted): any task, top-k scores.
* **uint8**: each candidate is rounded to the uint8 image the target receives inside the ball
  (``score_run.round_into_l2``: nearest, then towards the original only where needed), and
  success and "improved" are judged on it. The perturbation the next iteration builds on is
  that uint8 image's (as the authors' ``x_best - x``).
* **Queries**: the clean image is the first query and is counted (the authors count from the
  initialisation); an image stops at its first success or at Q_m, never later.
* **Per image** window positions, patterns and signs (the authors draw one window position per
  iteration for the whole batch); one query call per iteration for the images still running.
* **Small or non-square images**: the bump side is ``max(1, min(H, W) // 5)`` over the rows
  and columns each fits; the window side is capped by ``min(H, W) - 1`` (the authors'
  ``randint(0, h - s)`` needs ``s < h``) and at least 1.

Registry entry: :data:`SPEC`. Domain code: no gRPC.
"""

from __future__ import annotations

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.params import Param

from .base import (
    MAX_QUERIES,
    STOP_ITERATIONS,
    AttackContext,
    AttackResult,
    AttackSpec,
    Criterion,
    MarginQuery,
)
from .score_run import ScoreRun, l2_levels, round_into_l2
from .square import N_ITERS, p_selection

#: The paper's L2 default (``--p 0.1`` for the L2 attack) and the minimum window side.
DEFAULTS = {"p_init": 0.1}
MIN_SIDE = 3


def _half(hh: int, ww: int) -> np.ndarray:
    """The authors' ``pseudo_gaussian_pert_rectangles``: nested rectangles around the centre
    weighted 1 / (k + 1)^2, unit L2 norm."""
    delta = np.zeros((hh, ww))
    ch, cw = hh // 2 + 1, ww // 2 + 1
    r, c = ch - 1, cw - 1
    for k in range(max(ch, cw)):
        delta[max(r, 0):min(r + 2 * k + 1, hh), max(c, 0):min(c + 2 * k + 1, ww)] += \
            1.0 / (k + 1) ** 2
        r -= 1
        c -= 1
    return delta / max(float(np.sqrt(np.sum(delta ** 2))), 1e-12)


def bump(s: int) -> np.ndarray:
    """The authors' ``meta_pseudo_gaussian_pert`` before its random transpose: top half
    positive, bottom half negative, unit L2 norm (``s x s``)."""
    delta = np.zeros((s, s))
    if s >= 2:
        delta[: s // 2] = _half(s // 2, s)
        delta[s // 2:] = -_half(s - s // 2, s)
    else:
        delta[:] = 1.0
    return delta / max(float(np.sqrt(np.sum(delta ** 2))), 1e-12)


def _patterns(rng: np.random.Generator, n: int, s: int, c: int) -> np.ndarray:
    """``n x s x s x c``: per image the bump, transposed with probability 1/2, times a random
    sign per channel."""
    b = bump(s)
    flip = rng.random(n) > 0.5
    pats = np.where(flip[:, None, None], b.T[None], b[None])
    signs = rng.choice(np.array([-1.0, 1.0]), size=(n, 1, 1, c))
    return pats[..., None] * signs


def _window(a: np.ndarray, rows: np.ndarray, cols: np.ndarray, s: int) -> tuple:
    """Fancy index of the ``s x s`` window at (rows[i], cols[i]) of each image of ``a``."""
    n = len(rows)
    ri = rows[:, None] + np.arange(s)[None, :]
    ci = cols[:, None] + np.arange(s)[None, :]
    return (np.arange(n)[:, None, None], ri[:, :, None], ci[:, None, :])


def _sphere(x: np.ndarray, delta: np.ndarray, eps_lv: float) -> np.ndarray:
    """``delta`` scaled to L2 norm ``eps_lv`` per image, then clipped to [0, 255] (levels)."""
    n = len(delta)
    norm = np.sqrt(np.sum(delta.reshape(n, -1) ** 2, axis=1))
    d = delta * (eps_lv / np.maximum(norm, 1e-12)).reshape(n, 1, 1, 1)
    xf = x.astype(np.float64)
    out = xf + d
    np.clip(out, 0.0, 255.0, out=out)
    out -= xf
    return out


def square_l2_attack(margin: MarginQuery, images: np.ndarray, labels: np.ndarray, *,
                     epsilon: float, max_queries: int, rng: np.random.Generator,
                     p_init: float = DEFAULTS["p_init"], n_iters: int = N_ITERS,
                     criterion: Criterion | None = None, spent: np.ndarray | None = None) -> list[AttackResult]:
    """The L2 Square Attack on a batch; one result per image, in order. ``margin``: the
    criterion's margins (< 0 = success; ``criterion`` is accepted for the common signature
    and not needed). ``epsilon``: L2 bound in [0, 1] scale (IEEE-A9)."""
    run = ScoreRun(margin, images, labels, max_queries, spent)
    eps_lv = l2_levels(epsilon)
    if not np.isfinite(p_init) or not 0.0 < p_init <= 1.0:
        raise InvalidArgument("p_init", f"must be in (0, 1], got {p_init!r}")
    if int(n_iters) < 1:
        raise InvalidArgument("n_iters", f"must be >= 1, got {n_iters!r}")
    horizon = max(int(n_iters), run.qb.limit)
    if run.n == 0:
        return []
    x = run.images
    n, h, w, c = x.shape
    run.begin()
    active = run.running()
    if eps_lv < 1.0:  # no uint8 change fits in the ball: do not spend queries
        run.finish(STOP_ITERATIONS)
        return run.results(STOP_ITERATIONS)
    # 1. initialisation: a grid of bumps, random sign per image and channel, on the sphere
    if len(active):
        s0 = max(1, min(h, w) // 5)
        init = np.zeros((len(active), h, w, c))
        top, left = (h - s0 * (h // s0)) // 2, (w - s0 * (w // s0)) // 2
        for r0 in range(top, top + s0 * (h // s0), s0):
            for c0 in range(left, left + s0 * (w // s0), s0):
                init[:, r0:r0 + s0, c0:c0 + s0, :] += _patterns(rng, len(active), s0, c)
        cand = round_into_l2(x[active], _sphere(x[active], init, eps_lv), eps_lv)
        m = run.ask(active, cand)
        if m is not None:  # accepted as the authors do, whatever its loss
            run.best[active] = cand
            run.best_margin[active] = m
    # 2. square updates
    side_cap = max(min(h, w) - 1, 1)
    it = 0
    while True:
        active = run.running()
        if not len(active):
            break
        k = len(active)
        p = p_selection(p_init, it, horizon)
        s = max(int(round(np.sqrt(p * h * w))), MIN_SIDE)
        if s % 2 == 0:
            s += 1
        s = min(s, side_cap)
        xa = x[active].astype(np.float64)
        delta = run.best[active].astype(np.float64) - xa
        r1, c1 = rng.integers(0, h - s + 1, size=k), rng.integers(0, w - s + 1, size=k)
        r2, c2 = rng.integers(0, h - s + 1, size=k), rng.integers(0, w - s + 1, size=k)
        w1, w2 = _window(delta, r1, c1, s), _window(delta, r2, c2, s)
        old1 = delta[w1]                                              # k x s x s x c
        old2 = delta[w2]
        sq_w1 = np.sum(old1 ** 2, axis=(1, 2))                        # k x c
        norm_w1 = np.sqrt(sq_w1)
        norm_img = np.sqrt(np.einsum("ij,ij->i", delta.reshape(k, -1),
                                     delta.reshape(k, -1)))           # k
        # energy of the union of both windows, per channel: both windows less their overlap
        # (window 2's pixels that lie in window 1), without a whole-image mask
        ar = np.arange(s)
        rows2, cols2 = r2[:, None] + ar, c2[:, None] + ar              # k x s
        in1_at_2 = (((rows2 >= r1[:, None]) & (rows2 < r1[:, None] + s))[:, :, None]
                    & ((cols2 >= c1[:, None]) & (cols2 < c1[:, None] + s))[:, None, :])
        overlap = np.sum((old2 * in1_at_2[..., None]) ** 2, axis=(1, 2))
        norm_union = np.sqrt(np.maximum(sq_w1 + np.sum(old2 ** 2, axis=(1, 2)) - overlap, 0.0))
        new = _patterns(rng, k, s, c) + old1 / (1e-10 + norm_w1[:, None, None, :])
        budget = np.sqrt(np.maximum(eps_lv ** 2 - norm_img ** 2, 0.0)[:, None] / c
                         + norm_union ** 2)                            # k x c
        new *= (budget / np.maximum(np.sqrt(np.sum(new ** 2, axis=(1, 2))), 1e-12)
                )[:, None, None, :]
        delta[w2] = 0.0
        delta[w1] = new
        # onto the sphere; round_into_l2 clips to the image range itself (as _sphere would)
        norm = np.sqrt(np.einsum("ij,ij->i", delta.reshape(k, -1), delta.reshape(k, -1)))
        delta *= (eps_lv / np.maximum(norm, 1e-12)).reshape(k, 1, 1, 1)
        cand = round_into_l2(x[active], delta, eps_lv)
        run.ask(active, cand)  # keeps each image's best (lowest-margin) candidate
        it += 1
    return run.results(STOP_ITERATIONS)


def run(ctx: AttackContext) -> list[AttackResult]:
    p = ctx.params
    return square_l2_attack(ctx.margin_query(), ctx.images, ctx.labels, epsilon=p["epsilon"],
                            max_queries=p["max_queries"], rng=ctx.rng(), p_init=p["p_init"],
                            n_iters=p["n_iters"], criterion=ctx.criterion, spent=ctx.spent())


SPEC = AttackSpec(
    id="square_l2", kind="score", family="score-based", norms=("l2",),
    refs=("IEEE-A8", "IEEE-A9", "IEEE-M6"), targeted=True,
    description="Square Attack, L2 variant (Andriushchenko et al., ECCV 2020): random "
                "square updates on the L2 sphere (score-based)",
    params=(Param(name="epsilon", type="float", minimum=0.0, maximum=1e4,
                  description="L2 bound in [0,1] pixel scale (IEEE-A9)"),
            MAX_QUERIES,
            Param(name="p_init", type="float", default=DEFAULTS["p_init"],
                  description="initial fraction of pixels a square covers (paper L2: 0.1; "
                              "> 0)", minimum=1e-6, maximum=1.0),
            Param(name="n_iters", type="int", default=N_ITERS,
                  description="iterations the square-size schedule is laid over (the "
                              "reference's 10,000); max_queries when that is larger",
                  minimum=1, maximum=10_000_000)),
    run=run)
