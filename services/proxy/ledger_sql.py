"""The queries of the proxy ledger, written once for its two twins.

:class:`~.ledger.Ledger` (SQLite) and :class:`~.ledger_pg.PgLedger` (PostgreSQL) run the
same statements and map their rows the same way through what is here: the reads take an
:class:`~fortis.infra.storage.sql_dialects.Executor` (named parameters); the writes are
driver-level statements with positional placeholders (the SQLite twin's group commit and the
PostgreSQL twin's pipelined writer connection), built for a
:class:`~fortis.infra.storage.sql_dialects.Dialect`. A column or a query changes here, in
one place, for both.

What stays in the twins is what truly differs: SQLite's WAL and fsync handling, PostgreSQL's
writer connection, pipelines and asynchronous commits, and its owner advisory locks (only
PostgreSQL rows carry an ``owner``: replicas share the database, so ``mark_interrupted``
may only touch the rows of dead owners). Domain code: no gRPC.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from fortis.infra.storage.sql_dialects import Dialect, Executor
from fortis.services.proxy.ledger_types import (
    IN_FLIGHT,
    INTERRUPTED,
    INTERRUPTED_NOTE,
    Outcome,
    QueryRow,
    SessionRecord,
    SessionStats,
    session_stats,
)

#: Rows completed "not sent: ..." are no queries (see ``ledger.NOT_SENT_PREFIX``).
SENT = " AND error NOT LIKE 'not sent:%'"
#: The columns ``reserve`` writes, in order; PostgreSQL rows add their ``owner``.
QUERY_COLUMNS = ("tenant", "session_id", "target", "origin", "image_id", "input_sha256",
                 "output_summary", "latency_ms", "status", "error", "sent_at", "call_id",
                 "attempts", "position")
#: A row's idempotency key, as ``reserve`` returns it: (tenant, call_id, attempts, position).
AttemptKey = tuple[str, str, int, int]
_SESSION_COLUMNS = ("session_id, tenant, target, query_budget, per_image_budget, description,"
                    " created_at, calls_refused")
_ENTRY_COLUMNS = ("entry_id, tenant, session_id, target, origin, image_id, input_sha256,"
                  " output_summary, latency_ms, status, error, sent_at, call_id, attempts")


def scope(tenant: str | None) -> tuple[str, dict[str, Any]]:
    """SQL condition and parameters for an optional tenant (None = every tenant)."""
    return ("", {}) if tenant is None else (" AND tenant=:tenant", {"tenant": tenant})


# -- sessions -------------------------------------------------------------------------------------
def insert_session(x: Executor, s: SessionRecord) -> None:
    """Store ``s`` unless the tenant already has a session of that id (nothing written)."""
    x.execute("INSERT INTO sessions (tenant, session_id, target, query_budget, per_image_budget,"
              " description, created_at, calls_refused) VALUES (:tenant, :sid, :target, :qb,"
              " :pib, :d, :c, :r) ON CONFLICT DO NOTHING",
              {"tenant": s.tenant, "sid": s.session_id, "target": s.target,
               "qb": s.query_budget, "pib": s.per_image_budget, "d": s.description,
               "c": s.created_at, "r": s.calls_refused})


def get_session(x: Executor, session_id: str, tenant: str | None) -> SessionRecord | None:
    """The tenant's session (``tenant=None``: the first tenant's of that id)."""
    cond, args = scope(tenant)
    r = x.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE session_id=:sid" + cond
                  + " ORDER BY tenant LIMIT 1", {"sid": session_id, **args}).fetchone()
    if r is None:
        return None
    return SessionRecord(session_id=r[0], tenant=r[1], target=r[2], query_budget=int(r[3]),
                         per_image_budget=int(r[4]), description=r[5],
                         created_at=float(r[6]), calls_refused=int(r[7]))


def sessions_with_prefix(x: Executor, prefix: str, tenant: str | None) -> list[str]:
    esc = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    cond, args = scope(tenant)
    rows = x.execute("SELECT DISTINCT session_id FROM sessions WHERE session_id LIKE :p"
                     " ESCAPE '\\'" + cond + " ORDER BY session_id",
                     {"p": esc + "%", **args}).fetchall()
    return [r[0] for r in rows]


def add_refused(x: Executor, session_id: str, n: int, tenant: str) -> None:
    x.execute("UPDATE sessions SET calls_refused = calls_refused + :n WHERE session_id=:sid"
              " AND tenant=:tenant", {"n": n, "sid": session_id, "tenant": tenant})


# -- counts ---------------------------------------------------------------------------------------
def _per_image(x: Executor, session_id: str, tenant: str | None, which: str) -> dict[str, int]:
    cond, args = scope(tenant)
    rows = x.execute("SELECT image_id, COUNT(*) FROM queries WHERE session_id=:sid" + cond
                     + which + " GROUP BY image_id", {"sid": session_id, **args}).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def ok_counts(x: Executor, session_id: str, tenant: str | None) -> dict[str, int]:
    """Answered queries per image id."""
    return _per_image(x, session_id, tenant, " AND status='OK'")


def attempt_counts(x: Executor, session_id: str, tenant: str | None) -> dict[str, int]:
    """Rows per image id, whatever their status, rows never sent excluded."""
    return _per_image(x, session_id, tenant, SENT)


def mark_interrupted(x: Executor, owner: int | None = None) -> int:
    """Mark ``IN_FLIGHT`` rows ``INTERRUPTED`` (with ``owner``: only that owner's); the
    number marked."""
    cur = x.execute("UPDATE queries SET status=:s, error=:e WHERE status=:f"
                    + ("" if owner is None else " AND owner=:o"),
                    {"s": INTERRUPTED, "e": INTERRUPTED_NOTE, "f": IN_FLIGHT, "o": owner})
    return int(cur.rowcount or 0)


def last_entry_id(x: Executor) -> int:
    return int(x.execute("SELECT MAX(entry_id) FROM queries", {}).fetchone()[0] or 0)


def attempts_since(x: Executor, t: float) -> dict[str, int]:
    """Rows per tenant sent at or after ``t``, rows never sent excluded."""
    rows = x.execute("SELECT tenant, COUNT(*) FROM queries WHERE sent_at>=:t" + SENT
                     + " GROUP BY tenant", {"t": t}).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def replayable(x: Executor, session_id: str, tenant: str, *, up_to: int
               ) -> dict[str, list[tuple[str, int]]]:
    """Answered rows with a recorded reply, per image id in send order."""
    rows = x.execute("SELECT q.image_id, q.input_sha256, q.entry_id FROM queries q JOIN replies r"
                     " ON r.entry_id = q.entry_id WHERE q.session_id=:sid AND q.tenant=:tenant"
                     " AND q.status='OK' AND q.entry_id<=:up ORDER BY q.entry_id",
                     {"sid": session_id, "tenant": tenant, "up": up_to}).fetchall()
    out: dict[str, list[tuple[str, int]]] = {}
    for image_id, sha, entry_id in rows:
        out.setdefault(image_id, []).append((sha, int(entry_id)))
    return out


def reply(x: Executor, entry_id: int) -> bytes | None:
    row = x.execute("SELECT prediction FROM replies WHERE entry_id=:e",
                    {"e": entry_id}).fetchone()
    return None if row is None else bytes(row[0])


# -- reports --------------------------------------------------------------------------------------
def stats(x: Executor, session_id: str, tenant: str | None) -> SessionStats:
    """A session's stats (rows never sent are no queries; one latency per answered attempt:
    the rows of one attempt share it)."""
    cond, args = scope(tenant)
    params = {"sid": session_id, **args}
    rows = x.execute("SELECT image_id, origin, status, COUNT(*) FROM queries WHERE"
                     " session_id=:sid" + cond + SENT + " GROUP BY image_id, origin, status",
                     params).fetchall()
    lat = [float(r[0]) for r in x.execute(
        "SELECT MIN(latency_ms) FROM queries WHERE session_id=:sid" + cond
        + " AND status='OK' GROUP BY call_id, attempts", params).fetchall()]
    refused = x.execute("SELECT SUM(calls_refused) FROM sessions WHERE session_id=:sid" + cond,
                        params).fetchone()
    return session_stats([(a, b, c, int(n)) for a, b, c, n in rows], lat,
                         int(refused[0] or 0) if refused else 0)


def entries(x: Executor, session_id: str, tenant: str | None, *, after_id: int,
            limit: int) -> list[tuple[Any, ...]]:
    cond, args = scope(tenant)
    rows = x.execute(f"SELECT {_ENTRY_COLUMNS} FROM queries WHERE session_id=:sid" + cond
                     + " AND entry_id>:after ORDER BY entry_id LIMIT :lim",
                     {"sid": session_id, **args, "after": after_id, "lim": limit}).fetchall()
    return [tuple(r) for r in rows]


def send_times(x: Executor, target: str | None) -> list[float]:
    """Send time of every row (of ``target``), in order."""
    where = " WHERE target=:t" if target else ""
    rows = x.execute("SELECT sent_at FROM queries" + where + " ORDER BY sent_at",
                     {"t": target}).fetchall()
    return [float(r[0]) for r in rows]


# -- writes: driver-level statements (positional placeholders) --------------------------------
def query_values(rows: Sequence[QueryRow], *extra: Any) -> list[tuple[Any, ...]]:
    """The values ``reserve`` writes per row (:data:`QUERY_COLUMNS`, the row's index in the
    call as its position, then ``extra``)."""
    return [(r.tenant, r.session_id, r.target, r.origin, r.image_id, r.input_sha256,
             r.output_summary, r.latency_ms, r.status, r.error, r.sent_at, r.call_id,
             r.attempts, i, *extra) for i, r in enumerate(rows)]


def attempt_key(values: tuple[Any, ...]) -> AttemptKey:
    """The idempotency key of one row of :func:`query_values`."""
    return values[0], values[11], values[12], values[13]


@functools.lru_cache(maxsize=128)
def insert_sql(d: Dialect, n: int, columns: tuple[str, ...] = QUERY_COLUMNS) -> str:
    """INSERT of ``n`` rows, idempotent on the attempt key, returning each inserted row's id
    and key (a row written before returns nothing: see :func:`entry_ids`)."""
    one = "(" + ",".join([d.param] * len(columns)) + ")"
    return (f"INSERT INTO queries ({', '.join(columns)}) VALUES {','.join([one] * n)}"
            " ON CONFLICT (tenant, call_id, attempts, position) DO NOTHING"
            " RETURNING entry_id, tenant, call_id, attempts, position")


def existing_id_sql(d: Dialect) -> str:
    """The id of the row of one attempt key (written before)."""
    p = d.param
    return (f"SELECT entry_id FROM queries WHERE tenant={p} AND call_id={p} AND attempts={p}"
            f" AND position={p}")


def entry_ids(returned: Sequence[Sequence[Any]], keys: Sequence[AttemptKey],
              existing: Callable[[AttemptKey], int]) -> list[int]:
    """The entry id of each key, in order: from the rows :func:`insert_sql` returned, else
    (a row written before) from ``existing``."""
    ids = {(t, c, int(a), int(p)): int(e) for e, t, c, a, p in returned}
    return [ids[k] if k in ids else int(existing(k)) for k in keys]


def complete_sql(d: Dialect) -> str:
    """The outcome of one reserved row (a None send time keeps the reserved one)."""
    p = d.param
    return (f"UPDATE queries SET status={p}, error={p}, output_summary={p}, latency_ms={p},"
            f" sent_at=COALESCE({d.float_param}, sent_at) WHERE entry_id={p}")


def complete_values(done: Sequence[tuple[int, Outcome]]) -> list[tuple[Any, ...]]:
    return [(o.status, o.error, o.output_summary, o.latency_ms, o.sent_at, entry_id)
            for entry_id, o in done]


def reply_sql(d: Dialect) -> str:
    """Keep (or replace) the answer of an answered row."""
    return (f"INSERT INTO replies (entry_id, prediction) VALUES ({d.param}, {d.param})"
            " ON CONFLICT (entry_id) DO UPDATE SET prediction=excluded.prediction")
