from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_TYPE_UNSPECIFIED: _ClassVar[TaskType]
    TASK_TYPE_CLASSIFICATION: _ClassVar[TaskType]
    TASK_TYPE_DETECTION: _ClassVar[TaskType]
    TASK_TYPE_SEGMENTATION: _ClassVar[TaskType]

class OutputKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTPUT_KIND_UNSPECIFIED: _ClassVar[OutputKind]
    OUTPUT_KIND_FULL_SCORES: _ClassVar[OutputKind]
    OUTPUT_KIND_TOP_K_SCORES: _ClassVar[OutputKind]
    OUTPUT_KIND_LABEL_ONLY: _ClassVar[OutputKind]
    OUTPUT_KIND_BOXES: _ClassVar[OutputKind]
    OUTPUT_KIND_MASKS: _ClassVar[OutputKind]

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    D_TYPE_UNSPECIFIED: _ClassVar[DType]
    D_TYPE_UINT8: _ClassVar[DType]
    D_TYPE_INT32: _ClassVar[DType]
    D_TYPE_INT64: _ClassVar[DType]
    D_TYPE_FLOAT16: _ClassVar[DType]
    D_TYPE_FLOAT32: _ClassVar[DType]
    D_TYPE_FLOAT64: _ClassVar[DType]
    D_TYPE_BOOL: _ClassVar[DType]
TASK_TYPE_UNSPECIFIED: TaskType
TASK_TYPE_CLASSIFICATION: TaskType
TASK_TYPE_DETECTION: TaskType
TASK_TYPE_SEGMENTATION: TaskType
OUTPUT_KIND_UNSPECIFIED: OutputKind
OUTPUT_KIND_FULL_SCORES: OutputKind
OUTPUT_KIND_TOP_K_SCORES: OutputKind
OUTPUT_KIND_LABEL_ONLY: OutputKind
OUTPUT_KIND_BOXES: OutputKind
OUTPUT_KIND_MASKS: OutputKind
D_TYPE_UNSPECIFIED: DType
D_TYPE_UINT8: DType
D_TYPE_INT32: DType
D_TYPE_INT64: DType
D_TYPE_FLOAT16: DType
D_TYPE_FLOAT32: DType
D_TYPE_FLOAT64: DType
D_TYPE_BOOL: DType

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Image(_message.Message):
    __slots__ = ("image_id", "encoded", "tensor")
    IMAGE_ID_FIELD_NUMBER: _ClassVar[int]
    ENCODED_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    image_id: str
    encoded: bytes
    tensor: Tensor
    def __init__(self, image_id: _Optional[str] = ..., encoded: _Optional[bytes] = ..., tensor: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class ClassScore(_message.Message):
    __slots__ = ("label", "name", "score")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    label: int
    name: str
    score: float
    def __init__(self, label: _Optional[int] = ..., name: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class Classification(_message.Message):
    __slots__ = ("classes",)
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    classes: _containers.RepeatedCompositeFieldContainer[ClassScore]
    def __init__(self, classes: _Optional[_Iterable[_Union[ClassScore, _Mapping]]] = ...) -> None: ...

class BoundingBox(_message.Message):
    __slots__ = ("x_min", "y_min", "x_max", "y_max", "label", "name", "score")
    X_MIN_FIELD_NUMBER: _ClassVar[int]
    Y_MIN_FIELD_NUMBER: _ClassVar[int]
    X_MAX_FIELD_NUMBER: _ClassVar[int]
    Y_MAX_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    x_min: float
    y_min: float
    x_max: float
    y_max: float
    label: int
    name: str
    score: float
    def __init__(self, x_min: _Optional[float] = ..., y_min: _Optional[float] = ..., x_max: _Optional[float] = ..., y_max: _Optional[float] = ..., label: _Optional[int] = ..., name: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class Detection(_message.Message):
    __slots__ = ("boxes",)
    BOXES_FIELD_NUMBER: _ClassVar[int]
    boxes: _containers.RepeatedCompositeFieldContainer[BoundingBox]
    def __init__(self, boxes: _Optional[_Iterable[_Union[BoundingBox, _Mapping]]] = ...) -> None: ...

class Segmentation(_message.Message):
    __slots__ = ("class_map", "probabilities")
    CLASS_MAP_FIELD_NUMBER: _ClassVar[int]
    PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    class_map: Tensor
    probabilities: Tensor
    def __init__(self, class_map: _Optional[_Union[Tensor, _Mapping]] = ..., probabilities: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class Prediction(_message.Message):
    __slots__ = ("image_id", "classification", "detection", "segmentation")
    IMAGE_ID_FIELD_NUMBER: _ClassVar[int]
    CLASSIFICATION_FIELD_NUMBER: _ClassVar[int]
    DETECTION_FIELD_NUMBER: _ClassVar[int]
    SEGMENTATION_FIELD_NUMBER: _ClassVar[int]
    image_id: str
    classification: Classification
    detection: Detection
    segmentation: Segmentation
    def __init__(self, image_id: _Optional[str] = ..., classification: _Optional[_Union[Classification, _Mapping]] = ..., detection: _Optional[_Union[Detection, _Mapping]] = ..., segmentation: _Optional[_Union[Segmentation, _Mapping]] = ...) -> None: ...
