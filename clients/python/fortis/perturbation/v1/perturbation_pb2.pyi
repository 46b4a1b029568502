from fortis.common.v1 import common_pb2 as _common_pb2
from google.api import field_behavior_pb2 as _field_behavior_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.rpc import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PerturbationKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PERTURBATION_KIND_UNSPECIFIED: _ClassVar[PerturbationKind]
    PERTURBATION_KIND_CORRUPTION: _ClassVar[PerturbationKind]
    PERTURBATION_KIND_STYLE: _ClassVar[PerturbationKind]
    PERTURBATION_KIND_DEGRADATION: _ClassVar[PerturbationKind]
    PERTURBATION_KIND_PROPERTY: _ClassVar[PerturbationKind]

class LevelKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEVEL_KIND_UNSPECIFIED: _ClassVar[LevelKind]
    LEVEL_KIND_SEVERITY: _ClassVar[LevelKind]
    LEVEL_KIND_LEVEL: _ClassVar[LevelKind]
    LEVEL_KIND_EPSILON: _ClassVar[LevelKind]

class Scope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCOPE_UNSPECIFIED: _ClassVar[Scope]
    SCOPE_GLOBAL: _ClassVar[Scope]
    SCOPE_LOCAL: _ClassVar[Scope]

class Randomness(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RANDOMNESS_UNSPECIFIED: _ClassVar[Randomness]
    RANDOMNESS_DETERMINISTIC: _ClassVar[Randomness]
    RANDOMNESS_STOCHASTIC: _ClassVar[Randomness]

class Domain(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DOMAIN_UNSPECIFIED: _ClassVar[Domain]
    DOMAIN_COLOUR: _ClassVar[Domain]
    DOMAIN_PIXEL: _ClassVar[Domain]

class ParameterType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PARAMETER_TYPE_UNSPECIFIED: _ClassVar[ParameterType]
    PARAMETER_TYPE_FLOAT: _ClassVar[ParameterType]
    PARAMETER_TYPE_INT: _ClassVar[ParameterType]
    PARAMETER_TYPE_BOOL: _ClassVar[ParameterType]
    PARAMETER_TYPE_STRING: _ClassVar[ParameterType]

class AttackKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTACK_KIND_UNSPECIFIED: _ClassVar[AttackKind]
    ATTACK_KIND_TRANSFER: _ClassVar[AttackKind]
    ATTACK_KIND_SCORE: _ClassVar[AttackKind]
    ATTACK_KIND_DECISION: _ClassVar[AttackKind]

class Norm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NORM_UNSPECIFIED: _ClassVar[Norm]
    NORM_L0: _ClassVar[Norm]
    NORM_L2: _ClassVar[Norm]
    NORM_LINF: _ClassVar[Norm]
    NORM_L1: _ClassVar[Norm]
    NORM_SPATIAL: _ClassVar[Norm]

class ImageEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IMAGE_ENCODING_UNSPECIFIED: _ClassVar[ImageEncoding]
    IMAGE_ENCODING_PNG: _ClassVar[ImageEncoding]

class CriterionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CRITERION_KIND_UNSPECIFIED: _ClassVar[CriterionKind]
    CRITERION_KIND_MISCLASSIFICATION: _ClassVar[CriterionKind]
    CRITERION_KIND_TARGETED_MISCLASSIFICATION: _ClassVar[CriterionKind]
    CRITERION_KIND_CONFIDENT_MISCLASSIFICATION: _ClassVar[CriterionKind]
    CRITERION_KIND_TOP_K_MISCLASSIFICATION: _ClassVar[CriterionKind]
    CRITERION_KIND_ORIGINAL_CLASS_PROBABILITY: _ClassVar[CriterionKind]
    CRITERION_KIND_TARGET_CLASS_PROB_BOOST: _ClassVar[CriterionKind]
    CRITERION_KIND_OBJECT_MISSED: _ClassVar[CriterionKind]
    CRITERION_KIND_OBJECT_RELABELLED: _ClassVar[CriterionKind]
    CRITERION_KIND_MIOU_BELOW: _ClassVar[CriterionKind]

class ModelFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_FORMAT_UNSPECIFIED: _ClassVar[ModelFormat]
    MODEL_FORMAT_TORCHSCRIPT: _ClassVar[ModelFormat]
    MODEL_FORMAT_ONNX: _ClassVar[ModelFormat]

class SurrogateMaskKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SURROGATE_MASK_KIND_UNSPECIFIED: _ClassVar[SurrogateMaskKind]
    SURROGATE_MASK_KIND_CLASS_LOGITS: _ClassVar[SurrogateMaskKind]
    SURROGATE_MASK_KIND_FOREGROUND_PROBABILITY: _ClassVar[SurrogateMaskKind]
    SURROGATE_MASK_KIND_FOREGROUND_LOGIT: _ClassVar[SurrogateMaskKind]

class StopReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_REASON_UNSPECIFIED: _ClassVar[StopReason]
    STOP_REASON_SUCCESS: _ClassVar[StopReason]
    STOP_REASON_BUDGET: _ClassVar[StopReason]
    STOP_REASON_ALREADY_MISCLASSIFIED: _ClassVar[StopReason]
    STOP_REASON_BUDGET_EXHAUSTED_BY_PROXY: _ClassVar[StopReason]
    STOP_REASON_ITERATIONS: _ClassVar[StopReason]
PERTURBATION_KIND_UNSPECIFIED: PerturbationKind
PERTURBATION_KIND_CORRUPTION: PerturbationKind
PERTURBATION_KIND_STYLE: PerturbationKind
PERTURBATION_KIND_DEGRADATION: PerturbationKind
PERTURBATION_KIND_PROPERTY: PerturbationKind
LEVEL_KIND_UNSPECIFIED: LevelKind
LEVEL_KIND_SEVERITY: LevelKind
LEVEL_KIND_LEVEL: LevelKind
LEVEL_KIND_EPSILON: LevelKind
SCOPE_UNSPECIFIED: Scope
SCOPE_GLOBAL: Scope
SCOPE_LOCAL: Scope
RANDOMNESS_UNSPECIFIED: Randomness
RANDOMNESS_DETERMINISTIC: Randomness
RANDOMNESS_STOCHASTIC: Randomness
DOMAIN_UNSPECIFIED: Domain
DOMAIN_COLOUR: Domain
DOMAIN_PIXEL: Domain
PARAMETER_TYPE_UNSPECIFIED: ParameterType
PARAMETER_TYPE_FLOAT: ParameterType
PARAMETER_TYPE_INT: ParameterType
PARAMETER_TYPE_BOOL: ParameterType
PARAMETER_TYPE_STRING: ParameterType
ATTACK_KIND_UNSPECIFIED: AttackKind
ATTACK_KIND_TRANSFER: AttackKind
ATTACK_KIND_SCORE: AttackKind
ATTACK_KIND_DECISION: AttackKind
NORM_UNSPECIFIED: Norm
NORM_L0: Norm
NORM_L2: Norm
NORM_LINF: Norm
NORM_L1: Norm
NORM_SPATIAL: Norm
IMAGE_ENCODING_UNSPECIFIED: ImageEncoding
IMAGE_ENCODING_PNG: ImageEncoding
CRITERION_KIND_UNSPECIFIED: CriterionKind
CRITERION_KIND_MISCLASSIFICATION: CriterionKind
CRITERION_KIND_TARGETED_MISCLASSIFICATION: CriterionKind
CRITERION_KIND_CONFIDENT_MISCLASSIFICATION: CriterionKind
CRITERION_KIND_TOP_K_MISCLASSIFICATION: CriterionKind
CRITERION_KIND_ORIGINAL_CLASS_PROBABILITY: CriterionKind
CRITERION_KIND_TARGET_CLASS_PROB_BOOST: CriterionKind
CRITERION_KIND_OBJECT_MISSED: CriterionKind
CRITERION_KIND_OBJECT_RELABELLED: CriterionKind
CRITERION_KIND_MIOU_BELOW: CriterionKind
MODEL_FORMAT_UNSPECIFIED: ModelFormat
MODEL_FORMAT_TORCHSCRIPT: ModelFormat
MODEL_FORMAT_ONNX: ModelFormat
SURROGATE_MASK_KIND_UNSPECIFIED: SurrogateMaskKind
SURROGATE_MASK_KIND_CLASS_LOGITS: SurrogateMaskKind
SURROGATE_MASK_KIND_FOREGROUND_PROBABILITY: SurrogateMaskKind
SURROGATE_MASK_KIND_FOREGROUND_LOGIT: SurrogateMaskKind
STOP_REASON_UNSPECIFIED: StopReason
STOP_REASON_SUCCESS: StopReason
STOP_REASON_BUDGET: StopReason
STOP_REASON_ALREADY_MISCLASSIFIED: StopReason
STOP_REASON_BUDGET_EXHAUSTED_BY_PROXY: StopReason
STOP_REASON_ITERATIONS: StopReason

class Characterisation(_message.Message):
    __slots__ = ("scope", "randomness", "domain")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    RANDOMNESS_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    scope: Scope
    randomness: Randomness
    domain: Domain
    def __init__(self, scope: _Optional[_Union[Scope, str]] = ..., randomness: _Optional[_Union[Randomness, str]] = ..., domain: _Optional[_Union[Domain, str]] = ...) -> None: ...

class ParameterValue(_message.Message):
    __slots__ = ("number", "integer", "flag", "text")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    INTEGER_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    number: float
    integer: int
    flag: bool
    text: str
    def __init__(self, number: _Optional[float] = ..., integer: _Optional[int] = ..., flag: _Optional[bool] = ..., text: _Optional[str] = ...) -> None: ...

class ParameterSpec(_message.Message):
    __slots__ = ("name", "description", "type", "default_value", "minimum", "maximum", "choices", "required", "one_of")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_VALUE_FIELD_NUMBER: _ClassVar[int]
    MINIMUM_FIELD_NUMBER: _ClassVar[int]
    MAXIMUM_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    ONE_OF_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    type: ParameterType
    default_value: ParameterValue
    minimum: float
    maximum: float
    choices: _containers.RepeatedScalarFieldContainer[str]
    required: bool
    one_of: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., type: _Optional[_Union[ParameterType, str]] = ..., default_value: _Optional[_Union[ParameterValue, _Mapping]] = ..., minimum: _Optional[float] = ..., maximum: _Optional[float] = ..., choices: _Optional[_Iterable[str]] = ..., required: _Optional[bool] = ..., one_of: _Optional[str] = ...) -> None: ...

class NumberList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class NamedValue(_message.Message):
    __slots__ = ("name", "number", "text", "numbers", "integer", "flag")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    NUMBERS_FIELD_NUMBER: _ClassVar[int]
    INTEGER_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    name: str
    number: float
    text: str
    numbers: NumberList
    integer: int
    flag: bool
    def __init__(self, name: _Optional[str] = ..., number: _Optional[float] = ..., text: _Optional[str] = ..., numbers: _Optional[_Union[NumberList, _Mapping]] = ..., integer: _Optional[int] = ..., flag: _Optional[bool] = ...) -> None: ...

class LevelParameters(_message.Message):
    __slots__ = ("level", "values")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    level: int
    values: _containers.RepeatedCompositeFieldContainer[NamedValue]
    def __init__(self, level: _Optional[int] = ..., values: _Optional[_Iterable[_Union[NamedValue, _Mapping]]] = ...) -> None: ...

class PerturbationInfo(_message.Message):
    __slots__ = ("id", "kind", "family", "ieee_ref", "description", "stochastic", "severities", "parameters", "refs", "level_kind", "levels", "characterisation", "needs_model", "level_table_doc", "level_table")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    IEEE_REF_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    STOCHASTIC_FIELD_NUMBER: _ClassVar[int]
    SEVERITIES_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    REFS_FIELD_NUMBER: _ClassVar[int]
    LEVEL_KIND_FIELD_NUMBER: _ClassVar[int]
    LEVELS_FIELD_NUMBER: _ClassVar[int]
    CHARACTERISATION_FIELD_NUMBER: _ClassVar[int]
    NEEDS_MODEL_FIELD_NUMBER: _ClassVar[int]
    LEVEL_TABLE_DOC_FIELD_NUMBER: _ClassVar[int]
    LEVEL_TABLE_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: PerturbationKind
    family: str
    ieee_ref: str
    description: str
    stochastic: bool
    severities: _containers.RepeatedScalarFieldContainer[int]
    parameters: _containers.RepeatedCompositeFieldContainer[ParameterSpec]
    refs: _containers.RepeatedScalarFieldContainer[str]
    level_kind: LevelKind
    levels: _containers.RepeatedScalarFieldContainer[int]
    characterisation: Characterisation
    needs_model: bool
    level_table_doc: str
    level_table: _containers.RepeatedCompositeFieldContainer[LevelParameters]
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[_Union[PerturbationKind, str]] = ..., family: _Optional[str] = ..., ieee_ref: _Optional[str] = ..., description: _Optional[str] = ..., stochastic: _Optional[bool] = ..., severities: _Optional[_Iterable[int]] = ..., parameters: _Optional[_Iterable[_Union[ParameterSpec, _Mapping]]] = ..., refs: _Optional[_Iterable[str]] = ..., level_kind: _Optional[_Union[LevelKind, str]] = ..., levels: _Optional[_Iterable[int]] = ..., characterisation: _Optional[_Union[Characterisation, _Mapping]] = ..., needs_model: _Optional[bool] = ..., level_table_doc: _Optional[str] = ..., level_table: _Optional[_Iterable[_Union[LevelParameters, _Mapping]]] = ...) -> None: ...

class ListPerturbationsRequest(_message.Message):
    __slots__ = ("kind", "page_size", "page_token")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    kind: PerturbationKind
    page_size: int
    page_token: str
    def __init__(self, kind: _Optional[_Union[PerturbationKind, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListPerturbationsResponse(_message.Message):
    __slots__ = ("perturbations", "next_page_token")
    PERTURBATIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    perturbations: _containers.RepeatedCompositeFieldContainer[PerturbationInfo]
    next_page_token: str
    def __init__(self, perturbations: _Optional[_Iterable[_Union[PerturbationInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class AttackInfo(_message.Message):
    __slots__ = ("id", "kind", "family", "norms", "targeted", "untargeted", "parameters", "refs", "description", "needs_surrogate", "stochastic", "tasks", "uses_surrogate", "minimal_norm")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    NORMS_FIELD_NUMBER: _ClassVar[int]
    TARGETED_FIELD_NUMBER: _ClassVar[int]
    UNTARGETED_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    REFS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    NEEDS_SURROGATE_FIELD_NUMBER: _ClassVar[int]
    STOCHASTIC_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    USES_SURROGATE_FIELD_NUMBER: _ClassVar[int]
    MINIMAL_NORM_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: AttackKind
    family: str
    norms: _containers.RepeatedScalarFieldContainer[Norm]
    targeted: bool
    untargeted: bool
    parameters: _containers.RepeatedCompositeFieldContainer[ParameterSpec]
    refs: _containers.RepeatedScalarFieldContainer[str]
    description: str
    needs_surrogate: bool
    stochastic: bool
    tasks: _containers.RepeatedScalarFieldContainer[_common_pb2.TaskType]
    uses_surrogate: bool
    minimal_norm: bool
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[_Union[AttackKind, str]] = ..., family: _Optional[str] = ..., norms: _Optional[_Iterable[_Union[Norm, str]]] = ..., targeted: _Optional[bool] = ..., untargeted: _Optional[bool] = ..., parameters: _Optional[_Iterable[_Union[ParameterSpec, _Mapping]]] = ..., refs: _Optional[_Iterable[str]] = ..., description: _Optional[str] = ..., needs_surrogate: _Optional[bool] = ..., stochastic: _Optional[bool] = ..., tasks: _Optional[_Iterable[_Union[_common_pb2.TaskType, str]]] = ..., uses_surrogate: _Optional[bool] = ..., minimal_norm: _Optional[bool] = ...) -> None: ...

class ListAttacksRequest(_message.Message):
    __slots__ = ("kind", "page_size", "page_token")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    kind: AttackKind
    page_size: int
    page_token: str
    def __init__(self, kind: _Optional[_Union[AttackKind, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListAttacksResponse(_message.Message):
    __slots__ = ("attacks", "next_page_token")
    ATTACKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    attacks: _containers.RepeatedCompositeFieldContainer[AttackInfo]
    next_page_token: str
    def __init__(self, attacks: _Optional[_Iterable[_Union[AttackInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ApplyPerturbationRequest(_message.Message):
    __slots__ = ("perturbation_id", "severity", "seed", "images", "epsilon", "params", "surrogate", "labels", "response_encoding")
    PERTURBATION_ID_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    SURROGATE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_ENCODING_FIELD_NUMBER: _ClassVar[int]
    perturbation_id: str
    severity: int
    seed: int
    images: _containers.RepeatedCompositeFieldContainer[_common_pb2.Image]
    epsilon: float
    params: _struct_pb2.Struct
    surrogate: str
    labels: _containers.RepeatedScalarFieldContainer[int]
    response_encoding: ImageEncoding
    def __init__(self, perturbation_id: _Optional[str] = ..., severity: _Optional[int] = ..., seed: _Optional[int] = ..., images: _Optional[_Iterable[_Union[_common_pb2.Image, _Mapping]]] = ..., epsilon: _Optional[float] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., surrogate: _Optional[str] = ..., labels: _Optional[_Iterable[int]] = ..., response_encoding: _Optional[_Union[ImageEncoding, str]] = ...) -> None: ...

class ApplyPerturbationResponse(_message.Message):
    __slots__ = ("images",)
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    images: _containers.RepeatedCompositeFieldContainer[_common_pb2.Image]
    def __init__(self, images: _Optional[_Iterable[_Union[_common_pb2.Image, _Mapping]]] = ...) -> None: ...

class ApplyPerturbationStreamRequest(_message.Message):
    __slots__ = ("request_id", "perturbation_id", "severity", "seed", "images", "epsilon", "params", "surrogate", "labels", "response_encoding")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PERTURBATION_ID_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    SURROGATE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_ENCODING_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    perturbation_id: str
    severity: int
    seed: int
    images: _containers.RepeatedCompositeFieldContainer[_common_pb2.Image]
    epsilon: float
    params: _struct_pb2.Struct
    surrogate: str
    labels: _containers.RepeatedScalarFieldContainer[int]
    response_encoding: ImageEncoding
    def __init__(self, request_id: _Optional[str] = ..., perturbation_id: _Optional[str] = ..., severity: _Optional[int] = ..., seed: _Optional[int] = ..., images: _Optional[_Iterable[_Union[_common_pb2.Image, _Mapping]]] = ..., epsilon: _Optional[float] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., surrogate: _Optional[str] = ..., labels: _Optional[_Iterable[int]] = ..., response_encoding: _Optional[_Union[ImageEncoding, str]] = ...) -> None: ...

class ApplyPerturbationStreamResponse(_message.Message):
    __slots__ = ("request_id", "images", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    images: _containers.RepeatedCompositeFieldContainer[_common_pb2.Image]
    error: _status_pb2.Status
    def __init__(self, request_id: _Optional[str] = ..., images: _Optional[_Iterable[_Union[_common_pb2.Image, _Mapping]]] = ..., error: _Optional[_Union[_status_pb2.Status, _Mapping]] = ...) -> None: ...

class LabeledImage(_message.Message):
    __slots__ = ("image", "labels", "objects", "mask", "no_objects")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    NO_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    image: _common_pb2.Image
    labels: _containers.RepeatedScalarFieldContainer[int]
    objects: _containers.RepeatedCompositeFieldContainer[_common_pb2.BoundingBox]
    mask: _common_pb2.Tensor
    no_objects: bool
    def __init__(self, image: _Optional[_Union[_common_pb2.Image, _Mapping]] = ..., labels: _Optional[_Iterable[int]] = ..., objects: _Optional[_Iterable[_Union[_common_pb2.BoundingBox, _Mapping]]] = ..., mask: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., no_objects: _Optional[bool] = ...) -> None: ...

class DetectionAttackCriterion(_message.Message):
    __slots__ = ("iou_threshold", "score_threshold", "min_objects", "mode", "k")
    IOU_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    SCORE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    MIN_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    iou_threshold: float
    score_threshold: float
    min_objects: int
    mode: str
    k: int
    def __init__(self, iou_threshold: _Optional[float] = ..., score_threshold: _Optional[float] = ..., min_objects: _Optional[int] = ..., mode: _Optional[str] = ..., k: _Optional[int] = ...) -> None: ...

class SegmentationAttackCriterion(_message.Message):
    __slots__ = ("classes", "miou_threshold", "ignore_label", "all_absent_incorrect")
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    MIOU_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    IGNORE_LABEL_FIELD_NUMBER: _ClassVar[int]
    ALL_ABSENT_INCORRECT_FIELD_NUMBER: _ClassVar[int]
    classes: _containers.RepeatedScalarFieldContainer[int]
    miou_threshold: float
    ignore_label: int
    all_absent_incorrect: bool
    def __init__(self, classes: _Optional[_Iterable[int]] = ..., miou_threshold: _Optional[float] = ..., ignore_label: _Optional[int] = ..., all_absent_incorrect: _Optional[bool] = ...) -> None: ...

class AttackCriterion(_message.Message):
    __slots__ = ("kind", "target_label", "threshold", "k", "detection", "segmentation")
    KIND_FIELD_NUMBER: _ClassVar[int]
    TARGET_LABEL_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    DETECTION_FIELD_NUMBER: _ClassVar[int]
    SEGMENTATION_FIELD_NUMBER: _ClassVar[int]
    kind: CriterionKind
    target_label: int
    threshold: float
    k: int
    detection: DetectionAttackCriterion
    segmentation: SegmentationAttackCriterion
    def __init__(self, kind: _Optional[_Union[CriterionKind, str]] = ..., target_label: _Optional[int] = ..., threshold: _Optional[float] = ..., k: _Optional[int] = ..., detection: _Optional[_Union[DetectionAttackCriterion, _Mapping]] = ..., segmentation: _Optional[_Union[SegmentationAttackCriterion, _Mapping]] = ...) -> None: ...

class RunAttackRequest(_message.Message):
    __slots__ = ("attack_id", "params", "seed", "images", "proxy_session_id", "origin", "surrogate", "criterion", "ensemble", "surrogate_models")
    ATTACK_ID_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    PROXY_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    SURROGATE_FIELD_NUMBER: _ClassVar[int]
    CRITERION_FIELD_NUMBER: _ClassVar[int]
    ENSEMBLE_FIELD_NUMBER: _ClassVar[int]
    SURROGATE_MODELS_FIELD_NUMBER: _ClassVar[int]
    attack_id: str
    params: _struct_pb2.Struct
    seed: int
    images: _containers.RepeatedCompositeFieldContainer[LabeledImage]
    proxy_session_id: str
    origin: str
    surrogate: str
    criterion: AttackCriterion
    ensemble: _containers.RepeatedScalarFieldContainer[str]
    surrogate_models: _containers.RepeatedCompositeFieldContainer[SurrogateModel]
    def __init__(self, attack_id: _Optional[str] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., seed: _Optional[int] = ..., images: _Optional[_Iterable[_Union[LabeledImage, _Mapping]]] = ..., proxy_session_id: _Optional[str] = ..., origin: _Optional[str] = ..., surrogate: _Optional[str] = ..., criterion: _Optional[_Union[AttackCriterion, _Mapping]] = ..., ensemble: _Optional[_Iterable[str]] = ..., surrogate_models: _Optional[_Iterable[_Union[SurrogateModel, _Mapping]]] = ...) -> None: ...

class ValidateAttackRequest(_message.Message):
    __slots__ = ("attack_id", "params", "criterion", "task", "output_kind", "surrogate", "ensemble")
    ATTACK_ID_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    CRITERION_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_KIND_FIELD_NUMBER: _ClassVar[int]
    SURROGATE_FIELD_NUMBER: _ClassVar[int]
    ENSEMBLE_FIELD_NUMBER: _ClassVar[int]
    attack_id: str
    params: _struct_pb2.Struct
    criterion: AttackCriterion
    task: _common_pb2.TaskType
    output_kind: _common_pb2.OutputKind
    surrogate: str
    ensemble: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, attack_id: _Optional[str] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., criterion: _Optional[_Union[AttackCriterion, _Mapping]] = ..., task: _Optional[_Union[_common_pb2.TaskType, str]] = ..., output_kind: _Optional[_Union[_common_pb2.OutputKind, str]] = ..., surrogate: _Optional[str] = ..., ensemble: _Optional[_Iterable[str]] = ...) -> None: ...

class ValidateAttackResponse(_message.Message):
    __slots__ = ("params",)
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    params: _struct_pb2.Struct
    def __init__(self, params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class SurrogateLabelMapping(_message.Message):
    __slots__ = ("surrogate_label", "target_label")
    SURROGATE_LABEL_FIELD_NUMBER: _ClassVar[int]
    TARGET_LABEL_FIELD_NUMBER: _ClassVar[int]
    surrogate_label: int
    target_label: int
    def __init__(self, surrogate_label: _Optional[int] = ..., target_label: _Optional[int] = ...) -> None: ...

class SurrogateModel(_message.Message):
    __slots__ = ("name", "model", "format", "height", "width", "channels", "mean", "std", "labels", "label_map", "target_classes", "task", "outputs")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    STD_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    LABEL_MAP_FIELD_NUMBER: _ClassVar[int]
    TARGET_CLASSES_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    format: ModelFormat
    height: int
    width: int
    channels: int
    mean: _containers.RepeatedScalarFieldContainer[float]
    std: _containers.RepeatedScalarFieldContainer[float]
    labels: _containers.RepeatedScalarFieldContainer[str]
    label_map: _containers.RepeatedCompositeFieldContainer[SurrogateLabelMapping]
    target_classes: int
    task: _common_pb2.TaskType
    outputs: SurrogateOutputs
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., format: _Optional[_Union[ModelFormat, str]] = ..., height: _Optional[int] = ..., width: _Optional[int] = ..., channels: _Optional[int] = ..., mean: _Optional[_Iterable[float]] = ..., std: _Optional[_Iterable[float]] = ..., labels: _Optional[_Iterable[str]] = ..., label_map: _Optional[_Iterable[_Union[SurrogateLabelMapping, _Mapping]]] = ..., target_classes: _Optional[int] = ..., task: _Optional[_Union[_common_pb2.TaskType, str]] = ..., outputs: _Optional[_Union[SurrogateOutputs, _Mapping]] = ...) -> None: ...

class SurrogateOutputs(_message.Message):
    __slots__ = ("boxes", "boxes_normalised", "scores", "scores_are_logits", "labels", "class_logits", "mask", "mask_kind")
    BOXES_FIELD_NUMBER: _ClassVar[int]
    BOXES_NORMALISED_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    SCORES_ARE_LOGITS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CLASS_LOGITS_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    MASK_KIND_FIELD_NUMBER: _ClassVar[int]
    boxes: int
    boxes_normalised: bool
    scores: int
    scores_are_logits: bool
    labels: int
    class_logits: int
    mask: int
    mask_kind: SurrogateMaskKind
    def __init__(self, boxes: _Optional[int] = ..., boxes_normalised: _Optional[bool] = ..., scores: _Optional[int] = ..., scores_are_logits: _Optional[bool] = ..., labels: _Optional[int] = ..., class_logits: _Optional[int] = ..., mask: _Optional[int] = ..., mask_kind: _Optional[_Union[SurrogateMaskKind, str]] = ...) -> None: ...

class RunAttackResponse(_message.Message):
    __slots__ = ("image_id", "adversarial", "adversarial_float", "success", "queries", "linf", "l2", "initially_correct", "stop_reason", "signal", "criterion")
    IMAGE_ID_FIELD_NUMBER: _ClassVar[int]
    ADVERSARIAL_FIELD_NUMBER: _ClassVar[int]
    ADVERSARIAL_FLOAT_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    LINF_FIELD_NUMBER: _ClassVar[int]
    L2_FIELD_NUMBER: _ClassVar[int]
    INITIALLY_CORRECT_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    CRITERION_FIELD_NUMBER: _ClassVar[int]
    image_id: str
    adversarial: _common_pb2.Image
    adversarial_float: _common_pb2.Tensor
    success: bool
    queries: int
    linf: float
    l2: float
    initially_correct: bool
    stop_reason: StopReason
    signal: str
    criterion: str
    def __init__(self, image_id: _Optional[str] = ..., adversarial: _Optional[_Union[_common_pb2.Image, _Mapping]] = ..., adversarial_float: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., success: _Optional[bool] = ..., queries: _Optional[int] = ..., linf: _Optional[float] = ..., l2: _Optional[float] = ..., initially_correct: _Optional[bool] = ..., stop_reason: _Optional[_Union[StopReason, str]] = ..., signal: _Optional[str] = ..., criterion: _Optional[str] = ...) -> None: ...
