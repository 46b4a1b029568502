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
from dataclasses import dataclass

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

@dataclass(frozen=True)
class Sparse:
    """One iteration's unit directions given by their support (what SimBA's own bases are):
    ``flat`` (m,) the one coordinate of each direction (pixel basis, value 1); or ``chan``
    (m,) the channel each direction lies in and ``plane`` (m x H x W) its values there (DCT
    basis: a 2-D basis image in one channel, 0 in the others)."""

    flat: np.ndarray | None = None
    chan: np.ndarray | None = None
    plane: np.ndarray | None = None


#: ``directions(k, idx, delta) -> unit directions`` (float64, [0, 1] scale, one per image of
#: ``idx``: a dense ``m x H x W x C`` array or :class:`Sparse`) for iteration ``k``, given the
#: images' accepted perturbations ``delta`` (levels, m x H x W x C), or None when the basis
#: is exhausted.
Directions = Callable[[int, np.ndarray, np.ndarray], "np.ndarray | Sparse | None"]

#: A candidate whose squared L2 norm, computed incrementally, is below this fraction of the
#: rounding limit's square is inside the ball whatever the summation order (incremental
#: sums differ from numpy's pairwise ones by ~1e-13 relative): no scaling, exact fast path.
INSIDE = 1.0 - 1e-9


class _Accepted:
    """Per image, what every candidate of the sparse fast path starts from: the accepted
    perturbation ``delta`` (float levels, as the dense loop keeps it), its rounding ``r =
    rint(delta)`` (int16), ``sum r^2`` (exact: integers), ``sum delta^2`` and the uint8 image
    ``x + r``. A candidate differs from ``delta`` only on its direction's support, so its
    rounding, its integer ``sum r^2`` and its image are ``delta``'s with that support
    replaced, exactly what rounding the whole candidate gives when no scaling applies."""

    def __init__(self, x: np.ndarray) -> None:
        n = x.shape[0]
        self.d = int(np.prod(x.shape[1:]))
        self.x = x.reshape(n, self.d)
        self.xf = self.x.astype(np.float64)
        self.delta = np.zeros((n, self.d), dtype=np.float64)
        self.r = np.zeros((n, self.d), dtype=np.int16)
        self.rsq = np.zeros(n, dtype=np.int64)
        self.dsq = np.zeros(n, dtype=np.float64)
        self.img = self.x.copy()

    def set_rows(self, idx: np.ndarray, delta: np.ndarray) -> None:
        """Accept dense perturbations (rows of ``idx``)."""
        self.delta[idx] = delta
        r = np.rint(delta)
        self.r[idx] = r
        self.rsq[idx] = np.einsum("ij,ij->i", r, r).astype(np.int64)
        self.dsq[idx] = np.einsum("ij,ij->i", delta, delta)
        self.img[idx] = (self.xf[idx] + r).astype(np.uint8)


class _Support:
    """Reading and writing the support of directions ``todo`` on rows ``idx`` of an
    ``n x D`` array (``D`` = H x W x C, channels last): one coordinate per row (pixel basis),
    or one channel's H x W values per row, read as a strided slice per channel."""

    def __init__(self, q: Sparse, todo: np.ndarray, idx: np.ndarray, channels: int) -> None:
        self.idx, self.c = idx, channels
        self.flat = None if q.flat is None else q.flat[todo]
        self.groups: list[tuple[np.ndarray, int]] = []
        if q.chan is not None:
            ch = q.chan[todo]
            self.groups = [(np.flatnonzero(ch == c0), int(c0)) for c0 in np.unique(ch)]

    def get(self, arr: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        sel = np.arange(len(self.idx)) if rows is None else rows
        if self.flat is not None:
            return arr[self.idx[sel], self.flat[sel]][:, None]
        a3 = arr.reshape(arr.shape[0], -1, self.c)
        out = np.empty((len(sel), a3.shape[1]), dtype=arr.dtype)
        pos = np.full(len(self.idx), -1, dtype=np.int64)
        pos[sel] = np.arange(len(sel))
        for g, c0 in self.groups:
            g = g[pos[g] >= 0]
            out[pos[g]] = a3[self.idx[g], :, c0]
        return out

    def put(self, arr: np.ndarray, values: np.ndarray, rows: np.ndarray) -> None:
        """``arr``'s support of rows ``rows`` (positions in ``idx``) set to ``values``
        (len(rows) x s); ``arr`` is indexed by image (``idx[rows]``)."""
        self._put(arr, values, rows, self.idx)

    def put_local(self, arr: np.ndarray, values: np.ndarray, rows: np.ndarray) -> None:
        """As :meth:`put` on an array whose row k is image ``idx[k]`` (a batch)."""
        self._put(arr, values, rows, None)

    def _put(self, arr: np.ndarray, values: np.ndarray, rows: np.ndarray,
             image_of: np.ndarray | None) -> None:
        """:meth:`put` with ``arr``'s row of support row r at ``image_of[r]`` (None: r)."""
        def at(r: np.ndarray) -> np.ndarray:
            return r if image_of is None else image_of[r]

        if self.flat is not None:
            arr[at(rows), self.flat[rows]] = values[:, 0]
            return
        a3 = arr.reshape(arr.shape[0], -1, self.c)
        pos = np.full(len(self.idx), -1, dtype=np.int64)
        pos[rows] = np.arange(len(rows))
        for g, c0 in self.groups:
            g = g[pos[g] >= 0]
            a3[at(g), :, c0] = values[pos[g]]


def _sparse_trial(acc: _Accepted, sup: _Support, q: Sparse, todo: np.ndarray,
                  sign: int, step_lv: float,
                  eps_lv: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Candidates ``delta + sign * step * q`` for images ``sup.idx``: (uint8 images to send,
    the float candidates' support values, a mask of the rows that left the fast path, whose
    images must come from the dense computation)."""
    idx = sup.idx
    old = sup.get(acc.delta)                                      # m x s
    if q.flat is not None:
        cand = old + sign * step_lv * np.ones_like(old)
    else:
        assert q.plane is not None
        cand = old + sign * step_lv * q.plane[todo].reshape(len(todo), -1)
    xs = sup.get(acc.xf)
    np.maximum(cand, -xs, out=cand)
    np.minimum(cand, 255.0 - xs, out=cand)
    approx = acc.dsq[idx] - np.sum(old * old, axis=1) + np.sum(cand * cand, axis=1)
    limit = eps_lv * (1.0 - 1e-12)
    fast = approx < INSIDE * limit * limit
    r = np.rint(cand)
    r_old = sup.get(acc.r).astype(np.int64)
    rsq = acc.rsq[idx] - np.sum(r_old * r_old, axis=1) + \
        np.sum(r * r, axis=1).astype(np.int64)
    fast &= rsq <= limit * limit                                  # round_into_l2's excess <= 0
    imgs = acc.img[idx]
    f = np.flatnonzero(fast)
    sup.put_local(imgs, (xs[f] + r[f]).astype(np.uint8), f)
    return imgs, cand, ~fast


def simba_search(run: ScoreRun, directions: Directions, *, step_size: float, epsilon: float,
                 signs: Sequence[int]) -> None:
    """The SimBA loop on a started :class:`ScoreRun` (clean margins asked): for each running
    image, try ``delta + sign * step * q`` for each sign in turn, keep the first that lowers
    the margin. ``delta`` (float, uint8 levels) starts at 0; candidates are rounded into the
    L2 ball of radius ``epsilon``. Ends when every image stopped or ``directions`` is
    exhausted (those images stop with ``iterations``). Used by SimBA and SimBA-ODS.

    Sparse directions (SimBA's bases) take a fast path that touches only each direction's
    support while the candidate lies well inside the ball (no scaling, nothing to round back),
    and gives the same images as the dense computation, which every other candidate takes."""
    x = run.images
    shape = x.shape[1:]
    eps_lv = l2_levels(epsilon)
    step_lv = float(step_size) * 255.0
    acc = _Accepted(x)
    current = run.best_margin.copy()       # margin of the accepted delta (clean at start)
    if eps_lv < 1.0:                       # no uint8 change fits in the ball
        run.finish(STOP_ITERATIONS)
        return
    k = 0
    while True:
        active = run.running()
        if not len(active):
            return
        q = directions(k, active, acc.delta[active].reshape((len(active),) + shape))
        if q is None:
            run.finish(STOP_ITERATIONS, active)
            return
        todo = np.arange(len(active))
        for sign in signs:
            if not len(todo):
                break
            idx = active[todo]
            if isinstance(q, Sparse):
                sup = _Support(q, todo, idx, shape[2])
                batch, support, dense_rows = _sparse_trial(acc, sup, q, todo, sign, step_lv,
                                                           eps_lv)
                slow = np.flatnonzero(dense_rows)
                cand = None
                if len(slow):
                    cand = acc.delta[idx[slow]]
                    _put_rows(sup, cand, support[slow], slow)
                    cand = _scaled(cand, eps_lv)
                    batch[slow] = round_into_l2(x[idx[slow]],
                                                cand.reshape((len(slow),) + shape),
                                                eps_lv).reshape(len(slow), -1)
                m = run.ask(idx, batch.reshape((len(idx),) + shape))
                if m is None:
                    break
                improved = m < current[idx]
                current[idx[improved]] = m[improved]
                ok = np.flatnonzero(improved & ~dense_rows)
                if len(ok):
                    new = support[ok]
                    acc.dsq[idx[ok]] += np.sum(new * new, axis=1) - \
                        np.sum(sup.get(acc.delta, ok) ** 2, axis=1)
                    sup.put(acc.delta, new, ok)
                    r = np.rint(new)
                    r_old = sup.get(acc.r, ok).astype(np.int64)
                    acc.rsq[idx[ok]] += np.sum(r * r, axis=1).astype(np.int64) - \
                        np.sum(r_old * r_old, axis=1)
                    sup.put(acc.r, r.astype(np.int16), ok)
                    sup.put(acc.img, (sup.get(acc.xf, ok) + r).astype(np.uint8), ok)
                if cand is not None:
                    slow_ok = np.flatnonzero(improved[slow])
                    acc.set_rows(idx[slow[slow_ok]], cand[slow_ok])
            else:
                cand = acc.delta[idx] + sign * step_lv * q[todo].reshape(len(idx), -1)
                xi = acc.xf[idx]
                np.maximum(cand, -xi, out=cand)        # inside [0, 255] (np.clip with array
                np.minimum(cand, 255.0 - xi, out=cand)  # bounds is several times slower)
                cand = _scaled(cand, eps_lv)
                m = run.ask(idx, round_into_l2(x[idx], cand.reshape((len(idx),) + shape),
                                               eps_lv))
                if m is None:
                    break
                improved = m < current[idx]
                current[idx[improved]] = m[improved]
                acc.set_rows(idx[improved], cand[improved])
            left = np.array([run.stop[int(i)] is None for i in idx]) & ~improved
            left &= run.remaining(idx) > 0
            todo = todo[left]
        k += 1


def _put_rows(sup: _Support, dense: np.ndarray, values: np.ndarray, rows: np.ndarray) -> None:
    """Write the support values of ``rows`` (positions in ``sup.idx``) into ``dense``, whose
    row k belongs to ``rows[k]``."""
    tmp = np.empty((len(sup.idx),) + dense.shape[1:], dtype=dense.dtype)
    tmp[rows] = dense
    sup.put_local(tmp, values, rows)
    dense[:] = tmp[rows]


def _scaled(cand: np.ndarray, eps_lv: float) -> np.ndarray:
    """Rows (m x D) scaled back onto the L2 ball of radius ``eps_lv`` where outside it."""
    norm = np.sqrt(np.sum(cand ** 2, axis=1))
    scale = np.where(norm > eps_lv, eps_lv / np.maximum(norm, 1e-300), 1.0)
    cand *= scale[:, None]
    return cand


def _basis_directions(rng: np.random.Generator, n: int, shape: tuple[int, int, int],
                      basis: str, freq_ratio: float, stride_ratio: float,
                      length: int) -> Directions:
    """The SimBA / SimBA-DCT direction of iteration k for each image: a unit vector of its
    own random order over the pixel or DCT basis (:class:`Sparse`: its support only)."""
    h, w, c = shape
    d = h * w * c
    length = min(length, d)
    if basis == "pixel":
        order = np.stack([rng.permutation(d)[:length] for _ in range(n)]) if n else \
            np.zeros((0, length), dtype=np.int64)
    else:
        order = low_frequency_order(rng, n, shape, freq_ratio, stride_ratio, length)
    dh, dw = dct_matrix(h), dct_matrix(w)

    def directions(k: int, idx: np.ndarray, _delta: np.ndarray) -> Sparse | None:
        if k >= length:
            return None
        flat = order[idx, k]
        if basis == "pixel":
            return Sparse(flat=flat)
        u, rest = np.divmod(flat, w * c)
        v, ch = np.divmod(rest, c)
        return Sparse(chan=ch, plane=dh[u][:, :, None] * dw[v][:, None, :])

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
