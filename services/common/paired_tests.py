"""Paired comparisons of two evaluations of the same images, and family-wise control.

Two evaluations of one plan (two model versions) judge the *same* images, so the right test
of "did the rate change" looks at the images whose outcome changed: McNemar's exact test on
the discordant pairs (b: right in A, wrong in B; c: wrong in A, right in B). Under "no
change" each discordant image is equally likely to go either way, so min(b, c) is binomial
(b + c, 1/2) and the two-sided p-value is ``min(1, 2 P(X <= min(b, c)))``. The images both
got right (or both wrong) carry no information about the difference, which is why the
unpaired two-proportion z-test, which counts them as variance, misjudges a paired design.

Comparing ~90 metrics at alpha 0.05 each flags some change by chance almost every time, so
a gate reads p-values adjusted over the family of metrics it reads: Holm's step-down
(controls the family-wise error rate, the chance of *any* false flag, under any dependence
between the metrics) or Benjamini-Hochberg (controls the expected share of false flags among
the flags; valid for independent or positively dependent tests, which severities of one
corruption on the same images are).

Pure functions over integers and floats: no numpy, exact binomial tails in log space so a
million discordant pairs costs one pass and never overflows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final, Literal

__all__ = [
    "FAMILIES",
    "Family",
    "adjust",
    "benjamini_hochberg",
    "binomial_cdf_half",
    "holm",
    "mcnemar_exact",
    "paired_counts",
]

Family = Literal["holm", "bh", "none"]
#: The family controls ``adjust`` knows: the CLI's ``--family`` choices.
FAMILIES: Final[tuple[str, ...]] = ("holm", "bh", "none")


def binomial_cdf_half(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), exactly (summed in log space, largest term
    first, so large n neither overflows nor loses the small tail)."""
    if n < 0:
        raise ValueError("n must be >= 0")
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    log_half_n = -n * math.log(2.0)
    # log C(n, i) by lgamma: exact enough (relative 1e-13) and O(1) per term.
    logs = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + log_half_n
        for i in range(k + 1)
    ]
    top = max(logs)
    return min(1.0, math.exp(top) * math.fsum(math.exp(v - top) for v in logs))


def mcnemar_exact(b: int, c: int) -> float:
    """McNemar's exact two-sided p-value from the discordant counts ``b`` (right in A, wrong
    in B) and ``c`` (wrong in A, right in B): min(1, 2 P(X <= min(b, c))), X ~ Bin(b + c, 1/2).
    No discordant pair: p = 1 (nothing changed)."""
    for name, v in (("b", b), ("c", c)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{name} must be a count (an integer >= 0), not {v!r}")
    n = b + c
    if n == 0:
        return 1.0
    return min(1.0, 2.0 * binomial_cdf_half(min(b, c), n))


def paired_counts(a: str, b: str, *, good: str = "1", bad: str = "0") -> tuple[int, int, int]:
    """(n, b, c) of two per-image outcome strings of the same images: n the images both
    cover (neither is '-'), b those ``good`` in A and ``bad`` in B, c the reverse."""
    if len(a) != len(b):
        raise ValueError(f"outcome strings of different lengths ({len(a)} and {len(b)})")
    n = bb = cc = 0
    for x, y in zip(a, b, strict=True):
        if x in (good, bad) and y in (good, bad):
            n += 1
            if x == good and y == bad:
                bb += 1
            elif x == bad and y == good:
                cc += 1
    return n, bb, cc


def _checked(p_values: Sequence[float]) -> list[float]:
    out = []
    for i, p in enumerate(p_values):
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
            raise ValueError(f"p-value [{i}] must be a number in [0, 1], not {p!r}")
        out.append(float(p))
    return out


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error rate): sorted ascending,
    p_(i) * (m - i + 1), made monotone by a running maximum, capped at 1; in input order."""
    ps = _checked(p_values)
    m = len(ps)
    order = sorted(range(m), key=ps.__getitem__)
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, ps[i] * (m - rank)))
        out[i] = running
    return out


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (false discovery rate): sorted ascending,
    p_(i) * m / i, made monotone from the largest down by a running minimum, capped at 1;
    in input order."""
    ps = _checked(p_values)
    m = len(ps)
    order = sorted(range(m), key=ps.__getitem__)
    out = [0.0] * m
    running = 1.0
    for rank in range(m - 1, -1, -1):
        i = order[rank]
        running = min(running, ps[i] * m / (rank + 1))
        out[i] = min(1.0, running)
    return out


def adjust(p_values: Sequence[float], family: str) -> list[float]:
    """``p_values`` adjusted over their family: ``holm``, ``bh`` or ``none`` (as given)."""
    if family == "holm":
        return holm(p_values)
    if family == "bh":
        return benjamini_hochberg(p_values)
    if family == "none":
        return _checked(p_values)
    raise ValueError(f"family must be one of {', '.join(FAMILIES)}, not {family!r}")
