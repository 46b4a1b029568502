"""Schema versions of the embedded SQLite files: the evaluation store
(``<state>/evaluations.sqlite``), the proxy ledger (``<state>/ledger.sqlite``) and the blob
index (``<state>/blobs/blobs.sqlite``).

Each file records its schema version in SQLite's header (``PRAGMA user_version``) and what
kind of Fortis file it is (``PRAGMA application_id``, so a ledger handed over as an evaluation
store is refused, not "migrated"). Opening a file (:func:`open_db`):

- a new, empty file gets the whole schema and the head version in one transaction;
- a file at this Fortis's version is checked against the schema (tables, columns, indexes):
  a file that claims a version but lacks part of it is refused, never used half-way;
- an older file, or one written before versions were recorded (Fortis 0.2.0 and earlier:
  version 0), is migrated in place: a copy of it is taken first
  (``<file>.v<old>.bak``, through SQLite's online backup, so it is consistent even in WAL
  mode), then every step runs in ONE ``BEGIN IMMEDIATE`` transaction that also writes the new
  version, and the result is checked before ``COMMIT``. SQLite's DDL is transactional: a
  failure or a crash leaves the file exactly as it was. Two processes opening the file at
  once: the second waits for the first's lock and then finds it migrated. Readers that must
  not change a file (``migrate=False``) refuse an older one, naming
  ``fortis db upgrade --state-dir DIR``, which migrates a whole state folder;
- a file of a newer version than this Fortis knows is refused, naming both versions (run the
  newer Fortis, or restore the backup the upgrade left).

Why not Alembic as for PostgreSQL: the three files hold different subsets of the one
PostgreSQL database's tables (``infra/storage/migrations``), with SQLite's own types and
without the PostgreSQL-only columns (the ledger's ``owner``); one Alembic history cannot
describe three differently shaped files, so each file has a short list of numbered steps
here, kept in step with the PostgreSQL revisions where the tables are shared.

Pure code: no gRPC, no service imports.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from fortis.services.common import errors

#: The setting every refusal names (``fortis serve --state-dir``).
SETTING = "state_dir"
#: What an operator runs to migrate every SQLite file of a state folder.
UPGRADE_COMMAND = "fortis db upgrade --state-dir DIR"
#: ``PRAGMA application_id`` of each kind of Fortis SQLite file ("FEVS", "FLDG", "FBLB").
EVALUATION_STORE_ID = 0x46455653
LEDGER_ID = 0x464C4447
BLOB_INDEX_ID = 0x46424C42
KINDS = {EVALUATION_STORE_ID: "evaluation store", LEDGER_ID: "proxy ledger",
         BLOB_INDEX_ID: "blob index"}
#: How long an opener waits for another process's lock (a migration in progress).
BUSY_TIMEOUT_MS = 30_000


class SchemaError(errors.InvalidArgument):
    """A SQLite file that cannot be used as it is: newer than this Fortis, older and not to be
    migrated here, damaged, or not the kind of file expected. Names ``state_dir``."""

    def __init__(self, description: str) -> None:
        super().__init__(SETTING, description)


@dataclass(frozen=True)
class Step:
    """One migration: from ``version - 1`` to ``version``; ``run`` gets the connection inside
    the migration's transaction (statements only: no COMMIT, no executescript)."""

    version: int
    what: str
    run: Callable[[sqlite3.Connection], None]


@dataclass(frozen=True)
class Schema:
    """The versioned schema of one kind of SQLite file.

    ``baseline``: the statements of version 1, the layout Fortis 0.2.0 wrote (``CREATE TABLE
    IF NOT EXISTS`` / ``CREATE [UNIQUE] INDEX IF NOT EXISTS``); ``steps``: versions 2, 3, ...
    in order. A file written before versions were recorded is brought to version 1 by
    :func:`adopt` from what it holds: ``derived`` gives the value of a column a table rebuild
    adds (an SQL expression over the old row, e.g. the tenant of an item from its
    evaluation), ``filled`` a statement run after a column is added in place (e.g. unique
    values for a new key column)."""

    kind: str                   # "evaluation store", "proxy ledger", "blob index"
    application_id: int
    baseline: Sequence[str]
    steps: Sequence[Step] = ()
    derived: Mapping[tuple[str, str], str] = field(default_factory=dict)
    filled: Mapping[tuple[str, str], str] = field(default_factory=dict)
    #: What is computed once from the above (the head layout).
    cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def head(self) -> int:
        return 1 + len(self.steps)

    def __post_init__(self) -> None:
        for i, step in enumerate(self.steps):
            if step.version != i + 2:
                raise ValueError(f"{self.kind}: step {step.what!r} is numbered {step.version},"
                                 f" expected {i + 2}")


def statements(script: str) -> list[str]:
    """The statements of a schema script (no ';' inside our statements)."""
    return [s.strip() for s in script.split(";") if s.strip()]


# -- inspecting a file -------------------------------------------------------------------------
def tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")}


def columns(conn: sqlite3.Connection, table: str) -> dict[str, tuple[str, int, int]]:
    """Column name -> (declared type, not null, position in the primary key)."""
    return {r[1]: (str(r[2]).upper(), int(r[3]), int(r[5]))
            for r in conn.execute(f"PRAGMA table_info({table})")}


def primary_key(conn: sqlite3.Connection, table: str) -> tuple[str, ...]:
    cols = columns(conn, table)
    return tuple(name for name, (_, _, pk) in sorted(cols.items(), key=lambda c: c[1][2])
                 if pk)


def indexes(conn: sqlite3.Connection) -> dict[str, tuple[str, tuple[str, ...], bool]]:
    """Index name -> (table, columns, unique) of the indexes made by CREATE INDEX."""
    out = {}
    for name, table in conn.execute("SELECT name, tbl_name FROM sqlite_master WHERE"
                                    " type='index' AND name NOT LIKE 'sqlite_%'").fetchall():
        cols = tuple(str(r[2]) for r in conn.execute(f"PRAGMA index_info({name})"))
        unique = any(r[1] == name and r[2] for r in conn.execute(
            f"PRAGMA index_list({table})"))
        out[name] = (table, cols, unique)
    return out


@dataclass(frozen=True)
class Layout:
    """Tables (with their columns) and indexes of a schema."""

    tables: dict[str, dict[str, tuple[str, int, int]]]
    indexes: dict[str, tuple[str, tuple[str, ...], bool]]


def layout_of(conn: sqlite3.Connection) -> Layout:
    return Layout({t: columns(conn, t) for t in tables(conn)}, indexes(conn))


def head_layout(schema: Schema) -> Layout:
    """The layout of a file created fresh at the head (by the same code path as a
    migration's: the baseline, then every step); made once per schema."""
    if "head" not in schema.cache:
        conn = sqlite3.connect(":memory:", isolation_level=None)
        try:
            _create(conn, schema)
            schema.cache["head"] = layout_of(conn)
        finally:
            conn.close()
    layout: Layout = schema.cache["head"]
    return layout


def differences(conn: sqlite3.Connection, schema: Schema) -> list[str]:
    """What the file lacks or has otherwise than this Fortis's head schema (none: []):
    missing tables, columns, indexes; a column of another type, nullability or key."""
    want, have = head_layout(schema), layout_of(conn)
    problems = []
    for table, cols in sorted(want.tables.items()):
        got = have.tables.get(table)
        if got is None:
            problems.append(f"table {table} is missing")
            continue
        for name, spec in cols.items():
            if name not in got:
                problems.append(f"column {table}.{name} is missing")
            elif got[name] != spec:
                problems.append(f"column {table}.{name} is {got[name]}, expected {spec}")
    for index, (table, cols_of, unique) in sorted(want.indexes.items()):
        if index not in have.indexes:
            problems.append(f"index {index} is missing")
        elif have.indexes[index] != (table, cols_of, unique):
            problems.append(f"index {index} is {have.indexes[index]}, expected "
                            f"{(table, cols_of, unique)}")
    return problems


# -- files written before versions were recorded ----------------------------------------------
_CREATE_TABLE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+)")


@dataclass(frozen=True)
class Baseline:
    """Version 1 of a schema: its layout, each table's CREATE statement and each column's
    declared default (None: none)."""

    layout: Layout
    creates: dict[str, str]
    defaults: dict[tuple[str, str], str | None]


def baseline_of(schema: Schema) -> Baseline:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        for stmt in schema.baseline:
            conn.execute(stmt)
        layout = layout_of(conn)
        defaults = {(t, str(r[1])): (None if r[4] is None else str(r[4]))
                    for t in layout.tables for r in conn.execute(f"PRAGMA table_info({t})")}
    finally:
        conn.close()
    creates = {m.group(1): stmt for stmt in schema.baseline
               if (m := _CREATE_TABLE.match(stmt))}
    return Baseline(layout, creates, defaults)


def _key(cols: Mapping[str, tuple[str, int, int]]) -> tuple[str, ...]:
    return tuple(n for n, spec in sorted(cols.items(), key=lambda c: c[1][2]) if spec[2])


def adopt(conn: sqlite3.Connection, schema: Schema) -> list[str]:
    """Bring a file written before versions were recorded to version 1, in the caller's
    transaction; what was done, one line each. Known differences of earlier layouts are
    repaired: a missing table or index is created, a missing column with a default is added
    (then ``schema.filled``), a table keyed otherwise than version 1 (the keys before tenants
    had namespaces) is rebuilt with its rows copied (``schema.derived`` gives the new
    columns), an index on other columns is made again. A column version 1 does not know is a
    layout this Fortis cannot read: SchemaError, nothing changed."""
    base = baseline_of(schema)
    done: list[str] = []
    have = layout_of(conn)
    for table, cols in base.layout.tables.items():
        got = have.tables.get(table)
        if got is None:
            continue                                # created below with the baseline
        unknown = sorted(set(got) - set(cols))
        if unknown:
            raise SchemaError(
                f"the {schema.kind} has a layout this Fortis does not know (column "
                f"{table}.{unknown[0]}): it was written by a development build older than "
                "Fortis 0.2.0 or changed by hand, and cannot be migrated")
        missing = [c for c in cols if c not in got]
        hard = [c for c in missing if cols[c][1] and base.defaults[(table, c)] is None]
        if _key(cols) != _key(got) or hard:
            _rebuild(conn, schema, base, table, list(got))
            done.append(f"{table}: rebuilt with key ({', '.join(_key(cols))})")
            continue
        for c in missing:
            ctype, notnull, _ = cols[c]
            default = base.defaults[(table, c)]
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {c} {ctype}"
                         + (" NOT NULL" if notnull else "")
                         + (f" DEFAULT {default}" if default is not None else ""))
            if (table, c) in schema.filled:
                conn.execute(schema.filled[(table, c)])
            done.append(f"{table}.{c}: added")
    have_idx = indexes(conn)
    for name, spec in base.layout.indexes.items():
        if name in have_idx and have_idx[name] != spec:
            conn.execute(f"DROP INDEX {name}")
            done.append(f"index {name}: made again on ({', '.join(spec[1])})")
    for stmt in schema.baseline:
        conn.execute(stmt)
    return done


def _rebuild(conn: sqlite3.Connection, schema: Schema, base: Baseline, table: str,
             old_cols: list[str]) -> None:
    """Copy ``table`` into a new table of version 1's definition (same name), every row; a
    new column takes its ``schema.derived`` value, else its default."""
    old = f"{table}__before_v1"
    names, values = [], []
    for c, (_, notnull, _) in base.layout.tables[table].items():
        if c in old_cols:
            names.append(c)
            values.append(c)
        elif (table, c) in schema.derived:
            names.append(c)
            values.append(schema.derived[(table, c)].format(old=old))
        elif notnull and base.defaults[(table, c)] is None:
            raise SchemaError(f"the {schema.kind}'s table {table} has no column {c} and "
                              "nothing to fill it from: a layout this Fortis cannot migrate")
    conn.execute(f"ALTER TABLE {table} RENAME TO {old}")
    conn.execute(base.creates[table])
    before = conn.execute(f"SELECT COUNT(*) FROM {old}").fetchone()[0]
    conn.execute(f"INSERT INTO {table} ({', '.join(names)}) SELECT {', '.join(values)} "
                 f"FROM {old}")
    after = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    if after != before:          # never drop what could not be copied
        raise SchemaError(f"the {schema.kind}'s table {table} could not be copied whole "
                          f"({after} of {before} rows)")
    conn.execute(f"DROP TABLE {old}")


# -- opening -----------------------------------------------------------------------------------
def _create(conn: sqlite3.Connection, schema: Schema) -> None:
    for stmt in schema.baseline:
        conn.execute(stmt)
    for step in schema.steps:
        step.run(conn)


def _header(conn: sqlite3.Connection) -> tuple[int, int]:
    return (int(conn.execute("PRAGMA user_version").fetchone()[0]),
            int(conn.execute("PRAGMA application_id").fetchone()[0]))


def backup_path(path: Path, version: int) -> Path:
    """Where the copy taken before migrating from ``version`` goes."""
    return path.with_name(f"{path.name}.v{version}.bak")


def _backup(path: Path, version: int) -> Path:
    """A consistent copy of the file as it is now, fsynced before any migration step runs.
    The caller holds the write lock (nothing can change the file meanwhile); the copy is
    read through a second connection, since SQLite's backup cannot read through a connection
    inside a write transaction."""
    dest = backup_path(path, version)
    tmp = dest.with_name(dest.name + ".part")
    tmp.unlink(missing_ok=True)
    source = sqlite3.connect(str(path))
    copy = sqlite3.connect(str(tmp))
    try:
        source.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        source.backup(copy)
    finally:
        copy.close()
        source.close()
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, dest)
    return dest


def _refuse_unknown(path: Path, schema: Schema, version: int, app_id: int) -> None:
    if app_id not in (0, schema.application_id):
        other = KINDS.get(app_id, f"file of application id {app_id:#x}, not a Fortis file")
        raise SchemaError(f"{path} is a {other}, not the {schema.kind} expected here")
    if version > schema.head:
        raise SchemaError(
            f"the {schema.kind} {path} is at schema version {version}, newer than this "
            f"Fortis knows (version {schema.head}): it was written by a newer Fortis; run that "
            f"release, or restore the copy the upgrade left ({backup_path(path, schema.head)})")


def _check(conn: sqlite3.Connection, path: Path, schema: Schema,
           migrated_from: int | None = None) -> None:
    """Refuse a file at the head version that lacks part of the head schema (checked on every
    open, and after a migration before its COMMIT)."""
    problems = differences(conn, schema)
    if not problems:
        return
    what = "; ".join(problems[:5])
    if migrated_from is None:
        raise SchemaError(
            f"the {schema.kind} {path} claims schema version {schema.head} but does not match "
            f"it ({what}): the file is damaged or was changed by hand; restore it from a "
            "backup (a migration leaves <file>.v<old version>.bak)")
    raise SchemaError(
        f"the {schema.kind} {path} does not match schema version {schema.head} after "
        f"migrating it from version {migrated_from} ({what}): its layout is one this Fortis "
        "cannot migrate; nothing was changed")


def _describe(version: int) -> str:
    return ("was written before schema versions were recorded (Fortis 0.2.0 or earlier)"
            if version == 0 else f"is at schema version {version}")


def upgrade_command(path: Path) -> str:
    """The command that migrates the state folder holding ``path``."""
    folder = path.parent.parent if path.parent.name == "blobs" else path.parent
    return UPGRADE_COMMAND.replace("DIR", str(folder))


def ensure(conn: sqlite3.Connection, path: str | Path, schema: Schema, *,
           migrate: bool = True) -> tuple[int, int]:
    """Bring the open file to ``schema``'s head or refuse it (see the module's text); the
    connection must be in autocommit mode (``isolation_level=None``) with no transaction
    open. Returns (version found, version now)."""
    path = Path(path)
    try:
        version, app_id = _header(conn)
        _refuse_unknown(path, schema, version, app_id)
        if version == schema.head:
            _check(conn, path, schema)
            return version, version
        if not migrate and (version or tables(conn)):
            raise SchemaError(
                f"the {schema.kind} {path} {_describe(version)}; this Fortis needs version "
                f"{schema.head}: run `{upgrade_command(path)}` (or start `fortis serve` on "
                "it, which migrates it) first")
        conn.execute("BEGIN IMMEDIATE")
        try:
            # read again under the write lock: another process may have migrated it meanwhile
            version, app_id = _header(conn)
            _refuse_unknown(path, schema, version, app_id)
            if version == schema.head:
                conn.execute("COMMIT")
                _check(conn, path, schema)
                return version, version
            fresh = version == 0 and not tables(conn)
            if not fresh and str(path) != ":memory:":
                _backup(path, version)
            if fresh:
                _create(conn, schema)
            else:
                if version == 0:
                    adopt(conn, schema)
                    version_from = 1
                else:
                    version_from = version
                for step in schema.steps[version_from - 1:]:
                    step.run(conn)
            conn.execute(f"PRAGMA application_id={schema.application_id}")
            conn.execute(f"PRAGMA user_version={schema.head}")
            _check(conn, path, schema, migrated_from=version)
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        return version, schema.head
    except SchemaError:
        raise
    except sqlite3.DatabaseError as exc:
        raise SchemaError(
            f"the {schema.kind} {path} cannot be read as a SQLite database ({exc}): it is "
            "damaged or not a Fortis state file; restore it from a backup") from None


#: The oldest SQLite library the embedded state works with: the stores and the ledger share
#: their SQL text with PostgreSQL (``INSERT ... RETURNING``, SQLite 3.35, March 2021).
MIN_SQLITE: Final = (3, 35, 0)


def check_sqlite_version(version: tuple[int, ...] | None = None) -> None:
    """FailedPrecondition naming both versions when Python's SQLite library is older than
    :data:`MIN_SQLITE` (Debian 11, RHEL 9 and Ubuntu 20.04 ship older ones): said when a
    state file is opened, not as a syntax error at a run's first write."""
    have = tuple(sqlite3.sqlite_version_info if version is None else version)
    if have < MIN_SQLITE:
        raise errors.FailedPrecondition(
            f"this Python's SQLite library is {'.'.join(map(str, have))}; Fortis's embedded "
            f"state needs {'.'.join(map(str, MIN_SQLITE))} or newer: use a Python linked to a "
            "newer SQLite (the container images have one) or PostgreSQL (--database-url)")


def open_db(path: str | Path, schema: Schema, *, migrate: bool = True,
            timeout_ms: int = BUSY_TIMEOUT_MS) -> sqlite3.Connection:
    """A connection (autocommit, usable from several threads under the caller's lock) to
    the file at ``path``, whose schema is now this Fortis's head (see :func:`ensure`);
    SchemaError otherwise, with the connection closed; FailedPrecondition where the SQLite
    library is too old (:func:`check_sqlite_version`)."""
    check_sqlite_version()
    if str(path) != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    try:
        usual = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])
        conn.execute(f"PRAGMA busy_timeout={int(timeout_ms)}")     # a migration may be long
        ensure(conn, path, schema, migrate=migrate)
        conn.execute(f"PRAGMA busy_timeout={usual}")
    except BaseException:
        conn.close()
        raise
    return conn


def inspect(path: str | Path, schema: Schema) -> dict[str, object]:
    """What ``fortis db current --state-dir`` shows of one file, without changing it."""
    path = Path(path)
    out: dict[str, object] = {"file": str(path), "kind": schema.kind, "head": schema.head}
    if not path.exists():
        return {**out, "version": None, "at_head": False, "problem": "no such file"}
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            version, app_id = _header(conn)
            problem = ""
            try:
                _refuse_unknown(path, schema, version, app_id)
                if version == schema.head:
                    _check(conn, path, schema)
            except SchemaError as exc:
                problem = exc.violations[0].description
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        return {**out, "version": None, "at_head": False, "problem": str(exc)}
    return {**out, "version": version, "at_head": version == schema.head and not problem,
            **({"problem": problem} if problem else {})}
