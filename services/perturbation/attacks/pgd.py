"""PGD, Projected Gradient Descent (IEEE-A7 transfer, L-inf or L2; Madry et al. 2018): steps
on the surrogate's loss from a random start in the ball, each projected back onto it (signed
steps in L-inf, normalised gradient steps in L2), untargeted or targeted, crafted on a local
surrogate (or an ensemble, with boosters: ``whitebox.py``) and sent to the target
afterwards. Without the random start it is BIM with PGD's step. Registry entry: :data:`SPEC`."""

from __future__ import annotations

import numpy as np
import torch
from fortis.core.task import Task
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.params import Param

from .base import AttackContext, AttackResult, AttackSpec, check_linf_epsilon
from .gradient import Steps, run_steps, sign_gradient_linf
from .whitebox import BOOSTER_PARAMS


def pgd(model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, *, epsilon: float,
        steps: int = 10, step_size: float | None = None, random_start: bool = True,
        generator: torch.Generator | None = None) -> list[AttackResult]:
    """Projected Gradient Descent, L-inf, untargeted (IEEE-A7, Madry et al. 2018).

    ``step_size`` defaults to ``2.5 * epsilon / steps``. The random start draws from
    ``generator``; when none is given a generator seeded with 0 is used, so the result is
    deterministic either way. Returns the last iterate, quantised to uint8 within the bound.
    """
    if isinstance(steps, bool) or int(steps) != steps or steps < 0:
        raise InvalidArgument("steps", f"must be an integer >= 0, got {steps!r}")
    size = 2.5 * float(epsilon) / max(int(steps), 1) if not step_size else float(step_size)
    if not np.isfinite(size) or size < 0:
        raise InvalidArgument("step_size", f"must be a finite number >= 0, got {step_size!r}")
    if random_start and generator is None:
        generator = torch.Generator().manual_seed(0)
    return sign_gradient_linf(model, images, labels, epsilon, steps=int(steps), step_size=size,
                              random_start=random_start, generator=generator)


def run(ctx: AttackContext) -> list[AttackResult]:
    p = ctx.params
    eps, steps = float(p["epsilon"]), int(p["steps"])
    size = float(p["step_size"]) or 2.5 * eps / max(steps, 1)
    return run_steps(ctx, Steps(epsilon=eps, steps=steps, step_size=size, norm=p["norm"],
                                random_start=bool(p["random_start"])))


SPEC = AttackSpec(
    check=check_linf_epsilon,
    id="pgd", kind="transfer", family="gradient", norms=("linf", "l2"),
    refs=("IEEE-A7", "IEEE-A9"), needs_surrogate=True, targeted=True,
    tasks=(Task.CLASSIFICATION, Task.DETECTION, Task.SEGMENTATION),
    description="Projected Gradient Descent (Madry et al. 2018, L-inf or L2) on the local "
                "surrogate, then sent to the target",
    params=(Param(name="epsilon", type="float", minimum=0.0, maximum=1000.0,
                  description="bound in [0,1] pixel scale (IEEE-A9): L-inf <= 1, or the L2 "
                              "radius with norm l2"),
            Param(name="norm", type="string", default="linf", choices=("linf", "l2"),
                  description="the bound's norm"),
            Param(name="steps", type="int", default=10, description="iterations",
                  minimum=1, maximum=1000),
            Param(name="step_size", type="float", default=0.0,
                  description="step in [0,1] scale; 0 = 2.5*epsilon/steps",
                  minimum=0.0, maximum=1000.0),
            Param(name="random_start", type="bool", default=True,
                  description="start at a random point in the ball"),
            *BOOSTER_PARAMS),
    run=run)
