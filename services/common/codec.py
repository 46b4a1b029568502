"""Images and predictions between numpy and the protobuf contracts.

Conversion only (protobuf messages, no gRPC). Decoding failures become
``InvalidArgument`` naming the field, e.g. ``images[3].encoded``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import cv2
import numpy as np
from fortis.common.v1 import common_pb2
from fortis.core.task import Task
from fortis.services.common.errors import InvalidArgument

#: Largest image accepted, pixels (guards against decompression bombs).
MAX_PIXELS = 40_000_000
#: DType enum value <-> numpy dtype (little-endian on the wire).
_DTYPES: dict[int, Any] = {
    common_pb2.D_TYPE_UINT8: np.uint8, common_pb2.D_TYPE_INT32: np.int32,
    common_pb2.D_TYPE_INT64: np.int64, common_pb2.D_TYPE_FLOAT16: np.float16,
    common_pb2.D_TYPE_FLOAT32: np.float32, common_pb2.D_TYPE_FLOAT64: np.float64,
    common_pb2.D_TYPE_BOOL: np.bool_}
_ENUM_OF = {np.dtype(v).str.lstrip("<|="): k for k, v in _DTYPES.items()}
#: Most elements a tensor may declare (a shape whose product overflows is refused first).
MAX_ELEMENTS = 1 << 31


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


def tensor_to_array(t: common_pb2.Tensor, field: str) -> np.ndarray:
    """The numpy array of a Tensor message (read-only view of its bytes), validated: a known
    dtype, a shape of at least one positive dimension whose element count stays bounded, and
    exactly as many bytes as the shape needs."""
    dtype = _DTYPES.get(t.dtype)
    if dtype is None:
        names = ", ".join(common_pb2.DType.Name(k) for k in _DTYPES)
        raise InvalidArgument(f"{field}.dtype", f"unsupported dtype {t.dtype}; use one of {names}")
    shape = tuple(int(s) for s in t.shape)
    if not shape:
        raise InvalidArgument(f"{field}.shape", "at least one dimension is needed")
    if any(s <= 0 for s in shape):
        raise InvalidArgument(f"{field}.shape", f"dimensions must be positive, got {list(shape)[:8]}")
    n = 1
    for s in shape:
        n *= s
        if n > MAX_ELEMENTS:
            raise InvalidArgument(f"{field}.shape", f"more than {MAX_ELEMENTS} elements")
    item = np.dtype(dtype).itemsize
    if len(t.data) != n * item:
        raise InvalidArgument(f"{field}.data", f"{len(t.data)} bytes do not match shape "
                              f"{list(shape)} of {common_pb2.DType.Name(t.dtype)}")
    return np.frombuffer(t.data, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)


# Building messages that carry images: under the upb protobuf
# runtime, putting a message built on its own into another through a constructor argument,
# ``append`` or ``extend`` copies it slowly (measured here: ~300 us for one 224x224x3 uint8
# tensor, 20x an in-place fill; the cost grows with the bytes). So messages with tensors are
# filled in place (``fill_tensor``, ``fill_image``, ``add_images``: ``repeated.add()`` then
# setting fields) or copied with ``CopyFrom`` (fast), never passed to a constructor.


def fill_tensor(msg: common_pb2.Tensor, arr: np.ndarray) -> common_pb2.Tensor:
    """Fill the Tensor ``msg`` (e.g. a field of a message being built) with a numpy array
    (little-endian, row-major); returns ``msg``."""
    a, enum = _wire_form(arr)
    msg.dtype = enum
    del msg.shape[:]
    msg.shape.extend(a.shape)
    msg.data = a.tobytes()
    return msg


def _wire_form(arr: np.ndarray) -> tuple[np.ndarray, int]:
    """``arr`` contiguous and little-endian, and its DType enum value."""
    a = np.ascontiguousarray(arr)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    enum = _ENUM_OF.get(a.dtype.str.lstrip("<|="))
    if enum is None:
        raise InvalidArgument("tensor.dtype", f"dtype {a.dtype} has no wire form")
    return a, enum


def tensor_parts(arr: np.ndarray) -> tuple[bytes, np.ndarray]:
    """A Tensor of ``arr`` in two parts: its serialized fields but ``data``, and the array
    (contiguous, little-endian) whose bytes are ``data``. For answers built in their wire form
    (``wire.py``)."""
    a, enum = _wire_form(arr)
    return common_pb2.Tensor(dtype=enum, shape=a.shape).SerializeToString(), a


def array_to_tensor(arr: np.ndarray) -> common_pb2.Tensor:
    """A Tensor message of a numpy array (little-endian, row-major). To put it into another
    message use ``CopyFrom`` or :func:`fill_tensor` on the field, not a constructor."""
    return fill_tensor(common_pb2.Tensor(), arr)


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
    under upb, unlike a constructor argument or ``extend``; see the note above
    :func:`fill_tensor`)."""
    for m in messages:
        field.add().CopyFrom(m)


def add_images(field: Any, images: Iterable[tuple[str, np.ndarray]], *,
               raw: bool = True) -> None:
    """Append ``(image_id, array)`` pairs to the repeated Image ``field`` of a message being
    built, each filled in place (see the note above :func:`fill_tensor`)."""
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
    order = np.argsort(-proba, kind="stable")
    if output == "full_scores":
        keep = order
    elif output == "top_k":
        keep = order[:top_k]
    else:
        top = int(order[0])
        return common_pb2.Classification(classes=[common_pb2.ClassScore(label=top, name=names[top])])
    return common_pb2.Classification(classes=[
        common_pb2.ClassScore(label=int(c), name=names[int(c)], score=float(proba[c])) for c in keep])


def ranked_labels_scores(pred: common_pb2.Prediction) -> tuple[tuple[int, ...], tuple[float, ...] | None]:
    """Labels best first and their scores (None when the target gave no scores)."""
    classes = pred.classification.classes
    labels = tuple(int(c.label) for c in classes)
    if classes and all(c.HasField("score") for c in classes):
        return labels, tuple(float(c.score) for c in classes)
    return labels, None


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
