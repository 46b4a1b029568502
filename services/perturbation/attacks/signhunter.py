"""SignHunter, score-based, L-inf and L2, untargeted and targeted (IEEE-A8, IEEE-A9, IEEE-M6;
Al-Dujaili & O'Reilly, "Sign Bits Are All You Need for Black-Box Attacks", ICLR 2020).

The paper's Algorithm 1 (divide-and-conquer sign flipping): the perturbation is ``epsilon *
s`` with one sign bit per pixel and channel, ``s = +1`` at first. At depth ``h`` the ``d``
sign bits are cut into ``2^h`` chunks of ``ceil(d / 2^h)``; the ``i``-th chunk is flipped, the
target asked once, and the flip kept when the loss did not get worse, else undone; ``i``
advances, and after the last chunk of a depth ``h`` grows. When ``h`` passes
``ceil(log2 d)`` the hierarchy restarts at ``h = 0`` from the current signs. L-inf:
``x + epsilon * s``; L2: ``x + epsilon * s / ||s||_2`` (every pixel changed by
``epsilon / sqrt(d)``). One query per step, all images of the batch in one call.

The loss is the criterion's margin (``ctx.margin_query()``, < 0 = success; minimised): the
untargeted margin (true class minus best other) or, with a
:class:`~fortis.services.perturbation.criteria.TargetedMisclassification` criterion, the
targeted one; the authors' code maximises the cross-entropy or the C&W margin on logits.

Deviations, on purpose:

* uint8 (IEEE-A9): the perturbation is in levels, ``e = floor(epsilon * 255)`` for L-inf; for
  L2 every pixel moves by ``epsilon * 255 / sqrt(d)`` levels truncated towards ``x`` (so the
  image sent is within the bound); when that is below one level nothing can change and the
  images stop after their clean query (``iterations``). Images are clipped to ``[0, 255]``.
* The clean image is the first query and is counted (IEEE-M6); an image already adversarial
  stops there. The reference re-evaluates the unperturbed image at every step (a constant);
  it is asked once here. Each image stops at its first success (any query with margin < 0) or
  at Q_m.
* The sign vector is laid out as the image's ``H x W x C`` values in row-major order (the
  reference flattens its NCHW tensors: chunks group channels differently on RGB images).
* Restart: the reference moves its centre to the current adversarial and then projects back
  onto the ball; here the centre stays the original image (the paper's Algorithm 1), which is
  the same point for L-inf where the projection would otherwise zero every disagreeing sign.
"""

from __future__ import annotations

import math

import numpy as np

from ._zo import EPSILON_L2, ZoNorm, ZoSearch
from .base import (
    EPSILON_LINF,
    MAX_QUERIES,
    AttackContext,
    AttackResult,
    AttackSpec,
    MarginQuery,
)

#: The authors' defaults (src/config-jsons): MNIST L-inf 0.3 / L2 3.0, CIFAR-10 L-inf 12/255
#: / L2 127/255, ImageNet L-inf 0.05 / L2 5.0; the bound is always a plan parameter here.
PAPER_EPSILON = {"mnist": {"linf": 0.3, "l2": 3.0}, "imagenet": {"linf": 0.05, "l2": 5.0}}


def signhunter_attack(margin: MarginQuery, images: np.ndarray, labels: np.ndarray, *,
                      epsilon: float, max_queries: int, norm: ZoNorm = "linf",
                      rng: np.random.Generator | None = None,
                      spent: np.ndarray | None = None) -> list[AttackResult]:
    """SignHunter on a batch; one :class:`AttackResult` per image, in order. ``margin`` is a
    :data:`~.base.MarginQuery` (the criterion's margin, < 0 = success). Deterministic: ``rng``
    is accepted for a uniform signature and not used."""
    del rng
    zs = ZoSearch(margin, images, labels, norm=norm, epsilon=epsilon,
                  max_queries=max_queries, spent=spent)
    if zs.n == 0:
        return []
    zs.start()
    d = zs.d
    if norm == "linf":
        step = float(zs.e)
    else:
        step = float(np.trunc(zs.radius / math.sqrt(d)))  # levels per pixel, towards x
    if step < 1.0:
        zs.finish(zs.running())
        return zs.results()
    signs = np.ones((zs.n, d), dtype=np.float32)
    loss = np.full(zs.n, np.inf)

    def candidates(idx: np.ndarray, s: np.ndarray) -> np.ndarray:
        cand = zs.x[idx] + step * s.reshape((len(idx),) + zs.shape)
        return zs.feasible(cand, idx)

    # the first point, s = +1 (the reference's extra evaluation at h = i = 0)
    idx = zs.running()
    if len(idx):
        m = zs.ask(candidates(idx, signs[idx]), idx)
        if m is not None:
            loss[idx] = m
    depth_end = math.ceil(math.log2(d)) if d > 1 else 0
    h, i = 0, 0
    while True:
        idx = zs.running()
        if not len(idx):
            break
        chunk = math.ceil(d / 2 ** h)
        lo, hi = i * chunk, min(d, (i + 1) * chunk)
        trial = signs[idx].copy()
        trial[:, lo:hi] *= -1.0
        m = zs.ask(candidates(idx, trial), idx)
        if m is not None:
            keep = m <= loss[idx]          # the flip did not make the loss worse: keep it
            signs[idx[keep]] = trial[keep]
            loss[idx[keep]] = m[keep]
        i += 1
        if i == 2 ** h or hi == d:
            h, i = h + 1, 0
            if h > depth_end:
                h = 0
    return zs.results()


def _run(norm: ZoNorm):
    def run(ctx: AttackContext) -> list[AttackResult]:
        p = ctx.params
        return signhunter_attack(ctx.margin_query(), ctx.images, ctx.labels,
                                 epsilon=p["epsilon"], max_queries=p["max_queries"], norm=norm,
                                 spent=ctx.spent())
    return run


_REFS = ("IEEE-A8", "IEEE-A9", "IEEE-M6")

SPEC = AttackSpec(
    id="signhunter", kind="score", family="score-based", norms=("linf",), refs=_REFS,
    description="SignHunter (Al-Dujaili & O'Reilly, ICLR 2020): divide-and-conquer sign "
                "flipping, L-inf; untargeted or targeted; every query through the proxy",
    params=(EPSILON_LINF, MAX_QUERIES), targeted=True, stochastic=False, run=_run("linf"))

SPEC_L2 = AttackSpec(
    id="signhunter_l2", kind="score", family="score-based", norms=("l2",), refs=_REFS,
    description="SignHunter (Al-Dujaili & O'Reilly, ICLR 2020), L2 (every pixel moves by "
                "epsilon/sqrt(d)); untargeted or targeted; every query through the proxy",
    params=(EPSILON_L2, MAX_QUERIES),
    targeted=True, stochastic=False, run=_run("l2"))
