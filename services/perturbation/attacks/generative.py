"""A generative attack (IEEE-A7 transfer, generative, L-inf) in the style of AdvGAN (Xiao et
al. 2018, "Generating adversarial examples with adversarial networks"): a small perturbation
*generator* network ``G`` is trained on the local surrogate, then each image's adversarial is
one forward pass, ``adv = clip_[0,1](x + epsilon * tanh(G(x)))``, sent to the target afterwards.

**The generator** (:class:`Generator`): an encoder-decoder conv net with instance norms (as
AdvGAN's), a skip connection and a learned image-independent term, its output squashed to
the perturbation ``epsilon * tanh(.)``, so the L-inf bound holds by construction.

**Training** (``epochs`` passes over the batch's images in shuffled minibatches of
``batch_size``, Adam at ``learning_rate``): maximise the surrogate's loss of ``x + G(x)`` --
cross-entropy on the true label (untargeted), minus the cross-entropy on the target label
(targeted), each image's clipped at ``loss_cap`` -- with the DI / TI / SI boosters and
ensembles of ``whitebox.py`` when asked. **AdvGAN's discriminator (the GAN realism term) and
its hinge loss on the perturbation norm are omitted**: the tanh bound replaces the hinge, and
on a per-batch generator the realism term only trades attack strength for looks; the C&W
margin of the paper's adversarial loss is replaced by the (clipped) cross-entropy. The
generator is trained on the very images it then perturbs (a per-batch AdvGAN, white-box on
the surrogate, semi-white-box in the paper's terms).

**Randomness**: every draw -- the generator's initial weights, the shuffles, the boosters --
comes from the call's seeded ``ctx.torch_generator()``, so a rerun with the same seed, attack
id and image ids gives the same images (on the same machine and thread count).

**Cache**: a trained generator is kept in this process, keyed by (surrogate names and a hash
of their weights, the parameters, the seed, the image ids, a hash of the training images
and labels, the target), so a second call with the same inputs does not retrain
(:data:`STATS` counts trainings and cache hits; :func:`clear_cache`). At most
:data:`CACHE_SIZE` generators are kept (least recently used dropped).

**The bound (IEEE-A9)** is enforced on the uint8 output (round, then ``clip_to_linf``).
Nothing here queries the target: ``success`` is None, ``queries`` 0, stop reason
``iterations``. Registry entry: :data:`SPEC`.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from fortis.services.common.params import Param
from torch import nn

from .base import (
    EPSILON_LINF,
    AttackContext,
    AttackResult,
    AttackSpec,
    check_batch,
    linf_levels,
)
from .whitebox import BOOSTER_PARAMS, WhiteBox, chunks, crafted, quantise, to_tensor

__all__ = ["CACHE_SIZE", "SPEC", "STATS", "Generator", "clear_cache", "run"]

CACHE_SIZE = 8
#: ``trainings``: generators trained in this process; ``hits``: calls served from the cache.
STATS: dict[str, int] = {"trainings": 0, "hits": 0}
_CACHE: OrderedDict[tuple[Any, ...], dict[str, torch.Tensor]] = OrderedDict()
_LOCK = threading.Lock()
CHUNK = 64  # generator passes are cheap: bigger chunks than whitebox.CHUNK


class Generator(nn.Module):
    """The perturbation generator: N x C x H x W in [0, 1] -> unbounded N x C x H x W
    (``epsilon * tanh`` of it is the perturbation). Encoder: conv 3x3 -> conv 4x4 stride 2
    -> conv 3x3 (instance norm + ReLU, as AdvGAN's generator); decoder: bilinear upsampling
    back to H x W, a skip connection from the first layer, conv 3x3 -> conv 3x3 to C channels;
    plus a learned image-independent term (C x H x W) added before the tanh."""

    def __init__(self, channels: int, height: int, width: int, size: int = 16) -> None:
        super().__init__()
        half = max(1, size // 2)
        self.enc1 = nn.Conv2d(channels, half, 3, padding=1)
        self.norm1 = nn.InstanceNorm2d(half, affine=True)
        self.enc2 = nn.Conv2d(half, size, 4, stride=2, padding=1)
        self.norm2 = nn.InstanceNorm2d(size, affine=True)
        self.mid = nn.Conv2d(size, size, 3, padding=1)
        self.dec = nn.Conv2d(size + half, half, 3, padding=1)
        self.norm3 = nn.InstanceNorm2d(half, affine=True)
        self.out = nn.Conv2d(half, channels, 3, padding=1)
        self.universal = nn.Parameter(torch.zeros(1, channels, height, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h1 = F.relu(self.norm1(self.enc1(x * 2.0 - 1.0)))
        h2 = F.relu(self.mid(F.relu(self.norm2(self.enc2(h1)))))
        up = F.interpolate(h2, size=x.shape[-2:], mode="bilinear", align_corners=False)
        return self.out(F.relu(self.norm3(self.dec(torch.cat([up, h1], dim=1))))) + self.universal

    def init_(self, generator: torch.Generator) -> Generator:
        """Kaiming-uniform conv weights (PyTorch's default rule), zero biases, from
        ``generator`` (seeded); norms at identity, the universal term at zero."""
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_uniform_(m.weight, a=math.sqrt(5), generator=generator)
                    if m.bias is not None:
                        m.bias.zero_()
        return self


def _digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _model_digest(models: list[nn.Module]) -> str:
    h = hashlib.sha256()
    for m in models:
        for k, v in m.state_dict().items():
            h.update(k.encode())
            h.update(np.ascontiguousarray(v.detach().cpu().numpy()).tobytes())
    return h.hexdigest()


def _key(ctx: AttackContext, wb: WhiteBox, images: np.ndarray, labels: np.ndarray
         ) -> tuple[Any, ...]:
    names = tuple(str(getattr(s, "name", "?")) for s in wb.surrogates)
    params = tuple(sorted((k, repr(v)) for k, v in dict(ctx.params).items()))
    return (names, _model_digest(wb.models), params, int(ctx.seed), ctx.image_ids,
            _digest(images, labels), wb.target)


def clear_cache() -> None:
    """Forget every trained generator (tests: retrain from scratch)."""
    with _LOCK:
        _CACHE.clear()


def _train(wb: WhiteBox, images: np.ndarray, p: Mapping[str, Any],
           gen: torch.Generator) -> Generator:
    eps = float(p["epsilon"])
    g = Generator(images.shape[3], images.shape[1], images.shape[2], int(p["width"])).init_(gen)
    cap = float(p["loss_cap"])
    params = list(g.parameters())
    opt = torch.optim.Adam(params, lr=float(p["learning_rate"]))
    x_all = to_tensor(images)
    n, bs = x_all.shape[0], int(p["batch_size"])
    g.train()
    for _ in range(int(p["epochs"])):
        order = torch.randperm(n, generator=gen)
        for k in range(0, n, bs):
            rows = order[k:k + bs]
            x = x_all[rows]
            with torch.enable_grad():
                adv = (x + eps * torch.tanh(g(x))).clamp(0.0, 1.0)
                per = wb.loss(adv, rows.numpy())
                if cap > 0:  # images already far past the boundary stop pulling the generator
                    per = per.clamp(max=cap)
                loss = -per.mean()
                # gradients for the generator only: the surrogate's .grad is left untouched
                grads = torch.autograd.grad(loss, params)
            for prm, gr in zip(params, grads, strict=True):
                prm.grad = gr
            opt.step()
    g.eval()
    for prm in g.parameters():
        prm.requires_grad_(False)
    return g


def run(ctx: AttackContext) -> list[AttackResult]:
    images, labels = check_batch(ctx.images, ctx.labels)
    if images.shape[0] == 0:
        return []
    p = ctx.params
    eps = float(p["epsilon"])
    e = linf_levels(eps)
    wb = WhiteBox.from_ctx(ctx)
    key = _key(ctx, wb, images, labels)
    with wb:
        x_all = to_tensor(images)
        parts = list(chunks(len(images), CHUNK))
        correct = np.concatenate([wb.check_classifier(x_all[rows], rows) for _, rows in parts]) \
            if parts else np.zeros(0, dtype=bool)
        with _LOCK:
            state = _CACHE.get(key)
            if state is not None:
                _CACHE.move_to_end(key)
                STATS["hits"] += 1
        if state is None:
            g = _train(wb, images, p, ctx.torch_generator())
            with _LOCK:
                _CACHE[key] = {k: v.clone() for k, v in g.state_dict().items()}
                while len(_CACHE) > CACHE_SIZE:
                    _CACHE.popitem(last=False)
                STATS["trainings"] += 1
        else:
            g = Generator(images.shape[3], images.shape[1], images.shape[2], int(p["width"]))
            g.load_state_dict(state)
            g.eval()
        with torch.inference_mode():
            advs = np.concatenate([
                quantise((x + eps * torch.tanh(g(x))).clamp(0.0, 1.0), images[rows], e)
                for _, rows in parts for x in (x_all[rows],)]) if parts else images.copy()
    return crafted(images, advs, correct)


SPEC = AttackSpec(
    id="advgan", kind="transfer", family="generative", norms=("linf",),
    refs=("IEEE-A7", "IEEE-A9"), needs_surrogate=True, stochastic=True, targeted=True,
    description="Generative attack in the style of AdvGAN (Xiao et al. 2018, discriminator "
                "omitted): a perturbation generator trained on the local surrogate over the "
                "batch, epsilon*tanh output, then sent to the target",
    params=(EPSILON_LINF,
            Param(name="loss_cap", type="float", default=5.0, minimum=0.0, maximum=1e6,
                  description="per-image surrogate loss clipped at this value in training, so "
                              "images already fooled stop dominating (0 = off)"),
            Param(name="epochs", type="int", default=60, minimum=1, maximum=10_000,
                  description="training passes over the batch's images"),
            Param(name="batch_size", type="int", default=8, minimum=1, maximum=4096,
                  description="images per training step"),
            Param(name="learning_rate", type="float", default=0.003, minimum=1e-6, maximum=1.0,
                  description="Adam learning rate of the generator"),
            Param(name="width", type="int", default=16, minimum=2, maximum=256,
                  description="channels of the generator's bottleneck (its size)"),
            *BOOSTER_PARAMS),
    run=run)
