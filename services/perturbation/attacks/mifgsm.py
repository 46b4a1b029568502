"""MI-FGSM, the Momentum Iterative Fast Gradient Sign Method (IEEE-A7 transfer, L-inf; Dong et
al. 2018, "Boosting adversarial attacks with momentum"): iterated sign steps along an
accumulated gradient ``g_{t+1} = mu * g_t + grad / ||grad||_1`` (the L1 norm taken as a mean,
as torchattacks does: the same direction), step ``epsilon / steps`` by default; untargeted or
targeted. Its boosters: NI (Nesterov look-ahead, Lin et al. 2020: NI-FGSM) and VMI
(variance tuning, Wang and He 2021: VMI-FGSM) here, DI / TI / SI and ensembles from
``whitebox.py`` (so DI-TI-SI-NI-VMI-FGSM is one set of parameters). Registry entry:
:data:`SPEC`."""

from __future__ import annotations

from fortis.core.task import Task
from fortis.services.common.params import Param

from .base import EPSILON_LINF, AttackContext, AttackResult, AttackSpec
from .gradient import Steps, run_steps
from .whitebox import BOOSTER_PARAMS, MOMENTUM_PARAMS


def run(ctx: AttackContext) -> list[AttackResult]:
    p = ctx.params
    eps, steps = float(p["epsilon"]), int(p["steps"])
    size = float(p["step_size"]) or eps / steps
    return run_steps(ctx, Steps(epsilon=eps, steps=steps, step_size=size,
                                decay=float(p["decay"]), nesterov=bool(p["nesterov"]),
                                vmi_samples=int(p["vmi_samples"]),
                                vmi_beta=float(p["vmi_beta"])))


SPEC = AttackSpec(
    id="mi_fgsm", kind="transfer", family="gradient", norms=("linf",),
    refs=("IEEE-A7", "IEEE-A9"), needs_surrogate=True, targeted=True,
    tasks=(Task.CLASSIFICATION, Task.DETECTION, Task.SEGMENTATION),
    description="Momentum Iterative FGSM (Dong et al. 2018) on the local surrogate, with the "
                "NI / VMI / DI / TI / SI boosters, then sent to the target",
    params=(EPSILON_LINF,
            Param(name="steps", type="int", default=10, minimum=1, maximum=1000,
                  description="iterations (the paper uses 10)"),
            Param(name="step_size", type="float", default=0.0, minimum=0.0, maximum=1.0,
                  description="step in [0,1] scale; 0 = the paper's epsilon/steps"),
            *MOMENTUM_PARAMS, *BOOSTER_PARAMS),
    run=run)
