"""DEG-1 model gradient descent (white-box, after Szegedy et al. 2013): one signed-gradient step
of GRADIENT_STEP grey levels per level against the surrogate's log p(true class). torch is
imported only when it runs, so the rest of the catalogue loads without it."""

from __future__ import annotations

from typing import Any

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.degradation.operators import GRADIENT_STEP
from fortis.services.perturbation.spec import ApplyContext


def check_model_context(ctx: ApplyContext) -> tuple[Any, int]:
    """The surrogate and the true label from ``ctx``, validated (fields ``model``, ``label``)."""
    model = ctx.model
    if model is None:
        raise InvalidArgument("model", "model_gradient_descent is white-box: it needs a surrogate "
                              "model (ApplyContext.model)")
    missing = [a for a in ("model", "to_model_input", "input_spec") if not hasattr(model, a)]
    if missing or not callable(model.model) or not callable(model.to_model_input):
        raise InvalidArgument("model", "must be a TorchClassifier-like surrogate with .model, "
                              f".to_model_input and .input_spec; missing: {', '.join(missing)}")
    label = ctx.label
    if isinstance(label, bool) or not isinstance(label, int | np.integer):
        raise InvalidArgument("label", f"model_gradient_descent needs the image's true label "
                              f"(an integer class index), got {label!r}")
    n_classes = getattr(model, "num_classes", None)
    if int(label) < 0 or (isinstance(n_classes, int) and int(label) >= n_classes):
        raise InvalidArgument("label", f"must be a class index in 0..{n_classes - 1}, got {label}"
                              if isinstance(n_classes, int) else f"must be >= 0, got {label}")
    return model, int(label)


def _gradient_direction(img: np.ndarray, model: Any, label: int) -> np.ndarray:
    """sign(d log p(label) / d pixel) as int8 H x W x C (0 where the gradient is 0)."""
    import torch
    import torch.nn.functional as F

    net = model.model
    spec = model.input_spec
    param = next(iter(net.parameters()), None)
    device = param.device if param is not None else torch.device("cpu")
    h, w, c = img.shape
    with torch.inference_mode(False), torch.enable_grad():
        x = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1))).to(
            device=device, dtype=torch.float32)[None].requires_grad_(True)
        approx = x / 255.0
        if (h, w) != (spec.height, spec.width):
            shrink = spec.height <= h and spec.width <= w
            approx = F.interpolate(approx, size=(spec.height, spec.width),
                                   mode="area" if shrink else "bilinear",
                                   **({} if shrink else {"align_corners": False}))
        if c != spec.channels:
            if spec.channels == 3:
                approx = approx.repeat(1, 3, 1, 1)
            else:
                luma = torch.tensor([0.299, 0.587, 0.114], device=device).view(1, 3, 1, 1)
                approx = (approx * luma).sum(dim=1, keepdim=True)
        exact = model.to_model_input(img[None]).to(device=device, dtype=approx.dtype)
        # The value the surrogate really sees, the gradient of the differentiable stand-in.
        inp = exact + (approx - approx.detach())
        logits = net(inp)
        if label >= logits.shape[1]:
            raise InvalidArgument("label", f"must be a class index in 0..{logits.shape[1] - 1}, "
                                  f"got {label}")
        log_p = torch.log_softmax(logits.to(torch.float32), dim=1)[0, label]
        (grad,) = torch.autograd.grad(log_p, x)
    return grad[0].sign().to(torch.int8).permute(1, 2, 0).cpu().numpy()


def model_gradient_descent(img: np.ndarray, level: int, rng: np.random.Generator,
                           ctx: ApplyContext) -> np.ndarray:
    model, label = check_model_context(ctx)
    direction = _gradient_direction(img, model, label)
    out = img.astype(np.int16) - GRADIENT_STEP * direction.astype(np.int16)
    return np.clip(out, 0, 255).astype(np.uint8)
