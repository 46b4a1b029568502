"""The query ledger: every query (one image of one call) recorded in SQLite (WAL).

Rows are committed before the proxy returns the answer, so counts read from the ledger
(QNC, success within Q_m, rate) are facts, not an attack's own bookkeeping (DESIGN.md
section 1). ``synchronous=FULL`` by default: a committed row survives a power cut.
Concurrent writers are grouped into one transaction (group commit) so durability costs one
fsync per group, not per call. Domain code: no gRPC.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    target TEXT NOT NULL,
    query_budget INTEGER NOT NULL,
    per_image_budget INTEGER NOT NULL,
    description TEXT NOT NULL,
    created_at REAL NOT NULL,
    calls_refused INTEGER NOT NULL DEFAULT 0
);
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
    attempts INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS queries_session ON queries(session_id, image_id);
"""


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
    attempts: int


@dataclass(frozen=True, kw_only=True)
class SessionStats:
    queries_ok: int
    queries_failed: int
    calls_refused: int
    per_image: dict[str, tuple[int, int]]   # image_id -> (ok, failed)
    per_origin: dict[str, tuple[int, int]]
    latency_p50_ms: float


class Ledger:
    """SQLite ledger with group commit. Thread-safe."""

    def __init__(self, path: str | Path, *, synchronous: str = "FULL") -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(f"PRAGMA synchronous={synchronous}")
        self._conn.execute("PRAGMA busy_timeout=10000")
        self._conn.executescript(SCHEMA)
        self._lock = threading.Lock()            # guards the connection
        self._pending: list[tuple[list[QueryRow], threading.Event]] = []
        self._pending_lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- sessions -------------------------------------------------------------------------
    def insert_session(self, s: SessionRecord) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT INTO sessions VALUES (?,?,?,?,?,?,?,?)",
                (s.session_id, s.tenant, s.target, s.query_budget, s.per_image_budget,
                 s.description, s.created_at, s.calls_refused))

    def get_session(self, session_id: str) -> SessionRecord | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT session_id, tenant, target, query_budget, per_image_budget, description,"
                " created_at, calls_refused FROM sessions WHERE session_id=?",
                (session_id,)).fetchone()
        if row is None:
            return None
        return SessionRecord(session_id=row[0], tenant=row[1], target=row[2], query_budget=row[3],
                             per_image_budget=row[4], description=row[5], created_at=row[6],
                             calls_refused=row[7])

    def sessions_with_prefix(self, prefix: str) -> list[str]:
        esc = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        with self._lock:
            rows = self._conn.execute("SELECT session_id FROM sessions WHERE session_id LIKE ?"
                                      " ESCAPE '\\' ORDER BY session_id", (esc + "%",)).fetchall()
        return [r[0] for r in rows]

    def add_refused(self, session_id: str, n: int = 1) -> None:
        with self._lock:
            self._conn.execute(
                "UPDATE sessions SET calls_refused = calls_refused + ? WHERE session_id=?",
                (n, session_id))

    def ok_counts(self, session_id: str) -> dict[str, int]:
        """Answered queries per image id (to rebuild budgets after a restart)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT image_id, COUNT(*) FROM queries WHERE session_id=? AND status='OK'"
                " GROUP BY image_id", (session_id,)).fetchall()
        return {r[0]: int(r[1]) for r in rows}

    # -- queries ----------------------------------------------------------------------------
    def record(self, rows: Sequence[QueryRow]) -> None:
        """Commit ``rows`` durably; returns once they are on disk.

        Callers arriving while a commit is in flight are grouped into the next transaction.
        """
        done = threading.Event()
        with self._pending_lock:
            self._pending.append((list(rows), done))
        with self._lock:
            if not done.is_set():
                with self._pending_lock:
                    batch, self._pending = self._pending, []
                values: list[tuple[object, ...]] = []
                for group, _ in batch:
                    values += [(r.tenant, r.session_id, r.target, r.origin, r.image_id,
                                r.input_sha256, r.output_summary, r.latency_ms, r.status, r.error,
                                r.sent_at, r.call_id, r.attempts) for r in group]
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    self._conn.executemany(
                        "INSERT INTO queries (tenant, session_id, target, origin, image_id,"
                        " input_sha256, output_summary, latency_ms, status, error, sent_at,"
                        " call_id, attempts) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", values)
                    self._conn.execute("COMMIT")
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                for _, ev in batch:
                    ev.set()
        done.wait()

    def stats(self, session_id: str) -> SessionStats:
        with self._lock:
            rows = self._conn.execute(
                "SELECT image_id, origin, status, COUNT(*) FROM queries WHERE session_id=?"
                " GROUP BY image_id, origin, status", (session_id,)).fetchall()
            lat = [r[0] for r in self._conn.execute(
                "SELECT latency_ms FROM queries WHERE session_id=? AND status='OK'"
                " GROUP BY call_id", (session_id,)).fetchall()]
            refused = self._conn.execute(
                "SELECT calls_refused FROM sessions WHERE session_id=?", (session_id,)).fetchone()
        per_image: dict[str, list[int]] = {}
        per_origin: dict[str, list[int]] = {}
        ok = failed = 0
        for image_id, origin, status, n in rows:
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
            queries_ok=ok, queries_failed=failed, calls_refused=int(refused[0]) if refused else 0,
            per_image={k: (v[0], v[1]) for k, v in per_image.items()},
            per_origin={k: (v[0], v[1]) for k, v in per_origin.items()}, latency_p50_ms=p50)

    def entries(self, session_id: str, *, after_id: int = 0, limit: int = 1000) -> list[tuple]:
        with self._lock:
            return self._conn.execute(
                "SELECT entry_id, tenant, session_id, target, origin, image_id, input_sha256,"
                " output_summary, latency_ms, status, error, sent_at, call_id, attempts"
                " FROM queries WHERE session_id=? AND entry_id>? ORDER BY entry_id LIMIT ?",
                (session_id, after_id, limit)).fetchall()

    def send_times(self, target: str | None = None) -> list[float]:
        """Send time of every answered query (to check the rate limit from the ledger)."""
        with self._lock:
            if target:
                rows = self._conn.execute(
                    "SELECT sent_at FROM queries WHERE target=? ORDER BY sent_at", (target,))
            else:
                rows = self._conn.execute("SELECT sent_at FROM queries ORDER BY sent_at")
            return [r[0] for r in rows.fetchall()]


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
