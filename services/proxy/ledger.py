"""The query ledger: every query (one image of one attempt) recorded in SQLite (WAL).

Write-ahead (no image is sent without its ledger row): the proxy *reserves* a
row per image, status ``IN_FLIGHT``, before the image is handed to the target, and
*completes* it after (the ``google.rpc.Code`` name of the outcome, latency, output summary).
A crash between the two leaves a visible in-flight row, never a silent gap; every retry
attempt is its own set of rows (``attempts`` = the attempt number, 1 = first), so the ledger
is what the target saw. Rows are committed before the proxy returns the answer, so counts
read from the ledger (QNC, success within Q_m, rate) are facts, not an attack's own
bookkeeping. ``synchronous=FULL`` by default: a reservation is on disk
(fsync) before its image is sent, so it survives a power cut. Concurrent writers
(reservations and completions alike) are grouped into one transaction (group commit) so
durability costs one fsync per group, not per call.

Durability of outcomes: a completion is
committed before the answer is returned (every reader, in any process, sees it at once), but
without its own fsync: a transaction of completions only runs with ``synchronous=NORMAL``,
and its WAL frames reach the disk with the next durable commit (the next reservation's fsync
covers the whole WAL file) or, when none comes, by :data:`OUTCOME_DURABLE_WITHIN_S` at the
latest (a background fsync of the WAL). A process crash loses nothing (the frames are in the
file); a power cut inside that window can lose an outcome, never a reservation: the row then
reads ``INTERRUPTED`` at the next start, still charged (the target may have received it).
This takes one of the two fsyncs of every call off its path.

Crashes (tested by the SIGKILL crash test, ``tests/e2e/test_crash_resume.py``):
when a proxy starts, rows a dead process left ``IN_FLIGHT`` become ``INTERRUPTED``
(:meth:`Ledger.mark_interrupted`): still rows, still charged to the budgets (the target may
have received them), shown as in flight by the stats and as UNKNOWN with a note by
``ListLedgerEntries``. For sessions with a per-image budget (query attacks, IEEE-M6) the
answer of each answered row is kept (``replies``), so a resumed attempt's repeated queries
are answered from the ledger instead of reaching the target again (CAN-9 resume, Q_m kept).

Tenancy: sessions live in their tenant's namespace, keyed by
(tenant, session_id); two tenants may each own a session "X" and see only their own rows.
Every read the proxy makes names the tenant; ``tenant=None`` on a read is the operator's
view over all tenants (``fortis ledger --state-dir``).

Schema versions (``infra/storage/sqlite_schema.py``): the file records its version and is
migrated in place when opened (a copy taken first, one transaction), including files
written before versions were recorded: Fortis 0.2.0's, and earlier ones keyed by the
session id alone (before tenant-scoped keys: the sessions table is rebuilt with the
(tenant, session_id) key, every row kept) or without ``position`` (below). A newer or
damaged file is refused naming ``state_dir``; a reader (``fortis ledger``) refuses an older
one naming ``fortis db upgrade --state-dir DIR``.

Idempotent writes: a row's key is (tenant, call_id, attempts,
position), ``position`` being the image's place in the ``reserve`` call (one call attempt):
reserving the same attempt twice (a retried worker, a commit whose answer was lost) is one
row, and the second ``reserve`` returns the first one's entry ids. A file written before
that key gets the column and the unique index when migrated (old rows get ``-entry_id``,
never an attempt's 0..n-1, so they keep working).

Two implementations of :class:`LedgerStorage`, the interface the proxy depends on: this
SQLite :class:`Ledger` (the embedded default) and ``ledger_pg.PgLedger`` (PostgreSQL, shared
by proxy replicas). Both run the statements of ``ledger_sql`` (written once); what stays
here is SQLite's own: the one connection under a lock, group commit in ``BEGIN IMMEDIATE``
transactions, and the WAL fsync handling above. Domain code: no gRPC.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from fortis.infra.storage import sqlite_schema
from fortis.infra.storage.sql_dialects import SQLITE
from fortis.services.common import errors
from fortis.services.proxy import ledger_sql
from fortis.services.proxy.ledger_types import (  # noqa: F401 - re-exported
    IN_FLIGHT,
    IN_FLIGHT_NOTE,
    INTERRUPTED,
    INTERRUPTED_NOTE,
    NOT_SENT_PREFIX,
    Outcome,
    QueryRow,
    SessionRecord,
    SessionStats,
    session_stats,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    tenant TEXT NOT NULL,
    session_id TEXT NOT NULL,
    target TEXT NOT NULL,
    query_budget INTEGER NOT NULL,
    per_image_budget INTEGER NOT NULL,
    description TEXT NOT NULL,
    created_at REAL NOT NULL,
    calls_refused INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, session_id)
);
CREATE INDEX IF NOT EXISTS sessions_id ON sessions(session_id);
CREATE TABLE IF NOT EXISTS queries (
    entry_id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    session_id TEXT NOT NULL,
    target TEXT NOT NULL,
    origin TEXT NOT NULL,
    image_id TEXT NOT NULL,
    input_sha256 TEXT NOT NULL,
    output_summary TEXT NOT NULL,
    latency_ms REAL NOT NULL,
    status TEXT NOT NULL,
    error TEXT NOT NULL,
    sent_at REAL NOT NULL,
    call_id TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    position INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS queries_session ON queries(session_id, tenant, image_id);
CREATE INDEX IF NOT EXISTS queries_status ON queries(status);
CREATE TABLE IF NOT EXISTS replies (
    entry_id INTEGER PRIMARY KEY,
    prediction BLOB NOT NULL
);
"""
#: The idempotency key of a row: one row per (tenant, call, attempt, image position), so a
#: retried write is the same row, never a second one.
_ATTEMPT_KEY = ("CREATE UNIQUE INDEX IF NOT EXISTS queries_attempt_key"
                " ON queries(tenant, call_id, attempts, position)")

#: The file's versioned schema: version 1 is :data:`SCHEMA` (what Fortis 0.2.0 wrote).
LEDGER_SCHEMA = sqlite_schema.Schema(
    kind="proxy ledger",
    application_id=sqlite_schema.LEDGER_ID,
    baseline=[*sqlite_schema.statements(SCHEMA), _ATTEMPT_KEY],
    steps=(
        # the day's query count per tenant is read by send time when a proxy starts
        # (attempts_since); PostgreSQL has had this index since its first revision
        sqlite_schema.Step(2, "index queries_sent_at", lambda conn: conn.execute(
            "CREATE INDEX IF NOT EXISTS queries_sent_at ON queries(sent_at)")),
    ),
    # rows written before the attempt key: their id as position, unique and never an
    # attempt's 0..n-1 (so they keep counting and new rows stay idempotent)
    filled={("queries", "position"): "UPDATE queries SET position = -entry_id"},
)

_T = TypeVar("_T")


#: Longest time an outcome committed without its own fsync stays off the disk when no durable
#: commit follows it (a power cut in between: the row reads INTERRUPTED, still charged).
OUTCOME_DURABLE_WITHIN_S = 0.05
#: Rows per INSERT statement of ``reserve`` (SQLite binds at most 32766 parameters).
_ROWS_PER_INSERT = 1000


@dataclass
class _Op(Generic[_T]):
    run: Callable[[Any], _T]
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
    #: Must be on disk before the writer goes on (a reservation); False: a completion, durable
    #: with the next durable commit or within OUTCOME_DURABLE_WITHIN_S.
    durable: bool = True


def _closing() -> errors.Unavailable:
    return errors.Unavailable("the proxy ledger is closed: the server is shutting down")



class LedgerStorage(Protocol):
    """What the proxy needs of a ledger, whichever database holds it: :class:`Ledger`
    (SQLite, the embedded default) and ``ledger_pg.PgLedger`` (PostgreSQL, shared by proxy
    replicas) implement it with the same semantics; ``tests/storage/test_ledger.py`` runs
    the same assertions on both."""

    commits: int

    def close(self) -> None: ...
    def insert_session(self, s: SessionRecord) -> SessionRecord:
        """Store ``s`` unless the tenant already has a session of that id; the stored one."""
        ...
    def get_session(self, session_id: str, tenant: str | None = None
                    ) -> SessionRecord | None: ...
    def sessions_with_prefix(self, prefix: str, tenant: str | None = None) -> list[str]: ...
    def add_refused(self, session_id: str, n: int = 1, *, tenant: str) -> None: ...
    def ok_counts(self, session_id: str, tenant: str | None = None) -> dict[str, int]: ...
    def attempt_counts(self, session_id: str, tenant: str | None = None) -> dict[str, int]: ...
    def mark_interrupted(self) -> int: ...
    def last_entry_id(self) -> int: ...
    def attempts_since(self, t: float) -> dict[str, int]: ...
    def replayable(self, session_id: str, tenant: str, *, up_to: int
                   ) -> dict[str, list[tuple[str, int]]]: ...
    def reply(self, entry_id: int) -> bytes | None: ...
    def reserve(self, rows: Sequence[QueryRow]) -> list[int]: ...
    def complete(self, done: Sequence[tuple[int, Outcome]],
                 replies: Sequence[tuple[int, bytes]] = ()) -> None: ...
    def record(self, rows: Sequence[QueryRow]) -> None: ...
    def stats(self, session_id: str, tenant: str | None = None) -> SessionStats: ...
    def entries(self, session_id: str, *, tenant: str | None = None, after_id: int = 0,
                limit: int = 1000) -> list[tuple[Any, ...]]: ...
    def send_times(self, target: str | None = None) -> list[float]: ...


class Ledger:
    """SQLite ledger with write-ahead rows and group commit. Thread-safe."""

    def __init__(self, path: str | Path, *, synchronous: str = "FULL",
                 migrate: bool = True) -> None:
        """Open (or create) the ledger at ``path``, migrating an older file in place;
        ``migrate=False`` (a reader): refuse an older file naming ``fortis db upgrade``."""
        self.path = str(path)
        self._conn = sqlite_schema.open_db(self.path, LEDGER_SCHEMA, migrate=migrate)
        wal = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
        self._conn.execute(f"PRAGMA synchronous={synchronous}")
        self._conn.execute("PRAGMA busy_timeout=10000")
        self._lock = threading.Lock()            # guards the connection
        #: Transactions committed by :meth:`_group` (fewer than writers: group commit).
        self.commits = 0
        #: Of those, the ones at the configured ``synchronous`` level (with FULL: an fsync;
        #: completions alone skip it, see OUTCOME_DURABLE_WITHIN_S).
        self.durable_commits = 0
        self._closed = False
        self._pending: list[_Op[Any]] = []
        self._pending_lock = threading.Lock()
        #: Completions may skip their fsync only when the operator asked for fsyncs at all.
        #: (and only in WAL mode, where one fsync of the WAL file covers every commit before it).
        self._relax = wal and synchronous.upper() in ("FULL", "EXTRA", "2", "3")
        self._synchronous = synchronous.upper()
        self._mode = self._synchronous           # the connection's setting now
        #: Set while outcomes committed since the last fsync of the WAL wait for one (see
        #: OUTCOME_DURABLE_WITHIN_S); ``_undurable_since``: when the oldest of them was.
        self._undurable = threading.Event()
        self._undurable_since: float | None = None
        self._flusher: threading.Thread | None = None

    def close(self) -> None:
        """Close the connection once the write in progress is done; later calls (a request
        still running while the server stops) get UNAVAILABLE, never a closed-database bug
        (their reserved rows stay IN_FLIGHT and are marked INTERRUPTED at the next start)."""
        with self._lock:
            if not self._closed:
                self._sync_wal()        # outcomes committed without an fsync: on disk now
                self._closed = True
                self._conn.close()
        self._undurable.set()           # wakes the flusher, which sees the ledger closed
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join(5)

    def _sync_wal(self) -> None:
        """fsync the WAL file (the caller holds the lock): every committed outcome is then on
        disk. Frames of NORMAL commits are in the file already; this only waits for the disk."""
        if self._undurable_since is None:
            return
        with contextlib.suppress(OSError):
            fd = os.open(self.path + "-wal", os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._durable_now()

    def _durable_now(self) -> None:
        self._undurable_since = None
        self._undurable.clear()

    def _flush_outcomes(self) -> None:
        """Background thread: outcomes committed without an fsync reach the disk within
        OUTCOME_DURABLE_WITHIN_S when no durable commit (a reservation) does it first. Under
        steady load every reservation's fsync does it, and this thread only looks (every
        half-period, without the lock); idle, it sleeps until an outcome comes."""
        half = OUTCOME_DURABLE_WITHIN_S / 2
        while True:
            self._undurable.wait()
            if self._closed:
                return
            time.sleep(half)
            since = self._undurable_since
            if since is None or time.monotonic() - since < half:
                continue                    # a reservation's fsync came, or it is recent
            with self._lock:
                if self._closed:
                    return
                self._sync_wal()

    @contextlib.contextmanager
    def _db(self) -> Iterator[None]:
        """The connection's lock, refusing work once the ledger is closed."""
        with self._lock:
            if self._closed:
                raise _closing()
            yield

    # -- sessions -------------------------------------------------------------------------
    def insert_session(self, s: SessionRecord) -> SessionRecord:
        """Store ``s`` unless the tenant already has a session of that id (then nothing is
        written); the session as stored, which the caller compares with what it asked for."""
        with self._db():
            ledger_sql.insert_session(self._conn, s)
        stored = self.get_session(s.session_id, s.tenant)
        assert stored is not None
        return stored

    def get_session(self, session_id: str, tenant: str | None = None) -> SessionRecord | None:
        """The tenant's session ``session_id`` (``tenant=None``: the operator's view, the
        first tenant's session of that id)."""
        with self._db():
            return ledger_sql.get_session(self._conn, session_id, tenant)

    def sessions_with_prefix(self, prefix: str, tenant: str | None = None) -> list[str]:
        with self._db():
            return ledger_sql.sessions_with_prefix(self._conn, prefix, tenant)

    def add_refused(self, session_id: str, n: int = 1, *, tenant: str) -> None:
        with self._db():
            ledger_sql.add_refused(self._conn, session_id, n, tenant)

    def ok_counts(self, session_id: str, tenant: str | None = None) -> dict[str, int]:
        """Answered queries per image id (IEEE-M6 counts answered queries)."""
        with self._db():
            return ledger_sql.ok_counts(self._conn, session_id, tenant)

    def attempt_counts(self, session_id: str, tenant: str | None = None) -> dict[str, int]:
        """Rows per image id, whatever their status: what the target received (retries and
        in-flight rows included; rows completed as ``not sent`` excluded: the budget got
        them back), to rebuild the hard budgets after a restart."""
        with self._db():
            return ledger_sql.attempt_counts(self._conn, session_id, tenant)

    def mark_interrupted(self) -> int:
        """Mark every ``IN_FLIGHT`` row ``INTERRUPTED``; the number marked. Called once by
        the ledger's one writer (the proxy) when it starts: rows still in flight then were
        reserved by a process that died before completing them. Readers (``fortis ledger``)
        never call it."""
        with self._db():
            return ledger_sql.mark_interrupted(self._conn)

    def last_entry_id(self) -> int:
        with self._db():
            return ledger_sql.last_entry_id(self._conn)

    def attempts_since(self, t: float) -> dict[str, int]:
        """Rows per tenant sent at or after wall-clock ``t`` (every attempt the target
        received or may have received; rows completed as ``not sent`` excluded): the start
        of the proxy's queries-per-day count (``quotas.py``)."""
        with self._db():
            return ledger_sql.attempts_since(self._conn, t)

    def replayable(self, session_id: str, tenant: str, *, up_to: int
                   ) -> dict[str, list[tuple[str, int]]]:
        """Answered rows of a session with a recorded reply, ``entry_id <= up_to``, per image
        id in send order: ``(input_sha256, entry_id)``. A resumed query attack re-sends the
        same queries in the same order; the proxy answers those from here instead of sending
        them again (the target already answered them once)."""
        with self._db():
            return ledger_sql.replayable(self._conn, session_id, tenant, up_to=up_to)

    def reply(self, entry_id: int) -> bytes | None:
        """The recorded answer (a serialized prediction) of an answered row."""
        with self._db():
            return ledger_sql.reply(self._conn, entry_id)

    # -- queries ----------------------------------------------------------------------------
    def _group(self, run: Callable[[sqlite3.Connection], _T], *, durable: bool = True) -> _T:
        """Run ``run`` in a transaction shared with the writers waiting meanwhile (group
        commit); returns once it is committed, and with ``durable`` once it is on disk
        (otherwise with the next durable commit, see OUTCOME_DURABLE_WITHIN_S). A failed
        group fails each of its writers (none waits forever)."""
        op: _Op[_T] = _Op(run, durable=durable or not self._relax)
        with self._pending_lock:
            self._pending.append(op)
        with self._lock:
            if not op.done.is_set():
                with self._pending_lock:
                    batch, self._pending = self._pending, []
                if self._closed:            # fail every waiting writer, none waits forever
                    for o in batch:
                        o.error = _closing()
                        o.done.set()
                else:
                    self._commit(batch)
        op.done.wait()
        if op.error is not None:
            raise op.error
        return op.result  # type: ignore[no-any-return]

    def _commit(self, batch: list[_Op[Any]]) -> None:
        """One transaction for ``batch`` (the caller holds the lock): durable (the configured
        ``synchronous``) when any writer of it needs that, else ``synchronous=NORMAL``."""
        durable = any(o.durable for o in batch)
        try:
            self._set_synchronous(self._synchronous if durable else "NORMAL")
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                results = [o.run(self._conn) for o in batch]
                self._conn.execute("COMMIT")
                self.commits += 1
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._committed(durable)
        except BaseException as exc:  # noqa: BLE001 - handed to every writer
            for o in batch:
                o.error = exc
                o.done.set()
        else:
            for o, r in zip(batch, results, strict=True):
                o.result = r
                o.done.set()

    def _set_synchronous(self, mode: str) -> None:
        """The connection's ``synchronous`` for the next transaction (set only on a change)."""
        if mode != self._mode:
            self._conn.execute(f"PRAGMA synchronous={mode}")
            self._mode = mode

    def _committed(self, durable: bool) -> None:
        """After a commit: a durable one covered every outcome waiting for an fsync; one
        without (outcomes only) starts the wait, and the background flusher if needed."""
        if durable:
            self.durable_commits += 1
            if self._undurable_since is not None:
                self._durable_now()         # the fsync covered the whole WAL
        elif self._relax:
            if self._undurable_since is None:
                self._undurable_since = time.monotonic()
                self._undurable.set()
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_outcomes, daemon=True,
                                                 name="ledger-fsync")
                self._flusher.start()

    def reserve(self, rows: Sequence[QueryRow]) -> list[int]:
        """Commit ``rows`` (normally status ``IN_FLIGHT``; one call attempt, the images in
        order: a row's position is its index) before their images are sent; returns their
        entry ids, for :meth:`complete`. Idempotent: a row whose (tenant, call_id, attempts,
        position) is already there is not written again, its existing id is returned."""
        values = ledger_sql.query_values(rows)
        keys = [ledger_sql.attempt_key(v) for v in values]

        def run(conn: sqlite3.Connection) -> list[int]:
            returned: list[Any] = []
            for i in range(0, len(values), _ROWS_PER_INSERT):
                chunk = values[i:i + _ROWS_PER_INSERT]
                returned += conn.execute(ledger_sql.insert_sql(SQLITE, len(chunk)),
                                         [v for row in chunk for v in row]).fetchall()
            existing = ledger_sql.existing_id_sql(SQLITE)
            return ledger_sql.entry_ids(     # written before: the existing row's id
                returned, keys, lambda k: conn.execute(existing, k).fetchone()[0])

        return self._group(run)

    def complete(self, done: Sequence[tuple[int, Outcome]],
                 replies: Sequence[tuple[int, bytes]] = ()) -> None:
        """Record the outcome of reserved rows (committed before the answer is returned, on
        disk with the next durable commit or within OUTCOME_DURABLE_WITHIN_S); ``replies``:
        (entry id, serialized prediction) kept for a resumed attempt's replay."""
        values = ledger_sql.complete_values(done)
        kept = list(replies)

        def run(conn: sqlite3.Connection) -> None:
            conn.executemany(ledger_sql.complete_sql(SQLITE), values)
            if kept:
                conn.executemany(ledger_sql.reply_sql(SQLITE), kept)

        self._group(run, durable=False)

    def record(self, rows: Sequence[QueryRow]) -> None:
        """Commit finished ``rows`` at once (reservation and outcome in one)."""
        self.reserve(rows)

    def stats(self, session_id: str, tenant: str | None = None) -> SessionStats:
        with self._db():
            return ledger_sql.stats(self._conn, session_id, tenant)

    def entries(self, session_id: str, *, tenant: str | None = None, after_id: int = 0,
                limit: int = 1000) -> list[tuple[Any, ...]]:
        with self._db():
            return ledger_sql.entries(self._conn, session_id, tenant, after_id=after_id,
                                      limit=limit)

    def send_times(self, target: str | None = None) -> list[float]:
        """Send time of every query the target received (to check the rate limit from the
        ledger; retries are sends too)."""
        with self._db():
            return ledger_sql.send_times(self._conn, target)


def max_in_window(times: Iterable[float], window: float = 1.0) -> int:
    """Largest number of events in any half-open window [t, t + window)."""
    ts = sorted(times)
    best = 0
    j = 0
    for i, t in enumerate(ts):
        while ts[j] <= t - window:
            j += 1
        best = max(best, i - j + 1)
    return best


def wall_clock_of(monotonic_t: float) -> float:
    """Map a time.monotonic() reading to wall-clock seconds (one fixed offset per process)."""
    return monotonic_t + _OFFSET


_OFFSET = time.time() - time.monotonic()
