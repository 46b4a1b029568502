"""QEBA, Query-Efficient Boundary-based blackbox Attack, decision-based, L2, untargeted and
targeted (IEEE-A8, IEEE-A9, IEEE-M6; Li, Xu, Zhang, Yang, Li, "QEBA: Query-Efficient
Boundary-Based Blackbox Attack", CVPR 2020).

HopSkipJump's iteration (Chen et al. 2020) with the gradient estimated in a subspace: from a
boundary point, ``num_evals = min(init_evals * sqrt(t), max_num_evals)`` random probes of
radius ``delta`` are asked, each answered adversarial (+1) or not (-1); the baseline-corrected
mean of the probes weighted by the answers is the estimated normal; a geometric step-size
search (``||x_t - x|| / sqrt(t)``, halved until adversarial) moves along it and a binary
search towards the original returns to the boundary. QEBA draws the probes from a
lower-dimensional subspace, where the gradient of natural-image classifiers concentrates:

* ``subspace="resize"`` (QEBA-S, spatial): Gaussian noise on an ``H/ratio x W/ratio`` grid,
  upsampled bilinearly (the authors' ``ResizeGenerator``, factor 4);
* ``subspace="dct"`` (QEBA-F, frequency): Gaussian coefficients on the lowest
  ``H/ratio x W/ratio`` 2-D DCT frequencies of each channel (the authors' ``DCTGenerator``
  orthogonalises each coefficient block with a QR step; plain Gaussian coefficients here,
  the same distribution of directions up to that normalisation);
* ``subspace="full"``: the whole image space (HopSkipJump's probes; for comparisons).

The intrinsic-component variant (QEBA-I: PCA / autoencoder components learnt from a data set
of the target's domain) is **not implemented**: it needs a model of the data that a plan
does not carry. Parameters are the authors' (``gamma = 0.01``: binary-search threshold
``gamma / sqrt(d)`` and probe radius ``gamma * ||x_t - x||``; the first radius 0.1).

Differences, all on purpose (shared conventions in ``_decision.py``):

* Start: uniform noise (the authors' start), then the batch's other images (the targeted
  start: an image of the target class, as the paper starts targeted attacks), each verified
  by a counted query; binary search to the boundary.
* uint8: probes and points are rounded to the uint8 image the target receives; the probe
  radius is at least ``0.5 sqrt(d) / 255`` so a probe survives the rounding, and the probe
  directions used in the estimate are the rounded probes actually sent (the authors'
  ``discretize`` option); binary searches stop at a quarter uint8 level.
* Budget: the clean image is the first query; the probe count is cut to what Q_m leaves
  (``SEARCH_RESERVE`` queries kept for the step and binary searches); the step search halves
  at most ``MAX_HALVINGS`` times; an image that sends nothing new for ``MAX_STALLS``
  iterations stops (``iterations``). Each image stops at its first success or Q_m.
* Batched: every stage asks one query call holding the rows of all images still running.
"""

from __future__ import annotations

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.params import Param
from fortis.services.perturbation.criteria import Criterion, Misclassification

from ._decision import (
    INIT_TRIES,
    DecisionOracle,
    bisect,
    find_starts,
    low_frequency_noise,
    min_probe_radius,
    prepare,
    probe_normals,
    resize_matrix,
    separable,
    unit,
    unit_or_random,
)
from .base import (
    MAX_QUERIES,
    STOP_ITERATIONS,
    AttackContext,
    AttackResult,
    AttackSpec,
    DecisionQuery,
)

# Parameters of the authors' implementation (QEBA bapp_custom.py, resize/dct generators).
SUBSPACES = ("resize", "dct", "full")
SUBSPACE = "resize"      # QEBA-S
RATIO = 4                # subspace side = image side / RATIO (the authors' factor 4)
INIT_EVALS = 100         # probes at the first iteration (then * sqrt(t))
MAX_NUM_EVALS = 10_000   # probes per iteration at most
GAMMA = 0.01             # binary-search threshold gamma / sqrt(d); probe radius gamma * dist
FIRST_DELTA = 0.1        # probe radius of the first iteration ([0, 1] scale)
MAX_HALVINGS = 30        # geometric step-size search: at most this many halvings
SEARCH_RESERVE = 12      # queries kept back from the probes for the step and binary searches
MAX_STALLS = 3           # iterations in a row that send nothing stop an image


def subspace_probes(rng: np.random.Generator, m: int, shape: tuple[int, ...], subspace: str,
                    ratio: int) -> np.ndarray:
    """``m`` random directions (m x H x W x C, unit L2 norm) from the subspace."""
    h, w, _c = shape
    sh, sw = max(1, h // ratio), max(1, w // ratio)
    if subspace == "resize":
        small = rng.standard_normal((m, sh, sw, shape[2]))
        rv = separable(resize_matrix(h, sh), small, resize_matrix(w, sw).T)
    elif subspace == "dct":
        rv = low_frequency_noise(rng, m, shape, (sh, sw))
    else:
        rv = rng.standard_normal((m, *shape))
    return unit(rv)


def geometric_step(oracle: DecisionOracle, idx: np.ndarray, points: np.ndarray,
                   direction: np.ndarray, step: np.ndarray) -> np.ndarray:
    """HopSkipJump's step-size search: ``points + step * direction``, halving ``step`` until
    the target answers adversarial (at most ``MAX_HALVINGS``); a row that never does stays
    where it was. Returns the new points (uint8 grid, / 255)."""
    out = points.copy()
    step = step.astype(np.float64).copy()
    todo = np.arange(len(idx))
    shape = (-1,) + (1,) * (points.ndim - 1)
    for _ in range(MAX_HALVINGS):
        todo = todo[oracle.is_running(idx[todo])]
        if not len(todo):
            break
        pts = np.clip(points[todo] + step[todo].reshape(shape) * direction[todo], 0.0, 1.0)
        dec, imgs = oracle.ask(pts, idx[todo])
        out[todo[dec]] = imgs[dec] / 255.0
        step[todo[~dec]] /= 2.0
        todo = todo[~dec]
    return out


def qeba_attack(query: DecisionQuery, images: np.ndarray, labels: np.ndarray, *,
                epsilon: float, max_queries: int, rng: np.random.Generator,
                criterion: Criterion | None = None, spent: np.ndarray | None = None,
                subspace: str = SUBSPACE, ratio: int = RATIO, init_evals: int = INIT_EVALS,
                max_num_evals: int = MAX_NUM_EVALS, gamma: float = GAMMA,
                init_tries: int = INIT_TRIES) -> list[AttackResult]:
    """Run QEBA (L2) on a batch through a decision query; one :class:`AttackResult` per
    image, in order (IEEE-A8, IEEE-M6). ``criterion`` (default :class:`Misclassification`)
    only guides the choice of fallback starting points; the query judges."""
    if subspace not in SUBSPACES:
        raise InvalidArgument("subspace", f"must be one of {', '.join(SUBSPACES)}, got "
                                          f"{subspace!r}")
    if int(ratio) < 1:
        raise InvalidArgument("ratio", f"must be >= 1, got {ratio!r}")
    if int(init_evals) < 1 or int(max_num_evals) < 1:
        raise InvalidArgument("init_evals", "init_evals and max_num_evals must be >= 1")
    if not np.isfinite(gamma) or gamma <= 0:
        raise InvalidArgument("gamma", f"must be > 0, got {gamma!r}")
    crit = criterion if criterion is not None else Misclassification()
    oracle, labels, active = prepare(query, images, labels, epsilon=epsilon, norm="l2",
                                     max_queries=max_queries, spent=spent)
    if not len(active):
        return oracle.results()
    d = oracle.d
    theta = float(gamma) / np.sqrt(d)
    delta_min = min_probe_radius(d)
    has, starts = find_starts(oracle, active, labels, crit, rng, init_tries)
    active, starts = active[has], starts[has]
    cur = oracle.xf.copy()
    cur[active] = bisect(oracle, active, oracle.xf[active], starts, theta)
    dist = np.zeros(oracle.n)
    dist[active] = oracle.distances(np.rint(cur[active] * 255.0), active)
    stalls = np.zeros(oracle.n, dtype=np.int64)

    def draw(m: int) -> np.ndarray:
        return subspace_probes(rng, m, oracle.shape, subspace, int(ratio))

    t = 0
    while True:
        run = oracle.running()
        if not len(run):
            break
        t += 1
        before = oracle.sent(run)
        delta = np.full(len(run), FIRST_DELTA) if t == 1 else float(gamma) * dist[run]
        delta = np.maximum(delta, delta_min)
        want = min(int(init_evals * np.sqrt(t)), int(max_num_evals))
        counts = np.clip(oracle.remaining(run) - SEARCH_RESERVE, 1, want)
        normal, _ = probe_normals(oracle, run, cur[run], counts, delta, draw)
        grad = unit_or_random(normal, rng).reshape(cur[run].shape)
        moving = oracle.is_running(run)
        run, grad = run[moving], grad[moving]
        if len(run):
            stepped = geometric_step(oracle, run, cur[run], grad, dist[run] / np.sqrt(t))
            cur[run] = bisect(oracle, run, oracle.xf[run], stepped, theta)
            dist[run] = oracle.distances(np.rint(cur[run] * 255.0), run)
            stalls[run] = np.where(oracle.sent(run) > before[moving], 0, stalls[run] + 1)
            oracle.stop(run[stalls[run] >= MAX_STALLS], STOP_ITERATIONS)
    return oracle.results()


def run(ctx: AttackContext) -> list[AttackResult]:
    p = ctx.params
    return qeba_attack(ctx.decision_query(), ctx.images, ctx.labels, epsilon=p["epsilon"],
                       max_queries=p["max_queries"], rng=ctx.rng(), criterion=ctx.criterion,
                       spent=ctx.spent(), subspace=p["subspace"], ratio=p["ratio"])


SPEC = AttackSpec(
    id="qeba", minimal_norm=True, kind="decision", family="decision-based", norms=("l2",),
    refs=("IEEE-A8", "IEEE-A9", "IEEE-M6"),
    description="QEBA (Li et al. 2020; L2, decision-based, minimal-norm): HopSkipJump with "
                "the gradient estimated in a spatial (resize) or frequency (DCT) subspace; "
                "success = the criterion holds within L2 <= epsilon",
    params=(Param(name="epsilon", type="float", minimum=0.0, maximum=1e4,
                  description="L2 bound in [0,1] pixel scale (IEEE-A9)"), MAX_QUERIES,
            Param(name="subspace", type="string", default=SUBSPACE, choices=SUBSPACES,
                  description="probe subspace: resize (QEBA-S), dct (QEBA-F) or full"),
            Param(name="ratio", type="int", default=RATIO, minimum=1, maximum=64,
                  description="subspace side = image side / ratio")),
    targeted=True, run=run)
