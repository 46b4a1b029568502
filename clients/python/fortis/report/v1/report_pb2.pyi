import datetime

from fortis.common.v1 import common_pb2 as _common_pb2
from fortis.perturbation.v1 import perturbation_pb2 as _perturbation_pb2
from fortis.scoring.v1 import scoring_pb2 as _scoring_pb2
from google.api import field_behavior_pb2 as _field_behavior_pb2
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

class EstimateKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ESTIMATE_KIND_UNSPECIFIED: _ClassVar[EstimateKind]
    ESTIMATE_KIND_FIXED: _ClassVar[EstimateKind]
    ESTIMATE_KIND_UPPER_BOUND: _ClassVar[EstimateKind]
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
ESTIMATE_KIND_UNSPECIFIED: EstimateKind
ESTIMATE_KIND_FIXED: EstimateKind
ESTIMATE_KIND_UPPER_BOUND: EstimateKind

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
    __slots__ = ("plan_text", "target", "roles", "environment", "metrics", "tests", "ledger", "evaluation", "examples", "failed_settings", "canary", "benchmark", "sequential", "estimate", "outcomes")
    PLAN_TEXT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    TESTS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_FIELD_NUMBER: _ClassVar[int]
    EVALUATION_FIELD_NUMBER: _ClassVar[int]
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    FAILED_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    BENCHMARK_FIELD_NUMBER: _ClassVar[int]
    SEQUENTIAL_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    plan_text: str
    target: TargetReport
    roles: Roles
    environment: Environment
    metrics: _scoring_pb2.ScoreEvaluationResponse
    tests: _containers.RepeatedCompositeFieldContainer[TestDefinition]
    ledger: LedgerSummary
    evaluation: EvaluationInfo
    examples: _containers.RepeatedCompositeFieldContainer[ExampleImage]
    failed_settings: _containers.RepeatedCompositeFieldContainer[FailedSetting]
    canary: CanaryMetrics
    benchmark: BenchmarkResults
    sequential: SequentialResults
    estimate: EstimateReport
    outcomes: PerImageOutcomes
    def __init__(self, plan_text: _Optional[str] = ..., target: _Optional[_Union[TargetReport, _Mapping]] = ..., roles: _Optional[_Union[Roles, _Mapping]] = ..., environment: _Optional[_Union[Environment, _Mapping]] = ..., metrics: _Optional[_Union[_scoring_pb2.ScoreEvaluationResponse, _Mapping]] = ..., tests: _Optional[_Iterable[_Union[TestDefinition, _Mapping]]] = ..., ledger: _Optional[_Union[LedgerSummary, _Mapping]] = ..., evaluation: _Optional[_Union[EvaluationInfo, _Mapping]] = ..., examples: _Optional[_Iterable[_Union[ExampleImage, _Mapping]]] = ..., failed_settings: _Optional[_Iterable[_Union[FailedSetting, _Mapping]]] = ..., canary: _Optional[_Union[CanaryMetrics, _Mapping]] = ..., benchmark: _Optional[_Union[BenchmarkResults, _Mapping]] = ..., sequential: _Optional[_Union[SequentialResults, _Mapping]] = ..., estimate: _Optional[_Union[EstimateReport, _Mapping]] = ..., outcomes: _Optional[_Union[PerImageOutcomes, _Mapping]] = ...) -> None: ...

class PerImageOutcomes(_message.Message):
    __slots__ = ("image_ids", "settings")
    IMAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    image_ids: _containers.RepeatedScalarFieldContainer[str]
    settings: _containers.RepeatedCompositeFieldContainer[SettingOutcomes]
    def __init__(self, image_ids: _Optional[_Iterable[str]] = ..., settings: _Optional[_Iterable[_Union[SettingOutcomes, _Mapping]]] = ...) -> None: ...

class SettingOutcomes(_message.Message):
    __slots__ = ("kind", "name", "level", "outcomes")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    level: int
    outcomes: str
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., level: _Optional[int] = ..., outcomes: _Optional[str] = ...) -> None: ...

class SequentialResults(_message.Message):
    __slots__ = ("alpha", "method", "order_seed", "unreferenced", "queries_saved_estimate", "criteria", "settings", "notes", "null_fields", "empty_fields")
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    ORDER_SEED_FIELD_NUMBER: _ClassVar[int]
    UNREFERENCED_FIELD_NUMBER: _ClassVar[int]
    QUERIES_SAVED_ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    CRITERIA_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    alpha: float
    method: str
    order_seed: int
    unreferenced: str
    queries_saved_estimate: int
    criteria: _containers.RepeatedCompositeFieldContainer[SequentialCriterion]
    settings: _containers.RepeatedCompositeFieldContainer[SequentialSetting]
    notes: _containers.RepeatedScalarFieldContainer[str]
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, alpha: _Optional[float] = ..., method: _Optional[str] = ..., order_seed: _Optional[int] = ..., unreferenced: _Optional[str] = ..., queries_saved_estimate: _Optional[int] = ..., criteria: _Optional[_Iterable[_Union[SequentialCriterion, _Mapping]]] = ..., settings: _Optional[_Iterable[_Union[SequentialSetting, _Mapping]]] = ..., notes: _Optional[_Iterable[str]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class SequentialCriterion(_message.Message):
    __slots__ = ("metric", "op", "threshold", "outcome", "images", "population", "estimate", "interval", "null_fields", "empty_fields")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    POPULATION_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    metric: str
    op: str
    threshold: float
    outcome: str
    images: int
    population: int
    estimate: float
    interval: _containers.RepeatedScalarFieldContainer[float]
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, metric: _Optional[str] = ..., op: _Optional[str] = ..., threshold: _Optional[float] = ..., outcome: _Optional[str] = ..., images: _Optional[int] = ..., population: _Optional[int] = ..., estimate: _Optional[float] = ..., interval: _Optional[_Iterable[float]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class SequentialSetting(_message.Message):
    __slots__ = ("setting", "status", "stopped_early", "images_planned", "images_used", "queries_used", "queries_planned", "queries_upper_bound", "queries_saved_estimate", "queries_saved_kind", "null_fields", "empty_fields")
    SETTING_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STOPPED_EARLY_FIELD_NUMBER: _ClassVar[int]
    IMAGES_PLANNED_FIELD_NUMBER: _ClassVar[int]
    IMAGES_USED_FIELD_NUMBER: _ClassVar[int]
    QUERIES_USED_FIELD_NUMBER: _ClassVar[int]
    QUERIES_PLANNED_FIELD_NUMBER: _ClassVar[int]
    QUERIES_UPPER_BOUND_FIELD_NUMBER: _ClassVar[int]
    QUERIES_SAVED_ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    QUERIES_SAVED_KIND_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    setting: str
    status: str
    stopped_early: bool
    images_planned: int
    images_used: int
    queries_used: int
    queries_planned: int
    queries_upper_bound: int
    queries_saved_estimate: int
    queries_saved_kind: str
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, setting: _Optional[str] = ..., status: _Optional[str] = ..., stopped_early: _Optional[bool] = ..., images_planned: _Optional[int] = ..., images_used: _Optional[int] = ..., queries_used: _Optional[int] = ..., queries_planned: _Optional[int] = ..., queries_upper_bound: _Optional[int] = ..., queries_saved_estimate: _Optional[int] = ..., queries_saved_kind: _Optional[str] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class EstimatedSetting(_message.Message):
    __slots__ = ("stage", "setting", "kind", "estimated", "actual")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    SETTING_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_FIELD_NUMBER: _ClassVar[int]
    stage: str
    setting: str
    kind: EstimateKind
    estimated: int
    actual: int
    def __init__(self, stage: _Optional[str] = ..., setting: _Optional[str] = ..., kind: _Optional[_Union[EstimateKind, str]] = ..., estimated: _Optional[int] = ..., actual: _Optional[int] = ...) -> None: ...

class EstimateReport(_message.Message):
    __slots__ = ("fixed", "upper_bound", "expected", "per_setting", "total_actual")
    FIXED_FIELD_NUMBER: _ClassVar[int]
    UPPER_BOUND_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    PER_SETTING_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ACTUAL_FIELD_NUMBER: _ClassVar[int]
    fixed: int
    upper_bound: int
    expected: int
    per_setting: _containers.RepeatedCompositeFieldContainer[EstimatedSetting]
    total_actual: int
    def __init__(self, fixed: _Optional[int] = ..., upper_bound: _Optional[int] = ..., expected: _Optional[int] = ..., per_setting: _Optional[_Iterable[_Union[EstimatedSetting, _Mapping]]] = ..., total_actual: _Optional[int] = ...) -> None: ...

class MetricNode(_message.Message):
    __slots__ = ("value", "n", "status", "reason", "correct", "average", "classes", "misclassified", "layer", "zero_maps", "models", "per_model", "unit", "grade", "level", "grade_reason", "denominator", "change_tolerance", "wavelet", "levels", "measure", "chromatic", "baseline", "defended", "null_fields", "empty_fields")
    class PerModelEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: MetricNode
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[MetricNode, _Mapping]] = ...) -> None: ...
    VALUE_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    AVERAGE_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    MISCLASSIFIED_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    ZERO_MAPS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    PER_MODEL_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    GRADE_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    GRADE_REASON_FIELD_NUMBER: _ClassVar[int]
    DENOMINATOR_FIELD_NUMBER: _ClassVar[int]
    CHANGE_TOLERANCE_FIELD_NUMBER: _ClassVar[int]
    WAVELET_FIELD_NUMBER: _ClassVar[int]
    LEVELS_FIELD_NUMBER: _ClassVar[int]
    MEASURE_FIELD_NUMBER: _ClassVar[int]
    CHROMATIC_FIELD_NUMBER: _ClassVar[int]
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    DEFENDED_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    value: float
    n: int
    status: str
    reason: str
    correct: int
    average: str
    classes: int
    misclassified: int
    layer: str
    zero_maps: int
    models: int
    per_model: _containers.MessageMap[str, MetricNode]
    unit: str
    grade: str
    level: int
    grade_reason: str
    denominator: str
    change_tolerance: float
    wavelet: str
    levels: int
    measure: str
    chromatic: bool
    baseline: float
    defended: float
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, value: _Optional[float] = ..., n: _Optional[int] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ..., correct: _Optional[int] = ..., average: _Optional[str] = ..., classes: _Optional[int] = ..., misclassified: _Optional[int] = ..., layer: _Optional[str] = ..., zero_maps: _Optional[int] = ..., models: _Optional[int] = ..., per_model: _Optional[_Mapping[str, MetricNode]] = ..., unit: _Optional[str] = ..., grade: _Optional[str] = ..., level: _Optional[int] = ..., grade_reason: _Optional[str] = ..., denominator: _Optional[str] = ..., change_tolerance: _Optional[float] = ..., wavelet: _Optional[str] = ..., levels: _Optional[int] = ..., measure: _Optional[str] = ..., chromatic: _Optional[bool] = ..., baseline: _Optional[float] = ..., defended: _Optional[float] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class ModelCapability(_message.Message):
    __slots__ = ("n", "value", "status", "reason", "ca", "cf", "cc", "null_fields", "empty_fields")
    N_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CA_FIELD_NUMBER: _ClassVar[int]
    CF_FIELD_NUMBER: _ClassVar[int]
    CC_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    n: int
    value: float
    status: str
    reason: str
    ca: MetricNode
    cf: MetricNode
    cc: MetricNode
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, n: _Optional[int] = ..., value: _Optional[float] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ..., ca: _Optional[_Union[MetricNode, _Mapping]] = ..., cf: _Optional[_Union[MetricNode, _Mapping]] = ..., cc: _Optional[_Union[MetricNode, _Mapping]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class AttackEffect(_message.Message):
    __slots__ = ("n", "n_total", "value", "status", "reason", "mr", "tas", "aiac", "artc", "acamc_a", "acamc_t", "otr", "null_fields", "empty_fields")
    N_FIELD_NUMBER: _ClassVar[int]
    N_TOTAL_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MR_FIELD_NUMBER: _ClassVar[int]
    TAS_FIELD_NUMBER: _ClassVar[int]
    AIAC_FIELD_NUMBER: _ClassVar[int]
    ARTC_FIELD_NUMBER: _ClassVar[int]
    ACAMC_A_FIELD_NUMBER: _ClassVar[int]
    ACAMC_T_FIELD_NUMBER: _ClassVar[int]
    OTR_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    n: int
    n_total: int
    value: float
    status: str
    reason: str
    mr: MetricNode
    tas: MetricNode
    aiac: MetricNode
    artc: MetricNode
    acamc_a: MetricNode
    acamc_t: MetricNode
    otr: MetricNode
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, n: _Optional[int] = ..., n_total: _Optional[int] = ..., value: _Optional[float] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ..., mr: _Optional[_Union[MetricNode, _Mapping]] = ..., tas: _Optional[_Union[MetricNode, _Mapping]] = ..., aiac: _Optional[_Union[MetricNode, _Mapping]] = ..., artc: _Optional[_Union[MetricNode, _Mapping]] = ..., acamc_a: _Optional[_Union[MetricNode, _Mapping]] = ..., acamc_t: _Optional[_Union[MetricNode, _Mapping]] = ..., otr: _Optional[_Union[MetricNode, _Mapping]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class AttackCost(_message.Message):
    __slots__ = ("kind", "n_total", "n", "value", "status", "reason", "ctc", "qnc_f", "qnc_b", "null_fields", "empty_fields")
    KIND_FIELD_NUMBER: _ClassVar[int]
    N_TOTAL_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CTC_FIELD_NUMBER: _ClassVar[int]
    QNC_F_FIELD_NUMBER: _ClassVar[int]
    QNC_B_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    n_total: int
    n: int
    value: float
    status: str
    reason: str
    ctc: MetricNode
    qnc_f: MetricNode
    qnc_b: MetricNode
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kind: _Optional[str] = ..., n_total: _Optional[int] = ..., n: _Optional[int] = ..., value: _Optional[float] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ..., ctc: _Optional[_Union[MetricNode, _Mapping]] = ..., qnc_f: _Optional[_Union[MetricNode, _Mapping]] = ..., qnc_b: _Optional[_Union[MetricNode, _Mapping]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class PerturbationCost(_message.Message):
    __slots__ = ("n", "n_total", "value", "status", "reason", "amd", "aed", "apcr", "aed_fd_l", "aed_fd_h", "alms", "adms", "null_fields", "empty_fields")
    N_FIELD_NUMBER: _ClassVar[int]
    N_TOTAL_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AMD_FIELD_NUMBER: _ClassVar[int]
    AED_FIELD_NUMBER: _ClassVar[int]
    APCR_FIELD_NUMBER: _ClassVar[int]
    AED_FD_L_FIELD_NUMBER: _ClassVar[int]
    AED_FD_H_FIELD_NUMBER: _ClassVar[int]
    ALMS_FIELD_NUMBER: _ClassVar[int]
    ADMS_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    n: int
    n_total: int
    value: float
    status: str
    reason: str
    amd: MetricNode
    aed: MetricNode
    apcr: MetricNode
    aed_fd_l: MetricNode
    aed_fd_h: MetricNode
    alms: MetricNode
    adms: MetricNode
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, n: _Optional[int] = ..., n_total: _Optional[int] = ..., value: _Optional[float] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ..., amd: _Optional[_Union[MetricNode, _Mapping]] = ..., aed: _Optional[_Union[MetricNode, _Mapping]] = ..., apcr: _Optional[_Union[MetricNode, _Mapping]] = ..., aed_fd_l: _Optional[_Union[MetricNode, _Mapping]] = ..., aed_fd_h: _Optional[_Union[MetricNode, _Mapping]] = ..., alms: _Optional[_Union[MetricNode, _Mapping]] = ..., adms: _Optional[_Union[MetricNode, _Mapping]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class CanaryAttack(_message.Message):
    __slots__ = ("effect", "cost", "perturbation", "null_fields", "empty_fields")
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    PERTURBATION_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    effect: AttackEffect
    cost: AttackCost
    perturbation: PerturbationCost
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, effect: _Optional[_Union[AttackEffect, _Mapping]] = ..., cost: _Optional[_Union[AttackCost, _Mapping]] = ..., perturbation: _Optional[_Union[PerturbationCost, _Mapping]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class CanaryMetrics(_message.Message):
    __slots__ = ("model", "attacks", "notes", "null_fields", "empty_fields")
    class AttacksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: CanaryAttack
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[CanaryAttack, _Mapping]] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ATTACKS_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    model: ModelCapability
    attacks: _containers.MessageMap[str, CanaryAttack]
    notes: _containers.RepeatedScalarFieldContainer[str]
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[_Union[ModelCapability, _Mapping]] = ..., attacks: _Optional[_Mapping[str, CanaryAttack]] = ..., notes: _Optional[_Iterable[str]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

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

class Numbers(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class NumberMatrix(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[Numbers]
    def __init__(self, values: _Optional[_Iterable[_Union[Numbers, _Mapping]]] = ...) -> None: ...

class NumbersByName(_message.Message):
    __slots__ = ("values",)
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.ScalarMap[str, float]
    def __init__(self, values: _Optional[_Mapping[str, float]] = ...) -> None: ...

class RateSummary(_message.Message):
    __slots__ = ("value", "ci95", "m", "correct", "null_fields", "empty_fields")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    CI95_FIELD_NUMBER: _ClassVar[int]
    M_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    value: float
    ci95: _containers.RepeatedScalarFieldContainer[float]
    m: int
    correct: int
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, value: _Optional[float] = ..., ci95: _Optional[_Iterable[float]] = ..., m: _Optional[int] = ..., correct: _Optional[int] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class AverageSummary(_message.Message):
    __slots__ = ("value", "null_fields", "empty_fields")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    value: float
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, value: _Optional[float] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class ModelAttackSummary(_message.Message):
    __slots__ = ("success_rate", "success_rate_ci95", "robustness_adv", "null_fields", "empty_fields")
    SUCCESS_RATE_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_RATE_CI95_FIELD_NUMBER: _ClassVar[int]
    ROBUSTNESS_ADV_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    success_rate: float
    success_rate_ci95: _containers.RepeatedScalarFieldContainer[float]
    robustness_adv: float
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, success_rate: _Optional[float] = ..., success_rate_ci95: _Optional[_Iterable[float]] = ..., robustness_adv: _Optional[float] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class ModelSummary(_message.Message):
    __slots__ = ("name", "surrogate", "defends", "accuracy", "average_robustness_corr", "average_robustness_adv", "corruptions", "attacks", "null_fields", "empty_fields")
    class CorruptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class AttacksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ModelAttackSummary
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ModelAttackSummary, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    SURROGATE_FIELD_NUMBER: _ClassVar[int]
    DEFENDS_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    AVERAGE_ROBUSTNESS_CORR_FIELD_NUMBER: _ClassVar[int]
    AVERAGE_ROBUSTNESS_ADV_FIELD_NUMBER: _ClassVar[int]
    CORRUPTIONS_FIELD_NUMBER: _ClassVar[int]
    ATTACKS_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    surrogate: str
    defends: str
    accuracy: RateSummary
    average_robustness_corr: AverageSummary
    average_robustness_adv: AverageSummary
    corruptions: _containers.ScalarMap[str, float]
    attacks: _containers.MessageMap[str, ModelAttackSummary]
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., surrogate: _Optional[str] = ..., defends: _Optional[str] = ..., accuracy: _Optional[_Union[RateSummary, _Mapping]] = ..., average_robustness_corr: _Optional[_Union[AverageSummary, _Mapping]] = ..., average_robustness_adv: _Optional[_Union[AverageSummary, _Mapping]] = ..., corruptions: _Optional[_Mapping[str, float]] = ..., attacks: _Optional[_Mapping[str, ModelAttackSummary]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class RankEntry(_message.Message):
    __slots__ = ("value", "n", "score", "rank", "null_fields", "empty_fields")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    value: float
    n: int
    score: float
    rank: int
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, value: _Optional[float] = ..., n: _Optional[int] = ..., score: _Optional[float] = ..., rank: _Optional[int] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class RankingResult(_message.Message):
    __slots__ = ("higher_is_better", "over", "entries", "null_fields", "empty_fields")
    class EntriesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: RankEntry
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[RankEntry, _Mapping]] = ...) -> None: ...
    HIGHER_IS_BETTER_FIELD_NUMBER: _ClassVar[int]
    OVER_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    higher_is_better: bool
    over: _containers.RepeatedScalarFieldContainer[str]
    entries: _containers.MessageMap[str, RankEntry]
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, higher_is_better: _Optional[bool] = ..., over: _Optional[_Iterable[str]] = ..., entries: _Optional[_Mapping[str, RankEntry]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class TwoWaySqueeze(_message.Message):
    __slots__ = ("metric", "complete_only", "model_robustness", "attack_effectiveness", "null_fields", "empty_fields")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_ONLY_FIELD_NUMBER: _ClassVar[int]
    MODEL_ROBUSTNESS_FIELD_NUMBER: _ClassVar[int]
    ATTACK_EFFECTIVENESS_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    metric: str
    complete_only: bool
    model_robustness: RankingResult
    attack_effectiveness: RankingResult
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, metric: _Optional[str] = ..., complete_only: _Optional[bool] = ..., model_robustness: _Optional[_Union[RankingResult, _Mapping]] = ..., attack_effectiveness: _Optional[_Union[RankingResult, _Mapping]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class TransferSummary(_message.Message):
    __slots__ = ("by_source", "by_target", "attack_transferability", "model_transfer_robustness", "null_fields", "empty_fields")
    class BySourceEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: NumbersByName
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[NumbersByName, _Mapping]] = ...) -> None: ...
    class ByTargetEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: NumbersByName
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[NumbersByName, _Mapping]] = ...) -> None: ...
    BY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    BY_TARGET_FIELD_NUMBER: _ClassVar[int]
    ATTACK_TRANSFERABILITY_FIELD_NUMBER: _ClassVar[int]
    MODEL_TRANSFER_ROBUSTNESS_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    by_source: _containers.MessageMap[str, NumbersByName]
    by_target: _containers.MessageMap[str, NumbersByName]
    attack_transferability: RankingResult
    model_transfer_robustness: RankingResult
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, by_source: _Optional[_Mapping[str, NumbersByName]] = ..., by_target: _Optional[_Mapping[str, NumbersByName]] = ..., attack_transferability: _Optional[_Union[RankingResult, _Mapping]] = ..., model_transfer_robustness: _Optional[_Union[RankingResult, _Mapping]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class HeatMap(_message.Message):
    __slots__ = ("attack", "metric", "rows", "cols", "values", "null_fields", "empty_fields")
    ATTACK_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    attack: str
    metric: str
    rows: _containers.RepeatedScalarFieldContainer[str]
    cols: _containers.RepeatedScalarFieldContainer[str]
    values: _containers.RepeatedCompositeFieldContainer[Numbers]
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, attack: _Optional[str] = ..., metric: _Optional[str] = ..., rows: _Optional[_Iterable[str]] = ..., cols: _Optional[_Iterable[str]] = ..., values: _Optional[_Iterable[_Union[Numbers, _Mapping]]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class TwoWayResults(_message.Message):
    __slots__ = ("two_way", "transfer", "heatmaps", "null_fields", "empty_fields")
    class HeatmapsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: HeatMap
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[HeatMap, _Mapping]] = ...) -> None: ...
    TWO_WAY_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_FIELD_NUMBER: _ClassVar[int]
    HEATMAPS_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    two_way: TwoWaySqueeze
    transfer: TransferSummary
    heatmaps: _containers.MessageMap[str, HeatMap]
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, two_way: _Optional[_Union[TwoWaySqueeze, _Mapping]] = ..., transfer: _Optional[_Union[TransferSummary, _Mapping]] = ..., heatmaps: _Optional[_Mapping[str, HeatMap]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class FastRank(_message.Message):
    __slots__ = ("name", "kind", "rank", "of", "score", "value", "two_way", "null_fields", "empty_fields")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    OF_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TWO_WAY_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    rank: int
    of: int
    score: float
    value: float
    two_way: TwoWaySqueeze
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., rank: _Optional[int] = ..., of: _Optional[int] = ..., score: _Optional[float] = ..., value: _Optional[float] = ..., two_way: _Optional[_Union[TwoWaySqueeze, _Mapping]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class IrtSubject(_message.Message):
    __slots__ = ("theta", "score", "rank", "theta_sd", "interval95", "null_fields", "empty_fields")
    THETA_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    THETA_SD_FIELD_NUMBER: _ClassVar[int]
    INTERVAL95_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    theta: float
    score: float
    rank: int
    theta_sd: float
    interval95: _containers.RepeatedScalarFieldContainer[float]
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, theta: _Optional[float] = ..., score: _Optional[float] = ..., rank: _Optional[int] = ..., theta_sd: _Optional[float] = ..., interval95: _Optional[_Iterable[float]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class IrtItem(_message.Message):
    __slots__ = ("a", "b", "c", "null_fields", "empty_fields")
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    C_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    a: float
    b: float
    c: float
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, a: _Optional[float] = ..., b: _Optional[float] = ..., c: _Optional[float] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class IrtAcceptance(_message.Message):
    __slots__ = ("theta", "items", "null_fields", "empty_fields")
    THETA_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    theta: float
    items: float
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, theta: _Optional[float] = ..., items: _Optional[float] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class IrtSampler(_message.Message):
    __slots__ = ("chain_length", "burn_in", "null_fields", "empty_fields")
    CHAIN_LENGTH_FIELD_NUMBER: _ClassVar[int]
    BURN_IN_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    chain_length: int
    burn_in: int
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, chain_length: _Optional[int] = ..., burn_in: _Optional[int] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class IrtFit(_message.Message):
    __slots__ = ("subjects", "items", "acceptance", "sampler", "null_fields", "empty_fields")
    class SubjectsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: IrtSubject
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[IrtSubject, _Mapping]] = ...) -> None: ...
    class ItemsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: IrtItem
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[IrtItem, _Mapping]] = ...) -> None: ...
    SUBJECTS_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    subjects: _containers.MessageMap[str, IrtSubject]
    items: _containers.MessageMap[str, IrtItem]
    acceptance: IrtAcceptance
    sampler: IrtSampler
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, subjects: _Optional[_Mapping[str, IrtSubject]] = ..., items: _Optional[_Mapping[str, IrtItem]] = ..., acceptance: _Optional[_Union[IrtAcceptance, _Mapping]] = ..., sampler: _Optional[_Union[IrtSampler, _Mapping]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class IrtResults(_message.Message):
    __slots__ = ("subjects", "layer1", "layer2", "dropped", "null_fields", "empty_fields")
    class SubjectsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: IrtSubject
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[IrtSubject, _Mapping]] = ...) -> None: ...
    class Layer1Entry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: IrtFit
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[IrtFit, _Mapping]] = ...) -> None: ...
    SUBJECTS_FIELD_NUMBER: _ClassVar[int]
    LAYER1_FIELD_NUMBER: _ClassVar[int]
    LAYER2_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    subjects: _containers.MessageMap[str, IrtSubject]
    layer1: _containers.MessageMap[str, IrtFit]
    layer2: IrtFit
    dropped: _containers.RepeatedScalarFieldContainer[str]
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, subjects: _Optional[_Mapping[str, IrtSubject]] = ..., layer1: _Optional[_Mapping[str, IrtFit]] = ..., layer2: _Optional[_Union[IrtFit, _Mapping]] = ..., dropped: _Optional[_Iterable[str]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class DefenceEffect(_message.Message):
    __slots__ = ("n", "baseline", "defended", "av", "fv", "cv", "rr", "sr", "acv", "arac", "aitc", "value", "status", "reason", "null_fields", "empty_fields")
    class AcvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: MetricNode
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[MetricNode, _Mapping]] = ...) -> None: ...
    N_FIELD_NUMBER: _ClassVar[int]
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    DEFENDED_FIELD_NUMBER: _ClassVar[int]
    AV_FIELD_NUMBER: _ClassVar[int]
    FV_FIELD_NUMBER: _ClassVar[int]
    CV_FIELD_NUMBER: _ClassVar[int]
    RR_FIELD_NUMBER: _ClassVar[int]
    SR_FIELD_NUMBER: _ClassVar[int]
    ACV_FIELD_NUMBER: _ClassVar[int]
    ARAC_FIELD_NUMBER: _ClassVar[int]
    AITC_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    n: int
    baseline: ModelCapability
    defended: ModelCapability
    av: MetricNode
    fv: MetricNode
    cv: MetricNode
    rr: MetricNode
    sr: MetricNode
    acv: _containers.MessageMap[str, MetricNode]
    arac: MetricNode
    aitc: MetricNode
    value: float
    status: str
    reason: str
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, n: _Optional[int] = ..., baseline: _Optional[_Union[ModelCapability, _Mapping]] = ..., defended: _Optional[_Union[ModelCapability, _Mapping]] = ..., av: _Optional[_Union[MetricNode, _Mapping]] = ..., fv: _Optional[_Union[MetricNode, _Mapping]] = ..., cv: _Optional[_Union[MetricNode, _Mapping]] = ..., rr: _Optional[_Union[MetricNode, _Mapping]] = ..., sr: _Optional[_Union[MetricNode, _Mapping]] = ..., acv: _Optional[_Mapping[str, MetricNode]] = ..., arac: _Optional[_Union[MetricNode, _Mapping]] = ..., aitc: _Optional[_Union[MetricNode, _Mapping]] = ..., value: _Optional[float] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class DefencePair(_message.Message):
    __slots__ = ("baseline", "defended", "result", "attacks", "null_fields", "empty_fields")
    class AttacksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: DefenceEffect
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[DefenceEffect, _Mapping]] = ...) -> None: ...
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    DEFENDED_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ATTACKS_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    baseline: str
    defended: str
    result: DefenceEffect
    attacks: _containers.MessageMap[str, DefenceEffect]
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, baseline: _Optional[str] = ..., defended: _Optional[str] = ..., result: _Optional[_Union[DefenceEffect, _Mapping]] = ..., attacks: _Optional[_Mapping[str, DefenceEffect]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class BenchmarkResults(_message.Message):
    __slots__ = ("mode", "metric", "task", "attacks", "model_names", "sources", "models", "matrix", "baseline_evaluation", "notes", "twoway_models", "matrix_square", "twoway", "irt", "defence", "fast", "null_fields", "empty_fields")
    MODE_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    ATTACKS_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAMES_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    MATRIX_FIELD_NUMBER: _ClassVar[int]
    BASELINE_EVALUATION_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    TWOWAY_MODELS_FIELD_NUMBER: _ClassVar[int]
    MATRIX_SQUARE_FIELD_NUMBER: _ClassVar[int]
    TWOWAY_FIELD_NUMBER: _ClassVar[int]
    IRT_FIELD_NUMBER: _ClassVar[int]
    DEFENCE_FIELD_NUMBER: _ClassVar[int]
    FAST_FIELD_NUMBER: _ClassVar[int]
    NULL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELDS_FIELD_NUMBER: _ClassVar[int]
    mode: str
    metric: str
    task: str
    attacks: _containers.RepeatedScalarFieldContainer[str]
    model_names: _containers.RepeatedScalarFieldContainer[str]
    sources: _containers.RepeatedScalarFieldContainer[str]
    models: _containers.RepeatedCompositeFieldContainer[ModelSummary]
    matrix: _containers.RepeatedCompositeFieldContainer[NumberMatrix]
    baseline_evaluation: str
    notes: _containers.RepeatedScalarFieldContainer[str]
    twoway_models: _containers.RepeatedScalarFieldContainer[str]
    matrix_square: _containers.RepeatedCompositeFieldContainer[NumberMatrix]
    twoway: TwoWayResults
    irt: IrtResults
    defence: _containers.RepeatedCompositeFieldContainer[DefencePair]
    fast: FastRank
    null_fields: _containers.RepeatedScalarFieldContainer[str]
    empty_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, mode: _Optional[str] = ..., metric: _Optional[str] = ..., task: _Optional[str] = ..., attacks: _Optional[_Iterable[str]] = ..., model_names: _Optional[_Iterable[str]] = ..., sources: _Optional[_Iterable[str]] = ..., models: _Optional[_Iterable[_Union[ModelSummary, _Mapping]]] = ..., matrix: _Optional[_Iterable[_Union[NumberMatrix, _Mapping]]] = ..., baseline_evaluation: _Optional[str] = ..., notes: _Optional[_Iterable[str]] = ..., twoway_models: _Optional[_Iterable[str]] = ..., matrix_square: _Optional[_Iterable[_Union[NumberMatrix, _Mapping]]] = ..., twoway: _Optional[_Union[TwoWayResults, _Mapping]] = ..., irt: _Optional[_Union[IrtResults, _Mapping]] = ..., defence: _Optional[_Iterable[_Union[DefencePair, _Mapping]]] = ..., fast: _Optional[_Union[FastRank, _Mapping]] = ..., null_fields: _Optional[_Iterable[str]] = ..., empty_fields: _Optional[_Iterable[str]] = ...) -> None: ...
