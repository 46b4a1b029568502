"""The records of the proxy ledger, shared by its SQLite and PostgreSQL twins and by the
statements both run (``ledger_sql``): a row's statuses, the rows written, a call's outcome,
a session and its stats. ``ledger.py`` re-exports them for the proxy's code. Domain code: no
gRPC.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Status of a reserved row whose answer is not recorded yet (deliberately not a
#: ``google.rpc.Code`` name: the gRPC ``LedgerEntry`` shows it as UNKNOWN, with ``error``
#: saying "in flight").
IN_FLIGHT = "IN_FLIGHT"
IN_FLIGHT_NOTE = "in flight: reserved for the target, no outcome recorded (yet)"
#: Status of a row a previous proxy process reserved and never completed (it was killed or
#: crashed): the target may or may not have received the image, so the row still counts
#: against the hard budgets; set by :meth:`Ledger.mark_interrupted` when a proxy starts
#: (a crash leaves a visible in-flight row, never a silent gap).
INTERRUPTED = "INTERRUPTED"
INTERRUPTED_NOTE = ("interrupted: in flight when its proxy process stopped (killed or"
                    " crashed); the target may have received it, no answer was recorded")
#: Rows completed "not sent: ..." (reserved, then the call stopped before the images went:
#: the caller's deadline passed while waiting for the rate limit, a shutdown) stay in the
#: ledger for the record, but are no queries: not in the hard budgets, the stats or the day.
NOT_SENT_PREFIX = "not sent: "


@dataclass(frozen=True, kw_only=True)
class SessionRecord:
    session_id: str
    tenant: str
    target: str
    query_budget: int
    per_image_budget: int
    description: str
    created_at: float
    calls_refused: int = 0


@dataclass(frozen=True, kw_only=True)
class QueryRow:
    tenant: str
    session_id: str
    target: str
    origin: str
    image_id: str
    input_sha256: str
    output_summary: str
    latency_ms: float
    status: str
    error: str
    sent_at: float
    call_id: str
    attempts: int     # the attempt number of this row (1 = first; a retry is new rows)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """How a reserved row ends."""

    status: str            # a google.rpc.Code name ("OK", "UNAVAILABLE", ...)
    error: str = ""
    output_summary: str = ""
    latency_ms: float = 0.0
    sent_at: float | None = None     # when the images went (the rate limiter's grant)


@dataclass(frozen=True, kw_only=True)
class SessionStats:
    queries_ok: int
    queries_failed: int
    calls_refused: int
    per_image: dict[str, tuple[int, int]]   # image_id -> (ok, failed)
    per_origin: dict[str, tuple[int, int]]
    latency_p50_ms: float
    #: Every row: what the target received (retries included, in-flight rows included);
    #: the quantity the hard budgets count.
    attempts: int = 0
    #: Rows never completed: in flight now, or ``interrupted`` (left by a dead process).
    in_flight: int = 0
    per_image_attempts: dict[str, int] = field(default_factory=dict)
    interrupted: int = 0


def session_stats(rows: Iterable[Sequence[Any]], lat: list[float], refused: int
                  ) -> SessionStats:
    """A session's stats from its (image_id, origin, status, count) groups (rows never
    sent excluded), the latencies of its answered attempts and its refused calls: the
    one aggregation both ledgers share."""
    per_image: dict[str, list[int]] = {}
    per_origin: dict[str, list[int]] = {}
    per_image_attempts: dict[str, int] = {}
    ok = failed = in_flight = interrupted = 0
    for image_id, origin, status, n in rows:
        per_image_attempts[image_id] = per_image_attempts.get(image_id, 0) + n
        if status in (IN_FLIGHT, INTERRUPTED):
            in_flight += n
            interrupted += n if status == INTERRUPTED else 0
            per_image.setdefault(image_id, [0, 0])
            per_origin.setdefault(origin, [0, 0])
            continue
        idx = 0 if status == "OK" else 1
        per_image.setdefault(image_id, [0, 0])[idx] += n
        per_origin.setdefault(origin, [0, 0])[idx] += n
        if idx == 0:
            ok += n
        else:
            failed += n
    lat.sort()
    p50 = float(lat[len(lat) // 2]) if lat else 0.0
    return SessionStats(
        queries_ok=ok, queries_failed=failed,
        calls_refused=refused,
        per_image={k: (v[0], v[1]) for k, v in per_image.items()},
        per_origin={k: (v[0], v[1]) for k, v in per_origin.items()}, latency_p50_ms=p50,
        attempts=ok + failed + in_flight, in_flight=in_flight,
        per_image_attempts=per_image_attempts, interrupted=interrupted)
