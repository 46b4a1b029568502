"""Reading typed protobuf fields into report values, the same way everywhere.

Three rules make ``report.json`` honest: an unset ``optional`` field is ``None`` (never a 0
that reads as a measurement), an enum is its short lower-case name (``CORRECTNESS_MODE_TOP1``
-> ``"top1"``; the zero ``*_UNSPECIFIED`` -> ``None``), and a non-finite double is ``None``
(strict JSON has no NaN). Fields declared as strings today and as enums tomorrow read the same
(:func:`enum_text` looks at the descriptor at run time). No gRPC here.
"""

from __future__ import annotations

import math
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

__all__ = ["enum_text", "finite", "message_dict", "optional"]

_STRUCT = "google.protobuf.Struct"


def finite(value: float) -> float | None:
    """``value``, or ``None`` when it is NaN or infinite."""
    return value if math.isfinite(value) else None


def _enum_name(fd: FieldDescriptor, number: int) -> str | None:
    if number == 0:
        return None
    enum = fd.enum_type
    value = enum.values_by_number.get(number)
    if value is None:
        return f"unknown({number})"
    zero = enum.values_by_number[0].name if 0 in enum.values_by_number else ""
    prefix = zero[: -len("UNSPECIFIED")] if zero.endswith("UNSPECIFIED") else ""
    name = value.name[len(prefix):] if prefix and value.name.startswith(prefix) else value.name
    return name.lower()


def enum_text(message: Message, field: str) -> str | None:
    """An enum (or string) field as text: the value's name without the enum's prefix, lower
    case; ``None`` when unset. A string field gives its value (``None`` when empty)."""
    fd = message.DESCRIPTOR.fields_by_name[field]
    value = getattr(message, field)
    if fd.enum_type is None:
        return str(value) or None
    return _enum_name(fd, int(value))


def optional(message: Message, field: str) -> Any:
    """An ``optional`` scalar: its value, or ``None`` when unset (a float is also ``None``
    when it is not finite)."""
    if not message.HasField(field):
        return None
    value = getattr(message, field)
    return finite(value) if isinstance(value, float) else value


def _scalar(fd: FieldDescriptor, value: Any) -> Any:
    if fd.enum_type is not None:
        return _enum_name(fd, int(value))
    if fd.message_type is not None:
        return message_dict(value)
    if isinstance(value, float):
        return finite(value)
    return value


def message_dict(message: Message) -> Any:
    """Every field of ``message`` (set or not) as a plain value: enums as text, unset optional
    fields and sub-messages as ``None``, repeated fields as lists, maps as dicts. A
    ``google.protobuf.Struct`` (open by design) becomes its JSON object."""
    if message.DESCRIPTOR.full_name == _STRUCT:
        return json_format.MessageToDict(message)
    out: dict[str, Any] = {}
    for fd in message.DESCRIPTOR.fields:
        value = getattr(message, fd.name)
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            vfd = fd.message_type.fields_by_name["value"]
            out[fd.name] = {k: _scalar(vfd, v) for k, v in value.items()}
        elif fd.label == FieldDescriptor.LABEL_REPEATED:
            out[fd.name] = [_scalar(fd, v) for v in value]
        elif fd.has_presence and not message.HasField(fd.name):
            out[fd.name] = None
        else:
            out[fd.name] = _scalar(fd, value)
    return out
