"""What Fortis's minimal-norm decision-based attacks share (IEEE-A8, IEEE-A9, IEEE-M6):
Boundary, QEBA, qFool, GeoDA and SurFree. Each of those modules says how it searches; this
module owns how a point becomes a query and what the attack returns.

* **The oracle** (:class:`DecisionOracle`) is the only way these attacks reach the target:
  float points in [0, 1] (any batch of rows, each charged to the image it perturbs) are
  rounded to the uint8 image the target will receive, identical uint8 images are never asked
  twice for the same image (the answer is remembered), every row sent goes through
  :meth:`QueryBudget.ask` (counted per image, never past Q_m: rows an image has no budget
  left for are not sent and read "not adversarial"; that image has stopped with ``budget``).
  The target's answer is the criterion's decision (``ctx.decision_query()``, any task).
* **Best so far, first success.** Every row answered adversarial is a candidate: the oracle
  keeps, per image, the smallest-norm uint8 image answered adversarial (L2 or L-inf in [0, 1]
  scale, as ``common.arrays`` measures it), so the best never gets worse whatever the
  search does next; the image stops with ``success`` as soon as that best is within the plan's
  epsilon (IEEE-A9, IEEE-M6). What an attack returns is that best (or the original when it
  found none, ``success = False``): like HopSkipJump (``hsja.py``), a minimal-norm attack
  reports the smallest adversarial it found even when it is outside the bound, and only
  one within the bound is a success.
* **The clean image is the first query** (batched, counted); an image the target already
  answers adversarial stops there (``already_misclassified``, 1 query), whole batch included.
* **Starting points** (:func:`find_starts`): uniform noise (the papers' start) for
  ``INIT_TRIES`` queries, then the nearest other images of the batch (labelled differently,
  or of the target class for a targeted criterion), each verified by one counted query as
  this image's point; an image with none stops with ``iterations``. Then a binary search
  towards the original (:func:`bisect`) puts the start on the boundary.
* **Vectorised over the batch**: every search step asks one query call holding the rows of
  all images still running; loops are bounded (``MAX_BISECT_STEPS``, ``MAX_LINE_STEPS``)
  and attacks stop an image that sends nothing new for several rounds (``iterations``).
* **Subspaces** shared by QEBA, qFool, GeoDA and SurFree: orthonormal DCT-II matrices
  (:func:`dct_matrix`, low-frequency noise :func:`low_frequency_noise`, 8 x 8 block DCT) and
  bilinear upsampling matrices (:func:`resize_matrix`), plain numpy (no new dependency).

Domain code: no gRPC.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Literal

import numpy as np
from fortis.services.common.arrays import l2_distance, linf_distance
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.criteria import Criterion, TargetedMisclassification

from .base import (
    STOP_ALREADY_MISCLASSIFIED,
    STOP_ITERATIONS,
    STOP_SUCCESS,
    AttackResult,
    DecisionQuery,
    QueryBudget,
    check_batch,
    check_l2_epsilon,
    linf_levels,
    make_result,
)

__all__ = [
    "INIT_TRIES", "MAX_BISECT_STEPS", "MAX_LINE_STEPS", "DecisionOracle", "DistanceNorm",
    "bisect", "block_dct_matrix", "dct_matrix", "find_starts", "line_search",
    "low_frequency_noise", "min_probe_radius", "prepare", "probe_normals", "resize_matrix",
    "separable",
    "unit", "unit_or_random",
]

DistanceNorm = Literal["l2", "linf"]

INIT_TRIES = 25          # uniform-noise starting points tried per image (each one query)
FALLBACK_TRIES = 3       # other images of the batch tried per image after that (each one query)
MAX_BISECT_STEPS = 40    # binary-search halvings at most (quarter-level resolution comes first)
MAX_LINE_STEPS = 12      # a line search doubles its step at most this many times
BISECT_LEVELS = 0.25     # a binary search stops when its bracket is a quarter uint8 level wide
CHUNK_ELEMENTS = 1 << 23  # probe arrays are built in chunks of at most this many floats


def _key(img: np.ndarray) -> bytes:
    return hashlib.blake2b(img.tobytes(), digest_size=16).digest()


def unit(v: np.ndarray) -> np.ndarray:
    """Rows of ``v`` scaled to unit L2 norm (a zero row stays zero)."""
    flat = v.reshape(v.shape[0], -1)
    norm = np.sqrt(np.einsum("ij,ij->i", flat, flat))
    norm = np.where(norm > 0, norm, 1.0)
    return v / norm.reshape((-1,) + (1,) * (v.ndim - 1))


def min_probe_radius(d: int) -> float:
    """The smallest L2 radius ([0, 1] scale) at which a random probe of ``d`` values survives
    uint8 rounding on average (half a level per value), as ``hsja.py`` uses."""
    return 0.5 * float(np.sqrt(d)) / 255.0


class DecisionOracle:
    """The target's decision for a batch of images, counted, capped, remembered and
    best-tracking (module docstring). ``norm`` is the norm the attack minimises and the bound
    is in: ``"l2"`` (epsilon in [0, 1] scale) or ``"linf"`` (``linf_levels(epsilon)``)."""

    def __init__(self, query: DecisionQuery, images: np.ndarray, *, epsilon: float,
                 norm: DistanceNorm, max_queries: int, spent: np.ndarray | None) -> None:
        self.query = query
        self.x = images
        self.n = images.shape[0]
        self.shape = images.shape[1:]
        self.d = int(np.prod(self.shape))
        self.x64 = images.astype(np.float64)   # levels, for distances
        self.xf = self.x64 / 255.0
        self.norm = norm
        if norm == "l2":
            self.eps = check_l2_epsilon(epsilon)
            self.levels = -1
        elif norm == "linf":
            self.levels = linf_levels(epsilon)
            self.eps = self.levels / 255.0
        else:  # pragma: no cover - attacks pass a literal
            raise ValueError(f"unknown norm {norm!r}")
        self.qb = QueryBudget(self.n, max_queries, spent)
        self.best = images.copy()
        self.best_dist = np.full(self.n, np.inf)
        self.initially_correct: list[bool | None] = [None] * self.n
        self.memo: list[dict[bytes, bool]] = [{} for _ in range(self.n)]

    # -- state -------------------------------------------------------------------------------
    @property
    def found(self) -> np.ndarray:
        return np.isfinite(self.best_dist)

    def running(self) -> np.ndarray:
        """Indices still running (an image that spent Q_m stops here with ``budget``)."""
        return self.qb.running()

    def is_running(self, idx: np.ndarray) -> np.ndarray:
        stop = self.qb.stop
        return np.array([stop[int(i)] is None and self.qb.remaining(int(i)) > 0 for i in idx],
                        dtype=bool)

    def remaining(self, idx: Iterable[int]) -> np.ndarray:
        i = np.fromiter(idx, dtype=np.int64) if not isinstance(idx, np.ndarray) else \
            idx.astype(np.int64, copy=False)
        return self.qb.limit - self.qb.used[i]

    def sent(self, idx: Iterable[int]) -> np.ndarray:
        i = np.fromiter(idx, dtype=np.int64) if not isinstance(idx, np.ndarray) else \
            idx.astype(np.int64, copy=False)
        return self.qb.used[i] - self.qb.spent[i]

    def stop(self, idx: Iterable[int], reason: str) -> None:
        for i in idx:
            if self.qb.stop[int(i)] is None:
                self.qb.stop[int(i)] = reason

    def distances(self, imgs: np.ndarray, owner: np.ndarray) -> np.ndarray:
        """Distances ([0, 1] scale) of uint8 rows to their images' originals, in the norm."""
        if not len(owner):
            return np.zeros(0)
        diff = imgs.astype(np.float64) - self.x64[owner]
        flat = diff.reshape(len(owner), -1)
        if self.norm == "l2":
            return np.sqrt(np.einsum("ij,ij->i", flat, flat)) / 255.0
        return np.abs(flat).max(axis=1) / 255.0 if flat.shape[1] else np.zeros(len(owner))

    def may_be_within(self, i: int) -> bool:
        """False when image ``i``'s best distance is certainly outside the bound (the exact
        :meth:`within` test differs from :meth:`distances` only by rounding, far below the
        margin here): spares the exact measurement on every adversarial answer."""
        if self.norm == "l2":
            return bool(self.best_dist[i] <= self.eps * (1.0 + 1e-9) + 1e-12)
        return bool(self.best_dist[i] * 255.0 <= self.levels + 1e-6)

    def within(self, i: int, img: np.ndarray) -> bool:
        """Whether a uint8 image is within the bound of image ``i``, measured exactly as
        :func:`make_result` reports it."""
        if self.norm == "l2":
            return l2_distance(self.x[i], img) <= self.eps
        return linf_distance(self.x[i], img) * 255.0 <= self.levels + 1e-9

    # -- queries -----------------------------------------------------------------------------
    def start(self) -> np.ndarray:
        """Ask the clean images (one batched, counted query); those already adversarial stop
        with ``already_misclassified``. Returns the indices still running."""
        asked = self.running()
        if len(asked):
            got = self.qb.ask(self.query, self.x[asked].copy(), asked)
            if got is not None:
                dec = self._answers(got, len(asked))
                for k, i in enumerate(asked):
                    i = int(i)
                    self.initially_correct[i] = not bool(dec[k])
                    if dec[k]:
                        self.best_dist[i] = 0.0
                        self.qb.stop[i] = STOP_ALREADY_MISCLASSIFIED
                    else:
                        self.memo[i][_key(self.x[i])] = False
        return self.running()

    @staticmethod
    def _answers(got: np.ndarray, m: int) -> np.ndarray:
        dec = np.asarray(got).reshape(-1)
        if dec.shape[0] != m:
            raise InvalidArgument("decisions", f"query returned {dec.shape[0]} answers for "
                                  f"{m} images")
        return dec.astype(bool)

    def ask(self, points: np.ndarray, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Decisions for float ``points`` in [0, 1] (m x H x W x C), row k charged to image
        ``owner[k]``, judged on their uint8 rounding. Returns (decisions bool m, the uint8
        images m). Rows of stopped images, and rows past an image's budget, are not sent
        and read False."""
        owner = np.asarray(owner, dtype=np.int64)
        m = len(owner)
        lv = np.multiply(np.asarray(points), 255.0)   # np.clip(np.rint(...)), one temporary
        np.rint(lv, out=lv)
        np.clip(lv, 0, 255, out=lv)
        imgs = lv.astype(np.uint8)
        dec = np.zeros(m, dtype=bool)
        if m == 0:
            return dec, imgs
        keys = [_key(img) for img in imgs]
        stop = self.qb.stop
        room = {int(i): self.qb.remaining(int(i)) for i in np.unique(owner)
                if stop[int(i)] is None}
        pending: set[tuple[int, bytes]] = set()
        rows: list[int] = []
        for j in range(m):
            i = int(owner[j])
            if i not in room or keys[j] in self.memo[i] or (i, keys[j]) in pending:
                continue
            if room[i] <= 0:
                continue
            room[i] -= 1
            pending.add((i, keys[j]))
            rows.append(j)
        if rows:
            sel = np.asarray(rows, dtype=np.int64)
            got = self.qb.ask(self.query, imgs[sel], owner[sel])
            if got is not None:
                answers = self._answers(got, len(sel))
                for j, a in zip(rows, answers, strict=True):
                    self.memo[int(owner[j])][keys[j]] = bool(a)
                adv = sel[answers]
                if len(adv):
                    dist = self.distances(imgs[adv], owner[adv])
                    for j, dj in zip(adv, dist, strict=True):
                        i = int(owner[j])
                        if dj < self.best_dist[i]:
                            self.best_dist[i] = dj
                            self.best[i] = imgs[j]
                    for i in np.unique(owner[adv]):
                        i = int(i)
                        if stop[i] is None and self.may_be_within(i) and \
                                self.within(i, self.best[i]):
                            stop[i] = STOP_SUCCESS
        for j in range(m):
            dec[j] = self.memo[int(owner[j])].get(keys[j], False)
        return dec, imgs

    # -- results -----------------------------------------------------------------------------
    def results(self) -> list[AttackResult]:
        """One result per image: the best adversarial found (or the original), success when
        it is within the bound, the queries this attempt sent."""
        self.running()  # images that spent Q_m get their reason
        out = []
        for i in range(self.n):
            reason = self.qb.stop[i] or STOP_ITERATIONS
            found = bool(self.found[i])
            adv = self.best[i] if found else self.x[i]
            success = reason == STOP_ALREADY_MISCLASSIFIED or (found and self.within(i, adv))
            out.append(make_result(i, self.x[i], adv, success=success,
                                   queries=self.qb.sent(i),
                                   initially_correct=self.initially_correct[i],
                                   stop_reason=reason))
        return out


def prepare(query: DecisionQuery, images: np.ndarray, labels: np.ndarray, *, epsilon: float,
            norm: DistanceNorm, max_queries: int,
            spent: np.ndarray | None) -> tuple[DecisionOracle, np.ndarray, np.ndarray]:
    """Validate the batch, build the oracle and ask the clean images: (oracle, labels, indices
    still running)."""
    images, labels = check_batch(images, labels)
    oracle = DecisionOracle(query, images, epsilon=epsilon, norm=norm,
                            max_queries=max_queries, spent=spent)
    if oracle.n == 0:
        return oracle, labels, np.zeros(0, dtype=np.int64)
    return oracle, labels, oracle.start()


# --------------------------------------------------------------------------------------------
# Searches
# --------------------------------------------------------------------------------------------


def bisect(oracle: DecisionOracle, idx: np.ndarray, lo: np.ndarray, hi: np.ndarray,
           tol: float | np.ndarray = 0.0) -> np.ndarray:
    """Batched binary search on the segments ``lo -> hi`` (``lo`` not adversarial, ``hi``
    adversarial: float points in [0, 1]); returns, per image, the adversarial point closest to
    ``lo`` it found (the uint8 image answered adversarial, / 255). Stops when the bracket is a
    quarter level wide, or ``tol`` wide in units of the segment, or after
    ``MAX_BISECT_STEPS``; images that stop meanwhile keep their last bracket."""
    idx = np.asarray(idx, dtype=np.int64)
    out = np.array(hi, dtype=np.float64, copy=True)
    if not len(idx):
        return out
    span = np.abs(hi - lo).reshape(len(idx), -1).max(axis=1) * 255.0
    low = np.zeros(len(idx))
    high = np.ones(len(idx))
    thr = np.maximum(np.asarray(tol, dtype=np.float64),
                     BISECT_LEVELS / np.maximum(span, 1e-12))
    shape = (-1,) + (1,) * (hi.ndim - 1)
    for _ in range(MAX_BISECT_STEPS):
        act = np.flatnonzero((high - low > thr) & oracle.is_running(idx))
        if not len(act):
            break
        mid = (low[act] + high[act]) / 2.0
        pts = lo[act] + mid.reshape(shape) * (hi[act] - lo[act])
        dec, imgs = oracle.ask(np.clip(pts, 0.0, 1.0), idx[act])
        high[act] = np.where(dec, mid, high[act])
        low[act] = np.where(dec, low[act], mid)
        won = act[dec]
        out[won] = imgs[dec] / 255.0
    return out


def line_search(oracle: DecisionOracle, idx: np.ndarray, direction: np.ndarray,
                t0: np.ndarray, *, growth: float = 2.0,
                tol: float | np.ndarray = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """From each original along ``direction`` (rows, [0, 1] scale): ask ``x + t * direction``
    (clipped to [0, 1]) for ``t = t0, growth * t0, ...`` until adversarial (at most
    ``MAX_LINE_STEPS`` growths), then bisect between the last point that was not and that one
    (``tol`` as :func:`bisect`). Returns (found bool per row, boundary points; the original
    where none was found). With a sign direction ``t`` is the L-inf size of the step (GeoDA
    L-inf), with a unit one its L2 size."""
    idx = np.asarray(idx, dtype=np.int64)
    x = oracle.xf[idx]
    shape = (-1,) + (1,) * (x.ndim - 1)
    t = np.maximum(np.asarray(t0, dtype=np.float64), 1e-12).copy()
    lo_t = np.zeros(len(idx))
    found = np.zeros(len(idx), dtype=bool)
    hit = x.copy()
    todo = np.arange(len(idx))
    for _ in range(MAX_LINE_STEPS + 1):
        todo = todo[~found[todo] & oracle.is_running(idx[todo])]
        if not len(todo):
            break
        pts = np.clip(x[todo] + t[todo].reshape(shape) * direction[todo], 0.0, 1.0)
        dec, imgs = oracle.ask(pts, idx[todo])
        found[todo[dec]] = True
        hit[todo[dec]] = imgs[dec] / 255.0
        miss = todo[~dec]
        lo_t[miss] = t[miss]
        t[miss] *= growth
    out = x.copy()
    ok = np.flatnonzero(found)
    if len(ok):
        lo = np.clip(x[ok] + lo_t[ok].reshape(shape) * direction[ok], 0.0, 1.0)
        out[ok] = bisect(oracle, idx[ok], lo, hit[ok], tol)
    return found, out


def find_starts(oracle: DecisionOracle, idx: np.ndarray, labels: np.ndarray,
                criterion: Criterion, rng: np.random.Generator,
                init_tries: int = INIT_TRIES) -> tuple[np.ndarray, np.ndarray]:
    """Adversarial starting points for the images ``idx`` (module docstring): uniform noise,
    then the nearest suitable other images of the batch, each a counted query of this image.
    Returns (has bool per row, points float [0, 1]); images without one stop with
    ``iterations``."""
    idx = np.asarray(idx, dtype=np.int64)
    has = np.zeros(len(idx), dtype=bool)
    pts = oracle.xf[idx].copy()
    for _ in range(max(int(init_tries), 0)):
        todo = np.flatnonzero(~has & oracle.is_running(idx))
        if not len(todo):
            break
        noise = rng.uniform(0.0, 1.0, size=(len(todo), *oracle.shape))
        dec, imgs = oracle.ask(noise, idx[todo])
        has[todo[dec]] = True
        pts[todo[dec]] = imgs[dec] / 255.0
    todo = np.flatnonzero(~has & oracle.is_running(idx))
    if len(todo):
        targeted = isinstance(criterion, TargetedMisclassification)
        flat = oracle.x.reshape(oracle.n, -1).astype(np.float64)
        choices: dict[int, list[int]] = {}
        for k in todo:
            i = int(idx[k])
            dist = np.sqrt(np.sum((flat - flat[i]) ** 2, axis=1))
            same = np.all(flat == flat[i], axis=1)
            suits = labels == int(criterion.target) if targeted else labels != labels[i]
            order = [j for j in np.lexsort((dist, ~suits)) if not same[j]]
            choices[int(k)] = order[:FALLBACK_TRIES]
        for r in range(FALLBACK_TRIES):
            rows = [k for k in choices if len(choices[k]) > r and not has[k]
                    and oracle.is_running(idx[[k]])[0]]
            if not rows:
                break
            rk = np.asarray(rows, dtype=np.int64)
            cand = np.stack([oracle.xf[choices[int(k)][r]] for k in rk])
            dec, imgs = oracle.ask(cand, idx[rk])
            has[rk[dec]] = True
            pts[rk[dec]] = imgs[dec] / 255.0
    oracle.stop(idx[~has & oracle.is_running(idx)], STOP_ITERATIONS)
    return has, pts


def probe_normals(oracle: DecisionOracle, idx: np.ndarray, points: np.ndarray,
                  counts: np.ndarray, delta: np.ndarray,
                  draw: Callable[[int], np.ndarray], *,
                  baseline: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Monte-Carlo estimate of the boundary normal at each ``points[k]`` (pointing to the
    adversarial side; not normalised: (len(idx), d)) and the fraction of probes answered
    adversarial, per image: ``counts[k]`` probes
    ``points[k] + delta[k] * u`` with ``u = draw(m)`` (m unit directions), each answered
    adversarial (+1) or not (-1), averaged as ``mean(z * u)``; ``baseline`` subtracts the
    mean answer first (HopSkipJump / QEBA), without it the plain sign average (qFool, GeoDA).
    The probes used are the rounded ones actually sent; rows of all images share the query
    calls, built in chunks of at most ``CHUNK_ELEMENTS`` values."""
    shape = points.shape[1:]
    d = int(np.prod(shape))
    counts = np.asarray(counts, dtype=np.int64)
    owner = np.repeat(np.arange(len(idx)), counts)
    sum_frv = np.zeros((len(idx), d))
    sum_rv = np.zeros((len(idx), d))
    sum_f = np.zeros(len(idx))
    per = max(1, CHUNK_ELEMENTS // max(d, 1))
    for s in range(0, len(owner), per):
        own = owner[s:s + per]
        base = points[own]
        dl = delta[own].reshape((-1,) + (1,) * len(shape))
        dec, imgs = oracle.ask(np.clip(base + dl * draw(len(own)), 0.0, 1.0), idx[own])
        rv = ((imgs / 255.0 - base) / dl).reshape(len(own), d)
        f = 2.0 * dec - 1.0
        starts = np.flatnonzero(np.r_[True, own[1:] != own[:-1]])
        rows = own[starts]
        sum_frv[rows] += np.add.reduceat(f[:, None] * rv, starts, axis=0)
        sum_rv[rows] += np.add.reduceat(rv, starts, axis=0)
        sum_f[rows] += np.add.reduceat(f, starts)
    c = np.maximum(counts, 1).astype(np.float64)
    grad = sum_frv / c[:, None]
    mean_f = sum_f / c
    if baseline:
        mixed = np.abs(mean_f) < 1.0
        grad[mixed] -= (mean_f[mixed] / c[mixed])[:, None] * sum_rv[mixed]
    return grad, (mean_f + 1.0) / 2.0


def unit_or_random(v: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Rows of ``v`` (n x d) at unit norm; a zero or non-finite row becomes a random unit
    direction (a degenerate estimate)."""
    v = np.array(v, dtype=np.float64, copy=True)
    norm = np.sqrt(np.einsum("ij,ij->i", v, v))
    bad = ~np.isfinite(norm) | (norm < 1e-12)
    if bad.any():
        v[bad] = rng.standard_normal((int(bad.sum()), v.shape[1]))
        norm[bad] = np.sqrt(np.einsum("ij,ij->i", v[bad], v[bad]))
    return v / norm[:, None]


# --------------------------------------------------------------------------------------------
# Subspaces: DCT and bilinear resizing, as matrices
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=32)
def dct_matrix(n: int) -> np.ndarray:
    """The orthonormal DCT-II matrix ``C`` (n x n): ``C @ v`` is the DCT of ``v``, ``C.T @ c``
    its inverse (scipy's ``dct(norm='ortho')``)."""
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    c = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
    c[0] /= np.sqrt(2.0)
    c.setflags(write=False)
    return c


def low_frequency_noise(rng: np.random.Generator, m: int, shape: tuple[int, ...],
                        size: tuple[int, int]) -> np.ndarray:
    """``m`` images (m x H x W x C) whose 2-D DCT (per channel) is Gaussian on the lowest
    ``size = (h, w)`` frequencies and 0 elsewhere: random directions in the low-frequency
    subspace (QEBA-F, qFool's and GeoDA's subspaces)."""
    hh, ww, cc = shape
    h, w = min(size[0], hh), min(size[1], ww)
    coef = rng.standard_normal((m, h, w, cc))
    return separable(dct_matrix(hh)[:h].T, coef, dct_matrix(ww)[:w])


def separable(left: np.ndarray, v: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``left @ v[k, :, :, c] @ right`` for every image ``k`` and channel ``c`` of ``v``
    (m x h x w x C -> m x H x W x C; ``left`` H x h, ``right`` w x W), as two plain 2-D BLAS
    products on contiguous arrays (an ``einsum`` over four indices, or ``matmul`` on strided
    stacks, falls back to slow loops: seconds per call on 224 x 224 images)."""
    m, h, w, c = v.shape
    big_h, big_w = left.shape[0], right.shape[1]
    t = np.ascontiguousarray(np.swapaxes(v, 2, 3)).reshape(m * h * c, w) @ right
    t = np.ascontiguousarray(t.reshape(m, h, c * big_w).transpose(1, 0, 2)).reshape(h, -1)
    out = (left @ t).reshape(big_h, m, c, big_w)
    return np.ascontiguousarray(out.transpose(1, 0, 3, 2))


@lru_cache(maxsize=32)
def resize_matrix(out: int, inp: int) -> np.ndarray:
    """Bilinear interpolation matrix (out x inp), half-pixel centres and edge clamping (as
    scikit-image's ``resize(order=1)`` upsamples): ``A @ v`` resizes ``v``."""
    a = np.zeros((out, inp))
    s = np.clip((np.arange(out) + 0.5) * inp / out - 0.5, 0.0, inp - 1.0)
    lo = np.floor(s).astype(np.int64)
    hi = np.minimum(lo + 1, inp - 1)
    f = s - lo
    a[np.arange(out), lo] += 1.0 - f
    a[np.arange(out), hi] += f
    a.setflags(write=False)
    return a


def block_dct_matrix(n: int, block: int = 8) -> np.ndarray:
    """The orthonormal ``block x block`` DCT applied to every block of a length-``n`` signal
    (the last block may be shorter: it gets its own smaller DCT), as one n x n matrix."""
    m = np.zeros((n, n))
    for s in range(0, n, block):
        e = min(s + block, n)
        m[s:e, s:e] = dct_matrix(e - s)
    return m
