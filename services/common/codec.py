"""Images and predictions between numpy and the protobuf contracts.

Conversion only (protobuf messages, no gRPC). Decoding failures become
``InvalidArgument`` naming the field, e.g. ``images[3].encoded``. Tensors (``tensor_to_array``,
``fill_tensor``...) are the domain kernel's (:mod:`fortis.core.tensors`: the answer types
convert themselves with them).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import cv2
import numpy as np
from fortis.common.v1 import common_pb2
from fortis.core.task import Task
from fortis.core.tensors import fill_tensor, tensor_to_array
from fortis.services.common.errors import InvalidArgument

#: Largest image accepted, pixels (guards against decompression bombs).
MAX_PIXELS = 40_000_000


def png_array(image: np.ndarray) -> np.ndarray:
    """Lossless PNG of a uint8 HxW / HxWx1 / HxWx3 (RGB) image, as a uint8 array (the
    encoder's own buffer: copied on only where it is needed)."""
    arr = np.ascontiguousarray(image)
    if arr.ndim == 3 and arr.shape[2] == 3:
        arr = cv2.cvtColor(arr, cv2.COLOR_RGB2BGR)
    elif arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    ok, buf = cv2.imencode(".png", arr, [cv2.IMWRITE_PNG_COMPRESSION, 1])
    if not ok:
        raise InvalidArgument("image", "PNG encoding failed")
    return buf


def encode_png(image: np.ndarray) -> bytes:
    """Lossless PNG of a uint8 HxW / HxWx1 / HxWx3 (RGB) image."""
    return png_array(image).tobytes()


#: JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic): they carry the size.
_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE,
                       0xCF})
#: JPEG markers with no length field (TEM, RSTn, SOI, EOI).
_JPEG_BARE = frozenset({0x01, 0xD8, 0xD9, *range(0xD0, 0xD8)})


def image_header_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) declared by a PNG (IHDR) or JPEG (first SOFn) header, read without
    decoding a pixel; None when ``data`` is neither or its header is cut short.

    Why: a 389 KB PNG declaring 20000x20000 was once fully decoded (+746 MB) before the
    pixel count was checked. The size must be known from the header first.
    """
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        if len(data) < 24 or data[12:16] != b"IHDR":
            return None
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data[:2] != b"\xff\xd8":
        return None
    i, n = 2, len(data)
    while i + 1 < n:
        if data[i] != 0xFF:
            return None                     # not at a marker: a corrupt stream
        marker = data[i + 1]
        if marker == 0xFF:                  # fill byte
            i += 1
            continue
        if marker in _JPEG_BARE:
            i += 2
            continue
        if i + 4 > n:
            return None
        length = int.from_bytes(data[i + 2:i + 4], "big")
        if length < 2:
            return None
        if marker in _JPEG_SOF:
            if i + 9 > n:
                return None
            height = int.from_bytes(data[i + 5:i + 7], "big")
            width = int.from_bytes(data[i + 7:i + 9], "big")
            return width, height
        if marker == 0xDA:                  # start of scan before any frame header
            return None
        i += 2 + length
    return None


def check_image_header(data: bytes, field: str) -> tuple[int, int]:
    """(width, height) of PNG/JPEG bytes from the header alone, refusing anything that is not a
    PNG or JPEG, declares an empty image, or more than ``MAX_PIXELS`` pixels (InvalidArgument
    naming ``field``; the message never quotes the bytes), so a decompression bomb is
    refused before anything is decoded."""
    size = image_header_size(data)
    if size is None:
        raise InvalidArgument(field, f"not a decodable PNG/JPEG image ({len(data)} bytes; no "
                              "readable PNG IHDR or JPEG frame header)")
    w, h = size
    if w <= 0 or h <= 0:
        raise InvalidArgument(field, f"the image header declares an empty image ({w}x{h})")
    if w * h > MAX_PIXELS:
        raise InvalidArgument(field, f"image too large: the header declares {w}x{h} pixels "
                              f"(at most {MAX_PIXELS} pixels)")
    return w, h


def decode_image_bytes(data: bytes, field: str) -> np.ndarray:
    """Decode PNG/JPEG bytes to uint8 HxWxC RGB (C = 1 for grey images).

    The declared size is checked from the header before anything is decoded (against
    decompression bombs), and only PNG and JPEG reach the decoder (other formats OpenCV reads
    would skip that check).
    """
    if not data:
        raise InvalidArgument(field, "empty image bytes")
    check_image_header(data, field)
    buf = np.frombuffer(data, dtype=np.uint8)
    arr = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
    if arr is None:
        raise InvalidArgument(field, f"not a decodable PNG/JPEG image ({len(data)} bytes)")
    if arr.dtype != np.uint8:
        arr = (arr / 257).astype(np.uint8) if arr.dtype == np.uint16 else arr.astype(np.uint8)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    elif arr.shape[2] == 4:
        arr = cv2.cvtColor(arr, cv2.COLOR_BGRA2RGB)
    elif arr.shape[2] == 3:
        arr = cv2.cvtColor(arr, cv2.COLOR_BGR2RGB)
    if arr.shape[0] * arr.shape[1] > MAX_PIXELS:
        raise InvalidArgument(field, f"image too large: {arr.shape[1]}x{arr.shape[0]} pixels")
    return np.ascontiguousarray(arr)


def decode_image(msg: common_pb2.Image, field: str) -> np.ndarray:
    """uint8 HxWxC array of an Image message (encoded bytes or raw uint8 tensor)."""
    kind = msg.WhichOneof("content")
    if kind == "encoded":
        return decode_image_bytes(msg.encoded, f"{field}.encoded")
    if kind == "tensor":
        arr = tensor_to_array(msg.tensor, f"{field}.tensor")
        if arr.dtype != np.uint8:
            raise InvalidArgument(f"{field}.tensor.dtype", "images must be uint8 tensors")
        if arr.ndim == 2:
            arr = arr[:, :, None]
        if arr.ndim != 3 or arr.shape[2] not in (1, 3):
            raise InvalidArgument(f"{field}.tensor.shape", f"expected [height, width, 1|3], got {list(arr.shape)}")
        if arr.shape[0] * arr.shape[1] > MAX_PIXELS:
            raise InvalidArgument(f"{field}.tensor.shape", "image too large")
        return arr
    raise InvalidArgument(field, "image has no content: set 'encoded' or 'tensor'")


def decode_images(msgs: Sequence[common_pb2.Image], field: str = "images") -> list[np.ndarray]:
    return [decode_image(m, f"{field}[{i}]") for i, m in enumerate(msgs)]


def fill_image(msg: common_pb2.Image, image_id: str, image: np.ndarray, *,
               raw: bool = False) -> common_pb2.Image:
    """Fill the Image ``msg`` in place: a raw uint8 tensor (``raw``) or PNG bytes."""
    msg.image_id = image_id
    if raw:
        fill_tensor(msg.tensor, image)
    else:
        msg.encoded = encode_png(image)
    return msg


def image_msg(image_id: str, image: np.ndarray, *, raw: bool = False) -> common_pb2.Image:
    """An Image message on its own. Into a request: :func:`add_images` (or ``CopyFrom``)."""
    return fill_image(common_pb2.Image(), image_id, image, raw=raw)


def add_messages(field: Any, messages: Iterable[Any]) -> None:
    """Append copies of ``messages`` to the repeated message ``field`` (``CopyFrom``: fast
    under upb, unlike a constructor argument or ``extend``; see the note in
    :mod:`fortis.core.tensors`)."""
    for m in messages:
        field.add().CopyFrom(m)


def add_images(field: Any, images: Iterable[tuple[str, np.ndarray]], *,
               raw: bool = True) -> None:
    """Append ``(image_id, array)`` pairs to the repeated Image ``field`` of a message being
    built, each filled in place (see the note in :mod:`fortis.core.tensors`)."""
    for image_id, image in images:
        fill_image(field.add(), image_id, image, raw=raw)


def image_sha256(msg: common_pb2.Image) -> str:
    kind = msg.WhichOneof("content")
    data = msg.encoded if kind == "encoded" else (msg.tensor.data if kind == "tensor" else b"")
    return hashlib.sha256(data).hexdigest()


def classification_from_proba(proba: np.ndarray, *, output: str, top_k: int,
                              names: Sequence[str]) -> common_pb2.Classification:
    """A classification answer in one of the output modes real services expose.

    ``output``: "full_scores" | "top_k" | "label_only".
    """
    out = common_pb2.Classification()
    fill_classification(out, proba, output=output, top_k=top_k, names=names)
    return out


def fill_classification(msg: common_pb2.Classification, proba: np.ndarray, *, output: str,
                        top_k: int, names: Sequence[str],
                        order: np.ndarray | None = None) -> common_pb2.Classification:
    """Fill ``msg`` in place with :func:`classification_from_proba`'s answer; ``order``: the
    classes by decreasing score (``np.argsort(-proba, kind="stable")``), when the caller sorted
    a whole batch at once. Each class is added to the repeated field and set there: building
    ``ClassScore`` messages and handing them to a constructor copies each one again, which
    cost a built-in target about as much per answer as its model (Fashion-MNIST CNN)."""
    if order is None:
        order = np.argsort(-proba, kind="stable")
    classes = msg.classes
    if output not in ("full_scores", "top_k"):
        top = int(order[0])
        c = classes.add()
        c.label = top
        c.name = names[top]
        return msg
    keep = (order if output == "full_scores" else order[:top_k]).tolist()
    for label, score in zip(keep, proba[keep].tolist(), strict=True):
        c = classes.add()
        c.label = label
        c.name = names[label]
        c.score = score
    return msg


def dense_scores(pred: common_pb2.Prediction, num_classes: int) -> np.ndarray:
    """Score vector over all classes; classes the target did not return score 0."""
    out = np.zeros(num_classes, dtype=np.float32)
    for c in pred.classification.classes:
        if 0 <= c.label < num_classes and c.HasField("score"):
            out[c.label] = c.score
    return out


def summarize(pred: common_pb2.Prediction) -> str:
    """Short ledger summary of an answer."""
    which = pred.WhichOneof("result")
    task = Task(which) if which else None    # the result's oneof fields are named after the tasks
    if task == Task.CLASSIFICATION:
        cls = pred.classification.classes
        if not cls:
            return "empty"
        top = cls[0]
        return f"top1={top.label}" + (f" p={top.score:.4f}" if top.HasField("score") else "")
    if task == Task.DETECTION:
        return f"boxes={len(pred.detection.boxes)}"
    if task == Task.SEGMENTATION:
        return f"mask={list(pred.segmentation.class_map.shape)}"
    return "none"
