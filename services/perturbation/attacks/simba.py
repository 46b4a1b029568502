"""SimBA, the Simple Black-box Attack, score-based, L2; pixel and DCT bases; untargeted and
targeted (IEEE-A8, IEEE-A9, IEEE-M6).

Guo, Gardner, You, Wilson and Weinberger, "Simple Black-box Adversarial Attacks", ICML 2019
(authors' code: ``cg563/simple-blackbox-attack``, ``simba.py`` / ``run_simba.py``).

Algorithm 1 of the paper, per image: draw the next direction ``q`` of an orthonormal basis
(without replacement); try ``x - step * q``; if the adversarial loss decreased, keep it,
otherwise try ``x + step * q`` and keep that if the loss decreased; repeat until the attack
succeeds. SimBA (``basis="pixel"``): the standard basis in a random order. SimBA-DCT
(``basis="dct"``): the orthonormal 2-D DCT basis of the whole image in the authors' ``strided``
low-frequency-first order: first the ``freq_ratio`` block of lowest frequencies (the paper's
28 of 224 = 1/8) in a random order, then each next band of ``stride_ratio`` rows and columns
(7 of 224 = 1/32). Targeted: the same attack given ``TargetedMisclassification``.

Parameters (the paper's defaults, as data in :data:`DEFAULTS`): step size 0.2 ([0, 1] scale),
``freq_ratio`` 1/8, ``stride_ratio`` 1/32. Deviations, all on purpose:

* **The loss is the criterion's margin** (``ctx.margin_query()``, < 0 where the criterion holds)
  instead of the true (or target) class probability: so it works the same with top-k scores,
  detectors and segmenters (the margin falls exactly when the true-class probability falls
  relative to the best other class). The attack never reads scores itself.
* **An explicit L2 bound** ``epsilon`` (IEEE-A9, recorded in the plan): the paper bounds the
  perturbation only through the step size (``||delta||_2 <= step * sqrt(T)`` after T accepted
  steps); here a candidate outside the ball is scaled back onto it.
* **uint8**: the perturbation is kept in float (levels) and every candidate is rounded to the
  uint8 image the target receives, inside the ball (``score_run.round_into_l2``); success and
  "the loss decreased" are judged on that image. The perturbation accumulates unclipped
  apart from the [0, 255] box, as in the authors' batch code.
* **Queries**: the clean image is the first query and is counted; 1 query per iteration when
  ``x - step q`` improves, 2 otherwise (the paper's count; the authors' batch code also asks a
  second, uncounted prediction per iteration to check success, which here is the margin of
  the query itself). An image stops at its first success or at Q_m, never later; when its
  basis is exhausted (every direction tried, as ``max_iters = min(n_dims, num_iters)`` in the
  authors' code) it stops with ``iterations``.
* **Batch**: every running image gets its own random order and moves in one query call per
  probe (the authors share one order across the batch).

Registry entry: :data:`SPEC`. Domain code: no gRPC.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
from .dct import dct_matrix, low_frequency_order
from .score_run import ScoreRun, l2_levels, round_into_l2

#: The paper's / authors' defaults (``run_simba.py``: ``--epsilon 0.2``, SimBA-DCT
#: ``--freq_dims 28 --order strided --stride 7`` at 224 x 224).
DEFAULTS = {"step_size": 0.2, "freq_ratio": 28 / 224, "stride_ratio": 7 / 224}
BASES = ("dct", "pixel")

#: ``directions(k, idx, delta) -> unit directions`` (float64, [0, 1] scale, one per image of
#: ``idx``) for iteration ``k``, or None when the basis is exhausted.
Directions = Callable[[int, np.ndarray, np.ndarray], np.ndarray | None]


def simba_search(run: ScoreRun, directions: Directions, *, step_size: float, epsilon: float,
                 signs: Sequence[int]) -> None:
    """The SimBA loop on a started :class:`ScoreRun` (clean margins asked): for each running
    image, try ``delta + sign * step * q`` for each sign in turn, keep the first that lowers
    the margin. ``delta`` (float, uint8 levels) starts at 0; candidates are rounded into the
    L2 ball of radius ``epsilon``. Ends when every image stopped or ``directions`` is
    exhausted (those images stop with ``iterations``). Used by SimBA and SimBA-ODS."""
    x = run.images
    xf = x.astype(np.float64)
    eps_lv = l2_levels(epsilon)
    step_lv = float(step_size) * 255.0
    delta = np.zeros(x.shape, dtype=np.float64)
    current = run.best_margin.copy()       # margin of the accepted delta (clean at start)
    if eps_lv < 1.0:                       # no uint8 change fits in the ball
        run.finish(STOP_ITERATIONS)
        return
    k = 0
    while True:
        active = run.running()
        if not len(active):
            return
        q = directions(k, active, delta[active])
        if q is None:
            run.finish(STOP_ITERATIONS, active)
            return
        todo = np.arange(len(active))
        for sign in signs:
            if not len(todo):
                break
            idx = active[todo]
            cand = delta[idx] + sign * step_lv * q[todo]
            xi = xf[idx]
            np.maximum(cand, -xi, out=cand)            # inside [0, 255] (np.clip with array
            np.minimum(cand, 255.0 - xi, out=cand)     # bounds is several times slower)
            norm = np.sqrt(np.sum(cand.reshape(len(idx), -1) ** 2, axis=1))
            scale = np.where(norm > eps_lv, eps_lv / np.maximum(norm, 1e-300), 1.0)
            cand *= scale.reshape(-1, *([1] * (x.ndim - 1)))
            m = run.ask(idx, round_into_l2(x[idx], cand, eps_lv))
            if m is None:
                break
            improved = m < current[idx]
            delta[idx[improved]] = cand[improved]
            current[idx[improved]] = m[improved]
            left = np.array([run.stop[int(i)] is None for i in idx]) & ~improved
            left &= run.remaining(idx) > 0
            todo = todo[left]
        k += 1


def _basis_directions(rng: np.random.Generator, n: int, shape: tuple[int, int, int],
                      basis: str, freq_ratio: float, stride_ratio: float,
                      length: int) -> Directions:
    """The SimBA / SimBA-DCT direction of iteration k for each image: a unit vector of its
    own random order over the pixel or DCT basis."""
    h, w, c = shape
    d = h * w * c
    length = min(length, d)
    if basis == "pixel":
        order = np.stack([rng.permutation(d)[:length] for _ in range(n)]) if n else \
            np.zeros((0, length), dtype=np.int64)
    else:
        order = low_frequency_order(rng, n, shape, freq_ratio, stride_ratio, length)
    dh, dw = dct_matrix(h), dct_matrix(w)

    def directions(k: int, idx: np.ndarray, _delta: np.ndarray) -> np.ndarray | None:
        if k >= length:
            return None
        flat = order[idx, k]
        if basis == "pixel":
            flat_q = np.zeros((len(idx), d), dtype=np.float64)
            flat_q[np.arange(len(idx)), flat] = 1.0
            return flat_q.reshape(len(idx), h, w, c)
        q = np.zeros((len(idx), h, w, c), dtype=np.float64)
        u, rest = np.divmod(flat, w * c)
        v, ch = np.divmod(rest, c)
        q[np.arange(len(idx)), :, :, ch] = dh[u][:, :, None] * dw[v][:, None, :]
        return q

    return directions


def _check(step_size: float, freq_ratio: float, stride_ratio: float, basis: str) -> None:
    if basis not in BASES:
        raise InvalidArgument("basis", f"must be one of {', '.join(BASES)}, got {basis!r}")
    if not np.isfinite(step_size) or step_size <= 0.0:
        raise InvalidArgument("step_size", f"must be > 0, got {step_size!r}")
    for name, v in (("freq_ratio", freq_ratio), ("stride_ratio", stride_ratio)):
        if not np.isfinite(v) or not 0.0 < v <= 1.0:
            raise InvalidArgument(name, f"must be in (0, 1], got {v!r}")


def simba_attack(margin: MarginQuery, images: np.ndarray, labels: np.ndarray, *,
                 epsilon: float, max_queries: int, rng: np.random.Generator,
                 basis: str = "dct", step_size: float = DEFAULTS["step_size"],
                 freq_ratio: float = DEFAULTS["freq_ratio"],
                 stride_ratio: float = DEFAULTS["stride_ratio"],
                 criterion: Criterion | None = None,
                 spent: np.ndarray | None = None) -> list[AttackResult]:
    """SimBA (``basis="pixel"``) or SimBA-DCT (``basis="dct"``) on a batch; one result per
    image, in order. ``margin``: the criterion's margins (< 0 = success; untargeted or
    targeted, whichever criterion built it; ``criterion`` is accepted for the common attack
    signature and not needed). ``epsilon``: L2 bound in [0, 1] scale (IEEE-A9)."""
    run = ScoreRun(margin, images, labels, max_queries, spent)
    l2_levels(epsilon)
    _check(step_size, freq_ratio, stride_ratio, basis)
    if run.n == 0:
        return []
    directions = _basis_directions(rng, run.n, run.images.shape[1:], basis, freq_ratio,
                                   stride_ratio, run.qb.limit)
    run.begin()
    simba_search(run, directions, step_size=step_size, epsilon=epsilon, signs=(-1, 1))
    return run.results(STOP_ITERATIONS)


def run(ctx: AttackContext) -> list[AttackResult]:
    p = ctx.params
    return simba_attack(ctx.margin_query(), ctx.images, ctx.labels, epsilon=p["epsilon"],
                        max_queries=p["max_queries"], rng=ctx.rng(), basis=p["basis"],
                        step_size=p["step_size"], freq_ratio=p["freq_ratio"],
                        stride_ratio=p["stride_ratio"], criterion=ctx.criterion,
                        spent=ctx.spent())


SPEC = AttackSpec(
    id="simba", kind="score", family="score-based", norms=("l2",),
    refs=("IEEE-A8", "IEEE-A9", "IEEE-M6"), targeted=True,
    description="SimBA / SimBA-DCT (Guo et al., ICML 2019): greedy steps along random "
                "orthonormal pixel or low-frequency DCT directions (L2, score-based)",
    params=(Param(name="epsilon", type="float", minimum=0.0, maximum=1e4,
                  description="L2 bound in [0,1] pixel scale (IEEE-A9)"),
            MAX_QUERIES,
            Param(name="basis", type="string", default="dct", choices=BASES,
                  description="dct: SimBA-DCT (low frequencies first); pixel: SimBA"),
            Param(name="step_size", type="float", default=DEFAULTS["step_size"],
                  minimum=1e-6, maximum=10.0,
                  description="step along each direction, L2 in [0,1] scale (paper: 0.2)"),
            Param(name="freq_ratio", type="float", default=DEFAULTS["freq_ratio"],
                  minimum=1e-6, maximum=1.0,
                  description="DCT: side of the first low-frequency block / image side "
                              "(paper: 28/224)"),
            Param(name="stride_ratio", type="float", default=DEFAULTS["stride_ratio"],
                  minimum=1e-6, maximum=1.0,
                  description="DCT: band added when a block is exhausted / image side "
                              "(paper: 7/224)")),
    run=run)
