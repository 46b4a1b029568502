"""The queries of the evaluation store, written once for its two twins.

:class:`~.store.EvaluationStore` (SQLite) and :class:`~.store_pg.PgEvaluationStore`
(PostgreSQL) run the same statements and map their rows the same way, through the functions
here: each takes an :class:`~fortis.infra.storage.sql_dialects.Executor` (the twin's
connection, inside the transaction the twin opened) and the twin's
:class:`~fortis.infra.storage.sql_dialects.Dialect`, which supplies what the two databases
spell differently (the leases' clock, row-lock clauses). A column or a query changes here, in
one place, for both.

What stays in the twins is what truly differs: opening and closing connections, how a
transaction is taken (SQLite: ``BEGIN IMMEDIATE`` under the connection's lock; PostgreSQL: a
pooled connection per transaction, its rows locked by the clauses of the dialect), and
mapping a lost database to ``Unavailable``.

The records both return (:class:`EvaluationRow`, :class:`ArtifactInfo`) and the artifact
parts' helpers live here too, so this module depends on no twin; ``store.py`` re-exports them
for the service's code. Domain code: no gRPC.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from fortis.infra.storage.sql_dialects import Dialect, Executor, chunked, in_list
from fortis.services.common import errors

ACTIVE_STATES = ("PENDING", "RUNNING")


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


def artifact_parts(data: bytes) -> list[bytes]:
    """``data`` cut into stored parts (one empty part for empty data)."""
    return [data[i:i + ARTIFACT_PART_BYTES]
            for i in range(0, len(data), ARTIFACT_PART_BYTES)] or [b""]


def joined_artifact(info: ArtifactInfo, parts: Iterable[bytes]) -> bytes:
    """The stored parts joined, checked against the recorded size and SHA-256."""
    data = b"".join(parts)
    if len(data) != info.size or hashlib.sha256(data).hexdigest() != info.sha256:
        raise errors.Internal(f"artifact {info.name} is damaged in the evaluation store")
    return data


# -- statements ---------------------------------------------------------------------------------
#: The columns of an EvaluationRow, in its field order.
ROW_COLUMNS = tuple(f.name for f in fields(EvaluationRow))
#: Columns ``update`` may set: the row's and the report's (never the key).
UPDATABLE = frozenset(ROW_COLUMNS + ("report_json", "report_html")) - {"evaluation_id", "tenant"}
_SELECT_ROWS = f"SELECT {', '.join(ROW_COLUMNS)} FROM evaluations"
#: The rows of one evaluation (of ``evaluations``, ``items`` or ``artifacts``).
_EVALUATION = " WHERE tenant=:tenant AND evaluation_id=:eid"
_ACTIVE = "state IN (" + ", ".join(f"'{s}'" for s in ACTIVE_STATES) + ")"
_ITEMS = " WHERE tenant=:tenant AND evaluation_id=:eid"
_ITEM = _ITEMS + " AND item_key=:key"
_ARTIFACT = " WHERE tenant=:tenant AND evaluation_id=:eid AND name=:name"
_NEWEST_FIRST = " ORDER BY created_at DESC, evaluation_id DESC LIMIT :limit"
_ADD_ITEM = ("INSERT INTO items (tenant, evaluation_id, item_key) VALUES {values}"
             " ON CONFLICT (tenant, evaluation_id, item_key) DO NOTHING")
_LEASE = "UPDATE items SET lease_owner=:worker, lease_expires={now} + :lease_s"
_FREE_LEASE = "UPDATE items SET lease_owner='', lease_expires=0"


def _key(tenant: str, evaluation_id: str, **more: Any) -> dict[str, Any]:
    return {"tenant": tenant, "eid": evaluation_id, "now": time.time(), **more}


def evaluation_row(r: Sequence[Any]) -> EvaluationRow:
    """An ``evaluations`` row (columns :data:`ROW_COLUMNS`) as its record."""
    values = list(r)
    status = values[-1]
    values[-1] = bytes(status) if status is not None else None
    return EvaluationRow(*values)


def artifact_info(name: str, r: Sequence[Any]) -> ArtifactInfo:
    """An artifact's (size, sha256, created_at) as its record."""
    return ArtifactInfo(name, int(r[0]), r[1], float(r[2]))


# -- evaluations --------------------------------------------------------------------------------
def insert(x: Executor, *, evaluation_id: str, tenant: str, plan_text: str,
           plan_name: str) -> None:
    now = time.time()
    x.execute("INSERT INTO evaluations (evaluation_id, tenant, state, plan_text, plan_name,"
              " created_at, updated_at) VALUES (:eid, :tenant, 'PENDING', :plan_text,"
              " :plan_name, :now, :now)",
              {"eid": evaluation_id, "tenant": tenant, "plan_text": plan_text,
               "plan_name": plan_name, "now": now})


def get(x: Executor, tenant: str, evaluation_id: str) -> EvaluationRow | None:
    row = x.execute(_SELECT_ROWS + _EVALUATION, _key(tenant, evaluation_id)).fetchone()
    return evaluation_row(row) if row is not None else None


def page(x: Executor, tenant: str, *, limit: int,
         after: tuple[float, str] | None) -> list[EvaluationRow]:
    """A tenant's evaluations, newest first, after the (created_at, evaluation_id) cursor."""
    params: dict[str, Any] = {"tenant": tenant, "limit": limit}
    cursor = ""
    if after is not None:
        cursor = (" AND (created_at < :after_t OR (created_at = :after_t AND"
                  " evaluation_id < :after_id))")
        params.update(after_t=after[0], after_id=after[1])
    rows = x.execute(_SELECT_ROWS + " WHERE tenant=:tenant" + cursor + _NEWEST_FIRST,
                     params).fetchall()
    return [evaluation_row(r) for r in rows]


def active(x: Executor) -> list[EvaluationRow]:
    rows = x.execute(f"{_SELECT_ROWS} WHERE {_ACTIVE} ORDER BY created_at", {}).fetchall()
    return [evaluation_row(r) for r in rows]


def update(x: Executor, tenant: str, evaluation_id: str, values: dict[str, Any], *,
           running_only: bool) -> int:
    """Set ``values`` (and ``updated_at``) on an evaluation, with ``running_only`` only while
    it is pending or running; the number of rows updated."""
    unknown = set(values) - UPDATABLE
    if unknown:
        raise ValueError(f"no such evaluation column: {', '.join(sorted(unknown))}")
    values = {**values, "updated_at": time.time()}
    sets = ", ".join(f"{k}=:v_{k}" for k in values)
    where = _EVALUATION + (f" AND {_ACTIVE}" if running_only else "")
    cur = x.execute(f"UPDATE evaluations SET {sets}{where}",
                    {"tenant": tenant, "eid": evaluation_id,
                     **{f"v_{k}": v for k, v in values.items()}})
    return int(cur.rowcount or 0)


def mark_resumed(x: Executor, tenant: str, evaluation_id: str) -> None:
    x.execute("UPDATE evaluations SET resumed_count=resumed_count+1, updated_at=:now"
              + _EVALUATION, _key(tenant, evaluation_id))


def report(x: Executor, tenant: str, evaluation_id: str) -> tuple[str, str]:
    row = x.execute("SELECT report_json, report_html FROM evaluations" + _EVALUATION,
                    _key(tenant, evaluation_id)).fetchone()
    return (row[0], row[1]) if row is not None else ("", "")


# -- items ----------------------------------------------------------------------------------------
def item(x: Executor, tenant: str, evaluation_id: str, key: str
         ) -> tuple[bool, int, bytes | None]:
    row = x.execute("SELECT done, attempts, result FROM items" + _ITEM,
                    _key(tenant, evaluation_id, key=key)).fetchone()
    if row is None:
        return False, 0, None
    return bool(row[0]), int(row[1]), (bytes(row[2]) if row[2] is not None else None)


def start_item(x: Executor, tenant: str, evaluation_id: str, key: str) -> int:
    """Record a new attempt at an item; its attempt number (1 = first)."""
    rows = x.execute("INSERT INTO items (tenant, evaluation_id, item_key, attempts) VALUES"
                     " (:tenant, :eid, :key, 1) ON CONFLICT (tenant, evaluation_id, item_key)"
                     " DO UPDATE SET attempts=items.attempts+1 RETURNING attempts",
                     _key(tenant, evaluation_id, key=key)).fetchall()
    return int(rows[0][0])


def finish_item(x: Executor, tenant: str, evaluation_id: str, key: str, result: bytes, *,
                items_done: int, images_done: int, queries: int, message: str) -> None:
    """An item's result and the evaluation's progress (only while it is pending or running);
    the caller holds both in one transaction."""
    params = _key(tenant, evaluation_id, key=key, result=result, items_done=items_done,
                  images_done=images_done, queries=queries, message=message)
    x.execute("UPDATE items SET done=TRUE, result=:result" + _ITEM, params)
    x.execute("UPDATE evaluations SET items_done=:items_done, images_done=:images_done,"
              " queries=:queries, message=:message, updated_at=:now" + _EVALUATION
              + f" AND {_ACTIVE}", params)


def items(x: Executor, tenant: str, evaluation_id: str) -> list[tuple[str, int, bool]]:
    rows = x.execute("SELECT item_key, attempts, done FROM items" + _ITEMS
                     + " ORDER BY item_key", _key(tenant, evaluation_id)).fetchall()
    return [(r[0], int(r[1]), bool(r[2])) for r in rows]


# -- claims: several workers share an evaluation's items ------------------------------------------
def add_items(x: Executor, tenant: str, evaluation_id: str, keys: Iterable[str]) -> int:
    """Record items as pending (known ones kept as they are), in statements of bounded size;
    the number added."""
    added = 0
    for chunk in chunked(keys):
        values = ", ".join(f"(:tenant, :eid, :k{i})" for i in range(len(chunk)))
        cur = x.execute(_ADD_ITEM.format(values=values),
                        _key(tenant, evaluation_id, **{f"k{i}": k for i, k in enumerate(chunk)}))
        added += int(cur.rowcount or 0)
    return added


def claim_items(x: Executor, d: Dialect, tenant: str, evaluation_id: str, worker_id: str, *,
                limit: int, lease_s: float) -> list[str]:
    """Lease up to ``limit`` free unfinished items to ``worker_id``, in key order (rows being
    claimed by another transaction at this moment are skipped where the dialect locks rows:
    never handed out twice)."""
    rows = x.execute(
        "WITH free AS (SELECT item_key FROM items" + _ITEMS + " AND done=FALSE AND"
        f" (lease_owner='' OR lease_expires<={d.now}) ORDER BY item_key LIMIT :limit"
        f"{d.for_update_skip_locked}) " + _LEASE.format(now=d.now) + _ITEMS
        + " AND item_key IN (SELECT item_key FROM free) RETURNING item_key",
        _key(tenant, evaluation_id, worker=worker_id, lease_s=lease_s, limit=limit)).fetchall()
    return sorted(r[0] for r in rows)


def renew_leases(x: Executor, d: Dialect, tenant: str, evaluation_id: str, worker_id: str, *,
                 lease_s: float) -> int:
    cur = x.execute(f"UPDATE items SET lease_expires={d.now} + :lease_s" + _ITEMS
                    + " AND lease_owner=:worker AND done=FALSE",
                    _key(tenant, evaluation_id, worker=worker_id, lease_s=lease_s))
    return int(cur.rowcount or 0)


def release_items(x: Executor, tenant: str, evaluation_id: str, worker_id: str,
                  keys: Iterable[str] | None) -> int:
    """Give back ``worker_id``'s leases of unfinished items (all, or those of ``keys``)."""
    sql = _FREE_LEASE + _ITEMS + " AND lease_owner=:worker AND done=FALSE"
    params = _key(tenant, evaluation_id, worker=worker_id)
    if keys is None:
        return int(x.execute(sql, params).rowcount or 0)
    released = 0
    for chunk in chunked(keys):
        listed, more = in_list("k", chunk)
        released += int(x.execute(sql + " AND item_key IN " + listed,
                                  {**params, **more}).rowcount or 0)
    return released


def expire_leases(x: Executor, d: Dialect, tenant: str, evaluation_id: str) -> int:
    cur = x.execute(_FREE_LEASE + _ITEMS + f" AND lease_owner<>'' AND lease_expires<={d.now}"
                    " AND done=FALSE", _key(tenant, evaluation_id))
    return int(cur.rowcount or 0)


def leases(x: Executor, d: Dialect, tenant: str, evaluation_id: str) -> dict[str, str]:
    rows = x.execute("SELECT item_key, lease_owner FROM items" + _ITEMS + " AND done=FALSE"
                     f" AND lease_owner<>'' AND lease_expires>{d.now}",
                     _key(tenant, evaluation_id)).fetchall()
    return {r[0]: r[1] for r in rows}


def claim_key(x: Executor, d: Dialect, tenant: str, evaluation_id: str, key: str,
              worker_id: str, *, lease_s: float) -> str:
    """``"claimed"``, ``"done"`` or ``"leased"`` (see ``EvaluationStore.claim_key``); the
    caller holds one transaction, in which the dialect locks the item's row."""
    params = _key(tenant, evaluation_id, key=key, worker=worker_id, lease_s=lease_s)
    x.execute(_ADD_ITEM.format(values="(:tenant, :eid, :key)"), params)
    done, owner, live = x.execute(
        f"SELECT done, lease_owner, lease_expires>{d.now} FROM items" + _ITEM + d.for_update,
        params).fetchone()
    if done:
        return "done"
    if owner and owner != worker_id and live:
        return "leased"
    x.execute(_LEASE.format(now=d.now) + _ITEM, params)
    return "claimed"


def finish_claimed(x: Executor, tenant: str, evaluation_id: str, key: str, worker_id: str,
                   result: bytes, *, images: int, queries: int, message: str) -> bool:
    """Commit a claimed item's result and ADD its counts to the evaluation's progress; False
    (nothing written) when someone finished it already. The caller holds one transaction."""
    params = _key(tenant, evaluation_id, key=key, worker=worker_id, result=result,
                  images=images, queries=queries, message=message)
    cur = x.execute("UPDATE items SET done=TRUE, result=:result, lease_owner=:worker,"
                    " lease_expires=0" + _ITEM + " AND done=FALSE", params)
    if cur.rowcount != 1:
        return False
    x.execute("UPDATE evaluations SET items_done=items_done+1, images_done=images_done+:images,"
              " queries=queries+:queries, message=:message, updated_at=:now" + _EVALUATION
              + f" AND {_ACTIVE}", params)
    return True


# -- artifacts ------------------------------------------------------------------------------------
def put_artifact(x: Executor, d: Dialect, tenant: str, evaluation_id: str, name: str,
                 data: bytes, digest: str) -> ArtifactInfo:
    """Store (or replace) an artifact, in the caller's transaction: a new row is inserted
    (waiting for a concurrent writer of the same name to commit, where rows are locked), an
    existing one is locked, kept when it holds these bytes, else replaced with its parts."""
    info = ArtifactInfo(name, len(data), digest, time.time())
    params = _key(tenant, evaluation_id, name=name, size=info.size, sha256=digest,
                  created_at=info.created_at)
    inserted = x.execute(
        "INSERT INTO artifacts (tenant, evaluation_id, name, size, sha256, created_at) VALUES"
        " (:tenant, :eid, :name, :size, :sha256, :created_at)"
        " ON CONFLICT (tenant, evaluation_id, name) DO NOTHING", params).rowcount == 1
    if not inserted:
        stored = artifact_info(name, x.execute("SELECT size, sha256, created_at FROM artifacts"
                                               + _ARTIFACT + d.for_update, params).fetchone())
        if (stored.size, stored.sha256) == (info.size, digest):
            return stored
        x.execute("UPDATE artifacts SET size=:size, sha256=:sha256, created_at=:created_at"
                  + _ARTIFACT, params)
        x.execute("DELETE FROM artifact_parts" + _ARTIFACT, params)
    x.executemany("INSERT INTO artifact_parts (tenant, evaluation_id, name, seq, data)"
                  " VALUES (:tenant, :eid, :name, :seq, :data)",
                  [{**params, "seq": i, "data": part}
                   for i, part in enumerate(artifact_parts(data))])
    return info


def artifacts(x: Executor, tenant: str, evaluation_id: str) -> list[ArtifactInfo]:
    rows = x.execute("SELECT name, size, sha256, created_at FROM artifacts" + _EVALUATION
                     + " ORDER BY name", _key(tenant, evaluation_id)).fetchall()
    return [artifact_info(r[0], r[1:]) for r in rows]


def artifact(x: Executor, d: Dialect, tenant: str, evaluation_id: str, name: str
             ) -> tuple[ArtifactInfo, list[bytes]] | None:
    """An artifact's record and stored parts, read in the caller's transaction (the row held
    shared where rows are locked, so a concurrent replacement is never seen half-done)."""
    params = _key(tenant, evaluation_id, name=name)
    row = x.execute("SELECT size, sha256, created_at FROM artifacts" + _ARTIFACT + d.for_share,
                    params).fetchone()
    if row is None:
        return None
    parts = x.execute("SELECT data FROM artifact_parts" + _ARTIFACT + " ORDER BY seq",
                      params).fetchall()
    return artifact_info(name, row), [bytes(p[0]) for p in parts]
