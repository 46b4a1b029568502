from fortis.common.v1 import common_pb2 as _common_pb2
from google.api import field_behavior_pb2 as _field_behavior_pb2
from google.rpc import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InputSpec(_message.Message):
    __slots__ = ("height", "width", "channels", "max_batch_size")
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    height: int
    width: int
    channels: int
    max_batch_size: int
    def __init__(self, height: _Optional[int] = ..., width: _Optional[int] = ..., channels: _Optional[int] = ..., max_batch_size: _Optional[int] = ...) -> None: ...

class TargetInfo(_message.Message):
    __slots__ = ("name", "task_type", "labels", "output_kind", "top_k", "input", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_KIND_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    task_type: _common_pb2.TaskType
    labels: _containers.RepeatedScalarFieldContainer[str]
    output_kind: _common_pb2.OutputKind
    top_k: int
    input: InputSpec
    version: str
    def __init__(self, name: _Optional[str] = ..., task_type: _Optional[_Union[_common_pb2.TaskType, str]] = ..., labels: _Optional[_Iterable[str]] = ..., output_kind: _Optional[_Union[_common_pb2.OutputKind, str]] = ..., top_k: _Optional[int] = ..., input: _Optional[_Union[InputSpec, _Mapping]] = ..., version: _Optional[str] = ...) -> None: ...

class GetTargetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetTargetInfoResponse(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: TargetInfo
    def __init__(self, info: _Optional[_Union[TargetInfo, _Mapping]] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("images",)
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    images: _containers.RepeatedCompositeFieldContainer[_common_pb2.Image]
    def __init__(self, images: _Optional[_Iterable[_Union[_common_pb2.Image, _Mapping]]] = ...) -> None: ...

class PredictResponse(_message.Message):
    __slots__ = ("predictions",)
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    predictions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Prediction]
    def __init__(self, predictions: _Optional[_Iterable[_Union[_common_pb2.Prediction, _Mapping]]] = ...) -> None: ...

class PredictStreamRequest(_message.Message):
    __slots__ = ("request_id", "images")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    images: _containers.RepeatedCompositeFieldContainer[_common_pb2.Image]
    def __init__(self, request_id: _Optional[str] = ..., images: _Optional[_Iterable[_Union[_common_pb2.Image, _Mapping]]] = ...) -> None: ...

class PredictStreamResponse(_message.Message):
    __slots__ = ("request_id", "predictions", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    predictions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Prediction]
    error: _status_pb2.Status
    def __init__(self, request_id: _Optional[str] = ..., predictions: _Optional[_Iterable[_Union[_common_pb2.Prediction, _Mapping]]] = ..., error: _Optional[_Union[_status_pb2.Status, _Mapping]] = ...) -> None: ...
