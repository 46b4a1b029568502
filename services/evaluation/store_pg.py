"""The evaluation store in PostgreSQL, the pluggable alternative to SQLite at scale.

The same methods and semantics as the SQLite :class:`~.store.EvaluationStore` (the
:class:`~.store.EvaluationStorage` protocol), on the schema of the Alembic migrations
(``infra/storage/migrations``; the store refuses a database that is not at head and names
``fortis db upgrade``). Several processes may share one database: an item's result and the
evaluation's progress commit in one transaction, and workers claim pending items with
``SELECT ... FOR UPDATE SKIP LOCKED`` under a lease measured by the database's clock (no
clock skew between worker machines), so two workers never run the same item and a dead
worker's items are claimed again when its lease runs out.

The statements and their row mapping are ``store_sql``'s, shared with SQLite (the
PostgreSQL :data:`~fortis.infra.storage.sql_dialects.POSTGRES` dialect supplies the
row locks and the server's clock). What is PostgreSQL's own stays here: a pool of
connections (SQLAlchemy 2 over psycopg 3), one pooled connection and transaction per method
(thread-safe, no connection lock), and a database that stops answering reported as
``Unavailable``.

``changed``/``version`` signal the writes of this process (WatchEvaluation wakes on them);
changes written by other processes are seen at the watch's next heartbeat. Domain code: no
gRPC.

Artifacts (migration 0003): one ``artifacts`` row per (tenant, evaluation, name) and its
content in ``artifact_parts`` rows; a write locks the artifact's row, so two workers saving
the same chunk at once leave one consistent artifact, and the same bytes again write nothing.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from fortis.infra.storage import sqldb
from fortis.infra.storage.sql_dialects import POSTGRES, SaExecutor
from fortis.services.evaluation import store_sql as q
from fortis.services.evaluation.store import check_artifact, check_claim, summary_json
from fortis.services.evaluation.store_sql import ArtifactInfo, EvaluationRow, joined_artifact

_WHAT = "evaluation store"
_T = TypeVar("_T")


class _Shared:
    """What the tenant views of one store share: the engine and the change signal."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.version = 0


class PgEvaluationStore:
    """PostgreSQL implementation of :class:`~.store.EvaluationStorage`. Thread-safe (a
    connection pool; each method is one transaction)."""

    def __init__(self, url: str, *, engine: Any = None) -> None:
        """Connect to ``url`` (``postgresql://...``; InvalidArgument naming ``database_url``
        when it is malformed, unreachable, or not at the schema head)."""
        engine = engine if engine is not None else sqldb.create_engine(url)
        sqldb.require_head(engine)
        self._s = _Shared(engine)
        self.tenant: str | None = None

    def for_tenant(self, tenant: str) -> PgEvaluationStore:
        view = object.__new__(PgEvaluationStore)
        view._s, view.tenant = self._s, tenant
        return view

    def _t(self) -> str:
        if self.tenant is None:
            raise RuntimeError("per-evaluation access needs a tenant's view (for_tenant)")
        return self.tenant

    @property
    def changed(self) -> threading.Condition:
        return self._s.changed

    @property
    def version(self) -> int:
        return self._s.version

    def close(self) -> None:
        self._s.engine.dispose()

    def _bump(self) -> None:
        with self._s.lock:
            self._s.version += 1
            self._s.changed.notify_all()

    def _run(self, fn: Callable[[SaExecutor], _T], *, bump: bool = False) -> _T:
        """``fn(executor)`` in one transaction on a pooled connection (the rows it locks
        are held until it commits); a lost database is Unavailable. With ``bump``, the
        change signal after it."""
        with sqldb.unavailable_on_loss(_WHAT), self._s.engine.begin() as conn:
            result = fn(SaExecutor(conn))
        if bump:
            self._bump()
        return result

    # -- evaluations ----------------------------------------------------------------------
    def insert(self, *, evaluation_id: str, tenant: str, plan_text: str, plan_name: str) -> None:
        if self.tenant is not None and tenant != self.tenant:
            raise RuntimeError("a tenant's view inserts only into its own namespace")
        self._run(lambda x: q.insert(x, evaluation_id=evaluation_id, tenant=tenant,
                                     plan_text=plan_text, plan_name=plan_name), bump=True)

    def get(self, evaluation_id: str) -> EvaluationRow | None:
        return self._run(lambda x: q.get(x, self._t(), evaluation_id))

    def list(self, tenant: str, *, limit: int,
             after: tuple[float, str] | None = None) -> builtins.list[EvaluationRow]:
        """A tenant's evaluations, newest first, after the (created_at, evaluation_id)
        cursor of the previous page's last row."""
        return self._run(lambda x: q.page(x, tenant, limit=limit, after=after))

    def active(self) -> builtins.list[EvaluationRow]:
        return self._run(q.active)

    def update(self, evaluation_id: str, **fields: Any) -> None:
        if fields:
            self._run(lambda x: q.update(x, self._t(), evaluation_id, fields,
                                         running_only=False), bump=True)

    def update_running(self, evaluation_id: str, **fields: Any) -> bool:
        """Update an evaluation only while it is pending or running (a late update never
        overwrites a final state); whether the row was updated."""
        if not fields:
            return False
        return self._run(lambda x: q.update(x, self._t(), evaluation_id, fields,
                                            running_only=True), bump=True) > 0

    def finish(self, evaluation_id: str, *, report_json: str, report_html: str, summary: Any,
               finished_at: float) -> bool:
        return self.update_running(
            evaluation_id, state="SUCCEEDED", stage="done", report_json=report_json,
            report_html=report_html, finished_at=finished_at, message="",
            summary_json=summary_json(summary))

    def mark_resumed(self, evaluation_id: str) -> None:
        self._run(lambda x: q.mark_resumed(x, self._t(), evaluation_id), bump=True)

    def report(self, evaluation_id: str) -> tuple[str, str]:
        return self._run(lambda x: q.report(x, self._t(), evaluation_id))

    # -- items ------------------------------------------------------------------------------
    def item(self, evaluation_id: str, key: str) -> tuple[bool, int, bytes | None]:
        return self._run(lambda x: q.item(x, self._t(), evaluation_id, key))

    def start_item(self, evaluation_id: str, key: str) -> int:
        """Record a new attempt at an item; its attempt number (1 = first)."""
        return self._run(lambda x: q.start_item(x, self._t(), evaluation_id, key))

    def finish_item(self, evaluation_id: str, key: str, result: bytes, *, items_done: int,
                    images_done: int, queries: int, message: str) -> None:
        """An item's result and the evaluation's progress in one transaction (the progress
        only while the evaluation is still pending or running)."""
        self._run(lambda x: q.finish_item(x, self._t(), evaluation_id, key, result,
                                          items_done=items_done, images_done=images_done,
                                          queries=queries, message=message), bump=True)

    def items(self, evaluation_id: str) -> Iterator[tuple[str, int, bool]]:
        yield from self._run(lambda x: q.items(x, self._t(), evaluation_id))

    # -- claims: several workers share an evaluation's items --------------------------------
    def add_items(self, evaluation_id: str, keys: Iterable[str]) -> int:
        return self._run(lambda x: q.add_items(x, self._t(), evaluation_id, keys))

    def claim_items(self, evaluation_id: str, worker_id: str, *, limit: int,
                    lease_s: float) -> builtins.list[str]:
        """Up to ``limit`` unfinished items nobody holds (never leased, released, or with an
        expired lease) leased to ``worker_id`` for ``lease_s`` seconds, in key order. Rows
        another worker is claiming at this moment are skipped (``FOR UPDATE SKIP LOCKED``),
        never handed out twice."""
        check_claim(worker_id, limit, lease_s)
        return self._run(lambda x: q.claim_items(x, POSTGRES, self._t(), evaluation_id,
                                                 worker_id, limit=limit, lease_s=lease_s))

    def renew_leases(self, evaluation_id: str, worker_id: str, *, lease_s: float) -> int:
        check_claim(worker_id, 1, lease_s)
        return self._run(lambda x: q.renew_leases(x, POSTGRES, self._t(), evaluation_id,
                                                  worker_id, lease_s=lease_s))

    def release_items(self, evaluation_id: str, worker_id: str,
                      keys: Iterable[str] | None = None) -> int:
        return self._run(lambda x: q.release_items(x, self._t(), evaluation_id, worker_id,
                                                   keys))

    def expire_leases(self, evaluation_id: str) -> int:
        return self._run(lambda x: q.expire_leases(x, POSTGRES, self._t(), evaluation_id))

    def leases(self, evaluation_id: str) -> dict[str, str]:
        return self._run(lambda x: q.leases(x, POSTGRES, self._t(), evaluation_id))

    # -- one item at a time, for workers walking the stages (worker mode) -------------------
    def claim_key(self, evaluation_id: str, key: str, worker_id: str, *,
                  lease_s: float) -> str:
        """As :meth:`~.store.EvaluationStore.claim_key`: the row is locked ``FOR UPDATE``
        while it is read and leased, so two workers never both get ``"claimed"``; leases
        are measured by the database's clock."""
        check_claim(worker_id, 1, lease_s)
        return self._run(lambda x: q.claim_key(x, POSTGRES, self._t(), evaluation_id, key,
                                               worker_id, lease_s=lease_s))

    def finish_claimed(self, evaluation_id: str, key: str, worker_id: str, result: bytes, *,
                       images: int, queries: int, message: str) -> bool:
        """As :meth:`~.store.EvaluationStore.finish_claimed`: counts are added in SQL
        (``items_done = items_done + 1``), so workers never overwrite each other's."""
        return self._run(lambda x: q.finish_claimed(x, self._t(), evaluation_id, key,
                                                    worker_id, result, images=images,
                                                    queries=queries, message=message),
                         bump=True)

    # -- artifacts --------------------------------------------------------------------------
    def put_artifact(self, evaluation_id: str, name: str, data: bytes) -> ArtifactInfo:
        """As :meth:`~.store.EvaluationStore.put_artifact`, in one transaction: a new row is
        inserted (waiting for a concurrent writer of the same name to commit), an existing one
        is locked, kept when it holds these bytes, else replaced with its parts."""
        digest = check_artifact(evaluation_id, name, data)
        return self._run(lambda x: q.put_artifact(x, POSTGRES, self._t(), evaluation_id, name,
                                                  data, digest))

    def artifacts(self, evaluation_id: str) -> builtins.list[ArtifactInfo]:
        return self._run(lambda x: q.artifacts(x, self._t(), evaluation_id))

    def artifact(self, evaluation_id: str, name: str) -> bytes | None:
        """As :meth:`~.store.EvaluationStore.artifact`: the row is held ``FOR SHARE`` while
        its parts are read, so a concurrent replacement is never seen half-done."""
        got = self._run(lambda x: q.artifact(x, POSTGRES, self._t(), evaluation_id, name))
        return None if got is None else joined_artifact(*got)
