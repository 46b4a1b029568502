"""Reading a plan document field by field: :class:`Fields` collects every problem, each
naming its field, so that a plan's validators report all of them at once. Domain code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fortis.services.common.errors import FieldViolation
from fortis.services.common.limits import MAX_PLAN_STRING_CHARS

__all__ = ["Fields", "short"]


class Fields:
    """Collects violations while walking the document."""

    def __init__(self) -> None:
        self.problems: list[FieldViolation] = []

    def bad(self, path: str, msg: str) -> None:
        self.problems.append(FieldViolation(path, msg))

    def mapping(self, doc: Any, path: str, *, required: bool = True) -> Mapping[str, Any]:
        if doc is None and not required:
            return {}
        if not isinstance(doc, Mapping):
            self.bad(path, f"must be a mapping, got {type(doc).__name__}")
            return {}
        return doc

    def unknown(self, doc: Mapping[str, Any], path: str, allowed: set[str]) -> None:
        for k in doc:
            if k not in allowed:
                where = f"{path}.{k}" if path else str(k)
                self.bad(where[:200], f"unknown field; allowed: {', '.join(sorted(allowed))}")

    def string(self, doc: Mapping[str, Any], key: str, path: str, *, required: bool = False,
               default: str = "", choices: tuple[str, ...] | None = None) -> str:
        p = f"{path}.{key}" if path else key
        if key not in doc or doc[key] is None:
            if required:
                self.bad(p, "required")
            return default
        v = doc[key]
        if not isinstance(v, str) or (required and not v.strip()):
            self.bad(p, f"must be a non-empty string, got {short(v)}")
            return default
        if len(v) > MAX_PLAN_STRING_CHARS:
            self.bad(p, f"{len(v):,} characters; at most {MAX_PLAN_STRING_CHARS:,}")
            return default
        if choices and v not in choices:
            self.bad(p, f"must be one of {', '.join(choices)}, got {short(v)}")
            return default
        return v

    def integer(self, doc: Mapping[str, Any], key: str, path: str, *, default: int,
                lo: int, hi: int) -> int:
        p = f"{path}.{key}" if path else key
        if key not in doc:
            return default
        v = doc[key]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            self.bad(p, f"must be an integer in {lo}..{hi}, got {short(v)}")
            return default
        return v

    def levels(self, doc: Mapping[str, Any], key: str, path: str, *, lo: int, hi: int,
               default: list[int]) -> tuple[int, ...]:
        """A non-empty list of distinct integers in lo..hi, sorted."""
        raw = doc.get(key, default)
        if not isinstance(raw, list) or not raw:
            self.bad(f"{path}.{key}", f"must be a non-empty list of integers in {lo}..{hi}")
            return ()
        ok = []
        for j, x in enumerate(raw):
            if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
                self.bad(f"{path}.{key}[{j}]", f"must be an integer in {lo}..{hi}, got {short(x)}")
            else:
                ok.append(x)
        if len(set(ok)) != len(ok):
            self.bad(f"{path}.{key}", f"{key} repeat")
        return tuple(sorted(set(ok)))

    def items(self, doc: Mapping[str, Any], key: str) -> list[Any]:
        raw = doc.get(key) or []
        if not isinstance(raw, list):
            self.bad(key, "must be a list")
            return []
        return raw


def short(v: Any, limit: int = 80) -> str:
    r = repr(v)
    return r if len(r) <= limit else r[:limit] + "..."

