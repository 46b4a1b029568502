"""JSON-able result trees (the scoring service's Compute results, as dicts) to and from the typed
messages that carry them in a report's parts (``fortis.report.v1.CanaryMetrics``,
``BenchmarkResults``), keeping every detail report.json shows.

The convention, which report.proto states beside the messages:

- a dict key is a field's name, or its ``json_name`` where the key is not a proto name
  (``"MR"``); a name-keyed dict is a ``map`` field; a key the message does not have is an
  error (the schema describes exactly what the producers write);
- an unset field is an absent key; a key set to null is listed in the message's
  ``null_fields`` and one set to an empty list or map in ``empty_fields``; a map's value that
  is null is a message whose ``null_fields`` holds ``""``;
- in a repeated or map field of doubles, NaN stands for null;
- a message whose one field is ``values`` (``Numbers``, ``NumberMatrix``, ``NumbersByName``)
  is that list or map itself.

Going back, numbers come out as the untyped parts gave them (a number that is whole is an
``int``, a non-finite one None), so a report is the same whichever way its parts travelled.
Pure code: protobuf messages and dicts, no gRPC.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any, Final

from fortis.services.common.errors import InvalidArgument
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

__all__ = ["NULL_FIELDS", "EMPTY_FIELDS", "Unrepresentable", "fill_message", "message_tree"]

NULL_FIELDS: Final = "null_fields"
EMPTY_FIELDS: Final = "empty_fields"
_BOOKKEEPING: Final = frozenset({NULL_FIELDS, EMPTY_FIELDS})
#: Whole numbers below this are ints in the report (a double holds them exactly).
_EXACT: Final = 2 ** 53

_INTEGERS: Final = frozenset({
    FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64})
_FLOATS: Final = frozenset({FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT})
#: What each integer type holds (protobuf raises its own ValueError past these).
_RANGES: Final = {
    FieldDescriptor.TYPE_INT32: (-2 ** 31, 2 ** 31 - 1),
    FieldDescriptor.TYPE_SINT32: (-2 ** 31, 2 ** 31 - 1),
    FieldDescriptor.TYPE_INT64: (-2 ** 63, 2 ** 63 - 1),
    FieldDescriptor.TYPE_SINT64: (-2 ** 63, 2 ** 63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2 ** 32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2 ** 64 - 1),
}


def _default_json_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _key(fd: FieldDescriptor) -> str:
    """The dict key of a field: its explicit json_name, else its name."""
    return fd.json_name if fd.json_name != _default_json_name(fd.name) else fd.name


def _data_fields(desc: Descriptor) -> list[FieldDescriptor]:
    return [fd for fd in desc.fields if fd.name not in _BOOKKEEPING]


def _is_wrapper(desc: Descriptor) -> bool:
    return len(desc.fields) == 1 and desc.fields[0].name == "values"


def _is_map(fd: FieldDescriptor) -> bool:
    return bool(fd.message_type is not None and fd.message_type.GetOptions().map_entry)


def _is_repeated(fd: FieldDescriptor) -> bool:
    return bool(fd.is_repeated)


# --------------------------------------------------------------------------------------------
# dict -> message
# --------------------------------------------------------------------------------------------


class Unrepresentable(ValueError):
    """A value the typed message cannot hold (a string where a number belongs, a null where
    the schema has no way to say null): named by its path."""


def _scalar(fd: FieldDescriptor, value: Any, path: str) -> Any:
    # numbers.Real/Integral, not int/float: numpy scalars (np.int64, np.float32) are numbers
    # the untyped parts took as they were.
    if fd.type in _FLOATS:
        if value is None:
            return math.nan
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise Unrepresentable(f"{path}: a number is expected; got {type(value).__name__}")
        return float(value)
    if fd.type in _INTEGERS:
        if isinstance(value, numbers.Real) and not isinstance(value, bool | numbers.Integral) \
                and float(value).is_integer():
            value = int(float(value))   # Compute's results come back with every number a double
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise Unrepresentable(f"{path}: a whole number is expected; got {value!r}")
        low, high = _RANGES[fd.type]
        if not low <= int(value) <= high:
            raise Unrepresentable(f"{path}: out of range for the field; got {value!r}")
        return int(value)
    if fd.type == FieldDescriptor.TYPE_BOOL:
        if not isinstance(value, bool):
            raise Unrepresentable(f"{path}: true or false is expected; got {value!r}")
        return value
    if not isinstance(value, str):
        raise Unrepresentable(f"{path}: a string is expected; got {type(value).__name__}")
    return value


def _tolerated(unknown: list[str] | None, path: str, exc: Unrepresentable) -> None:
    """In the tolerant mode (``unknown`` given) a value the message cannot hold is left out
    and named, as an unknown key is; otherwise it is the caller's error."""
    if unknown is None:
        raise exc
    unknown.append(f"{path} ({exc.args[0].split(': ', 1)[-1]})")


def _fill_field(msg: Message, fd: FieldDescriptor, value: Any, path: str,
                unknown: list[str] | None) -> None:
    if _is_map(fd):
        if not isinstance(value, Mapping):
            raise Unrepresentable(f"{path}: a mapping is expected; got {type(value).__name__}")
        container = getattr(msg, fd.name)
        value_fd = fd.message_type.fields_by_name["value"]
        for k, v in value.items():
            at = f"{path}.{k}"
            try:
                if value_fd.message_type is None:
                    container[str(k)] = _scalar(value_fd, v, at)
                elif v is None:
                    if _is_wrapper(value_fd.message_type):
                        raise Unrepresentable(f"{at}: null is not a list of numbers")
                    getattr(container[str(k)], NULL_FIELDS).append("")
                else:
                    fill_message(container[str(k)], v, at, unknown)
            except Unrepresentable as exc:
                container.pop(str(k), None)
                _tolerated(unknown, at, exc)
    elif _is_repeated(fd):
        if not isinstance(value, list | tuple):
            raise Unrepresentable(f"{path}: a list is expected; got {type(value).__name__}")
        container = getattr(msg, fd.name)
        for n, v in enumerate(value):
            if fd.message_type is None:
                container.append(_scalar(fd, v, f"{path}[{n}]"))
            elif v is None:
                # a repeated message has no place for a null: one row left out would shift
                # every later row, so the whole list is the caller's error (or left out)
                raise Unrepresentable(f"{path}[{n}]: null in a list of messages")
            else:
                fill_message(container.add(), v, f"{path}[{n}]", unknown)
    elif fd.message_type is not None:
        sub = getattr(msg, fd.name)
        sub.SetInParent()
        fill_message(sub, value, path, unknown)
    else:
        setattr(msg, fd.name, _scalar(fd, value, path))


def fill_message(msg: Message, data: Any, path: str,
                 unknown: list[str] | None = None) -> Message:
    """Fill ``msg`` from the JSON-able ``data`` (module docstring). A key the message does not
    describe, or a value it cannot hold (a wrong type, a null where the schema has none), is
    a ValueError naming it (``path``); given ``unknown``, it is left out and its path appended
    there instead (a newer or looser producer must not fail a whole evaluation at its end)."""
    desc = msg.DESCRIPTOR
    if _is_wrapper(desc):
        _fill_field(msg, desc.fields[0], data, path, unknown)
        return msg
    if not isinstance(data, Mapping):
        raise Unrepresentable(f"{path}: a mapping is expected; got {type(data).__name__}")
    fields = {_key(fd): fd for fd in _data_fields(desc)}
    for key, value in data.items():
        fd = fields.get(str(key))
        if fd is None and unknown is not None:
            unknown.append(f"{path}.{key}")
            continue
        if fd is None:
            raise ValueError(f"{path}.{key}: not a field of {desc.full_name}")
        if value is None:
            getattr(msg, NULL_FIELDS).append(str(key))
        elif (_is_map(fd) or _is_repeated(fd)) and isinstance(value, Mapping | list | tuple) \
                and not value:
            getattr(msg, EMPTY_FIELDS).append(str(key))
        elif unknown is None:
            _fill_field(msg, fd, value, f"{path}.{key}", unknown)
        else:
            try:
                _fill_field(msg, fd, value, f"{path}.{key}", unknown)
            except Unrepresentable as exc:
                msg.ClearField(fd.name)
                _tolerated(unknown, f"{path}.{key}", exc)
    return msg


# --------------------------------------------------------------------------------------------
# message -> dict
# --------------------------------------------------------------------------------------------


def _plain_number(value: Any, fd: FieldDescriptor) -> Any:
    """A number as the untyped parts gave it: whole -> int, non-finite -> None."""
    if fd.type == FieldDescriptor.TYPE_BOOL or fd.type not in _FLOATS | _INTEGERS:
        return value
    n = float(value)
    if not math.isfinite(n):
        return None
    return int(n) if n.is_integer() and abs(n) < _EXACT else n


class _Budget:
    """Values left to copy and how deep messages may nest; ``InvalidArgument`` naming ``path``
    past either (a caller of RenderReport is not trusted: the page draws what it is sent, and
    ``MetricNode.per_model`` nests itself)."""

    def __init__(self, path: str, values: int | None, depth: int | None = None) -> None:
        self.path, self.total, self.left = path, values, values
        self.max_depth, self.depth = depth, 0

    def enter(self) -> None:
        self.depth += 1
        if self.max_depth is not None and self.depth > self.max_depth:
            raise InvalidArgument(self.path, f"nested deeper than {self.max_depth}")

    def leave(self) -> None:
        self.depth -= 1

    def take(self, n: int = 1) -> None:
        if self.left is None:
            return
        self.left -= n
        if self.left < 0:
            raise InvalidArgument(self.path, f"more than {self.total} values")


def _field_tree(msg: Message, fd: FieldDescriptor, budget: _Budget) -> Any:
    value = getattr(msg, fd.name)
    if _is_map(fd) or _is_repeated(fd):
        budget.take(len(value))
    if _is_map(fd):
        value_fd = fd.message_type.fields_by_name["value"]
        if value_fd.message_type is None:
            return {k: _plain_number(v, value_fd) for k, v in value.items()}
        return {k: _tree(v, budget) for k, v in value.items()}
    if _is_repeated(fd):
        if fd.message_type is None:
            return [_plain_number(v, fd) for v in value]
        return [_tree(v, budget) for v in value]
    if fd.message_type is not None:
        return _tree(value, budget)
    return _plain_number(value, fd)


def _tree(msg: Message, budget: _Budget) -> Any:
    budget.take()
    budget.enter()
    try:
        return _message_tree(msg, budget)
    finally:
        budget.leave()


def _message_tree(msg: Message, budget: _Budget) -> Any:
    desc = msg.DESCRIPTOR
    if _is_wrapper(desc):
        return _field_tree(msg, desc.fields[0], budget)
    nulls = set(getattr(msg, NULL_FIELDS))
    if "" in nulls:
        return None
    empties = set(getattr(msg, EMPTY_FIELDS))
    out: dict[str, Any] = {}
    for fd in _data_fields(desc):
        key = _key(fd)
        if key in nulls:
            out[key] = None
        elif _is_map(fd) or _is_repeated(fd):
            if len(getattr(msg, fd.name)) or key in empties:
                out[key] = _field_tree(msg, fd, budget)
        elif msg.HasField(fd.name):
            out[key] = _field_tree(msg, fd, budget)
    return out


def message_tree(msg: Message, path: str = "", max_values: int | None = None,
                 max_depth: int | None = None) -> Any:
    """The JSON-able tree ``msg`` carries (the inverse of :func:`fill_message`); with
    ``max_values`` or ``max_depth``, more values or messages nested deeper than that are an
    ``InvalidArgument`` naming ``path``."""
    return _tree(msg, _Budget(path, max_values, max_depth))
