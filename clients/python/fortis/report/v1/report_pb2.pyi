import datetime

from fortis.common.v1 import common_pb2 as _common_pb2
from fortis.perturbation.v1 import perturbation_pb2 as _perturbation_pb2
from fortis.scoring.v1 import scoring_pb2 as _scoring_pb2
from google.api import field_behavior_pb2 as _field_behavior_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.rpc import code_pb2 as _code_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TestKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TEST_KIND_UNSPECIFIED: _ClassVar[TestKind]
    TEST_KIND_CORRUPTION: _ClassVar[TestKind]
    TEST_KIND_DEGRADATION: _ClassVar[TestKind]
    TEST_KIND_TRANSFER_ATTACK: _ClassVar[TestKind]
    TEST_KIND_SCORE_ATTACK: _ClassVar[TestKind]
    TEST_KIND_DECISION_ATTACK: _ClassVar[TestKind]
    TEST_KIND_STYLE: _ClassVar[TestKind]

class ExampleKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXAMPLE_KIND_UNSPECIFIED: _ClassVar[ExampleKind]
    EXAMPLE_KIND_CORRUPTION: _ClassVar[ExampleKind]
    EXAMPLE_KIND_ATTACK: _ClassVar[ExampleKind]
    EXAMPLE_KIND_DEGRADATION: _ClassVar[ExampleKind]

class ExampleVerdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXAMPLE_VERDICT_UNSPECIFIED: _ClassVar[ExampleVerdict]
    EXAMPLE_VERDICT_CORRECT: _ClassVar[ExampleVerdict]
    EXAMPLE_VERDICT_INCORRECT: _ClassVar[ExampleVerdict]
TEST_KIND_UNSPECIFIED: TestKind
TEST_KIND_CORRUPTION: TestKind
TEST_KIND_DEGRADATION: TestKind
TEST_KIND_TRANSFER_ATTACK: TestKind
TEST_KIND_SCORE_ATTACK: TestKind
TEST_KIND_DECISION_ATTACK: TestKind
TEST_KIND_STYLE: TestKind
EXAMPLE_KIND_UNSPECIFIED: ExampleKind
EXAMPLE_KIND_CORRUPTION: ExampleKind
EXAMPLE_KIND_ATTACK: ExampleKind
EXAMPLE_KIND_DEGRADATION: ExampleKind
EXAMPLE_VERDICT_UNSPECIFIED: ExampleVerdict
EXAMPLE_VERDICT_CORRECT: ExampleVerdict
EXAMPLE_VERDICT_INCORRECT: ExampleVerdict

class Party(_message.Message):
    __slots__ = ("name", "organisation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ORGANISATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    organisation: str
    def __init__(self, name: _Optional[str] = ..., organisation: _Optional[str] = ...) -> None: ...

class Roles(_message.Message):
    __slots__ = ("requester", "tester", "provider")
    REQUESTER_FIELD_NUMBER: _ClassVar[int]
    TESTER_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    requester: Party
    tester: Party
    provider: Party
    def __init__(self, requester: _Optional[_Union[Party, _Mapping]] = ..., tester: _Optional[_Union[Party, _Mapping]] = ..., provider: _Optional[_Union[Party, _Mapping]] = ...) -> None: ...

class TargetReport(_message.Message):
    __slots__ = ("name", "model_name", "task", "endpoint", "output_kind", "top_k", "labels_count", "version", "input_height", "input_width", "input_channels", "correctness", "detection", "segmentation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_KIND_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    LABELS_COUNT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INPUT_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    INPUT_WIDTH_FIELD_NUMBER: _ClassVar[int]
    INPUT_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    CORRECTNESS_FIELD_NUMBER: _ClassVar[int]
    DETECTION_FIELD_NUMBER: _ClassVar[int]
    SEGMENTATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    model_name: str
    task: _common_pb2.TaskType
    endpoint: str
    output_kind: _common_pb2.OutputKind
    top_k: int
    labels_count: int
    version: str
    input_height: int
    input_width: int
    input_channels: int
    correctness: _scoring_pb2.CorrectnessRule
    detection: _scoring_pb2.DetectionCriterion
    segmentation: _scoring_pb2.SegmentationCriterion
    def __init__(self, name: _Optional[str] = ..., model_name: _Optional[str] = ..., task: _Optional[_Union[_common_pb2.TaskType, str]] = ..., endpoint: _Optional[str] = ..., output_kind: _Optional[_Union[_common_pb2.OutputKind, str]] = ..., top_k: _Optional[int] = ..., labels_count: _Optional[int] = ..., version: _Optional[str] = ..., input_height: _Optional[int] = ..., input_width: _Optional[int] = ..., input_channels: _Optional[int] = ..., correctness: _Optional[_Union[_scoring_pb2.CorrectnessRule, _Mapping]] = ..., detection: _Optional[_Union[_scoring_pb2.DetectionCriterion, _Mapping]] = ..., segmentation: _Optional[_Union[_scoring_pb2.SegmentationCriterion, _Mapping]] = ...) -> None: ...

class Environment(_message.Message):
    __slots__ = ("python", "platform", "fortis", "torch", "numpy", "seed")
    PYTHON_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    FORTIS_FIELD_NUMBER: _ClassVar[int]
    TORCH_FIELD_NUMBER: _ClassVar[int]
    NUMPY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    python: str
    platform: str
    fortis: str
    torch: str
    numpy: str
    seed: int
    def __init__(self, python: _Optional[str] = ..., platform: _Optional[str] = ..., fortis: _Optional[str] = ..., torch: _Optional[str] = ..., numpy: _Optional[str] = ..., seed: _Optional[int] = ...) -> None: ...

class TestDefinition(_message.Message):
    __slots__ = ("name", "kind", "perturbation_id", "family", "refs", "levels", "level_parameters", "params", "characterisation", "surrogate", "epsilon", "norm", "query_budget", "images", "signal", "criterion")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PERTURBATION_ID_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    REFS_FIELD_NUMBER: _ClassVar[int]
    LEVELS_FIELD_NUMBER: _ClassVar[int]
    LEVEL_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    CHARACTERISATION_FIELD_NUMBER: _ClassVar[int]
    SURROGATE_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    NORM_FIELD_NUMBER: _ClassVar[int]
    QUERY_BUDGET_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    CRITERION_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: TestKind
    perturbation_id: str
    family: str
    refs: _containers.RepeatedScalarFieldContainer[str]
    levels: _containers.RepeatedScalarFieldContainer[int]
    level_parameters: _containers.RepeatedCompositeFieldContainer[_perturbation_pb2.LevelParameters]
    params: _containers.RepeatedCompositeFieldContainer[_perturbation_pb2.NamedValue]
    characterisation: _perturbation_pb2.Characterisation
    surrogate: str
    epsilon: float
    norm: str
    query_budget: int
    images: int
    signal: str
    criterion: str
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[TestKind, str]] = ..., perturbation_id: _Optional[str] = ..., family: _Optional[str] = ..., refs: _Optional[_Iterable[str]] = ..., levels: _Optional[_Iterable[int]] = ..., level_parameters: _Optional[_Iterable[_Union[_perturbation_pb2.LevelParameters, _Mapping]]] = ..., params: _Optional[_Iterable[_Union[_perturbation_pb2.NamedValue, _Mapping]]] = ..., characterisation: _Optional[_Union[_perturbation_pb2.Characterisation, _Mapping]] = ..., surrogate: _Optional[str] = ..., epsilon: _Optional[float] = ..., norm: _Optional[str] = ..., query_budget: _Optional[int] = ..., images: _Optional[int] = ..., signal: _Optional[str] = ..., criterion: _Optional[str] = ...) -> None: ...

class LedgerSummary(_message.Message):
    __slots__ = ("sessions", "total_queries", "aborted_attempt_sessions", "aborted_attempt_queries")
    class SessionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class AbortedAttemptSessionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_QUERIES_FIELD_NUMBER: _ClassVar[int]
    ABORTED_ATTEMPT_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    ABORTED_ATTEMPT_QUERIES_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.ScalarMap[str, int]
    total_queries: int
    aborted_attempt_sessions: _containers.ScalarMap[str, int]
    aborted_attempt_queries: int
    def __init__(self, sessions: _Optional[_Mapping[str, int]] = ..., total_queries: _Optional[int] = ..., aborted_attempt_sessions: _Optional[_Mapping[str, int]] = ..., aborted_attempt_queries: _Optional[int] = ...) -> None: ...

class DatasetInfo(_message.Message):
    __slots__ = ("source", "split", "offset", "limit")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    source: str
    split: str
    offset: int
    limit: int
    def __init__(self, source: _Optional[str] = ..., split: _Optional[str] = ..., offset: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class EvaluationInfo(_message.Message):
    __slots__ = ("evaluation_id", "start_time", "end_time", "images", "dataset", "resumed_count")
    EVALUATION_ID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    RESUMED_COUNT_FIELD_NUMBER: _ClassVar[int]
    evaluation_id: str
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    images: int
    dataset: DatasetInfo
    resumed_count: int
    def __init__(self, evaluation_id: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., images: _Optional[int] = ..., dataset: _Optional[_Union[DatasetInfo, _Mapping]] = ..., resumed_count: _Optional[int] = ...) -> None: ...

class ExampleBox(_message.Message):
    __slots__ = ("x_min", "y_min", "x_max", "y_max", "label", "score")
    X_MIN_FIELD_NUMBER: _ClassVar[int]
    Y_MIN_FIELD_NUMBER: _ClassVar[int]
    X_MAX_FIELD_NUMBER: _ClassVar[int]
    Y_MAX_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    x_min: float
    y_min: float
    x_max: float
    y_max: float
    label: str
    score: float
    def __init__(self, x_min: _Optional[float] = ..., y_min: _Optional[float] = ..., x_max: _Optional[float] = ..., y_max: _Optional[float] = ..., label: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class ExampleImage(_message.Message):
    __slots__ = ("kind", "setting", "level", "image_id", "original_png", "perturbed_png", "original_answer", "perturbed_answer", "note", "target", "original_verdict", "perturbed_verdict", "truth_boxes", "original_boxes", "perturbed_boxes", "truth_mask_png", "original_mask_png", "perturbed_mask_png", "mask_classes")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SETTING_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    IMAGE_ID_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_PNG_FIELD_NUMBER: _ClassVar[int]
    PERTURBED_PNG_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_ANSWER_FIELD_NUMBER: _ClassVar[int]
    PERTURBED_ANSWER_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_VERDICT_FIELD_NUMBER: _ClassVar[int]
    PERTURBED_VERDICT_FIELD_NUMBER: _ClassVar[int]
    TRUTH_BOXES_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_BOXES_FIELD_NUMBER: _ClassVar[int]
    PERTURBED_BOXES_FIELD_NUMBER: _ClassVar[int]
    TRUTH_MASK_PNG_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_MASK_PNG_FIELD_NUMBER: _ClassVar[int]
    PERTURBED_MASK_PNG_FIELD_NUMBER: _ClassVar[int]
    MASK_CLASSES_FIELD_NUMBER: _ClassVar[int]
    kind: ExampleKind
    setting: str
    level: int
    image_id: str
    original_png: bytes
    perturbed_png: bytes
    original_answer: str
    perturbed_answer: str
    note: str
    target: str
    original_verdict: ExampleVerdict
    perturbed_verdict: ExampleVerdict
    truth_boxes: _containers.RepeatedCompositeFieldContainer[ExampleBox]
    original_boxes: _containers.RepeatedCompositeFieldContainer[ExampleBox]
    perturbed_boxes: _containers.RepeatedCompositeFieldContainer[ExampleBox]
    truth_mask_png: bytes
    original_mask_png: bytes
    perturbed_mask_png: bytes
    mask_classes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kind: _Optional[_Union[ExampleKind, str]] = ..., setting: _Optional[str] = ..., level: _Optional[int] = ..., image_id: _Optional[str] = ..., original_png: _Optional[bytes] = ..., perturbed_png: _Optional[bytes] = ..., original_answer: _Optional[str] = ..., perturbed_answer: _Optional[str] = ..., note: _Optional[str] = ..., target: _Optional[str] = ..., original_verdict: _Optional[_Union[ExampleVerdict, str]] = ..., perturbed_verdict: _Optional[_Union[ExampleVerdict, str]] = ..., truth_boxes: _Optional[_Iterable[_Union[ExampleBox, _Mapping]]] = ..., original_boxes: _Optional[_Iterable[_Union[ExampleBox, _Mapping]]] = ..., perturbed_boxes: _Optional[_Iterable[_Union[ExampleBox, _Mapping]]] = ..., truth_mask_png: _Optional[bytes] = ..., original_mask_png: _Optional[bytes] = ..., perturbed_mask_png: _Optional[bytes] = ..., mask_classes: _Optional[_Iterable[str]] = ...) -> None: ...

class FailedSetting(_message.Message):
    __slots__ = ("kind", "name", "level", "code", "message", "images_done", "images_planned")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    IMAGES_DONE_FIELD_NUMBER: _ClassVar[int]
    IMAGES_PLANNED_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    level: int
    code: _code_pb2.Code
    message: str
    images_done: int
    images_planned: int
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., level: _Optional[int] = ..., code: _Optional[_Union[_code_pb2.Code, str]] = ..., message: _Optional[str] = ..., images_done: _Optional[int] = ..., images_planned: _Optional[int] = ...) -> None: ...

class ReportParts(_message.Message):
    __slots__ = ("plan_text", "target", "roles", "environment", "metrics", "tests", "ledger", "evaluation", "examples", "canary", "benchmark", "failed_settings")
    PLAN_TEXT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    TESTS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_FIELD_NUMBER: _ClassVar[int]
    EVALUATION_FIELD_NUMBER: _ClassVar[int]
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    BENCHMARK_FIELD_NUMBER: _ClassVar[int]
    FAILED_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    plan_text: str
    target: TargetReport
    roles: Roles
    environment: Environment
    metrics: _scoring_pb2.ScoreEvaluationResponse
    tests: _containers.RepeatedCompositeFieldContainer[TestDefinition]
    ledger: LedgerSummary
    evaluation: EvaluationInfo
    examples: _containers.RepeatedCompositeFieldContainer[ExampleImage]
    canary: _struct_pb2.Struct
    benchmark: _struct_pb2.Struct
    failed_settings: _containers.RepeatedCompositeFieldContainer[FailedSetting]
    def __init__(self, plan_text: _Optional[str] = ..., target: _Optional[_Union[TargetReport, _Mapping]] = ..., roles: _Optional[_Union[Roles, _Mapping]] = ..., environment: _Optional[_Union[Environment, _Mapping]] = ..., metrics: _Optional[_Union[_scoring_pb2.ScoreEvaluationResponse, _Mapping]] = ..., tests: _Optional[_Iterable[_Union[TestDefinition, _Mapping]]] = ..., ledger: _Optional[_Union[LedgerSummary, _Mapping]] = ..., evaluation: _Optional[_Union[EvaluationInfo, _Mapping]] = ..., examples: _Optional[_Iterable[_Union[ExampleImage, _Mapping]]] = ..., canary: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., benchmark: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., failed_settings: _Optional[_Iterable[_Union[FailedSetting, _Mapping]]] = ...) -> None: ...

class RenderReportRequest(_message.Message):
    __slots__ = ("parts",)
    PARTS_FIELD_NUMBER: _ClassVar[int]
    parts: ReportParts
    def __init__(self, parts: _Optional[_Union[ReportParts, _Mapping]] = ...) -> None: ...

class RenderReportResponse(_message.Message):
    __slots__ = ("report_json", "report_html")
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    REPORT_HTML_FIELD_NUMBER: _ClassVar[int]
    report_json: str
    report_html: str
    def __init__(self, report_json: _Optional[str] = ..., report_html: _Optional[str] = ...) -> None: ...
