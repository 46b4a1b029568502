"""FGSM, the Fast Gradient Sign Method (IEEE-A7 transfer, L-inf; Goodfellow et al. 2015):
one signed-gradient step of size epsilon on the surrogate's loss -- cross-entropy on the true
label, or towards the target class (targeted) -- crafted on a local surrogate (or an
ensemble, with the DI / TI / SI boosters: ``whitebox.py``) and sent to the target afterwards
(so the target's answer, not this module, decides success). Registry entry: :data:`SPEC`."""

from __future__ import annotations

import numpy as np
import torch
from fortis.core.task import Task

from .base import EPSILON_LINF, AttackContext, AttackResult, AttackSpec
from .gradient import Steps, run_steps, sign_gradient_linf
from .whitebox import BOOSTER_PARAMS


def fgsm(model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, *,
         epsilon: float) -> list[AttackResult]:
    """Fast Gradient Sign Method (IEEE-A7, Goodfellow et al. 2015): one signed-gradient step
    of size ``epsilon`` on the cross-entropy of the surrogate, untargeted, L-inf."""
    return sign_gradient_linf(model, images, labels, epsilon, steps=1, step_size=float(epsilon),
                              random_start=False, generator=None)


def run(ctx: AttackContext) -> list[AttackResult]:
    eps = float(ctx.params["epsilon"])
    return run_steps(ctx, Steps(epsilon=eps, steps=1, step_size=eps))


SPEC = AttackSpec(
    id="fgsm", kind="transfer", family="gradient", norms=("linf",),
    refs=("IEEE-A7", "IEEE-A9"), needs_surrogate=True, stochastic=False, targeted=True,
    tasks=(Task.CLASSIFICATION, Task.DETECTION, Task.SEGMENTATION),
    description="Fast Gradient Sign Method (Goodfellow et al. 2015): one signed-gradient step "
                "on the local surrogate, then sent to the target",
    params=(EPSILON_LINF, *BOOSTER_PARAMS), run=run)
