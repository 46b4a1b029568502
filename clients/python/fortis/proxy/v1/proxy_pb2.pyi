import datetime

from fortis.common.v1 import common_pb2 as _common_pb2
from fortis.target.v1 import target_pb2 as _target_pb2
from google.api import field_behavior_pb2 as _field_behavior_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.rpc import code_pb2 as _code_pb2
from google.rpc import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetTenantUsageRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetTenantUsageResponse(_message.Message):
    __slots__ = ("queries_today", "queries_per_day", "images_per_second")
    QUERIES_TODAY_FIELD_NUMBER: _ClassVar[int]
    QUERIES_PER_DAY_FIELD_NUMBER: _ClassVar[int]
    IMAGES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    queries_today: int
    queries_per_day: int
    images_per_second: float
    def __init__(self, queries_today: _Optional[int] = ..., queries_per_day: _Optional[int] = ..., images_per_second: _Optional[float] = ...) -> None: ...

class GetBuiltinTargetsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetBuiltinTargetsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[BuiltinModelTargets]
    def __init__(self, models: _Optional[_Iterable[_Union[BuiltinModelTargets, _Mapping]]] = ...) -> None: ...

class BuiltinModelTargets(_message.Message):
    __slots__ = ("model", "targets")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    model: str
    targets: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., targets: _Optional[_Iterable[str]] = ...) -> None: ...

class TargetSummary(_message.Message):
    __slots__ = ("name", "images_per_second", "price_per_1000")
    NAME_FIELD_NUMBER: _ClassVar[int]
    IMAGES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    PRICE_PER_1000_FIELD_NUMBER: _ClassVar[int]
    name: str
    images_per_second: float
    price_per_1000: float
    def __init__(self, name: _Optional[str] = ..., images_per_second: _Optional[float] = ..., price_per_1000: _Optional[float] = ...) -> None: ...

class ListTargetsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTargetsResponse(_message.Message):
    __slots__ = ("targets", "next_page_token")
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    targets: _containers.RepeatedCompositeFieldContainer[TargetSummary]
    next_page_token: str
    def __init__(self, targets: _Optional[_Iterable[_Union[TargetSummary, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetTargetInfoRequest(_message.Message):
    __slots__ = ("target",)
    TARGET_FIELD_NUMBER: _ClassVar[int]
    target: str
    def __init__(self, target: _Optional[str] = ...) -> None: ...

class GetTargetInfoResponse(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: _target_pb2.TargetInfo
    def __init__(self, info: _Optional[_Union[_target_pb2.TargetInfo, _Mapping]] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("session_id", "tenant", "target", "query_budget", "per_image_budget", "queries_used", "description", "create_time")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    QUERY_BUDGET_FIELD_NUMBER: _ClassVar[int]
    PER_IMAGE_BUDGET_FIELD_NUMBER: _ClassVar[int]
    QUERIES_USED_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tenant: str
    target: str
    query_budget: int
    per_image_budget: int
    queries_used: int
    description: str
    create_time: _timestamp_pb2.Timestamp
    def __init__(self, session_id: _Optional[str] = ..., tenant: _Optional[str] = ..., target: _Optional[str] = ..., query_budget: _Optional[int] = ..., per_image_budget: _Optional[int] = ..., queries_used: _Optional[int] = ..., description: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateSessionRequest(_message.Message):
    __slots__ = ("target", "session_id", "query_budget", "per_image_budget", "description")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_BUDGET_FIELD_NUMBER: _ClassVar[int]
    PER_IMAGE_BUDGET_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    target: str
    session_id: str
    query_budget: int
    per_image_budget: int
    description: str
    def __init__(self, target: _Optional[str] = ..., session_id: _Optional[str] = ..., query_budget: _Optional[int] = ..., per_image_budget: _Optional[int] = ..., description: _Optional[str] = ...) -> None: ...

class CreateSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: Session
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: Session
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("session_id", "origin", "images")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    origin: str
    images: _containers.RepeatedCompositeFieldContainer[_common_pb2.Image]
    def __init__(self, session_id: _Optional[str] = ..., origin: _Optional[str] = ..., images: _Optional[_Iterable[_Union[_common_pb2.Image, _Mapping]]] = ...) -> None: ...

class PredictResponse(_message.Message):
    __slots__ = ("predictions", "queries_left")
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    QUERIES_LEFT_FIELD_NUMBER: _ClassVar[int]
    predictions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Prediction]
    queries_left: int
    def __init__(self, predictions: _Optional[_Iterable[_Union[_common_pb2.Prediction, _Mapping]]] = ..., queries_left: _Optional[int] = ...) -> None: ...

class PredictStreamRequest(_message.Message):
    __slots__ = ("request_id", "session_id", "origin", "images")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    session_id: str
    origin: str
    images: _containers.RepeatedCompositeFieldContainer[_common_pb2.Image]
    def __init__(self, request_id: _Optional[str] = ..., session_id: _Optional[str] = ..., origin: _Optional[str] = ..., images: _Optional[_Iterable[_Union[_common_pb2.Image, _Mapping]]] = ...) -> None: ...

class PredictStreamResponse(_message.Message):
    __slots__ = ("request_id", "predictions", "error", "queries_left")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    QUERIES_LEFT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    predictions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Prediction]
    error: _status_pb2.Status
    queries_left: int
    def __init__(self, request_id: _Optional[str] = ..., predictions: _Optional[_Iterable[_Union[_common_pb2.Prediction, _Mapping]]] = ..., error: _Optional[_Union[_status_pb2.Status, _Mapping]] = ..., queries_left: _Optional[int] = ...) -> None: ...

class GetSessionStatsRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ImageQueryCount(_message.Message):
    __slots__ = ("image_id", "queries", "failed", "attempts")
    IMAGE_ID_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    image_id: str
    queries: int
    failed: int
    attempts: int
    def __init__(self, image_id: _Optional[str] = ..., queries: _Optional[int] = ..., failed: _Optional[int] = ..., attempts: _Optional[int] = ...) -> None: ...

class OriginQueryCount(_message.Message):
    __slots__ = ("origin", "queries", "failed")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    origin: str
    queries: int
    failed: int
    def __init__(self, origin: _Optional[str] = ..., queries: _Optional[int] = ..., failed: _Optional[int] = ...) -> None: ...

class GetSessionStatsResponse(_message.Message):
    __slots__ = ("session", "queries_ok", "queries_failed", "calls_refused", "images", "origins", "latency_p50_ms", "queries_attempted", "queries_in_flight", "tenant_queries_today", "tenant_queries_per_day")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    QUERIES_OK_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FAILED_FIELD_NUMBER: _ClassVar[int]
    CALLS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    ORIGINS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_P50_MS_FIELD_NUMBER: _ClassVar[int]
    QUERIES_ATTEMPTED_FIELD_NUMBER: _ClassVar[int]
    QUERIES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    TENANT_QUERIES_TODAY_FIELD_NUMBER: _ClassVar[int]
    TENANT_QUERIES_PER_DAY_FIELD_NUMBER: _ClassVar[int]
    session: Session
    queries_ok: int
    queries_failed: int
    calls_refused: int
    images: _containers.RepeatedCompositeFieldContainer[ImageQueryCount]
    origins: _containers.RepeatedCompositeFieldContainer[OriginQueryCount]
    latency_p50_ms: float
    queries_attempted: int
    queries_in_flight: int
    tenant_queries_today: int
    tenant_queries_per_day: int
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., queries_ok: _Optional[int] = ..., queries_failed: _Optional[int] = ..., calls_refused: _Optional[int] = ..., images: _Optional[_Iterable[_Union[ImageQueryCount, _Mapping]]] = ..., origins: _Optional[_Iterable[_Union[OriginQueryCount, _Mapping]]] = ..., latency_p50_ms: _Optional[float] = ..., queries_attempted: _Optional[int] = ..., queries_in_flight: _Optional[int] = ..., tenant_queries_today: _Optional[int] = ..., tenant_queries_per_day: _Optional[int] = ...) -> None: ...

class ListLedgerEntriesRequest(_message.Message):
    __slots__ = ("session_id", "page_size", "page_token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    page_size: int
    page_token: str
    def __init__(self, session_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class LedgerEntry(_message.Message):
    __slots__ = ("entry_id", "tenant", "session_id", "target", "origin", "image_id", "input_sha256", "output_summary", "latency_ms", "status", "error", "send_time", "call_id", "attempts")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    IMAGE_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_SHA256_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SEND_TIME_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    entry_id: int
    tenant: str
    session_id: str
    target: str
    origin: str
    image_id: str
    input_sha256: str
    output_summary: str
    latency_ms: float
    status: _code_pb2.Code
    error: str
    send_time: _timestamp_pb2.Timestamp
    call_id: str
    attempts: int
    def __init__(self, entry_id: _Optional[int] = ..., tenant: _Optional[str] = ..., session_id: _Optional[str] = ..., target: _Optional[str] = ..., origin: _Optional[str] = ..., image_id: _Optional[str] = ..., input_sha256: _Optional[str] = ..., output_summary: _Optional[str] = ..., latency_ms: _Optional[float] = ..., status: _Optional[_Union[_code_pb2.Code, str]] = ..., error: _Optional[str] = ..., send_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., call_id: _Optional[str] = ..., attempts: _Optional[int] = ...) -> None: ...

class ListLedgerEntriesResponse(_message.Message):
    __slots__ = ("entries", "next_page_token")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[LedgerEntry]
    next_page_token: str
    def __init__(self, entries: _Optional[_Iterable[_Union[LedgerEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
