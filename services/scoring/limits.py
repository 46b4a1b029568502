"""Documented bounds of every numeric parameter of the metric catalogue, and of the arrays of
one ``Compute`` call, so that one tenant cannot stall every tenant (unbounded,
``Compute("irt")`` would accept ``chain_length: 1e9``).

:data:`PARAM_BOUNDS` is the one table: per catalogue entry, per parameter path (dotted below
``params``: ``rule.k`` is ``params.rule.k``), its kind and its inclusive minimum and maximum.
:func:`check_params` refuses anything outside it with INVALID_ARGUMENT naming
``params.<path>`` before any work is done; :func:`describe` gives the bound as ListMetrics
shows it. :data:`MAX_ARRAY_ELEMENTS` bounds the elements of all arrays of one call together;
:func:`check_array_elements` checks it from the shapes, so the transport can refuse before
decoding anything. Pure code, no gRPC.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from fortis.services.common.errors import FieldViolation, InvalidArgument

#: Elements of all arrays of one Compute call together (50 million: 400 MB of float64).
MAX_ARRAY_ELEMENTS: Final = 50_000_000
#: The largest IRT chain (CAN-8 defaults to 7000 steps; the bound leaves room for 14x that).
MAX_CHAIN_LENGTH: Final = 100_000
#: Elements of a list parameter naming subjects, items, models or attacks.
MAX_NAMES: Final = 1000
#: Tests (settings) of one IEEE re-scoring call.
MAX_TESTS: Final = 10_000
#: A rank cut-off or a number of positions (ndcg, drr, top-k rules).
MAX_RANK: Final = 10_000
_INT64: Final = 2**63 - 1


@dataclass(frozen=True)
class Bound:
    """``kind``: "int" (an integral number, 3.0 accepted: Struct numbers are doubles),
    "number" (a finite real), "list" (a list whose length is in [lo, hi]) or "numbers" (a
    list of at most ``length`` finite reals, each in [lo, hi])."""

    kind: str
    lo: float
    hi: float
    length: int = 0

    def text(self) -> str:
        """The bound as documented, e.g. ``[1, 100000]``."""
        if self.kind == "list":
            return f"at most {int(self.hi)} entries"
        span = f"[{_fmt(self.lo)}, {_fmt(self.hi)}]"
        if self.kind == "numbers":
            return f"at most {self.length} numbers, each in {span}"
        return f"{'integer' if self.kind == 'int' else 'number'} in {span}"


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def _int(lo: float, hi: float) -> Bound:
    return Bound("int", lo, hi)


def _num(lo: float, hi: float) -> Bound:
    return Bound("number", lo, hi)


def _list(hi: int) -> Bound:
    return Bound("list", 0, hi)


_UNIT: Final = _num(0.0, 1.0)

#: metric id -> parameter path (below ``params``) -> bound. Every numeric parameter an entry
#: reads, and the list parameters whose length drives the work.
PARAM_BOUNDS: Final[Mapping[str, Mapping[str, Bound]]] = {
    "ieee.classification": {"rule.k": _int(1, MAX_RANK), "rule.q": _int(1, 1_000_000),
                            "rule.threshold": _UNIT, "tests": _list(MAX_TESTS)},
    "ieee.detection": {"criterion.k": _int(1, MAX_RANK), "criterion.q": _int(1, 1_000_000),
                       "criterion.iou_threshold": _UNIT,
                       "criterion.confidence_threshold": _UNIT, "tests": _list(MAX_TESTS)},
    "ieee.segmentation": {"criterion.miou_threshold": _UNIT,
                          "criterion.ignore_label": _int(-(2**31), 2**31 - 1),
                          "tests": _list(MAX_TESTS)},
    "ndcg": {"gamma_b": _UNIT, "gamma_a": _UNIT, "positions": _int(1, MAX_RANK),
             "max_k1": _int(1, MAX_RANK), "max_k2": _int(1, MAX_RANK)},
    "drr": {"k": _int(1, MAX_RANK)},
    "degradation_profile": {"thresholds": Bound("numbers", 0.0, 1.0, length=16),
                            "num_classes": _int(1, 1_000_000),
                            "image_ids": _list(MAX_ARRAY_ELEMENTS)},
    "canary.perturbation_cost": {"change_tolerance": _num(0.0, 255.0)},
    "twoway": {"attacks": _list(MAX_NAMES), "models": _list(MAX_NAMES)},
    "twoway.fast_rank": {"attacks": _list(MAX_NAMES), "models": _list(MAX_NAMES)},
    "irt": {"seed": _int(0, _INT64), "chain_length": _int(1, MAX_CHAIN_LENGTH),
            "burn_in": _int(0, MAX_CHAIN_LENGTH - 1),
            "step_theta": _num(1e-6, 10.0), "step_a": _num(1e-6, 10.0),
            "step_b": _num(1e-6, 10.0), "step_c": _num(1e-6, 1.0),
            "subjects": _list(MAX_NAMES), "metrics": _list(MAX_NAMES)},
    "pertknob.robustness": {"threshold": _num(0.0, 1e9), "results": _list(1_000_000)},
}


def describe(metric_id: str, name: str) -> str:
    """The bounds of parameter ``name`` of ``metric_id`` (and of its sub-fields) as one phrase
    for ListMetrics, or "" when it has none."""
    bounds = PARAM_BOUNDS.get(metric_id, {})
    parts = [(path, b) for path, b in bounds.items()
             if path == name or path.startswith(name + ".")]
    return "; ".join(b.text() if path == name else f"{path.split('.', 1)[1]}: {b.text()}"
                     for path, b in parts)


def _lookup(params: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    node: Any = params
    for key in path.split("."):
        if not isinstance(node, Mapping) or key not in node:
            return False, None
        node = node[key]
    return True, node


def _real(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def _violation(field: str, b: Bound, value: Any) -> FieldViolation | None:
    if b.kind in ("list", "numbers"):
        if not isinstance(value, list):
            return None        # the entry itself says what shape it needs
        if b.kind == "list":
            return (FieldViolation(field, f"{len(value)} entries; {b.text()}")
                    if len(value) > b.hi else None)
        if len(value) > b.length:
            return FieldViolation(field, f"{len(value)} numbers; {b.text()}")
        for n, v in enumerate(value):
            bad = _violation(f"{field}[{n}]", _num(b.lo, b.hi), v)
            if bad is not None:
                return bad
        return None
    x = _real(value)
    if x is None or not math.isfinite(x):
        return FieldViolation(field, f"must be a finite number, got {value!r}")
    if b.kind == "int" and not x.is_integer():
        return FieldViolation(field, f"must be an integer, got {value!r}")
    if not b.lo <= x <= b.hi:
        return FieldViolation(field, f"{value!r} out of bounds: {b.text()}")
    return None


def check_params(metric_id: str, params: Mapping[str, Any]) -> None:
    """Refuse, before any work, every parameter of ``metric_id`` outside its bound
    (:data:`PARAM_BOUNDS`); all violations at once, each naming ``params.<path>``. Absent
    and null parameters take the entry's default and are not checked."""
    problems: list[FieldViolation] = []
    for path, b in PARAM_BOUNDS.get(metric_id, {}).items():
        found, value = _lookup(params, path)
        if found and value is not None:
            bad = _violation(f"params.{path}", b, value)
            if bad is not None:
                problems.append(bad)
    if problems:
        raise InvalidArgument.from_violations(problems)


def check_array_elements(shapes: Iterable[tuple[str, Sequence[int]]]) -> None:
    """Refuse a call whose arrays hold more than :data:`MAX_ARRAY_ELEMENTS` elements together
    (named ``arrays.<name>.shape`` when one array alone is too big, else ``arrays``). Works on
    the shapes alone, before decoding; shapes with a non-positive dimension are left to the
    decoder to refuse."""
    total = 0
    for name, shape in shapes:
        n = 1
        for s in shape:
            n *= int(s)
        if any(int(s) <= 0 for s in shape):
            continue
        if n > MAX_ARRAY_ELEMENTS:
            raise InvalidArgument(f"arrays.{name}.shape",
                                  f"{n} elements; at most {MAX_ARRAY_ELEMENTS} per Compute call")
        total += n
        if total > MAX_ARRAY_ELEMENTS:
            raise InvalidArgument("arrays", f"more than {MAX_ARRAY_ELEMENTS} elements in all "
                                            "(the most one Compute call may carry)")
