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
    __slots__ = ("plan_name", "corruptions", "attacks", "degradation_operators")
    PLAN_NAME_FIELD_NUMBER: _ClassVar[int]
    CORRUPTIONS_FIELD_NUMBER: _ClassVar[int]
    ATTACKS_FIELD_NUMBER: _ClassVar[int]
    DEGRADATION_OPERATORS_FIELD_NUMBER: _ClassVar[int]
    plan_name: str
    corruptions: int
    attacks: int
    degradation_operators: int
    def __init__(self, plan_name: _Optional[str] = ..., corruptions: _Optional[int] = ..., attacks: _Optional[int] = ..., degradation_operators: _Optional[int] = ...) -> None: ...

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
