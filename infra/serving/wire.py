"""Answers that carry images, built directly in their wire form.

A large answer made the usual way -- fill a message with the images, then let the transport
serialize it -- holds the interpreter lock for every byte it copies: measured here, a 64 MiB
``ApplyPerturbation`` answer held it ~45 ms while being filled and ~120 ms while being
serialized, and every other call of the server (every tenant's) waited that long. So an answer
with images is built as bytes: the small parts (ids, shapes, tags) by protobuf itself, the
pixels copied in with the lock released (``ctypes.memmove`` is a foreign call, which releases
it). The servicer returns a :class:`Wire`; the transport (``server.py``) sends its bytes as they
are. What a client receives is the same message, byte for byte parseable by any protobuf
runtime; ``tests/unit/test_wire.py`` checks that against protobuf's own encoding.

Conversion only: no gRPC here.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from fortis.common.v1 import common_pb2
from fortis.core.tensors import tensor_parts
from fortis.services.common.codec import png_array

__all__ = ["Piece", "Wire", "image_field", "image_list", "message", "tensor_field"]

#: Below this many bytes an answer is joined the ordinary way (copying it takes microseconds,
#: and a tiny ``bytes(n)`` may be an interpreter-wide shared object that must never be written).
_DIRECT_MIN = 1 << 16

#: ``PyBytes_FromStringAndSize(NULL, n)``: a bytes object of ``n`` bytes, not filled in.
_uninitialized_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_uninitialized_bytes.restype = ctypes.py_object
_uninitialized_bytes.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)

_LEN = 2        # wire type of a length-delimited field


@dataclass(frozen=True)
class Wire:
    """A message already serialized: the transport sends ``data`` unchanged."""

    data: bytes

    def __len__(self) -> int:
        return len(self.data)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field: int) -> bytes:
    return _varint(field << 3 | _LEN)


#: A piece of an answer: small bytes, or a contiguous uint8 array copied without the lock.
Piece = bytes | np.ndarray


def _size(pieces: list[Piece]) -> int:
    return sum(p.nbytes if isinstance(p, np.ndarray) else len(p) for p in pieces)


def _field(field: int, body: list[Piece]) -> list[Piece]:
    """``body`` (a message's pieces) as the length-delimited field number ``field``."""
    return [_key(field) + _varint(_size(body)), *body]


def tensor_field(field: int, array: np.ndarray) -> list[Piece]:
    """A ``Tensor`` of ``array`` as the field number ``field``: its dtype and shape serialized
    by protobuf, then ``data`` (the last field, so only its prefix depends on the pixels)."""
    fields, arr = tensor_parts(array)
    payload = arr.reshape(-1).view(np.uint8)
    return _field(field, [fields + b"\x1a" + _varint(payload.size), payload])  # Tensor.data = 3


def image_field(field: int, image_id: str, image: np.ndarray, *, raw: bool) -> list[Piece]:
    """An ``Image`` as the field number ``field``: a raw tensor (``raw``) or PNG bytes."""
    head = common_pb2.Image(image_id=image_id).SerializeToString() if image_id else b""
    if raw:
        return _field(field, [head, *tensor_field(3, image)])                 # Image.tensor = 3
    png = png_array(image).reshape(-1)
    return _field(field, [head + b"\x12" + _varint(png.size), png])           # Image.encoded = 2


def message(*parts: bytes | list[Piece]) -> Wire:
    """A message in its wire form from its parts in order: bytes (fields serialized by
    protobuf) and the pieces of :func:`tensor_field` / :func:`image_field`."""
    pieces: list[Piece] = []
    for part in parts:
        if isinstance(part, bytes):
            pieces.append(part)
        else:
            pieces.extend(part)
    total = _size(pieces)
    if total < _DIRECT_MIN:
        return Wire(b"".join(p.tobytes() if isinstance(p, np.ndarray) else p for p in pieces))
    # A new object of its own (see _DIRECT_MIN), no one else sees it yet; left unfilled
    # (``bytes(total)`` would zero it while holding the lock), every byte is written below.
    out = _uninitialized_bytes(None, total)
    at = np.frombuffer(out, dtype=np.uint8).ctypes.data
    for p in pieces:
        if isinstance(p, np.ndarray):
            ctypes.memmove(at, p.ctypes.data, p.nbytes)
            at += p.nbytes
        else:
            ctypes.memmove(at, p, len(p))
            at += len(p)
    return Wire(out)


def image_list(field: int, images: Iterable[tuple[str, np.ndarray]], *, raw: bool = True,
               prefix: bytes = b"") -> Wire:
    """The wire form of a message whose ``prefix`` (its other fields, serialized) is followed
    by the repeated ``Image`` field number ``field`` holding ``images`` (``(image_id, uint8
    array)`` pairs, in order): raw tensors, or PNG when not ``raw``."""
    return message(prefix, *(image_field(field, i, a, raw=raw) for i, a in images))
