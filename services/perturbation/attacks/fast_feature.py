"""The Fast Feature attack (IEEE-A7 transfer, feature layer, L-inf; the feature-space attack of
Sabour et al. 2016, "Adversarial manipulation of deep representations", as IBM ART's
``FeatureAdversariesPyTorch`` implements it with its PGD optimiser): make the image's
representation at one layer of the local surrogate match a *guide* image's, within the L-inf
ball, so the image still looks like itself but the surrogate "sees" the guide.

Each step, per image: ``adv <- clip_[x-eps, x+eps] & [0,1] (adv - step_size * sign(d))`` with
``d`` the gradient of ``||features(adv, layer) - features(guide, layer)||_2^2`` (ART's loss,
summed over the feature map, ``lambda_ = 0``).

**The guide** is another image of the batch of a different class, chosen deterministically
from the seed (:func:`choose_guides`, from ``ctx.rng()``): untargeted, uniformly among the
batch's images whose label differs from the image's; targeted (``TargetedMisclassification``),
among the batch's images of the target class (targeted in the sense of the guide's class).
Where the batch holds no such image (a batch of one image, of one class, without the target
class: what the batch holds depends on the plan's batch size, never on what the attack
needs), the guide is the surrogate's own image of a class (:func:`class_image`: gradient
ascent of the class's log-probability from mid-grey, deterministic): the target class, or a
class other than the image's drawn from the seed.

**The layer** (``params.layer``): a module name of the surrogate (unknown: InvalidArgument
naming ``params.layer`` with the layer list); empty = the penultimate representation, the
input of the surrogate's last Linear layer (the paper attacks deep layers such as fc7) --
``classifier.2`` on the built-in ``fmnist-surrogate`` (``dispersion.default_layer``). Only
the first surrogate of an ensemble is used (its feature space).

**The bound (IEEE-A9)** is enforced on the uint8 output (round, then ``clip_to_linf``).
Nothing here queries the target: ``success`` is None, ``queries`` 0, stop reason
``iterations``. Registry entry: :data:`SPEC`.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from fortis.services.common.params import Param

from .base import (
    EPSILON_LINF,
    AttackContext,
    AttackResult,
    AttackSpec,
    check_batch,
)
from .dispersion import LAYER_PARAM, feature_pgd, resolve_layer
from .whitebox import WhiteBox, crafted, to_tensor

__all__ = ["SPEC", "choose_guides", "run"]

log = logging.getLogger("fortis.attacks.fast_feature")


def choose_guides(labels: np.ndarray, rng: np.random.Generator,
                  target: int | None = None, num_classes: int = 0) -> np.ndarray:
    """Per image, the index of its guide in the batch, or ``-1 - c`` where the batch holds
    none and the surrogate's own image of class ``c`` guides it (see the module doc;
    ``num_classes``: the surrogate's, for drawing such a class; 0: the batch's labels)."""
    labels = np.asarray(labels, dtype=np.int64)
    n = labels.shape[0]
    pool = np.flatnonzero(labels == int(target)) if target is not None else np.empty(0, int)
    classes = max(int(num_classes), int(labels.max(initial=0)) + 1, 2)
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        cand = pool[pool != i] if target is not None else np.flatnonzero(labels != labels[i])
        if target is not None and cand.size == 0:
            cand = pool  # the only image of the target class guides itself (already there)
        if cand.size:
            out[i] = int(cand[int(rng.integers(cand.size))])
        elif target is not None:
            out[i] = -1 - int(target)
        else:
            other = [c for c in range(classes) if c != int(labels[i])]
            out[i] = -1 - int(other[int(rng.integers(len(other)))])
    return out


#: Steps and step size of :func:`class_image` (gradient ascent in [0, 1] pixel scale).
CLASS_IMAGE_STEPS = 60
CLASS_IMAGE_STEP = 0.02


def class_image(wb: WhiteBox, shape: tuple[int, ...], cls: int) -> torch.Tensor:
    """The surrogate's own image of class ``cls`` (1 x C x H x W in [0, 1]): signed gradient
    ascent of its log-probability from mid-grey. Deterministic (no draw), so a guide made
    for one chunk is the one any batching would make."""
    x = torch.full((1, shape[2], shape[0], shape[1]), 0.5)
    for _ in range(CLASS_IMAGE_STEPS):
        x.requires_grad_(True)
        logp = torch.log_softmax(wb.plain_logits(x), dim=1)[0, int(cls)]
        (g,) = torch.autograd.grad(logp, x)
        x = (x.detach() + CLASS_IMAGE_STEP * g.sign()).clamp(0.0, 1.0)
    return x.detach()


def run(ctx: AttackContext) -> list[AttackResult]:
    images, labels = check_batch(ctx.images, ctx.labels)
    if images.shape[0] == 0:
        return []
    p = ctx.params
    eps, steps = float(p["epsilon"]), int(p["steps"])
    size = float(p["step_size"]) or max(1.0 / 255.0, 2.5 * eps / steps)
    wb = WhiteBox.from_ctx(ctx)
    layer = resolve_layer(wb, str(p["layer"]), where="last")
    with wb:
        num_classes = int(wb.plain_logits(to_tensor(images[:1])).shape[1])
        guides = choose_guides(labels, ctx.rng(), wb.target, num_classes)
        made = {c: class_image(wb, images.shape[1:], c) for c in
                sorted({-1 - int(g) for g in guides if g < 0})}
    log.info("fast feature attack on layer %s of %s", layer, getattr(ctx.surrogate, "name", "?"))
    with wb, torch.no_grad():  # not inference_mode: the features enter the autograd loss
        x = torch.cat([to_tensor(images[[int(g)]]) if g >= 0 else made[-1 - int(g)]
                       for g in guides])
        guide_feats = torch.cat([wb.features(x[k:k + 64], layer)
                                 for k in range(0, len(guides), 64)])

    def objective(f: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
        g = guide_feats[torch.from_numpy(rows)]
        return (f - g).flatten(1).pow(2).sum(dim=1)

    advs, correct = feature_pgd(wb, images, layer=layer, epsilon=eps, steps=steps,
                                step_size=size, objective=objective)
    return crafted(images, advs, correct)


SPEC = AttackSpec(
    id="fast_feature", kind="transfer", family="feature-layer", norms=("linf",),
    refs=("IEEE-A7", "IEEE-A9"), needs_surrogate=True, stochastic=True, targeted=True,
    description="Fast Feature attack (Sabour et al. 2016; ART's FeatureAdversaries): moves a "
                "layer's representation onto a guide image's of another class within the "
                "L-inf ball, on the local surrogate, then sent to the target",
    params=(EPSILON_LINF, LAYER_PARAM,
            Param(name="steps", type="int", default=40, minimum=1, maximum=1000,
                  description="iterations"),
            Param(name="step_size", type="float", default=0.0, minimum=0.0, maximum=1.0,
                  description="step in [0,1] scale; 0 = max(1/255, 2.5*epsilon/steps)")),
    run=run)
