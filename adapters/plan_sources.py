"""The built-in image sources a plan may name (``dataset.source``): a registry the
composition root (server/app/stack.py) hands to the evaluation service, so that service never
imports data or model code.

Each source takes the plan's dataset selection (split, offset, limit) and returns
``(image id, uint8 HxWxC image, dataset labels)`` rows; label mapping (IEEE-P6) is applied by
the evaluation service.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from fortis.services.common.errors import InvalidArgument

__all__ = ["BUILTIN_SOURCES", "fashion_mnist", "imagenet_photos", "named_image"]

Row = tuple[str, np.ndarray, tuple[int, ...]]


def fashion_mnist(ds: Any) -> list[Row]:
    """Fashion-MNIST (Debian dataset-fashion-mnist), 28x28 grey, ids fmnist-<split>-NNNNN."""
    from fortis.adapters.torch_models.datasets import load_fashion_mnist

    images, labels = load_fashion_mnist(ds.split, limit=ds.limit, offset=ds.offset)
    return [(f"fmnist-{ds.split}-{ds.offset + k:05d}", im, (int(lab),))
            for k, (im, lab) in enumerate(zip(images, labels, strict=True))]


def imagenet_photos(ds: Any) -> list[Row]:
    """Natural photos available offline with their ImageNet labels, resized (shorter side
    256) and centre-cropped to 224x224, ids photo-<name>."""
    from fortis.adapters.torch_models.datasets import load_imagenet_photos
    from fortis.adapters.torch_models.mobilenet import preprocess_photo

    photos = load_imagenet_photos()[ds.offset:ds.offset + ds.limit]
    return [(p.image_id, preprocess_photo(p.image), tuple(int(x) for x in p.labels))
            for p in photos]


BUILTIN_SOURCES: dict[str, Callable[[Any], list[Row]]] = {
    "fashion-mnist": fashion_mnist,
    "imagenet-photos": imagenet_photos,
}


def named_image(name: str) -> np.ndarray:
    """A photo available offline: darknet's (Debian package), scikit-image's, or Fashion-MNIST."""
    from fortis.adapters.torch_models import datasets

    if name == "fashion-mnist":
        images, _ = datasets.load_fashion_mnist("test", limit=1)
        return np.ascontiguousarray(images[0])
    path = Path(name)
    if path.suffix.lower() in (".png", ".jpg", ".jpeg") or path.exists():
        if not path.exists():
            raise InvalidArgument("image", f"no such file: {name}")
        data = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if data is None:
            raise InvalidArgument("image", f"not a readable PNG/JPEG: {name}")
        return np.ascontiguousarray(cv2.cvtColor(data, cv2.COLOR_BGR2RGB))
    darknet = datasets.DARKNET_DIR / f"{name}.jpg"
    if darknet.exists():
        return named_image(str(darknet))
    try:
        from skimage import data as skdata  # optional (dev extra)
        img = getattr(skdata, name)()
    except (ImportError, AttributeError):
        raise InvalidArgument("image", f"unknown built-in image '{name}': use a file path, a "
                              "darknet photo (dog, eagle, giraffe, kite, person, horses), "
                              "fashion-mnist, or a scikit-image photo (astronaut, chelsea, coffee)") from None
    img = np.asarray(img)
    if img.ndim == 3 and img.shape[2] == 4:
        img = img[:, :, :3]
    return np.ascontiguousarray(img.astype(np.uint8))
