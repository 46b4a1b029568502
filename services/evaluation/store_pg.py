"""The evaluation store in PostgreSQL, the pluggable alternative to SQLite at scale.

The same methods and semantics as the SQLite :class:`~.store.EvaluationStore` (the
:class:`~.store.EvaluationStorage` protocol), in SQLAlchemy 2 Core over psycopg 3, on the
schema of the Alembic migrations (``services/common/migrations``; the store refuses a
database that is not at head and names ``fortis db upgrade``). Several processes may share
one database: an item's result and the evaluation's progress commit in one transaction, and
workers claim pending items with ``SELECT ... FOR UPDATE SKIP LOCKED`` under a lease measured
by the database's clock (no clock skew between worker machines), so two workers never run
the same item and a dead worker's items are claimed again when its lease runs out.

``changed``/``version`` signal the writes of this process (WatchEvaluation wakes on them);
changes written by other processes are seen at the watch's next heartbeat. A database that
stops answering is ``Unavailable``. Domain code: no gRPC.

Artifacts (migration 0003): one ``artifacts`` row per (tenant, evaluation, name) and its
content in ``artifact_parts`` rows; a write locks the artifact's row, so two workers saving
the same chunk at once leave one consistent artifact, and the same bytes again write nothing.
"""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import sqlalchemy as sa
from fortis.services.common import sqldb
from fortis.services.evaluation.store import (
    ACTIVE_STATES,
    ArtifactInfo,
    EvaluationRow,
    artifact_parts,
    check_artifact,
    check_claim,
    joined_artifact,
    summary_json,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert

metadata = sa.MetaData()
_TEXT: dict[str, Any] = {"nullable": False, "server_default": ""}

evaluations = sa.Table(
    "evaluations", metadata,
    sa.Column("evaluation_id", sa.Text(), primary_key=True),
    sa.Column("tenant", sa.Text(), primary_key=True),
    sa.Column("state", sa.Text(), nullable=False),
    sa.Column("plan_text", sa.Text(), nullable=False),
    sa.Column("plan_name", sa.Text(), nullable=False),
    sa.Column("created_at", sa.Float(), nullable=False),
    sa.Column("updated_at", sa.Float(), nullable=False),
    sa.Column("error_code", sa.Text(), **_TEXT),
    sa.Column("error_message", sa.Text(), **_TEXT),
    sa.Column("resumed_count", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("stage", sa.Text(), nullable=False, server_default="plan"),
    sa.Column("items_done", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("items_total", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("queries", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("message", sa.Text(), **_TEXT),
    sa.Column("summary_json", sa.Text(), **_TEXT),
    sa.Column("images_done", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("images_total", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("error_status", sa.LargeBinary(), nullable=True),
    sa.Column("report_json", sa.Text(), **_TEXT),
    sa.Column("report_html", sa.Text(), **_TEXT),
    sa.Column("started_at", sa.Float(), nullable=False, server_default="0"),
    sa.Column("finished_at", sa.Float(), nullable=False, server_default="0"),
    sa.PrimaryKeyConstraint("tenant", "evaluation_id", name="evaluations_pkey"),
    sa.Index("evaluations_state", "state"),
)
items = sa.Table(
    "items", metadata,
    sa.Column("tenant", sa.Text(), nullable=False),
    sa.Column("evaluation_id", sa.Text(), nullable=False),
    sa.Column("item_key", sa.Text(), nullable=False),
    sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("done", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column("result", sa.LargeBinary(), nullable=True),
    sa.Column("lease_owner", sa.Text(), **_TEXT),
    sa.Column("lease_expires", sa.Float(), nullable=False, server_default="0"),
    sa.PrimaryKeyConstraint("tenant", "evaluation_id", "item_key", name="items_pkey"),
)

#: What an evaluation keeps besides its item results (migration 0003).
artifacts = sa.Table(
    "artifacts", metadata,
    sa.Column("tenant", sa.Text(), nullable=False),
    sa.Column("evaluation_id", sa.Text(), nullable=False),
    sa.Column("name", sa.Text(), nullable=False),
    sa.Column("size", sa.BigInteger(), nullable=False),
    sa.Column("sha256", sa.Text(), nullable=False),
    sa.Column("created_at", sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint("tenant", "evaluation_id", "name", name="artifacts_pkey"),
)
artifact_parts_table = sa.Table(
    "artifact_parts", metadata,
    sa.Column("tenant", sa.Text(), nullable=False),
    sa.Column("evaluation_id", sa.Text(), nullable=False),
    sa.Column("name", sa.Text(), nullable=False),
    sa.Column("seq", sa.Integer(), nullable=False),
    sa.Column("data", sa.LargeBinary(), nullable=False),
    sa.PrimaryKeyConstraint("tenant", "evaluation_id", "name", "seq",
                            name="artifact_parts_pkey"),
)

#: The columns of an EvaluationRow, in its field order.
_ROW = [evaluations.c[n] for n in EvaluationRow.__dataclass_fields__]
#: Seconds since the epoch by the database's clock (leases: one clock for every worker).
_DB_NOW = sa.func.extract("epoch", sa.func.clock_timestamp())
_WHAT = "evaluation store"


def _row(r: Any) -> EvaluationRow:
    values = list(r)
    status = values[-1]
    values[-1] = bytes(status) if status is not None else None
    return EvaluationRow(*values)


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

    def _run(self, fn: Any) -> Any:
        """``fn(conn)`` in one transaction; a lost database is Unavailable."""
        with sqldb.unavailable_on_loss(_WHAT), self._s.engine.begin() as conn:
            return fn(conn)

    def _key(self, evaluation_id: str) -> Any:
        return sa.and_(evaluations.c.tenant == self._t(),
                       evaluations.c.evaluation_id == evaluation_id)

    def _ikey(self, evaluation_id: str) -> Any:
        return sa.and_(items.c.tenant == self._t(), items.c.evaluation_id == evaluation_id)

    # -- evaluations ----------------------------------------------------------------------
    def insert(self, *, evaluation_id: str, tenant: str, plan_text: str, plan_name: str) -> None:
        if self.tenant is not None and tenant != self.tenant:
            raise RuntimeError("a tenant's view inserts only into its own namespace")
        now = time.time()
        self._run(lambda c: c.execute(evaluations.insert().values(
            evaluation_id=evaluation_id, tenant=tenant, state="PENDING", plan_text=plan_text,
            plan_name=plan_name, created_at=now, updated_at=now)))
        self._bump()

    def get(self, evaluation_id: str) -> EvaluationRow | None:
        r = self._run(lambda c: c.execute(
            sa.select(*_ROW).where(self._key(evaluation_id))).first())
        return _row(r) if r is not None else None

    def list(self, tenant: str, *, limit: int,
             after: tuple[float, str] | None = None) -> builtins.list[EvaluationRow]:
        """A tenant's evaluations, newest first, after the (created_at, evaluation_id)
        cursor of the previous page's last row."""
        q = sa.select(*_ROW).where(evaluations.c.tenant == tenant)
        if after is not None:
            q = q.where(sa.or_(evaluations.c.created_at < after[0], sa.and_(
                evaluations.c.created_at == after[0], evaluations.c.evaluation_id < after[1])))
        q = q.order_by(evaluations.c.created_at.desc(),
                       evaluations.c.evaluation_id.desc()).limit(limit)
        return [_row(r) for r in self._run(lambda c: c.execute(q).all())]

    def active(self) -> builtins.list[EvaluationRow]:
        q = (sa.select(*_ROW).where(evaluations.c.state.in_(ACTIVE_STATES))
             .order_by(evaluations.c.created_at))
        return [_row(r) for r in self._run(lambda c: c.execute(q).all())]

    def update(self, evaluation_id: str, **fields: Any) -> None:
        if not fields:
            return
        fields["updated_at"] = time.time()
        self._run(lambda c: c.execute(
            evaluations.update().where(self._key(evaluation_id)).values(**fields)))
        self._bump()

    def update_running(self, evaluation_id: str, **fields: Any) -> bool:
        """Update an evaluation only while it is pending or running (a late update never
        overwrites a final state); whether the row was updated."""
        if not fields:
            return False
        fields["updated_at"] = time.time()
        n = self._run(lambda c: c.execute(
            evaluations.update().where(self._key(evaluation_id),
                                       evaluations.c.state.in_(ACTIVE_STATES))
            .values(**fields)).rowcount)
        self._bump()
        return bool(n)

    def finish(self, evaluation_id: str, *, report_json: str, report_html: str, summary: Any,
               finished_at: float) -> bool:
        return self.update_running(
            evaluation_id, state="SUCCEEDED", stage="done", report_json=report_json,
            report_html=report_html, finished_at=finished_at, message="",
            summary_json=summary_json(summary))

    def mark_resumed(self, evaluation_id: str) -> None:
        self._run(lambda c: c.execute(evaluations.update().where(self._key(evaluation_id))
                                      .values(resumed_count=evaluations.c.resumed_count + 1,
                                              updated_at=time.time())))
        self._bump()

    def report(self, evaluation_id: str) -> tuple[str, str]:
        r = self._run(lambda c: c.execute(sa.select(
            evaluations.c.report_json, evaluations.c.report_html)
            .where(self._key(evaluation_id))).first())
        return (r[0], r[1]) if r is not None else ("", "")

    # -- items ------------------------------------------------------------------------------
    def item(self, evaluation_id: str, key: str) -> tuple[bool, int, bytes | None]:
        r = self._run(lambda c: c.execute(
            sa.select(items.c.done, items.c.attempts, items.c.result)
            .where(self._ikey(evaluation_id), items.c.item_key == key)).first())
        if r is None:
            return False, 0, None
        return bool(r[0]), int(r[1]), (bytes(r[2]) if r[2] is not None else None)

    def start_item(self, evaluation_id: str, key: str) -> int:
        """Record a new attempt at an item; its attempt number (1 = first)."""
        ins = pg_insert(items).values(tenant=self._t(), evaluation_id=evaluation_id,
                                      item_key=key, attempts=1)
        stmt = ins.on_conflict_do_update(
            constraint="items_pkey", set_={"attempts": items.c.attempts + 1}
        ).returning(items.c.attempts)
        return int(self._run(lambda c: c.execute(stmt).scalar_one()))

    def finish_item(self, evaluation_id: str, key: str, result: bytes, *, items_done: int,
                    images_done: int, queries: int, message: str) -> None:
        """An item's result and the evaluation's progress in one transaction (the progress
        only while the evaluation is still pending or running)."""
        def run(c: Any) -> None:
            c.execute(items.update().where(self._ikey(evaluation_id), items.c.item_key == key)
                      .values(done=True, result=result))
            c.execute(evaluations.update().where(
                self._key(evaluation_id), evaluations.c.state.in_(ACTIVE_STATES)).values(
                items_done=items_done, images_done=images_done, queries=queries,
                message=message, updated_at=time.time()))
        self._run(run)
        self._bump()

    def items(self, evaluation_id: str) -> Iterator[tuple[str, int, bool]]:
        rows = self._run(lambda c: c.execute(
            sa.select(items.c.item_key, items.c.attempts, items.c.done)
            .where(self._ikey(evaluation_id)).order_by(items.c.item_key)).all())
        for r in rows:
            yield r[0], int(r[1]), bool(r[2])

    # -- claims: several workers share an evaluation's items --------------------------------
    def add_items(self, evaluation_id: str, keys: Iterable[str]) -> int:
        values = [{"tenant": self._t(), "evaluation_id": evaluation_id, "item_key": k}
                  for k in keys]
        if not values:
            return 0
        stmt = (pg_insert(items).on_conflict_do_nothing(constraint="items_pkey")
                .returning(items.c.item_key))
        return len(self._run(lambda c: c.execute(stmt, values).all()))

    def claim_items(self, evaluation_id: str, worker_id: str, *, limit: int,
                    lease_s: float) -> builtins.list[str]:
        """Up to ``limit`` unfinished items nobody holds (never leased, released, or with an
        expired lease) leased to ``worker_id`` for ``lease_s`` seconds, in key order. Rows
        another worker is claiming at this moment are skipped (``FOR UPDATE SKIP LOCKED``),
        never handed out twice."""
        check_claim(worker_id, limit, lease_s)
        free = (sa.select(items.c.item_key)
                .where(self._ikey(evaluation_id), items.c.done.is_(False),
                       sa.or_(items.c.lease_owner == "", items.c.lease_expires <= _DB_NOW))
                .order_by(items.c.item_key).limit(limit)
                .with_for_update(skip_locked=True).cte("free"))
        stmt = (items.update()
                .where(self._ikey(evaluation_id), items.c.item_key == free.c.item_key)
                .values(lease_owner=worker_id, lease_expires=_DB_NOW + lease_s)
                .returning(items.c.item_key))
        return sorted(r[0] for r in self._run(lambda c: c.execute(stmt).all()))

    def renew_leases(self, evaluation_id: str, worker_id: str, *, lease_s: float) -> int:
        check_claim(worker_id, 1, lease_s)
        stmt = (items.update().where(self._ikey(evaluation_id),
                                     items.c.lease_owner == worker_id,
                                     items.c.done.is_(False))
                .values(lease_expires=_DB_NOW + lease_s))
        return int(self._run(lambda c: c.execute(stmt).rowcount) or 0)

    def release_items(self, evaluation_id: str, worker_id: str,
                      keys: Iterable[str] | None = None) -> int:
        stmt = (items.update().where(self._ikey(evaluation_id),
                                     items.c.lease_owner == worker_id, items.c.done.is_(False))
                .values(lease_owner="", lease_expires=0.0))
        if keys is not None:
            stmt = stmt.where(items.c.item_key.in_(builtins.list(keys)))
        return int(self._run(lambda c: c.execute(stmt).rowcount) or 0)

    def expire_leases(self, evaluation_id: str) -> int:
        stmt = (items.update().where(self._ikey(evaluation_id), items.c.lease_owner != "",
                                     items.c.lease_expires <= _DB_NOW, items.c.done.is_(False))
                .values(lease_owner="", lease_expires=0.0))
        return int(self._run(lambda c: c.execute(stmt).rowcount) or 0)

    def leases(self, evaluation_id: str) -> dict[str, str]:
        rows = self._run(lambda c: c.execute(
            sa.select(items.c.item_key, items.c.lease_owner)
            .where(self._ikey(evaluation_id), items.c.done.is_(False),
                   items.c.lease_owner != "", items.c.lease_expires > _DB_NOW)).all())
        return {r[0]: r[1] for r in rows}

    # -- one item at a time, for workers walking the stages (worker mode) -------------------
    def claim_key(self, evaluation_id: str, key: str, worker_id: str, *,
                  lease_s: float) -> str:
        """As :meth:`~.store.EvaluationStore.claim_key`: the row is locked ``FOR UPDATE``
        while it is read and leased, so two workers never both get ``"claimed"``; leases
        are measured by the database's clock."""
        check_claim(worker_id, 1, lease_s)
        tenant = self._t()

        def run(c: Any) -> str:
            c.execute(pg_insert(items).values(tenant=tenant, evaluation_id=evaluation_id,
                                              item_key=key)
                      .on_conflict_do_nothing(constraint="items_pkey"))
            done, owner, live = c.execute(
                sa.select(items.c.done, items.c.lease_owner, items.c.lease_expires > _DB_NOW)
                .where(self._ikey(evaluation_id), items.c.item_key == key)
                .with_for_update()).one()
            if done:
                return "done"
            if owner and owner != worker_id and live:
                return "leased"
            c.execute(items.update().where(self._ikey(evaluation_id), items.c.item_key == key)
                      .values(lease_owner=worker_id, lease_expires=_DB_NOW + lease_s))
            return "claimed"
        return str(self._run(run))

    def finish_claimed(self, evaluation_id: str, key: str, worker_id: str, result: bytes, *,
                       images: int, queries: int, message: str) -> bool:
        """As :meth:`~.store.EvaluationStore.finish_claimed`: counts are added in SQL
        (``items_done = items_done + 1``), so workers never overwrite each other's."""
        def run(c: Any) -> bool:
            n = c.execute(items.update().where(self._ikey(evaluation_id),
                                               items.c.item_key == key,
                                               items.c.done.is_(False))
                          .values(done=True, result=result, lease_owner=worker_id,
                                  lease_expires=0.0)).rowcount
            if n != 1:
                return False
            c.execute(evaluations.update().where(
                self._key(evaluation_id), evaluations.c.state.in_(ACTIVE_STATES)).values(
                items_done=evaluations.c.items_done + 1,
                images_done=evaluations.c.images_done + images,
                queries=evaluations.c.queries + queries, message=message,
                updated_at=time.time()))
            return True
        first = bool(self._run(run))
        self._bump()
        return first

    # -- artifacts --------------------------------------------------------------------------
    def _akey(self, evaluation_id: str, name: str) -> Any:
        return sa.and_(artifacts.c.tenant == self._t(),
                       artifacts.c.evaluation_id == evaluation_id, artifacts.c.name == name)

    def put_artifact(self, evaluation_id: str, name: str, data: bytes) -> ArtifactInfo:
        """As :meth:`~.store.EvaluationStore.put_artifact`, in one transaction: a new row is
        inserted (waiting for a concurrent writer of the same name to commit), an existing one
        is locked, kept when it holds these bytes, else replaced with its parts."""
        digest = check_artifact(evaluation_id, name, data)
        tenant = self._t()
        parts = artifact_parts(data)
        parts_t = artifact_parts_table

        def run(c: Any) -> ArtifactInfo:
            info = ArtifactInfo(name, len(data), digest, time.time())
            inserted = c.execute(
                pg_insert(artifacts).values(tenant=tenant, evaluation_id=evaluation_id,
                                            name=name, size=info.size, sha256=digest,
                                            created_at=info.created_at)
                .on_conflict_do_nothing(constraint="artifacts_pkey")
                .returning(artifacts.c.name)).first() is not None
            if not inserted:
                size, sha, created = c.execute(
                    sa.select(artifacts.c.size, artifacts.c.sha256, artifacts.c.created_at)
                    .where(self._akey(evaluation_id, name)).with_for_update()).one()
                if (int(size), sha) == (len(data), digest):
                    return ArtifactInfo(name, int(size), sha, float(created))
                c.execute(artifacts.update().where(self._akey(evaluation_id, name)).values(
                    size=info.size, sha256=digest, created_at=info.created_at))
                c.execute(parts_t.delete().where(
                    parts_t.c.tenant == tenant, parts_t.c.evaluation_id == evaluation_id,
                    parts_t.c.name == name))
            c.execute(parts_t.insert(), [
                {"tenant": tenant, "evaluation_id": evaluation_id, "name": name, "seq": i,
                 "data": part} for i, part in enumerate(parts)])
            return info
        result: ArtifactInfo = self._run(run)
        return result

    def artifacts(self, evaluation_id: str) -> builtins.list[ArtifactInfo]:
        rows = self._run(lambda c: c.execute(
            sa.select(artifacts.c.name, artifacts.c.size, artifacts.c.sha256,
                      artifacts.c.created_at)
            .where(artifacts.c.tenant == self._t(), artifacts.c.evaluation_id == evaluation_id)
            .order_by(artifacts.c.name)).all())
        return [ArtifactInfo(r[0], int(r[1]), r[2], float(r[3])) for r in rows]

    def artifact(self, evaluation_id: str, name: str) -> bytes | None:
        """As :meth:`~.store.EvaluationStore.artifact`: the row is held ``FOR SHARE`` while
        its parts are read, so a concurrent replacement is never seen half-done."""
        parts_t = artifact_parts_table

        def run(c: Any) -> tuple[ArtifactInfo, list[bytes]] | None:
            r = c.execute(sa.select(artifacts.c.size, artifacts.c.sha256,
                                    artifacts.c.created_at)
                          .where(self._akey(evaluation_id, name))
                          .with_for_update(read=True)).first()
            if r is None:
                return None
            data = [bytes(p[0]) for p in c.execute(
                sa.select(parts_t.c.data).where(
                    parts_t.c.tenant == self._t(), parts_t.c.evaluation_id == evaluation_id,
                    parts_t.c.name == name).order_by(parts_t.c.seq)).all()]
            return ArtifactInfo(name, int(r[0]), r[1], float(r[2])), data
        got = self._run(run)
        if got is None:
            return None
        return joined_artifact(*got)
