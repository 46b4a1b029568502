"""Dispersion Reduction, DR (IEEE-A7 transfer, feature layer, L-inf; Lu et al. 2020,
"Enhancing cross-task black-box transferability of adversarial examples with dispersion
reduction"): iteratively *lower the standard deviation* of one intermediate feature map of
the local surrogate, within the L-inf ball. A flat feature map carries little information
for whatever head follows, so the perturbation transfers across models and even tasks; the
attack needs no label (untargeted only).

Each step, per image: ``adv <- clip_[x-eps, x+eps] & [0,1] (adv - step_size * sign(d))``
with ``d`` the gradient of ``std(features(adv, layer))`` (the standard deviation over every
element of the image's feature map), the signed projected descent of the paper's Algorithm 1.

**The layer** (``params.layer``): a module name of the surrogate (``WhiteBox.layer_names``;
an unknown name is InvalidArgument naming ``params.layer`` with the list). Empty: a middle
layer chosen by :func:`default_layer` -- the middle leaf module of the convolutional part
(the leaf modules before the first Flatten / Linear), moved on to the BatchNorm / activation
that follows it; for the built-in ``fmnist-surrogate`` that is ``features.3`` (the ReLU
after the second convolution), as the paper takes a middle block of VGG16 (conv3.3). The
layer used is logged (logger ``fortis.attacks.dispersion``) and given by
:func:`resolve_layer`.

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
    linf_levels,
)
from .whitebox import WhiteBox, chunks, crafted, quantise, to_tensor

__all__ = ["LAYER_PARAM", "SPEC", "default_layer", "feature_pgd", "resolve_layer", "run"]

log = logging.getLogger("fortis.attacks.dispersion")
_HEADS = (torch.nn.Flatten, torch.nn.Linear)
_FOLLOWERS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.ReLU, torch.nn.ReLU6,
              torch.nn.LeakyReLU, torch.nn.GELU, torch.nn.SiLU, torch.nn.Hardswish,
              torch.nn.ELU, torch.nn.Tanh, torch.nn.Sigmoid)

LAYER_PARAM = Param(
    name="layer", type="string", default="",
    description="module name of the surrogate whose output is attacked (WhiteBox.layer_names; "
                "'' = a middle layer chosen automatically)")


def _leaves(wb: WhiteBox) -> list[tuple[str, torch.nn.Module]]:
    return [(n, m) for n, m in wb._feature_model().named_modules()
            if n and not any(True for _ in m.children())]


def default_layer(wb: WhiteBox, where: str = "middle") -> str:
    """The layer used when ``params.layer`` is empty. ``middle`` (DR): the middle leaf of the
    convolutional part, moved on to the BatchNorm / activation after it. ``last`` (the
    feature attack): the input of the final Linear layer -- the last leaf before it, i.e. the
    penultimate representation."""
    leaves = _leaves(wb)
    if not leaves:
        return wb.layer_names()[0]
    if where == "last":
        lin = [k for k, (_, m) in enumerate(leaves) if isinstance(m, torch.nn.Linear)]
        k = lin[-1] - 1 if lin and lin[-1] > 0 else len(leaves) - 1
        while k > 0 and isinstance(leaves[k][1], torch.nn.Dropout):
            k -= 1
        return leaves[k][0]
    head = next((k for k, (_, m) in enumerate(leaves) if isinstance(m, _HEADS)), len(leaves))
    conv = leaves[:head] or leaves
    k = (len(conv) - 1) // 2 if len(conv) % 2 == 0 else len(conv) // 2
    while k + 1 < len(conv) and isinstance(conv[k + 1][1], _FOLLOWERS):
        k += 1
    return conv[k][0]


def resolve_layer(wb: WhiteBox, layer: str, where: str = "middle") -> str:
    """``layer`` checked against the surrogate's modules (InvalidArgument naming
    ``params.layer`` with the list), or the default when empty."""
    name = str(layer or "") or default_layer(wb, where)
    with torch.inference_mode():
        wb.features(torch.zeros((1, *_shape(wb))), name)  # raises for an unknown name
    return name


def _shape(wb: WhiteBox) -> tuple[int, int, int]:
    spec = wb.surrogates[0].input_spec
    return (int(spec.channels), int(spec.height), int(spec.width))


def feature_pgd(wb: WhiteBox, images: np.ndarray, *, layer: str, epsilon: float, steps: int,
                step_size: float, objective) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    """Signed projected *descent* of ``objective(features(adv, layer), rows) -> per-image
    loss`` in the L-inf ball; uint8 adversarials (bound enforced after rounding) and whether
    the surrogate got each clean image right."""
    e = linf_levels(epsilon)
    eps = float(epsilon)
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
                a = adv.detach().requires_grad_(True)
                with torch.enable_grad():
                    loss = objective(wb.features(a, layer), rows).sum()
                    (g,) = torch.autograd.grad(loss, a)
                with torch.no_grad():  # not inference_mode: the iterate is differentiated next
                    adv = adv - step_size * g.sign()
                    adv = torch.min(torch.max(adv, x - eps), x + eps).clamp(0.0, 1.0)
            advs[rows] = quantise(adv, xs, e)
    return advs, correct


def _dispersion(f: torch.Tensor, _rows: np.ndarray) -> torch.Tensor:
    return f.flatten(1).std(dim=1)


def run(ctx: AttackContext) -> list[AttackResult]:
    images, _ = check_batch(ctx.images, ctx.labels)
    p = ctx.params
    eps, steps = float(p["epsilon"]), int(p["steps"])
    size = float(p["step_size"]) or max(1.0 / 255.0, 2.5 * eps / steps)
    wb = WhiteBox.from_ctx(ctx)
    layer = resolve_layer(wb, str(p["layer"]))
    log.info("dispersion reduction on layer %s of %s", layer,
             getattr(ctx.surrogate, "name", "?"))
    advs, correct = feature_pgd(wb, images, layer=layer, epsilon=eps, steps=steps,
                                step_size=size, objective=_dispersion)
    return crafted(images, advs, correct)


SPEC = AttackSpec(
    id="dispersion_reduction", kind="transfer", family="feature-layer", norms=("linf",),
    refs=("IEEE-A7", "IEEE-A9"), needs_surrogate=True, stochastic=False,
    description="Dispersion Reduction (Lu et al. 2020): lowers the standard deviation of a "
                "middle feature map of the local surrogate within the L-inf ball (no label "
                "needed), then sent to the target",
    params=(EPSILON_LINF, LAYER_PARAM,
            Param(name="steps", type="int", default=40, minimum=1, maximum=1000,
                  description="iterations"),
            Param(name="step_size", type="float", default=0.0, minimum=0.0, maximum=1.0,
                  description="step in [0,1] scale; 0 = max(1/255, 2.5*epsilon/steps)")),
    run=run)
