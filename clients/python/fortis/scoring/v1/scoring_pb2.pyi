from fortis.common.v1 import common_pb2 as _common_pb2
from google.api import field_behavior_pb2 as _field_behavior_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CorrectnessMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CORRECTNESS_MODE_UNSPECIFIED: _ClassVar[CorrectnessMode]
    CORRECTNESS_MODE_TOP1: _ClassVar[CorrectnessMode]
    CORRECTNESS_MODE_TOPK: _ClassVar[CorrectnessMode]
    CORRECTNESS_MODE_THRESHOLD: _ClassVar[CorrectnessMode]

class AggregateMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AGGREGATE_MODE_UNSPECIFIED: _ClassVar[AggregateMode]
    AGGREGATE_MODE_ALL: _ClassVar[AggregateMode]
    AGGREGATE_MODE_AT_LEAST: _ClassVar[AggregateMode]

class AllAbsentPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ALL_ABSENT_POLICY_UNSPECIFIED: _ClassVar[AllAbsentPolicy]
    ALL_ABSENT_POLICY_CORRECT: _ClassVar[AllAbsentPolicy]
    ALL_ABSENT_POLICY_INCORRECT: _ClassVar[AllAbsentPolicy]

class BoxFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BOX_FORMAT_UNSPECIFIED: _ClassVar[BoxFormat]
    BOX_FORMAT_XYXY: _ClassVar[BoxFormat]
    BOX_FORMAT_XYWH: _ClassVar[BoxFormat]
    BOX_FORMAT_CXCYWH: _ClassVar[BoxFormat]
    BOX_FORMAT_XYXY_NORMALISED: _ClassVar[BoxFormat]
    BOX_FORMAT_XYWH_NORMALISED: _ClassVar[BoxFormat]
    BOX_FORMAT_CXCYWH_NORMALISED: _ClassVar[BoxFormat]

class SettingKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SETTING_KIND_UNSPECIFIED: _ClassVar[SettingKind]
    SETTING_KIND_CLEAN: _ClassVar[SettingKind]
    SETTING_KIND_CORRUPTION: _ClassVar[SettingKind]
    SETTING_KIND_TRANSFER_ATTACK: _ClassVar[SettingKind]
    SETTING_KIND_QUERY_ATTACK: _ClassVar[SettingKind]
    SETTING_KIND_DEGRADATION: _ClassVar[SettingKind]

class AttackScoring(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTACK_SCORING_UNSPECIFIED: _ClassVar[AttackScoring]
    ATTACK_SCORING_TRANSFER: _ClassVar[AttackScoring]
    ATTACK_SCORING_QUERY: _ClassVar[AttackScoring]

class InputKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INPUT_KIND_UNSPECIFIED: _ClassVar[InputKind]
    INPUT_KIND_ARRAY: _ClassVar[InputKind]
    INPUT_KIND_PARAM: _ClassVar[InputKind]
CORRECTNESS_MODE_UNSPECIFIED: CorrectnessMode
CORRECTNESS_MODE_TOP1: CorrectnessMode
CORRECTNESS_MODE_TOPK: CorrectnessMode
CORRECTNESS_MODE_THRESHOLD: CorrectnessMode
AGGREGATE_MODE_UNSPECIFIED: AggregateMode
AGGREGATE_MODE_ALL: AggregateMode
AGGREGATE_MODE_AT_LEAST: AggregateMode
ALL_ABSENT_POLICY_UNSPECIFIED: AllAbsentPolicy
ALL_ABSENT_POLICY_CORRECT: AllAbsentPolicy
ALL_ABSENT_POLICY_INCORRECT: AllAbsentPolicy
BOX_FORMAT_UNSPECIFIED: BoxFormat
BOX_FORMAT_XYXY: BoxFormat
BOX_FORMAT_XYWH: BoxFormat
BOX_FORMAT_CXCYWH: BoxFormat
BOX_FORMAT_XYXY_NORMALISED: BoxFormat
BOX_FORMAT_XYWH_NORMALISED: BoxFormat
BOX_FORMAT_CXCYWH_NORMALISED: BoxFormat
SETTING_KIND_UNSPECIFIED: SettingKind
SETTING_KIND_CLEAN: SettingKind
SETTING_KIND_CORRUPTION: SettingKind
SETTING_KIND_TRANSFER_ATTACK: SettingKind
SETTING_KIND_QUERY_ATTACK: SettingKind
SETTING_KIND_DEGRADATION: SettingKind
ATTACK_SCORING_UNSPECIFIED: AttackScoring
ATTACK_SCORING_TRANSFER: AttackScoring
ATTACK_SCORING_QUERY: AttackScoring
INPUT_KIND_UNSPECIFIED: InputKind
INPUT_KIND_ARRAY: InputKind
INPUT_KIND_PARAM: InputKind

class CorrectnessRule(_message.Message):
    __slots__ = ("mode", "k", "threshold")
    MODE_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    mode: CorrectnessMode
    k: int
    threshold: float
    def __init__(self, mode: _Optional[_Union[CorrectnessMode, str]] = ..., k: _Optional[int] = ..., threshold: _Optional[float] = ...) -> None: ...

class DetectionCriterion(_message.Message):
    __slots__ = ("mode", "k", "iou_threshold", "confidence_threshold", "aggregate", "q")
    MODE_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    IOU_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    Q_FIELD_NUMBER: _ClassVar[int]
    mode: CorrectnessMode
    k: int
    iou_threshold: float
    confidence_threshold: float
    aggregate: AggregateMode
    q: int
    def __init__(self, mode: _Optional[_Union[CorrectnessMode, str]] = ..., k: _Optional[int] = ..., iou_threshold: _Optional[float] = ..., confidence_threshold: _Optional[float] = ..., aggregate: _Optional[_Union[AggregateMode, str]] = ..., q: _Optional[int] = ...) -> None: ...

class SegmentationCriterion(_message.Message):
    __slots__ = ("classes", "miou_threshold", "ignore_label", "all_absent")
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    MIOU_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    IGNORE_LABEL_FIELD_NUMBER: _ClassVar[int]
    ALL_ABSENT_FIELD_NUMBER: _ClassVar[int]
    classes: _containers.RepeatedScalarFieldContainer[int]
    miou_threshold: float
    ignore_label: int
    all_absent: AllAbsentPolicy
    def __init__(self, classes: _Optional[_Iterable[int]] = ..., miou_threshold: _Optional[float] = ..., ignore_label: _Optional[int] = ..., all_absent: _Optional[_Union[AllAbsentPolicy, str]] = ...) -> None: ...

class LabelSet(_message.Message):
    __slots__ = ("labels",)
    LABELS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, labels: _Optional[_Iterable[int]] = ...) -> None: ...

class ClassificationTruth(_message.Message):
    __slots__ = ("labels",)
    LABELS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[LabelSet]
    def __init__(self, labels: _Optional[_Iterable[_Union[LabelSet, _Mapping]]] = ...) -> None: ...

class ImageBoxes(_message.Message):
    __slots__ = ("boxes", "labels", "box_format", "label_base", "width", "height")
    BOXES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    BOX_FORMAT_FIELD_NUMBER: _ClassVar[int]
    LABEL_BASE_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    boxes: _common_pb2.Tensor
    labels: _containers.RepeatedScalarFieldContainer[int]
    box_format: BoxFormat
    label_base: int
    width: int
    height: int
    def __init__(self, boxes: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., labels: _Optional[_Iterable[int]] = ..., box_format: _Optional[_Union[BoxFormat, str]] = ..., label_base: _Optional[int] = ..., width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class DetectionTruth(_message.Message):
    __slots__ = ("images",)
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    images: _containers.RepeatedCompositeFieldContainer[ImageBoxes]
    def __init__(self, images: _Optional[_Iterable[_Union[ImageBoxes, _Mapping]]] = ...) -> None: ...

class SegmentationTruth(_message.Message):
    __slots__ = ("class_maps",)
    CLASS_MAPS_FIELD_NUMBER: _ClassVar[int]
    class_maps: _common_pb2.Tensor
    def __init__(self, class_maps: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...

class RankingOptions(_message.Message):
    __slots__ = ("enabled", "reason", "num_classes")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NUM_CLASSES_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    reason: str
    num_classes: int
    def __init__(self, enabled: _Optional[bool] = ..., reason: _Optional[str] = ..., num_classes: _Optional[int] = ...) -> None: ...

class ScoringSetup(_message.Message):
    __slots__ = ("image_ids", "classification", "detection", "segmentation", "correctness", "detection_criterion", "segmentation_criterion", "ranking")
    IMAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    CLASSIFICATION_FIELD_NUMBER: _ClassVar[int]
    DETECTION_FIELD_NUMBER: _ClassVar[int]
    SEGMENTATION_FIELD_NUMBER: _ClassVar[int]
    CORRECTNESS_FIELD_NUMBER: _ClassVar[int]
    DETECTION_CRITERION_FIELD_NUMBER: _ClassVar[int]
    SEGMENTATION_CRITERION_FIELD_NUMBER: _ClassVar[int]
    RANKING_FIELD_NUMBER: _ClassVar[int]
    image_ids: _containers.RepeatedScalarFieldContainer[str]
    classification: ClassificationTruth
    detection: DetectionTruth
    segmentation: SegmentationTruth
    correctness: CorrectnessRule
    detection_criterion: DetectionCriterion
    segmentation_criterion: SegmentationCriterion
    ranking: RankingOptions
    def __init__(self, image_ids: _Optional[_Iterable[str]] = ..., classification: _Optional[_Union[ClassificationTruth, _Mapping]] = ..., detection: _Optional[_Union[DetectionTruth, _Mapping]] = ..., segmentation: _Optional[_Union[SegmentationTruth, _Mapping]] = ..., correctness: _Optional[_Union[CorrectnessRule, _Mapping]] = ..., detection_criterion: _Optional[_Union[DetectionCriterion, _Mapping]] = ..., segmentation_criterion: _Optional[_Union[SegmentationCriterion, _Mapping]] = ..., ranking: _Optional[_Union[RankingOptions, _Mapping]] = ...) -> None: ...

class ClassificationAnswers(_message.Message):
    __slots__ = ("labels", "scores")
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    labels: _common_pb2.Tensor
    scores: _common_pb2.Tensor
    def __init__(self, labels: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., scores: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...

class DetectionAnswers(_message.Message):
    __slots__ = ("boxes", "labels", "scores", "counts")
    BOXES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    boxes: _common_pb2.Tensor
    labels: _common_pb2.Tensor
    scores: _common_pb2.Tensor
    counts: _common_pb2.Tensor
    def __init__(self, boxes: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., labels: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., scores: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., counts: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...

class SegmentationAnswers(_message.Message):
    __slots__ = ("class_maps",)
    CLASS_MAPS_FIELD_NUMBER: _ClassVar[int]
    class_maps: _common_pb2.Tensor
    def __init__(self, class_maps: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...

class QueryAttackOutcomes(_message.Message):
    __slots__ = ("success", "queries", "query_budget")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    QUERY_BUDGET_FIELD_NUMBER: _ClassVar[int]
    success: _containers.RepeatedScalarFieldContainer[bool]
    queries: _containers.RepeatedScalarFieldContainer[int]
    query_budget: int
    def __init__(self, success: _Optional[_Iterable[bool]] = ..., queries: _Optional[_Iterable[int]] = ..., query_budget: _Optional[int] = ...) -> None: ...

class PerturbationSizes(_message.Message):
    __slots__ = ("linf", "l2")
    LINF_FIELD_NUMBER: _ClassVar[int]
    L2_FIELD_NUMBER: _ClassVar[int]
    linf: _containers.RepeatedScalarFieldContainer[float]
    l2: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, linf: _Optional[_Iterable[float]] = ..., l2: _Optional[_Iterable[float]] = ...) -> None: ...

class SettingAnswers(_message.Message):
    __slots__ = ("kind", "name", "level", "image_index", "errors", "classification", "detection", "segmentation", "query_attack", "sizes", "fraction_of_pixels_changed", "excluded", "excluded_reason")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    IMAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    CLASSIFICATION_FIELD_NUMBER: _ClassVar[int]
    DETECTION_FIELD_NUMBER: _ClassVar[int]
    SEGMENTATION_FIELD_NUMBER: _ClassVar[int]
    QUERY_ATTACK_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    FRACTION_OF_PIXELS_CHANGED_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_REASON_FIELD_NUMBER: _ClassVar[int]
    kind: SettingKind
    name: str
    level: int
    image_index: _containers.RepeatedScalarFieldContainer[int]
    errors: _containers.RepeatedScalarFieldContainer[str]
    classification: ClassificationAnswers
    detection: DetectionAnswers
    segmentation: SegmentationAnswers
    query_attack: QueryAttackOutcomes
    sizes: PerturbationSizes
    fraction_of_pixels_changed: float
    excluded: _containers.RepeatedScalarFieldContainer[bool]
    excluded_reason: str
    def __init__(self, kind: _Optional[_Union[SettingKind, str]] = ..., name: _Optional[str] = ..., level: _Optional[int] = ..., image_index: _Optional[_Iterable[int]] = ..., errors: _Optional[_Iterable[str]] = ..., classification: _Optional[_Union[ClassificationAnswers, _Mapping]] = ..., detection: _Optional[_Union[DetectionAnswers, _Mapping]] = ..., segmentation: _Optional[_Union[SegmentationAnswers, _Mapping]] = ..., query_attack: _Optional[_Union[QueryAttackOutcomes, _Mapping]] = ..., sizes: _Optional[_Union[PerturbationSizes, _Mapping]] = ..., fraction_of_pixels_changed: _Optional[float] = ..., excluded: _Optional[_Iterable[bool]] = ..., excluded_reason: _Optional[str] = ...) -> None: ...

class ScoreEvaluationRequest(_message.Message):
    __slots__ = ("setup", "setting")
    SETUP_FIELD_NUMBER: _ClassVar[int]
    SETTING_FIELD_NUMBER: _ClassVar[int]
    setup: ScoringSetup
    setting: SettingAnswers
    def __init__(self, setup: _Optional[_Union[ScoringSetup, _Mapping]] = ..., setting: _Optional[_Union[SettingAnswers, _Mapping]] = ...) -> None: ...

class Rate(_message.Message):
    __slots__ = ("value", "ci95_low", "ci95_high", "m", "correct")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    CI95_LOW_FIELD_NUMBER: _ClassVar[int]
    CI95_HIGH_FIELD_NUMBER: _ClassVar[int]
    M_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    value: float
    ci95_low: float
    ci95_high: float
    m: int
    correct: int
    def __init__(self, value: _Optional[float] = ..., ci95_low: _Optional[float] = ..., ci95_high: _Optional[float] = ..., m: _Optional[int] = ..., correct: _Optional[int] = ...) -> None: ...

class Average(_message.Message):
    __slots__ = ("value", "n", "m", "definition")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    M_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_FIELD_NUMBER: _ClassVar[int]
    value: float
    n: int
    m: int
    definition: str
    def __init__(self, value: _Optional[float] = ..., n: _Optional[int] = ..., m: _Optional[int] = ..., definition: _Optional[str] = ...) -> None: ...

class SeverityRobustness(_message.Message):
    __slots__ = ("severity", "robustness")
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    ROBUSTNESS_FIELD_NUMBER: _ClassVar[int]
    severity: int
    robustness: Rate
    def __init__(self, severity: _Optional[int] = ..., robustness: _Optional[_Union[Rate, _Mapping]] = ...) -> None: ...

class CorruptionMetrics(_message.Message):
    __slots__ = ("name", "severities", "mean_robustness")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SEVERITIES_FIELD_NUMBER: _ClassVar[int]
    MEAN_ROBUSTNESS_FIELD_NUMBER: _ClassVar[int]
    name: str
    severities: _containers.RepeatedCompositeFieldContainer[SeverityRobustness]
    mean_robustness: float
    def __init__(self, name: _Optional[str] = ..., severities: _Optional[_Iterable[_Union[SeverityRobustness, _Mapping]]] = ..., mean_robustness: _Optional[float] = ...) -> None: ...

class SeveritySummary(_message.Message):
    __slots__ = ("severity", "average", "worst_case", "n_settings")
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    AVERAGE_FIELD_NUMBER: _ClassVar[int]
    WORST_CASE_FIELD_NUMBER: _ClassVar[int]
    N_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    severity: int
    average: Average
    worst_case: Rate
    n_settings: int
    def __init__(self, severity: _Optional[int] = ..., average: _Optional[_Union[Average, _Mapping]] = ..., worst_case: _Optional[_Union[Rate, _Mapping]] = ..., n_settings: _Optional[int] = ...) -> None: ...

class WorstCase(_message.Message):
    __slots__ = ("rate", "n_settings", "over")
    RATE_FIELD_NUMBER: _ClassVar[int]
    N_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    OVER_FIELD_NUMBER: _ClassVar[int]
    rate: Rate
    n_settings: int
    over: str
    def __init__(self, rate: _Optional[_Union[Rate, _Mapping]] = ..., n_settings: _Optional[int] = ..., over: _Optional[str] = ...) -> None: ...

class AttackMetrics(_message.Message):
    __slots__ = ("name", "kind", "robustness_adv", "success", "mean_queries", "median_queries", "mean_queries_successful", "query_budget", "errors", "error_images", "clean_mismatches", "mean_linf", "max_linf", "mean_l2", "mean_l2_successful", "median_l2_successful", "success_by_queries", "fooling_rate", "fooling_threshold", "never_fooled", "excluded", "excluded_reason", "unsuccessful_mean_l2", "unsuccessful_max_linf")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ROBUSTNESS_ADV_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MEAN_QUERIES_FIELD_NUMBER: _ClassVar[int]
    MEDIAN_QUERIES_FIELD_NUMBER: _ClassVar[int]
    MEAN_QUERIES_SUCCESSFUL_FIELD_NUMBER: _ClassVar[int]
    QUERY_BUDGET_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    ERROR_IMAGES_FIELD_NUMBER: _ClassVar[int]
    CLEAN_MISMATCHES_FIELD_NUMBER: _ClassVar[int]
    MEAN_LINF_FIELD_NUMBER: _ClassVar[int]
    MAX_LINF_FIELD_NUMBER: _ClassVar[int]
    MEAN_L2_FIELD_NUMBER: _ClassVar[int]
    MEAN_L2_SUCCESSFUL_FIELD_NUMBER: _ClassVar[int]
    MEDIAN_L2_SUCCESSFUL_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_BY_QUERIES_FIELD_NUMBER: _ClassVar[int]
    FOOLING_RATE_FIELD_NUMBER: _ClassVar[int]
    FOOLING_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    NEVER_FOOLED_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_REASON_FIELD_NUMBER: _ClassVar[int]
    UNSUCCESSFUL_MEAN_L2_FIELD_NUMBER: _ClassVar[int]
    UNSUCCESSFUL_MAX_LINF_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: AttackScoring
    robustness_adv: Rate
    success: Rate
    mean_queries: float
    median_queries: float
    mean_queries_successful: float
    query_budget: int
    errors: int
    error_images: _containers.RepeatedScalarFieldContainer[str]
    clean_mismatches: int
    mean_linf: float
    max_linf: float
    mean_l2: float
    mean_l2_successful: float
    median_l2_successful: float
    success_by_queries: _containers.RepeatedCompositeFieldContainer[QueryCurvePoint]
    fooling_rate: float
    fooling_threshold: float
    never_fooled: float
    excluded: int
    excluded_reason: str
    unsuccessful_mean_l2: float
    unsuccessful_max_linf: float
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[AttackScoring, str]] = ..., robustness_adv: _Optional[_Union[Rate, _Mapping]] = ..., success: _Optional[_Union[Rate, _Mapping]] = ..., mean_queries: _Optional[float] = ..., median_queries: _Optional[float] = ..., mean_queries_successful: _Optional[float] = ..., query_budget: _Optional[int] = ..., errors: _Optional[int] = ..., error_images: _Optional[_Iterable[str]] = ..., clean_mismatches: _Optional[int] = ..., mean_linf: _Optional[float] = ..., max_linf: _Optional[float] = ..., mean_l2: _Optional[float] = ..., mean_l2_successful: _Optional[float] = ..., median_l2_successful: _Optional[float] = ..., success_by_queries: _Optional[_Iterable[_Union[QueryCurvePoint, _Mapping]]] = ..., fooling_rate: _Optional[float] = ..., fooling_threshold: _Optional[float] = ..., never_fooled: _Optional[float] = ..., excluded: _Optional[int] = ..., excluded_reason: _Optional[str] = ..., unsuccessful_mean_l2: _Optional[float] = ..., unsuccessful_max_linf: _Optional[float] = ...) -> None: ...

class QueryCurvePoint(_message.Message):
    __slots__ = ("queries", "success_rate")
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_RATE_FIELD_NUMBER: _ClassVar[int]
    queries: int
    success_rate: float
    def __init__(self, queries: _Optional[int] = ..., success_rate: _Optional[float] = ...) -> None: ...

class IeeeMetrics(_message.Message):
    __slots__ = ("m", "accuracy", "corruptions", "average_robustness_corr", "worstcase_robustness_corr", "by_severity", "attacks", "average_robustness_adv", "m_per_attack", "worstcase_robustness_adv")
    class MPerAttackEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    M_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    CORRUPTIONS_FIELD_NUMBER: _ClassVar[int]
    AVERAGE_ROBUSTNESS_CORR_FIELD_NUMBER: _ClassVar[int]
    WORSTCASE_ROBUSTNESS_CORR_FIELD_NUMBER: _ClassVar[int]
    BY_SEVERITY_FIELD_NUMBER: _ClassVar[int]
    ATTACKS_FIELD_NUMBER: _ClassVar[int]
    AVERAGE_ROBUSTNESS_ADV_FIELD_NUMBER: _ClassVar[int]
    M_PER_ATTACK_FIELD_NUMBER: _ClassVar[int]
    WORSTCASE_ROBUSTNESS_ADV_FIELD_NUMBER: _ClassVar[int]
    m: int
    accuracy: Rate
    corruptions: _containers.RepeatedCompositeFieldContainer[CorruptionMetrics]
    average_robustness_corr: Average
    worstcase_robustness_corr: WorstCase
    by_severity: _containers.RepeatedCompositeFieldContainer[SeveritySummary]
    attacks: _containers.RepeatedCompositeFieldContainer[AttackMetrics]
    average_robustness_adv: Average
    m_per_attack: _containers.ScalarMap[str, int]
    worstcase_robustness_adv: WorstCase
    def __init__(self, m: _Optional[int] = ..., accuracy: _Optional[_Union[Rate, _Mapping]] = ..., corruptions: _Optional[_Iterable[_Union[CorruptionMetrics, _Mapping]]] = ..., average_robustness_corr: _Optional[_Union[Average, _Mapping]] = ..., worstcase_robustness_corr: _Optional[_Union[WorstCase, _Mapping]] = ..., by_severity: _Optional[_Iterable[_Union[SeveritySummary, _Mapping]]] = ..., attacks: _Optional[_Iterable[_Union[AttackMetrics, _Mapping]]] = ..., average_robustness_adv: _Optional[_Union[Average, _Mapping]] = ..., m_per_attack: _Optional[_Mapping[str, int]] = ..., worstcase_robustness_adv: _Optional[_Union[WorstCase, _Mapping]] = ...) -> None: ...

class SettingRanking(_message.Message):
    __slots__ = ("name", "kind", "m", "ndcg_1", "ndcg_at", "drr", "drr_n", "applicable")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    M_FIELD_NUMBER: _ClassVar[int]
    NDCG_1_FIELD_NUMBER: _ClassVar[int]
    NDCG_AT_FIELD_NUMBER: _ClassVar[int]
    DRR_FIELD_NUMBER: _ClassVar[int]
    DRR_N_FIELD_NUMBER: _ClassVar[int]
    APPLICABLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: SettingKind
    m: int
    ndcg_1: float
    ndcg_at: _containers.RepeatedScalarFieldContainer[float]
    drr: float
    drr_n: int
    applicable: bool
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[SettingKind, str]] = ..., m: _Optional[int] = ..., ndcg_1: _Optional[float] = ..., ndcg_at: _Optional[_Iterable[float]] = ..., drr: _Optional[float] = ..., drr_n: _Optional[int] = ..., applicable: _Optional[bool] = ...) -> None: ...

class Ranking(_message.Message):
    __slots__ = ("applicable", "reason", "gamma_b", "gamma_a", "drr_k", "settings")
    APPLICABLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GAMMA_B_FIELD_NUMBER: _ClassVar[int]
    GAMMA_A_FIELD_NUMBER: _ClassVar[int]
    DRR_K_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    applicable: bool
    reason: str
    gamma_b: float
    gamma_a: float
    drr_k: int
    settings: _containers.RepeatedCompositeFieldContainer[SettingRanking]
    def __init__(self, applicable: _Optional[bool] = ..., reason: _Optional[str] = ..., gamma_b: _Optional[float] = ..., gamma_a: _Optional[float] = ..., drr_k: _Optional[int] = ..., settings: _Optional[_Iterable[_Union[SettingRanking, _Mapping]]] = ...) -> None: ...

class ProfilePoint(_message.Message):
    __slots__ = ("level", "value", "ci95_low", "ci95_high", "n", "correct", "at_least", "censored", "missing", "reason")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    CI95_LOW_FIELD_NUMBER: _ClassVar[int]
    CI95_HIGH_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    AT_LEAST_FIELD_NUMBER: _ClassVar[int]
    CENSORED_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    level: int
    value: float
    ci95_low: float
    ci95_high: float
    n: int
    correct: int
    at_least: float
    censored: int
    missing: int
    reason: str
    def __init__(self, level: _Optional[int] = ..., value: _Optional[float] = ..., ci95_low: _Optional[float] = ..., ci95_high: _Optional[float] = ..., n: _Optional[int] = ..., correct: _Optional[int] = ..., at_least: _Optional[float] = ..., censored: _Optional[int] = ..., missing: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class FailurePoint(_message.Message):
    __slots__ = ("threshold", "reached", "level", "accuracy", "ci95_low", "ci95_high", "fraction_of_pixels_changed", "example_image")
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    REACHED_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    CI95_LOW_FIELD_NUMBER: _ClassVar[int]
    CI95_HIGH_FIELD_NUMBER: _ClassVar[int]
    FRACTION_OF_PIXELS_CHANGED_FIELD_NUMBER: _ClassVar[int]
    EXAMPLE_IMAGE_FIELD_NUMBER: _ClassVar[int]
    threshold: float
    reached: bool
    level: int
    accuracy: float
    ci95_low: float
    ci95_high: float
    fraction_of_pixels_changed: float
    example_image: str
    def __init__(self, threshold: _Optional[float] = ..., reached: _Optional[bool] = ..., level: _Optional[int] = ..., accuracy: _Optional[float] = ..., ci95_low: _Optional[float] = ..., ci95_high: _Optional[float] = ..., fraction_of_pixels_changed: _Optional[float] = ..., example_image: _Optional[str] = ...) -> None: ...

class DegradationProfile(_message.Message):
    __slots__ = ("name", "m", "m_used", "applicable", "reason", "accuracy", "rank", "probability", "failure_points", "fraction_of_pixels_changed")
    class FractionOfPixelsChangedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    M_FIELD_NUMBER: _ClassVar[int]
    M_USED_FIELD_NUMBER: _ClassVar[int]
    APPLICABLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    FAILURE_POINTS_FIELD_NUMBER: _ClassVar[int]
    FRACTION_OF_PIXELS_CHANGED_FIELD_NUMBER: _ClassVar[int]
    name: str
    m: int
    m_used: int
    applicable: bool
    reason: str
    accuracy: _containers.RepeatedCompositeFieldContainer[ProfilePoint]
    rank: _containers.RepeatedCompositeFieldContainer[ProfilePoint]
    probability: _containers.RepeatedCompositeFieldContainer[ProfilePoint]
    failure_points: _containers.RepeatedCompositeFieldContainer[FailurePoint]
    fraction_of_pixels_changed: _containers.ScalarMap[int, float]
    def __init__(self, name: _Optional[str] = ..., m: _Optional[int] = ..., m_used: _Optional[int] = ..., applicable: _Optional[bool] = ..., reason: _Optional[str] = ..., accuracy: _Optional[_Iterable[_Union[ProfilePoint, _Mapping]]] = ..., rank: _Optional[_Iterable[_Union[ProfilePoint, _Mapping]]] = ..., probability: _Optional[_Iterable[_Union[ProfilePoint, _Mapping]]] = ..., failure_points: _Optional[_Iterable[_Union[FailurePoint, _Mapping]]] = ..., fraction_of_pixels_changed: _Optional[_Mapping[int, float]] = ...) -> None: ...

class SettingErrors(_message.Message):
    __slots__ = ("name", "errors", "of", "examples")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    OF_FIELD_NUMBER: _ClassVar[int]
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    name: str
    errors: int
    of: int
    examples: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., errors: _Optional[int] = ..., of: _Optional[int] = ..., examples: _Optional[_Iterable[str]] = ...) -> None: ...

class QueryErrors(_message.Message):
    __slots__ = ("total", "settings")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    total: int
    settings: _containers.RepeatedCompositeFieldContainer[SettingErrors]
    def __init__(self, total: _Optional[int] = ..., settings: _Optional[_Iterable[_Union[SettingErrors, _Mapping]]] = ...) -> None: ...

class ScoreEvaluationResponse(_message.Message):
    __slots__ = ("ieee", "ranking", "degradation", "query_errors", "verdicts")
    IEEE_FIELD_NUMBER: _ClassVar[int]
    RANKING_FIELD_NUMBER: _ClassVar[int]
    DEGRADATION_FIELD_NUMBER: _ClassVar[int]
    QUERY_ERRORS_FIELD_NUMBER: _ClassVar[int]
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    ieee: IeeeMetrics
    ranking: Ranking
    degradation: _containers.RepeatedCompositeFieldContainer[DegradationProfile]
    query_errors: QueryErrors
    verdicts: _containers.RepeatedCompositeFieldContainer[SettingVerdicts]
    def __init__(self, ieee: _Optional[_Union[IeeeMetrics, _Mapping]] = ..., ranking: _Optional[_Union[Ranking, _Mapping]] = ..., degradation: _Optional[_Iterable[_Union[DegradationProfile, _Mapping]]] = ..., query_errors: _Optional[_Union[QueryErrors, _Mapping]] = ..., verdicts: _Optional[_Iterable[_Union[SettingVerdicts, _Mapping]]] = ...) -> None: ...

class SettingVerdicts(_message.Message):
    __slots__ = ("kind", "name", "level", "count", "correct")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    kind: SettingKind
    name: str
    level: int
    count: int
    correct: bytes
    def __init__(self, kind: _Optional[_Union[SettingKind, str]] = ..., name: _Optional[str] = ..., level: _Optional[int] = ..., count: _Optional[int] = ..., correct: _Optional[bytes] = ...) -> None: ...

class MetricInput(_message.Message):
    __slots__ = ("name", "kind", "description", "required")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: InputKind
    description: str
    required: bool
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[InputKind, str]] = ..., description: _Optional[str] = ..., required: _Optional[bool] = ...) -> None: ...

class MetricInfo(_message.Message):
    __slots__ = ("id", "refs", "description", "inputs")
    ID_FIELD_NUMBER: _ClassVar[int]
    REFS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    refs: _containers.RepeatedScalarFieldContainer[str]
    description: str
    inputs: _containers.RepeatedCompositeFieldContainer[MetricInput]
    def __init__(self, id: _Optional[str] = ..., refs: _Optional[_Iterable[str]] = ..., description: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[MetricInput, _Mapping]]] = ...) -> None: ...

class ListMetricsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListMetricsResponse(_message.Message):
    __slots__ = ("metrics", "next_page_token")
    METRICS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    metrics: _containers.RepeatedCompositeFieldContainer[MetricInfo]
    next_page_token: str
    def __init__(self, metrics: _Optional[_Iterable[_Union[MetricInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ComputeRequest(_message.Message):
    __slots__ = ("metric", "arrays", "params")
    class ArraysEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _common_pb2.Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...
    METRIC_FIELD_NUMBER: _ClassVar[int]
    ARRAYS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    metric: str
    arrays: _containers.MessageMap[str, _common_pb2.Tensor]
    params: _struct_pb2.Struct
    def __init__(self, metric: _Optional[str] = ..., arrays: _Optional[_Mapping[str, _common_pb2.Tensor]] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class ComputeResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: _struct_pb2.Struct
    def __init__(self, result: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...
