"""A plan's text -> its document (YAML or JSON), bounded before anything is built: the size,
YAML anchors and aliases (refused while composing), the nesting depth. Domain code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.limits import MAX_PLAN_BYTES, MAX_PLAN_DEPTH

__all__ = ["MAX_DEPTH", "MAX_PLAN_BYTES", "parse_plan_text"]

#: Nesting depth of a plan document (docs/limits.md).
MAX_DEPTH = MAX_PLAN_DEPTH


def _depth(doc: Any, limit: int) -> int:
    """Nesting depth of a parsed document, stopping once past ``limit``."""
    stack = [(doc, 1)]
    worst = 0
    while stack:
        node, d = stack.pop()
        worst = max(worst, d)
        if worst > limit:
            return worst
        if isinstance(node, Mapping):
            stack += [(v, d + 1) for v in node.values()]
        elif isinstance(node, list):
            stack += [(v, d + 1) for v in node]
    return worst


class _AliasRefused(Exception):
    """An anchor or alias met while composing a YAML plan (carries where, never the text)."""

    def __init__(self, what: str, mark: Any) -> None:
        super().__init__(what)
        self.what = what
        self.mark = mark


class _PlanLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses anchors (``&a``) and aliases (``*a``, and so ``<<:``
    merges) as it composes, before anything is built or expanded.

    Why: a 563-byte plan of nested aliases ("billion laughs") cost +792 MB and a 72 MB
    error string. A plan never needs them: the refusal is cheap (checked per node) and the
    document is never expanded.
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _AliasRefused("aliases (*name)", event.start_mark)
        if getattr(event, "anchor", None) is not None:
            raise _AliasRefused("anchors (&name)", event.start_mark)
        return super().compose_node(parent, index)


def _load_yaml(text: str) -> Any:
    loader = _PlanLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def parse_plan_text(text: str, fmt: str = "") -> dict[str, Any]:
    """YAML or JSON text -> document (``fmt``: "yaml", "json" or "" to detect).

    Bounded before anything is built: the size (``MAX_PLAN_BYTES``), YAML
    anchors and aliases refused while composing (no expansion), the depth (``MAX_DEPTH``).
    Every error is InvalidArgument on ``plan`` with a short message quoting no plan text.
    """
    if not text or not text.strip():
        raise InvalidArgument("plan", "the plan is empty")
    if len(text.encode()) > MAX_PLAN_BYTES:
        raise InvalidArgument("plan", f"the plan is larger than {MAX_PLAN_BYTES} bytes")
    fmt = fmt or ("json" if text.lstrip().startswith("{") else "yaml")
    try:
        doc = json.loads(text) if fmt == "json" else _load_yaml(text)
    except RecursionError:
        raise InvalidArgument("plan", f"nested more than {MAX_DEPTH} levels deep") from None
    except _AliasRefused as exc:
        raise InvalidArgument("plan", f"YAML {exc.what} are not accepted (at line "
                              f"{exc.mark.line + 1}, column {exc.mark.column + 1}): write each "
                              "value out in full") from None
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        if isinstance(exc, json.JSONDecodeError):
            where = f" at line {exc.lineno}, column {exc.colno}"
            problem = exc.msg[:200]
        else:
            problem = str(getattr(exc, "problem", None) or "syntax error")[:200]
        raise InvalidArgument("plan", f"not valid {fmt.upper()}{where}: {problem}") from None
    except ValueError as exc:   # e.g. an integer past Python's digit limit: quote none of it
        raise InvalidArgument("plan", f"not valid {fmt.upper()}: a value could not be read "
                              f"({type(exc).__name__}, e.g. a number of over 4300 digits)") from None
    if not isinstance(doc, dict):
        raise InvalidArgument("plan", f"the plan must be a mapping at the top level, got {type(doc).__name__}")
    if _depth(doc, MAX_DEPTH) > MAX_DEPTH:
        raise InvalidArgument("plan", f"nested more than {MAX_DEPTH} levels deep")
    return doc
