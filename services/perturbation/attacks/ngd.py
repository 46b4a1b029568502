"""ZO-NGD, score-based, L-inf (and L2), untargeted and targeted (IEEE-A8, IEEE-A9, IEEE-M6;
Zhao, Chen, Wang, Lin et al., "Towards Query-Efficient Black-Box Adversary with Zeroth-Order
Natural Gradient Descent", AAAI 2020; IEEE 3129's [B32]).

Per iteration and image: the loss at the iterate is known (asked once), ``q`` random unit
directions ``u_i`` are probed, each giving a zeroth-order gradient sample ``g_i = D
(f(x + mu u_i) - f(x)) / mu * u_i`` (``D`` the dimension); the gradient estimate is ``g =
mean g_i`` and the Fisher information matrix is approximated from the *same* samples (no
extra query, as the paper), ``F = mean g_i g_i^T + gamma I``; the natural-gradient direction
``F^{-1} g`` is computed in ``O(q^2 D)`` by the Woodbury identity
(``F^{-1} v = (v - G^T (q gamma I + G G^T)^{-1} G v) / gamma``, ``G`` the ``q x D`` samples),
then a projected step ``x - lr * sign(F^{-1} g)`` (L-inf) or ``x - lr * F^{-1} g /
||F^{-1} g||`` (L2) onto the ball and ``[0, 1]``; the new iterate is asked (the next
iteration's ``f(x)`` and a success check).

The loss ``f`` is the criterion's margin (``ctx.margin_query()``, < 0 = success,
minimised); untargeted or, with a ``TargetedMisclassification`` criterion, targeted.

Defaults (:data:`DEFAULTS`): q = 20 samples, gamma = 1.0 (relative, see below), lr 0.01
(L-inf per pixel) / 2.0 (L2, as RGF here), ``mu`` one uint8 level per pixel.

Deviations, on purpose:

* Fisher information: the paper builds ``F`` from the zeroth-order gradients of the model's
  *log-likelihood* (it reads the class probabilities); here it is the empirical Fisher of
  the criterion's margin (the same samples ``g_i``), since attacks read only the margin
  (``ctx.margin_query()``: any task, top-k scores). The damping is relative to the samples'
  scale: ``gamma = gamma_rel * mean ||g_i||^2 / D`` (the paper's absolute gamma depends on
  the loss's units). Its default 1.0 was measured on the unit tests' tiny CNN (16 x 16,
  L-inf 0.15, 1000 queries, 6 images): 0.01 gave 0/6 successes (the inverse then amplifies
  the directions the few samples barely saw), 1.0 and 100 gave 2/6 (RGF there: 3/6).
* The step is normalised (sign for L-inf, unit L2 norm) so ``lr`` is in pixel units; the
  paper's raw ``eta F^{-1} g`` scales with the loss.
* ``mu``: the paper's probe radius is below a uint8 level on [0, 1] images; probes move
  about one level per pixel and the derivative uses the probe *actually sent* (after
  rounding and projection), as RGF here (``rgf.py``).
* Every query within the bound (a success check), the clean image is the first query and
  the first ``f(x)``; Q_m is a hard cap (an iteration probes what fits).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from fortis.services.common.params import Param

from ._zo import (
    EPSILON_L2,
    ZoNorm,
    ZoSearch,
    check_count,
    check_positive,
    chunks,
    expand,
    l2_norms,
)
from .base import (
    EPSILON_LINF,
    MAX_QUERIES,
    AttackContext,
    AttackResult,
    AttackSpec,
    MarginQuery,
)
from .rgf import MIN_PROBE_LEVELS, _derivs, _probe, _unit

DEFAULTS: dict[str, Any] = {"samples": 20, "gamma": 1.0,
                            "learning_rate": {"linf": 0.01, "l2": 2.0}}
MAX_ITERATIONS = 1_000_000  # loop cap (Q_m ends it first: every iteration asks >= 1 query)


def natural_direction(samples: np.ndarray, g: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """``F^{-1} g`` per image with ``F = G^T G / q + gamma I`` (Woodbury). ``samples``: k x q x
    D gradient samples (rows of zeros are ignored through their count ``q`` = nonzero rows),
    ``g``: k x D, ``gamma``: k (> 0).

    All k images at once: one stacked ``k x q x q`` system. A zero row of ``G`` adds a
    decoupled diagonal entry ``n gamma`` with right-hand side 0 to its image's system, so its
    component of the solution is 0 and ``G^T`` of the solution is what the system of the
    nonzero rows alone gives; the pivots partial pivoting picks are the same."""
    k, q, d = samples.shape
    gs = samples if samples.dtype == np.float64 else samples.astype(np.float64)
    v = g if g.dtype == np.float64 else g.astype(np.float64)
    gamma = np.asarray(gamma, dtype=np.float64)
    nz = np.any(gs != 0, axis=2)                                    # k x q
    n = nz.sum(axis=1)
    out = v / gamma[:, None]
    has = np.flatnonzero(n > 0)
    if not len(has):
        return out
    gh = gs[has]
    small = np.matmul(gh, np.swapaxes(gh, 1, 2))                   # k' x q x q
    small[:, np.arange(q), np.arange(q)] += (n[has] * gamma[has])[:, None]
    rhs = np.matmul(gh, v[has][:, :, None])                         # k' x q x 1
    sol = np.linalg.solve(small, rhs)
    out[has] = (v[has] - np.matmul(np.swapaxes(gh, 1, 2), sol)[:, :, 0]) / gamma[has][:, None]
    return out


def ngd_attack(margin: MarginQuery, images: np.ndarray, labels: np.ndarray, *,
               epsilon: float, max_queries: int, rng: np.random.Generator,
               norm: ZoNorm = "linf", samples: int = 20, gamma: float = 1.0,
               learning_rate: float | None = None,
               spent: np.ndarray | None = None) -> list[AttackResult]:
    """ZO-NGD on a batch; one :class:`AttackResult` per image, in order. ``margin``: the
    criterion's margin, < 0 = success. ``learning_rate`` in [0, 1] pixel scale (per pixel
    for L-inf, the step's L2 norm for L2); ``gamma`` relative damping."""
    zs = ZoSearch(margin, images, labels, norm=norm, epsilon=epsilon,
                  max_queries=max_queries, spent=spent)
    q = check_count(samples, "samples")
    gam = check_positive(gamma, "gamma")
    lr = check_positive(DEFAULTS["learning_rate"][norm] if learning_rate is None
                        else learning_rate, "learning_rate") * 255.0
    if zs.n == 0:
        return []
    sig = MIN_PROBE_LEVELS * math.sqrt(zs.d)
    m0 = zs.start()
    adv = zs.x.copy()
    f_base = np.where(np.isnan(m0), np.inf, m0)
    base = zs.images.copy()
    for _ in range(MAX_ITERATIONS):
        active = zs.running()
        if not len(active):
            break
        for idx in chunks(active, q + 1, zs.d):
            _iteration(zs, idx, adv, f_base, base, rng=rng, q=q, gam=gam, sig=sig, lr=lr)
    zs.finish(zs.running())
    return zs.results()


def _iteration(zs: ZoSearch, idx: np.ndarray, adv: np.ndarray, f_base: np.ndarray,
               base: np.ndarray, *, rng: np.random.Generator, q: int, gam: float, sig: float,
               lr: float) -> None:
    k, shape, d = len(idx), zs.shape, zs.d
    need = np.minimum(q, zs.remaining(idx))
    u = _unit(rng.standard_normal((k * q,) + shape, dtype=np.float32)).reshape((k, q) + shape)
    got = _probe(zs, idx, base, adv, u, sig, need)
    if got is None:
        return
    mm, steps, valid = got
    der, unit = _derivs(mm, steps, valid, f_base[idx])
    samples = (d * der)[..., None] * unit.reshape(k, q, d)          # k x q x D
    cnt = np.maximum(valid.sum(axis=1), 1)
    g = samples.sum(axis=1) / cnt[:, None]
    scale = (samples ** 2).sum(axis=(1, 2)) / cnt / d   # samples: float64 already
    gamma = np.maximum(gam * scale, 1e-12)
    live = np.array([not zs.done(int(i)) for i in idx], dtype=bool) & (np.abs(g).sum(axis=1) > 0)
    if not live.any():
        return
    direction = natural_direction(samples[live], g[live], gamma[live]).astype(np.float32)
    direction = direction.reshape((-1,) + shape)
    sel = idx[live]
    if zs.norm == "linf":
        new = adv[sel] - lr * np.sign(direction)
    else:
        new = adv[sel] - lr * direction / expand(np.maximum(l2_norms(direction), 1e-12),
                                                 direction.ndim).astype(np.float32)
    adv[sel] = zs.project(new.astype(np.float32), sel)
    sel = sel[zs.remaining(sel) >= 1]
    if not len(sel):
        return
    sent = zs.feasible(adv[sel], sel)
    m = zs.ask(sent, sel)
    if m is not None:
        f_base[sel] = m
        base[sel] = sent


def _run(norm: ZoNorm):
    def run(ctx: AttackContext) -> list[AttackResult]:
        p = ctx.params
        return ngd_attack(ctx.margin_query(), ctx.images, ctx.labels, epsilon=p["epsilon"],
                          max_queries=p["max_queries"], rng=ctx.rng(), norm=norm,
                          samples=p["samples"], gamma=p["gamma"],
                          learning_rate=p["learning_rate"], spent=ctx.spent())
    return run


def _params(norm: ZoNorm) -> tuple[Param, ...]:
    return (
        EPSILON_LINF if norm == "linf" else EPSILON_L2, MAX_QUERIES,
        Param(name="samples", type="int", default=DEFAULTS["samples"], minimum=1,
              maximum=10_000, description="q: random directions per estimate (and Fisher)"),
        Param(name="gamma", type="float", default=DEFAULTS["gamma"], minimum=1e-8,
              maximum=1e6, description="Fisher damping, relative to the samples' scale"),
        Param(name="learning_rate", type="float", default=DEFAULTS["learning_rate"][norm],
              minimum=1e-6, maximum=1e4,
              description="step: per pixel (L-inf sign step) or its L2 norm (L2), [0,1] scale"),
    )


_REFS = ("IEEE-A8", "IEEE-A9", "IEEE-M6")

SPEC = AttackSpec(
    id="ngd", kind="score", family="score-based", norms=("linf",), refs=_REFS,
    description="ZO-NGD (Zhao et al., AAAI 2020): zeroth-order natural gradient descent, the "
                "Fisher information approximated from the same queries (Woodbury), L-inf; "
                "untargeted or targeted",
    params=_params("linf"), targeted=True, run=_run("linf"))

SPEC_L2 = AttackSpec(
    id="ngd_l2", kind="score", family="score-based", norms=("l2",), refs=_REFS,
    description="ZO-NGD (Zhao et al., AAAI 2020), L2 steps; untargeted or targeted",
    params=_params("l2"), targeted=True, run=_run("l2"))
