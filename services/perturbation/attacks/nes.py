"""NES, score-based, L-inf (and L2), untargeted and targeted (IEEE-A8, IEEE-A9, IEEE-M6; Ilyas,
Engstrom, Athalye & Lin, "Black-box Adversarial Attacks with Limited Queries and
Information", ICML 2018: the query-limited setting).

Natural-evolution-strategies gradient estimate with antithetic Gaussian sampling (the
authors' ``limited-blackbox-attacks``: ``samples_per_draw`` = 50 images per estimate, i.e. 25
pairs ``x +- sigma * u``, ``u ~ N(0, I)``), ``g = sum_j (f(x + sigma u_j) - f(x - sigma u_j))
u_j / (2 P sigma)``; momentum 0.9 on ``g``; projected sign steps (L-inf: ``x - lr *
sign(g)``, then clip to the ball and ``[0, 1]``) with the reference's plateau annealing of the
learning rate (halved, down to ``min_lr``, when the last 5 estimates' mean loss did not
decrease). L2 (the authors define L-inf; the L2 variant is the NES baseline of Ilyas, Engstrom
& Madry, ICLR 2019): ``x - lr * g / ||g||_2`` projected onto the L2 ball. Loss ``f``: the
criterion's margin (``ctx.margin_query()``, minimised; < 0 = success), untargeted or, with a
``TargetedMisclassification`` criterion, targeted; the authors use the cross-entropy of the
target class.

Defaults (:data:`PAPER`): samples 50, momentum 0.9, plateau 5 / drop 2, min_lr 5e-5, lr 0.01
(L-inf), 0.3 (L2, the ICLR 2019 NES-L2 config). Deviations, on purpose:

* ``sigma``: the paper's 0.001 is a quarter of a uint8 level, so every probe would round back
  to the iterate: the default is 1.5/255 (probes of about 1-2 levels), and the estimate uses
  the probes *actually sent* (``(q+ - q-) / 2`` after rounding and projection) as the
  directions, not the Gaussian draws.
* Every query is within the bound (IEEE-A9): probes are projected onto the ball and
  ``[0, 255]`` and rounded to uint8 (the reference probes outside its ball). They double as
  the success check: the image stops at the first call where a probe's margin is < 0 (the
  reference spends one more query per iteration on the iterate itself; here it is not asked).
* The clean image is the first query and is counted; Q_m is a hard cap: when fewer than
  ``samples`` queries are left, the last estimate uses the pairs that fit (a last odd query
  is a single probe).
* The iterate is kept in float levels; what is sent and returned is uint8.
"""

from __future__ import annotations

import numpy as np
from fortis.services.common.errors import InvalidArgument
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

#: The authors' defaults (``main.py``; L2 from Ilyas et al. 2019's ``nes-l2.json``).
PAPER = {"samples": 50, "sigma": 1e-3, "momentum": 0.9, "plateau_length": 5,
         "plateau_drop": 2.0, "min_lr": 5e-5, "learning_rate": {"linf": 1e-2, "l2": 0.3}}
SIGMA = 1.5 / 255  # default probe scale (deviation: the paper's 1e-3 is below one uint8 level)


def nes_attack(margin: MarginQuery, images: np.ndarray, labels: np.ndarray, *,
               epsilon: float, max_queries: int, rng: np.random.Generator,
               norm: ZoNorm = "linf", samples: int = 50, sigma: float = SIGMA,
               learning_rate: float | None = None, momentum: float = 0.9,
               plateau_length: int = 5, plateau_drop: float = 2.0, min_lr: float = 5e-5,
               spent: np.ndarray | None = None) -> list[AttackResult]:
    """NES (antithetic Gaussian estimate + projected sign / L2 steps) on a batch; one
    :class:`AttackResult` per image, in order. ``margin``: the criterion's margin, < 0 =
    success. ``sigma`` and ``learning_rate`` are in [0, 1] pixel scale (L2: the step's
    L2 norm)."""
    zs = ZoSearch(margin, images, labels, norm=norm, epsilon=epsilon,
                  max_queries=max_queries, spent=spent)
    pairs = max(1, check_count(samples, "samples", 2) // 2)
    sig = check_positive(sigma, "sigma") * 255.0
    lr0 = PAPER["learning_rate"][norm] if learning_rate is None else learning_rate  # type: ignore[index]
    lr0 = check_positive(lr0, "learning_rate") * 255.0
    if not 0.0 <= momentum < 1.0:
        raise InvalidArgument("momentum", f"must be in [0, 1), got {momentum!r}")
    plateau = check_count(plateau_length, "plateau_length")
    drop = check_positive(plateau_drop, "plateau_drop")
    lr_min = check_positive(min_lr, "min_lr") * 255.0
    if zs.n == 0:
        return []
    zs.start()
    adv = zs.x.copy()                                      # float iterates (levels)
    grad = np.zeros_like(adv)
    lr = np.full(zs.n, lr0)
    history: list[list[float]] = [[] for _ in range(zs.n)]

    while True:
        active = zs.running()
        if not len(active):
            break
        for idx in chunks(active, 2 * pairs, zs.d):
            _step(zs, idx, adv, grad, lr, history, rng=rng, pairs=pairs, sig=sig,
                  momentum=momentum, plateau=plateau, drop=drop, lr_min=lr_min)
    return zs.results()


def _step(zs: ZoSearch, idx: np.ndarray, adv: np.ndarray, grad: np.ndarray, lr: np.ndarray,
          history: list[list[float]], *, rng: np.random.Generator, pairs: int, sig: float,
          momentum: float, plateau: int, drop: float, lr_min: float) -> None:
    """One NES iteration for images ``idx``: estimate, momentum, annealing, projected step."""
    k = len(idx)
    room = zs.remaining(idx)
    npairs = np.minimum(pairs, room // 2)                 # pairs that fit in Q_m
    u = rng.standard_normal((k, pairs) + zs.shape, dtype=np.float32)
    valid = np.arange(pairs)[None, :] < npairs[:, None]   # k x pairs
    base = adv[idx][:, None]
    every = bool(valid.all())       # every pair fits: the mask selects everything, in order
    step = sig * u
    probes = base + step
    plus = zs.feasible(probes.reshape((-1,) + zs.shape) if every else probes[valid],
                       np.repeat(idx, npairs), scratch=True)
    probes = np.subtract(base, step, out=probes)
    minus = zs.feasible(probes.reshape((-1,) + zs.shape) if every else probes[valid],
                        np.repeat(idx, npairs), scratch=True)
    del probes, step
    single = np.flatnonzero((npairs == 0) & (room >= 1))  # one query left: a lone probe
    lone = zs.feasible(base[single, 0] + sig * u[single, 0], idx[single])
    owners = np.concatenate([np.repeat(idx, npairs), np.repeat(idx, npairs), idx[single]])
    m = zs.ask(np.concatenate([plus, minus, lone]), owners)
    if m is None:
        return
    nv = int(npairs.sum())
    m_plus = np.zeros((k, pairs))
    m_minus = np.zeros((k, pairs))
    m_plus[valid], m_minus[valid] = m[:nv], m[nv:2 * nv]
    half = plus.astype(np.float32)
    half -= minus
    half /= 2.0
    if every:
        diff = half.reshape((k, pairs) + zs.shape)
    else:
        diff = np.zeros((k, pairs) + zs.shape, dtype=np.float32)
        diff[valid] = half
    coef = (m_plus - m_minus) / (2.0 * np.maximum(npairs, 1)[:, None] * sig * sig)
    g = np.einsum("kp,kp...->k...", coef.astype(np.float32), diff)
    for j, i in enumerate(idx):
        if npairs[j] == 0 or zs.done(int(i)):
            continue
        grad[i] = momentum * grad[i] + (1.0 - momentum) * g[j]
        # plateau annealing on the estimates' mean loss (the reference's last_ls)
        h = history[int(i)]
        h.append(float((m_plus[j, :npairs[j]].sum() + m_minus[j, :npairs[j]].sum())
                       / (2 * npairs[j])))
        del h[:-plateau]
        if len(h) == plateau and h[-1] > h[0]:
            lr[i] = max(lr[i] / drop, lr_min)
            h.clear()
    live = np.array([npairs[j] > 0 and not zs.done(int(i)) for j, i in enumerate(idx)],
                    dtype=bool)
    if not live.any():
        return
    sel = idx[live]
    g = grad[sel]
    if zs.norm == "linf":
        new = adv[sel] - expand(lr[sel], g.ndim).astype(np.float32) * np.sign(g)
    else:
        n = np.maximum(l2_norms(g), 1e-12)
        new = adv[sel] - (expand(lr[sel] / n, g.ndim)).astype(np.float32) * g
    adv[sel] = zs.project(new, sel)


def _run(norm: ZoNorm):
    def run(ctx: AttackContext) -> list[AttackResult]:
        p = ctx.params
        return nes_attack(ctx.margin_query(), ctx.images, ctx.labels, epsilon=p["epsilon"],
                          max_queries=p["max_queries"], rng=ctx.rng(), norm=norm,
                          samples=p["samples"], sigma=p["sigma"],
                          learning_rate=p["learning_rate"], momentum=p["momentum"],
                          spent=ctx.spent())
    return run


def _params(norm: ZoNorm) -> tuple[Param, ...]:
    return (
        EPSILON_LINF if norm == "linf" else EPSILON_L2, MAX_QUERIES,
        Param(name="samples", type="int", default=PAPER["samples"], minimum=2, maximum=10_000,
              description="queries per gradient estimate (antithetic pairs x 2)"),
        Param(name="sigma", type="float", default=SIGMA, minimum=1e-6, maximum=1.0,
              description="probe scale, std per pixel in [0,1] scale (paper 0.001 is below "
                          "one uint8 level)"),
        Param(name="learning_rate", type="float", default=PAPER["learning_rate"][norm],  # type: ignore[index]
              minimum=1e-6, maximum=1e4,
              description="step: per pixel (L-inf sign step) or the step's L2 norm (L2), "
                          "[0,1] scale"),
        Param(name="momentum", type="float", default=PAPER["momentum"], minimum=0.0,
              maximum=0.999, description="momentum on the gradient estimate"),
    )


_REFS = ("IEEE-A8", "IEEE-A9", "IEEE-M6")

SPEC = AttackSpec(
    id="nes", kind="score", family="score-based", norms=("linf",), refs=_REFS,
    description="NES (Ilyas et al., ICML 2018): antithetic Gaussian gradient estimate, "
                "momentum, projected sign steps, L-inf; untargeted or targeted",
    params=_params("linf"), targeted=True, run=_run("linf"))

SPEC_L2 = AttackSpec(
    id="nes_l2", kind="score", family="score-based", norms=("l2",), refs=_REFS,
    description="NES (Ilyas et al., ICML 2018) with projected L2 steps; untargeted or "
                "targeted",
    params=_params("l2"), targeted=True, run=_run("l2"))
