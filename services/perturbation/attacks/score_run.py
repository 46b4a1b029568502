"""What the score-based attacks of SimBA, ODS, the low-frequency DCT attack, Square L2, Local
Search and the single-pixel attack share (IEEE-A8, IEEE-A9, IEEE-M6): the per-batch
bookkeeping around ``base.QueryBudget`` and the rounding of an L2-bounded candidate onto the
uint8 grid.

:class:`ScoreRun` asks the criterion's margins (``base.MarginQuery``: < 0 where the criterion
holds) for any number of candidate rows per image, charges every row to its image, keeps per
image the lowest-margin uint8 image asked so far (what the attack returns: the first image
with margin < 0 once it succeeds, else the closest it came) and stops an image at the first
call in which one of its rows succeeded (IEEE-M6). The clean image is the first query of every
image and is counted; an image already meeting the criterion stops there
(``already_misclassified``, 1 query), including when every image of the batch does.

:func:`round_into_l2` rounds a float perturbation (uint8 levels) to integers so the image the
target receives stays inside the L2 ball: nearest rounding, then, where that leaves the ball,
the pixels rounded away from the original are rounded towards it instead, cheapest first
(``base.project_l2`` truncates every pixel, which loses a whole level on most of them).

Domain code: no gRPC.
"""

from __future__ import annotations

import numpy as np
from fortis.services.common.errors import InvalidArgument

from .base import (
    STOP_ALREADY_MISCLASSIFIED,
    STOP_SUCCESS,
    AttackResult,
    MarginQuery,
    QueryBudget,
    check_batch,
    make_result,
)

__all__ = ["ScoreRun", "l2_levels", "round_into_l2"]

FRAC_BINS = 1024  # bins of the rounding fraction when rounding back into the L2 ball


def l2_levels(epsilon: float) -> float:
    """An L2 bound in [0, 1] pixel scale (IEEE-A9) in uint8 levels (``epsilon * 255``)."""
    eps = float(epsilon)
    if not np.isfinite(eps) or eps < 0.0:
        raise InvalidArgument("epsilon", f"must be a finite number >= 0, got {epsilon!r}")
    return eps * 255.0


def round_into_l2(x: np.ndarray, delta: np.ndarray, eps_levels: float) -> np.ndarray:
    """uint8 images ``x + r`` with ``r`` integer, ``x + r`` in [0, 255] and
    ``||r||_2 <= eps_levels`` for each image (the batch axis is 0), ``r`` as near to the float
    ``delta`` (levels) as that allows: ``delta`` is clipped to [0, 255], scaled into the ball,
    rounded to nearest; where the rounding left the ball, pixels rounded away from ``x`` are
    truncated towards it, those whose fraction is nearest 0.5 first (least added error; in
    1/1024-wide bins of the fraction, a whole bin at a time, so the result may give back a
    little more than needed but never leaves the ball), in O(pixels) per image."""
    n = x.shape[0]
    xf = x.reshape(n, -1).astype(np.float64)
    d = np.array(delta, dtype=np.float64).reshape(n, -1)
    np.maximum(d, -xf, out=d)
    np.minimum(d, 255.0 - xf, out=d)
    limit = float(eps_levels) * (1.0 - 1e-12)
    norm = np.sqrt(np.einsum("ij,ij->i", d, d))
    scale = np.where(norm > limit, limit / np.maximum(norm, 1e-300), 1.0)
    d *= scale[:, None]
    r = np.rint(d)
    excess = np.einsum("ij,ij->i", r, r) - limit * limit
    over = np.flatnonzero(excess > 0)
    if len(over):
        ro, do = r[over], d[over]
        t = np.trunc(do)
        away = np.abs(ro) > np.abs(do)
        # fraction of |d| in [0.5, 1) where rounded away: bin 0 = nearest 0.5 (cheapest)
        bins = np.where(away, np.clip(((np.abs(do) - np.abs(t)) - 0.5) * (2 * FRAC_BINS), 0,
                                      FRAC_BINS - 1).astype(np.int64), FRAC_BINS)
        saving = np.where(away, ro * ro - t * t, 0.0)
        m = len(over)
        flat = bins + (FRAC_BINS + 1) * np.arange(m)[:, None]
        sums = np.bincount(flat.ravel(), weights=saving.ravel(),
                           minlength=m * (FRAC_BINS + 1)).reshape(m, FRAC_BINS + 1)
        cum = np.cumsum(sums[:, :FRAC_BINS], axis=1)
        # the first bin where the savings reach the excess (truncating every pixel rounded
        # away gives |r| <= |d|, inside the ball: the last bin always reaches it)
        last = np.argmax(cum >= excess[over, None] - 1e-9, axis=1)
        reach = cum[np.arange(m), last] >= excess[over] - 1e-9
        last = np.where(reach, last, FRAC_BINS - 1)
        switch = away & (bins <= last[:, None])
        r[over] = np.where(switch, t, ro)
    return (xf + r).reshape(x.shape).astype(np.uint8)


class ScoreRun:
    """One score-based attack on one batch: budget, margins, best images, results."""

    def __init__(self, margin: MarginQuery, images: np.ndarray, labels: np.ndarray,
                 max_queries: int, spent: np.ndarray | None) -> None:
        self.images, self.labels = check_batch(images, labels)
        self.margin = margin
        self.n = self.images.shape[0]
        self.qb = QueryBudget(self.n, max_queries, spent)
        self.best = self.images.copy()
        self.best_margin = np.full(self.n, np.inf)
        self.initially_correct: list[bool | None] = [None] * self.n

    @property
    def stop(self) -> list[str | None]:
        return self.qb.stop

    def running(self) -> np.ndarray:
        """Indices still running (an image that spent Q_m stops here with ``budget``)."""
        return self.qb.running()

    def remaining(self, idx: np.ndarray) -> np.ndarray:
        """Queries each of ``idx`` has left."""
        return self.qb.limit - self.qb.used[np.asarray(idx, dtype=np.int64)]

    def ask(self, idx: np.ndarray, batch: np.ndarray) -> np.ndarray | None:
        """Margins of uint8 ``batch`` (row k charged to image ``idx[k]``; an image may have
        several rows), or None when the proxy refused (those images stopped). Keeps each
        image's lowest-margin row; an image with a row < 0 stops with ``success``. A NaN
        margin counts as +inf (never a success)."""
        idx = np.asarray(idx, dtype=np.int64)
        if len(idx) == 0:
            return np.zeros(0)
        batch = np.ascontiguousarray(batch, dtype=np.uint8)
        out = self.qb.ask(self.margin, batch, idx)
        if out is None:
            return None
        m = np.asarray(out, dtype=np.float64).reshape(-1)
        if m.shape != idx.shape:
            raise InvalidArgument("margins", f"query returned {m.shape[0]} margins for "
                                  f"{len(idx)} images")
        m = np.where(np.isnan(m), np.inf, m)
        order = np.lexsort((np.arange(len(idx)), m, idx))   # per image: lowest, then first
        first = np.ones(len(order), dtype=bool)
        first[1:] = idx[order][1:] != idx[order][:-1]
        rows = order[first]
        who = idx[rows]
        better = m[rows] < self.best_margin[who]
        self.best[who[better]] = batch[rows[better]]
        self.best_margin[who[better]] = m[rows[better]]
        for i in who[self.best_margin[who] < 0]:
            if self.qb.stop[int(i)] is None:
                self.qb.stop[int(i)] = STOP_SUCCESS
        return m

    def begin(self) -> np.ndarray:
        """Ask the clean images (each image's first query, counted); those already meeting
        the criterion stop with ``already_misclassified``. Returns the clean margins (+inf
        where not asked: no queries left, or the proxy refused)."""
        m0 = np.full(self.n, np.inf)
        everyone = self.running()
        if not len(everyone):
            return m0
        out = self.qb.ask(self.margin, self.images[everyone], everyone)
        if out is None:
            return m0
        m = np.asarray(out, dtype=np.float64).reshape(-1)
        if m.shape != everyone.shape:
            raise InvalidArgument("margins", f"query returned {m.shape[0]} margins for "
                                  f"{len(everyone)} images")
        m = np.where(np.isnan(m), np.inf, m)
        m0[everyone] = m
        self.best_margin[everyone] = m
        for k, i in enumerate(everyone):
            self.initially_correct[int(i)] = not bool(m[k] < 0)
            if m[k] < 0:
                self.qb.stop[int(i)] = STOP_ALREADY_MISCLASSIFIED
        return m0

    def finish(self, reason: str, idx: np.ndarray | None = None) -> None:
        """Stop ``idx`` (default: every image still running) with ``reason``."""
        for i in (self.running() if idx is None else idx):
            if self.qb.stop[int(i)] is None:
                self.qb.stop[int(i)] = reason

    def results(self, default_reason: str) -> list[AttackResult]:
        """One result per image, in order; images still running stop with
        ``default_reason``."""
        self.finish(default_reason)
        return [make_result(i, self.images[i], self.best[i],
                            success=bool(self.best_margin[i] < 0), queries=self.qb.sent(i),
                            initially_correct=self.initially_correct[i],
                            stop_reason=str(self.qb.stop[i]))
                for i in range(self.n)]
