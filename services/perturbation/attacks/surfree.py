"""SurFree, decision-based, L2, untargeted (IEEE-A8, IEEE-A9, IEEE-M6; Maho, Furon, Le Merrer,
"SurFree: a fast surrogate-free black-box attack", CVPR 2021).

No gradient estimate: from the current adversarial ``x_b`` at distance ``r`` from the original
``x`` (unit direction ``u``), SurFree draws a new direction ``v`` orthogonal to ``u`` and to the
directions it tried before, and searches the circle through ``x`` and ``x_b`` in the plane
``(u, v)``: the point at angle ``theta``, ``x + r cos(theta) (cos(theta) u + sin(theta) v)``,
is at distance ``r cos(theta) < r`` from ``x``. Angles ``+-theta_max (1 - i/T)``, ``i = 0..T-1``,
are asked in turn until one is adversarial; none: ``theta_max`` shrinks by ``rho`` and a new
direction is drawn; one: ``theta_max`` grows by ``1 / rho`` and a binary search on the angle
(between it and the next angle out, which was not adversarial) refines it until
``1 - cos(theta)`` is known within ``bs_gamma``, at most ``bs_max_iteration`` halvings. The
point found is the new ``x_b``. Directions: the 8 x 8 block DCT of the original (per
channel), its lowest half of each block's zig-zag frequencies kept (``frequence_range (0,
0.5)``, function "constant": every non-zero coefficient becomes 1), each multiplied by a
random draw in {-1, 0, 1} and transformed back. Parameters are the authors' (config_example:
``theta_max = 30`` degrees, ``T = 3``, ``rho = 0.98``, ``n_ortho = 100``, ``bs_gamma = 0.01``,
``bs_max_iteration = 10``). Untargeted, as the paper.

Differences, all on purpose (shared conventions in ``_decision.py``):

* Start: uniform noise (the authors blend uniform noise linearly, 10 steps), then the batch's
  other images (each a counted query), then a binary search to the boundary (the authors
  start from the coarse blend).
* The angle binary search does not also ask the opposite angle at every halving (the
  authors' code asks ``f(-mid)`` too, doubling its cost, to switch sides when that is
  adversarial); the unbounded loops of the reference (drawing directions until one works,
  extending the angle while adversarial) are bounded (``MAX_DRAWS`` per step, 90 degrees).
* uint8: points are rounded to what the target receives (identical images never asked
  twice); an image that sends nothing new for ``MAX_STALLS`` steps stops (``iterations``).
* Memory: the orthogonalisation keeps at most ``n_ortho`` past directions per image, fewer
  when the batch's directions would exceed ``DIRECTION_MEMORY`` bytes (large images).
* The clean image is the first query; each image stops at its first success (L2 within
  epsilon) or Q_m. Batched: every angle asked is one query call for all images searching.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.params import Param
from fortis.services.perturbation.criteria import Criterion, Misclassification

from ._decision import (
    INIT_TRIES,
    DecisionOracle,
    bisect,
    block_dct_matrix,
    find_starts,
    prepare,
    separable,
)
from .base import (
    MAX_QUERIES,
    STOP_ITERATIONS,
    AttackContext,
    AttackResult,
    AttackSpec,
    DecisionQuery,
)

# Parameters of the authors' implementation (SurFree config_example.json).
THETA_MAX = 30.0          # degrees
T = 3                     # angles +-theta_max * (1 - i/T) evaluated per direction
RHO = 0.98                # theta_max shrinks by rho on a failed direction, grows by 1/rho
N_ORTHO = 100             # past directions the new one is orthogonal to
BS_GAMMA = 0.01           # angle binary search until 1 - cos(theta) is known within this
BS_MAX_ITERATION = 10     # angle binary search halvings at most
FREQUENCE_RANGE = 0.5     # lowest fraction of each 8 x 8 block's zig-zag frequencies used
BLOCK = 8
MAX_DRAWS = 50            # directions drawn per step at most
MAX_EXTEND = 8            # angle extensions beyond theta_max at most (and never past 90)
MAX_STALLS = 5            # steps in a row that send nothing stop an image
DIRECTION_MEMORY = 512 << 20  # bytes of past directions kept for the whole batch at most


@lru_cache(maxsize=8)
def zigzag_mask(fraction: float, block: int = BLOCK) -> np.ndarray:
    """The lowest ``fraction`` of a ``block x block`` DCT block's coefficients in zig-zag
    order (the authors' ``get_zig_zag_mask``)."""
    order = sorted((i + j, i if (i + j) % 2 else j, i, j)
                    for i in range(block) for j in range(block))
    keep = int(block * block * fraction)
    mask = np.zeros((block, block), dtype=bool)
    for _s, _k, i, j in order[:keep]:
        mask[i, j] = True
    mask.setflags(write=False)
    return mask


class _Directions:
    """Random DCT directions for each image, orthogonal to its past directions."""

    def __init__(self, oracle: DecisionOracle, n_ortho: int, rng: np.random.Generator) -> None:
        h, w, c = oracle.shape
        self.rng = rng
        self.bh, self.bw = block_dct_matrix(h, BLOCK), block_dct_matrix(w, BLOCK)
        zz = zigzag_mask(FREQUENCE_RANGE)
        tile = np.tile(zz, (-(-h // BLOCK), -(-w // BLOCK)))[:h, :w]
        coef = separable(self.bh, oracle.xf, self.bw.T)
        self.mask = (np.abs(coef) > 0) & tile[None, :, :, None]
        per_image = max(1, DIRECTION_MEMORY // max(1, oracle.n * oracle.d * 4))
        self.keep = max(1, min(int(n_ortho), per_image))
        # per image: slot 0 the first direction, then a ring of the last ``keep`` drawn
        # (zero rows: none yet); pages are only touched as directions are stored
        self.basis = np.zeros((oracle.n, self.keep + 1, oracle.d), dtype=np.float32)
        self.pos = np.zeros(oracle.n, dtype=np.int64)

    def draw(self, idx: np.ndarray, u: np.ndarray) -> np.ndarray:
        """New unit directions (len(idx) x d), orthogonal to ``u`` (rows, unit) and to the
        images' past directions; remembered as past directions."""
        m = len(idx)
        signs = self.rng.integers(-1, 2, size=(m, *self.mask.shape[1:]))
        coef = self.mask[idx] * signs
        v = separable(self.bh.T, coef.astype(np.float64), self.bw).reshape(m, -1)
        o = self.basis[idx]                                       # m x (keep + 1) x d
        v -= np.matmul(np.matmul(o, v[:, :, None].astype(np.float32))[:, :, 0][:, None, :],
                       o)[:, 0, :]
        v -= np.einsum("ij,ij->i", v, u)[:, None] * u
        norm = np.sqrt(np.einsum("ij,ij->i", v, v))
        bad = norm < 1e-12
        if bad.any():  # a flat image or an exhausted subspace: a Gaussian direction instead
            g = self.rng.standard_normal((int(bad.sum()), v.shape[1]))
            g -= np.einsum("ij,ij->i", g, u[bad])[:, None] * u[bad]
            v[bad] = g
            norm[bad] = np.sqrt(np.einsum("ij,ij->i", g, g))
        v /= norm[:, None]
        self.basis[idx, 1 + self.pos[idx]] = v
        self.pos[idx] = (self.pos[idx] + 1) % self.keep
        return v

    def set_first(self, i: int, u: np.ndarray) -> None:
        self.basis[i, 0] = u


def _circle(x: np.ndarray, r: np.ndarray, u: np.ndarray, v: np.ndarray,
            theta: np.ndarray) -> np.ndarray:
    """``x + r cos(theta) (cos(theta) u + sin(theta) v)`` (theta in degrees), clipped."""
    t = np.deg2rad(theta)[:, None]
    pts = x + (r[:, None] * np.cos(t)) * (np.cos(t) * u + np.sin(t) * v)
    return np.clip(pts, 0.0, 1.0)


def surfree_attack(query: DecisionQuery, images: np.ndarray, labels: np.ndarray, *,
                   epsilon: float, max_queries: int, rng: np.random.Generator,
                   criterion: Criterion | None = None, spent: np.ndarray | None = None,
                   theta_max: float = THETA_MAX, steps_per_direction: int = T,
                   rho: float = RHO, n_ortho: int = N_ORTHO, bs_gamma: float = BS_GAMMA,
                   bs_max_iteration: int = BS_MAX_ITERATION,
                   init_tries: int = INIT_TRIES) -> list[AttackResult]:
    """Run SurFree (L2) on a batch through a decision query; one :class:`AttackResult` per
    image, in order (IEEE-A8, IEEE-M6)."""
    if not np.isfinite(theta_max) or not 0.0 < theta_max < 90.0:
        raise InvalidArgument("theta_max", f"must be in (0, 90) degrees, got {theta_max!r}")
    if int(steps_per_direction) < 1:
        raise InvalidArgument("steps_per_direction", "must be >= 1")
    if not np.isfinite(rho) or not 0.0 < rho <= 1.0:
        raise InvalidArgument("rho", f"must be in (0, 1], got {rho!r}")
    if int(n_ortho) < 0 or int(bs_max_iteration) < 0 or not bs_gamma > 0:
        raise InvalidArgument("n_ortho", "n_ortho, bs_max_iteration must be >= 0, "
                                         "bs_gamma > 0")
    crit = criterion if criterion is not None else Misclassification()
    oracle, labels, active = prepare(query, images, labels, epsilon=epsilon, norm="l2",
                                     max_queries=max_queries, spent=spent)
    if not len(active):
        return oracle.results()
    has, starts = find_starts(oracle, active, labels, crit, rng, init_tries)
    active, starts = active[has], starts[has]
    n, d = oracle.n, oracle.d
    xf = oracle.xf.reshape(n, d)
    cur = xf.copy()
    if len(active):
        cur[active] = bisect(oracle, active, oracle.xf[active],
                             starts).reshape(len(active), d)
    dirs = _Directions(oracle, int(n_ortho), rng)
    for i in active:
        off = cur[i] - xf[i]
        dirs.set_first(int(i), off / max(float(np.linalg.norm(off)), 1e-300))
    tmax = np.full(n, float(theta_max))
    stalls = np.zeros(n, dtype=np.int64)
    tt = int(steps_per_direction)
    shape = oracle.shape

    def ask(idx: np.ndarray, pts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        dec, imgs = oracle.ask(pts.reshape(len(idx), *shape), idx)
        return dec, imgs.reshape(len(idx), d) / 255.0

    while True:
        run = oracle.running()
        if not len(run):
            break
        before = oracle.sent(run)
        off = cur[run] - xf[run]
        r = np.sqrt(np.einsum("ij,ij->i", off, off))
        u = off / np.maximum(r, 1e-300)[:, None]
        v = np.zeros_like(u)
        theta = np.zeros(len(run))         # the adversarial angle found (0: none yet)
        used = np.zeros(len(run))          # theta_max the angle was found with
        best_pt = cur[run].copy()
        for _ in range(MAX_DRAWS):
            todo = np.flatnonzero((theta == 0) & oracle.is_running(run))
            if not len(todo):
                break
            v[todo] = dirs.draw(run[todo], u[todo])
            for i in range(tt):
                for sign in (1.0, -1.0):
                    ask_k = todo[(theta[todo] == 0) & oracle.is_running(run[todo])]
                    if not len(ask_k):
                        break
                    th = sign * tmax[run[ask_k]] * (1.0 - i / tt)
                    dec, pts = ask(run[ask_k], _circle(xf[run[ask_k]], r[ask_k], u[ask_k],
                                                      v[ask_k], th))
                    won = ask_k[dec]
                    theta[won] = th[dec]
                    used[won] = tmax[run[won]]
                    best_pt[won] = pts[dec]
            failed = todo[theta[todo] == 0]
            tmax[run[failed]] *= rho
            got = todo[theta[todo] != 0]
            tmax[run[got]] = np.minimum(tmax[run[got]] / rho, 89.0)
        # the angle binary search between the adversarial angle and the next one out
        k = np.flatnonzero(theta != 0)
        lower = theta[k].copy()
        step = used[k] / tt
        at_max = np.isclose(np.abs(lower), used[k])
        upper = lower + np.sign(lower) * step
        for _ in range(MAX_EXTEND):       # found at theta_max: extend while adversarial
            e = np.flatnonzero(at_max & (np.abs(upper) < 90.0) & oracle.is_running(run[k]))
            if not len(e):
                break
            dec, pts = ask(run[k[e]], _circle(xf[run[k[e]]], r[k[e]], u[k[e]], v[k[e]],
                                              upper[e]))
            won = e[dec]
            lower[won] = upper[won]
            best_pt[k[won]] = pts[dec]
            upper[won] = np.clip(upper[won] + np.sign(upper[won]) * step[won], -90.0, 90.0)
            at_max[e[~dec]] = False
        for _ in range(int(bs_max_iteration)):
            alpha = np.abs(np.cos(np.deg2rad(upper)) - np.cos(np.deg2rad(lower)))
            b = np.flatnonzero((alpha > bs_gamma) & oracle.is_running(run[k]))
            if not len(b):
                break
            mid = (upper[b] + lower[b]) / 2.0
            dec, pts = ask(run[k[b]], _circle(xf[run[k[b]]], r[k[b]], u[k[b]], v[k[b]], mid))
            lower[b[dec]] = mid[dec]
            best_pt[k[b[dec]]] = pts[dec]
            upper[b[~dec]] = mid[~dec]
        new_off = best_pt[k] - xf[run[k]]
        closer = np.sqrt(np.einsum("ij,ij->i", new_off, new_off)) < r[k]
        cur[run[k[closer]]] = best_pt[k[closer]]
        stalls[run] = np.where(oracle.sent(run) > before, 0, stalls[run] + 1)
        oracle.stop(run[stalls[run] >= MAX_STALLS], STOP_ITERATIONS)
    return oracle.results()


def run(ctx: AttackContext) -> list[AttackResult]:
    p = ctx.params
    return surfree_attack(ctx.decision_query(), ctx.images, ctx.labels, epsilon=p["epsilon"],
                          max_queries=p["max_queries"], rng=ctx.rng(), criterion=ctx.criterion,
                          spent=ctx.spent(), theta_max=p["theta_max"])


SPEC = AttackSpec(
    id="surfree", minimal_norm=True, kind="decision", family="decision-based", norms=("l2",),
    refs=("IEEE-A8", "IEEE-A9", "IEEE-M6"),
    description="SurFree (Maho et al. 2021; L2, decision-based, minimal-norm): circular "
                "search on the boundary along random DCT directions, no gradient estimate; "
                "success = the criterion holds within L2 <= epsilon",
    params=(Param(name="epsilon", type="float", minimum=0.0, maximum=1e4,
                  description="L2 bound in [0,1] pixel scale (IEEE-A9)"), MAX_QUERIES,
            Param(name="theta_max", type="float", default=THETA_MAX, minimum=0.1,
                  maximum=89.0, description="initial largest angle of the circular search "
                                            "(degrees)")),
    run=run)
