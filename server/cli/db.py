"""``fortis db upgrade`` and ``fortis db current``: the schema of a PostgreSQL database shared
by Fortis services, managed by the Alembic migrations shipped in the package
(``infra/storage/migrations``).

``upgrade`` brings the database to this Fortis's head (one transaction, under an advisory
lock: two at once run one after the other; the Helm chart runs it as a pre-install /
pre-upgrade hook Job); ``current`` prints the revision the database is at (``--check``: exit 1
unless it is at head). The URL comes from ``--database-url`` or ``$FORTIS_DATABASE_URL``
(which keeps the password out of the process list). Exit 2 with one line naming
``database_url`` on a bad URL or an unreachable server; the password is never printed.

``--state-dir DIR`` does the same for the embedded SQLite files of a state folder (the
evaluation store, the proxy ledger, the blob index: ``infra/storage/sqlite_schema.py``):
``upgrade`` migrates each present file in place (a copy ``<file>.v<old>.bak`` first, one
transaction per file), ``current`` prints each file's version and this Fortis's (``--check``:
exit 1 unless all are at head). A file newer than this Fortis, damaged, or of another kind:
exit 2, one line naming ``state_dir``, nothing changed. ``fortis serve`` migrates its own
files when it starts; this command is for doing it beforehand (or for readers such as
``fortis ledger``, which refuse an older file rather than change it).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from fortis.server.cli.output import EXIT_BAD_INPUT, EXIT_FAILED, err


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    sp = sub.add_parser("db", help="the schema of a Fortis state: PostgreSQL (fortis serve "
                        "--database-url) or a state folder's SQLite files (--state-dir)")
    dsub = sp.add_subparsers(dest="db_command", required=True)
    for name, help_text in (("upgrade", "migrate the database to this Fortis's schema head"),
                            ("current", "the database's schema revision and this Fortis's")):
        dp = dsub.add_parser(name, help=help_text)
        where = dp.add_mutually_exclusive_group()
        where.add_argument("--database-url", metavar="URL",
                           help="postgresql://USER:PASSWORD@HOST:PORT/DB (default: "
                           "$FORTIS_DATABASE_URL, which keeps the password out of `ps`)")
        where.add_argument("--state-dir", metavar="DIR",
                           help="the SQLite files of this state folder instead (fortis serve "
                           "--state-dir without --database-url)")
        if name == "upgrade":
            dp.add_argument("--revision", default="head", help="target revision (default head)")
            dp.set_defaults(fn=cmd_upgrade)
        else:
            dp.add_argument("--check", action="store_true",
                            help="exit 1 unless the database is at this Fortis's head")
            dp.set_defaults(fn=cmd_current)


def _engine(ns: argparse.Namespace) -> Any:
    """The engine of the URL given (InvalidArgument naming database_url otherwise)."""
    from fortis.infra.storage import sqldb
    from fortis.services.common.errors import InvalidArgument

    url = ns.database_url or os.environ.get("FORTIS_DATABASE_URL", "")
    if not url:
        raise InvalidArgument(sqldb.SETTING, "give --database-url URL or set "
                              "$FORTIS_DATABASE_URL")
    return sqldb.create_engine(url)


def _run(ns: argparse.Namespace, action: Any) -> int:
    """Run ``action(engine)``; expected failures are one line without the password."""
    import sqlalchemy as sa
    from fortis.infra.storage import sqldb
    from fortis.services.common.errors import FortisError

    try:
        engine = _engine(ns)
    except FortisError as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    try:
        return int(action(engine))
    except FortisError as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    except sa.exc.DBAPIError as exc:       # e.g. no right to create tables
        err(f"{sqldb.SETTING}: {ns.db_command} failed on {sqldb.shown(engine.url)}: "
            f"{sqldb.scrub(str(exc.orig), engine.url.password)}")
        return EXIT_FAILED
    finally:
        engine.dispose()


def _state_files(state_dir: str) -> list[tuple[Any, Any]]:
    """(path, schema) of every SQLite file a state folder may hold."""
    from pathlib import Path

    from fortis.infra.storage.blobs import INDEX_SCHEMA
    from fortis.services.evaluation.store import STORE_SCHEMA
    from fortis.services.proxy.ledger import LEDGER_SCHEMA

    root = Path(state_dir)
    return [(root / "evaluations.sqlite", STORE_SCHEMA), (root / "ledger.sqlite", LEDGER_SCHEMA),
            (root / "blobs" / "blobs.sqlite", INDEX_SCHEMA)]


def _state_upgrade(ns: argparse.Namespace) -> int:
    import sqlite3

    from fortis.infra.storage import sqlite_schema
    from fortis.services.common.errors import InvalidArgument

    if ns.revision != "head":
        err("revision: a state folder's SQLite files migrate to this Fortis's head only")
        return EXIT_BAD_INPUT
    try:
        for path, schema in _state_files(ns.state_dir):
            if not path.is_file():
                print(json.dumps({"file": str(path), "kind": schema.kind, "absent": True}))
                continue
            conn = sqlite3.connect(str(path), isolation_level=None)
            try:
                conn.execute(f"PRAGMA busy_timeout={sqlite_schema.BUSY_TIMEOUT_MS}")
                before, after = sqlite_schema.ensure(conn, path, schema)
            finally:
                conn.close()
            backup = sqlite_schema.backup_path(path, before)
            print(json.dumps({"file": str(path), "kind": schema.kind, "before": before,
                              "after": after, "head": schema.head,
                              **({"backup": str(backup)} if before != after else {})}))
    except InvalidArgument as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    return 0


def _state_current(ns: argparse.Namespace) -> int:
    from fortis.infra.storage import sqlite_schema

    every = True
    for path, schema in _state_files(ns.state_dir):
        if not path.is_file():
            print(json.dumps({"file": str(path), "kind": schema.kind, "absent": True}))
            continue
        info = sqlite_schema.inspect(path, schema)
        every = every and bool(info["at_head"])
        print(json.dumps(info))
    return EXIT_FAILED if ns.check and not every else 0


def cmd_upgrade(ns: argparse.Namespace) -> int:
    from fortis.infra.storage import sqldb

    if ns.state_dir:
        return _state_upgrade(ns)

    def act(engine: Any) -> int:
        from alembic.util import CommandError
        from fortis.services.common.errors import InvalidArgument
        try:
            before, after = sqldb.upgrade(engine, ns.revision)
        except CommandError as exc:       # an unknown revision
            raise InvalidArgument("revision", str(exc)[:300]) from None
        print(json.dumps({"database": sqldb.shown(engine.url), "before": before,
                          "after": after, "head": sqldb.head_revision()}))
        return 0
    return _run(ns, act)


def cmd_current(ns: argparse.Namespace) -> int:
    from fortis.infra.storage import sqldb

    if ns.state_dir:
        return _state_current(ns)

    def act(engine: Any) -> int:
        current, head = sqldb.current_revision(engine), sqldb.head_revision()
        print(json.dumps({"database": sqldb.shown(engine.url), "current": current,
                          "head": head, "at_head": current == head}))
        return EXIT_FAILED if ns.check and current != head else 0
    return _run(ns, act)
