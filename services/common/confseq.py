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
the last time by bisection to ``1e-9``. Pure numpy: imported by the evaluation service.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "betting_cs",
    "betting_interval",
    "decide",
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
#: Bisection stops when the bracket is this narrow.
_BISECT_TOL = 1e-9
#: Slack on the logical bounds so rounding in sums of floats never excludes the true mean.
_LOGICAL_SLACK = 1e-12
#: Rows of the candidate-by-time matrix computed at once (bounds the memory to rows * n).
_ROW_CHUNK = 64

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


def _first_exclusion(
    rows: FloatArray, m: FloatArray, population: int, alpha: float
) -> NDArray[np.int64]:
    """For each candidate mean ``m[j]`` (observations ``rows[j]``, or the one row for all),
    the first index ``t`` (0-based) at which the candidate is excluded -- its capital reached
    ``1/alpha`` or it contradicts the values seen -- or ``n`` when it survives them all."""
    n = rows.shape[1]
    t = np.arange(n, dtype=np.float64)  # draws before this one
    log_barrier = math.log(1.0 / alpha)
    out = np.empty(m.size, dtype=np.int64)
    shared = rows.shape[0] == 1
    if shared:
        lam_all = _bets(rows, alpha)
        x_all = rows
        s_all = np.cumsum(rows, axis=1)
    for start in range(0, m.size, _ROW_CHUNK):
        stop = min(start + _ROW_CHUNK, m.size)
        mm = m[start:stop, None]
        if shared:
            x, lam, s = x_all, lam_all, s_all
        else:
            x = rows[start:stop]
            lam = _bets(x, alpha)
            s = np.cumsum(x, axis=1)
        s_before = s - x
        remaining = population - t  # values not yet drawn, this one included
        mu = (population * mm - s_before) / remaining
        slack = _LOGICAL_SLACK * max(1.0, float(population))
        impossible = (mu * remaining < -slack) | ((mu - 1.0) * remaining > slack)
        # Logical bounds after this draw: whatever the unseen values, S_t/N <= m <= 1-(t-S_t)/N.
        impossible |= population * mm < s - slack
        impossible |= population * (1.0 - mm) < (t + 1.0 - s) - slack
        mu = np.clip(mu, 0.0, 1.0)
        with np.errstate(divide="ignore"):
            lam_pos = np.minimum(lam, TRUNCATION / mu)
            lam_neg = np.minimum(lam, TRUNCATION / (1.0 - mu))
        diff = x - mu
        log_pos = math.log(THETA) + np.cumsum(np.log1p(lam_pos * diff), axis=1)
        log_neg = math.log(1.0 - THETA) + np.cumsum(np.log1p(-lam_neg * diff), axis=1)
        bad = impossible | ~(np.maximum(log_pos, log_neg) < log_barrier)
        hit = bad.any(axis=1)
        out[start:stop] = np.where(hit, bad.argmax(axis=1), n)
    return out


def _survives(
    x: FloatArray, population: int, alpha: float
) -> Callable[[FloatArray], NDArray[np.bool_]]:
    """A test of candidate means: True where the candidate is still in the running CS after
    every value of ``x``."""
    row = x[None, :]

    def test(m: FloatArray) -> NDArray[np.bool_]:
        return _first_exclusion(row, m, population, alpha) >= x.size

    return test


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
    n = arr.size
    grid = np.linspace(0.0, 1.0, GRID_POINTS)
    excluded_at = _first_exclusion(arr[None, :], grid, size, alpha_)

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

    s = np.cumsum(arr)
    logical_lower = s / size
    logical_upper = 1.0 - (np.arange(1, n + 1) - s) / size
    lower = np.maximum(lower, logical_lower)
    upper = np.minimum(upper, logical_upper)

    lo_last, hi_last = _refine_last(arr, size, alpha_, float(lower[-1]), float(upper[-1]))
    lower[-1] = max(lower[-1], lo_last)
    upper[-1] = min(upper[-1], hi_last)

    crossed = lower > upper
    if np.any(crossed):
        lower = np.where(crossed, logical_lower, lower)
        upper = np.where(crossed, logical_upper, upper)
    return lower, upper


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
    new_lower = (
        zoom[0] if first == 0 else _bisect(inside, zoom[first - 1], zoom[first], _BISECT_TOL)
    )
    new_upper = (
        zoom[-1]
        if last == ok.size - 1
        else _bisect(inside, zoom[last + 1], zoom[last], _BISECT_TOL)
    )
    return float(new_lower), float(new_upper)


def betting_interval(x: ArrayLike, *, population: int, alpha: float = 0.05) -> tuple[float, float]:
    """The last (lower, upper) of :func:`betting_cs`: the interval after every value of x."""
    lower, upper = betting_cs(x, population=population, alpha=alpha)
    return float(lower[-1]), float(upper[-1])


def decide(x: ArrayLike, *, population: int, threshold: float, alpha: float = 0.05) -> int:
    """+1 if the CS's lower bound is > threshold (the mean is above it, decided), -1 if its
    upper bound < threshold, 0 while undecided."""
    threshold_ = _check_unit(threshold, "threshold")
    lower, upper = betting_interval(x, population=population, alpha=alpha)
    if lower > threshold_:
        return 1
    if upper < threshold_:
        return -1
    return 0


def ratio_transform(a: ArrayLike, b: ArrayLike, threshold: float) -> np.ndarray:
    """y_i = a_i - threshold * b_i + threshold, for a ratio metric sum(a)/sum(b) with b_i in
    {0, 1}, 0 <= a_i <= b_i: mean(y) > threshold  <=>  sum(a)/sum(b) > threshold; y in [0,1].

    (An item outside the ratio's denominator, b_i = 0, contributes exactly ``threshold``; one
    inside contributes a_i; so mean(y) - threshold = (sum(a) - threshold sum(b)) / n.)
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
