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

Schema versions (``infra/storage/sqlite_schema.py``): the file records its version; an
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
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

from fortis.infra.storage import sqlite_schema
from fortis.infra.storage.sql_dialects import SQLITE
from fortis.services.common import errors
from fortis.services.common.limits import MAX_ARTIFACT_BYTES, MAX_ARTIFACT_NAME_CHARS
from fortis.services.evaluation import store_sql as q
from fortis.services.evaluation.store_sql import (  # noqa: F401 - re-exported
    ACTIVE_STATES,
    ARTIFACT_PART_BYTES,
    ArtifactInfo,
    EvaluationRow,
    artifact_parts,
    joined_artifact,
)

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

FINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")
_T = TypeVar("_T")


def summary_json(summary: Any) -> str:
    """The stored form of an evaluation's headline results (``ports.Summary``)."""
    return json.dumps({"accuracy": summary.accuracy,
                       "average_robustness_corr": summary.average_robustness_corr,
                       "average_robustness_adv": summary.average_robustness_adv,
                       "m": summary.m,
                       "failed_settings": list(getattr(summary, "failed_settings", ()))})


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
    """SQLite implementation of :class:`EvaluationStorage`. The queries are
    ``store_sql``'s, shared with PostgreSQL; what is SQLite's own stays here: one connection
    in WAL mode guarded by a lock (thread-safe), and every transaction that reads then writes
    taken with ``BEGIN IMMEDIATE`` (the database's write lock, for lack of row locks), so
    other connections and processes wait for it."""

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

    def _run(self, fn: Callable[[sqlite3.Connection], _T], *, bump: bool = False) -> _T:
        """``fn(conn)`` under the connection's lock, each statement its own transaction;
        with ``bump``, the change signal after it."""
        with self._lock:
            result = fn(self._conn)
            if bump:
                self._bump()
        return result

    def _tx(self, fn: Callable[[sqlite3.Connection], _T], *, bump: bool = False,
            begin: str = "BEGIN IMMEDIATE") -> _T:
        """``fn(conn)`` in one transaction (``BEGIN IMMEDIATE``: the write lock from the
        start, so a read-then-write is never overtaken), rolled back when it fails."""
        with self._lock:
            self._conn.execute(begin)
            try:
                result = fn(self._conn)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            if bump:
                self._bump()
        return result

    # -- evaluations ----------------------------------------------------------------------
    def insert(self, *, evaluation_id: str, tenant: str, plan_text: str, plan_name: str) -> None:
        if self.tenant is not None and tenant != self.tenant:
            raise RuntimeError("a tenant's view inserts only into its own namespace")
        self._run(lambda c: q.insert(c, evaluation_id=evaluation_id, tenant=tenant,
                                     plan_text=plan_text, plan_name=plan_name), bump=True)

    def get(self, evaluation_id: str) -> EvaluationRow | None:
        return self._run(lambda c: q.get(c, self._t(), evaluation_id))

    def list(self, tenant: str, *, limit: int,
             after: tuple[float, str] | None = None) -> builtins.list[EvaluationRow]:
        """A tenant's evaluations, newest first, starting after the (created_at,
        evaluation_id) cursor of the previous page's last row."""
        return self._run(lambda c: q.page(c, tenant, limit=limit, after=after))

    def active(self) -> builtins.list[EvaluationRow]:
        return self._run(q.active)

    def update(self, evaluation_id: str, **fields: Any) -> None:
        if fields:
            self._run(lambda c: q.update(c, self._t(), evaluation_id, fields,
                                         running_only=False), bump=True)

    def update_running(self, evaluation_id: str, **fields: Any) -> bool:
        """Update an evaluation only while it is pending or running: once a caller cancelled
        it (or it ended), a late update from its worker never overwrites the final state.
        Returns whether the row was updated."""
        if not fields:
            return False
        return self._run(lambda c: q.update(c, self._t(), evaluation_id, fields,
                                            running_only=True), bump=True) > 0

    def finish(self, evaluation_id: str, *, report_json: str, report_html: str, summary: Any,
               finished_at: float) -> bool:
        """Mark a running evaluation SUCCEEDED with its report and summary."""
        return self.update_running(
            evaluation_id, state="SUCCEEDED", stage="done", report_json=report_json,
            report_html=report_html, finished_at=finished_at, message="",
            summary_json=summary_json(summary))

    def mark_resumed(self, evaluation_id: str) -> None:
        self._run(lambda c: q.mark_resumed(c, self._t(), evaluation_id), bump=True)

    def report(self, evaluation_id: str) -> tuple[str, str]:
        return self._run(lambda c: q.report(c, self._t(), evaluation_id))

    # -- items ------------------------------------------------------------------------------
    def item(self, evaluation_id: str, key: str) -> tuple[bool, int, bytes | None]:
        """(done, attempts so far, result blob) of an item."""
        return self._run(lambda c: q.item(c, self._t(), evaluation_id, key))

    def start_item(self, evaluation_id: str, key: str) -> int:
        """Record a new attempt at an item; returns its attempt number (1 = first)."""
        return self._run(lambda c: q.start_item(c, self._t(), evaluation_id, key))

    def finish_item(self, evaluation_id: str, key: str, result: bytes, *, items_done: int,
                    images_done: int, queries: int, message: str) -> None:
        """Commit an item's result and the evaluation's progress in one transaction (the
        progress only while the evaluation is still running: a cancelled one keeps its
        "cancelled by a caller" message)."""
        tenant = self._t()
        self._tx(lambda c: q.finish_item(c, tenant, evaluation_id, key, result,
                                         items_done=items_done, images_done=images_done,
                                         queries=queries, message=message), bump=True)

    def items(self, evaluation_id: str) -> Iterator[tuple[str, int, bool]]:
        yield from self._run(lambda c: q.items(c, self._t(), evaluation_id))

    # -- claims: several workers share an evaluation's items --------------------------------
    def add_items(self, evaluation_id: str, keys: Iterable[str]) -> int:
        """Record the items of an evaluation as pending (those already known are kept as
        they are); the number added."""
        return self._run(lambda c: q.add_items(c, self._t(), evaluation_id, keys))

    def claim_items(self, evaluation_id: str, worker_id: str, *, limit: int,
                    lease_s: float) -> builtins.list[str]:
        """Up to ``limit`` unfinished items nobody holds (never leased, released, or whose
        lease expired: a dead worker's) leased to ``worker_id`` for ``lease_s`` seconds, in
        key order. One ``BEGIN IMMEDIATE`` transaction: claims by other connections and
        processes wait for it, so no item is handed to two workers."""
        check_claim(worker_id, limit, lease_s)
        tenant = self._t()
        return self._tx(lambda c: q.claim_items(c, SQLITE, tenant, evaluation_id, worker_id,
                                                limit=limit, lease_s=lease_s))

    def renew_leases(self, evaluation_id: str, worker_id: str, *, lease_s: float) -> int:
        """Extend the leases ``worker_id`` still holds (its heartbeat); the number renewed
        (an item another worker claimed after this one's lease expired is not)."""
        check_claim(worker_id, 1, lease_s)
        return self._run(lambda c: q.renew_leases(c, SQLITE, self._t(), evaluation_id,
                                                  worker_id, lease_s=lease_s))

    def release_items(self, evaluation_id: str, worker_id: str,
                      keys: Iterable[str] | None = None) -> int:
        """Give back ``worker_id``'s leases of unfinished items (all, or those of ``keys``):
        the items can be claimed at once (a worker stopping cleanly). A finished item keeps
        the name of the worker that ran it."""
        return self._run(lambda c: q.release_items(c, self._t(), evaluation_id, worker_id,
                                                   keys))

    def expire_leases(self, evaluation_id: str) -> int:
        """Clear the leases that ran out (their workers died or stalled); the number
        cleared. Claims take expired items anyway; this makes the state visible."""
        return self._run(lambda c: q.expire_leases(c, SQLITE, self._t(), evaluation_id))

    def leases(self, evaluation_id: str) -> dict[str, str]:
        """Item key -> worker of every unfinished item under a live lease."""
        return self._run(lambda c: q.leases(c, SQLITE, self._t(), evaluation_id))

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
        return self._tx(lambda c: q.claim_key(c, SQLITE, tenant, evaluation_id, key, worker_id,
                                              lease_s=lease_s))

    def finish_claimed(self, evaluation_id: str, key: str, worker_id: str, result: bytes, *,
                       images: int, queries: int, message: str) -> bool:
        """Commit a claimed item's result and ADD its counts to the evaluation's progress
        (several workers write progress: each adds its own, none overwrites another's). An
        item someone already finished is left as it is (False): its counts are not added
        twice. The lease ends with the item (the row keeps who ran it)."""
        tenant = self._t()
        return self._tx(lambda c: q.finish_claimed(c, tenant, evaluation_id, key, worker_id,
                                                   result, images=images, queries=queries,
                                                   message=message), bump=True)

    # -- artifacts: what an evaluation keeps besides its item results -----------------------
    def put_artifact(self, evaluation_id: str, name: str, data: bytes) -> ArtifactInfo:
        """Store (or replace) the artifact ``name`` of this tenant's evaluation, in one
        transaction. Idempotent: the same bytes under the same name again (a retried item)
        write nothing and return the stored artifact."""
        digest = check_artifact(evaluation_id, name, data)
        tenant = self._t()
        return self._tx(lambda c: q.put_artifact(c, SQLITE, tenant, evaluation_id, name, data,
                                                 digest))

    def artifacts(self, evaluation_id: str) -> builtins.list[ArtifactInfo]:
        """This tenant's artifacts of the evaluation, by name."""
        return self._run(lambda c: q.artifacts(c, self._t(), evaluation_id))

    def artifact(self, evaluation_id: str, name: str) -> bytes | None:
        """The content of this tenant's artifact (checked against its SHA-256); None when
        there is none of that name (another tenant's is none). One read transaction
        (``BEGIN``): one snapshot for the row and its parts."""
        tenant = self._t()
        got = self._tx(lambda c: q.artifact(c, SQLITE, tenant, evaluation_id, name),
                       begin="BEGIN")
        return None if got is None else joined_artifact(*got)
