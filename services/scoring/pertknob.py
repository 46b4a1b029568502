"""Per-property robustness statistics (PER-4, seed 004 III-A) over recorded PertKnob results.

The search itself (PER-3: criteria, bisection / linear scan within Q_m) is perturbation work and
lives in the perturbation service (``services/perturbation/pertknob_search.py``, run as the
``pertknob`` attack through the proxy); this module only reads what it recorded, so the two
services import nothing of each other. Pure domain code (no gRPC).

Over the images: the mean and median of the minimal ||delta||_2 of the images that were fooled,
the share never fooled, and the fooling rate at a threshold T (an image counts as fooled at T
when its minimal ||delta||_2 < T; the seed takes T = the mean minimal L2 over all models for a
property, so pass one common T when comparing models; by default T = this set's mean).
A ``budget_exhausted`` image whose search met the criterion before the budget ran out (it has
an L2: the perturbation at the smallest epsilon seen to fool) counts as fooled, with that L2 as
an upper bound of its minimal one (``n_upper_bound`` of the ``n_found``): its image does fool
the target. ``already_met`` images and a ``budget_exhausted`` one with no hit are counted but
left out of the statistics.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fortis.services.common.errors import InvalidArgument

__all__ = ["STATUSES", "PropertyRobustness", "SearchOutcome", "SearchRecord",
           "property_robustness"]

#: The outcomes of one image's search (PER-3), as the search records them.
STATUSES = ("found", "never_fooled", "already_met", "budget_exhausted")


class SearchOutcome(Protocol):
    """What the statistics read of one image's search result (the perturbation service's
    ``KnobResult`` has this shape, as does :class:`SearchRecord`)."""

    @property
    def status(self) -> str: ...

    @property
    def l2(self) -> float | None: ...

    @property
    def queries(self) -> int: ...


@dataclass(frozen=True, kw_only=True)
class SearchRecord:
    """One image's recorded search result, e.g. read back from a report or ``Compute`` params.
    ``status`` is one of :data:`STATUSES`; ``l2`` the minimal ||delta||_2 ([0, 1] scale)."""

    status: str
    l2: float | None
    queries: int
    epsilon: float | None = None


@dataclass(frozen=True, kw_only=True)
class PropertyRobustness:
    """PER-4 statistics of one property over a set of images (see the module docstring)."""

    n_images: int
    n_found: int
    n_never_fooled: int
    n_already_met: int
    n_undetermined: int
    n_upper_bound: int
    mean_l2: float | None
    median_l2: float | None
    never_fooled_share: float | None
    threshold: float | None
    threshold_source: str
    fooling_rate: float | None
    mean_queries: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def property_robustness(results: Sequence[SearchOutcome], *,
                        threshold: float | None = None) -> PropertyRobustness:
    """Mean and median minimal ||delta||_2 over the fooled images, the share never fooled and
    the fooling rate at ``threshold`` T (default: this set's mean minimal L2) (PER-4)."""
    if threshold is not None and not (math.isfinite(threshold) and threshold >= 0):
        raise InvalidArgument("threshold", f"must be a finite number >= 0, got {threshold!r}")
    cut = [r.l2 for r in results if r.status == "budget_exhausted" and r.l2 is not None]
    found = [r.l2 for r in results if r.status == "found" and r.l2 is not None] + cut
    never = sum(r.status == "never_fooled" for r in results)
    decided = len(found) + never
    mean = statistics.fmean(found) if found else None
    median = statistics.median(found) if found else None
    t, source = (threshold, "given") if threshold is not None else (mean, "mean_l2")
    rate = (sum(v < t for v in found) / decided) if (decided and t is not None) else None
    return PropertyRobustness(
        n_images=len(results), n_found=len(found), n_never_fooled=never,
        n_already_met=sum(r.status == "already_met" for r in results),
        n_undetermined=sum(r.status == "budget_exhausted" and r.l2 is None for r in results),
        n_upper_bound=len(cut),
        mean_l2=mean, median_l2=median,
        never_fooled_share=(never / decided) if decided else None,
        threshold=t, threshold_source=source, fooling_rate=rate,
        mean_queries=statistics.fmean([r.queries for r in results]) if results else 0.0)
