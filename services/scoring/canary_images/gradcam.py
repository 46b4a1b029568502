"""Grad-CAM and ACAMC-A/T (CAN-2, CANARY seed 003 paper 3.1.2): how far an attack moves the
white-box model's class activation maps. Domain code: no gRPC; torch autograd.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from fortis.services.common.arrays import chunk_slices
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.canary_images.common import (
    NOT_AVAILABLE,
    check_images,
    mean_node,
    missing_node,
    to_unit,
)
from torch import nn

__all__ = ["WhiteBoxModel", "acamc", "cosine_similarity", "grad_cam", "resolve_layer"]


@runtime_checkable
class WhiteBoxModel(Protocol):
    """What ACAMC needs of a white-box model (``TorchClassifier`` has both)."""

    model: nn.Module

    def to_model_input(self, images: np.ndarray) -> torch.Tensor: ...


def resolve_layer(model: nn.Module, layer: nn.Module | str | None) -> tuple[nn.Module, str]:
    """The module Grad-CAM reads: a module of ``model``, its dotted name, or (``None``) the
    last ``nn.Conv2d`` (the paper: "generally the feature layer of the last convolutional
    layer output")."""
    named = dict(model.named_modules())
    if layer is None:
        convs = [(name, m) for name, m in named.items() if isinstance(m, nn.Conv2d)]
        if not convs:
            raise InvalidArgument("layer", "the model has no nn.Conv2d; name the layer to use")
        return convs[-1][1], convs[-1][0]
    if isinstance(layer, str):
        if layer not in named:
            raise InvalidArgument("layer", f"the model has no module named {layer!r}")
        return named[layer], layer
    for name, m in named.items():
        if m is layer:
            return m, name
    raise InvalidArgument("layer", "the module is not part of the model")


def _cams(model: nn.Module, layer: nn.Module, inputs: torch.Tensor,
          class_sets: Sequence[torch.Tensor | None]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One forward pass; Grad-CAM maps for each class set (``None`` = the predicted class).
    Returns the logits and one N x h x w map per class set."""
    captured: list[torch.Tensor] = []

    def hook(_m: nn.Module, _inp: Any, out: Any) -> Any:
        if not isinstance(out, torch.Tensor):
            raise InvalidArgument("layer", "Grad-CAM needs a layer whose output is one tensor")
        captured.append(out)
        return out.clone()  # later in-place ops cannot touch the captured activation

    handle = layer.register_forward_hook(hook)
    try:
        with torch.enable_grad():
            x = inputs.detach().clone().requires_grad_(True)
            logits = model(x)
    finally:
        handle.remove()
    if not captured:
        raise InvalidArgument("layer", "the layer was not run by the model's forward pass")
    act = captured[-1]
    if act.ndim != 4:
        raise InvalidArgument("layer", f"Grad-CAM needs an N x K x h x w activation; got "
                                       f"{tuple(act.shape)}")
    predicted = logits.argmax(dim=1)
    maps = []
    for i, classes in enumerate(class_sets):
        cls = predicted if classes is None else classes
        score = logits.gather(1, cls.view(-1, 1).to(torch.long)).sum()
        (grad,) = torch.autograd.grad(score, act, retain_graph=i < len(class_sets) - 1)
        weights = grad.mean(dim=(2, 3), keepdim=True)          # a_k^c = 1/Z sum_ij dy^c/dA^k_ij
        maps.append(torch.relu((weights * act).sum(dim=1)).detach())  # ReLU(sum_k a_k^c A^k)
    return logits.detach(), maps


def grad_cam(model: nn.Module, inputs: torch.Tensor, classes: Sequence[int] | torch.Tensor,
             *, layer: nn.Module | str | None = None) -> np.ndarray:
    """Grad-CAM maps ``L^c = ReLU(sum_k a_k^c A^k)``, ``a_k^c = mean_ij d y^c / d A^k_ij``
    (Selvaraju et al. 2017; CANARY 3.1.2 ACAMC, CAN-2) of ``inputs`` (N x C x H x W, the model's
    own input) for ``classes`` (one per image). ``y^c`` is the model's pre-softmax score (as in
    Grad-CAM and the CANARY code); ``A`` is ``layer``'s output (default: the last Conv2d).
    Returns N x h x w float64 maps at the layer's resolution (not normalised or resized).
    The model should be in eval mode (batch-norm statistics fixed); it is not switched."""
    module, _ = resolve_layer(model, layer)
    cls = torch.as_tensor(classes, dtype=torch.long).reshape(-1)
    if cls.numel() != inputs.shape[0]:
        raise InvalidArgument("classes", f"need one class per image ({inputs.shape[0]}); "
                                         f"got {cls.numel()}")
    _, maps = _cams(model, module, inputs, [cls])
    return maps[0].to(torch.float64).numpy()


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of N x ... arrays; NaN where either row is all zeros."""
    fa = np.asarray(a, dtype=np.float64).reshape(len(a), -1)
    fb = np.asarray(b, dtype=np.float64).reshape(len(b), -1)
    na, nb = np.linalg.norm(fa, axis=1), np.linalg.norm(fb, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        sim = (fa * fb).sum(axis=1) / (na * nb)
    sim[(na == 0) | (nb == 0)] = np.nan
    return np.clip(sim, -1.0, 1.0)


class _BareModel:
    """A bare ``nn.Module`` taking float N x C x H x W in [0, 1]."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def to_model_input(self, images: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(to_unit(images).astype(np.float32)).permute(0, 3, 1, 2)


def _model_input(wb: WhiteBoxModel, images: np.ndarray) -> torch.Tensor:
    if images.dtype == np.uint8:
        return wb.to_model_input(images)
    # Float adversarial examples (kept as float arrays, CAN-9) go in as they are; they must
    # already have the model's input size.
    spec = getattr(wb, "input_spec", None)
    t = torch.from_numpy(to_unit(images).astype(np.float32)).permute(0, 3, 1, 2)
    if spec is not None and tuple(t.shape[1:]) != (spec.channels, spec.height, spec.width):
        raise InvalidArgument("adv_images", f"float images must already be "
                                            f"{spec.height} x {spec.width} x {spec.channels} "
                                            "(the model's input); pass uint8 to have them resized")
    return t


def acamc(
    white_box: WhiteBoxModel | nn.Module | None,
    clean_images: Any,
    adv_images: Any,
    labels: Any,
    *,
    layer: nn.Module | str | None = None,
    batch_size: int = 32,
) -> dict[str, Any]:
    """ACAMC-A and ACAMC-T (CAN-2, CANARY 3.1.2): mean cosine similarity of Grad-CAM maps
    before and after the attack,

        ACAMC-A = 1/n sum_i S(L_{x_i}^{F(x_i)}, L_{x_i^a}^{F(x_i^a)})   (inferred class)
        ACAMC-T = 1/n sum_i S(L_{x_i}^{y_i},    L_{x_i^a}^{y_i})        (true class)

    over the images the white-box model classifies correctly (F(x_i) = y_i, judged by the
    model itself). An image whose map is all zeros on either side has no cosine and is left
    out of that metric (as the authors' code does; counted in ``zero_maps``).

    ``white_box``: a :class:`WhiteBoxModel` (e.g. ``TorchClassifier``: uint8 images go
    through its ``to_model_input``; float images must already have its input size) or a bare
    ``nn.Module`` on float N x C x H x W in [0, 1]. ``None`` -> both "not available".
    """
    if white_box is None:
        reason = "needs a white-box model (Grad-CAM on its convolutional layer); none given"
        return {"ACAMC_A": missing_node(NOT_AVAILABLE, reason),
                "ACAMC_T": missing_node(NOT_AVAILABLE, reason), "layer": None}
    wb: WhiteBoxModel = _BareModel(white_box) if isinstance(white_box, nn.Module) else white_box
    if not isinstance(wb, WhiteBoxModel):
        raise InvalidArgument("white_box", "must be a torch nn.Module or have .model and "
                                           ".to_model_input (e.g. TorchClassifier)")
    x_all = check_images(clean_images, "clean_images")
    xa_all = check_images(adv_images, "adv_images")
    if x_all.shape[0] != xa_all.shape[0]:
        raise InvalidArgument("adv_images", f"{xa_all.shape[0]} images for "
                                            f"{x_all.shape[0]} clean images")
    y_all = np.asarray(labels)
    if y_all.shape != (x_all.shape[0],) or not np.issubdtype(y_all.dtype, np.integer):
        raise InvalidArgument("labels", f"must be {x_all.shape[0]} integer labels")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidArgument("batch_size", f"must be an integer >= 1; got {batch_size!r}")
    module, layer_name = resolve_layer(wb.model, layer)

    sims_a: list[np.ndarray] = []
    sims_t: list[np.ndarray] = []
    n_correct = 0
    for sl in chunk_slices(x_all.shape[0], batch_size):
        y = torch.from_numpy(y_all[sl].astype(np.int64))
        clean_logits, (clean_true,) = _cams(wb.model, module, _model_input(wb, x_all[sl]), [y])
        if clean_logits.shape[1] <= int(y.max()) or int(y.min()) < 0:
            raise InvalidArgument("labels", f"must lie in [0, {clean_logits.shape[1]})")
        correct = (clean_logits.argmax(dim=1) == y).numpy()
        if not correct.any():
            continue
        n_correct += int(correct.sum())
        # F(x) = y on these images, so L_x^{F(x)} is L_x^{y}: one clean map serves both.
        _, (adv_inferred, adv_true) = _cams(wb.model, module,
                                            _model_input(wb, xa_all[sl][correct]),
                                            [None, y[correct]])
        ref = clean_true[correct].numpy()
        sims_a.append(cosine_similarity(ref, adv_inferred.numpy()))
        sims_t.append(cosine_similarity(ref, adv_true.numpy()))

    out: dict[str, Any] = {"layer": layer_name, "n_correct": n_correct}
    for key, parts in (("ACAMC_A", sims_a), ("ACAMC_T", sims_t)):
        sims = np.concatenate(parts) if parts else np.empty(0)
        valid = sims[~np.isnan(sims)]
        reason = ("the model classified none of the images correctly" if n_correct == 0 else
                  "every Grad-CAM map pair had an all-zero map (no cosine similarity)")
        out[key] = mean_node(valid, empty_reason=reason, zero_maps=int(np.isnan(sims).sum()))
    return out
