"""Anytime-valid confidence sequences for the mean of a finite population sampled without
replacement, so an evaluation may look at its running accuracy after every batch and stop as
soon as the verdict is clear without inflating its error rate (IEEE-M8: the interval at 95 %
holds at every look, not only at a sample size fixed in advance).

Why not the Wilson interval: a 95 % Wilson interval is valid at one fixed sample size; a
runner that checks it after every batch and stops the first time it clears the threshold
declares a wrong verdict far more often than 5 % near the threshold (``bench/sequential.py``
measures how often). A confidence sequence holds simultaneously at every time ``t``, so any
stopping rule built on it keeps its error rate.

Method: the hedged capital process of Waudby-Smith & Ramdas ("Estimating means of bounded
random variables by betting", JRSS-B 2024, the section on sampling without replacement; and
"Confidence sequences for sampling without replacement", NeurIPS 2020). For a candidate
population mean ``m`` the next draw's conditional mean is

    mu_t(m) = (N m - S_{t-1}) / (N - t + 1),     S_{t-1} = x_1 + ... + x_{t-1},

and the capital of two bettors -- one betting the draws come out above ``mu_t(m)``, one below --

    K_t(m) = max(theta * prod_i (1 + l_i^+ (x_i - mu_i(m))),
                 (1 - theta) * prod_i (1 - l_i^- (x_i - mu_i(m))))

is a nonnegative martingale when ``m`` is the true mean, so by Ville's inequality it ever
reaches ``1/alpha`` with probability at most ``alpha``. The confidence sequence is every ``m``
whose capital has not reached ``1/alpha`` so far (the running intersection). The bets are the
paper's predictable plug-in ``sqrt(2 log(2/alpha) / (sigma^2_{t-1} t log(1 + t)))`` from a
regularised running variance, truncated at ``c / mu_t(m)`` and ``c / (1 - mu_t(m))`` with
``c = 1/2`` so a factor never falls below ``1 - c``. A candidate whose ``mu_t(m)`` leaves
[0, 1] cannot be the mean of what is left and is excluded; so is any candidate outside the
logical bounds ``[S_t / N, 1 - (t - S_t) / N]`` that hold whatever the unseen values are,
which makes the interval the exact population mean once every value has been seen.

Each capital factor is monotone in ``m`` (the positive bettor's non-increasing, the negative
one's non-decreasing), so the set of surviving candidates is an interval; it is found on a
grid of candidates (bounds rounded outwards to the neighbouring excluded grid point), and at
the last time by a search to ``1e-9``. Pure numpy: imported by the evaluation service.

The guarantee is over the order of the draws: the caller must draw the items in a uniformly
random order (a permutation from a generator seeded by the plan). In a fixed order (the
dataset's) the intervals can be confidently wrong until the end, though never outside what
the values seen allow, and exact once all are seen.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "betting_cs",
    "betting_interval",
    "decide",
    "decide_prefixes",
    "ratio_interval",
    "ratio_transform",
]

#: Candidate means on the grid: ``GRID_POINTS`` evenly spaced points in [0, 1].
GRID_POINTS = 1001
#: Weight of the positive bettor (theta); the paper's symmetric choice.
THETA = 0.5
#: Bet truncation c: a factor never falls below 1 - c.
TRUNCATION = 0.5
#: Largest population accepted: N m must stay exact in a double.
MAX_POPULATION = 2**53
#: The search for the last interval's ends stops when a bracket is this narrow.
_BISECT_TOL = 1e-9
#: Candidates tested per bracket and round of that search.
_SEARCH_POINTS = 32
#: Slack on the logical bounds so rounding in sums of floats never excludes the true mean.
_LOGICAL_SLACK = 1e-12

FloatArray = NDArray[np.float64]


# ---------------------------------------------------------------- input checks


def _check_alpha(alpha: object) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise ValueError(f"alpha must be a number in (0, 1), got {type(alpha).__name__}")
    value = float(alpha)
    if not (0.0 < value < 1.0):  # also refuses NaN
        raise ValueError(f"alpha must be in (0, 1), got {value!r}")
    return value


def _check_unit(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number in [0, 1], got {type(value).__name__}")
    out = float(value)
    if not (0.0 <= out <= 1.0):  # also refuses NaN
        raise ValueError(f"{name} must be in [0, 1], got {out!r}")
    return out


def _as_vector(values: ArrayLike, name: str, *, allow_empty: bool = False) -> FloatArray:
    """A 1-D float64 array of finite values, or a ValueError naming ``name``."""
    if isinstance(values, (str, bytes)):
        raise ValueError(f"{name} must be a 1-D sequence of numbers, got {type(values).__name__}")
    try:
        arr = np.asarray(values)
    except (ValueError, TypeError) as exc:  # ragged nesting, unconvertible objects
        raise ValueError(f"{name} must be a 1-D sequence of numbers: {exc}") from None
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got an array of shape {arr.shape}")
    if arr.dtype == np.bool_:
        arr = arr.astype(np.float64)
    if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"{name} must hold numbers, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if arr.size == 0 and not allow_empty:
        raise ValueError(f"{name} is empty: at least one observation is needed")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} holds a non-finite value (NaN or infinity)")
    return arr


def _check_observations(x: ArrayLike, population: object) -> tuple[FloatArray, int]:
    arr = _as_vector(x, "x")
    if np.any(arr < 0.0) or np.any(arr > 1.0):
        bad = int(np.flatnonzero((arr < 0.0) | (arr > 1.0))[0])
        raise ValueError(f"x must lie in [0, 1]; x[{bad}] = {float(arr[bad])!r}")
    return arr, _check_population(population, arr.size)


def _check_population(population: object, n: int) -> int:
    if isinstance(population, bool) or not isinstance(population, numbers.Integral):
        raise ValueError(f"population must be an integer, got {type(population).__name__}")
    size = int(population)
    if size < n:
        raise ValueError(f"population ({size}) is smaller than the number of observations ({n})")
    if size > MAX_POPULATION:
        raise ValueError(f"population ({size}) exceeds the largest supported ({MAX_POPULATION})")
    return size


# ---------------------------------------------------------------- the capital process


def _bets(rows: FloatArray, alpha: float) -> FloatArray:
    """The predictable plug-in bets for each row of observations: bet ``i`` uses only the
    values before ``i`` (a regularised mean 1/2 and variance 1/4 stand in for the first)."""
    t = np.arange(1, rows.shape[1] + 1, dtype=np.float64)
    mean = (0.5 + np.cumsum(rows, axis=1)) / (t + 1.0)
    var = (0.25 + np.cumsum((rows - mean) ** 2, axis=1)) / (t + 1.0)
    var_before = np.concatenate([np.full((rows.shape[0], 1), 0.25), var[:, :-1]], axis=1)
    # log(1/(alpha * theta)) = log(2/alpha) for the symmetric hedge.
    return np.sqrt(2.0 * math.log(1.0 / (alpha * THETA)) / (var_before * t * np.log1p(t)))


@dataclass(frozen=True)
class _Prepared:
    """What the capital process needs of the observations, whatever the candidate: the bets,
    the sums before each draw and the candidates still possible at each draw."""

    rows: FloatArray
    bets: FloatArray
    sums_before: FloatArray
    m_low: FloatArray
    m_high: FloatArray
    remaining: FloatArray
    population: int
    alpha: float


def _prepare(rows: FloatArray, population: int, alpha: float) -> _Prepared:
    n = rows.shape[1]
    sums = np.cumsum(rows, axis=1)
    t = np.arange(n, dtype=np.float64)  # draws before this one
    remaining = population - t  # values not yet drawn, this one included
    slack = _LOGICAL_SLACK * max(1.0, float(population))
    sums_before = sums - rows
    # Candidates possible at draw t: mu_t(m) in [0, 1] before it, and after it the logical
    # bounds S_t/N <= m <= 1 - (t + 1 - S_t)/N that hold whatever the unseen values are.
    m_low = np.maximum(sums_before - slack, sums - slack) / population
    m_high = np.minimum(
        (sums_before + remaining + slack) / population,
        1.0 - (t + 1.0 - sums - slack) / population,
    )
    return _Prepared(
        rows, _bets(rows, alpha), sums_before, m_low, m_high, remaining, population, alpha
    )


def _first_exclusion(
    rows: FloatArray,
    m: FloatArray,
    population: int,
    alpha: float,
    prepared: _Prepared | None = None,
) -> NDArray[np.int64]:
    """For each candidate mean ``m[j]`` (observations ``rows[j]``, or the one row for all),
    the first index ``t`` (0-based) at which the candidate is excluded -- its capital reached
    ``1/alpha`` or it contradicts the values seen -- or ``n`` when it survives them all.

    Time runs in blocks of growing length, each over the candidates still alive only (their
    capital carried over): most candidates fall early, so the work follows the shrinking
    interval rather than the whole grid times the whole sequence."""
    p = prepared if prepared is not None else _prepare(rows, population, alpha)
    rows, lam_all, s_before, m_low, m_high, remaining = (
        p.rows,
        p.bets,
        p.sums_before,
        p.m_low,
        p.m_high,
        p.remaining,
    )
    n = rows.shape[1]
    shared = rows.shape[0] == 1
    log_barrier = math.log(1.0 / alpha)
    out = np.full(m.size, n, dtype=np.int64)
    alive = np.arange(m.size)
    carry_pos = np.full(m.size, math.log(THETA))
    carry_neg = np.full(m.size, math.log(1.0 - THETA))
    start, block = 0, 32
    while start < n and alive.size:
        stop = min(n, start + block)
        cols = slice(start, stop)
        r = 0 if shared else alive
        mm = m[alive, None]
        x = rows[r, cols] if shared else rows[alive, cols]
        lam = lam_all[r, cols] if shared else lam_all[alive, cols]
        sb = s_before[r, cols] if shared else s_before[alive, cols]
        lo = m_low[r, cols] if shared else m_low[alive, cols]
        hi = m_high[r, cols] if shared else m_high[alive, cols]
        impossible = (mm < lo) | (mm > hi)
        mu = np.clip((population * mm - sb) / remaining[cols], 0.0, 1.0)
        with np.errstate(divide="ignore"):
            lam_pos = np.minimum(lam, TRUNCATION / mu)
            lam_neg = np.minimum(lam, TRUNCATION / (1.0 - mu))
        diff = x - mu
        log_pos = carry_pos[alive, None] + np.cumsum(np.log1p(lam_pos * diff), axis=1)
        log_neg = carry_neg[alive, None] + np.cumsum(np.log1p(-lam_neg * diff), axis=1)
        bad = impossible | ~(np.maximum(log_pos, log_neg) < log_barrier)
        hit = bad.any(axis=1)
        out[alive[hit]] = start + bad[hit].argmax(axis=1)
        keep = ~hit
        carry_pos[alive[keep]] = log_pos[keep, -1]
        carry_neg[alive[keep]] = log_neg[keep, -1]
        alive = alive[keep]
        start, block = stop, min(2 * block, 1024)
    return out


def _survives(
    x: FloatArray, population: int, alpha: float
) -> Callable[[FloatArray], NDArray[np.bool_]]:
    """A test of candidate means: True where the candidate is still in the running CS after
    every value of ``x``."""
    prepared = _prepare(x[None, :], population, alpha)

    def test(m: FloatArray) -> NDArray[np.bool_]:
        return _first_exclusion(prepared.rows, m, population, alpha, prepared) >= x.size

    return test


def _search_sides(
    inside: Callable[[FloatArray], NDArray[np.bool_]],
    lower: tuple[float, float],
    upper: tuple[float, float],
    tol: float,
) -> tuple[float, float]:
    """Both ends of an interval of surviving candidates at once, from brackets (excluded,
    included) below and (included, excluded) above: each round tests ``_SEARCH_POINTS``
    evenly spaced candidates inside each bracket in one call and keeps the sub-bracket where
    the test changes. Returns the excluded ends (the bounds stay conservative)."""
    lo_out, lo_in = lower
    hi_in, hi_out = upper
    k = _SEARCH_POINTS
    while lo_in - lo_out > tol or hi_out - hi_in > tol:
        below = np.linspace(lo_out, lo_in, k + 2)[1:-1]
        above = np.linspace(hi_in, hi_out, k + 2)[1:-1]
        ok = inside(np.concatenate([below, above]))
        ok_below, ok_above = ok[:k], ok[k:]
        if lo_in - lo_out > tol:
            if ok_below.any():
                j = int(np.argmax(ok_below))
                lo_in, lo_out = float(below[j]), float(below[j - 1]) if j > 0 else lo_out
            else:
                lo_out = float(below[-1])
        if hi_out - hi_in > tol:
            if ok_above.any():
                j = int(k - 1 - np.argmax(ok_above[::-1]))
                hi_in, hi_out = float(above[j]), float(above[j + 1]) if j < k - 1 else hi_out
            else:
                hi_out = float(above[0])
    return lo_out, hi_out


def _bisect(
    inside: Callable[[FloatArray], NDArray[np.bool_]],
    outside_at: float,
    inside_at: float,
    tol: float,
) -> float:
    """The boundary between an excluded point and an included one of an interval, rounded
    towards the excluded side (the bound stays conservative)."""
    lo, hi = outside_at, inside_at
    while abs(hi - lo) > tol:
        mid = 0.5 * (lo + hi)
        if bool(inside(np.array([mid]))[0]):
            hi = mid
        else:
            lo = mid
    return lo


# ---------------------------------------------------------------- public API


def betting_cs(
    x: ArrayLike, *, population: int, alpha: float = 0.05
) -> tuple[np.ndarray, np.ndarray]:
    """Time-uniform (1 - alpha) confidence sequence for the mean of a finite population of
    `population` values in [0, 1], from x[0], x[1], ... drawn WITHOUT replacement in a
    uniformly random order: (lower[t], upper[t]) for t = 0..len(x)-1, each the running
    intersection (monotone: lower non-decreasing, upper non-increasing). At t = population - 1
    (every value seen) the interval is the exact population mean (width 0, up to float).

    With probability at least 1 - alpha the population mean lies in every interval at once,
    so the sequence may be checked after every draw and stopped on any rule. The bounds are
    those of the grid (rounded outwards) except the last, which is refined by bisection. In
    the rare event that the data later contradict the sequence (the mean was excluded, which
    has probability at most alpha), the logical bounds win and monotonicity may break there:
    the interval never claims what the values seen rule out.

    Raises ValueError (naming the argument) for values outside [0, 1], NaN, an empty ``x``,
    a population smaller than ``len(x)`` or alpha outside (0, 1).
    """
    alpha_ = _check_alpha(alpha)
    arr, size = _check_observations(x, population)
    lower, upper, _ = _grid_sequence(arr, size, alpha_)
    lower[-1], upper[-1] = _last_interval(arr, size, alpha_, float(lower[-1]), float(upper[-1]))
    return _logical_when_crossed(arr, size, lower, upper)


def _last_interval(
    x: FloatArray, population: int, alpha: float, lower: float, upper: float
) -> tuple[float, float]:
    """The interval after every value of ``x`` from its grid bounds: refined by bisection, or
    the logical bounds where the values seen contradict it."""
    refined_lower, refined_upper = _refine_last(x, population, alpha, lower, upper)
    lower, upper = max(lower, refined_lower), min(upper, refined_upper)
    if lower > upper:
        logical_lower, logical_upper = _logical_bounds(x, population)
        return float(logical_lower[-1]), float(logical_upper[-1])
    return lower, upper


def _logical_bounds(x: FloatArray, population: int) -> tuple[FloatArray, FloatArray]:
    """Bounds on the population mean after each draw that hold whatever the unseen values."""
    s = np.cumsum(x)
    return s / population, 1.0 - (np.arange(1, x.size + 1) - s) / population


def _logical_when_crossed(
    x: FloatArray, population: int, lower: FloatArray, upper: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Where the values seen contradict the betting bounds (the mean was excluded: probability
    at most alpha), the logical bounds alone; a crossing persists once it happens, as both
    kinds of bound are monotone."""
    crossed = lower > upper
    if np.any(crossed):
        logical_lower, logical_upper = _logical_bounds(x, population)
        lower = np.where(crossed, logical_lower, lower)
        upper = np.where(crossed, logical_upper, upper)
    return lower, upper


def _grid_sequence(
    arr: FloatArray, size: int, alpha: float
) -> tuple[FloatArray, FloatArray, NDArray[np.bool_]]:
    """The grid bounds after each draw (rounded outwards, intersected with the logical bounds)
    and where the grid had no survivor left (the bounds there are carried forward)."""
    n = arr.size
    grid = np.linspace(0.0, 1.0, GRID_POINTS)
    excluded_at = _first_exclusion(arr[None, :], grid, size, alpha)

    # The surviving candidates form an interval that only shrinks: the first survivor at time
    # t is the first grid index whose exclusion time (prefix maximum) is past t.
    times = np.arange(n)
    left = np.searchsorted(np.maximum.accumulate(excluded_at), times, side="right")
    right_rev = np.searchsorted(np.maximum.accumulate(excluded_at[::-1]), times, side="right")
    right = GRID_POINTS - 1 - right_rev
    empty = left >= GRID_POINTS
    lower = np.where(left > 0, grid[np.clip(left - 1, 0, GRID_POINTS - 1)], 0.0)
    upper = np.where(right < GRID_POINTS - 1, grid[np.clip(right + 1, 0, GRID_POINTS - 1)], 1.0)
    if np.any(empty):
        # Narrower than the grid: the earlier bounds still enclose the (nested) survivors.
        last_lower, last_upper = 0.0, 1.0
        for i in range(n):
            if empty[i]:
                lower[i], upper[i] = last_lower, last_upper
            else:
                last_lower, last_upper = lower[i], upper[i]
    logical_lower, logical_upper = _logical_bounds(arr, size)
    return np.maximum(lower, logical_lower), np.minimum(upper, logical_upper), empty


def _refine_last(
    x: FloatArray, population: int, alpha: float, lower: float, upper: float
) -> tuple[float, float]:
    """The last interval's bounds to bisection precision, searched inside the grid bounds."""
    if not lower < upper:
        return lower, upper
    inside = _survives(x, population, alpha)
    zoom = np.linspace(lower, upper, 129)
    ok = inside(zoom)
    if not ok.any():
        return lower, upper
    first = int(np.argmax(ok))
    last = int(ok.size - 1 - np.argmax(ok[::-1]))
    # an end that survives at the grid bound itself stays there (nothing outside to search)
    below = (float(zoom[first - 1]), float(zoom[first])) if first > 0 else (lower, lower)
    above = (float(zoom[last]), float(zoom[last + 1])) if last < ok.size - 1 else (upper, upper)
    return _search_sides(inside, below, above, _BISECT_TOL)


def betting_interval(x: ArrayLike, *, population: int, alpha: float = 0.05) -> tuple[float, float]:
    """The last (lower, upper) of :func:`betting_cs`: the interval after every value of x."""
    lower, upper = betting_cs(x, population=population, alpha=alpha)
    return float(lower[-1]), float(upper[-1])


def decide(x: ArrayLike, *, population: int, threshold: float, alpha: float = 0.05) -> int:
    """+1 if the CS's lower bound is > threshold (the mean is above it, decided), -1 if its
    upper bound < threshold, 0 while undecided.

    A wrong decision needs the CS to miss the mean on one given side (a +1 when the mean is
    at or below the threshold needs the positive bettor's capital at the mean to reach
    ``1/(theta alpha)``), which by Ville's inequality happens with probability at most
    ``theta * alpha = alpha / 2``, whatever the stopping rule. So a verdict wrong at most
    5 % of the time only needs ``alpha = 0.10`` (``bench/sequential.py`` measures both).
    """
    threshold_ = _check_unit(threshold, "threshold")
    lower, upper = betting_interval(x, population=population, alpha=alpha)
    if lower > threshold_:
        return 1
    if upper < threshold_:
        return -1
    return 0


def decide_prefixes(
    x: ArrayLike,
    *,
    population: int,
    threshold: float,
    sizes: ArrayLike,
    alpha: float = 0.05,
    stop_at_first: bool = False,
) -> np.ndarray:
    """``[decide(x[:n], ...) for n in sizes]`` from one pass over ``x``: a runner (or a
    simulation) that looks after every batch needs the decision at each look, and the grid
    part of the sequence is the same for every prefix (each bound uses only the values before
    it). Only a look whose grid bound lies within one grid step of the threshold -- where the
    refined last interval could decide differently -- or where the grid had no survivor left
    is recomputed on its prefix. With ``stop_at_first`` the looks after the first decided one
    are left 0 (a runner stops there; it saves the later recomputations)."""
    threshold_ = _check_unit(threshold, "threshold")
    alpha_ = _check_alpha(alpha)
    arr, size = _check_observations(x, population)
    try:
        looks = np.asarray(sizes)
    except (ValueError, TypeError):
        raise ValueError("sizes must be a 1-D sequence of prefix lengths") from None
    if looks.ndim != 1 or not np.issubdtype(looks.dtype, np.integer):
        raise ValueError("sizes must be a 1-D sequence of integer prefix lengths")
    if looks.size and (looks.min() < 1 or looks.max() > arr.size):
        raise ValueError(f"sizes must lie in [1, len(x)] = [1, {arr.size}]")
    lower, upper, empty = _grid_sequence(arr, size, alpha_)
    step = 1.0 / (GRID_POINTS - 1)
    out = np.zeros(looks.size, dtype=np.int64)
    for k, n in enumerate(looks.tolist()):
        lo, hi = float(lower[n - 1]), float(upper[n - 1])
        near = abs(lo - threshold_) <= step or abs(hi - threshold_) <= step
        if near or empty[n - 1] or lo > hi or n == arr.size:
            # A threshold still in the CS of x[:n] leaves it undecided whatever the refined
            # ends; otherwise, what betting_cs(x[:n]) ends with (its grid part is this one's
            # first n bounds).
            if _survives(arr[:n], size, alpha_)(np.array([threshold_]))[0]:
                continue
            lo, hi = _last_interval(arr[:n], size, alpha_, lo, hi)
        out[k] = 1 if lo > threshold_ else -1 if hi < threshold_ else 0
        if stop_at_first and out[k] != 0:
            break
    return out


def ratio_transform(a: ArrayLike, b: ArrayLike, threshold: float) -> np.ndarray:
    """y_i = a_i - threshold * b_i + threshold, for a ratio metric sum(a)/sum(b) with b_i in
    {0, 1}, 0 <= a_i <= b_i: mean(y) > threshold  <=>  sum(a)/sum(b) > threshold; y in [0,1].

    (An item outside the ratio's denominator, b_i = 0, contributes exactly ``threshold``; one
    inside contributes a_i; so mean(y) - threshold = (sum(a) - threshold sum(b)) / n.) A
    sequential decision on a ratio metric is therefore
    ``decide(ratio_transform(a, b, threshold), population=N, threshold=threshold)``.
    """
    threshold_ = _check_unit(threshold, "threshold")
    a_, b_ = _check_ratio_parts(a, b)
    return a_ - threshold_ * b_ + threshold_


def _check_ratio_parts(
    a: ArrayLike, b: ArrayLike, *, allow_empty: bool = True
) -> tuple[FloatArray, FloatArray]:
    a_ = _as_vector(a, "a", allow_empty=allow_empty)
    b_ = _as_vector(b, "b", allow_empty=allow_empty)
    if a_.shape != b_.shape:
        raise ValueError(f"a and b must have the same length, got {a_.size} and {b_.size}")
    if np.any((b_ != 0.0) & (b_ != 1.0)):
        bad = int(np.flatnonzero((b_ != 0.0) & (b_ != 1.0))[0])
        raise ValueError(f"b must hold 0 or 1; b[{bad}] = {float(b_[bad])!r}")
    if np.any((a_ < 0.0) | (a_ > b_)):
        bad = int(np.flatnonzero((a_ < 0.0) | (a_ > b_))[0])
        raise ValueError(
            f"a must satisfy 0 <= a <= b; a[{bad}] = {a_[bad]!r}, b[{bad}] = {float(b_[bad])!r}"
        )
    return a_, b_


def ratio_interval(
    a: ArrayLike, b: ArrayLike, *, population: int, alpha: float = 0.05, tol: float = 1e-4
) -> tuple[float, float] | None:
    """Time-uniform interval for sum(a)/sum(b) (population version) at the last t: the set of
    theta whose transformed mean's CS contains theta, by bisection on each side of the point
    estimate; None when sum(b) == 0.

    ``theta`` is the population ratio exactly when the population mean of
    ``ratio_transform(a, b, theta)`` equals ``theta``, so the candidates the betting test does
    not reject form a (1 - alpha) interval for the ratio, valid at every time like the CS.
    The bounds are rounded outwards to within ``tol``.
    """
    alpha_ = _check_alpha(alpha)
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not (0.0 < float(tol) < 1.0):
        raise ValueError(f"tol must be a number in (0, 1), got {tol!r}")
    a_, b_ = _check_ratio_parts(a, b, allow_empty=False)
    size = _check_population(population, a_.size)
    if float(b_.sum()) == 0.0:
        return None
    outside_share = 1.0 - b_

    def inside(theta: FloatArray) -> NDArray[np.bool_]:
        rows = a_[None, :] + theta[:, None] * outside_share[None, :]
        return _first_exclusion(rows, theta, size, alpha_) >= a_.size

    estimate = float(a_.sum() / b_.sum())
    anchor: float | None = estimate if bool(inside(np.array([estimate]))[0]) else None
    if anchor is None:
        grid = np.linspace(0.0, 1.0, GRID_POINTS)
        ok = inside(grid)
        if not ok.any():
            # Every candidate rejected: only the logical bounds on the ratio remain.
            return _ratio_logical(a_, b_, size)
        anchor = float(grid[int(np.argmax(ok))])
    tol_ = float(tol)
    lower = 0.0 if bool(inside(np.array([0.0]))[0]) else _bisect(inside, 0.0, anchor, tol_)
    upper = 1.0 if bool(inside(np.array([1.0]))[0]) else _bisect(inside, 1.0, anchor, tol_)
    return float(lower), float(upper)


def _ratio_logical(a: FloatArray, b: FloatArray, population: int) -> tuple[float, float]:
    """Bounds on the population ratio that hold whatever the unseen items are."""
    unseen = population - a.size
    low = float(a.sum() / (b.sum() + unseen))
    high = float((a.sum() + unseen) / (b.sum() + unseen))
    return low, high
