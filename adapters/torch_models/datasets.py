"""Offline data: Fashion-MNIST (Debian ``dataset-fashion-mnist``) and labelled ImageNet photos.

Nothing here downloads anything; missing files raise (Fashion-MNIST) or are skipped
(photos).

Photos for the ImageNet MobileNetV2 target
------------------------------------------
Each photo's acceptable label set was chosen from what the photo *shows* (by looking at
it), restricted to ImageNet-1k classes; the model's output was only used afterwards to
decide whether a photo stays in the set (kept only if its top-5 contains an acceptable
label). Preprocessing: :func:`mobilenet.preprocess_photo` (shorter side 256, centre crop
224). Results with torchvision's MobileNetV2 weights (``mobilenet_v2-b0353104.pth``):

==================  =================================  ==========================  =====  =====
image_id            shows                              acceptable labels           top-1  top-5
==================  =================================  ==========================  =====  =====
darknet/dog         fluffy black/white/tan dog in       248 Eskimo dog, 249         yes    yes
                    front of a bicycle (dog is the      malamute, 250 Siberian     (249)
                    main object; breed uncertain:       husky, 232 Border collie
                    northern-spitz / herding look)
darknet/eagle       juvenile bald eagle on a shore      22 bald eagle               yes    yes
darknet/giraffe     giraffe and a zebra (ImageNet-1k    340 zebra                   yes    yes
                    has no giraffe class)
darknet/kite        beach with kite-surf kites          978 seashore, 977 sandbar,  no     yes
                                                        975 lakeside                (852)
skimage/chelsea     tabby cat (head)                    281 tabby, 282 tiger cat,   yes    yes
                                                        285 Egyptian cat           (285)
skimage/coffee      espresso in a cup on a saucer       967 espresso, 968 cup       yes    yes
skimage/rocket      Falcon 9 rocket on its launch pad   657 missile, 744            no     yes
                                                        projectile/missile          (812)
skimage/motorcycle  motorcycle in a garage (ImageNet-1k 665 moped, 670 motor        yes    yes
                    has no motorcycle class; "moped"    scooter                    (665)
                    and "motor scooter" are the motor-
                    bike classes)
==================  =================================  ==========================  =====  =====

Top-1 6/8, top-5 8/8. Considered and left out: darknet/horses (horses; 339 sorrel is the only
horse class and it is not in the top-5: ram, bighorn, water buffalo, ox, camel);
darknet/person (person, husky-like dog and a white horse; top-5 is setters/spaniels/llama,
no acceptable class); darknet/scream (a painting: no class); skimage/astronaut (a person
in a space suit: no class; the space-shuttle model is a small background object);
skimage/cat (same photo as chelsea).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "DARKNET_DIR",
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_DIR",
    "LabeledPhoto",
    "PHOTO_LABELS",
    "load_fashion_mnist",
    "load_imagenet_photos",
]

FASHION_MNIST_DIR = Path(os.environ.get("FORTIS_FMNIST_DIR", "/usr/share/datasets/fashion-mnist"))
FASHION_MNIST_CLASSES: tuple[str, ...] = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
DARKNET_DIR = Path(os.environ.get("FORTIS_DARKNET_DIR", "/usr/share/darknet/data"))

_SPLIT_PREFIX = {"train": "train", "test": "t10k"}
_SPLIT_SIZE = {"train": 60_000, "test": 10_000}


def _read_idx(path: Path, expected_magic: int) -> np.ndarray:
    if not path.is_file():
        raise FileNotFoundError(
            f"Fashion-MNIST file {path} is missing: run `apt-get install dataset-fashion-mnist` "
            "or point FORTIS_FMNIST_DIR at a folder holding the four *-ubyte.gz files")
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic = int.from_bytes(raw[0:4], "big")
    if magic != expected_magic:
        raise ValueError(f"{path}: bad idx magic {magic:#x}, expected {expected_magic:#x}")
    ndim = magic & 0xFF
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {data.size} bytes of data, header says {dims}")
    return data.reshape(dims)


def load_fashion_mnist(
    split: str = "test", limit: int | None = None, offset: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST images (uint8 N x 28 x 28 x 1) and labels (int64 N, 0..9).

    ``split`` is "train" (60,000) or "test" (10,000); ``offset``/``limit`` select the rows
    ``[offset, offset + limit)`` in file order.
    """
    if split not in _SPLIT_PREFIX:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if offset < 0 or (limit is not None and limit < 0):
        raise ValueError("offset and limit must be non-negative")
    prefix = _SPLIT_PREFIX[split]
    images = _read_idx(FASHION_MNIST_DIR / f"{prefix}-images-idx3-ubyte.gz", 0x0803)
    labels = _read_idx(FASHION_MNIST_DIR / f"{prefix}-labels-idx1-ubyte.gz", 0x0801)
    if len(images) != len(labels):
        raise ValueError(f"{split}: {len(images)} images but {len(labels)} labels")
    end = len(images) if limit is None else min(len(images), offset + limit)
    x = images[offset:end, :, :, None].copy()  # writable, detached from the file buffer
    y = labels[offset:end].astype(np.int64)
    return x, y


@dataclass(frozen=True)
class LabeledPhoto:
    """A real photo with the ImageNet-1k classes that count as a correct answer for it."""

    image_id: str
    image: np.ndarray  # uint8 H x W x 3, RGB
    labels: tuple[int, ...]  # acceptable ImageNet-1k class indices
    source: str


def _darknet(name: str) -> Callable[[], np.ndarray | None]:
    def load() -> np.ndarray | None:
        path = DARKNET_DIR / f"{name}.jpg"
        if not path.is_file():
            return None
        from PIL import Image

        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"), dtype=np.uint8)
    return load


def _skimage(name: str) -> Callable[[], np.ndarray | None]:
    def load() -> np.ndarray | None:
        try:
            import skimage.data
            image = getattr(skimage.data, name)()
        except Exception:  # scikit-image (a dev dependency) missing, or its file missing
            return None
        if isinstance(image, tuple):  # stereo_motorcycle -> (left, right, disparity)
            image = image[0]
        image = np.asarray(image)
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            return None
        return np.ascontiguousarray(image)
    return load


# image_id -> (loader, source, acceptable ImageNet-1k labels); see the module docstring.
PHOTO_LABELS: dict[str, tuple[Callable[[], np.ndarray | None], str, tuple[int, ...]]] = {
    "darknet/dog": (_darknet("dog"), str(DARKNET_DIR / "dog.jpg"), (248, 249, 250, 232)),
    "darknet/eagle": (_darknet("eagle"), str(DARKNET_DIR / "eagle.jpg"), (22,)),
    "darknet/giraffe": (_darknet("giraffe"), str(DARKNET_DIR / "giraffe.jpg"), (340,)),
    "darknet/kite": (_darknet("kite"), str(DARKNET_DIR / "kite.jpg"), (978, 977, 975)),
    "skimage/chelsea": (_skimage("chelsea"), "skimage.data.chelsea()", (281, 282, 285)),
    "skimage/coffee": (_skimage("coffee"), "skimage.data.coffee()", (967, 968)),
    "skimage/rocket": (_skimage("rocket"), "skimage.data.rocket()", (657, 744)),
    "skimage/motorcycle": (
        _skimage("stereo_motorcycle"), "skimage.data.stereo_motorcycle()[0]", (665, 670)),
}


def load_imagenet_photos() -> list[LabeledPhoto]:
    """The labelled photos available on this machine (missing ones are skipped silently)."""
    photos: list[LabeledPhoto] = []
    for image_id, (loader, source, labels) in PHOTO_LABELS.items():
        image = loader()
        if image is None:
            continue
        image.setflags(write=False)
        photos.append(LabeledPhoto(image_id=image_id, image=image, labels=labels, source=source))
    return photos
