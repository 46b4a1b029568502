"""DDN, Decoupled Direction and Norm (IEEE-A7 transfer, minimal-norm L2; Rony et al. 2019,
"Decoupling direction and norm for efficient gradient-based L2 adversarial attacks and
defenses"), crafted white-box on a local surrogate (or an ensemble, with the DI / TI / SI
boosters: ``whitebox.py``) and sent to the target afterwards.

Algorithm 1 of the paper, per image: the perturbation ``delta`` takes a step of size
``alpha_k`` (cosine-annealed from ``1`` to ``0.01``, the authors' code) along the normalised
gradient of the cross-entropy (ascending it on the true label, descending it on the target
label when targeted); the norm ``epsilon_k`` shrinks by ``(1 - gamma)`` while the current
point is adversarial and grows by ``(1 + gamma)`` while it is not; ``delta`` is then
rescaled to norm ``epsilon_k``, **quantised to the 8-bit grid** (the paper's step for
images stored as uint8, so the returned image is exactly an iterate) and clipped to the
box. A zero gradient is replaced with a random direction drawn from the call's seeded
generator. ``max_norm`` (> 0) bounds ``epsilon_k`` (IEEE-A9: the returned image is within
it after rounding).

As the other optimisation attacks (``cw.py``), every iterate is judged after uint8 rounding
with the surrogate's plain logits; the smallest-L2 such image is returned, else the clean
image. ``success`` None, ``queries`` 0. Registry entry: :data:`SPEC`. Domain code: no gRPC.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from fortis.services.common.params import Param

from .base import AttackContext, AttackResult, AttackSpec, check_batch
from .cw import Best, check_int, check_number
from .whitebox import BOOSTER_PARAMS, WhiteBox


def _norms(t: torch.Tensor) -> torch.Tensor:
    return t.flatten(1).norm(dim=1)


def run(ctx: AttackContext) -> list[AttackResult]:
    """DDN on the context's surrogate(s); one result per image (see the module doc)."""
    p = ctx.params
    steps = check_int(p, "steps", minimum=1)
    init = check_number(p, "init_epsilon", minimum=0.0, strict_min=True)
    gamma = check_number(p, "gamma", minimum=0.0, strict_min=True, maximum=1.0)
    max_norm = check_number(p, "max_norm", minimum=0.0)
    quantize = bool(p.get("quantize", True))
    images, _ = check_batch(ctx.images, ctx.labels)
    wb = WhiteBox.from_ctx(ctx)
    gen = ctx.torch_generator()
    sign = -1.0 if wb.target is not None else 1.0
    results: list[AttackResult] = []
    with wb:
        for start, rows, xs, x, y, correct in wb.batches(images):
            cls = y if wb.target is None else torch.full_like(y, wb.target)
            best = Best(wb, xs, rows, norm="l2", bound=max_norm or None)
            n = len(xs)
            worst = _norms(torch.maximum(x, 1.0 - x))
            if max_norm:
                worst = worst.clamp(max=max_norm)
            eps = torch.minimum(torch.full((n,), init), worst)
            delta = torch.zeros_like(x)
            for i in range(steps):
                alpha = 0.01 + (1.0 - 0.01) * (1 + math.cos(math.pi * i / steps)) / 2
                with torch.enable_grad():
                    d = delta.detach().requires_grad_(True)
                    logits = wb.logits(x + d)
                    loss = sign * F.cross_entropy(logits, cls, reduction="sum")
                    (g,) = torch.autograd.grad(loss, d)
                with torch.inference_mode():
                    adv_now = best.update(x + delta)   # the iterate: adversarial after rounding?
                    is_adv = torch.from_numpy(adv_now)
                    gn = _norms(g)
                    zero = gn == 0
                    if bool(zero.any()):
                        g[zero] = torch.randn(g[zero].shape, generator=gen)
                        gn = _norms(g)
                    step = delta + alpha * g / gn.view(-1, 1, 1, 1)
                    eps = torch.minimum(eps * torch.where(is_adv, 1.0 - gamma, 1.0 + gamma),
                                        worst)
                    sn = _norms(step).clamp_min(1e-12)
                    step = step * (eps / sn).view(-1, 1, 1, 1)
                    adv = x + step
                    if quantize:
                        adv = torch.round(adv * 255.0) / 255.0
                    delta = (adv.clamp(0.0, 1.0) - x).clone()
                delta = delta.clone()  # a normal tensor again (gradient next step)
            with torch.inference_mode():
                best.update(x + delta)
            results += best.results(start, correct)
    return results


SPEC = AttackSpec(
    id="ddn", minimal_norm=True, kind="transfer", family="minimal-norm", norms=("l2",),
    refs=("IEEE-A7", "IEEE-A9"), needs_surrogate=True, stochastic=False, targeted=True,
    description="Decoupled Direction and Norm (Rony et al. 2019, L2) on the local surrogate: "
                "normalised-gradient steps, the norm shrunk or grown by gamma, 8-bit "
                "quantisation; the smallest-L2 image adversarial on the surrogate after uint8 "
                "rounding, then sent to the target",
    params=(Param(name="steps", type="int", default=100, minimum=1, maximum=10000,
                  description="iterations (the paper: 100 on MNIST / CIFAR-10, 1000 for the "
                              "best norms)"),
            Param(name="init_epsilon", type="float", default=1.0, minimum=1e-6, maximum=1000.0,
                  description="the first norm epsilon_0 in [0,1] scale (the paper: 1)"),
            Param(name="gamma", type="float", default=0.05, minimum=1e-6, maximum=1.0,
                  description="the norm changes by a factor 1 -/+ gamma per step (the paper: "
                              "0.05)"),
            Param(name="max_norm", type="float", default=0.0, minimum=0.0, maximum=1000.0,
                  description="L2 bound in [0,1] scale (IEEE-A9); 0 = unbounded (minimal "
                              "norm)"),
            Param(name="quantize", type="bool", default=True,
                  description="round each iterate to the 8-bit grid (the paper's step)"),
            *BOOSTER_PARAMS),
    run=run)
