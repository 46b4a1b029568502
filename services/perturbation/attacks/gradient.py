"""The iterative gradient loop of the decision-layer transfer attacks (IEEE-A7) on a local
surrogate: FGSM is one step of it (``fgsm.py``), BIM several from the clean image
(``bim.py``), PGD several from a random start (``pgd.py``), MI-FGSM with momentum and its NI /
VMI boosters (``mifgsm.py``). The objective -- cross-entropy (untargeted), minus the target
class's cross-entropy (targeted), a detector's or segmenter's task loss -- and the DI / TI /
SI boosters and ensembles come from :class:`~.whitebox.WhiteBox`.

Each step, per image (torchattacks' order of operations, so the deterministic attacks give
the same uint8 images as torchattacks on the same surrogate; ``tests/reference``):

* L-inf: ``adv <- clip_[x-eps, x+eps] & [0,1] (adv + alpha * sign(d))``;
* L2: ``adv <- proj_{||.||_2 <= eps} (adv + alpha * d / ||d||_2)``, clipped to [0, 1];

with ``d`` the loss gradient, or with momentum (MI-FGSM, Dong et al. 2018)
``d <- g / mean|g| + mu * d`` where ``g`` is the gradient at ``adv`` (NI: at the look-ahead
``adv + alpha * mu * d``) plus, with VMI, the previous step's variance term
``v = mean_i grad(adv + U(-beta*eps, beta*eps)) - grad(adv)``.

Nothing here queries the target: the uint8 adversarials are sent to it later, so
``success`` is ``None`` and ``queries`` is 0. The bound (IEEE-A9) is enforced on the uint8
output: round, then project (``base.clip_to_linf`` / ``base.project_l2``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from fortis.core.task import Task
from fortis.services.common.errors import InvalidArgument

from .base import (
    AttackContext,
    AttackResult,
    check_batch,
    check_l2_epsilon,
    linf_levels,
    project_l2,
)
from .whitebox import WhiteBox, chunks, crafted, quantise, to_tensor


@dataclass(frozen=True, kw_only=True)
class Steps:
    """How the loop steps: ``steps`` iterations of size ``step_size`` ([0, 1] scale) in
    ``norm``; momentum ``decay`` (None: plain gradient), NI look-ahead, VMI samples."""

    epsilon: float
    steps: int
    step_size: float
    norm: str = "linf"
    random_start: bool = False
    decay: float | None = None
    nesterov: bool = False
    vmi_samples: int = 0
    vmi_beta: float = 1.5

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or int(self.steps) != self.steps or self.steps < 0:
            raise InvalidArgument("params.steps", f"must be an integer >= 0, got {self.steps!r}")
        if not np.isfinite(self.step_size) or self.step_size < 0:
            raise InvalidArgument("params.step_size", f"must be a finite number >= 0, got "
                                  f"{self.step_size!r}")
        if self.norm not in ("linf", "l2"):
            raise InvalidArgument("params.norm", f"must be linf or l2, got {self.norm!r}")


def _l2_dims(t: torch.Tensor) -> torch.Tensor:
    return t.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, 1, 1, 1)


def _project(adv: torch.Tensor, x: torch.Tensor, eps: float, norm: str) -> torch.Tensor:
    if norm == "linf":
        return torch.min(torch.max(adv, x - eps), x + eps).clamp(0.0, 1.0)
    delta = adv - x
    factor = torch.clamp(eps / _l2_dims(delta), max=1.0)
    return (x + delta * factor).clamp(0.0, 1.0)


def _step(d: torch.Tensor, norm: str) -> torch.Tensor:
    return d.sign() if norm == "linf" else d / _l2_dims(d)


def iterate(wb: WhiteBox, images: np.ndarray, s: Steps,
            generator: torch.Generator | None = None) -> list[AttackResult]:
    """Run the loop on uint8 ``images`` (the WhiteBox's batch, in order); one result each."""
    n = images.shape[0]
    if s.norm == "linf":
        e = linf_levels(s.epsilon)
        eps = float(s.epsilon)
    else:
        eps = check_l2_epsilon(s.epsilon)
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    advs = np.empty_like(images)
    correct_all = np.zeros(n, dtype=bool)
    with wb:
        for _start, rows in chunks(n):
            xs = images[rows]
            x = to_tensor(xs)
            # initially_correct from the first gradient step's clean forward pass when it is
            # one (no random start, no DI / SI transform): no forward pass spent on it
            correct = None if (s.steps and not s.random_start and wb.task == Task.CLASSIFICATION) \
                else wb.check_classifier(x, rows)
            adv = x.clone()
            if s.random_start:
                if s.norm == "linf":
                    noise = torch.rand(x.shape, generator=gen, dtype=x.dtype) * (2 * eps) - eps
                else:
                    noise = torch.randn(x.shape, generator=gen, dtype=x.dtype)
                    radius = torch.rand((x.shape[0], 1, 1, 1), generator=gen) * eps
                    noise = noise / _l2_dims(noise) * radius
                adv = (x + noise).clamp(0.0, 1.0)
            momentum = torch.zeros_like(x)
            variance = torch.zeros_like(x)
            for t in range(s.steps):
                if s.decay is None:
                    d = wb.grad(adv, rows)
                    clean = wb.last_plain if t == 0 else None
                else:
                    point = adv + s.decay * s.step_size * momentum if s.nesterov else adv
                    g_hat = wb.grad(point, rows)
                    clean = wb.last_plain if t == 0 else None   # the look-ahead is adv at t=0
                    g = g_hat + variance if s.vmi_samples else g_hat
                    g = g / torch.mean(torch.abs(g), dim=(1, 2, 3), keepdim=True).clamp_min(1e-30)
                    d = g + momentum * s.decay
                    momentum = d
                    if s.vmi_samples:
                        acc = torch.zeros_like(x)
                        r = s.vmi_beta * (eps if s.norm == "linf" else eps / np.sqrt(x[0].numel()))
                        for _k in range(s.vmi_samples):
                            u = torch.rand(x.shape, generator=gen, dtype=x.dtype) * (2 * r) - r
                            acc = acc + wb.grad(adv + u, rows)
                        variance = acc / s.vmi_samples - g_hat
                if correct is None:
                    correct = wb.correct_from(clean, wb.labels[torch.from_numpy(rows)]) \
                        if clean is not None else wb.check_classifier(x, rows)
                adv = _project(adv.detach() + s.step_size * _step(d, s.norm), x, eps, s.norm)
            if correct is None:
                correct = wb.check_classifier(x, rows)
            if s.norm == "linf":
                out = quantise(adv, xs, e)
            else:
                out = np.stack([project_l2(o.astype(np.float64), xk, eps) for o, xk in
                                zip(_float_levels(adv), xs, strict=True)])
            advs[rows] = out
            correct_all[rows] = correct
    return crafted(images, advs, correct_all)


def _float_levels(adv: torch.Tensor) -> np.ndarray:
    """float N x C x H x W in [0, 1] -> N x H x W x C in uint8 scale (float, unrounded)."""
    return adv.detach().permute(0, 2, 3, 1).cpu().numpy().astype(np.float64) * 255.0


def run_steps(ctx: AttackContext, s: Steps) -> list[AttackResult]:
    """An attack's ``run``: the WhiteBox of the context (surrogates, boosters, criterion) and
    the loop with the call's seeded generator."""
    check_batch(ctx.images, ctx.labels)
    wb = WhiteBox.from_ctx(ctx)
    return iterate(wb, ctx.images, s, generator=ctx.torch_generator())


def surrogate_model(ctx: AttackContext) -> torch.nn.Module:
    """The surrogate's torch module, after checking it takes the batch's image size."""
    from .base import check_surrogate_input
    if ctx.surrogate is None:
        raise InvalidArgument("surrogate",
                              f"{ctx.spec.id} is a transfer attack: name a surrogate model")
    check_surrogate_input(ctx.surrogate, ctx.images.shape[1:])
    model: torch.nn.Module = ctx.surrogate.model
    return model


class _Plain:
    """A bare torch module as a surrogate (the functional API: ``fgsm(model, ...)``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.name = type(model).__name__


def sign_gradient_linf(model: torch.nn.Module, images: np.ndarray, labels: np.ndarray,
                       epsilon: float, steps: int, step_size: float, random_start: bool,
                       generator: torch.Generator | None) -> list[AttackResult]:
    """The functional form (a torch module, no context): L-inf, untargeted, no boosters."""
    images, labels = check_batch(images, labels)
    wb = WhiteBox([_Plain(model)], labels=labels)
    return iterate(wb, images, Steps(epsilon=epsilon, steps=steps, step_size=step_size,
                                     random_start=random_start), generator=generator)
