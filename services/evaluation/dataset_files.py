"""Reading the files a plan's dataset names under the data root: the confinement rule, bounded
reads, and image decoding with the header checked first. Shared by the manifest reader
(``datasets.py``) and the annotated formats (``dataset_formats.py``). Domain code.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any

import cv2
import numpy as np
from fortis.services.common.codec import check_image_header
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.paths import confined_file as _confined

__all__ = ["MAX_ANNOTATION_BYTES", "MAX_ID_CHARS", "MAX_IMAGE_BYTES", "NOT_FOUND", "confined_file",
           "decode", "read_bounded", "read_image", "short", "utf8"]

#: Largest annotations file (COCO JSON, a VOC image list) read, bytes: a manifest's limit.
MAX_ANNOTATION_BYTES = 50 * 1024 * 1024
#: Largest image or mask file read, bytes (its pixel count is bounded by the header check).
MAX_IMAGE_BYTES = 64 * 1024 * 1024
#: Longest image id, characters.
MAX_ID_CHARS = 256

NOT_FOUND = "not found under the data root"


def short(v: Any, limit: int = 60) -> str:
    """A bounded excerpt of a value for a message (never the whole of a line)."""
    r = repr(v)
    return r if len(r) <= limit else r[:limit] + "..."


def utf8(text: str) -> bool:
    """Whether ``text`` can be sent as UTF-8: a name read from bytes (a file name, a tar
    member, a JSON ``\\udcff`` escape) may hold lone surrogates, which no message, report or
    gRPC string can carry."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def confined_file(root: Path, base: PurePosixPath, raw: object, field: str) -> Path:
    """The regular file ``raw`` names, relative to ``base`` under the data root (the shared
    rule of services/common/paths.py)."""
    return _confined(root, raw, field, base=base, root_name="data root")


def read_bounded(path: Path, limit: int, field: str, what: str) -> bytes:
    try:
        with path.open("rb") as f:
            if os.fstat(f.fileno()).st_size > limit:
                raise InvalidArgument(field, f"the {what} is larger than {limit} bytes")
            data = f.read(limit + 1)
    except OSError:
        raise InvalidArgument(field, NOT_FOUND) from None
    if len(data) > limit:
        raise InvalidArgument(field, f"the {what} is larger than {limit} bytes")
    return data


def read_image(path: Path, field: str, flags: int = cv2.IMREAD_COLOR) -> np.ndarray:
    """Decode one confined image file: its size bounded, its header's pixel count checked
    before decoding (a small file must not decode to a huge image)."""
    return decode(read_bounded(path, MAX_IMAGE_BYTES, field, "image file"), field, flags)


def decode(data: bytes, field: str, flags: int = cv2.IMREAD_COLOR) -> np.ndarray:
    """Decode PNG/JPEG bytes after checking the header's pixel count."""
    check_image_header(data, field)
    img = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), flags)
    if img is None:
        raise InvalidArgument(field, f"not a readable PNG/JPEG image ({len(data)} bytes)")
    if flags == cv2.IMREAD_COLOR:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    return np.ascontiguousarray(img)
