"""Greedy Local Search (LocSearchAdv), score-based, L0, untargeted and targeted (IEEE-A8,
IEEE-A9, IEEE-M6).

Narodytska and Kasiviswanathan, "Simple Black-Box Adversarial Attacks on Deep Neural
Networks", CVPR Workshops 2017 (Algorithm 3, ``LocSearchAdv``; the reference implementations
are Foolbox 2's ``LocalSearchAttack`` and advertorch's ``LocalSearchAttack``).

Pixel values are seen in the paper's normalised range ``[LB, UB] = [-1/2, 1/2]``
(``v = level / 255 - 1/2``). Per round ``i`` on the current image ``I``:

1. **Pixel sensitivity** on the candidate locations ``P`` (at first a random 10 % of the
   locations): for each ``(r, c)`` in ``P``, the image with that pixel set to
   ``p * sign(I(b, r, c))`` in every channel ``b`` ("PERT"; with ``p >= 1/2`` that is the
   extreme value on the pixel's side of mid-grey), scored by the target.
2. The ``t`` locations whose probe scored best are perturbed for good: each channel value
   ``v`` becomes ``CYC(r v)`` (multiply by ``r``, wrap into ``[LB, UB]``).
3. Stop when the image is adversarial; else ``P`` = the ``(2d+1) x (2d+1)`` neighbourhoods of
   the ``t`` locations, and the next round.

Defaults (:data:`DEFAULTS`, the reference implementations'): ``p = 10``, ``r = 1.5``,
``d = 5``, ``t = 5``, ``R = 150`` rounds, first candidates 10 % of the locations, at most 128
candidates scored per round (Foolbox's and advertorch's random subset "for efficiency"; the
paper scores the whole neighbourhood, up to ``t (2d+1)^2 = 605`` queries per round).

Deviations, all on purpose:

* **The score is the criterion's margin** (``ctx.margin_query()``) instead of the true class
  probability (lower is better in both): any task, top-k scores, targeted or not.
* **The L0 bound** ``epsilon`` (IEEE-A9: pixel locations changed, any channel): the paper has
  none besides ``t R``. Once ``epsilon`` locations differ from the original, only locations
  already changed are scored and perturbed; a round never perturbs more new locations than
  the bound leaves. Every image asked lies within it.
* **uint8**: every probe and every round's image is rounded to the uint8 image the target
  receives (a PERT value outside ``[LB, UB]`` saturates at 0 or 255, as a target receiving
  uint8 sees it; Foolbox 2 scored such out-of-range images unclipped). Success is judged on
  those images: a probe that already meets the criterion is a success.
* **Queries**: the clean image is the first query and counted; each round asks its probes
  and then the perturbed image (the paper's check). A round shrinks its candidate subset to
  the queries left (one kept for the check); an image stops at its first success or at Q_m,
  never later, or after ``R`` rounds (``iterations``).
* Every running image is probed in one query call per round (split only to bound memory).

Registry entry: :data:`SPEC`. Domain code: no gRPC.
"""

from __future__ import annotations

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
from .score_run import ScoreRun

#: Foolbox 2 / advertorch defaults (Narodytska & Kasiviswanathan's parameter names).
DEFAULTS = {"p": 10.0, "r": 1.5, "d": 5, "t": 5, "rounds": 150, "seed_ratio": 0.1,
            "max_candidates": 128}
MAX_CALL_ELEMENTS = 1 << 24  # uint8 elements per query call (probes of many images)


def _dilate(mask: np.ndarray, d: int) -> np.ndarray:
    """``mask`` (N x H x W bool) dilated by a ``(2d+1) x (2d+1)`` square (integral image)."""
    n, h, w = mask.shape
    ii = np.zeros((n, h + 1, w + 1), dtype=np.int64)
    ii[:, 1:, 1:] = mask.astype(np.int64).cumsum(1).cumsum(2)
    r0 = np.clip(np.arange(h) - d, 0, h)
    r1 = np.clip(np.arange(h) + d + 1, 0, h)
    c0 = np.clip(np.arange(w) - d, 0, w)
    c1 = np.clip(np.arange(w) + d + 1, 0, w)
    box = (ii[:, r1][:, :, c1] - ii[:, r0][:, :, c1] - ii[:, r1][:, :, c0]
           + ii[:, r0][:, :, c0])
    return box > 0


def _pert(values: np.ndarray, p: float) -> np.ndarray:
    """PERT of uint8 pixel values (any shape): ``p * sign(v)`` in ``[-1/2, 1/2]``, back in
    levels and rounded into [0, 255]."""
    v = values.astype(np.float64) / 255.0 - 0.5
    return np.clip(np.rint((p * np.sign(v) + 0.5) * 255.0), 0, 255).astype(np.uint8)


def _cyclic(values: np.ndarray, r: float) -> np.ndarray:
    """CYC(r v) of uint8 pixel values: multiply by ``r`` in ``[-1/2, 1/2]``, wrap back into
    it by adding or subtracting ``UB - LB = 1``, back in levels."""
    v = r * (values.astype(np.float64) / 255.0 - 0.5)
    v = np.where(v < -0.5, v + 1.0, np.where(v > 0.5, v - 1.0, v))
    return np.clip(np.rint((v + 0.5) * 255.0), 0, 255).astype(np.uint8)


def local_search_attack(margin: MarginQuery, images: np.ndarray, labels: np.ndarray, *,
                        epsilon: int, max_queries: int, rng: np.random.Generator,
                        p: float = DEFAULTS["p"], r: float = DEFAULTS["r"],
                        d: int = int(DEFAULTS["d"]), t: int = int(DEFAULTS["t"]),
                        rounds: int = int(DEFAULTS["rounds"]),
                        seed_ratio: float = DEFAULTS["seed_ratio"],
                        max_candidates: int = int(DEFAULTS["max_candidates"]),
                        criterion: Criterion | None = None,
                        spent: np.ndarray | None = None) -> list[AttackResult]:
    """LocSearchAdv on a batch; one result per image, in order. ``margin``: the criterion's
    margins (< 0 = success; ``criterion`` is accepted for the common signature and not
    needed). ``epsilon``: L0 bound, pixel locations changed (IEEE-A9)."""
    run = ScoreRun(margin, images, labels, max_queries, spent)
    if isinstance(epsilon, bool) or int(epsilon) != epsilon or epsilon < 0:
        raise InvalidArgument("epsilon", f"L0 bound: pixels changed, an integer >= 0, got "
                                         f"{epsilon!r}")
    for name, v in (("d", d), ("t", t), ("rounds", rounds), ("max_candidates", max_candidates)):
        if isinstance(v, bool) or int(v) != v or v < (0 if name == "d" else 1):
            raise InvalidArgument(name, f"must be an integer >= {0 if name == 'd' else 1}, "
                                        f"got {v!r}")
    if not np.isfinite(p) or p <= 0 or not np.isfinite(r) or not 0 <= r <= 2:
        raise InvalidArgument("r", "needs p > 0 and r in [0, 2]")
    if not 0.0 < seed_ratio <= 1.0:
        raise InvalidArgument("seed_ratio", f"must be in (0, 1], got {seed_ratio!r}")
    if run.n == 0:
        return []
    x = run.images
    n, h, w, c = x.shape
    bound = int(epsilon)
    cur = x.copy()
    run.begin()
    if bound == 0:
        return run.results(STOP_ITERATIONS)
    # first candidates: a random seed_ratio of the locations (at least one)
    n_seed = max(1, int(seed_ratio * h * w))
    cand = np.zeros((n, h, w), dtype=bool)
    first = np.argsort(rng.random((n, h * w)), axis=1)[:, :n_seed]
    np.put_along_axis(cand.reshape(n, -1), first, True, axis=1)
    per_image = h * w * c
    for _ in range(int(rounds)):
        active = run.running()
        if not len(active):
            break
        k = len(active)
        changed = np.any(cur[active] != x[active], axis=3)                 # k x h x w
        room = bound - changed.reshape(k, -1).sum(axis=1)                  # new pixels left
        allowed = cand[active] & (changed | (room > 0)[:, None, None])
        # a random subset of at most max_candidates, and one query kept for the check
        width = min(int(max_candidates), h * w)
        keys = np.where(allowed.reshape(k, -1), rng.random((k, h * w)), np.inf)
        slots = np.argsort(keys, axis=1)[:, :width]                        # k x width
        valid = np.isfinite(np.take_along_axis(keys, slots, axis=1))
        valid &= np.arange(width)[None, :] < (run.remaining(active) - 1)[:, None]
        none = ~valid.any(axis=1)
        run.finish(STOP_ITERATIONS, active[none])   # nothing left to probe
        keep = ~none
        active, slots, valid, changed, room = (active[keep], slots[keep], valid[keep],
                                               changed[keep], room[keep])
        k = len(active)
        if not k:
            break
        # 1. probes: one pixel set to PERT of its own values
        scores = np.full((k, width), np.inf)
        step = max(1, MAX_CALL_ELEMENTS // (per_image * width))
        for s in range(0, k, step):
            part = np.arange(s, min(k, s + step))
            ii, jj = np.nonzero(valid[part])
            img = active[part][ii]
            rr, cc = np.divmod(slots[part][ii, jj], w)
            probes = cur[img].copy()
            probes[np.arange(len(img)), rr, cc, :] = _pert(cur[img, rr, cc, :], p)
            m = run.ask(img, probes)
            if m is not None:
                scores[part[ii], jj] = m
        # 2. the t best-scoring locations, at most `room` of them new
        go = np.array([run.stop[int(i)] is None for i in active])
        order = np.argsort(scores, axis=1)[:, :int(t)]
        best = np.take_along_axis(slots, order, axis=1)                    # k x t'
        ok = np.isfinite(np.take_along_axis(scores, order, axis=1)) & go[:, None]
        is_new = ~np.take_along_axis(changed.reshape(k, -1), best, axis=1)
        ok &= ~is_new | (np.cumsum(is_new & ok, axis=1) <= room[:, None])
        ii, jj = np.nonzero(ok)
        img = active[ii]
        rr, cc = np.divmod(best[ii, jj], w)
        cur[img, rr, cc, :] = _cyclic(cur[img, rr, cc, :], r)
        # 3. the check: ask the perturbed image; next candidates = neighbourhoods
        check = active[go & ok.any(axis=1) & (run.remaining(active) > 0)]
        if len(check):
            run.ask(check, cur[check])
        sel = np.zeros((k, h, w), dtype=bool)
        sel[ii, rr, cc] = True
        cand[active] = _dilate(sel, int(d))
    return run.results(STOP_ITERATIONS)


def run(ctx: AttackContext) -> list[AttackResult]:
    q = ctx.params
    return local_search_attack(ctx.margin_query(), ctx.images, ctx.labels,
                               epsilon=q["epsilon"], max_queries=q["max_queries"], rng=ctx.rng(),
                               p=q["p"], r=q["r"], d=q["d"], t=q["t"], rounds=q["rounds"],
                               criterion=ctx.criterion, spent=ctx.spent())


SPEC = AttackSpec(
    id="local_search", kind="score", family="score-based", norms=("l0",),
    refs=("IEEE-A8", "IEEE-A9", "IEEE-M6"), targeted=True,
    description="Greedy Local Search, LocSearchAdv (Narodytska & Kasiviswanathan, CVPR-W "
                "2017): perturb the few most sensitive pixels around the best ones (L0, "
                "score-based)",
    params=(Param(name="epsilon", type="int", minimum=0, maximum=1 << 30,
                  description="L0 bound: pixel locations changed (IEEE-A9)"),
            MAX_QUERIES,
            Param(name="p", type="float", default=DEFAULTS["p"], minimum=1e-6, maximum=1e3,
                  description="sensitivity probe p * sign(pixel) in [-1/2, 1/2] (>= 1/2 "
                              "saturates to 0/255)"),
            Param(name="r", type="float", default=DEFAULTS["r"], minimum=0.0, maximum=2.0,
                  description="cyclic perturbation factor"),
            Param(name="d", type="int", default=int(DEFAULTS["d"]), minimum=0, maximum=1000,
                  description="half side of the neighbourhood square"),
            Param(name="t", type="int", default=int(DEFAULTS["t"]), minimum=1, maximum=1000,
                  description="pixels perturbed per round"),
            Param(name="rounds", type="int", default=int(DEFAULTS["rounds"]), minimum=1,
                  maximum=100_000, description="rounds R")),
    run=run)
