"""Built-in models, by name: the targets and surrogates Fortis can serve without a network.

    fmnist-cnn        Fashion-MNIST CNN trained by the project (target)
    fmnist-surrogate  a second, different Fashion-MNIST CNN (the tester's surrogate)
    fmnist-mlp        a third Fashion-MNIST model, an MLP (a second surrogate: ensembles;
                      also a target)
    fmnist-cnn-at     fmnist-cnn's architecture adversarially trained (FGSM with a random
                      start, L-inf 0.1): the defended model of benchmarks across models
    mobilenet-v2      ImageNet MobileNetV2 with torchvision's weights (offline package)
    efficientnet-lite0  ImageNet EfficientNet-Lite0 (offline packages): a second ImageNet
                      architecture, surrogate or target next to mobilenet-v2 (IEEE-A7)
    mtcnn-surrogate   MTCNN's P-, R-, O-Net in torch: a differentiable surrogate detector
                      (transfer attacks on detection targets; not a classifier)
    u2netp-surrogate  U2-Net-p converted from its ONNX file to torch: a differentiable
                      surrogate segmenter (transfer attacks on segmentation targets)

Built-in targets that are not classifiers (fortis.adapters.vision_targets; installed on
first use by scripts/setup_vision.sh):

    haar-face         OpenCV Haar frontal-face cascade (detection)
    mtcnn             facenet-pytorch MTCNN with its bundled weights (detection)
    blazeface         MediaPipe BlazeFace, full range, in .venv-mediapipe (detection)
    selfie-seg        MediaPipe selfie segmentation, person vs background (segmentation)
    u2netp            U2-Net-p salient-object segmentation on onnxruntime (segmentation)

Models load lazily, once per process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from fortis.services.common.errors import InvalidArgument


def _fmnist(kind: str) -> Callable[[], Any]:
    def load() -> Any:
        from fortis.adapters.torch_models.classifier import fmnist_classifier
        return fmnist_classifier(kind)
    return load


def _mobilenet() -> Any:
    from fortis.adapters.torch_models.classifier import mobilenet_classifier
    return mobilenet_classifier()


def _efficientnet() -> Any:
    from fortis.adapters.torch_models.classifier import efficientnet_lite0_classifier
    return efficientnet_lite0_classifier()


def _vision_surrogate(name: str) -> Callable[[], Any]:
    def load() -> Any:
        from fortis.adapters.vision_targets.surrogates import SURROGATES
        return SURROGATES[name]()
    return load


BUILTIN_MODELS: dict[str, Callable[[], Any]] = {
    "fmnist-cnn": _fmnist("target"),
    "fmnist-surrogate": _fmnist("surrogate"),
    "fmnist-mlp": _fmnist("mlp"),
    "fmnist-cnn-at": _fmnist("robust"),
    "mobilenet-v2": _mobilenet,
    "efficientnet-lite0": _efficientnet,
    # surrogates of detectors / segmenters (``task``, ``task_loss``; whitebox.py)
    "mtcnn-surrogate": _vision_surrogate("mtcnn-surrogate"),
    "u2netp-surrogate": _vision_surrogate("u2netp-surrogate"),
}

#: Built-in targets that are not classifiers (detectors, segmenters): name -> factory of an
#: object with ``info() -> TargetInfo`` and ``predict(images) -> [Prediction]``, served
#: through ``TargetService`` by ``fortis.adapters.torch_target.TargetServicer``. Filled by
#: ``fortis.adapters.vision_targets`` (imported below when present).
BUILTIN_TARGETS: dict[str, Callable[[], Any]] = {}
try:
    from fortis.adapters.vision_targets import TARGETS as _VISION_TARGETS
    BUILTIN_TARGETS.update(_VISION_TARGETS)
except ImportError:  # pragma: no cover - the module is part of the distribution
    pass

_cache: dict[str, Any] = {}
_lock = threading.Lock()


def load_model(name: str, field: str = "model") -> Any:
    """The classifier named ``name`` (loaded once per process)."""
    if name not in BUILTIN_MODELS:
        raise InvalidArgument(field, f"unknown built-in model '{name}'; known: {', '.join(BUILTIN_MODELS)}")
    with _lock:
        if name not in _cache:
            _cache[name] = BUILTIN_MODELS[name]()
        return _cache[name]
