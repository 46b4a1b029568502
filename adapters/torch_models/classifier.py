"""In-process image classifier over a torch model: uint8 images in, softmax out.

Used by the target adapter (the service under test) and by the tester's surrogate
attacks. Preprocessing is fixed and documented: each image is resized to the model's
input size (``cv2.INTER_AREA`` when shrinking, ``cv2.INTER_LINEAR`` otherwise; no crop,
aspect ratio not kept), grey is repeated to RGB / RGB is converted to grey (ITU-R 601
luma, ``cv2.COLOR_RGB2GRAY``) as the model needs, an alpha channel is dropped, and
pixels are scaled to float32 [0, 1] in NCHW.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np
import torch
from torch import nn

from .datasets import FASHION_MNIST_CLASSES
from .efficientnet import WEIGHTS_FILE as EFFICIENTNET_WEIGHTS
from .efficientnet import load_efficientnet_lite0
from .fmnist import CACHE_VERSION, load_fmnist_model
from .mobilenet import WEIGHTS_FILE, imagenet_class_names, load_mobilenet_v2

__all__ = ["InputSpec", "TorchClassifier", "efficientnet_lite0_classifier", "fmnist_classifier",
           "mobilenet_classifier"]

BATCH_SIZE = 64


@dataclass(frozen=True, kw_only=True)
class InputSpec:
    """The image shape a model consumes (H x W x C, C = 1 grey or 3 RGB)."""

    height: int
    width: int
    channels: int

    def __post_init__(self) -> None:
        if self.height < 1 or self.width < 1:
            raise ValueError(f"bad input size {self.height}x{self.width}")
        if self.channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, got {self.channels}")


class TorchClassifier:
    """A torch model taking float32 N x C x H x W in [0, 1] and returning class logits."""

    def __init__(
        self,
        model: nn.Module,
        *,
        input_spec: InputSpec,
        class_names: Sequence[str],
        name: str,
        version: str,
    ) -> None:
        self.model = model.eval()
        self.input_spec = input_spec
        self.class_names: tuple[str, ...] = tuple(class_names)
        self.name = name
        self.version = version

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def fit_input(self, image: np.ndarray) -> np.ndarray:
        """One uint8 H x W x C image -> uint8 height x width x channels of the model's input
        (what :meth:`to_model_input` does to each image of a batch). Fitting a batch's images
        one at a time before stacking them never holds a stack of full-size images (seven
        4096 x 4096 images were stacked into a 112 MiB copy made while holding the
        interpreter lock, to be shrunk to 28 x 28 after)."""
        spec = self.input_spec
        if image.shape[2] == 4:
            image = image[:, :, :3]
        h, w = image.shape[:2]
        if (h, w) != (spec.height, spec.width):
            shrink = spec.height <= h and spec.width <= w
            image = cv2.resize(
                np.ascontiguousarray(image), (spec.width, spec.height),
                interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
            if image.ndim == 2:
                image = image[:, :, None]
        c = image.shape[2]
        if c != spec.channels:
            if spec.channels == 3:  # grey -> RGB
                image = np.repeat(image, 3, axis=2)
            else:  # RGB -> grey
                image = cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2GRAY)[:, :, None]
        return image

    def to_model_input(self, images: np.ndarray) -> torch.Tensor:
        """uint8 N x H x W x C (C in 1, 3, 4; any H, W) -> float32 N x C' x H' x W' in [0, 1]."""
        arr = np.asarray(images)
        if arr.dtype != np.uint8:
            raise ValueError(f"expected uint8 images, got {arr.dtype}")
        if arr.ndim != 4 or arr.shape[3] not in (1, 3, 4):
            raise ValueError(f"expected N x H x W x C images with C in (1, 3, 4), got {arr.shape}")
        spec = self.input_spec
        out = np.empty((len(arr), spec.height, spec.width, spec.channels), dtype=np.uint8)
        for i, image in enumerate(arr):
            out[i] = self.fit_input(image)
        return torch.from_numpy(out).permute(0, 3, 1, 2).to(torch.float32).div_(255.0)

    def predict_logits(self, images: np.ndarray) -> np.ndarray:
        """float32 N x num_classes logits."""
        arr = np.asarray(images)
        results = [np.empty((0, self.num_classes), dtype=np.float32)]
        with torch.inference_mode():
            for i in range(0, len(arr), BATCH_SIZE):
                logits = self.model(self.to_model_input(arr[i:i + BATCH_SIZE]))
                results.append(logits.to(torch.float32).numpy())
        out = np.concatenate(results)
        if out.shape[1] != self.num_classes:
            raise ValueError(f"model returned {out.shape[1]} classes, "
                             f"{self.num_classes} class names given")
        return out

    def predict_proba(self, images: np.ndarray) -> np.ndarray:
        """uint8 N x H x W x C -> float32 N x num_classes softmax probabilities."""
        logits = torch.from_numpy(self.predict_logits(images))
        return torch.softmax(logits, dim=1).numpy()

    def predict(self, images: np.ndarray) -> np.ndarray:
        """int64 N top-1 class indices."""
        return self.predict_proba(images).argmax(axis=1).astype(np.int64)

    def __repr__(self) -> str:
        s = self.input_spec
        return (f"TorchClassifier(name={self.name!r}, version={self.version!r}, "
                f"input={s.height}x{s.width}x{s.channels}, classes={self.num_classes})")


def fmnist_classifier(kind: str = "target") -> TorchClassifier:
    """A Fashion-MNIST model of ``kind`` (fmnist.KINDS: target, surrogate, mlp, robust; trained
    on first use, then cached), named ``fmnist-<kind>`` in its target info."""
    model, _metrics = load_fmnist_model(kind)
    return TorchClassifier(
        model, input_spec=InputSpec(height=28, width=28, channels=1),
        class_names=FASHION_MNIST_CLASSES, name=f"fmnist-{kind}", version=CACHE_VERSION)


def mobilenet_classifier() -> TorchClassifier:
    """torchvision's ImageNet MobileNetV2 weights (1000 classes, 224 x 224 RGB)."""
    return TorchClassifier(
        load_mobilenet_v2(), input_spec=InputSpec(height=224, width=224, channels=3),
        class_names=list(imagenet_class_names()), name="mobilenet_v2-imagenet",
        version=WEIGHTS_FILE.removesuffix(".pth"))


def efficientnet_lite0_classifier() -> TorchClassifier:
    """ImageNet EfficientNet-Lite0 (offline packages; 1000 classes, 224 x 224 RGB): a second
    ImageNet architecture next to MobileNetV2 (surrogate vs target, IEEE-A7)."""
    return TorchClassifier(
        load_efficientnet_lite0(), input_spec=InputSpec(height=224, width=224, channels=3),
        class_names=list(imagenet_class_names()), name="efficientnet_lite0-imagenet",
        version=EFFICIENTNET_WEIGHTS.removesuffix(".pth"))
