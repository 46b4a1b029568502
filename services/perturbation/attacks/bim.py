"""BIM, the Basic Iterative Method (IEEE-A7 transfer, L-inf; Kurakin et al. 2017, "Adversarial
examples in the physical world"): FGSM repeated with a small step from the clean image, each
iterate clipped to the epsilon ball and [0, 1]; untargeted or targeted (the paper's
iterative least-likely class method is the targeted form with that class). The paper's
defaults: step 1/255 and ``min(eps*255 + 4, 1.25 * eps*255)`` iterations. Boosters and
ensembles: ``whitebox.py``. Registry entry: :data:`SPEC`."""

from __future__ import annotations

from fortis.core.task import Task
from fortis.services.common.params import Param

from .base import EPSILON_LINF, AttackContext, AttackResult, AttackSpec
from .gradient import Steps, run_steps
from .whitebox import BOOSTER_PARAMS


def kurakin_steps(epsilon: float) -> int:
    """The paper's number of iterations: ``min(eps*255 + 4, 1.25 * eps*255)``, at least 1."""
    e = float(epsilon) * 255.0
    return max(1, int(min(e + 4.0, 1.25 * e)))


def run(ctx: AttackContext) -> list[AttackResult]:
    p = ctx.params
    eps = float(p["epsilon"])
    steps = int(p["steps"]) or kurakin_steps(eps)
    size = float(p["step_size"]) or 1.0 / 255.0
    return run_steps(ctx, Steps(epsilon=eps, steps=steps, step_size=size))


SPEC = AttackSpec(
    id="bim", kind="transfer", family="gradient", norms=("linf",),
    refs=("IEEE-A7", "IEEE-A9"), needs_surrogate=True, stochastic=False, targeted=True,
    tasks=(Task.CLASSIFICATION, Task.DETECTION, Task.SEGMENTATION),
    description="Basic Iterative Method (Kurakin et al. 2017): iterated FGSM from the clean "
                "image on the local surrogate, then sent to the target",
    params=(EPSILON_LINF,
            Param(name="steps", type="int", default=0, minimum=0, maximum=1000,
                  description="iterations; 0 = the paper's min(eps*255+4, 1.25*eps*255)"),
            Param(name="step_size", type="float", default=0.0, minimum=0.0, maximum=1.0,
                  description="step in [0,1] scale; 0 = the paper's 1/255"),
            *BOOSTER_PARAMS),
    run=run)
