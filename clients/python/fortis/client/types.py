"""Typed, immutable results of :class:`fortis.client.FortisClient`.

Callers get plain frozen dataclasses with Python types (enums, datetimes, dicts) instead of
protobuf messages, so they can be compared, hashed and type-checked without knowing the wire
format. Each keeps the message it was built from in ``.raw`` for fields this layer does not
(yet) surface. Builders read optional or renamed fields defensively (``HasField``/``getattr``)
so one client works against servers a minor contract revision apart.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Generic, TypeVar

from fortis.client.errors import FortisError, from_status
from google.protobuf.json_format import MessageToDict

T = TypeVar("T")

__all__ = [
    "Evaluation", "LedgerEntry", "Page", "Perturbation", "Progress", "SessionStats", "State",
    "Target", "enum_name", "progress_of",
]


class State(str, enum.Enum):  # noqa: UP042 - enum.StrEnum is 3.11+; this runs on 3.10
    """Lifecycle of an evaluation. A ``str`` enum: ``State.SUCCEEDED == "SUCCEEDED"``."""

    UNSPECIFIED = "UNSPECIFIED"
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def finished(self) -> bool:
        """True once the evaluation can change no more."""
        return self in (State.SUCCEEDED, State.FAILED, State.CANCELLED)

    def __str__(self) -> str:
        return self.value


def enum_name(message: Any, field_name: str) -> str:
    """A protobuf enum field as its short lower-case name ("corruption" for
    PERTURBATION_KIND_CORRUPTION), or the field itself when it is a plain string.

    The prefix every value of the enum shares is dropped (Buf's enum-value-prefix rule), so the
    name is the same whatever the enum is called; a string field passes through unchanged.
    """
    value = getattr(message, field_name)
    if isinstance(value, str):
        return value
    enum_type = message.DESCRIPTOR.fields_by_name[field_name].enum_type
    common = os.path.commonprefix([v.name for v in enum_type.values])
    prefix = common[: common.rfind("_") + 1]
    known = enum_type.values_by_number.get(value)
    return known.name.removeprefix(prefix).lower() if known else str(value)


def _time(message: Any, field_name: str) -> datetime | None:
    if not message.HasField(field_name):
        return None
    return getattr(message, field_name).ToDatetime(tzinfo=timezone.utc)  # type: ignore[no-any-return]  # noqa: UP017 - 3.10


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a List call; pass ``next_page_token`` back for the next ("" = last page)."""

    items: list[T]
    next_page_token: str = ""

    def __iter__(self) -> Any:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True)
class Progress:
    """Progress of an evaluation: ``stage`` is a name ("clean", "corruptions", ..., "done")."""

    state: State
    stage: str
    items_done: int
    items_total: int
    queries: int
    message: str
    images_done: int = 0       # image-level work: moves inside long items (query attacks)
    images_total: int = 0

    @property
    def fraction(self) -> float:
        """Work done, by images when the server counts them, else by items."""
        if self.images_total:
            return self.images_done / self.images_total
        return self.items_done / self.items_total if self.items_total else 0.0


@dataclass(frozen=True)
class Evaluation:
    """An evaluation of one plan. ``error`` is the FortisError it failed with, if it did."""

    evaluation_id: str
    tenant: str
    state: State
    progress: Progress
    plan_name: str
    plan_text: str
    create_time: datetime | None
    update_time: datetime | None
    error: FortisError | None
    resumed_count: int
    summary: dict[str, Any]
    raw: Any = field(repr=False, compare=False)

    @property
    def finished(self) -> bool:
        return self.state.finished

    @classmethod
    def from_proto(cls, ev: Any) -> Evaluation:
        try:
            state = State(enum_name(ev, "state").upper())
        except ValueError:     # a state this client does not know yet
            state = State.UNSPECIFIED
        p = ev.progress
        progress = Progress(state=state, stage=enum_name(p, "stage"), items_done=p.items_done,
                            items_total=p.items_total, queries=p.queries, message=p.message,
                            images_done=getattr(p, "images_done", 0),
                            images_total=getattr(p, "images_total", 0))
        error = from_status(ev.error) if ev.HasField("error") and ev.error.code else None
        return cls(evaluation_id=ev.evaluation_id, tenant=ev.tenant, state=state,
                   progress=progress, plan_name=ev.plan_name, plan_text=ev.plan_text,
                   create_time=_time(ev, "create_time"), update_time=_time(ev, "update_time"),
                   error=error, resumed_count=ev.resumed_count, summary=_summary(ev), raw=ev)


def _summary(ev: Any) -> dict[str, Any]:
    """Headline results: a typed ``summary`` message if the contract has one, else the
    ``summary_json`` string of older servers."""
    fields = ev.DESCRIPTOR.fields_by_name
    if "summary" in fields and ev.HasField("summary"):
        return MessageToDict(ev.summary, preserving_proto_field_name=True)
    text = getattr(ev, "summary_json", "") if "summary_json" in fields else ""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def progress_of(ev: Evaluation | Any) -> Progress:
    """The progress of an evaluation (typed, or the raw message)."""
    return (ev if isinstance(ev, Evaluation) else Evaluation.from_proto(ev)).progress


@dataclass(frozen=True)
class SessionStats:
    """Query counts of one proxy session, read from the proxy's ledger."""

    session_id: str
    target: str
    query_budget: int
    per_image_budget: int
    queries_ok: int
    queries_failed: int
    calls_refused: int
    per_image: dict[str, int]
    per_origin: dict[str, int]
    latency_p50_ms: float
    raw: Any = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, st: Any) -> SessionStats:
        s = st.session
        return cls(session_id=s.session_id, target=s.target, query_budget=s.query_budget,
                   per_image_budget=s.per_image_budget, queries_ok=st.queries_ok,
                   queries_failed=st.queries_failed, calls_refused=st.calls_refused,
                   per_image={i.image_id: i.queries for i in st.images},
                   per_origin={o.origin: o.queries for o in st.origins},
                   latency_p50_ms=st.latency_p50_ms, raw=st)


@dataclass(frozen=True)
class LedgerEntry:
    """One call the proxy recorded (one query per image)."""

    entry_id: int
    session_id: str
    target: str
    origin: str
    image_id: str
    input_sha256: str
    output_summary: str
    latency_ms: float
    status: str
    error: str
    send_time: datetime | None
    attempts: int
    raw: Any = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, e: Any) -> LedgerEntry:
        return cls(entry_id=e.entry_id, session_id=e.session_id, target=e.target,
                   origin=e.origin, image_id=e.image_id, input_sha256=e.input_sha256,
                   output_summary=e.output_summary, latency_ms=e.latency_ms, status=e.status,
                   error=e.error, send_time=_time(e, "send_time"), attempts=e.attempts, raw=e)


@dataclass(frozen=True)
class Perturbation:
    """One entry of the perturbation/attack catalogue. ``kind`` is e.g. "corruption",
    "score_attack"; ``level_kind`` "severity", "level", "epsilon" or "unspecified"."""

    id: str
    kind: str
    family: str
    description: str
    refs: list[str]
    level_kind: str
    levels: list[int]
    stochastic: bool
    needs_model: bool
    parameters: list[dict[str, Any]]
    raw: Any = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, p: Any) -> Perturbation:
        params = [MessageToDict(s, preserving_proto_field_name=True) for s in p.parameters]
        return cls(id=p.id, kind=enum_name(p, "kind"), family=p.family,
                   description=p.description, refs=list(p.refs) or [p.ieee_ref],
                   level_kind=enum_name(p, "level_kind"),
                   levels=list(p.levels) or list(p.severities), stochastic=p.stochastic,
                   needs_model=p.needs_model, parameters=params, raw=p)


@dataclass(frozen=True)
class Attack:
    """One attack of the attack registry (``ListAttacks``). ``kind`` is "transfer", "score"
    or "decision"; ``norms`` e.g. ["linf"]."""

    id: str
    kind: str
    family: str
    description: str
    refs: list[str]
    norms: list[str]
    targeted: bool
    untargeted: bool
    needs_surrogate: bool
    parameters: list[dict[str, Any]]
    raw: Any = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, a: Any) -> Attack:
        norms = [a.DESCRIPTOR.fields_by_name["norms"].enum_type.values_by_number[n].name
                 .removeprefix("NORM_").lower() for n in a.norms]
        params = [MessageToDict(s, preserving_proto_field_name=True) for s in a.parameters]
        return cls(id=a.id, kind=enum_name(a, "kind"), family=a.family,
                   description=a.description, refs=list(a.refs), norms=norms,
                   targeted=a.targeted, untargeted=a.untargeted,
                   needs_surrogate=a.needs_surrogate, parameters=params, raw=a)


@dataclass(frozen=True)
class Target:
    """A target the proxy serves. ``images_per_second`` 0 means no rate limit."""

    name: str
    images_per_second: float
    raw: Any = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, t: Any) -> Target:
        return cls(name=t.name, images_per_second=t.images_per_second, raw=t)
