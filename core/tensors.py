"""Tensors between numpy and the ``fortis.common.v1.Tensor`` message: the wire form of every
array the contracts carry (answers' class maps, images as raw tensors, scoring arrays).

In the domain kernel because the answer types convert themselves to and from their messages
(:mod:`fortis.core.answers`); ``services/common/codec.py`` names these for the services and
adapters, beside the image conversion. Protobuf messages only, no gRPC. Decoding failures are
:class:`~fortis.client.errors.InvalidArgument` naming the field, e.g. ``images[3].tensor.data``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from fortis.client.errors import InvalidArgument
from fortis.common.v1 import common_pb2

__all__ = ["MAX_ELEMENTS", "array_to_tensor", "fill_tensor", "tensor_parts", "tensor_to_array"]

#: DType enum value <-> numpy dtype (little-endian on the wire).
_DTYPES: dict[int, Any] = {
    common_pb2.D_TYPE_UINT8: np.uint8, common_pb2.D_TYPE_INT32: np.int32,
    common_pb2.D_TYPE_INT64: np.int64, common_pb2.D_TYPE_FLOAT16: np.float16,
    common_pb2.D_TYPE_FLOAT32: np.float32, common_pb2.D_TYPE_FLOAT64: np.float64,
    common_pb2.D_TYPE_BOOL: np.bool_}
_ENUM_OF = {np.dtype(v).str.lstrip("<|="): k for k, v in _DTYPES.items()}
#: Most elements a tensor may declare (a shape whose product overflows is refused first).
MAX_ELEMENTS = 1 << 31


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
# filled in place (``fill_tensor`` here, codec's ``fill_image`` and ``add_images``:
# ``repeated.add()`` then setting fields) or copied with ``CopyFrom`` (fast), never passed to a constructor.


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
