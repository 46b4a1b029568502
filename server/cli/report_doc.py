"""Reading a report document (``report.json``) as the pipeline commands do (``fortis gate``,
``compare``, ``junit``, ``mlflow-export``): every value is checked before use, since a report
file is whatever the caller hands over."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["mapping", "number"]


def number(value: Any) -> float | None:
    """A finite number as float; None for anything else (bools, strings, NaN, missing)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}
