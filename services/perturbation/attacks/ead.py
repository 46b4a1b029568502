"""EAD, the elastic-net attack (IEEE-A7 transfer, minimal-norm L1 / elastic net; Chen et al.
2018, "EAD: Elastic-net attacks to deep neural networks via adversarial examples"), crafted
white-box on a local surrogate (or an ensemble, with the DI / TI / SI boosters:
``whitebox.py``) and sent to the target afterwards.

Per image it minimises ``c * f(x') + ||x' - x||_2^2 + beta * ||x' - x||_1`` over the box
[0, 1], with ``f`` the C&W margin loss with confidence ``kappa`` (untargeted, or towards the
target class: ``cw.margins``), by FISTA (``fista``, the paper's default) or ISTA: a gradient
step on the smooth part at the slack point ``y_k``, then the projected
shrinkage-thresholding ``S_beta`` (the L1 part's proximal operator, clipped to [0, 1]):

    x_{k+1} = S_beta(y_k - a_k * grad(y_k)),   y_{k+1} = x_{k+1} + k / (k + 3) (x_{k+1} - x_k)

with the paper's code's square-root decay ``a_k = a_0 (1 - k / K)^(1/2)``. ``c`` is found
per image by the C&W binary search (``cw.update_consts``); rounds may stop early when the
loss stops decreasing. The decision rule (``decision_rule``) picks the returned image among
the adversarial iterates: the smallest elastic-net distance ``beta * L1 + L2^2`` ("EN") or
the smallest L1 ("L1").

As the other optimisation attacks (``cw.py``), every iterate is judged after uint8 rounding
with the surrogate's plain logits (margin at most ``-kappa``); the best such image is
returned, else the clean image. ``success`` None, ``queries`` 0. Registry entry:
:data:`SPEC`, declared with the norm ``l2`` (the registry's norms are linf / l2 / l0: there
is no L1; the results report L2 and L-inf, the objective is the elastic net). Domain code:
no gRPC.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.params import Param

from .base import AttackContext, AttackResult, AttackSpec, check_batch
from .cw import Best, check_int, check_number, margins, update_consts
from .whitebox import BOOSTER_PARAMS, WhiteBox


def shrink(z: torch.Tensor, x: torch.Tensor, beta: float) -> torch.Tensor:
    """The projected shrinkage-thresholding ``S_beta`` of EAD (eq. 7): coordinates of
    ``z - x`` within ``beta`` go back to ``x``, the others move ``beta`` towards it, and the
    result is clipped to [0, 1]."""
    d = z - x
    out = torch.where(d > beta, (z - beta).clamp(max=1.0), x)
    return torch.where(d < -beta, (z + beta).clamp(min=0.0), out)


def run(ctx: AttackContext) -> list[AttackResult]:
    """EAD on the context's surrogate(s); one result per image (see the module doc)."""
    p = ctx.params
    steps = check_int(p, "steps", minimum=1)
    search = check_int(p, "binary_search_steps", minimum=1)
    c0 = check_number(p, "initial_const", minimum=0.0, strict_min=True)
    lr0 = check_number(p, "learning_rate", minimum=0.0, strict_min=True)
    kappa = check_number(p, "confidence", minimum=0.0)
    beta = check_number(p, "beta", minimum=0.0)
    rule = str(p.get("decision_rule", "EN"))
    if rule not in ("EN", "L1"):
        raise InvalidArgument("params.decision_rule", f"must be EN or L1, got {rule!r}")
    fista = bool(p.get("fista", True))
    abort_early = bool(p.get("abort_early", True))
    images, _ = check_batch(ctx.images, ctx.labels)
    wb = WhiteBox.from_ctx(ctx)
    results: list[AttackResult] = []
    with wb:
        for start, rows, xs, x, y, correct in wb.batches(images):
            best = Best(wb, xs, rows, norm="en" if rule == "EN" else "l1", kappa=kappa,
                        beta=beta)
            n = len(xs)
            const = torch.full((n,), c0, dtype=torch.float32)
            lower = torch.zeros(n)
            upper = torch.full((n,), 1e10)
            for outer in range(search):
                if search >= 10 and outer == search - 1:
                    const = torch.minimum(upper, torch.full_like(upper, 1e10))
                xk = x.clone()
                yk = x.clone()
                success = np.zeros(n, dtype=bool)
                previous = math.inf
                check_every = max(steps // 10, 1)
                for k in range(steps):
                    lr = lr0 * (1.0 - k / steps) ** 0.5
                    with torch.enable_grad():
                        v = yk.detach().requires_grad_(True)
                        f = margins(wb.logits(v), y, wb.target).clamp_min(-kappa)
                        smooth = (const * f + (v - x).flatten(1).pow(2).sum(dim=1)).sum()
                        (g,) = torch.autograd.grad(smooth, v)
                    with torch.inference_mode():
                        nxt = shrink(yk - lr * g, x, beta)
                        yk = nxt + (k / (k + 3.0)) * (nxt - xk) if fista else nxt
                        xk = nxt
                        success |= best.update(xk)
                    if abort_early and (k + 1) % check_every == 0:
                        value = float(smooth.detach()) + beta * float((v.detach() - x).abs().sum())
                        if value > previous * 0.9999:
                            break
                        previous = value
                    yk, xk = yk.clone(), xk.clone()  # leave inference mode's tensors
                update_consts(const, lower, upper, torch.from_numpy(success))
            results += best.results(start, correct)
    return results


SPEC = AttackSpec(
    id="ead", minimal_norm=True, kind="transfer", family="optimisation", norms=("l1", "l2"),
    refs=("IEEE-A7", "IEEE-A9"), needs_surrogate=True, stochastic=False, targeted=True,
    description="EAD, elastic-net attack (Chen et al. 2018) on the local surrogate: "
                "FISTA/ISTA with L1 shrinkage beta, binary search over c, EN or L1 decision "
                "rule; the best image adversarial on the surrogate after uint8 rounding, then "
                "sent to the target",
    params=(Param(name="steps", type="int", default=1000, minimum=1, maximum=10000,
                  description="(F)ISTA iterations per binary-search round (the paper: 1000)"),
            Param(name="binary_search_steps", type="int", default=9, minimum=1, maximum=20,
                  description="rounds of the binary search over the constant c (the paper: 9)"),
            Param(name="initial_const", type="float", default=1e-3, minimum=1e-8,
                  maximum=1e6, description="the first c (the paper: 1e-3)"),
            Param(name="learning_rate", type="float", default=1e-2, minimum=1e-6, maximum=10.0,
                  description="initial step a_0, decayed as sqrt(1 - k/K) (the paper: 1e-2)"),
            Param(name="beta", type="float", default=1e-2, minimum=0.0, maximum=1.0,
                  description="L1 weight and shrinkage threshold (the paper: 1e-3 to 1e-1; "
                              "1e-2 the default of its code and foolbox)"),
            Param(name="decision_rule", type="string", default="EN", choices=("EN", "L1"),
                  description="which adversarial iterate is returned: smallest elastic-net "
                              "distance (EN) or smallest L1"),
            Param(name="confidence", type="float", default=0.0, minimum=0.0, maximum=1000.0,
                  description="kappa: the logit margin an adversarial must reach"),
            Param(name="fista", type="bool", default=True,
                  description="FISTA momentum (the paper's default); false = ISTA"),
            Param(name="abort_early", type="bool", default=True,
                  description="stop a round when the loss stops decreasing"),
            *BOOSTER_PARAMS),
    run=run)
