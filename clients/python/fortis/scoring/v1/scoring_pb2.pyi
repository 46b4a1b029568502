from fortis.common.v1 import common_pb2 as _common_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MetricInput(_message.Message):
    __slots__ = ("name", "kind", "description", "required")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    description: str
    required: bool
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., description: _Optional[str] = ..., required: _Optional[bool] = ...) -> None: ...

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
    __slots__ = ()
    def __init__(self) -> None: ...

class ListMetricsResponse(_message.Message):
    __slots__ = ("metrics",)
    METRICS_FIELD_NUMBER: _ClassVar[int]
    metrics: _containers.RepeatedCompositeFieldContainer[MetricInfo]
    def __init__(self, metrics: _Optional[_Iterable[_Union[MetricInfo, _Mapping]]] = ...) -> None: ...

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

class CorrectnessRule(_message.Message):
    __slots__ = ("mode", "k", "threshold")
    MODE_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    mode: str
    k: int
    threshold: float
    def __init__(self, mode: _Optional[str] = ..., k: _Optional[int] = ..., threshold: _Optional[float] = ...) -> None: ...

class RecordedPrediction(_message.Message):
    __slots__ = ("image_id", "labels", "scores", "error")
    IMAGE_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    image_id: str
    labels: _containers.RepeatedScalarFieldContainer[int]
    scores: _containers.RepeatedScalarFieldContainer[float]
    error: str
    def __init__(self, image_id: _Optional[str] = ..., labels: _Optional[_Iterable[int]] = ..., scores: _Optional[_Iterable[float]] = ..., error: _Optional[str] = ...) -> None: ...

class TestOutcomes(_message.Message):
    __slots__ = ("kind", "perturbation_id", "severity", "predictions", "queries", "success", "query_budget", "image_ids")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PERTURBATION_ID_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    QUERY_BUDGET_FIELD_NUMBER: _ClassVar[int]
    IMAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    perturbation_id: str
    severity: int
    predictions: _containers.RepeatedCompositeFieldContainer[RecordedPrediction]
    queries: _containers.RepeatedScalarFieldContainer[int]
    success: _containers.RepeatedScalarFieldContainer[bool]
    query_budget: int
    image_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kind: _Optional[str] = ..., perturbation_id: _Optional[str] = ..., severity: _Optional[int] = ..., predictions: _Optional[_Iterable[_Union[RecordedPrediction, _Mapping]]] = ..., queries: _Optional[_Iterable[int]] = ..., success: _Optional[_Iterable[bool]] = ..., query_budget: _Optional[int] = ..., image_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ScoreClassificationRequest(_message.Message):
    __slots__ = ("rule", "labels", "tests")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: LabelSet
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[LabelSet, _Mapping]] = ...) -> None: ...
    RULE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TESTS_FIELD_NUMBER: _ClassVar[int]
    rule: CorrectnessRule
    labels: _containers.MessageMap[str, LabelSet]
    tests: _containers.RepeatedCompositeFieldContainer[TestOutcomes]
    def __init__(self, rule: _Optional[_Union[CorrectnessRule, _Mapping]] = ..., labels: _Optional[_Mapping[str, LabelSet]] = ..., tests: _Optional[_Iterable[_Union[TestOutcomes, _Mapping]]] = ...) -> None: ...

class LabelSet(_message.Message):
    __slots__ = ("labels",)
    LABELS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, labels: _Optional[_Iterable[int]] = ...) -> None: ...

class ScoreClassificationResponse(_message.Message):
    __slots__ = ("metrics",)
    METRICS_FIELD_NUMBER: _ClassVar[int]
    metrics: _struct_pb2.Struct
    def __init__(self, metrics: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...
