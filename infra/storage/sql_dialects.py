"""One text per query for the SQLite and PostgreSQL twins of a store (the evaluation store,
the proxy ledger): what differs between the two dialects is named here once, so a query or a
column is written once and both twins run it.

Statements take named parameters (``:name``): ``sqlite3`` binds them from a dict as they
are, and :class:`SaExecutor` runs them through SQLAlchemy's ``text()`` on a PostgreSQL
connection. The few places where the dialects disagree are attributes of a :class:`Dialect`:

- ``now``: the clock of leases. SQLite has one writer machine, so it is the caller's
  ``time.time()`` bound as ``:now``; PostgreSQL is shared by workers on several machines, so
  it is the server's clock (no skew between workers).
- row locks: PostgreSQL holds the rows a transaction reads (``FOR UPDATE``, ``FOR UPDATE SKIP
  LOCKED``, ``FOR SHARE``); SQLite has no row locks, its twins take the database's write lock
  for the whole transaction (``BEGIN IMMEDIATE``), so the clauses are empty there.
- ``param``/``float_param``: the positional placeholder of driver-level statements (the
  ledger's writes: ``sqlite3``'s ``?``, psycopg's ``%s``; psycopg sends a None with no type, so
  a float that may be None is cast).

Pure code: no gRPC, no service imports; SQLAlchemy is imported only when a PostgreSQL twin
runs a statement (the SQLite default never loads it).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Dialect:
    """The SQL fragments in which SQLite and PostgreSQL differ (see the module's docstring)."""

    name: str
    now: str
    for_update: str
    for_update_skip_locked: str
    for_share: str
    param: str
    float_param: str


SQLITE = Dialect("sqlite", now=":now", for_update="", for_update_skip_locked="",
                 for_share="", param="?", float_param="?")
POSTGRES = Dialect("postgresql", now="extract(epoch from clock_timestamp())",
                   for_update=" FOR UPDATE", for_update_skip_locked=" FOR UPDATE SKIP LOCKED",
                   for_share=" FOR SHARE", param="%s", float_param="%s::double precision")


class Cursor(Protocol):
    """What a statement's result offers in both drivers."""

    @property
    def rowcount(self) -> int: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> Any: ...


class Executor(Protocol):
    """Runs a statement with named parameters: a ``sqlite3.Connection`` is one as it is; a
    SQLAlchemy connection through :class:`SaExecutor`."""

    def execute(self, sql: str, parameters: Mapping[str, Any] = ..., /) -> Cursor: ...
    def executemany(self, sql: str, parameters: Iterable[Mapping[str, Any]], /) -> Cursor: ...


class SaExecutor:
    """A SQLAlchemy connection (its transaction is the caller's) as an :class:`Executor`."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, sql: str, parameters: Mapping[str, Any] | None = None, /) -> Any:
        return self.conn.execute(_text(sql), dict(parameters or {}))

    def executemany(self, sql: str, parameters: Iterable[Mapping[str, Any]], /) -> Any:
        return self.conn.execute(_text(sql), [dict(p) for p in parameters])


@functools.lru_cache(maxsize=512)
def _text(sql: str) -> Any:
    import sqlalchemy as sa

    return sa.text(sql)


#: Values bound in one ``IN (...)`` list: well under SQLite's 32766 and PostgreSQL's 65535
#: parameters per statement.
IN_CHUNK = 500


def in_list(name: str, values: Sequence[Any]) -> tuple[str, dict[str, Any]]:
    """``(:name0, :name1, ...)`` and its parameters, for ``column IN`` a list of values."""
    params = {f"{name}{i}": v for i, v in enumerate(values)}
    return "(" + ", ".join(f":{k}" for k in params) + ")", params


def chunked(values: Iterable[Any], n: int = IN_CHUNK) -> Iterator[list[Any]]:
    """``values`` in lists of at most ``n``."""
    chunk: list[Any] = []
    for v in values:
        chunk.append(v)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
