"""The white-box sign-gradient loop shared by the transfer attacks (IEEE-A7) on a local
surrogate: FGSM is one step of it (``fgsm.py``), PGD several with a random start (``pgd.py``).

The surrogate takes float32 NCHW images in [0, 1] (normalisation inside the model) and returns
logits. Nothing here queries the target: the uint8 adversarials are sent to it later, so
``success`` is ``None`` and ``queries`` is 0. The L-inf bound (IEEE-A9) is enforced on the
uint8 output: round, then project with ``base.clip_to_linf`` (``[x - e, x + e]`` and
``[0, 255]``, ``e = floor(epsilon * 255 + 1e-6)``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from fortis.services.common.errors import InvalidArgument

from .base import (
    STOP_ITERATIONS,
    AttackContext,
    AttackResult,
    check_batch,
    check_surrogate_input,
    clip_to_linf,
    linf_levels,
    make_result,
)

CHUNK = 32  # images per forward/backward pass (bounds memory on large batches)


def _to_tensor(images: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(images)).to(torch.float32) / 255.0
    return t.permute(0, 3, 1, 2).contiguous()


def _quantise(adv: torch.Tensor, x: np.ndarray, e: int) -> np.ndarray:
    """float NCHW in [0,1] -> uint8 NHWC within ``e`` levels of ``x``."""
    levels = np.rint(adv.detach().permute(0, 2, 3, 1).cpu().numpy().astype(np.float64) * 255.0)
    return clip_to_linf(levels, x, e)


def _grad(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = F.cross_entropy(model(x), y, reduction="sum")
        (g,) = torch.autograd.grad(loss, x)
    return g


def _clean_predictions(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        logits = model(x)
    if logits.ndim != 2:
        raise InvalidArgument("surrogate", f"model must return N x classes logits, got {tuple(logits.shape)}")
    if int(y.max()) >= logits.shape[1]:
        raise InvalidArgument("labels", f"label {int(y.max())} out of range for a "
                              f"{logits.shape[1]}-class surrogate")
    return (logits.argmax(dim=1) == y).cpu().numpy()


def sign_gradient_linf(model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, epsilon: float,
         steps: int, step_size: float, random_start: bool,
         generator: torch.Generator | None) -> list[AttackResult]:
    images, labels = check_batch(images, labels)
    e = linf_levels(epsilon)
    eps = float(epsilon)
    was_training = model.training
    model.eval()
    results: list[AttackResult] = []
    try:
        for start in range(0, images.shape[0], CHUNK):
            xs = images[start:start + CHUNK]
            x = _to_tensor(xs)
            y = torch.from_numpy(labels[start:start + CHUNK])
            correct = _clean_predictions(model, x, y)
            if random_start:
                noise = torch.rand(x.shape, generator=generator, dtype=x.dtype) * (2 * eps) - eps
                adv = (x + noise).clamp(0.0, 1.0)
            else:
                adv = x.clone()
            for _ in range(steps):
                g = _grad(model, adv, y)
                adv = adv.detach() + step_size * g.sign()
                adv = torch.min(torch.max(adv, x - eps), x + eps).clamp(0.0, 1.0)
            out = _quantise(adv, xs, e)
            for k in range(xs.shape[0]):
                results.append(make_result(start + k, xs[k], out[k], success=None, queries=0,
                                           initially_correct=bool(correct[k]),
                                           stop_reason=STOP_ITERATIONS))
    finally:
        model.train(was_training)
    return results



def surrogate_model(ctx: AttackContext) -> torch.nn.Module:
    """The surrogate's torch module, after checking it takes the batch's image size."""
    if ctx.surrogate is None:
        raise InvalidArgument("surrogate",
                              f"{ctx.spec.id} is a transfer attack: name a surrogate model")
    check_surrogate_input(ctx.surrogate, ctx.images.shape[1:])
    model: torch.nn.Module = ctx.surrogate.model
    return model
