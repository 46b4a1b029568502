"""The query ledger in PostgreSQL, shared by proxy replicas at scale.

The same public methods and semantics as the SQLite :class:`~.ledger.Ledger` (the
:class:`~.ledger.LedgerStorage` protocol the proxy depends on), on the schema of the Alembic
migrations in ``infra/storage/migrations`` (0001 + 0002), through SQLAlchemy 2 (engine,
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

The statements and their row mapping are ``ledger_sql``'s, shared with SQLite (a column or a
query changes there once); what is PostgreSQL's own stays here: the writer connection and its
pipelines, asynchronous commits, and the owner advisory locks above.

Tenant scoping as in SQLite (every proxy read names the tenant; ``tenant=None`` is the
operator's view). ``insert_session`` of an existing (tenant, session_id) writes nothing and
returns the stored session (two replicas creating the same session at once get one row;
``TargetProxy.create_session`` refuses a caller whose settings differ from it). Domain code: no gRPC.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
import structlog
from fortis.infra.storage import sqldb
from fortis.infra.storage.sql_dialects import POSTGRES, SaExecutor
from fortis.services.common import errors
from fortis.services.proxy import ledger_sql
from fortis.services.proxy.ledger import _Op
from fortis.services.proxy.ledger_types import (
    IN_FLIGHT,
    Outcome,
    QueryRow,
    SessionRecord,
    SessionStats,
)

log = structlog.get_logger("fortis.proxy.ledger")

#: First key of the owners' advisory locks ("FRLG"); the second is the owner number.
OWNER_LOCK = 0x46524C47
#: How often (seconds of writing) a ledger checks that it still holds its owner lock.
OWNER_CHECK_S = 5.0
_WHAT = "proxy ledger"

_T = TypeVar("_T")
#: The columns ``reserve`` writes: the shared ones and the row's owner (PostgreSQL only).
_COLUMNS = (*ledger_sql.QUERY_COLUMNS, "owner")
_UPDATE_SQL = ledger_sql.complete_sql(POSTGRES)
_REPLY_SQL = ledger_sql.reply_sql(POSTGRES)
_EXISTING_SQL = ledger_sql.existing_id_sql(POSTGRES)


def _closing() -> errors.Unavailable:
    return errors.Unavailable("the proxy ledger is closed: the server is shutting down")


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
            return ledger_sql.mark_interrupted(SaExecutor(conn), owner)

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
    def _read(self) -> Iterator[SaExecutor]:
        """A pooled connection for one read (its ``conn`` commits a write), refusing work
        once closed; a lost database is Unavailable."""
        if self._closed:
            raise _closing()
        with sqldb.unavailable_on_loss(_WHAT), self._engine.connect() as conn:
            yield SaExecutor(conn)

    # -- sessions -------------------------------------------------------------------------------
    def insert_session(self, s: SessionRecord) -> SessionRecord:
        """Store ``s`` unless the tenant already has a session of that id; the session as
        stored. Two replicas creating one session at once: one row, and both callers get
        that row (the proxy then compares its settings with what each asked for)."""
        with self._read() as x:
            ledger_sql.insert_session(x, s)
            x.conn.commit()
        stored = self.get_session(s.session_id, s.tenant)
        if stored is None:      # pragma: no cover - deleted between the two statements
            raise errors.Unavailable("proxy ledger: the session vanished while being created")
        return stored

    def get_session(self, session_id: str, tenant: str | None = None) -> SessionRecord | None:
        with self._read() as x:
            return ledger_sql.get_session(x, session_id, tenant)

    def sessions_with_prefix(self, prefix: str, tenant: str | None = None) -> list[str]:
        with self._read() as x:
            return ledger_sql.sessions_with_prefix(x, prefix, tenant)

    def add_refused(self, session_id: str, n: int = 1, *, tenant: str) -> None:
        with self._read() as x:
            ledger_sql.add_refused(x, session_id, n, tenant)
            x.conn.commit()

    # -- counts ----------------------------------------------------------------------------------
    def ok_counts(self, session_id: str, tenant: str | None = None) -> dict[str, int]:
        with self._read() as x:
            return ledger_sql.ok_counts(x, session_id, tenant)

    def attempt_counts(self, session_id: str, tenant: str | None = None) -> dict[str, int]:
        with self._read() as x:
            return ledger_sql.attempt_counts(x, session_id, tenant)

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
            with self._read() as x:
                owners = [int(r[0]) for r in x.execute(
                    "SELECT DISTINCT owner FROM queries WHERE status=:f AND owner<>:me",
                    {"f": IN_FLIGHT, "me": self.owner}).fetchall()]
            with self._lock:
                for o in owners:
                    marked += self._interrupt_if_dead(o)
        return marked

    def _interrupt_if_dead(self, owner: int) -> int:
        """Mark the in-flight rows of ``owner`` when its lock is free (its process died);
        the number marked (the caller holds ``_lock``)."""
        params = {"k": OWNER_LOCK, "o": owner}
        if not self._holder.execute(sa.text("SELECT pg_try_advisory_lock(:k, :o)"),
                                    params).scalar():
            return 0            # alive: its rows are in flight for real
        try:
            return self._interrupt_owner(owner)
        finally:
            self._holder.execute(sa.text("SELECT pg_advisory_unlock(:k, :o)"), params)

    def last_entry_id(self) -> int:
        with self._read() as x:
            return ledger_sql.last_entry_id(x)

    def attempts_since(self, t: float) -> dict[str, int]:
        with self._read() as x:
            return ledger_sql.attempts_since(x, t)

    def replayable(self, session_id: str, tenant: str, *, up_to: int
                   ) -> dict[str, list[tuple[str, int]]]:
        with self._read() as x:
            return ledger_sql.replayable(x, session_id, tenant, up_to=up_to)

    def reply(self, entry_id: int) -> bytes | None:
        with self._read() as x:
            return ledger_sql.reply(x, entry_id)

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
        lock), sent as one pipeline (:meth:`_pipeline`); each writer gets its result, or the
        batch's error."""
        try:
            with sqldb.unavailable_on_loss(_WHAT):
                if self._read_only:
                    raise errors.FailedPrecondition("this proxy ledger was opened read-only")
                lost = self._writer is None or self._writer.closed or self._writer.broken
                if lost:
                    self._writer = self._connect_writer()
                self._keep_owner(now=lost and self.commits > 0)
                finishes = self._pipeline(self._writer, batch)
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

    def _pipeline(self, pg: Any, batch: list[_Op[Any]]) -> list[Callable[[], Any]]:
        """Run ``batch`` in one transaction sent as one pipeline (psycopg's pipeline mode):
        BEGIN, every writer's statements and COMMIT leave in one go and their answers come
        back together, one round trip however many writers share it; each writer's step to
        read its answers after the commit. A batch of completions only is an asynchronous
        commit. A lost connection is dropped (a new one at the next write) and reported as
        Unavailable."""
        import psycopg

        try:
            with pg.pipeline():
                pg.execute("BEGIN")
                if not any(o.durable for o in batch):
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
        return finishes

    def reserve(self, rows: Sequence[QueryRow]) -> list[int]:
        """Commit ``rows`` (one call attempt, images in order) before they are sent; their
        entry ids. Idempotent on (tenant, call_id, attempts, position)."""
        if not rows:
            return []
        values = ledger_sql.query_values(rows, self.owner)
        keys = [ledger_sql.attempt_key(v) for v in values]
        params = tuple(v for row in values for v in row)
        sql = ledger_sql.insert_sql(POSTGRES, len(values), _COLUMNS)

        def run(pg: Any) -> Callable[[], list[int]]:
            cur = pg.cursor()
            cur.execute(sql, params)          # queued in the pipeline (one round trip)
            return lambda: ledger_sql.entry_ids(    # written before: the existing row's id
                cur.fetchall(), keys, lambda k: pg.execute(_EXISTING_SQL, k).fetchone()[0])

        return self._group(run)

    def complete(self, done: Sequence[tuple[int, Outcome]],
                 replies: Sequence[tuple[int, bytes]] = ()) -> None:
        """Record the outcome of reserved rows (committed, so visible to every replica, before
        the answer is returned; as an asynchronous commit: on disk when the server's WAL writer
        flushes, within 3 x ``wal_writer_delay``; a server crash before that leaves the row
        in flight, read INTERRUPTED, still charged); ``replies``: (entry id, serialized
        prediction) kept for a resumed attempt's replay."""
        values = ledger_sql.complete_values(done)
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
        with self._read() as x:
            return ledger_sql.stats(x, session_id, tenant)

    def entries(self, session_id: str, *, tenant: str | None = None, after_id: int = 0,
                limit: int = 1000) -> list[tuple[Any, ...]]:
        with self._read() as x:
            return ledger_sql.entries(x, session_id, tenant, after_id=after_id, limit=limit)

    def send_times(self, target: str | None = None) -> list[float]:
        with self._read() as x:
            return ledger_sql.send_times(x, target)
