"""Sparse L1 Descent, SLIDE (IEEE-A7 transfer, L1; Tramer and Boneh 2019, "Adversarial
training and robustness for multiple perturbations"): projected steepest ascent in the L1
ball where each step moves only the pixels whose gradient magnitude is at or above the
``q``-th percentile of the image's gradient magnitudes -- the sparse step that makes L1
descent work (a plain L1 steepest step moves one pixel at a time). Crafted on the local
surrogate's loss (cross-entropy on the true label, or towards the target class; boosters and
ensembles from ``whitebox.py``) and sent to the target afterwards.

Each step, per image (the authors' ``MultiRobustness`` code, as Foolbox 3's
``SparseL1DescentAttack``):

* ``g`` = the loss gradient, zeroed where the pixel sits at 0 and the gradient points down,
  or at 1 and it points up (a step there would be clipped away);
* ``e = sign(g) * [|g| >= percentile_q(|g|)]``, normalised to ``||e||_1 = 1``;
* ``adv <- proj_{||. - x||_1 <= eps}(adv + step_size * e)`` (the exact Euclidean projection
  onto the L1 ball, Duchi et al. 2008), clipped to [0, 1].

**The bound (IEEE-A9)**: ``epsilon`` bounds ``||adv - x||_1`` measured on the uint8 images in
[0, 1] scale, ``sum |adv - x| / 255`` over every pixel and channel. The float iterate is
rounded to uint8 *towards x* (each change truncated), so the image the target receives is
still within the ball (rounding to nearest could leave it). :class:`~.base.AttackResult`
has ``linf`` and ``l2`` fields only: :func:`l1_distance` measures the L1 distance of a
result (``tests/unit/test_transfer_more.py`` checks it).

Nothing here queries the target: ``success`` is None, ``queries`` 0, stop reason
``iterations``. Registry entry: :data:`SPEC`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.params import Param

from .base import AttackContext, AttackResult, AttackSpec, check_batch
from .whitebox import BOOSTER_PARAMS, WhiteBox, chunks, crafted, to_tensor

__all__ = ["SPEC", "l1_distance", "project_l1", "run", "sparse_l1_descent"]



def l1_distance(x: np.ndarray, adv: np.ndarray) -> float:
    """``||adv - x||_1`` in [0, 1] scale on uint8 images (every pixel and channel)."""
    return float(np.abs(adv.astype(np.int64) - x.astype(np.int64)).sum()) / 255.0


def project_l1(delta: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Euclidean projection of each row's ``delta`` (N x ...) onto the L1 ball of radius
    ``epsilon`` (Duchi et al. 2008, sort-based; rows inside are unchanged)."""
    flat = delta.flatten(1)
    n, d = flat.shape
    absd = flat.abs()
    inside = absd.sum(dim=1) <= epsilon
    if bool(inside.all()):
        return delta
    mu = torch.sort(absd, dim=1, descending=True).values
    cums = mu.cumsum(dim=1)
    js = torch.arange(1, d + 1, dtype=flat.dtype)
    # rho = the last index j with mu_j - (cumsum_j - eps) / j > 0
    cond = (mu - (cums - epsilon) / js) > 0
    rho = (cond * torch.arange(d)).argmax(dim=1)
    theta = (cums[torch.arange(n), rho] - epsilon) / (rho + 1).to(flat.dtype)
    proj = flat.sign() * (absd - theta.clamp_min(0).unsqueeze(1)).clamp_min(0)
    out = torch.where(inside.unsqueeze(1), flat, proj)
    return out.view_as(delta)


def _sparse_direction(g: torch.Tensor, adv: torch.Tensor, q: float) -> torch.Tensor:
    bad = ((adv <= 0.0) & (g < 0)) | ((adv >= 1.0) & (g > 0))
    g = torch.where(bad, torch.zeros_like(g), g)
    a = g.abs().flatten(1)
    thr = torch.quantile(a, q / 100.0, dim=1, keepdim=True)
    e = torch.where(a >= thr, a.new_ones(()), a.new_zeros(())) * g.flatten(1).sign()
    e = e / e.abs().sum(dim=1, keepdim=True).clamp_min(1e-12)
    return e.view_as(g)


def _toward_x(adv: torch.Tensor, xs: np.ndarray) -> np.ndarray:
    """float N x C x H x W in [0, 1] -> uint8 N x H x W x C, each change truncated towards
    ``xs`` (so no pixel moves further than the float iterate: L1 can only shrink)."""
    levels = adv.detach().permute(0, 2, 3, 1).cpu().numpy().astype(np.float64) * 255.0
    xf = xs.astype(np.float64)
    return np.clip(xf + np.trunc(levels - xf + 1e-6 * np.sign(levels - xf)), 0, 255).astype(np.uint8)


def sparse_l1_descent(wb: WhiteBox, images: np.ndarray, *, epsilon: float, steps: int,
                      step_size: float, percentile: float) -> tuple[np.ndarray, np.ndarray]:
    """uint8 adversarials of ``images`` (the WhiteBox's batch, in order) and whether the
    surrogate got each clean image right."""
    n = images.shape[0]
    advs = np.empty_like(images)
    correct = np.zeros(n, dtype=bool)
    with wb:
        for _start, rows in chunks(n):
            xs = images[rows]
            x = to_tensor(xs)
            correct[rows] = wb.check_classifier(x, rows)
            adv = x.clone()
            for _ in range(steps):
                g = wb.grad(adv, rows)
                with torch.no_grad():  # not inference_mode: the iterate is differentiated next
                    e = _sparse_direction(g, adv, percentile)
                    adv = (x + project_l1(adv + step_size * e - x, epsilon)).clamp(0.0, 1.0)
            out = _toward_x(adv, xs)
            advs[rows] = out
    return advs, correct


def run(ctx: AttackContext) -> list[AttackResult]:
    images, _ = check_batch(ctx.images, ctx.labels)
    p = ctx.params
    eps = float(p["epsilon"])
    if not math.isfinite(eps) or eps < 0:
        raise InvalidArgument("params.epsilon", f"must be a finite number >= 0, got {eps!r}")
    steps = int(p["steps"])
    size = float(p["step_size"]) or eps / 5.0
    wb = WhiteBox.from_ctx(ctx)
    advs, correct = sparse_l1_descent(wb, images, epsilon=eps, steps=steps, step_size=size,
                                      percentile=float(p["percentile"]))
    return crafted(images, advs, correct)


SPEC = AttackSpec(
    id="sparse_l1", kind="transfer", family="gradient", norms=("l1",),
    refs=("IEEE-A7", "IEEE-A9"), needs_surrogate=True, stochastic=False, targeted=True,
    description="Sparse L1 Descent (Tramer and Boneh 2019): L1-bounded projected ascent "
                "moving only the top-percentile gradient pixels, on the local surrogate, then "
                "sent to the target",
    params=(
        Param(name="epsilon", type="float", default=10.0, minimum=0.0, maximum=1e6,
              description="L1 bound in [0,1] pixel scale: sum of |change| / 255 over every "
                          "pixel and channel (IEEE-A9; the paper uses 10 on MNIST)"),
        Param(name="percentile", type="float", default=99.0, minimum=0.0, maximum=100.0,
              description="q: each step moves the pixels at or above the q-th percentile of "
                          "gradient magnitude (the paper: 99 on MNIST)"),
        Param(name="steps", type="int", default=20, minimum=1, maximum=1000,
              description="iterations"),
        Param(name="step_size", type="float", default=0.0, minimum=0.0, maximum=1e6,
              description="L1 length of each step in [0,1] scale; 0 = epsilon/5 (Foolbox's "
                          "relative step 0.2)"),
        *BOOSTER_PARAMS),
    run=run)
