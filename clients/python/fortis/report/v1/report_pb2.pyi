from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RenderReportRequest(_message.Message):
    __slots__ = ("parts",)
    PARTS_FIELD_NUMBER: _ClassVar[int]
    parts: _struct_pb2.Struct
    def __init__(self, parts: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class RenderReportResponse(_message.Message):
    __slots__ = ("report_json", "report_html")
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    REPORT_HTML_FIELD_NUMBER: _ClassVar[int]
    report_json: str
    report_html: str
    def __init__(self, report_json: _Optional[str] = ..., report_html: _Optional[str] = ...) -> None: ...
