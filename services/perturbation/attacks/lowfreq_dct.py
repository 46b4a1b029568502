"""The low-frequency DCT attack (IEEE's "DCT attack"), score-based, L-inf, untargeted and
targeted: NES gradient estimation with samples drawn in the low-frequency DCT subspace
(LF-NES) (IEEE-A8, IEEE-A9, IEEE-M6).

Guo, Frank and Weinberger, "Low Frequency Adversarial Perturbation", UAI 2019 (authors' code:
``cg563/low-frequency-adversarial``). The paper restricts the search space of black-box
attacks to the low-frequency block of the DCT -- a ``ratio x ratio`` fraction of the
frequencies of each channel -- and evaluates it inside the decision-based Boundary Attack
(LF-BA) and inside the score-based NES attack of Ilyas, Engstrom, Athalye and Lin ("Black-box
Adversarial Attacks with Limited Queries and Information", ICML 2018): **LF-NES**, which is
what this module implements. Any attack that samples Gaussian noise becomes low-frequency by
sampling it with the authors' ``sample_gaussian_torch``: i.i.d. N(0, 1) coefficients in the
top-left ``round(ratio H) x round(ratio W)`` DCT block, inverse DCT (``dct.py``).

NES (Ilyas et al., query-limited setting), per iteration and image: ``samples`` antithetic
probes ``x_t +- sigma u_j`` (``u_j`` low-frequency Gaussian); gradient estimate
``g = sum_j (L(x + sigma u_j) - L(x - sigma u_j)) u_j / (samples sigma)``; momentum
``g_t = 0.9 g_{t-1} + 0.1 g``; projected sign step ``x_{t+1} = clip_eps(x_t - lr sign(g_t))``;
the learning rate halves when the loss of the last ``plateau_length`` iterates did not fall
(the authors' plateau annealing, down to ``min_lr``). ``ratio = 1`` is plain NES.
Defaults (:data:`DEFAULTS`): 50 samples per draw, lr 0.01, momentum 0.9, plateau 5 / drop 2
(Ilyas et al.'s ``main.py``), frequency ratio 1/4 (the largest of the paper's
{1/4, 1/8, 1/16, 1/32}; at 28 x 28 the smaller ones leave 1-3 frequencies per axis).

Deviations, all on purpose:

* **The loss is the criterion's margin** (``ctx.margin_query()``) instead of the cross
  entropy: any task, top-k scores, the same attack targeted or not.
* **uint8**: every probe and iterate is rounded to the uint8 image the target receives and
  projected into the L-inf ball (``e = floor(epsilon * 255)`` levels, IEEE-A9); success is
  judged on those images. Ilyas et al.'s ``sigma = 0.001`` is a quarter of one uint8 level and
  would round to nothing: ``sigma`` here is the probes' root-mean-square per pixel, default
  2 / 255 (each ``u_j`` is scaled to RMS 1, so sigma means the same for every ratio), and
  ``min_lr`` is 1 / 255 (one level).
* **Queries**: the clean image first, counted; then per iteration ``samples`` probes plus the
  new iterate (the authors check every iterate with an uncounted prediction; here it is a
  counted query). A probe that already meets the criterion is a success: it is a queried
  image inside the ball. An image stops at its first success or at Q_m (a last draw shrinks
  to the queries left), never later.
* Every running image is estimated and stepped in one query call per iteration.

Registry entry: :data:`SPEC`. Domain code: no gRPC.
"""

from __future__ import annotations

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.params import Param

from .base import (
    EPSILON_LINF,
    MAX_QUERIES,
    STOP_ITERATIONS,
    AttackContext,
    AttackResult,
    AttackSpec,
    Criterion,
    MarginQuery,
    linf_levels,
)
from .dct import low_frequency_noise
from .score_run import ScoreRun

#: Ilyas et al.'s query-limited NES defaults and the paper's largest frequency ratio; sigma and
#: min_lr in [0, 1] scale (see the module docstring for why they differ from 1e-3 / 5e-5).
DEFAULTS = {"freq_ratio": 0.25, "samples": 50, "sigma": 2 / 255, "learning_rate": 0.01,
            "momentum": 0.9, "plateau_length": 5, "plateau_drop": 2.0, "min_lr": 1 / 255}


def lowfreq_dct_attack(margin: MarginQuery, images: np.ndarray, labels: np.ndarray, *,
                       epsilon: float, max_queries: int, rng: np.random.Generator,
                       freq_ratio: float = DEFAULTS["freq_ratio"],
                       samples: int = int(DEFAULTS["samples"]),
                       sigma: float = DEFAULTS["sigma"],
                       learning_rate: float = DEFAULTS["learning_rate"],
                       momentum: float = DEFAULTS["momentum"],
                       plateau_length: int = int(DEFAULTS["plateau_length"]),
                       plateau_drop: float = DEFAULTS["plateau_drop"],
                       min_lr: float = DEFAULTS["min_lr"],
                       criterion: Criterion | None = None,
                       spent: np.ndarray | None = None) -> list[AttackResult]:
    """LF-NES on a batch; one result per image, in order. ``margin``: the criterion's margins
    (< 0 = success; ``criterion`` is accepted for the common signature and not needed).
    ``epsilon``: L-inf bound in [0, 1] scale (IEEE-A9). ``freq_ratio = 1``: plain NES."""
    run = ScoreRun(margin, images, labels, max_queries, spent)
    e = linf_levels(epsilon)
    for name, v in (("freq_ratio", freq_ratio), ("sigma", sigma),
                    ("learning_rate", learning_rate), ("min_lr", min_lr)):
        if not np.isfinite(v) or not 0.0 < v <= 1.0:
            raise InvalidArgument(name, f"must be in (0, 1], got {v!r}")
    if not 0.0 <= momentum < 1.0:
        raise InvalidArgument("momentum", f"must be in [0, 1), got {momentum!r}")
    if int(samples) != samples or samples < 2 or samples % 2:
        raise InvalidArgument("samples", f"must be an even integer >= 2, got {samples!r}")
    if int(plateau_length) != plateau_length or plateau_length < 1 or plateau_drop <= 1.0:
        raise InvalidArgument("plateau_length", "needs plateau_length >= 1 and "
                                                "plateau_drop > 1")
    if run.n == 0:
        return []
    x = run.images
    n = run.n
    shape = x.shape[1:]
    xf = x.astype(np.float64)
    lo, hi = np.maximum(xf - e, 0.0), np.minimum(xf + e, 255.0)
    m0 = run.begin()
    if e == 0:  # nothing can change within the bound: do not spend queries
        return run.results(STOP_ITERATIONS)
    pairs = int(samples) // 2
    adv = xf.copy()                                  # the iterate x_t (float levels)
    g_prev = np.zeros(x.shape)
    lr = np.full(n, float(learning_rate) * 255.0)
    floor = float(min_lr) * 255.0
    sig = float(sigma) * 255.0
    history: list[list[float]] = [[float(v)] for v in m0]
    while True:
        active = run.running()
        if not len(active):
            break
        # a last draw shrinks to the queries left (one kept for the iterate); an image with
        # fewer than 3 left cannot estimate a gradient any more
        p = np.minimum(pairs, np.maximum((run.remaining(active) - 1) // 2, 0))
        run.finish(STOP_ITERATIONS, active[p == 0])
        active, p = active[p > 0], p[p > 0]
        if not len(active):
            break
        k = len(active)
        u = low_frequency_noise(rng, k * pairs, shape, freq_ratio).reshape(k, pairs, *shape)
        use = np.arange(pairs)[None, :] < p[:, None]                       # k x pairs
        base = adv[active][:, None]
        plus = np.rint(np.clip(base + sig * u, lo[active][:, None], hi[active][:, None]))
        minus = np.rint(np.clip(base - sig * u, lo[active][:, None], hi[active][:, None]))
        who = np.repeat(active, pairs).reshape(k, pairs)
        rows = np.concatenate([plus[use], minus[use]]).astype(np.uint8)
        m = run.ask(np.concatenate([who[use], who[use]]), rows)
        if m is None:
            continue
        diff = np.zeros((k, pairs))
        half = int(use.sum())
        diff[use] = m[:half] - m[half:]
        diff = np.where(np.isfinite(diff), diff, 0.0)
        g = np.einsum("kp,kp...->k...", diff, u) / (2.0 * np.maximum(p, 1) * sig
                                                    ).reshape(k, *([1] * len(shape)))
        g = momentum * g_prev[active] + (1.0 - momentum) * g
        g_prev[active] = g
        step = adv[active] - lr[active].reshape(k, *([1] * len(shape))) * np.sign(g)
        adv[active] = np.clip(step, lo[active], hi[active])
        go = np.array([run.stop[int(i)] is None for i in active]) & (run.remaining(active) > 0)
        moved = active[go]
        if not len(moved):
            continue
        mi = run.ask(moved, np.rint(adv[moved]).astype(np.uint8))
        if mi is None:
            continue
        for j, i in enumerate(moved):     # plateau annealing of the learning rate
            h = history[int(i)]
            h.append(float(mi[j]))
            if len(h) > plateau_length:
                del h[0]
            if len(h) == plateau_length and h[-1] > h[0]:
                lr[i] = max(lr[i] / plateau_drop, floor)
                h.clear()
    return run.results(STOP_ITERATIONS)


def run(ctx: AttackContext) -> list[AttackResult]:
    p = ctx.params
    return lowfreq_dct_attack(
        ctx.margin_query(), ctx.images, ctx.labels, epsilon=p["epsilon"],
        max_queries=p["max_queries"], rng=ctx.rng(), freq_ratio=p["freq_ratio"],
        samples=p["samples"], sigma=p["sigma"], learning_rate=p["learning_rate"],
        criterion=ctx.criterion, spent=ctx.spent())


SPEC = AttackSpec(
    id="lowfreq_dct", kind="score", family="score-based", norms=("linf",),
    refs=("IEEE-A8", "IEEE-A9", "IEEE-M6"), targeted=True,
    description="Low-frequency DCT attack (Guo, Frank, Weinberger, UAI 2019): NES gradient "
                "estimation with samples in the low-frequency DCT subspace (LF-NES; L-inf, "
                "score-based)",
    params=(EPSILON_LINF, MAX_QUERIES,
            Param(name="freq_ratio", type="float", default=DEFAULTS["freq_ratio"],
                  minimum=1e-6, maximum=1.0,
                  description="side of the low-frequency DCT block / image side (1 = plain "
                              "NES; paper: 1/4 .. 1/32)"),
            Param(name="samples", type="int", default=int(DEFAULTS["samples"]), minimum=2,
                  maximum=10_000, description="antithetic samples per gradient estimate "
                                              "(even; Ilyas et al.: 50)"),
            Param(name="sigma", type="float", default=DEFAULTS["sigma"], minimum=1e-6,
                  maximum=1.0, description="probe size, RMS per pixel in [0,1] scale"),
            Param(name="learning_rate", type="float", default=DEFAULTS["learning_rate"],
                  minimum=1e-6, maximum=1.0,
                  description="sign-step size in [0,1] scale (Ilyas et al.: 0.01)")),
    run=run)
