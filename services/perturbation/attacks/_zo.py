"""What the score-based gradient-estimation attacks share (IEEE-A8, IEEE-A9, IEEE-M6): ZOO,
NES, NGD, RGF, P-RGF, SignHunter and Bandits.

Each of them keeps a float iterate per image in uint8 *level* space (``0..255``), builds
candidate images around it (finite-difference probes, sign flips, coordinate probes) and asks
the target for the criterion's margin on them. :class:`ZoSearch` owns what must be identical
for all of them, on top of :class:`~.base.QueryBudget`:

* **The bound (IEEE-A9).** Every image sent is first made feasible (:meth:`ZoSearch.feasible`):
  L-inf: rounded to the nearest level and clipped to ``[x - e, x + e] & [0, 255]`` with
  ``e = floor(epsilon * 255 + 1e-6)`` levels; L2: the difference to ``x`` scaled onto the ball
  ``||(adv - x) / 255||_2 <= epsilon`` when outside it, truncated towards ``x`` (as
  ``base.project_l2``: rounding to nearest could leave the ball) and clipped to ``[0, 255]``.
  So every query lies within the bound, and any query the target answers with a margin
  < 0 is a success within the bound: an attack's probes double as success checks. (An
  attack whose paper probes outside the ball, Bandits, says so: such rows are asked with
  ``credit=False`` and never count as a success nor become the adversarial.)
* **The budget (IEEE-M6).** The clean image is the first query and is counted; an image
  already adversarial stops there (``already_misclassified``). :meth:`ZoSearch.ask` goes through
  ``QueryBudget.ask``; it judges every row of the answer and stops an image at the call where
  one of its rows succeeded, keeping that row (the lowest margin when several did) as its
  adversarial. Attacks size their calls by :meth:`ZoSearch.remaining`, never past Q_m.
* **What is returned.** The successful image, else the lowest-margin image the target
  answered for that index (within the bound, never an unqueried point), else the original.
* **Batches.** State is per image; one call carries the rows of every image still running,
  split into :func:`chunks` so a call's probes stay within ``CHUNK_ELEMENTS`` floats.

Domain code: no gRPC. Attacks use ``ctx.margin_query()`` only (NGD, whose Fisher information
needs the class probabilities, is the documented exception: see ``ngd.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, Literal

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.params import Param

from .base import (
    STOP_ALREADY_MISCLASSIFIED,
    STOP_ITERATIONS,
    STOP_SUCCESS,
    AttackResult,
    MarginQuery,
    QueryBudget,
    check_batch,
    check_l2_epsilon,
    linf_levels,
    make_result,
)

ZoNorm = Literal["linf", "l2"]
#: The L2 bound's parameter (as HopSkipJump's): ``||(adv - x) / 255||_2 <= epsilon``.
EPSILON_L2 = Param(name="epsilon", type="float", minimum=0.0, maximum=1e4,
                   description="L2 bound in [0,1] pixel scale (IEEE-A9)")
CHUNK_ELEMENTS: Final = 1 << 24  # floats of candidate images per query call (memory bound)


def chunks(idx: np.ndarray, rows_per_image: int, d: int) -> Iterator[np.ndarray]:
    """Split ``idx`` so that ``len(part) * rows_per_image * d <= CHUNK_ELEMENTS`` (at least
    one image per part)."""
    per = max(1, CHUNK_ELEMENTS // max(1, rows_per_image * d))
    for s in range(0, len(idx), per):
        yield idx[s:s + per]


def check_positive(value: float, name: str, *, allow_zero: bool = False) -> float:
    v = float(value)
    if not np.isfinite(v) or v < 0.0 or (v == 0.0 and not allow_zero):
        raise InvalidArgument(name, f"must be a finite number {'>=' if allow_zero else '>'} 0, "
                                    f"got {value!r}")
    return v


def check_count(value: int, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise InvalidArgument(name, f"must be an integer >= {minimum}, got {value!r}")
    return int(value)


def l2_norms(v: np.ndarray) -> np.ndarray:
    """Per-row L2 norm of ``v`` (rows x ...), float64."""
    flat = v.reshape(len(v), int(np.prod(v.shape[1:]))).astype(np.float64)
    return np.sqrt(np.einsum("ij,ij->i", flat, flat))


def rms(v: np.ndarray) -> np.ndarray:
    """Per-row root-mean-square of ``v`` (rows x ...), float64."""
    return l2_norms(v) / np.sqrt(max(1, int(np.prod(v.shape[1:]))))


def expand(a: np.ndarray, ndim: int) -> np.ndarray:
    """``a`` (rows,) reshaped to broadcast against rows x ... arrays of ``ndim`` dims."""
    return a.reshape((-1,) + (1,) * (ndim - 1))


class ZoSearch:
    """One score-based attack on one batch: the bound, the per-image budget, success judged on
    every image sent, the returned adversarials (see the module docstring)."""

    def __init__(self, margin: MarginQuery, images: np.ndarray, labels: np.ndarray, *,
                 norm: ZoNorm, epsilon: float, max_queries: int,
                 spent: np.ndarray | None = None) -> None:
        self.images, self.labels = check_batch(images, labels)
        if norm not in ("linf", "l2"):
            raise InvalidArgument("norm", f"must be 'linf' or 'l2', got {norm!r}")
        self.norm: ZoNorm = norm
        self.n = int(self.images.shape[0])
        self.shape: tuple[int, int, int] = tuple(self.images.shape[1:])  # type: ignore[assignment]
        self.d = int(np.prod(self.shape))
        if norm == "linf":
            self.e = linf_levels(epsilon)              # levels
            self.radius = float(self.e)                # the ball's radius in levels
        else:
            self.epsilon = check_l2_epsilon(epsilon)
            self.radius = self.epsilon * 255.0         # L2 radius in levels
        self.qb = QueryBudget(self.n, max_queries, spent)
        self.margin = margin
        self.x = self.images.astype(np.float32)
        self.adv = self.images.copy()
        self.m_best = np.full(self.n, np.inf)
        self.initially_correct: list[bool | None] = [None] * self.n

    # -- budget ---------------------------------------------------------------------------

    def running(self) -> np.ndarray:
        return self.qb.running()

    def remaining(self, idx: np.ndarray) -> np.ndarray:
        return self.qb.limit - self.qb.used[np.asarray(idx, dtype=np.int64)]

    def finish(self, idx: np.ndarray, reason: str = STOP_ITERATIONS) -> None:
        """Stop images that cannot do anything more (nothing to change within the bound)."""
        for i in np.asarray(idx, dtype=np.int64):
            if self.qb.stop[int(i)] is None:
                self.qb.stop[int(i)] = reason

    @property
    def degenerate(self) -> bool:
        """Nothing can change within the bound: L-inf below one level, L2 radius 0."""
        return self.radius <= 0.0 if self.norm == "l2" else self.e == 0

    # -- the bound --------------------------------------------------------------------------

    def feasible(self, cand: np.ndarray, owners: np.ndarray, *,
                 scratch: bool = False) -> np.ndarray:
        """uint8 images within the bound around ``x[owners]`` and within [0, 255], from float
        candidates in level space (rows x H x W x C). ``scratch``: ``cand`` (float) may be
        overwritten (spares a copy of every probe on large images)."""
        if self.norm == "linf":
            # np.clip's values without its temporaries (np.clip with array bounds is several
            # times slower); the bounds x -+ e are integers, exact in float32
            owners = np.asarray(owners, dtype=np.int64)
            inplace = scratch and isinstance(cand, np.ndarray) and cand.dtype.kind == "f" \
                and cand.flags.c_contiguous
            out = np.rint(cand, out=cand) if inplace else np.rint(cand)
            starts = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]]) if len(owners) \
                else np.zeros(0, dtype=np.int64)
            if len(owners) and len(starts) * 8 <= len(owners):  # long runs: broadcast the bounds
                ends = np.r_[starts[1:], len(owners)]
                for a, b in zip(starts, ends, strict=True):
                    xi = self.x[owners[a]]
                    np.maximum(out[a:b], xi - self.e, out=out[a:b])
                    np.minimum(out[a:b], xi + self.e, out=out[a:b])
            else:
                bound = self.x.take(owners, axis=0)
                np.subtract(bound, self.e, out=bound)
                np.maximum(out, bound, out=out)
                np.add(bound, 2 * self.e, out=bound)
                np.minimum(out, bound, out=out)
            np.clip(out, 0, 255, out=out)
            return out.astype(np.uint8)
        x = self.x[owners]
        delta = np.asarray(cand, dtype=np.float32) - x
        norms = l2_norms(delta)
        scale = np.where(norms > self.radius, self.radius / np.maximum(norms, 1e-12), 1.0)
        delta = np.trunc(delta * expand(scale, delta.ndim).astype(np.float32))
        return np.clip(x + delta, 0, 255).astype(np.uint8)

    def project(self, cand: np.ndarray, owners: np.ndarray) -> np.ndarray:
        """Float projection of iterates onto the ball and the box (no rounding): L-inf
        ``clip(cand, x - e, x + e)``, L2 radial scaling; then ``[0, 255]``."""
        x = self.x[owners]
        if self.norm == "linf":
            out = np.clip(cand, x - self.e, x + self.e)
        else:
            delta = cand - x
            norms = l2_norms(delta)
            scale = np.where(norms > self.radius, self.radius / np.maximum(norms, 1e-12), 1.0)
            out = x + delta * expand(scale, delta.ndim).astype(np.float32)
        return np.clip(out, 0, 255).astype(np.float32)

    # -- queries ----------------------------------------------------------------------------

    def start(self) -> np.ndarray:
        """Ask the clean images (counted); margins per image (``nan`` where not asked). Images
        already adversarial stop with ``already_misclassified``; with a degenerate bound the
        others stop with ``iterations`` (nothing can change, no query is spent)."""
        m0 = np.full(self.n, np.nan)
        everyone = self.running()
        if not len(everyone):
            return m0
        ans = self.qb.ask(self.margin, self.images[everyone], everyone)
        if ans is None:
            return m0
        m = self._clean(ans)
        m0[everyone] = m
        self.m_best[everyone] = m
        for k, i in enumerate(everyone):
            self.initially_correct[int(i)] = not bool(m[k] < 0)
            if m[k] < 0:
                self.qb.stop[int(i)] = STOP_ALREADY_MISCLASSIFIED
        if self.degenerate:
            self.finish(self.running())
        return m0

    @staticmethod
    def _clean(ans: np.ndarray) -> np.ndarray:
        m = np.asarray(ans, dtype=np.float64).reshape(-1)
        return np.where(np.isnan(m), np.inf, m)

    def within(self, cand: np.ndarray, owners: np.ndarray) -> np.ndarray:
        """Per row of uint8 ``cand``: whether it lies within the bound around ``x[owners]``."""
        diff = cand.astype(np.float32) - self.x[np.asarray(owners, dtype=np.int64)]
        if self.norm == "linf":
            flat = np.abs(diff).reshape(len(diff), -1)
            return flat.max(axis=1, initial=0.0) <= self.e
        return l2_norms(diff) <= self.radius * (1.0 + 1e-9)

    def ask(self, cand: np.ndarray, owners: np.ndarray,
            credit: np.ndarray | None = None) -> np.ndarray | None:
        """Send uint8 ``cand`` (row k charged to image ``owners[k]``); margins per row, or
        None when the proxy refused (those images stopped). Rows are credited (default: all;
        they must then lie within the bound) or not (``credit[k]`` False: a probe outside the
        bound, answered and counted, never an adversarial). Each image's lowest-margin
        credited row becomes its adversarial when it beats the best so far; an image with a
        credited row < 0 stops with ``success``."""
        owners = np.asarray(owners, dtype=np.int64)
        if not len(owners):
            return np.zeros(0)
        ans = self.qb.ask(self.margin, cand, owners)
        if ans is None:
            return None
        answered = self._clean(ans)
        if answered.shape != (len(owners),):
            raise InvalidArgument("margins",
                                  f"query returned {answered.shape} for {len(owners)} images")
        m = answered if credit is None else np.where(credit, answered, np.inf)
        uniq, inv = np.unique(owners, return_inverse=True)
        low = np.full(len(uniq), np.inf)
        np.minimum.at(low, inv, m)
        rows = np.flatnonzero(m == low[inv])
        groups, first = np.unique(inv[rows], return_index=True)
        for g, r in zip(groups, rows[first], strict=True):
            i = int(uniq[g])
            if self.qb.stop[i] == STOP_SUCCESS:
                continue
            if m[r] < self.m_best[i]:
                self.m_best[i] = m[r]
                self.adv[i] = cand[r]
            if m[r] < 0:
                self.qb.stop[i] = STOP_SUCCESS
        return answered

    def done(self, i: int) -> bool:
        return self.qb.stop[int(i)] is not None

    # -- results ----------------------------------------------------------------------------

    def results(self) -> list[AttackResult]:
        self.running()  # images that spent Q_m get their 'budget' stop reason
        return [make_result(i, self.images[i], self.adv[i], success=bool(self.m_best[i] < 0),
                            queries=self.qb.sent(i), initially_correct=self.initially_correct[i],
                            stop_reason=str(self.qb.stop[i] or STOP_ITERATIONS))
                for i in range(self.n)]


def nearest_upsample_index(size: int, out: int) -> np.ndarray:
    """Source index of each of ``out`` positions when ``size`` values are upsampled by
    nearest neighbour (torch ``nn.Upsample(mode='nearest')``: ``floor(j * size / out)``)."""
    return np.minimum((np.arange(out) * size) // out, size - 1)


def bilinear_matrix(size: int, out: int) -> np.ndarray:
    """``out x size`` matrix of 1-D bilinear interpolation with half-pixel centres (torch
    ``interpolate(mode='bilinear', align_corners=False)``): ``up(v) = M @ v``."""
    m = np.zeros((out, size), dtype=np.float32)
    if size == 1:
        m[:, 0] = 1.0
        return m
    src = np.clip((np.arange(out) + 0.5) * size / out - 0.5, 0.0, size - 1)
    lo = np.floor(src).astype(np.int64)
    hi = np.minimum(lo + 1, size - 1)
    w = (src - lo).astype(np.float32)
    rows = np.arange(out)
    np.add.at(m, (rows, lo), 1.0 - w)
    np.add.at(m, (rows, hi), w)
    return m
