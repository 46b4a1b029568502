"""The query ledger in PostgreSQL, shared by proxy replicas at scale.

The same public methods and semantics as the SQLite :class:`~.ledger.Ledger` (the
:class:`~.ledger.LedgerStorage` protocol the proxy depends on), on the schema of the Alembic
migrations in ``services/common/migrations`` (0001 + 0002), through SQLAlchemy 2 (engine,
pool) over psycopg 3; the two writes of every call are driver-level statements on a writer
connection of its own, each transaction sent as one pipeline (BEGIN, the statements, COMMIT:
one round trip; SQLAlchemy's multi-row insert construct cost ~0.7 ms more per call, and a
transaction of separate round trips 3-4 of them). Several proxy replicas share one database, so the ledger is what the target saw
whichever replica sent the query:

- **Write-ahead** rows as in SQLite: ``reserve`` commits ``IN_FLIGHT`` rows before the images
  go, ``complete`` records the outcome before the answer is returned; rows completed
  ``not sent: ...`` are no queries (not in ``attempt_counts``, ``stats``,
  ``attempts_since``).
- **Idempotent**: a row's key is (tenant, call_id, attempts, position) (0002's
  ``queries_attempt_key``); a reservation written twice is ``INSERT ... ON CONFLICT DO
  NOTHING`` and returns the existing rows' ids, so a retried writer never double-counts.
- **Group commit**: concurrent writers of this process share one transaction on one writer
  connection (one WAL flush per group, ``commits`` counts them). Durable as the server is
  configured: ``synchronous_commit`` on (PostgreSQL's default) means a reserved row is on
  disk when ``reserve`` returns, before its image is sent. A group of completions only is an
  asynchronous commit (``SET LOCAL synchronous_commit TO OFF``): visible to every replica
  when ``complete`` returns, on disk within 3 x the server's ``wal_writer_delay``; a server
  crash in between leaves the row in flight (INTERRUPTED, still charged), never loses a
  reservation. This takes one WAL flush off every call's path.
- **Replicas and crashes**: each ledger takes a random ``owner`` number and holds the session
  advisory lock ``(OWNER_LOCK, owner)`` on its own connection while it lives, and writes the
  number into its rows. ``mark_interrupted`` (at a proxy's start) marks ``INTERRUPTED`` only
  the in-flight rows of owners whose lock it can take: processes that died (their
  connection, and with it the lock, went with them). A live replica's in-flight rows are
  never touched. Rows of an owner number this ledger drew itself, left by a dead process
  that had it, are marked when the ledger opens.
- A database that stops answering is ``Unavailable`` ("proxy ledger unavailable: ..."),
  never INTERNAL; the writer connection is replaced at the next write.

Tenant scoping as in SQLite (every proxy read names the tenant; ``tenant=None`` is the
operator's view). ``insert_session`` of an existing (tenant, session_id) writes nothing and
returns the stored session (two replicas creating the same session at once get one row;
``TargetProxy.create_session`` refuses a caller whose settings differ from it). Domain code: no gRPC.
"""

from __future__ import annotations

import contextlib
import functools
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
import structlog
from fortis.services.common import errors, sqldb
from fortis.services.target_proxy.ledger import (
    IN_FLIGHT,
    INTERRUPTED,
    INTERRUPTED_NOTE,
    Outcome,
    QueryRow,
    SessionRecord,
    SessionStats,
    _Op,
    session_stats,
)

log = structlog.get_logger("fortis.proxy.ledger")

#: First key of the owners' advisory locks ("FRLG"); the second is the owner number.
OWNER_LOCK = 0x46524C47
#: How often (seconds of writing) a ledger checks that it still holds its owner lock.
OWNER_CHECK_S = 5.0
_WHAT = "proxy ledger"
#: Rows completed "not sent: ..." are no queries (as ``ledger._SENT``).
_SENT_TEXT = " AND error NOT LIKE 'not sent:%'"

_T = TypeVar("_T")
#: The columns ``reserve`` writes, in order (driver-level statements: ``%s`` placeholders).
_COLUMNS = ("tenant", "session_id", "target", "origin", "image_id", "input_sha256",
            "output_summary", "latency_ms", "status", "error", "sent_at", "call_id",
            "attempts", "position", "owner")
_UPDATE_SQL = ("UPDATE queries SET status=%s, error=%s, output_summary=%s, latency_ms=%s,"
               " sent_at=COALESCE(%s::double precision, sent_at) WHERE entry_id=%s")
_REPLY_SQL = ("INSERT INTO replies (entry_id, prediction) VALUES (%s, %s)"
              " ON CONFLICT (entry_id) DO UPDATE SET prediction=EXCLUDED.prediction")


@functools.lru_cache(maxsize=64)
def _insert_sql(n: int) -> str:
    """INSERT of ``n`` rows, idempotent on the attempt key, returning each inserted row's
    id and key."""
    one = "(" + ",".join(["%s"] * len(_COLUMNS)) + ")"
    return (f"INSERT INTO queries ({', '.join(_COLUMNS)}) VALUES {','.join([one] * n)}"
            " ON CONFLICT ON CONSTRAINT queries_attempt_key DO NOTHING"
            " RETURNING entry_id, tenant, call_id, attempts, position")


def _closing() -> errors.Unavailable:
    return errors.Unavailable("the proxy ledger is closed: the server is shutting down")


def _scope(tenant: str | None) -> tuple[str, dict[str, Any]]:
    return ("", {}) if tenant is None else (" AND tenant=:tenant", {"tenant": tenant})


class PgLedger:
    """PostgreSQL implementation of :class:`~.ledger.LedgerStorage`. Thread-safe: reads use
    the engine's pool, writes go through one writer connection (group commit)."""

    def __init__(self, url: str, *, engine: Any = None, read_only: bool = False) -> None:
        """Connect to ``url`` (InvalidArgument naming ``database_url`` when malformed,
        unreachable or not at the schema head), draw an owner number and lock it.
        ``read_only`` (``fortis ledger --database-url``): reads only, no owner number, never
        a write."""
        self._own_engine = engine is None
        self._engine = engine if engine is not None else sqldb.create_engine(url)
        try:
            sqldb.require_head(self._engine)
            self._lock = threading.Lock()          # guards the writer connection
            self._pending: list[_Op[Any]] = []
            self._pending_lock = threading.Lock()
            self._closed = False
            self._writer: Any = None
            self._read_only = read_only
            #: Transactions committed by the group commit (fewer than writers under load).
            self.commits = 0
            #: Times the owner lock was taken again after its connection was lost.
            self.owner_retaken = 0
            self._holder: Any = None
            self.owner = 0
            self._inherited = 0
            self._owner_checked = time.monotonic()
            if not read_only:
                with sqldb.unavailable_on_loss(_WHAT):
                    self._holder, self.owner = self._take_owner()
                    #: In-flight rows a dead process with this owner number left, marked now.
                    self._inherited = self._interrupt_owner(self.owner)
        except BaseException:
            if self._own_engine:
                self._engine.dispose()
            raise

    # -- plumbing -----------------------------------------------------------------------------
    def _take_owner(self) -> tuple[Any, int]:
        """A connection holding the advisory lock of a fresh owner number (for life)."""
        holder = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        for _ in range(100):
            owner = 1 + secrets.randbelow(2 ** 31 - 2)
            if holder.execute(sa.text("SELECT pg_try_advisory_lock(:k, :o)"),
                              {"k": OWNER_LOCK, "o": owner}).scalar():
                return holder, owner
        holder.close()      # pragma: no cover - 100 taken numbers out of 2**31
        raise errors.Unavailable("proxy ledger: no free owner number")

    def _keep_owner(self, *, now: bool = False) -> None:
        """Make sure this ledger still holds its owner lock (the caller holds ``_lock``):
        checked every OWNER_CHECK_S of writing, and at once after a lost connection. A lost
        holder connection (the server restarted, the connection was terminated) took the
        lock with it, so another proxy starting meanwhile would take this live proxy for dead
        and mark its in-flight rows INTERRUPTED: a new holder takes the same number again
        before more rows are written under it, or a fresh number if the old one was taken
        meanwhile (rows marked in between are completed as usual: ``complete`` writes by
        entry id)."""
        if not now and time.monotonic() - self._owner_checked < OWNER_CHECK_S:
            return
        try:
            self._holder.execute(sa.text("SELECT 1"))
        except Exception:  # noqa: BLE001 - any failure: the lock may be gone with it
            with contextlib.suppress(Exception):
                self._holder.close()
            holder = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            if holder.execute(sa.text("SELECT pg_try_advisory_lock(:k, :o)"),
                              {"k": OWNER_LOCK, "o": self.owner}).scalar():
                self._holder = holder
            else:
                holder.close()
                old = self.owner
                self._holder, self.owner = self._take_owner()
                log.warning("ledger_owner_changed", old=old, new=self.owner)
            self.owner_retaken += 1
        self._owner_checked = time.monotonic()

    def _interrupt_owner(self, owner: int) -> int:
        with self._engine.begin() as conn:
            cur = conn.execute(sa.text("UPDATE queries SET status=:s, error=:e WHERE status=:f"
                                       " AND owner=:o"),
                               {"s": INTERRUPTED, "e": INTERRUPTED_NOTE, "f": IN_FLIGHT,
                                "o": owner})
            return int(cur.rowcount or 0)

    def close(self) -> None:
        """Close the connections (the owner lock goes with its connection) once the write in
        progress is done; later calls get UNAVAILABLE."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for conn in (self._writer, self._holder):
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
            self._writer = None
            if self._own_engine:
                self._engine.dispose()

    @contextlib.contextmanager
    def _read(self) -> Iterator[Any]:
        """A pooled connection for one read, refusing work once closed; a lost database is
        Unavailable."""
        if self._closed:
            raise _closing()
        with sqldb.unavailable_on_loss(_WHAT), self._engine.connect() as conn:
            yield conn

    def _rows(self, sql: str, params: dict[str, Any]) -> list[Any]:
        with self._read() as conn:
            return list(conn.execute(sa.text(sql), params).all())

    # -- sessions -------------------------------------------------------------------------------
    def insert_session(self, s: SessionRecord) -> SessionRecord:
        """Store ``s`` unless the tenant already has a session of that id; the session as
        stored. Two replicas creating one session at once: one row, and both callers get
        that row (the proxy then compares its settings with what each asked for)."""
        with self._read() as conn:
            conn.execute(sa.text(
                "INSERT INTO sessions (tenant, session_id, target, query_budget,"
                " per_image_budget, description, created_at, calls_refused) VALUES (:tenant,"
                " :sid, :target, :qb, :pib, :d, :c, :r) ON CONFLICT DO NOTHING"),
                {"tenant": s.tenant, "sid": s.session_id, "target": s.target,
                 "qb": s.query_budget, "pib": s.per_image_budget, "d": s.description,
                 "c": s.created_at, "r": s.calls_refused})
            conn.commit()
        stored = self.get_session(s.session_id, s.tenant)
        if stored is None:      # pragma: no cover - deleted between the two statements
            raise errors.Unavailable("proxy ledger: the session vanished while being created")
        return stored

    def get_session(self, session_id: str, tenant: str | None = None) -> SessionRecord | None:
        cond, args = _scope(tenant)
        rows = self._rows(
            "SELECT session_id, tenant, target, query_budget, per_image_budget, description,"
            " created_at, calls_refused FROM sessions WHERE session_id=:sid" + cond
            + " ORDER BY tenant LIMIT 1", {"sid": session_id, **args})
        if not rows:
            return None
        r = rows[0]
        return SessionRecord(session_id=r[0], tenant=r[1], target=r[2], query_budget=int(r[3]),
                             per_image_budget=int(r[4]), description=r[5],
                             created_at=float(r[6]), calls_refused=int(r[7]))

    def sessions_with_prefix(self, prefix: str, tenant: str | None = None) -> list[str]:
        esc = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        cond, args = _scope(tenant)
        rows = self._rows("SELECT DISTINCT session_id FROM sessions WHERE session_id LIKE :p"
                          " ESCAPE '\\'" + cond + " ORDER BY session_id",
                          {"p": esc + "%", **args})
        return [r[0] for r in rows]

    def add_refused(self, session_id: str, n: int = 1, *, tenant: str) -> None:
        with self._read() as conn:
            conn.execute(sa.text("UPDATE sessions SET calls_refused = calls_refused + :n"
                                 " WHERE session_id=:sid AND tenant=:tenant"),
                         {"n": n, "sid": session_id, "tenant": tenant})
            conn.commit()

    # -- counts ----------------------------------------------------------------------------------
    def ok_counts(self, session_id: str, tenant: str | None = None) -> dict[str, int]:
        cond, args = _scope(tenant)
        rows = self._rows("SELECT image_id, COUNT(*) FROM queries WHERE session_id=:sid" + cond
                          + " AND status='OK' GROUP BY image_id", {"sid": session_id, **args})
        return {r[0]: int(r[1]) for r in rows}

    def attempt_counts(self, session_id: str, tenant: str | None = None) -> dict[str, int]:
        cond, args = _scope(tenant)
        rows = self._rows("SELECT image_id, COUNT(*) FROM queries WHERE session_id=:sid" + cond
                          + _SENT_TEXT + " GROUP BY image_id", {"sid": session_id, **args})
        return {r[0]: int(r[1]) for r in rows}

    def mark_interrupted(self) -> int:
        """Mark ``INTERRUPTED`` the in-flight rows of dead owners (their advisory lock is
        free) and the ones of this ledger's own number left before it opened; the number
        marked. A live replica's rows (its lock is held) are left alone."""
        marked, self._inherited = self._inherited, 0
        if self._closed:
            raise _closing()
        if self._read_only:
            return 0
        with sqldb.unavailable_on_loss(_WHAT):
            owners = [int(r[0]) for r in self._rows(
                "SELECT DISTINCT owner FROM queries WHERE status=:f AND owner<>:me",
                {"f": IN_FLIGHT, "me": self.owner})]
            with self._lock:
                for o in owners:
                    params = {"k": OWNER_LOCK, "o": o}
                    if not self._holder.execute(sa.text("SELECT pg_try_advisory_lock(:k, :o)"),
                                                params).scalar():
                        continue            # alive: its rows are in flight for real
                    try:
                        marked += self._interrupt_owner(o)
                    finally:
                        self._holder.execute(sa.text("SELECT pg_advisory_unlock(:k, :o)"),
                                             params)
        return marked

    def last_entry_id(self) -> int:
        rows = self._rows("SELECT MAX(entry_id) FROM queries", {})
        return int(rows[0][0] or 0)

    def attempts_since(self, t: float) -> dict[str, int]:
        rows = self._rows("SELECT tenant, COUNT(*) FROM queries WHERE sent_at>=:t" + _SENT_TEXT
                          + " GROUP BY tenant", {"t": t})
        return {r[0]: int(r[1]) for r in rows}

    def replayable(self, session_id: str, tenant: str, *, up_to: int
                   ) -> dict[str, list[tuple[str, int]]]:
        rows = self._rows(
            "SELECT q.image_id, q.input_sha256, q.entry_id FROM queries q JOIN replies r"
            " ON r.entry_id = q.entry_id WHERE q.session_id=:sid AND q.tenant=:tenant"
            " AND q.status='OK' AND q.entry_id<=:up ORDER BY q.entry_id",
            {"sid": session_id, "tenant": tenant, "up": up_to})
        out: dict[str, list[tuple[str, int]]] = {}
        for image_id, sha, entry_id in rows:
            out.setdefault(image_id, []).append((sha, int(entry_id)))
        return out

    def reply(self, entry_id: int) -> bytes | None:
        rows = self._rows("SELECT prediction FROM replies WHERE entry_id=:e", {"e": entry_id})
        return None if not rows else bytes(rows[0][0])

    # -- writes (group commit) ---------------------------------------------------------------
    def _group(self, run: Callable[[Any], Callable[[], _T]], *, durable: bool = True) -> _T:
        """Run ``run`` in a transaction shared with the writers waiting meanwhile; returns
        once it is committed (with ``durable``, once it is on the server's disk). A failed
        group fails each of its writers."""
        op: _Op[_T] = _Op(run, durable=durable)
        with self._pending_lock:
            self._pending.append(op)
        with self._lock:
            if not op.done.is_set():
                with self._pending_lock:
                    batch, self._pending = self._pending, []
                if self._closed:
                    for o in batch:
                        o.error = _closing()
                        o.done.set()
                else:
                    self._commit(batch)
        op.done.wait()
        if op.error is not None:
            raise op.error
        return op.result  # type: ignore[no-any-return]

    def _connect_writer(self) -> Any:
        """The writer: a psycopg connection of its own (taken out of the engine's pool), in
        autocommit mode, its transactions written as pipelines (see :meth:`_commit`)."""
        raw = self._engine.raw_connection()
        pg = raw.driver_connection
        raw.detach()                     # ours alone; closed by close() or when lost
        pg.autocommit = True
        return pg

    def _commit(self, batch: list[_Op[Any]]) -> None:
        """One transaction for ``batch`` on the writer connection (the caller holds the
        lock), sent as one pipeline (psycopg's pipeline mode): BEGIN, every writer's
        statements and COMMIT leave in one go and their answers come back together, one
        round trip however many writers share it. A batch of completions only is an
        asynchronous commit. A lost connection is dropped (a new one at the next write) and
        reported as Unavailable to every writer of the batch."""
        import psycopg

        durable = any(o.durable for o in batch)
        try:
            with sqldb.unavailable_on_loss(_WHAT):
                if self._read_only:
                    raise errors.FailedPrecondition("this proxy ledger was opened read-only")
                lost = self._writer is None or self._writer.closed or self._writer.broken
                if lost:
                    self._writer = self._connect_writer()
                self._keep_owner(now=lost and self.commits > 0)
                pg = self._writer
                try:
                    with pg.pipeline():
                        pg.execute("BEGIN")
                        if not durable:
                            # outcomes only: visible at once, flushed by the WAL writer
                            pg.execute("SET LOCAL synchronous_commit TO OFF")
                        finishes = [o.run(pg) for o in batch]
                        pg.execute("COMMIT")
                except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                    with contextlib.suppress(Exception):
                        pg.close()
                    self._writer = None
                    raise errors.Unavailable(f"{_WHAT} unavailable: the database cannot be "
                                             f"reached ({type(exc).__name__})") from None
                except BaseException:
                    if pg.broken or pg.closed:
                        self._writer = None
                    elif pg.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                        with contextlib.suppress(Exception):
                            pg.execute("ROLLBACK")
                    raise
                self.commits += 1
                results = [finish() for finish in finishes]
        except BaseException as exc:  # noqa: BLE001 - handed to every writer
            for o in batch:
                o.error = exc
                o.done.set()
        else:
            for o, r in zip(batch, results, strict=True):
                o.result = r
                o.done.set()

    def reserve(self, rows: Sequence[QueryRow]) -> list[int]:
        """Commit ``rows`` (one call attempt, images in order) before they are sent; their
        entry ids. Idempotent on (tenant, call_id, attempts, position)."""
        if not rows:
            return []
        values = [{"tenant": r.tenant, "session_id": r.session_id, "target": r.target,
                   "origin": r.origin, "image_id": r.image_id, "input_sha256": r.input_sha256,
                   "output_summary": r.output_summary, "latency_ms": r.latency_ms,
                   "status": r.status, "error": r.error, "sent_at": r.sent_at,
                   "call_id": r.call_id, "attempts": r.attempts, "position": i,
                   "owner": self.owner} for i, r in enumerate(rows)]
        keys = [(v["tenant"], v["call_id"], v["attempts"], v["position"]) for v in values]
        params = tuple(v[c] for v in values for c in _COLUMNS)
        sql = _insert_sql(len(values))

        def run(pg: Any) -> Callable[[], list[int]]:
            cur = pg.cursor()
            cur.execute(sql, params)          # queued in the pipeline (one round trip)

            def finish() -> list[int]:
                ids = {(t, c, a, p): int(e) for e, t, c, a, p in cur.fetchall()}
                for key in keys:
                    if key not in ids:   # written before: the existing row's id (committed)
                        ids[key] = int(pg.execute(
                            "SELECT entry_id FROM queries WHERE tenant=%s AND call_id=%s AND"
                            " attempts=%s AND position=%s", key).fetchone()[0])
                return [ids[k] for k in keys]
            return finish

        return self._group(run)

    def complete(self, done: Sequence[tuple[int, Outcome]],
                 replies: Sequence[tuple[int, bytes]] = ()) -> None:
        """Record the outcome of reserved rows (committed, so visible to every replica, before
        the answer is returned; as an asynchronous commit: on disk when the server's WAL writer
        flushes, within 3 x ``wal_writer_delay``; a server crash before that leaves the row
        in flight, read INTERRUPTED, still charged); ``replies``: (entry id, serialized
        prediction) kept for a resumed attempt's replay."""
        values = [(o.status, o.error, o.output_summary, o.latency_ms, o.sent_at, entry_id)
                  for entry_id, o in done]
        kept = [(e, blob) for e, blob in replies]

        def run(pg: Any) -> Callable[[], None]:
            cur = pg.cursor()
            for sql, rows in ((_UPDATE_SQL, values), (_REPLY_SQL, kept)):
                if rows:
                    cur.executemany(sql, rows)   # queued in the pipeline (one round trip)
            return lambda: None

        self._group(run, durable=False)

    def record(self, rows: Sequence[QueryRow]) -> None:
        self.reserve(rows)

    # -- reports ----------------------------------------------------------------------------
    def stats(self, session_id: str, tenant: str | None = None) -> SessionStats:
        cond, args = _scope(tenant)
        params = {"sid": session_id, **args}
        with self._read() as conn:
            rows = conn.execute(sa.text(
                "SELECT image_id, origin, status, COUNT(*) FROM queries WHERE session_id=:sid"
                + cond + _SENT_TEXT + " GROUP BY image_id, origin, status"), params).all()
            lat = [float(r[0]) for r in conn.execute(sa.text(   # one latency per attempt
                "SELECT MIN(latency_ms) FROM queries WHERE session_id=:sid" + cond
                + " AND status='OK' GROUP BY call_id, attempts"), params).all()]
            refused = conn.execute(sa.text(
                "SELECT SUM(calls_refused) FROM sessions WHERE session_id=:sid" + cond),
                params).scalar()
        return session_stats([(a, b, c, int(n)) for a, b, c, n in rows], lat,
                             int(refused or 0))

    def entries(self, session_id: str, *, tenant: str | None = None, after_id: int = 0,
                limit: int = 1000) -> list[tuple[Any, ...]]:
        cond, args = _scope(tenant)
        rows = self._rows(
            "SELECT entry_id, tenant, session_id, target, origin, image_id, input_sha256,"
            " output_summary, latency_ms, status, error, sent_at, call_id, attempts"
            " FROM queries WHERE session_id=:sid" + cond + " AND entry_id>:after"
            " ORDER BY entry_id LIMIT :lim",
            {"sid": session_id, **args, "after": after_id, "lim": limit})
        return [tuple(r) for r in rows]

    def send_times(self, target: str | None = None) -> list[float]:
        if target:
            rows = self._rows("SELECT sent_at FROM queries WHERE target=:t ORDER BY sent_at",
                              {"t": target})
        else:
            rows = self._rows("SELECT sent_at FROM queries ORDER BY sent_at", {})
        return [float(r[0]) for r in rows]
