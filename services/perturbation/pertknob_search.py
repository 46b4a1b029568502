"""The PertKnob minimal-perturbation search (PER-3, seed 004 II-E; Zhong et al., DSN 2020):
the smallest epsilon of a real-world safety property (PER-1) whose perturbation meets a threat
criterion (PER-2, ``criteria.py``), within a per-image query budget (IEEE-M6).

It lives in the perturbation service because it *is* a perturbation search that queries the
target (the ``pertknob`` attack, ``attacks/pertknob.py``, runs it through the proxy); the scoring
service keeps only the PER-4 statistics over its recorded results. Pure domain code (no gRPC,
nothing of another service), numpy only. The target is reached only through a
``query(images) -> predictions`` callable (in production it goes through Fortis's proxy, which
counts and limits queries too); this module counts every image it sends as one query and never
sends more than the budget.

epsilon in [0, 1] is divided into k equal cells (k = 1000 in the seed); the candidate epsilons
are i / k, i = 1..k; epsilon = 0 is the clean image. Before any perturbation the clean image is
queried once (counted) unless the clean prediction is given in the reference; if it already
meets the criterion the image is reported ``already_met`` (minimal epsilon 0) and not searched.

- ``linear`` (the seed's search): increase epsilon one cell at a time and stop at the first cell
  that meets the criterion (``found``) or when all k cells fail (``never_fooled``). Exact for
  any criterion on the k-cell grid; up to k + 1 queries per image. ``batch`` > 1 sends that
  many consecutive cells per round (fewer round trips, up to ``batch`` - 1 queries spent past
  the first hit).
- ``bisection``: assumes the criterion is *monotone* in epsilon (once met, met for every larger
  epsilon), which is what the safety properties are built for (a larger epsilon is a larger
  perturbation of the same kind: properties.py "Coherence along epsilon"). It queries
  epsilon = 1 (not met -> ``never_fooled``), then halves the bracket (lo not met, hi met) on
  the k-cell grid until hi - lo = 1 cell: 1 + 1 + ceil(log2 k) queries (12 for k = 1000) and
  the same answer as the linear scan when the criterion is monotone. Optionally
  ``coarse_cells`` = c first scans c evenly spaced cells linearly and bisects inside the first
  coarse cell that meets the criterion: for a criterion that is not monotone this finds the
  first *coarse* crossing instead of an arbitrary one, at c extra queries at most.

Both stop when the per-image ``budget`` (clean query included) is spent: ``budget_exhausted``,
with the bracket reached so far (``upper`` = the smallest epsilon seen to meet the criterion,
if any; it is then an upper bound on the minimal epsilon and ``epsilon`` / ``l2`` are reported
for it).

For every image the result records the minimal epsilon on the grid and ||delta||_2 of that
perturbation, delta = (x' - x) / 255 over all pixels and channels (the [0, 1] scale), measured
on the uint8 image the target received (``common.arrays.l2_distance``).

Stochastic properties: each image gets its own generator (derived from the ``rng`` given, or
given one per image), and every evaluation starts from a copy of that generator's state, so
the image sees one random pattern scaled by epsilon at every cell (what makes the noises
monotone).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from fortis.services.common.arrays import l2_distance, linf_distance
from fortis.services.common.errors import FieldViolation, InvalidArgument
from fortis.services.perturbation.criteria import Criterion, Reference
from fortis.services.perturbation.properties import PROPERTIES, apply_property

__all__ = ["KnobConfig", "KnobResult", "Perturb", "QueryFn", "Status", "pertknob",
           "pertknob_search", "property_perturbation"]

#: ``perturb(image, epsilon, rng) -> image``: uint8 in, uint8 of the same shape out.
Perturb = Callable[[np.ndarray, float, np.random.Generator], np.ndarray]
#: ``query(images) -> predictions``: one prediction per image, in order.
QueryFn = Callable[[list[np.ndarray]], Sequence[Any]]
Status = Literal["found", "never_fooled", "already_met", "budget_exhausted"]



def property_perturbation(property_id: str, params: Mapping[str, Any] | None = None) -> Perturb:
    """``perturb(image, epsilon, rng)`` for one safety property of properties.py (PER-1)."""
    if property_id not in PROPERTIES:
        raise InvalidArgument("perturbation_id", f"unknown property '{property_id}'; known: "
                                                 f"{', '.join(PROPERTIES)}")
    fixed = dict(params or {})

    def perturb(image: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
        return apply_property(property_id, image, epsilon, rng, fixed)

    perturb.__name__ = f"perturb_{property_id}"
    return perturb


@dataclass(frozen=True, kw_only=True)
class KnobConfig:
    """PertKnob settings (PER-3). ``budget``: queries per image, clean query included (None =
    cells + 1, enough for a full linear scan). See the module docstring for the modes."""

    mode: Literal["linear", "bisection"] = "linear"
    cells: int = 1000
    budget: int | None = None
    coarse_cells: int = 0
    batch: int = 1

    def __post_init__(self) -> None:
        v: list[FieldViolation] = []
        if self.mode not in ("linear", "bisection"):
            v.append(FieldViolation("pertknob.mode", "must be 'linear' or 'bisection'"))
        if isinstance(self.cells, bool) or not isinstance(self.cells, int) or self.cells < 1:
            v.append(FieldViolation("pertknob.cells", f"must be an integer >= 1, got "
                                                      f"{self.cells!r}"))
        if self.budget is not None and (isinstance(self.budget, bool)
                                        or not isinstance(self.budget, int) or self.budget < 1):
            v.append(FieldViolation("pertknob.budget", f"must be an integer >= 1, got "
                                                       f"{self.budget!r}"))
        if not isinstance(self.coarse_cells, int) or self.coarse_cells < 0:
            v.append(FieldViolation("pertknob.coarse_cells", "must be an integer >= 0"))
        if not isinstance(self.batch, int) or self.batch < 1:
            v.append(FieldViolation("pertknob.batch", "must be an integer >= 1"))
        if v:
            raise InvalidArgument.from_violations(v)

    @property
    def query_budget(self) -> int:
        return self.budget if self.budget is not None else self.cells + 1


@dataclass(frozen=True, kw_only=True)
class KnobResult:
    """PertKnob's answer for one image (PER-3).

    ``epsilon``: the minimal epsilon on the grid (``found``), 0 (``already_met``), an upper
    bound (``budget_exhausted`` after a hit) or None; ``l2`` / ``linf``: ||delta||_2 and
    ||delta||_inf of the perturbation at ``epsilon`` ([0, 1] scale). ``lower``: the largest
    epsilon seen not to meet the criterion (for bisection, assumed for every smaller epsilon);
    ``upper``: the smallest seen to meet it. ``queries``: images sent for this image.
    ``perturbed``: the perturbed image at ``epsilon`` when the search keeps images."""

    status: Status
    epsilon: float | None
    l2: float | None
    linf: float | None
    queries: int
    lower: float
    upper: float | None
    mode: str
    cells: int
    criterion: str
    perturbed: np.ndarray | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "epsilon": self.epsilon, "l2": self.l2,
                "linf": self.linf, "queries": self.queries, "lower": self.lower,
                "upper": self.upper, "mode": self.mode, "cells": self.cells,
                "criterion": self.criterion}


class _Search:
    """State of one image's search; indices are grid cells (0 = the clean image)."""

    def __init__(self, image: np.ndarray, ref: Reference, rng: np.random.Generator,
                 cfg: KnobConfig, criterion: Criterion) -> None:
        self.image = image
        self.ref = ref
        self.rng = rng
        self.cfg = cfg
        self.criterion = criterion
        self.budget = cfg.query_budget
        self.used = 0
        self.lo = 0                       # largest index known not to meet
        self.hi: int | None = None        # smallest index known to meet
        self.best: tuple[float, float, np.ndarray] | None = None   # l2, linf, image at hi
        self.status: Status | None = None
        k = cfg.cells
        if cfg.mode == "linear":
            self.scan = list(range(1, k + 1))
        elif cfg.coarse_cells > 0:
            c = min(cfg.coarse_cells, k)
            self.scan = sorted({max(1, round(j * k / c)) for j in range(1, c + 1)} | {k})
        else:
            self.scan = [k]
        self.pos = 0                      # next position in self.scan
        self.phase = "clean" if ref.original is None else "start"
        if self.phase == "start":
            self._after_clean(ref.original)

    # -- protocol
    def requests(self) -> list[int]:
        left = self.budget - self.used
        if self.status is not None:
            return []
        if left <= 0:
            self.status = "budget_exhausted"
            return []
        if self.phase == "clean":
            return [0]
        if self.phase == "scan":
            n = self.cfg.batch if self.cfg.mode == "linear" else 1
            return self.scan[self.pos:self.pos + min(n, left)]
        assert self.hi is not None        # bisect
        return [(self.lo + self.hi) // 2]

    def receive(self, idx: list[int], preds: Sequence[Any], imgs: list[np.ndarray]) -> None:
        self.used += len(idx)
        if self.phase == "clean":
            self.ref = replace(self.ref, original=preds[0])
            self._after_clean(preds[0])
            return
        if self.phase == "scan":
            for i, pred, img in zip(idx, preds, imgs, strict=True):
                self.pos += 1
                if self.criterion(pred, self.ref):
                    self._hit(i, img)
                    prev = self.scan[self.pos - 2] if self.pos >= 2 else 0
                    self.lo = max(self.lo, prev)
                    self.phase = "bisect"
                    break
                self.lo = i
            else:
                if self.pos >= len(self.scan):
                    self.status = "never_fooled"
                    return
        else:
            i, pred, img = idx[0], preds[0], imgs[0]
            if self.criterion(pred, self.ref):
                self._hit(i, img)
            else:
                self.lo = i
        if self.phase == "bisect" and self.hi is not None and self.hi - self.lo <= 1:
            self.status = "found"

    def _after_clean(self, clean_pred: Any) -> None:
        if self.criterion(clean_pred, self.ref):
            self.status = "already_met"
            self.hi = 0
            self.best = (0.0, 0.0, self.image.copy())
        self.phase = "scan"

    def _hit(self, i: int, img: np.ndarray) -> None:
        if self.hi is None or i < self.hi:
            self.hi = i
            self.best = (l2_distance(self.image, img), linf_distance(self.image, img), img)

    def result(self, keep: bool) -> KnobResult:
        k = self.cfg.cells
        status: Status = self.status if self.status is not None else "budget_exhausted"
        have = self.best is not None and self.hi is not None
        return KnobResult(
            status=status,
            epsilon=(self.hi / k if have and self.hi is not None else None),
            l2=self.best[0] if self.best is not None else None,
            linf=self.best[1] if self.best is not None else None,
            queries=self.used, lower=self.lo / k,
            upper=(self.hi / k if self.hi is not None else None),
            mode=self.cfg.mode, cells=k, criterion=self.criterion.name,
            perturbed=(self.best[2] if keep and self.best is not None else None))


def _check_images(images: Sequence[np.ndarray] | np.ndarray) -> list[np.ndarray]:
    out = []
    for n, im in enumerate(images):
        if not isinstance(im, np.ndarray) or im.dtype != np.uint8:
            raise InvalidArgument(f"images[{n}]", "must be a uint8 numpy array")
        out.append(im)
    if not out:
        raise InvalidArgument("images", "at least one image is needed")
    return out


def pertknob_search(images: Sequence[np.ndarray] | np.ndarray, perturb: Perturb,
                    criterion: Criterion, query: QueryFn, *,
                    rng: np.random.Generator | Sequence[np.random.Generator],
                    references: Sequence[Reference] | None = None,
                    config: KnobConfig | None = None, max_batch: int = 256,
                    keep_images: bool = False) -> list[KnobResult]:
    """PertKnob (PER-3) over several images in lock-step: each round every unfinished image
    contributes its next cell(s), and the perturbed images go to ``query`` together (chunks of
    at most ``max_batch`` images). Every image sent counts as one query of that image; an image
    never sends more than ``config.query_budget``.

    ``rng``: one generator per image, or one generator from which each image's generator is
    derived (one 63-bit seed drawn per image, in order). ``references[n]``: image n's ground
    truth / clean prediction / target box (default: ``Reference()``, i.e. the clean top-1 is
    the label)."""
    cfg = config or KnobConfig()
    ims = _check_images(images)
    refs = list(references) if references is not None else [Reference() for _ in ims]
    if len(refs) != len(ims):
        raise InvalidArgument("references", f"{len(refs)} references for {len(ims)} images")
    if isinstance(rng, np.random.Generator):
        seeds = rng.integers(0, 2**63 - 1, size=len(ims))
        rngs = [np.random.default_rng(int(s)) for s in seeds]
    else:
        rngs = list(rng)
        if len(rngs) != len(ims) or not all(isinstance(g, np.random.Generator) for g in rngs):
            raise InvalidArgument("rng", "give one numpy Generator, or one per image")
    if max_batch < 1:
        raise InvalidArgument("max_batch", "must be >= 1")
    searches = [_Search(im, ref, g, cfg, criterion)
                for im, ref, g in zip(ims, refs, rngs, strict=True)]

    while True:
        plan: list[tuple[int, list[int]]] = []
        for s_idx, s in enumerate(searches):
            req = s.requests()
            if req:
                plan.append((s_idx, req))
        if not plan:
            break
        batch_imgs: list[np.ndarray] = []
        for s_idx, req in plan:
            s = searches[s_idx]
            for i in req:
                if i == 0:
                    batch_imgs.append(s.image)
                else:
                    # every evaluation starts from the image's generator state (coherence)
                    img = perturb(s.image, i / cfg.cells, copy.deepcopy(s.rng))
                    if not isinstance(img, np.ndarray) or img.shape != s.image.shape:
                        raise InvalidArgument("perturb", "must return an image of the input's "
                                                         "shape")
                    batch_imgs.append(img)
        preds: list[Any] = []
        for start in range(0, len(batch_imgs), max_batch):
            chunk = batch_imgs[start:start + max_batch]
            got = list(query(chunk))
            if len(got) != len(chunk):
                raise InvalidArgument("query", f"returned {len(got)} predictions for "
                                                f"{len(chunk)} images")
            preds.extend(got)
        pos = 0
        for s_idx, req in plan:
            n = len(req)
            searches[s_idx].receive(req, preds[pos:pos + n], batch_imgs[pos:pos + n])
            pos += n
    return [s.result(keep_images) for s in searches]


def pertknob(image: np.ndarray, perturb: Perturb, criterion: Criterion, query: QueryFn, *,
             rng: np.random.Generator, reference: Reference | None = None,
             config: KnobConfig | None = None, keep_images: bool = False) -> KnobResult:
    """PertKnob (PER-3) for one image; ``rng`` is used as the image's own generator."""
    return pertknob_search([image], perturb, criterion, query, rng=[rng],
                           references=[reference or Reference()], config=config,
                           keep_images=keep_images)[0]
