"""Durable state of evaluations (CAN-9): SQLite, one row per evaluation and per work item.

A work item (the clean pass over a chunk of images, one corruption at one severity over a
chunk, one attack over a chunk) is committed with its results when it finishes; a restarted
service skips finished items and redoes the rest. Domain code: no gRPC.

Pluggable state: :class:`EvaluationStorage` is the surface the service's code
depends on; :class:`EvaluationStore` (SQLite, the embedded default) and
``store_pg.PgEvaluationStore`` (PostgreSQL) implement it. Several workers share an
evaluation's items through leases (:meth:`EvaluationStore.claim_items`: ``BEGIN IMMEDIATE``
here, ``FOR UPDATE SKIP LOCKED`` in PostgreSQL): a claimed item is its worker's until the
lease expires or is released, so two workers never run the same item.

Schema versions (``services/common/sqlite_schema.py``): the file records its version; an
older one (Fortis 0.2.0 wrote files without a version; earlier builds keyed evaluations and
items without the tenant, or had no lease columns) is migrated in place when opened, after a
copy is taken, in one transaction; a newer or damaged one is refused naming ``state_dir``.

Artifacts: what an evaluation keeps besides its item results, such as the
adversarial examples of its attack stages (CAN-9: kept as float arrays as well as the images
sent), live in the store too, keyed by (tenant, evaluation id, name) and written by whichever
worker ran the item, so separate pods need no shared disk (:meth:`EvaluationStore.put_artifact`;
content in parts of :data:`ARTIFACT_PART_BYTES`; names checked by :func:`check_artifact_name`,
so an export never writes outside its folder). ``fortis artifacts list|export`` reads them.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fortis.services.common import errors, sqlite_schema
from fortis.services.common.limits import MAX_ARTIFACT_BYTES, MAX_ARTIFACT_NAME_CHARS

SCHEMA = """
CREATE TABLE IF NOT EXISTS evaluations (
    evaluation_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    state TEXT NOT NULL,
    plan_text TEXT NOT NULL,
    plan_name TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    error_code TEXT NOT NULL DEFAULT '',
    error_message TEXT NOT NULL DEFAULT '',
    resumed_count INTEGER NOT NULL DEFAULT 0,
    stage TEXT NOT NULL DEFAULT 'plan',
    items_done INTEGER NOT NULL DEFAULT 0,
    items_total INTEGER NOT NULL DEFAULT 0,
    queries INTEGER NOT NULL DEFAULT 0,
    message TEXT NOT NULL DEFAULT '',
    summary_json TEXT NOT NULL DEFAULT '',
    images_done INTEGER NOT NULL DEFAULT 0,
    images_total INTEGER NOT NULL DEFAULT 0,
    error_status BLOB,
    report_json TEXT NOT NULL DEFAULT '',
    report_html TEXT NOT NULL DEFAULT '',
    started_at REAL NOT NULL DEFAULT 0,
    finished_at REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, evaluation_id)
);
CREATE TABLE IF NOT EXISTS items (
    tenant TEXT NOT NULL,
    evaluation_id TEXT NOT NULL,
    item_key TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    done INTEGER NOT NULL DEFAULT 0,
    result BLOB,
    lease_owner TEXT NOT NULL DEFAULT '',
    lease_expires REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, evaluation_id, item_key)
);
CREATE TABLE IF NOT EXISTS artifacts (
    tenant TEXT NOT NULL,
    evaluation_id TEXT NOT NULL,
    name TEXT NOT NULL,
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (tenant, evaluation_id, name)
);
CREATE TABLE IF NOT EXISTS artifact_parts (
    tenant TEXT NOT NULL,
    evaluation_id TEXT NOT NULL,
    name TEXT NOT NULL,
    seq INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (tenant, evaluation_id, name, seq)
);
"""

#: The file's versioned schema: version 1 is :data:`SCHEMA` (what Fortis 0.2.0 wrote).
STORE_SCHEMA = sqlite_schema.Schema(
    kind="evaluation store",
    application_id=sqlite_schema.EVALUATION_STORE_ID,
    baseline=sqlite_schema.statements(SCHEMA),
    steps=(
        # the pending and running evaluations are looked up by state when a service starts
        # (active()); PostgreSQL has had this index since its first revision
        sqlite_schema.Step(2, "index evaluations_state", lambda conn: conn.execute(
            "CREATE INDEX IF NOT EXISTS evaluations_state ON evaluations(state)")),
    ),
    # a file from before tenant namespaces: an item belongs to its evaluation's tenant
    derived={("items", "tenant"): "COALESCE((SELECT e.tenant FROM evaluations e WHERE"
                                  " e.evaluation_id = {old}.evaluation_id), '')"},
)

ACTIVE_STATES = ("PENDING", "RUNNING")
FINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")


def summary_json(summary: Any) -> str:
    """The stored form of an evaluation's headline results (``ports.Summary``)."""
    return json.dumps({"accuracy": summary.accuracy,
                       "average_robustness_corr": summary.average_robustness_corr,
                       "average_robustness_adv": summary.average_robustness_adv,
                       "m": summary.m,
                       "failed_settings": list(getattr(summary, "failed_settings", ()))})


@dataclass(frozen=True)
class EvaluationRow:
    evaluation_id: str
    tenant: str
    state: str
    plan_text: str
    plan_name: str
    created_at: float
    updated_at: float
    error_code: str
    error_message: str
    resumed_count: int
    stage: str
    items_done: int
    items_total: int
    queries: int
    message: str
    summary_json: str
    started_at: float
    finished_at: float
    images_done: int
    images_total: int
    error_status: bytes | None


@dataclass(frozen=True)
class ArtifactInfo:
    """A stored artifact's metadata (never its content)."""

    name: str
    size: int
    sha256: str
    created_at: float


#: Bytes of one stored part of an artifact (rows of bounded size in either database).
ARTIFACT_PART_BYTES = 4 * 1024 * 1024
_ARTIFACT_PART = r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]*"
_ARTIFACT_NAME = re.compile(rf"{_ARTIFACT_PART}(/{_ARTIFACT_PART}){{0,7}}")


def check_artifact_name(name: object, field: str = "name") -> str:
    """``name`` when it is a safe artifact name: '/'-separated parts of letters, digits, '_',
    '-', '.', none empty or starting with '.' (so no '..', no absolute path), at most
    :data:`~fortis.services.common.limits.MAX_ARTIFACT_NAME_CHARS` characters; InvalidArgument
    on ``field`` otherwise (never echoing it)."""
    if not isinstance(name, str) or len(name) > MAX_ARTIFACT_NAME_CHARS \
            or not _ARTIFACT_NAME.fullmatch(name):
        n = len(name) if isinstance(name, str) else 0
        raise errors.InvalidArgument(field, f"an artifact name is 1 to {MAX_ARTIFACT_NAME_CHARS}"
                                     " characters: '/'-separated parts of letters, digits, '_',"
                                     f" '-', '.', none starting with '.' (got {n} characters)")
    return name


def check_artifact(evaluation_id: str, name: str, data: bytes) -> str:
    """Check an artifact to store (the evaluation id, the name, the size); its SHA-256."""
    if not evaluation_id or len(evaluation_id) > 100:
        raise errors.InvalidArgument("evaluation_id", "1 to 100 characters")
    check_artifact_name(name)
    if len(data) > MAX_ARTIFACT_BYTES:
        raise errors.InvalidArgument("data", f"{len(data):,} bytes; an artifact holds at most "
                                     f"{MAX_ARTIFACT_BYTES:,}")
    return hashlib.sha256(data).hexdigest()


def artifact_parts(data: bytes) -> builtins.list[bytes]:
    """``data`` cut into stored parts (one empty part for empty data)."""
    return [data[i:i + ARTIFACT_PART_BYTES]
            for i in range(0, len(data), ARTIFACT_PART_BYTES)] or [b""]


def joined_artifact(info: ArtifactInfo, parts: Iterable[bytes]) -> bytes:
    """The stored parts joined, checked against the recorded size and SHA-256."""
    data = b"".join(parts)
    if len(data) != info.size or hashlib.sha256(data).hexdigest() != info.sha256:
        raise errors.Internal(f"artifact {info.name} is damaged in the evaluation store")
    return data


#: Bounds of a claim: items per claim, and the lease in seconds.
MAX_CLAIM = 10_000
MAX_LEASE_S = 86_400.0


def check_claim(worker_id: str, limit: int, lease_s: float) -> None:
    """InvalidArgument naming the parameter of a malformed claim."""
    if not worker_id or len(worker_id) > 200:
        raise errors.InvalidArgument("worker_id", "1 to 200 characters")
    if not 1 <= limit <= MAX_CLAIM:
        raise errors.InvalidArgument("limit", f"from 1 to {MAX_CLAIM} items per claim")
    if not 0 < lease_s <= MAX_LEASE_S:
        raise errors.InvalidArgument("lease_s", f"more than 0 and at most {MAX_LEASE_S:.0f} s")


class EvaluationStorage(Protocol):
    """What the evaluation service needs of its durable state (SQLite or
    PostgreSQL behind the same methods and semantics)."""

    tenant: str | None

    def for_tenant(self, tenant: str) -> EvaluationStorage: ...
    @property
    def changed(self) -> threading.Condition: ...
    @property
    def version(self) -> int: ...
    def close(self) -> None: ...
    def insert(self, *, evaluation_id: str, tenant: str, plan_text: str,
               plan_name: str) -> None: ...
    def get(self, evaluation_id: str) -> EvaluationRow | None: ...
    def list(self, tenant: str, *, limit: int,
             after: tuple[float, str] | None = None) -> builtins.list[EvaluationRow]: ...
    def active(self) -> builtins.list[EvaluationRow]: ...
    def update(self, evaluation_id: str, **fields: Any) -> None: ...
    def update_running(self, evaluation_id: str, **fields: Any) -> bool: ...
    def finish(self, evaluation_id: str, *, report_json: str, report_html: str, summary: Any,
               finished_at: float) -> bool: ...
    def mark_resumed(self, evaluation_id: str) -> None: ...
    def report(self, evaluation_id: str) -> tuple[str, str]: ...
    def item(self, evaluation_id: str, key: str) -> tuple[bool, int, bytes | None]: ...
    def start_item(self, evaluation_id: str, key: str) -> int: ...
    def finish_item(self, evaluation_id: str, key: str, result: bytes, *, items_done: int,
                    images_done: int, queries: int, message: str) -> None: ...
    def items(self, evaluation_id: str) -> Iterator[tuple[str, int, bool]]: ...
    def add_items(self, evaluation_id: str, keys: Iterable[str]) -> int: ...
    def claim_items(self, evaluation_id: str, worker_id: str, *, limit: int,
                    lease_s: float) -> builtins.list[str]: ...
    def renew_leases(self, evaluation_id: str, worker_id: str, *, lease_s: float) -> int: ...
    def release_items(self, evaluation_id: str, worker_id: str,
                      keys: Iterable[str] | None = None) -> int: ...
    def expire_leases(self, evaluation_id: str) -> int: ...
    def leases(self, evaluation_id: str) -> dict[str, str]: ...
    def claim_key(self, evaluation_id: str, key: str, worker_id: str, *,
                  lease_s: float) -> str: ...
    def finish_claimed(self, evaluation_id: str, key: str, worker_id: str, result: bytes, *,
                       images: int, queries: int, message: str) -> bool: ...
    def put_artifact(self, evaluation_id: str, name: str, data: bytes) -> ArtifactInfo: ...
    def artifacts(self, evaluation_id: str) -> builtins.list[ArtifactInfo]: ...
    def artifact(self, evaluation_id: str, name: str) -> bytes | None: ...


_COLS = ("evaluation_id, tenant, state, plan_text, plan_name, created_at, updated_at, error_code,"
         " error_message, resumed_count, stage, items_done, items_total, queries, message,"
         " summary_json, started_at, finished_at, images_done, images_total, error_status")


class _Db:
    """What the views of one store share: the connection, its lock, the change signal."""

    def __init__(self, path: str | Path, *, migrate: bool = True) -> None:
        self.conn = sqlite_schema.open_db(path, STORE_SCHEMA, migrate=migrate)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.version = 0


class EvaluationStore:
    def __init__(self, path: str | Path, *, migrate: bool = True) -> None:
        """Open (or create) the store at ``path``, migrating an older file in place;
        ``migrate=False`` (a reader that must not change the file): refuse an older file
        naming ``fortis db upgrade --state-dir DIR``."""
        self._db = _Db(path, migrate=migrate)
        self._conn = self._db.conn
        self._lock = self._db.lock
        self.tenant: str | None = None

    def for_tenant(self, tenant: str) -> EvaluationStore:
        """The view of this store in ``tenant``'s namespace (same connection and signal)."""
        view = object.__new__(EvaluationStore)
        view._db, view._conn, view._lock, view.tenant = self._db, self._conn, self._lock, tenant
        return view

    def _t(self) -> str:
        if self.tenant is None:
            raise RuntimeError("per-evaluation access needs a tenant's view (for_tenant)")
        return self.tenant

    @property
    def changed(self) -> threading.Condition:
        return self._db.changed

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _bump(self) -> None:
        self._db.version += 1
        self._db.changed.notify_all()

    @property
    def version(self) -> int:
        return self._db.version

    def insert(self, *, evaluation_id: str, tenant: str, plan_text: str, plan_name: str) -> None:
        if self.tenant is not None and tenant != self.tenant:
            raise RuntimeError("a tenant's view inserts only into its own namespace")
        now = time.time()
        with self._lock:
            self._conn.execute(
                "INSERT INTO evaluations (evaluation_id, tenant, state, plan_text, plan_name,"
                " created_at, updated_at) VALUES (?,?,?,?,?,?,?)",
                (evaluation_id, tenant, "PENDING", plan_text, plan_name, now, now))
            self._bump()

    def get(self, evaluation_id: str) -> EvaluationRow | None:
        with self._lock:
            row = self._conn.execute(f"SELECT {_COLS} FROM evaluations WHERE tenant=? AND"
                                     " evaluation_id=?", (self._t(), evaluation_id)).fetchone()
        return EvaluationRow(*row) if row else None

    def list(self, tenant: str, *, limit: int,
             after: tuple[float, str] | None = None) -> list[EvaluationRow]:
        """A tenant's evaluations, newest first, starting after the (created_at,
        evaluation_id) cursor of the previous page's last row."""
        with self._lock:
            if after is None:
                rows = self._conn.execute(
                    f"SELECT {_COLS} FROM evaluations WHERE tenant=? ORDER BY created_at DESC,"
                    " evaluation_id DESC LIMIT ?", (tenant, limit)).fetchall()
            else:
                rows = self._conn.execute(
                    f"SELECT {_COLS} FROM evaluations WHERE tenant=? AND (created_at<? OR"
                    " (created_at=? AND evaluation_id<?)) ORDER BY created_at DESC,"
                    " evaluation_id DESC LIMIT ?",
                    (tenant, after[0], after[0], after[1], limit)).fetchall()
        return [EvaluationRow(*r) for r in rows]

    def active(self) -> builtins.list[EvaluationRow]:
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {_COLS} FROM evaluations WHERE state IN ('PENDING','RUNNING')"
                " ORDER BY created_at").fetchall()
        return [EvaluationRow(*r) for r in rows]

    def update(self, evaluation_id: str, **fields: Any) -> None:
        if not fields:
            return
        fields["updated_at"] = time.time()
        sets = ", ".join(f"{k}=?" for k in fields)
        with self._lock:
            self._conn.execute(f"UPDATE evaluations SET {sets} WHERE tenant=? AND"
                               " evaluation_id=?", (*fields.values(), self._t(), evaluation_id))
            self._bump()

    def update_running(self, evaluation_id: str, **fields: Any) -> bool:
        """Update an evaluation only while it is pending or running: once a caller cancelled
        it (or it ended), a late update from its worker never overwrites the final state.
        Returns whether the row was updated."""
        if not fields:
            return False
        fields["updated_at"] = time.time()
        sets = ", ".join(f"{k}=?" for k in fields)
        with self._lock:
            cur = self._conn.execute(
                f"UPDATE evaluations SET {sets} WHERE tenant=? AND evaluation_id=? AND state IN"
                " ('PENDING','RUNNING')", (*fields.values(), self._t(), evaluation_id))
            self._bump()
            return cur.rowcount > 0

    def finish(self, evaluation_id: str, *, report_json: str, report_html: str, summary: Any,
               finished_at: float) -> bool:
        """Mark a running evaluation SUCCEEDED with its report and summary."""
        return self.update_running(
            evaluation_id, state="SUCCEEDED", stage="done", report_json=report_json,
            report_html=report_html, finished_at=finished_at, message="",
            summary_json=summary_json(summary))

    def mark_resumed(self, evaluation_id: str) -> None:
        with self._lock:
            self._conn.execute("UPDATE evaluations SET resumed_count=resumed_count+1,"
                               " updated_at=? WHERE tenant=? AND evaluation_id=?",
                               (time.time(), self._t(), evaluation_id))
            self._bump()

    def report(self, evaluation_id: str) -> tuple[str, str]:
        with self._lock:
            row = self._conn.execute("SELECT report_json, report_html FROM evaluations WHERE"
                                     " tenant=? AND evaluation_id=?",
                                     (self._t(), evaluation_id)).fetchone()
        return (row[0], row[1]) if row else ("", "")

    # -- items ------------------------------------------------------------------------------
    def item(self, evaluation_id: str, key: str) -> tuple[bool, int, bytes | None]:
        """(done, attempts so far, result blob) of an item."""
        with self._lock:
            row = self._conn.execute("SELECT done, attempts, result FROM items WHERE tenant=?"
                                     " AND evaluation_id=? AND item_key=?",
                                     (self._t(), evaluation_id, key)).fetchone()
        if row is None:
            return False, 0, None
        return bool(row[0]), int(row[1]), (bytes(row[2]) if row[2] is not None else None)

    def start_item(self, evaluation_id: str, key: str) -> int:
        """Record a new attempt at an item; returns its attempt number (1 = first)."""
        with self._lock:
            tenant = self._t()
            self._conn.execute(
                "INSERT INTO items (tenant, evaluation_id, item_key, attempts) VALUES (?,?,?,1)"
                " ON CONFLICT(tenant, evaluation_id, item_key) DO UPDATE SET"
                " attempts=attempts+1", (tenant, evaluation_id, key))
            row = self._conn.execute("SELECT attempts FROM items WHERE tenant=? AND"
                                     " evaluation_id=? AND item_key=?",
                                     (tenant, evaluation_id, key)).fetchone()
        return int(row[0])

    def finish_item(self, evaluation_id: str, key: str, result: bytes, *, items_done: int,
                    images_done: int, queries: int, message: str) -> None:
        """Commit an item's result and the evaluation's progress in one transaction (the
        progress only while the evaluation is still running: a cancelled one keeps its
        "cancelled by a caller" message)."""
        tenant = self._t()
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.execute("UPDATE items SET done=1, result=? WHERE tenant=? AND"
                                   " evaluation_id=? AND item_key=?",
                                   (result, tenant, evaluation_id, key))
                self._conn.execute("UPDATE evaluations SET items_done=?, images_done=?,"
                                   " queries=?, message=?, updated_at=? WHERE tenant=? AND"
                                   " evaluation_id=? AND state IN ('PENDING','RUNNING')",
                                   (items_done, images_done, queries, message, time.time(),
                                    tenant, evaluation_id))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._bump()

    def items(self, evaluation_id: str) -> Iterator[tuple[str, int, bool]]:
        with self._lock:
            rows = self._conn.execute("SELECT item_key, attempts, done FROM items WHERE"
                                      " tenant=? AND evaluation_id=? ORDER BY item_key",
                                      (self._t(), evaluation_id)).fetchall()
        for r in rows:
            yield r[0], int(r[1]), bool(r[2])

    # -- claims: several workers share an evaluation's items --------------------------------
    def add_items(self, evaluation_id: str, keys: Iterable[str]) -> int:
        """Record the items of an evaluation as pending (those already known are kept as
        they are); the number added."""
        tenant = self._t()
        with self._lock:
            cur = self._conn.executemany(
                "INSERT INTO items (tenant, evaluation_id, item_key) VALUES (?,?,?)"
                " ON CONFLICT(tenant, evaluation_id, item_key) DO NOTHING",
                [(tenant, evaluation_id, k) for k in keys])
            return int(cur.rowcount or 0)

    def claim_items(self, evaluation_id: str, worker_id: str, *, limit: int,
                    lease_s: float) -> builtins.list[str]:
        """Up to ``limit`` unfinished items nobody holds (never leased, released, or whose
        lease expired: a dead worker's) leased to ``worker_id`` for ``lease_s`` seconds, in
        key order. One ``BEGIN IMMEDIATE`` transaction: claims by other connections and
        processes wait for it, so no item is handed to two workers."""
        check_claim(worker_id, limit, lease_s)
        tenant = self._t()
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                now = time.time()
                keys = [r[0] for r in self._conn.execute(
                    "SELECT item_key FROM items WHERE tenant=? AND evaluation_id=? AND done=0"
                    " AND (lease_owner='' OR lease_expires<=?) ORDER BY item_key LIMIT ?",
                    (tenant, evaluation_id, now, limit)).fetchall()]
                self._conn.executemany(
                    "UPDATE items SET lease_owner=?, lease_expires=? WHERE tenant=? AND"
                    " evaluation_id=? AND item_key=?",
                    [(worker_id, now + lease_s, tenant, evaluation_id, k) for k in keys])
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return keys

    def renew_leases(self, evaluation_id: str, worker_id: str, *, lease_s: float) -> int:
        """Extend the leases ``worker_id`` still holds (its heartbeat); the number renewed
        (an item another worker claimed after this one's lease expired is not)."""
        check_claim(worker_id, 1, lease_s)
        with self._lock:
            cur = self._conn.execute(
                "UPDATE items SET lease_expires=? WHERE tenant=? AND evaluation_id=? AND"
                " lease_owner=? AND done=0", (time.time() + lease_s, self._t(), evaluation_id,
                                              worker_id))
            return int(cur.rowcount or 0)

    def release_items(self, evaluation_id: str, worker_id: str,
                      keys: Iterable[str] | None = None) -> int:
        """Give back ``worker_id``'s leases of unfinished items (all, or those of ``keys``):
        the items can be claimed at once (a worker stopping cleanly). A finished item keeps
        the name of the worker that ran it."""
        tenant = self._t()
        with self._lock:
            if keys is None:
                cur = self._conn.execute(
                    "UPDATE items SET lease_owner='', lease_expires=0 WHERE tenant=? AND"
                    " evaluation_id=? AND lease_owner=? AND done=0",
                    (tenant, evaluation_id, worker_id))
                return int(cur.rowcount or 0)
            cur = self._conn.executemany(
                "UPDATE items SET lease_owner='', lease_expires=0 WHERE tenant=? AND"
                " evaluation_id=? AND lease_owner=? AND item_key=? AND done=0",
                [(tenant, evaluation_id, worker_id, k) for k in keys])
            return int(cur.rowcount or 0)

    def expire_leases(self, evaluation_id: str) -> int:
        """Clear the leases that ran out (their workers died or stalled); the number
        cleared. Claims take expired items anyway; this makes the state visible."""
        with self._lock:
            cur = self._conn.execute(
                "UPDATE items SET lease_owner='', lease_expires=0 WHERE tenant=? AND"
                " evaluation_id=? AND lease_owner<>'' AND lease_expires<=? AND done=0",
                (self._t(), evaluation_id, time.time()))
            return int(cur.rowcount or 0)

    def leases(self, evaluation_id: str) -> dict[str, str]:
        """Item key -> worker of every unfinished item under a live lease."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT item_key, lease_owner FROM items WHERE tenant=? AND evaluation_id=?"
                " AND done=0 AND lease_owner<>'' AND lease_expires>?",
                (self._t(), evaluation_id, time.time())).fetchall()
        return {r[0]: r[1] for r in rows}

    # -- one item at a time, for workers walking the stages (worker mode) -------------------
    def claim_key(self, evaluation_id: str, key: str, worker_id: str, *,
                  lease_s: float) -> str:
        """Try to take the item ``key`` for ``worker_id``: ``"claimed"`` (it is now this
        worker's for ``lease_s`` seconds: it was new, free, released, expired or already
        this worker's), ``"done"`` (someone finished it) or ``"leased"`` (another worker
        holds a live lease). One ``BEGIN IMMEDIATE`` transaction, so two processes never
        both get ``"claimed"`` for one item."""
        check_claim(worker_id, 1, lease_s)
        tenant = self._t()
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                now = time.time()
                self._conn.execute(
                    "INSERT INTO items (tenant, evaluation_id, item_key) VALUES (?,?,?)"
                    " ON CONFLICT(tenant, evaluation_id, item_key) DO NOTHING",
                    (tenant, evaluation_id, key))
                done, owner, expires = self._conn.execute(
                    "SELECT done, lease_owner, lease_expires FROM items WHERE tenant=? AND"
                    " evaluation_id=? AND item_key=?", (tenant, evaluation_id, key)).fetchone()
                if done:
                    state = "done"
                elif owner and owner != worker_id and expires > now:
                    state = "leased"
                else:
                    self._conn.execute(
                        "UPDATE items SET lease_owner=?, lease_expires=? WHERE tenant=? AND"
                        " evaluation_id=? AND item_key=?",
                        (worker_id, now + lease_s, tenant, evaluation_id, key))
                    state = "claimed"
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return state

    def finish_claimed(self, evaluation_id: str, key: str, worker_id: str, result: bytes, *,
                       images: int, queries: int, message: str) -> bool:
        """Commit a claimed item's result and ADD its counts to the evaluation's progress
        (several workers write progress: each adds its own, none overwrites another's). An
        item someone already finished is left as it is (False): its counts are not added
        twice. The lease ends with the item (the row keeps who ran it)."""
        tenant = self._t()
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                cur = self._conn.execute(
                    "UPDATE items SET done=1, result=?, lease_owner=?, lease_expires=0 WHERE"
                    " tenant=? AND evaluation_id=? AND item_key=? AND done=0",
                    (result, worker_id, tenant, evaluation_id, key))
                first = cur.rowcount == 1
                if first:
                    self._conn.execute(
                        "UPDATE evaluations SET items_done=items_done+1,"
                        " images_done=images_done+?, queries=queries+?, message=?,"
                        " updated_at=? WHERE tenant=? AND evaluation_id=? AND"
                        " state IN ('PENDING','RUNNING')",
                        (images, queries, message, time.time(), tenant, evaluation_id))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._bump()
        return first

    # -- artifacts: what an evaluation keeps besides its item results -----------------------
    def put_artifact(self, evaluation_id: str, name: str, data: bytes) -> ArtifactInfo:
        """Store (or replace) the artifact ``name`` of this tenant's evaluation, in one
        transaction. Idempotent: the same bytes under the same name again (a retried item)
        write nothing and return the stored artifact."""
        digest = check_artifact(evaluation_id, name, data)
        tenant = self._t()
        key = (tenant, evaluation_id, name)
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                row = self._conn.execute(
                    "SELECT size, sha256, created_at FROM artifacts WHERE tenant=? AND"
                    " evaluation_id=? AND name=?", key).fetchone()
                if row is not None and (int(row[0]), row[1]) == (len(data), digest):
                    self._conn.execute("COMMIT")
                    return ArtifactInfo(name, int(row[0]), row[1], float(row[2]))
                info = ArtifactInfo(name, len(data), digest, time.time())
                self._conn.execute("DELETE FROM artifact_parts WHERE tenant=? AND"
                                   " evaluation_id=? AND name=?", key)
                self._conn.execute(
                    "INSERT INTO artifacts (tenant, evaluation_id, name, size, sha256,"
                    " created_at) VALUES (?,?,?,?,?,?) ON CONFLICT(tenant, evaluation_id, name)"
                    " DO UPDATE SET size=excluded.size, sha256=excluded.sha256,"
                    " created_at=excluded.created_at", (*key, info.size, digest, info.created_at))
                self._conn.executemany(
                    "INSERT INTO artifact_parts (tenant, evaluation_id, name, seq, data)"
                    " VALUES (?,?,?,?,?)",
                    [(*key, i, part) for i, part in enumerate(artifact_parts(data))])
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return info

    def artifacts(self, evaluation_id: str) -> builtins.list[ArtifactInfo]:
        """This tenant's artifacts of the evaluation, by name."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT name, size, sha256, created_at FROM artifacts WHERE tenant=? AND"
                " evaluation_id=? ORDER BY name", (self._t(), evaluation_id)).fetchall()
        return [ArtifactInfo(r[0], int(r[1]), r[2], float(r[3])) for r in rows]

    def artifact(self, evaluation_id: str, name: str) -> bytes | None:
        """The content of this tenant's artifact (checked against its SHA-256); None when
        there is none of that name (another tenant's is none)."""
        key = (self._t(), evaluation_id, name)
        with self._lock:
            self._conn.execute("BEGIN")         # one snapshot for the row and its parts
            try:
                row = self._conn.execute(
                    "SELECT size, sha256, created_at FROM artifacts WHERE tenant=? AND"
                    " evaluation_id=? AND name=?", key).fetchone()
                parts = [] if row is None else [bytes(r[0]) for r in self._conn.execute(
                    "SELECT data FROM artifact_parts WHERE tenant=? AND evaluation_id=? AND"
                    " name=? ORDER BY seq", key).fetchall()]
            finally:
                self._conn.execute("COMMIT")
        if row is None:
            return None
        return joined_artifact(ArtifactInfo(name, int(row[0]), row[1], float(row[2])), parts)
