"""Parameter schemas shared by every catalogue (perturbations, attacks) and by the callers that
learn those schemas over the contract (the evaluation service validates plans against the
``ParameterSpec`` messages of ``ListPerturbations``/``ListAttacks``).

Pure data and validation, no gRPC. One validator for every parameter of every catalogue entry:
types, bounds, allowed choices and required values, with every problem reported at once and
each naming its field (``attacks[2].params.epsilon: must be in [0.0, 1.0], got 3.0``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fortis.services.common.errors import FieldViolation, InvalidArgument
from fortis.services.common.limits import MAX_TEXT_CHARS

#: The parameter types a catalogue entry may declare.
ParamType = Literal["float", "int", "bool", "string"]
PARAM_TYPES: tuple[str, ...] = ("float", "int", "bool", "string")


@dataclass(frozen=True, kw_only=True)
class Param:
    """One parameter of a perturbation or attack, as listed by ``ListPerturbations`` /
    ``ListAttacks``. ``default=None`` means required; ``choices`` restricts a string."""

    name: str
    type: str              # one of PARAM_TYPES
    default: Any = None    # None = required
    description: str = ""
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    #: Parameters sharing a non-empty ``one_of`` group are alternatives: exactly one of them
    #: must be given (e.g. neural_style's ``model`` blob or ``model_path``). Each has a default
    #: of "" and is not ``required`` on its own.
    one_of: str = ""

    @property
    def required(self) -> bool:
        return self.default is None

    @property
    def needs_input(self) -> bool:
        """The caller must give this parameter or one of its alternatives."""
        return self.default is None or bool(self.one_of)


class _HasParams:
    """Anything with an ``id`` and a ``params`` schema (PerturbationSpec, AttackSpec)."""

    id: str
    params: Sequence[Param]


def _coerce(p: Param, v: Any) -> Any:
    """The value as the parameter's type, or raise TypeError/ValueError."""
    if p.type == "float":
        if isinstance(v, bool):
            raise TypeError
        v = float(v)
        if not math.isfinite(v):
            raise ValueError
        return v
    if p.type == "int":
        if isinstance(v, bool):
            raise TypeError
        f = float(v)
        if not math.isfinite(f) or f != int(f):
            raise TypeError
        return int(f)
    if p.type == "bool":
        if not isinstance(v, bool):
            raise TypeError
        return v
    if not isinstance(v, str):
        raise TypeError
    return v


def _groups(schema: Sequence[Param]) -> dict[str, list[str]]:
    """``one_of`` group -> the names of its alternative parameters."""
    groups: dict[str, list[str]] = {}
    for p in schema:
        if p.one_of:
            groups.setdefault(p.one_of, []).append(p.name)
    return groups


def validate_params(spec: Any, params: Mapping[str, Any] | None,
                    field_prefix: str = "params") -> dict[str, Any]:
    """Check and complete ``params`` against ``spec.params`` (a sequence of :class:`Param`);
    every problem is reported at once in one :class:`InvalidArgument`."""
    given = dict(params or {})
    schema: Sequence[Param] = spec.params
    out: dict[str, Any] = {}
    problems: list[FieldViolation] = []
    known = {p.name for p in schema}
    for key in given:
        if key not in known:
            hint = f"known: {', '.join(sorted(known))}" if known else "it takes no parameters"
            problems.append(FieldViolation(f"{field_prefix}.{key}",
                                           f"unknown parameter for {spec.id}; {hint}"))
    for p in schema:
        f = f"{field_prefix}.{p.name}"
        if p.name not in given:
            if p.default is None:
                problems.append(FieldViolation(f, "required"))
            else:
                out[p.name] = p.default
            continue
        v = given[p.name]
        try:
            v = _coerce(p, v)
        except (TypeError, ValueError, OverflowError):
            article = "an" if p.type == "int" else "a"
            problems.append(FieldViolation(f, f"must be {article} {p.type}, got {_short(v)}"))
            continue
        if p.type == "string" and len(v) > MAX_TEXT_CHARS:
            problems.append(FieldViolation(f, f"{len(v):,} characters; at most {MAX_TEXT_CHARS:,}"))
            continue
        if (p.minimum is not None and v < p.minimum) or (p.maximum is not None and v > p.maximum):
            problems.append(FieldViolation(f, f"must be in [{p.minimum}, {p.maximum}], got {_short(v)}"))
            continue
        if p.choices and v not in p.choices:
            problems.append(FieldViolation(f, f"must be one of {', '.join(p.choices)}, got {_short(v)}"))
            continue
        out[p.name] = v
    for names in _groups(schema).values():
        chosen = [n for n in names if given.get(n) not in (None, "")]
        if len(chosen) != 1:
            what = "required" if not chosen else "give only one"
            problems += [FieldViolation(f"{field_prefix}.{n}",
                                        f"{what}: exactly one of {', '.join(names)}")
                         for n in (names if not chosen else chosen)]
    if problems:
        raise InvalidArgument.from_violations(problems)
    return out


def _short(v: Any, limit: int = 80) -> str:
    """A bounded repr for error messages (a 1 MB value is never echoed back)."""
    r = repr(v)
    return r if len(r) <= limit else r[:limit] + "..."
