"""GeoDA, Geometric Decision-based Attack, L2 and L-inf, untargeted (IEEE-A8, IEEE-A9,
IEEE-M6; Rahmati, Moosavi-Dezfooli, Frossard, Dai, "GeoDA: a geometric framework for
black-box adversarial attacks", CVPR 2020).

The decision boundary of deep networks has a small mean curvature near data points, so GeoDA
treats it locally as a hyperplane: at a boundary point ``x_B`` it estimates the normal ``w``
from ``N_t`` random probes in a low-frequency DCT subspace (``sub_dim x sub_dim`` per
channel), each answered adversarial (+1) or not (-1), ``w ~ sum z_i eta_i`` (accumulated over
the iterations, as the authors' code does); the smallest perturbation that reaches that
hyperplane from the original ``x`` is

* L2: ``r = (w . (x_B - x) / ||w||_2^2) w``;
* L-inf: ``r = (w . (x_B - x) / ||w||_1) sign(w)``;

a search along ``r``'s direction from ``x`` and a binary search return to the boundary, which
is the next ``x_B``. The queries are spread over ``T`` iterations as the paper's optimal
distribution ``N_t ~ lambda^(-2t/3)`` (``lambda = 0.6``; ``T`` chosen as the authors' code
does, so the first iteration gets 50 to 80 probes, 25 queries per iteration kept for the
searches). The sparse L1 variant is **not implemented**: Fortis's norms (IEEE-A9) are L0, L2
and L-inf; an L1 bound has no place in a plan yet. Untargeted only, as the paper. Two
registry entries: ``geoda`` (L2) and ``geoda_linf``.

Differences, all on purpose (shared conventions in ``_decision.py``):

* Start: uniform noise, then the batch's other images (each a counted query), then a binary
  search to the boundary (the authors: Gaussian noise of growing size, then bisection).
* The hyperplane step: the paper's closed form gives where the boundary should be; the search
  asks that point and doubles the step until adversarial, then bisects between the last point
  that was not and the first that is (the authors' code walks from ``x`` in fixed steps of 5
  along the estimate, ART the same).
* uint8: points are rounded to what the target receives; the probe radius is
  ``max(sigma, 0.5 sqrt(d) / 255)`` in L2 (the authors' ``sigma = 0.0002`` is far below one
  uint8 level: such probes would all round back to ``x_B``); binary searches stop at a
  quarter level.
* Budget: the schedule is computed from what Q_m leaves once the start is found; an image that
  still has queries after its ``T`` iterations continues with the last iteration's count
  (the authors stop, leaving them unspent); the clean image is the first query; each image
  stops at its first success (L2 or L-inf within epsilon) or Q_m; an image that sends nothing
  new for ``MAX_STALLS`` iterations stops (``iterations``). Non-square images are fine (ART's
  GeoDA refuses them).
"""

from __future__ import annotations

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.params import Param
from fortis.services.perturbation.criteria import Criterion, Misclassification

from ._decision import (
    INIT_TRIES,
    DistanceNorm,
    bisect,
    find_starts,
    line_search,
    low_frequency_noise,
    min_probe_radius,
    prepare,
    probe_normals,
    unit,
)
from .base import (
    EPSILON_LINF,
    MAX_QUERIES,
    STOP_ITERATIONS,
    AttackContext,
    AttackResult,
    AttackSpec,
    DecisionQuery,
)

# Parameters of the paper and the authors' code (GeoDA.py).
LAMBDA = 0.6                    # query distribution N_t ~ lambda^(-2t/3) ("mu" in the code)
SUB_DIM_FRACTION = 75 / 224     # DCT subspace side: the authors' 75 on 224 x 224 images
QUERIES_PER_SEARCH = 25         # kept per iteration for the searches (the authors' 25)
FIRST_MIN, FIRST_MAX = 50, 80   # the first iteration's probes (the authors' T selection)
SIGMA = 0.0                     # probe radius in L2 ([0, 1] scale); floored to survive uint8
MAX_STALLS = 3                  # iterations in a row that send nothing stop an image
MAX_ITERATIONS = 10_000         # bound on the loop (the budget ends it long before)


def query_schedule(budget: int, lam: float = LAMBDA) -> list[int]:
    """Probes per iteration for ``budget`` queries (the paper's optimal distribution, the
    authors' choice of the number of iterations ``T``: ``T`` grows while the first
    iteration's share exceeds 80 and shrinks while it is below 50; oscillation ends on the
    larger ``T``)."""
    budget = max(int(budget), 1)
    t = max(1, round(budget / 500))
    seen: dict[int, list[int]] = {}
    for _ in range(200):
        nq = max(budget - QUERIES_PER_SEARCH * t, t)
        coefs = lam ** (-2.0 * np.arange(t) / 3.0)
        q = [max(int(v), 1) for v in np.round(nq * coefs / coefs.sum())]
        seen[t] = q
        if q[0] > FIRST_MAX and t + 1 not in seen:
            t += 1
        elif q[0] < FIRST_MIN and t > 1 and t - 1 not in seen:
            t -= 1
        else:
            break
    if q[0] < FIRST_MIN and t - 1 in seen and seen[t - 1][0] <= FIRST_MAX:
        q = seen[t - 1]
    if q[0] > FIRST_MAX and t + 1 in seen:
        q = seen[t + 1]
    return q


def geoda_attack(query: DecisionQuery, images: np.ndarray, labels: np.ndarray, *,
                 epsilon: float, max_queries: int, rng: np.random.Generator,
                 criterion: Criterion | None = None, spent: np.ndarray | None = None,
                 norm: DistanceNorm = "l2", sub_dim: int = 0, lam: float = LAMBDA,
                 sigma: float = SIGMA, init_tries: int = INIT_TRIES) -> list[AttackResult]:
    """Run GeoDA (L2 or L-inf, ``norm``) on a batch through a decision query; one
    :class:`AttackResult` per image, in order (IEEE-A8, IEEE-M6). ``sub_dim`` 0: the
    authors' proportion of the image side. ``epsilon`` bounds the ``norm``."""
    if norm not in ("l2", "linf"):
        raise InvalidArgument("norm", f"must be l2 or linf, got {norm!r}")
    if int(sub_dim) < 0:
        raise InvalidArgument("sub_dim", f"must be >= 0, got {sub_dim!r}")
    if not np.isfinite(lam) or not 0.0 < lam < 1.0:
        raise InvalidArgument("lambda", f"must be in (0, 1), got {lam!r}")
    if not np.isfinite(sigma) or sigma < 0:
        raise InvalidArgument("sigma", f"must be >= 0, got {sigma!r}")
    crit = criterion if criterion is not None else Misclassification()
    oracle, labels, active = prepare(query, images, labels, epsilon=epsilon, norm=norm,
                                     max_queries=max_queries, spent=spent)
    if not len(active):
        return oracle.results()
    h, w, _c = oracle.shape
    side = int(sub_dim) or max(1, round(min(h, w) * SUB_DIM_FRACTION))
    delta_min = max(float(sigma), min_probe_radius(oracle.d))
    has, starts = find_starts(oracle, active, labels, crit, rng, init_tries)
    active, starts = active[has], starts[has]
    xb = oracle.xf.copy()
    xb[active] = bisect(oracle, active, oracle.xf[active], starts)
    schedules = {int(i): query_schedule(oracle.qb.remaining(int(i)), lam) for i in active}
    grad = np.zeros((oracle.n, oracle.d))
    stalls = np.zeros(oracle.n, dtype=np.int64)

    def draw(m: int) -> np.ndarray:
        return unit(low_frequency_noise(rng, m, oracle.shape, (side, side)))

    for t in range(MAX_ITERATIONS):
        run = oracle.running()
        if not len(run):
            break
        before = oracle.sent(run)
        want = np.array([schedules[int(i)][min(t, len(schedules[int(i)]) - 1)] for i in run])
        room = oracle.remaining(run) - QUERIES_PER_SEARCH // 2
        counts = np.clip(np.minimum(want, room), 1, None)
        delta = np.full(len(run), delta_min)
        normal, _ = probe_normals(oracle, run, xb[run], counts, delta, draw, baseline=False)
        grad[run] += normal
        moving = oracle.is_running(run)
        run, before = run[moving], before[moving]
        if not len(run):
            continue
        g = grad[run]
        offset = (xb[run] - oracle.xf[run]).reshape(len(run), -1)
        if norm == "l2":
            gn = np.sqrt(np.einsum("ij,ij->i", g, g))
            direction = g / np.maximum(gn, 1e-300)[:, None]
            t0 = np.einsum("ij,ij->i", direction, offset)
        else:
            direction = np.sign(g)
            t0 = np.einsum("ij,ij->i", g, offset) / np.maximum(np.abs(g).sum(axis=1), 1e-300)
        dist = oracle.distances(np.rint(xb[run] * 255.0), run)
        fallback = ~np.isfinite(t0) | (t0 <= 0) | ~(np.abs(g).sum(axis=1) > 0)
        t0 = np.where(fallback, dist, t0)
        found, pts = line_search(oracle, run, direction.reshape(xb[run].shape), t0)
        xb[run[found]] = pts[found]
        stalls[run] = np.where(oracle.sent(run) > before, 0, stalls[run] + 1)
        oracle.stop(run[stalls[run] >= MAX_STALLS], STOP_ITERATIONS)
    oracle.stop(oracle.running(), STOP_ITERATIONS)
    return oracle.results()


def _run(ctx: AttackContext, norm: DistanceNorm) -> list[AttackResult]:
    p = ctx.params
    return geoda_attack(ctx.decision_query(), ctx.images, ctx.labels, epsilon=p["epsilon"],
                        max_queries=p["max_queries"], rng=ctx.rng(), criterion=ctx.criterion,
                        spent=ctx.spent(), norm=norm, sub_dim=p["sub_dim"])


def run(ctx: AttackContext) -> list[AttackResult]:
    return _run(ctx, "l2")


def run_linf(ctx: AttackContext) -> list[AttackResult]:
    return _run(ctx, "linf")


SUB_DIM = Param(name="sub_dim", type="int", default=0, minimum=0, maximum=4096,
                description="side of the low-frequency DCT subspace of the probes; 0 = the "
                            "authors' 75/224 of the image side")

SPEC = AttackSpec(
    id="geoda", minimal_norm=True, kind="decision", family="decision-based", norms=("l2",),
    refs=("IEEE-A8", "IEEE-A9", "IEEE-M6"),
    description="GeoDA (Rahmati et al. 2020; L2, decision-based, minimal-norm): local "
                "hyperplane approximation of the boundary from DCT-subspace probes; success = "
                "the criterion holds within L2 <= epsilon",
    params=(Param(name="epsilon", type="float", minimum=0.0, maximum=1e4,
                  description="L2 bound in [0,1] pixel scale (IEEE-A9)"), MAX_QUERIES, SUB_DIM),
    run=run)

SPEC_LINF = AttackSpec(
    id="geoda_linf", minimal_norm=True, kind="decision", family="decision-based", norms=("linf",),
    refs=("IEEE-A8", "IEEE-A9", "IEEE-M6"),
    description="GeoDA (Rahmati et al. 2020; L-inf, decision-based, minimal-norm): sign of the "
                "estimated boundary normal; success = the criterion holds within L-inf <= "
                "epsilon",
    params=(EPSILON_LINF, MAX_QUERIES, SUB_DIM),
    run=run_linf)
