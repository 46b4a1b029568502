"""The rules every blob store applies once, whichever holds the bytes (files + SQLite in
``blobs.py``, PostgreSQL in ``blobs_pg.py``): the kinds and their maximum sizes, blob ids,
the answers for unknown or foreign ids, the header of an upload (:func:`check_header`),
the tenant's room (:func:`check_room`), each chunk as it arrives and the whole at the end
(:class:`UploadChecks`), and the :class:`BlobStorage` protocol the callers use.

Pure code (no gRPC).
"""

from __future__ import annotations

import builtins
import hashlib
import re
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from fortis.services.common.codec import check_image_header, image_header_size
from fortis.services.common.errors import (
    InvalidArgument,
    NotFound,
    QuotaExceeded,
    QuotaViolation,
)
from fortis.services.common.limits import (
    MAX_ARCHIVE_BYTES,
    MAX_MEDIA_TYPE_CHARS,
    MAX_MODEL_BYTES,
    MAX_UPLOAD_CHUNK_BYTES,
)

#: The kinds of blob and the largest of each, bytes.
MAX_BLOB_BYTES: Final = {"image": 32 * 1024 * 1024, "manifest": 16 * 1024 * 1024,
                         "model": MAX_MODEL_BYTES, "archive": MAX_ARCHIVE_BYTES}
KINDS: Final = tuple(MAX_BLOB_BYTES)
#: Largest data chunk of one UploadBlob message, bytes.
MAX_CHUNK_BYTES: Final = MAX_UPLOAD_CHUNK_BYTES
#: Default storage quota of one tenant, bytes (``fortis serve --upload-quota-bytes``).
DEFAULT_QUOTA_BYTES: Final = 2 * 1024 ** 3
#: Most blobs one tenant may keep (bounds listing and the index).
MAX_BLOBS_PER_TENANT: Final = 100_000
#: An image's header must have arrived within this many bytes (a JPEG's APPn segments first).
MAX_IMAGE_HEADER_BYTES: Final = 1024 * 1024
BLOB_ID_PREFIX: Final = "sha256:"
_BLOB_ID = re.compile(r"sha256:[0-9a-f]{64}")
_MEDIA_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+\-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+\-]*")
_PNG = b"\x89PNG\r\n\x1a\n"
_ZIP = b"PK\x03\x04"
_GZIP = b"\x1f\x8b\x08"
#: A tar header block, bytes.
TAR_BLOCK: Final = 512
#: Compressed bytes of a gzip archive within which its first tar header must have inflated.
MAX_ARCHIVE_HEAD_BYTES: Final = 64 * 1024
#: Tags that may follow an ONNX ModelProto's ir_version: producer_name (2), producer_version
#: (3), domain (4), model_version (5), doc_string (6), graph (7), opset_import (8),
#: metadata_props (14), and the first byte of training_info (20) / functions (25).
_ONNX_SECOND_TAGS = frozenset({0x12, 0x1A, 0x22, 0x28, 0x32, 0x3A, 0x42, 0x72, 0xA2, 0xCA})


def is_blob_id(raw: object) -> bool:
    """True when ``raw`` is written as a blob id (``sha256:`` and 64 lowercase hex digits)."""
    return isinstance(raw, str) and _BLOB_ID.fullmatch(raw) is not None


def check_blob_id(raw: object, field: str) -> str:
    """The hex digest of blob id ``raw``; InvalidArgument on ``field`` (never echoing it)."""
    if not is_blob_id(raw):
        n = len(raw) if isinstance(raw, str) else 0
        raise InvalidArgument(field, f"a blob id is 'sha256:' and 64 lowercase hex digits "
                                     f"(got {n} characters)")
    assert isinstance(raw, str)
    return raw[len(BLOB_ID_PREFIX):]


def is_tar_header(block: bytes) -> bool:
    """Whether ``block`` (512 bytes) is a POSIX (ustar, pax) or GNU tar header: its magic
    and its checksum (the sum of its bytes with the checksum field read as spaces), so a
    random file is not taken for an archive."""
    if len(block) < TAR_BLOCK or block[257:262] != b"ustar":
        return False
    field = block[148:156].split(b"\x00", 1)[0].strip()
    if not field or not re.fullmatch(rb"[0-7]{1,8}", field):
        return False
    return int(field, 8) == sum(block[:148]) + 8 * 32 + sum(block[156:TAR_BLOCK])


@dataclass(frozen=True, kw_only=True)
class BlobInfo:
    """A stored blob's metadata (never its content)."""

    blob_id: str
    kind: str
    size: int
    created: float
    media_type: str = ""
    width: int = 0
    height: int = 0


def _not_found(blob_id: str) -> NotFound:
    # One message for unknown and foreign ids alike (another tenant's id behaves
    # exactly as an unknown one).
    return NotFound("blob", blob_id)


def not_found(blob_id: str) -> NotFound:
    """NotFound for ``blob_id``: the same answer for an unknown id and another tenant's."""
    return _not_found(blob_id)


def no_such_upload(field: str) -> InvalidArgument:
    """The answer to a plan or request field naming an unknown or foreign blob (one message
    for both)."""
    return InvalidArgument(field, "no such upload of this tenant (upload it first: "
                                  "fortis upload)")


def quota_violation(tenant: str, description: str) -> QuotaExceeded:
    """RESOURCE_EXHAUSTED with a QuotaFailure on ``tenant:<name>``."""
    return QuotaExceeded([QuotaViolation(f"tenant:{tenant[:64]}", description)])


def check_header(*, kind: str, size: int, media_type: str = "",
                 expected_sha256: str = "") -> str:
    """Check an upload's header (fields named ``header.<field>``): the kind, the declared size
    against the kind's maximum, the media type and the expected digest; the expected hex
    digest ("" when none was given)."""
    if kind not in MAX_BLOB_BYTES:
        raise InvalidArgument("header.kind", f"one of {', '.join(k.upper() for k in KINDS)}"
                                             " is needed")
    limit = MAX_BLOB_BYTES[kind]
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= limit:
        raise InvalidArgument("header.size", f"the declared size must be in 1..{limit:,} "
                                             f"bytes for a {kind}")
    if media_type and (len(media_type) > MAX_MEDIA_TYPE_CHARS
                       or not _MEDIA_TYPE.fullmatch(media_type)):
        raise InvalidArgument("header.media_type", "a media type such as image/png is needed")
    return check_blob_id(expected_sha256, "header.expected_sha256") if expected_sha256 else ""


def check_room(tenant: str, *, used: int, count: int, held: int, size: int, quota: int,
               max_blobs: int) -> None:
    """Refuse (QuotaExceeded) an upload of ``size`` bytes when the tenant's ``used`` bytes,
    ``held`` bytes of uploads in progress and it pass ``quota``, or it holds ``max_blobs``."""
    if used + held + size > quota:
        raise quota_violation(tenant, f"upload storage: {used:,} bytes stored and {held:,} "
                                      f"being uploaded; {size:,} more would pass the quota of "
                                      f"{quota:,} bytes (delete blobs with DeleteBlob)")
    if count >= max_blobs:
        raise quota_violation(tenant, f"upload storage: at most {max_blobs:,} blobs per tenant "
                                      "(delete blobs with DeleteBlob)")


class Reservations:
    """Bytes of the uploads in progress in this process, per tenant (counted against the
    quota until each upload ends)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._held: dict[str, int] = {}

    def held(self, tenant: str) -> int:
        return self._held.get(tenant, 0)

    def add(self, tenant: str, size: int) -> None:
        """Reserve ``size`` bytes (call with :attr:`lock` held, after checking the room)."""
        self._held[tenant] = self._held.get(tenant, 0) + size

    def release(self, tenant: str, size: int) -> None:
        with self.lock:
            left = self._held.get(tenant, 0) - size
            if left > 0:
                self._held[tenant] = left
            else:
                self._held.pop(tenant, None)


class BlobUpload(Protocol):
    """One upload in progress (either store): chunks in order, then ``finish``; ``abort``
    (or any refusal) keeps nothing."""

    def write(self, chunk: bytes) -> None: ...
    def finish(self) -> tuple[BlobInfo, bool]: ...
    def abort(self) -> None: ...


class BlobReader(Protocol):
    """Random access to one stored blob (a dataset archive read member by member, never the
    whole blob in memory): ``read_at`` returns up to ``n`` bytes from ``offset`` (fewer only
    at the end). The blob's tenancy and kind were checked when it was opened."""

    size: int

    def read_at(self, offset: int, n: int) -> bytes: ...
    def close(self) -> None: ...


class BlobStorage(Protocol):
    """What the callers need of the uploaded blobs, wherever they are
    stored: the file store (:class:`BlobStore`) or PostgreSQL (``blobs_pg.PgBlobStore``),
    the same limits, messages and tenancy."""

    quota_bytes: int

    def close(self) -> None: ...
    def get(self, tenant: str, blob_id: str, field: str = "blob_id") -> BlobInfo: ...
    def path_of(self, tenant: str, blob_id: str, field: str, *, kind: str = "") -> Path: ...
    def read(self, tenant: str, blob_id: str, field: str, *, kind: str) -> bytes: ...
    def open_reader(self, tenant: str, blob_id: str, field: str, *,
                    kind: str) -> BlobReader: ...
    def usage(self, tenant: str) -> tuple[int, int]: ...
    def list(self, tenant: str, *, kind: str = "", limit: int = 100,
             after: tuple[float, str] | None = None) -> builtins.list[BlobInfo]: ...
    def delete(self, tenant: str, blob_id: str, field: str = "blob_id") -> BlobInfo: ...
    def begin(self, tenant: str, *, kind: str, size: int, media_type: str = "",
              expected_sha256: str = "") -> BlobUpload: ...


class UploadChecks:
    """The checks of one upload as its bytes arrive, shared by both stores: chunk size,
    content past the declared size, a model's zip signature, an image's PNG/JPEG header and
    pixel count (as soon as it has arrived, never decoding), and at the end the size, the
    header and the digest. Keeps the running SHA-256 and the image's size and media type."""

    def __init__(self, *, kind: str, size: int, media_type: str, expected_hex: str) -> None:
        self.kind, self.size, self.expected_hex = kind, size, expected_hex
        self.media_type = media_type
        self.received = 0
        self.width = self.height = 0
        self._hash = hashlib.sha256()
        self._head = b""
        self._model_head = b""
        self._header_done = kind not in ("image", "archive")
        self._archive_head = b""
        self._inflate: Any = None
        self._inflated_from = 0

    def accept(self, chunk: bytes) -> None:
        """Check one chunk and count it (the caller stores it next)."""
        if len(chunk) > MAX_CHUNK_BYTES:
            raise InvalidArgument("chunk", f"{len(chunk):,} bytes; at most "
                                           f"{MAX_CHUNK_BYTES:,} per message")
        if self.received + len(chunk) > self.size:
            raise InvalidArgument("chunk", f"more bytes than the declared header.size "
                                           f"({self.size:,})")
        if self.kind == "model" and self.received < 3 and chunk:
            self._model_head = (self._model_head + chunk)[:3]
            self._check_model_head(self._model_head)
        self.received += len(chunk)
        self._hash.update(chunk)
        if not self._header_done:
            if self.kind == "archive":
                self._sniff_archive(chunk)
            else:
                self._sniff(chunk)

    def _sniff_archive(self, chunk: bytes) -> None:
        """Check an archive's first tar header as soon as it has arrived: a tar starts with
        one; a gzip file is inflated (at most one header's worth, from at most
        :data:`MAX_ARCHIVE_HEAD_BYTES` compressed bytes) until its tar header is seen."""
        if self._inflate is None and not self._archive_head and chunk[:1] == _GZIP[:1]:
            self._inflate = zlib.decompressobj(wbits=31)
        if self._inflate is None:
            self._archive_head += chunk[:TAR_BLOCK - len(self._archive_head)]
        else:
            self._inflated_from += len(chunk)
            head = self._archive_head
            try:
                head += self._inflate.decompress(chunk[:MAX_ARCHIVE_HEAD_BYTES],
                                                 TAR_BLOCK - len(head))
            except zlib.error:
                raise InvalidArgument("chunk", "an archive's gzip stream is not readable"
                                      ) from None
            self._archive_head = head
            if len(head) < TAR_BLOCK and self._inflated_from > MAX_ARCHIVE_HEAD_BYTES:
                raise InvalidArgument("chunk", f"no tar header within the first "
                                               f"{MAX_ARCHIVE_HEAD_BYTES:,} bytes of the gzip "
                                               "stream")
        if len(self._archive_head) >= TAR_BLOCK:
            if not is_tar_header(self._archive_head[:TAR_BLOCK]):
                raise InvalidArgument("chunk", "an archive is a POSIX (ustar/pax) or GNU tar "
                                               "file, optionally gzip-compressed")
            self.media_type = "application/gzip" if self._inflate is not None \
                else "application/x-tar"
            self._header_done = True
            self._archive_head, self._inflate = b"", None

    def _check_model_head(self, head: bytes) -> None:
        """A model is TorchScript (torch.jit.save writes a zip archive) or ONNX (a ModelProto:
        its first field is ir_version, tag 0x08 and a small varint, then another field of
        ModelProto), told from its first bytes as they arrive."""
        if head.startswith(_ZIP[:len(head)]):
            return
        onnx = head[:1] == b"\x08" and (len(head) < 2 or 1 <= head[1] <= 0x7F) and (
            len(head) < 3 or head[2] in _ONNX_SECOND_TAGS)
        if not onnx:
            raise InvalidArgument("chunk", "a model is a TorchScript file (torch.jit.save "
                                           "writes a zip archive) or an ONNX model "
                                           "(a ModelProto starting with its ir_version)")

    def _sniff(self, chunk: bytes) -> None:
        """Check an image's format and pixel count as soon as its header has arrived (never
        decoding: a small file may declare a huge image)."""
        self._head += chunk[:MAX_IMAGE_HEADER_BYTES + 1 - len(self._head)]
        head = self._head
        if len(head) >= 2 and not (head.startswith(_PNG[:len(head)])
                                   or head.startswith(b"\xff\xd8")):
            raise InvalidArgument("chunk", "an image must be a PNG or JPEG file")
        size = image_header_size(head)
        if size is None:
            if len(head) > MAX_IMAGE_HEADER_BYTES:
                raise InvalidArgument("chunk", f"no PNG IHDR or JPEG frame header within the "
                                               f"first {MAX_IMAGE_HEADER_BYTES:,} bytes")
            return
        self.width, self.height = check_image_header(head, "chunk")
        self.media_type = "image/png" if head.startswith(_PNG) else "image/jpeg"
        self._header_done = True
        self._head = b""

    def digest(self) -> str:
        """The whole upload checked (size, header, expected digest): its hex SHA-256."""
        if self.received != self.size:
            raise InvalidArgument("header.size", f"declared {self.size:,} bytes, received "
                                                 f"{self.received:,}")
        if not self._header_done:
            if self.kind == "archive":
                raise InvalidArgument("chunk", "not a tar archive (no complete tar header)")
            raise InvalidArgument("chunk", "not a PNG/JPEG image (no readable PNG IHDR or "
                                           "JPEG frame header)")
        hexd = self._hash.hexdigest()
        if self.expected_hex and hexd != self.expected_hex:
            raise InvalidArgument("header.expected_sha256", "the content hashes to "
                                                            f"sha256:{hexd}")
        return hexd

    def info(self, hexd: str, created: float) -> BlobInfo:
        """The new blob's metadata."""
        return BlobInfo(blob_id=BLOB_ID_PREFIX + hexd, kind=self.kind, size=self.received,
                        created=created, media_type=self.media_type, width=self.width,
                        height=self.height)


def same_kind(existing: BlobInfo, kind: str) -> BlobInfo:
    """An idempotent re-upload: the existing blob, unless these bytes are stored as another
    kind (InvalidArgument on ``header.kind``)."""
    if existing.kind != kind:
        raise InvalidArgument("header.kind", f"these bytes are already uploaded as a "
                                             f"{existing.kind}")
    return existing

