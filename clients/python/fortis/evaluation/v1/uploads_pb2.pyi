import datetime

from google.api import field_behavior_pb2 as _field_behavior_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BlobKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BLOB_KIND_UNSPECIFIED: _ClassVar[BlobKind]
    BLOB_KIND_IMAGE: _ClassVar[BlobKind]
    BLOB_KIND_MANIFEST: _ClassVar[BlobKind]
    BLOB_KIND_MODEL: _ClassVar[BlobKind]
    BLOB_KIND_ARCHIVE: _ClassVar[BlobKind]
BLOB_KIND_UNSPECIFIED: BlobKind
BLOB_KIND_IMAGE: BlobKind
BLOB_KIND_MANIFEST: BlobKind
BLOB_KIND_MODEL: BlobKind
BLOB_KIND_ARCHIVE: BlobKind

class UploadHeader(_message.Message):
    __slots__ = ("kind", "size", "media_type", "expected_sha256")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SHA256_FIELD_NUMBER: _ClassVar[int]
    kind: BlobKind
    size: int
    media_type: str
    expected_sha256: str
    def __init__(self, kind: _Optional[_Union[BlobKind, str]] = ..., size: _Optional[int] = ..., media_type: _Optional[str] = ..., expected_sha256: _Optional[str] = ...) -> None: ...

class UploadBlobRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: UploadHeader
    chunk: bytes
    def __init__(self, header: _Optional[_Union[UploadHeader, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class Blob(_message.Message):
    __slots__ = ("blob_id", "kind", "size", "create_time", "media_type", "width", "height")
    BLOB_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    blob_id: str
    kind: BlobKind
    size: int
    create_time: _timestamp_pb2.Timestamp
    media_type: str
    width: int
    height: int
    def __init__(self, blob_id: _Optional[str] = ..., kind: _Optional[_Union[BlobKind, str]] = ..., size: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., media_type: _Optional[str] = ..., width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class UploadBlobResponse(_message.Message):
    __slots__ = ("blob", "already_existed")
    BLOB_FIELD_NUMBER: _ClassVar[int]
    ALREADY_EXISTED_FIELD_NUMBER: _ClassVar[int]
    blob: Blob
    already_existed: bool
    def __init__(self, blob: _Optional[_Union[Blob, _Mapping]] = ..., already_existed: _Optional[bool] = ...) -> None: ...

class GetBlobRequest(_message.Message):
    __slots__ = ("blob_id",)
    BLOB_ID_FIELD_NUMBER: _ClassVar[int]
    blob_id: str
    def __init__(self, blob_id: _Optional[str] = ...) -> None: ...

class GetBlobResponse(_message.Message):
    __slots__ = ("blob",)
    BLOB_FIELD_NUMBER: _ClassVar[int]
    blob: Blob
    def __init__(self, blob: _Optional[_Union[Blob, _Mapping]] = ...) -> None: ...

class ListBlobsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "kind")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    kind: BlobKind
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., kind: _Optional[_Union[BlobKind, str]] = ...) -> None: ...

class ListBlobsResponse(_message.Message):
    __slots__ = ("blobs", "next_page_token", "used_bytes", "quota_bytes")
    BLOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUOTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    blobs: _containers.RepeatedCompositeFieldContainer[Blob]
    next_page_token: str
    used_bytes: int
    quota_bytes: int
    def __init__(self, blobs: _Optional[_Iterable[_Union[Blob, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., used_bytes: _Optional[int] = ..., quota_bytes: _Optional[int] = ...) -> None: ...

class DeleteBlobRequest(_message.Message):
    __slots__ = ("blob_id",)
    BLOB_ID_FIELD_NUMBER: _ClassVar[int]
    blob_id: str
    def __init__(self, blob_id: _Optional[str] = ...) -> None: ...

class DeleteBlobResponse(_message.Message):
    __slots__ = ("blob",)
    BLOB_FIELD_NUMBER: _ClassVar[int]
    blob: Blob
    def __init__(self, blob: _Optional[_Union[Blob, _Mapping]] = ...) -> None: ...
