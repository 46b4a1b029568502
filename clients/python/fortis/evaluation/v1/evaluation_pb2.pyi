import datetime

from google.api import field_behavior_pb2 as _field_behavior_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.rpc import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EvaluationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVALUATION_STATE_UNSPECIFIED: _ClassVar[EvaluationState]
    EVALUATION_STATE_PENDING: _ClassVar[EvaluationState]
    EVALUATION_STATE_RUNNING: _ClassVar[EvaluationState]
    EVALUATION_STATE_SUCCEEDED: _ClassVar[EvaluationState]
    EVALUATION_STATE_FAILED: _ClassVar[EvaluationState]
    EVALUATION_STATE_CANCELLED: _ClassVar[EvaluationState]

class PlanFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLAN_FORMAT_UNSPECIFIED: _ClassVar[PlanFormat]
    PLAN_FORMAT_YAML: _ClassVar[PlanFormat]
    PLAN_FORMAT_JSON: _ClassVar[PlanFormat]

class Stage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STAGE_UNSPECIFIED: _ClassVar[Stage]
    STAGE_PLAN: _ClassVar[Stage]
    STAGE_CLEAN: _ClassVar[Stage]
    STAGE_CORRUPTIONS: _ClassVar[Stage]
    STAGE_DEGRADATION: _ClassVar[Stage]
    STAGE_TRANSFER_ATTACKS: _ClassVar[Stage]
    STAGE_QUERY_ATTACKS: _ClassVar[Stage]
    STAGE_SCORING: _ClassVar[Stage]
    STAGE_REPORT: _ClassVar[Stage]
    STAGE_DONE: _ClassVar[Stage]

class QueryCountKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUERY_COUNT_KIND_UNSPECIFIED: _ClassVar[QueryCountKind]
    QUERY_COUNT_KIND_FIXED: _ClassVar[QueryCountKind]
    QUERY_COUNT_KIND_UPPER_BOUND: _ClassVar[QueryCountKind]
EVALUATION_STATE_UNSPECIFIED: EvaluationState
EVALUATION_STATE_PENDING: EvaluationState
EVALUATION_STATE_RUNNING: EvaluationState
EVALUATION_STATE_SUCCEEDED: EvaluationState
EVALUATION_STATE_FAILED: EvaluationState
EVALUATION_STATE_CANCELLED: EvaluationState
PLAN_FORMAT_UNSPECIFIED: PlanFormat
PLAN_FORMAT_YAML: PlanFormat
PLAN_FORMAT_JSON: PlanFormat
STAGE_UNSPECIFIED: Stage
STAGE_PLAN: Stage
STAGE_CLEAN: Stage
STAGE_CORRUPTIONS: Stage
STAGE_DEGRADATION: Stage
STAGE_TRANSFER_ATTACKS: Stage
STAGE_QUERY_ATTACKS: Stage
STAGE_SCORING: Stage
STAGE_REPORT: Stage
STAGE_DONE: Stage
QUERY_COUNT_KIND_UNSPECIFIED: QueryCountKind
QUERY_COUNT_KIND_FIXED: QueryCountKind
QUERY_COUNT_KIND_UPPER_BOUND: QueryCountKind

class Progress(_message.Message):
    __slots__ = ("stage", "items_done", "items_total", "queries", "message", "images_done", "images_total")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    ITEMS_DONE_FIELD_NUMBER: _ClassVar[int]
    ITEMS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    IMAGES_DONE_FIELD_NUMBER: _ClassVar[int]
    IMAGES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    stage: Stage
    items_done: int
    items_total: int
    queries: int
    message: str
    images_done: int
    images_total: int
    def __init__(self, stage: _Optional[_Union[Stage, str]] = ..., items_done: _Optional[int] = ..., items_total: _Optional[int] = ..., queries: _Optional[int] = ..., message: _Optional[str] = ..., images_done: _Optional[int] = ..., images_total: _Optional[int] = ...) -> None: ...

class EvaluationSummary(_message.Message):
    __slots__ = ("accuracy", "average_robustness_corr", "average_robustness_adv", "m", "failed_settings")
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    AVERAGE_ROBUSTNESS_CORR_FIELD_NUMBER: _ClassVar[int]
    AVERAGE_ROBUSTNESS_ADV_FIELD_NUMBER: _ClassVar[int]
    M_FIELD_NUMBER: _ClassVar[int]
    FAILED_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    accuracy: float
    average_robustness_corr: float
    average_robustness_adv: float
    m: int
    failed_settings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, accuracy: _Optional[float] = ..., average_robustness_corr: _Optional[float] = ..., average_robustness_adv: _Optional[float] = ..., m: _Optional[int] = ..., failed_settings: _Optional[_Iterable[str]] = ...) -> None: ...

class Evaluation(_message.Message):
    __slots__ = ("evaluation_id", "tenant", "state", "progress", "plan_text", "plan_name", "create_time", "update_time", "error", "resumed_count", "summary")
    EVALUATION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    PLAN_TEXT_FIELD_NUMBER: _ClassVar[int]
    PLAN_NAME_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESUMED_COUNT_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    evaluation_id: str
    tenant: str
    state: EvaluationState
    progress: Progress
    plan_text: str
    plan_name: str
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    error: _status_pb2.Status
    resumed_count: int
    summary: EvaluationSummary
    def __init__(self, evaluation_id: _Optional[str] = ..., tenant: _Optional[str] = ..., state: _Optional[_Union[EvaluationState, str]] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., plan_text: _Optional[str] = ..., plan_name: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error: _Optional[_Union[_status_pb2.Status, _Mapping]] = ..., resumed_count: _Optional[int] = ..., summary: _Optional[_Union[EvaluationSummary, _Mapping]] = ...) -> None: ...

class CreateEvaluationRequest(_message.Message):
    __slots__ = ("plan", "format", "evaluation_id")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    EVALUATION_ID_FIELD_NUMBER: _ClassVar[int]
    plan: str
    format: PlanFormat
    evaluation_id: str
    def __init__(self, plan: _Optional[str] = ..., format: _Optional[_Union[PlanFormat, str]] = ..., evaluation_id: _Optional[str] = ...) -> None: ...

class CreateEvaluationResponse(_message.Message):
    __slots__ = ("evaluation",)
    EVALUATION_FIELD_NUMBER: _ClassVar[int]
    evaluation: Evaluation
    def __init__(self, evaluation: _Optional[_Union[Evaluation, _Mapping]] = ...) -> None: ...

class GetEvaluationRequest(_message.Message):
    __slots__ = ("evaluation_id",)
    EVALUATION_ID_FIELD_NUMBER: _ClassVar[int]
    evaluation_id: str
    def __init__(self, evaluation_id: _Optional[str] = ...) -> None: ...

class GetEvaluationResponse(_message.Message):
    __slots__ = ("evaluation",)
    EVALUATION_FIELD_NUMBER: _ClassVar[int]
    evaluation: Evaluation
    def __init__(self, evaluation: _Optional[_Union[Evaluation, _Mapping]] = ...) -> None: ...

class ListEvaluationsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListEvaluationsResponse(_message.Message):
    __slots__ = ("evaluations", "next_page_token")
    EVALUATIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    evaluations: _containers.RepeatedCompositeFieldContainer[Evaluation]
    next_page_token: str
    def __init__(self, evaluations: _Optional[_Iterable[_Union[Evaluation, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelEvaluationRequest(_message.Message):
    __slots__ = ("evaluation_id",)
    EVALUATION_ID_FIELD_NUMBER: _ClassVar[int]
    evaluation_id: str
    def __init__(self, evaluation_id: _Optional[str] = ...) -> None: ...

class CancelEvaluationResponse(_message.Message):
    __slots__ = ("evaluation",)
    EVALUATION_FIELD_NUMBER: _ClassVar[int]
    evaluation: Evaluation
    def __init__(self, evaluation: _Optional[_Union[Evaluation, _Mapping]] = ...) -> None: ...

class WatchEvaluationRequest(_message.Message):
    __slots__ = ("evaluation_id",)
    EVALUATION_ID_FIELD_NUMBER: _ClassVar[int]
    evaluation_id: str
    def __init__(self, evaluation_id: _Optional[str] = ...) -> None: ...

class WatchEvaluationResponse(_message.Message):
    __slots__ = ("evaluation", "heartbeat")
    EVALUATION_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    evaluation: Evaluation
    heartbeat: bool
    def __init__(self, evaluation: _Optional[_Union[Evaluation, _Mapping]] = ..., heartbeat: _Optional[bool] = ...) -> None: ...

class ValidatePlanRequest(_message.Message):
    __slots__ = ("plan", "format")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    plan: str
    format: PlanFormat
    def __init__(self, plan: _Optional[str] = ..., format: _Optional[_Union[PlanFormat, str]] = ...) -> None: ...

class ValidatePlanResponse(_message.Message):
    __slots__ = ("plan_name", "corruptions", "attacks", "degradation_operators", "estimate")
    PLAN_NAME_FIELD_NUMBER: _ClassVar[int]
    CORRUPTIONS_FIELD_NUMBER: _ClassVar[int]
    ATTACKS_FIELD_NUMBER: _ClassVar[int]
    DEGRADATION_OPERATORS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    plan_name: str
    corruptions: int
    attacks: int
    degradation_operators: int
    estimate: QueryEstimate
    def __init__(self, plan_name: _Optional[str] = ..., corruptions: _Optional[int] = ..., attacks: _Optional[int] = ..., degradation_operators: _Optional[int] = ..., estimate: _Optional[_Union[QueryEstimate, _Mapping]] = ...) -> None: ...

class SettingQueryEstimate(_message.Message):
    __slots__ = ("stage", "setting", "kind", "images", "per_image", "fixed", "upper_bound", "expected", "target")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    SETTING_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    PER_IMAGE_FIELD_NUMBER: _ClassVar[int]
    FIXED_FIELD_NUMBER: _ClassVar[int]
    UPPER_BOUND_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    stage: str
    setting: str
    kind: QueryCountKind
    images: int
    per_image: int
    fixed: int
    upper_bound: int
    expected: int
    target: str
    def __init__(self, stage: _Optional[str] = ..., setting: _Optional[str] = ..., kind: _Optional[_Union[QueryCountKind, str]] = ..., images: _Optional[int] = ..., per_image: _Optional[int] = ..., fixed: _Optional[int] = ..., upper_bound: _Optional[int] = ..., expected: _Optional[int] = ..., target: _Optional[str] = ...) -> None: ...

class DurationEstimate(_message.Message):
    __slots__ = ("limit", "rate", "unit", "seconds_fixed", "seconds_upper_bound")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIXED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_UPPER_BOUND_FIELD_NUMBER: _ClassVar[int]
    limit: str
    rate: float
    unit: str
    seconds_fixed: float
    seconds_upper_bound: float
    def __init__(self, limit: _Optional[str] = ..., rate: _Optional[float] = ..., unit: _Optional[str] = ..., seconds_fixed: _Optional[float] = ..., seconds_upper_bound: _Optional[float] = ...) -> None: ...

class PriceEstimate(_message.Message):
    __slots__ = ("per_1000", "source", "fixed", "upper_bound")
    PER_1000_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    FIXED_FIELD_NUMBER: _ClassVar[int]
    UPPER_BOUND_FIELD_NUMBER: _ClassVar[int]
    per_1000: float
    source: str
    fixed: float
    upper_bound: float
    def __init__(self, per_1000: _Optional[float] = ..., source: _Optional[str] = ..., fixed: _Optional[float] = ..., upper_bound: _Optional[float] = ...) -> None: ...

class QueryEstimate(_message.Message):
    __slots__ = ("images", "batch_size", "settings", "fixed", "upper_bound", "expected", "expected_from", "durations", "price", "tenant_queries_today", "tenant_queries_per_day")
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    FIXED_FIELD_NUMBER: _ClassVar[int]
    UPPER_BOUND_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FROM_FIELD_NUMBER: _ClassVar[int]
    DURATIONS_FIELD_NUMBER: _ClassVar[int]
    PRICE_FIELD_NUMBER: _ClassVar[int]
    TENANT_QUERIES_TODAY_FIELD_NUMBER: _ClassVar[int]
    TENANT_QUERIES_PER_DAY_FIELD_NUMBER: _ClassVar[int]
    images: int
    batch_size: int
    settings: _containers.RepeatedCompositeFieldContainer[SettingQueryEstimate]
    fixed: int
    upper_bound: int
    expected: int
    expected_from: str
    durations: _containers.RepeatedCompositeFieldContainer[DurationEstimate]
    price: PriceEstimate
    tenant_queries_today: int
    tenant_queries_per_day: int
    def __init__(self, images: _Optional[int] = ..., batch_size: _Optional[int] = ..., settings: _Optional[_Iterable[_Union[SettingQueryEstimate, _Mapping]]] = ..., fixed: _Optional[int] = ..., upper_bound: _Optional[int] = ..., expected: _Optional[int] = ..., expected_from: _Optional[str] = ..., durations: _Optional[_Iterable[_Union[DurationEstimate, _Mapping]]] = ..., price: _Optional[_Union[PriceEstimate, _Mapping]] = ..., tenant_queries_today: _Optional[int] = ..., tenant_queries_per_day: _Optional[int] = ...) -> None: ...

class GetEvaluationReportRequest(_message.Message):
    __slots__ = ("evaluation_id",)
    EVALUATION_ID_FIELD_NUMBER: _ClassVar[int]
    evaluation_id: str
    def __init__(self, evaluation_id: _Optional[str] = ...) -> None: ...

class GetEvaluationReportResponse(_message.Message):
    __slots__ = ("report_json", "report_html")
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    REPORT_HTML_FIELD_NUMBER: _ClassVar[int]
    report_json: str
    report_html: str
    def __init__(self, report_json: _Optional[str] = ..., report_html: _Optional[str] = ...) -> None: ...
