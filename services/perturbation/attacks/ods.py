"""ODS, Output Diversified Sampling, in SimBA (SimBA-ODS): score-based, L2, untargeted and
targeted, with a local surrogate's gradients as the search directions (IEEE-A8, IEEE-A9,
IEEE-M6).

Tashiro, Song and Ermon, "Diversity can be Transferable: Output Diversification for White- and
Black-box Attacks", NeurIPS 2020 (authors' code: ``ermongroup/ODS``,
``blackbox_simbaODS.py``).

For black-box attacks the paper replaces the random directions of a query attack by ODS
directions computed on a surrogate the tester holds: for a random weight vector
``w ~ U(-1, 1)^C`` over the surrogate's ``C`` outputs ``f``,
``v_ODS = grad_x (w . f(x)) / ||grad_x (w . f(x))||_2``, taken at the current iterate. SimBA-ODS
(the paper's score-based attack): per iteration one new ODS direction per image (with several
surrogates, a random one each time), try ``x + step * v`` then ``x - step * v`` and keep the
first that lowers the loss; stop at success. Step size 0.2 (the authors' default).

The paper's claim, shown in ``tests/reference/test_attacks_simba_ods.py`` on the project's
Fashion-MNIST CNN with the project's surrogate (another architecture): SimBA-ODS needs fewer
queries than SimBA (pixel and DCT) for the same or higher success.

Deviations, all on purpose (shared with ``simba.py``, whose loop this reuses): the loss is the
criterion's margin (``ctx.margin_query()``) instead of the target's logit margin / cross
entropy; an explicit L2 bound ``epsilon`` (IEEE-A9, candidates outside it scaled back onto
it); candidates rounded to the uint8 image the target receives inside the ball, success judged
on it; the clean image is the first query and counted; every running image moves in one query
call per probe; a zero surrogate gradient (e.g. saturated ReLUs) falls back to a random
pixel direction instead of dividing by zero. The surrogate is only differentiated (never
queried through the proxy); it must take the images at their size
(``base.check_surrogate_input``). Registry entry: :data:`SPEC`. Domain code: no gRPC.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from fortis.core.task import Task
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.params import Param

from .base import (
    MAX_QUERIES,
    STOP_BUDGET,
    AttackContext,
    AttackResult,
    AttackSpec,
    Criterion,
    MarginQuery,
    check_surrogate_input,
)
from .score_run import ScoreRun, l2_levels
from .simba import Directions, simba_search

#: The authors' default (``blackbox_simbaODS.py --step_size 0.2``); signs tried in their order.
DEFAULTS = {"step_size": 0.2}
SIGNS = (1, -1)
CHUNK = 64  # images per surrogate forward/backward pass


def ods_directions(models: Sequence[torch.nn.Module], x: np.ndarray, delta: np.ndarray,
                   rng: np.random.Generator) -> np.ndarray:
    """Unit ODS directions ([0, 1] image scale, ``N x H x W x C`` float64) at the images
    ``clip(x + delta)`` (uint8 levels): per image a random surrogate and a random
    ``w ~ U(-1, 1)^C``, the normalised input gradient of ``w . logits``."""
    n = x.shape[0]
    pick = rng.integers(0, len(models), size=n)
    out = np.zeros(x.shape, dtype=np.float64)
    cur = np.clip(x.astype(np.float64) + delta, 0.0, 255.0) / 255.0
    for mi, model in enumerate(models):
        who = np.flatnonzero(pick == mi)
        for s in range(0, len(who), CHUNK):
            part = who[s:s + CHUNK]
            t = torch.from_numpy(np.ascontiguousarray(
                cur[part].transpose(0, 3, 1, 2), dtype=np.float32)).requires_grad_(True)
            with torch.enable_grad():
                logits = model(t)
                if logits.ndim != 2 or logits.shape[0] != len(part):
                    raise InvalidArgument("surrogate", "model must return N x classes logits, "
                                                       f"got {tuple(logits.shape)}")
                w = torch.from_numpy(rng.uniform(-1.0, 1.0, size=tuple(logits.shape))
                                     .astype(np.float32))
                (g,) = torch.autograd.grad((logits * w).sum(), t)
            out[part] = g.detach().numpy().transpose(0, 2, 3, 1)
    flat = out.reshape(n, -1)
    norm = np.sqrt(np.sum(flat * flat, axis=1))
    dead = norm <= 1e-20
    if dead.any():  # no gradient signal: a random pixel direction instead of 0 / 0
        flat[dead] = 0.0
        flat[np.flatnonzero(dead), rng.integers(0, flat.shape[1], size=int(dead.sum()))] = 1.0
        norm[dead] = 1.0
    return (flat / norm[:, None]).reshape(x.shape)


def ods_attack(margin: MarginQuery, images: np.ndarray, labels: np.ndarray, *,
               surrogate: torch.nn.Module | Sequence[torch.nn.Module], epsilon: float,
               max_queries: int, rng: np.random.Generator,
               step_size: float = DEFAULTS["step_size"], criterion: Criterion | None = None,
               spent: np.ndarray | None = None) -> list[AttackResult]:
    """SimBA-ODS on a batch; one result per image, in order. ``surrogate``: one torch module
    or several (float32 NCHW in [0, 1] -> logits), each left in the mode it was in.
    ``margin``: the criterion's margins (``criterion`` is accepted for the common signature
    and not needed). ``epsilon``: L2 bound in [0, 1] scale (IEEE-A9)."""
    models = [surrogate] if isinstance(surrogate, torch.nn.Module) else list(surrogate)
    if not models or not all(isinstance(m, torch.nn.Module) for m in models):
        raise InvalidArgument("surrogate", "ODS needs one or more torch surrogate models")
    run = ScoreRun(margin, images, labels, max_queries, spent)
    l2_levels(epsilon)
    if not np.isfinite(step_size) or step_size <= 0.0:
        raise InvalidArgument("step_size", f"must be > 0, got {step_size!r}")
    if run.n == 0:
        return []
    modes = [m.training for m in models]
    for m in models:
        m.eval()
    x = run.images

    def directions(_k: int, idx: np.ndarray, delta: np.ndarray) -> np.ndarray:
        return ods_directions(models, x[idx], delta, rng)

    d: Directions = directions
    try:
        run.begin()
        simba_search(run, d, step_size=step_size, epsilon=epsilon, signs=SIGNS)
    finally:
        for m, was in zip(models, modes, strict=True):
            m.train(was)
    return run.results(STOP_BUDGET)


def run(ctx: AttackContext) -> list[AttackResult]:
    if ctx.surrogate is None:
        raise InvalidArgument("surrogate", "ods (SimBA-ODS) needs a surrogate model for its "
                                           "directions: name one in the plan")
    check_surrogate_input(ctx.surrogate, ctx.images.shape[1:])
    p = ctx.params
    return ods_attack(ctx.margin_query(), ctx.images, ctx.labels, surrogate=ctx.surrogate.model,
                      epsilon=p["epsilon"], max_queries=p["max_queries"], rng=ctx.rng(),
                      step_size=p["step_size"], criterion=ctx.criterion, spent=ctx.spent())


SPEC = AttackSpec(
    id="ods", kind="score", family="score-based", norms=("l2",),
    refs=("IEEE-A8", "IEEE-A9", "IEEE-M6"), targeted=True, uses_surrogate=True,
    tasks=(Task.CLASSIFICATION,),
    description="SimBA-ODS (Tashiro et al., NeurIPS 2020): SimBA along output-diversified "
                "directions from a local classifier surrogate's gradients (L2, score-based)",
    params=(Param(name="epsilon", type="float", minimum=0.0, maximum=1e4,
                  description="L2 bound in [0,1] pixel scale (IEEE-A9)"),
            MAX_QUERIES,
            Param(name="step_size", type="float", default=DEFAULTS["step_size"],
                  minimum=1e-6, maximum=10.0,
                  description="step along each ODS direction, L2 in [0,1] scale (paper: 0.2)")),
    run=run)
