"""The plan a report repeats (IEEE-P3, P4): its text parsed into a JSON-able mapping, bounded
in bytes and in values (a YAML plan's anchors can name one subtree many times). Pure code,
no gRPC; a bad plan raises ``InvalidArgument`` naming ``parts.plan_text``."""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Mapping
from typing import Any, Final

import yaml
from fortis.services.common.errors import InvalidArgument

__all__ = ["MAX_PLAN_BYTES", "plan_document"]

#: The plan text is bounded: the evaluation service validated it already, and a report is no
#: place for a document larger than any real plan.
MAX_PLAN_BYTES: Final = 1 << 20
#: A YAML plan with anchors can name the same subtree many times; copying it into the report
#: expands every reference, so the number of values copied is bounded too.
_MAX_PLAN_VALUES: Final = 200_000


def _plain(value: Any, budget: list[int]) -> Any:
    """A JSON-able copy of a YAML value (str keys, lists, ISO dates, NaN -> None), counting
    every value against ``budget`` so an alias-expanded plan cannot blow up the report."""
    budget[0] -= 1
    if budget[0] < 0:
        raise InvalidArgument("parts.plan_text",
                              f"the plan expands to more than {_MAX_PLAN_VALUES} values")
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _plain(v, budget) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, budget) for v in value]
    if isinstance(value, _dt.datetime | _dt.date):
        return value.isoformat()
    return str(value)


def plan_document(plan_text: str) -> dict[str, Any]:
    """The plan as a JSON-able mapping, parsed with ``yaml.safe_load`` (JSON plans are YAML
    too). Bounded in bytes and in values; anything but a mapping is refused."""
    if not plan_text.strip():
        raise InvalidArgument("parts.plan_text", "the plan's text is required")
    size = len(plan_text.encode("utf-8"))
    if size > MAX_PLAN_BYTES:
        raise InvalidArgument("parts.plan_text",
                              f"the plan is {size} bytes; at most {MAX_PLAN_BYTES} are accepted")
    try:
        doc = yaml.safe_load(plan_text)
    except (yaml.YAMLError, RecursionError) as exc:
        raise InvalidArgument("parts.plan_text", f"not a YAML or JSON document: {exc}") from None
    if not isinstance(doc, Mapping):
        raise InvalidArgument("parts.plan_text",
                              f"the plan must be a mapping; got {type(doc).__name__}")
    try:
        return dict(_plain(doc, [_MAX_PLAN_VALUES]))
    except RecursionError:
        raise InvalidArgument("parts.plan_text", "the plan is nested too deeply") from None
