"""The single-pixel attack (one-pixel attack), score-based, L0, untargeted and targeted:
differential evolution over ``k`` pixels' positions and values (IEEE-A8, IEEE-A9, IEEE-M6).

Su, Vargas and Sakurai, "One Pixel Attack for Fooling Deep Neural Networks", IEEE Transactions
on Evolutionary Computation 23(5), 2019. A candidate is ``k`` tuples ``(row, col, v_1..v_C)``
(the paper's ``(x, y, r, g, b)``; one value per channel); the image it stands for is the
original with those ``k`` pixels set to those values. Differential evolution, as the paper:

* population of ``popsize`` = 400 candidates per image; positions drawn uniformly over the
  image, values from N(128, 127) (the paper's initialisation), clipped to [0, 255];
* each generation, for every member ``i`` a child ``x_r1 + F (x_r2 - x_r3)`` with three
  distinct random other members and ``F = 0.5``, no crossover (DE/rand/1); the child replaces
  its parent when its fitness is better;
* fitness: the criterion's margin (below); at most ``generations`` = 100 generations
  (the paper's maximum), the attack stops as soon as a candidate succeeds.

``epsilon`` is the L0 bound ``k`` (IEEE-A9: pixel locations changed, default 1 = the one-pixel
attack; Vargas et al.'s few-pixel variants are ``k`` = 3, 5). Every candidate changes at most
``k`` locations, so every image asked lies within the bound.

Deviations, all on purpose:

* **The fitness is the criterion's margin** (``ctx.margin_query()``, < 0 where the criterion
  holds) instead of the true-class probability (untargeted) or the target-class probability
  (targeted): any task, top-k scores, the same attack targeted or not. The paper's early stop
  (true-class probability below 5 %, or target above 50 %) becomes the criterion itself:
  an image stops at its first success, judged on the uint8 image the target received.
* **Positions and values** evolve as floats, as in the paper; the image asked uses
  ``floor`` of the position (clipped into the image) and the value rounded to an integer
  level. A mutated component outside its range is clipped back to it.
* **Queries**: the clean image first, counted; then ``popsize`` per generation (the initial
  population is generation 0). A generation that would pass Q_m evaluates only the first
  children the budget leaves (the rest keep their parents); an image stops at its first
  success or at Q_m, never later, or after ``generations`` generations (``iterations``).
  The paper's budget is 400 x 100 = 40,000 queries: with a budget of a few hundred the
  search is mostly the random initial population; ``popsize`` is a parameter (the
  references' smaller populations, e.g. torchattacks' 10 x dimensions, fit small budgets).
* **Blocks**: a generation is asked in blocks of ``block_size`` = 50 candidates per image,
  every running image's block in one query call (split only to bound memory), so an image
  that succeeds stops within 50 queries instead of paying for its whole population (the
  paper evaluates one candidate at a time; one call per generation would charge up to 400
  queries after the one that succeeded). The algorithm is unchanged: every child is built
  from the previous generation. Each image has its own population and random draws.

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

#: The paper's parameters (Su, Vargas, Sakurai 2019, section IV): population 400, F = 0.5,
#: 100 generations, values initialised from N(128, 127).
DEFAULTS = {"pixels": 1, "popsize": 400, "generations": 100, "mutation": 0.5,
            "init_mean": 128.0, "init_std": 127.0}
MAX_CALL_ELEMENTS = 1 << 24  # uint8 elements per query call
MAX_REDRAW = 32  # bounded redraws of coinciding DE members
BLOCK = 50  # candidates per image per query call: a success stops the image within 50 rows


def _images(x: np.ndarray, who: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """uint8 images: ``x[who[j]]`` with the ``k`` pixels of candidate ``cand[j]``
    (``k x (2 + C)``: row, col, values) set."""
    h, w = x.shape[1], x.shape[2]
    out = x[who].copy()
    rows = np.clip(np.floor(cand[:, :, 0]), 0, h - 1).astype(np.int64)      # m x k
    cols = np.clip(np.floor(cand[:, :, 1]), 0, w - 1).astype(np.int64)
    vals = np.clip(np.rint(cand[:, :, 2:]), 0, 255).astype(np.uint8)       # m x k x C
    out[np.arange(len(who))[:, None], rows, cols] = vals
    return out


def _three_others(rng: np.random.Generator, a: int, pop: int) -> np.ndarray:
    """``a x pop x 3`` member indices: for each member ``i`` three distinct members other than
    ``i`` (redrawn where two coincide, a bounded number of times, then the next three)."""
    me = np.arange(pop)[None, :, None]
    r = rng.integers(0, pop - 1, size=(a, pop, 3))
    r += r >= me                                                          # skip i itself
    for _ in range(MAX_REDRAW):
        clash = (r[..., 0] == r[..., 1]) | (r[..., 0] == r[..., 2]) | (r[..., 1] == r[..., 2])
        if not clash.any():
            return r
        fresh = rng.integers(0, pop - 1, size=(int(clash.sum()), 3))
        r[clash] = fresh + (fresh >= np.broadcast_to(me[..., 0], clash.shape)[clash][:, None])
    clash = (r[..., 0] == r[..., 1]) | (r[..., 0] == r[..., 2]) | (r[..., 1] == r[..., 2])
    r[clash] = (np.broadcast_to(me, r.shape)[clash] + np.arange(1, 4)) % pop
    return r


def _clip(cand: np.ndarray, h: int, w: int) -> np.ndarray:
    cand[..., 0] = np.clip(cand[..., 0], 0.0, np.nextafter(h, 0))
    cand[..., 1] = np.clip(cand[..., 1], 0.0, np.nextafter(w, 0))
    cand[..., 2:] = np.clip(cand[..., 2:], 0.0, 255.0)
    return cand


def single_pixel_attack(margin: MarginQuery, images: np.ndarray, labels: np.ndarray, *,
                        epsilon: int = int(DEFAULTS["pixels"]), max_queries: int,
                        rng: np.random.Generator, popsize: int = int(DEFAULTS["popsize"]),
                        generations: int = int(DEFAULTS["generations"]),
                        mutation: float = DEFAULTS["mutation"],
                        block_size: int = BLOCK,
                        criterion: Criterion | None = None,
                        spent: np.ndarray | None = None) -> list[AttackResult]:
    """The one-pixel (``epsilon = 1``) or k-pixel attack by differential evolution on a batch;
    one result per image, in order. ``margin``: the criterion's margins (< 0 = success;
    ``criterion`` is accepted for the common signature and not needed). ``epsilon``: the L0
    bound, pixel locations changed (IEEE-A9)."""
    run = ScoreRun(margin, images, labels, max_queries, spent)
    if isinstance(epsilon, bool) or int(epsilon) != epsilon or epsilon < 0:
        raise InvalidArgument("epsilon", f"L0 bound: pixels changed, an integer >= 0, got "
                                         f"{epsilon!r}")
    if isinstance(popsize, bool) or int(popsize) != popsize or popsize < 4:
        raise InvalidArgument("popsize", f"must be an integer >= 4 (DE/rand/1 needs three "
                                         f"other members), got {popsize!r}")
    if isinstance(generations, bool) or int(generations) != generations or generations < 0:
        raise InvalidArgument("generations", f"must be an integer >= 0, got {generations!r}")
    if isinstance(block_size, bool) or int(block_size) != block_size or block_size < 1:
        raise InvalidArgument("block_size", f"must be an integer >= 1, got {block_size!r}")
    if not np.isfinite(mutation) or not 0.0 < mutation <= 2.0:
        raise InvalidArgument("mutation", f"must be in (0, 2], got {mutation!r}")
    if run.n == 0:
        return []
    x = run.images
    n, h, w, c = x.shape
    k, pop = int(epsilon), int(popsize)
    run.begin()
    if k == 0:  # no pixel may change: do not spend queries
        return run.results(STOP_ITERATIONS)
    dims = 2 + c
    per_call = max(1, MAX_CALL_ELEMENTS // (h * w * c))
    block = min(pop, int(block_size))
    population = np.zeros((n, pop, k, dims))
    fitness = np.full((n, pop), np.inf)

    def draw(m: int) -> np.ndarray:
        cand = np.empty((m, pop, k, dims))
        cand[..., 0] = rng.uniform(0.0, h, size=(m, pop, k))
        cand[..., 1] = rng.uniform(0.0, w, size=(m, pop, k))
        cand[..., 2:] = rng.normal(DEFAULTS["init_mean"], DEFAULTS["init_std"],
                                   size=(m, pop, k, c))
        return _clip(cand, h, w)

    def ask(active: np.ndarray, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ask the candidates ``cand`` (a x pop x k x dims) of the active images, ``block``
        members of every image still running per call (an image stops at the first call in
        which one of its rows succeeds; the members it did not ask keep no fitness); returns
        (image slot, member, margin) of the rows asked."""
        slots, members, margins = [], [], []
        for start in range(0, pop, block):
            going = np.array([run.stop[int(i)] is None for i in active], dtype=bool)
            take = np.where(going, np.minimum(run.remaining(active), pop - start), 0)
            take = np.minimum(take, block)
            slot, off = np.nonzero(np.arange(block)[None, :] < take[:, None])
            if not len(slot):
                break
            member = start + off
            for s in range(0, len(slot), per_call):
                part = slice(s, s + per_call)
                who = active[slot[part]]
                m = run.ask(who, _images(x, who, cand[slot[part], member[part]]))
                slots.append(slot[part])
                members.append(member[part])
                margins.append(np.full(len(who), np.inf) if m is None else m)
        if not slots:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
        return np.concatenate(slots), np.concatenate(members), np.concatenate(margins)

    # generation 0: the initial population
    active = run.running()
    if len(active):
        population[active] = draw(len(active))
        slot, member, m = ask(active, population[active])
        fitness[active[slot], member] = m
    for _ in range(int(generations)):
        active = run.running()
        if not len(active):
            break
        a = len(active)
        # images whose initial population was cut short by the budget have no more queries:
        # they stopped above; every running image has a full, evaluated population here
        # DE/rand/1: three distinct members other than i, per image and member
        r = _three_others(rng, a, pop)
        p = population[active]
        ar = np.arange(a)[:, None]
        child = p[ar, r[..., 0]] + mutation * (p[ar, r[..., 1]] - p[ar, r[..., 2]])
        child = _clip(child, h, w)
        slot, member, m = ask(active, child)
        better = m < fitness[active[slot], member]
        population[active[slot[better]], member[better]] = child[slot[better], member[better]]
        fitness[active[slot[better]], member[better]] = m[better]
    return run.results(STOP_ITERATIONS)


def run(ctx: AttackContext) -> list[AttackResult]:
    p = ctx.params
    return single_pixel_attack(ctx.margin_query(), ctx.images, ctx.labels,
                               epsilon=p["epsilon"], max_queries=p["max_queries"],
                               rng=ctx.rng(), popsize=p["popsize"],
                               generations=p["generations"], mutation=p["mutation"],
                               criterion=ctx.criterion, spent=ctx.spent())


SPEC = AttackSpec(
    id="single_pixel", kind="score", family="score-based", norms=("l0",),
    refs=("IEEE-A8", "IEEE-A9", "IEEE-M6"), targeted=True,
    description="Single-pixel attack (Su, Vargas, Sakurai, IEEE TEVC 2019): differential "
                "evolution over k pixels' positions and values (L0, score-based)",
    params=(Param(name="epsilon", type="int", default=int(DEFAULTS["pixels"]), minimum=0,
                  maximum=1 << 20,
                  description="L0 bound: pixels changed (IEEE-A9; 1 = the one-pixel attack)"),
            MAX_QUERIES,
            Param(name="popsize", type="int", default=int(DEFAULTS["popsize"]), minimum=4,
                  maximum=100_000, description="candidates per image (paper: 400)"),
            Param(name="generations", type="int", default=int(DEFAULTS["generations"]),
                  minimum=0, maximum=1_000_000,
                  description="at most this many DE generations (paper: 100)"),
            Param(name="mutation", type="float", default=DEFAULTS["mutation"], minimum=1e-6,
                  maximum=2.0, description="DE scale factor F (paper: 0.5)")),
    run=run)
