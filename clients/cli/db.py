"""``fortis db upgrade`` and ``fortis db current`` (issue 10, "Pluggable state, PostgreSQL at
scale"): the schema of a PostgreSQL database shared by Fortis services, managed by the Alembic
migrations shipped in the package (``services/common/migrations``).

``upgrade`` brings the database to this Fortis's head (one transaction, under an advisory
lock: two at once run one after the other; the Helm chart runs it as a pre-install /
pre-upgrade hook Job); ``current`` prints the revision the database is at (``--check``: exit 1
unless it is at head). The URL comes from ``--database-url`` or ``$FORTIS_DATABASE_URL``
(which keeps the password out of the process list). Exit 2 with one line naming
``database_url`` on a bad URL or an unreachable server; the password is never printed.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from fortis.cli.output import EXIT_BAD_INPUT, EXIT_FAILED, err


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    sp = sub.add_parser("db", help="the PostgreSQL schema of a shared Fortis state "
                        "(fortis serve --database-url)")
    dsub = sp.add_subparsers(dest="db_command", required=True)
    for name, help_text in (("upgrade", "migrate the database to this Fortis's schema head"),
                            ("current", "the database's schema revision and this Fortis's")):
        dp = dsub.add_parser(name, help=help_text)
        dp.add_argument("--database-url", metavar="URL",
                        help="postgresql://USER:PASSWORD@HOST:PORT/DB (default: "
                        "$FORTIS_DATABASE_URL, which keeps the password out of `ps`)")
        if name == "upgrade":
            dp.add_argument("--revision", default="head", help="target revision (default head)")
            dp.set_defaults(fn=cmd_upgrade)
        else:
            dp.add_argument("--check", action="store_true",
                            help="exit 1 unless the database is at this Fortis's head")
            dp.set_defaults(fn=cmd_current)


def _engine(ns: argparse.Namespace) -> Any:
    """The engine of the URL given (InvalidArgument naming database_url otherwise)."""
    from fortis.services.common import sqldb
    from fortis.services.common.errors import InvalidArgument

    url = ns.database_url or os.environ.get("FORTIS_DATABASE_URL", "")
    if not url:
        raise InvalidArgument(sqldb.SETTING, "give --database-url URL or set "
                              "$FORTIS_DATABASE_URL")
    return sqldb.create_engine(url)


def _run(ns: argparse.Namespace, action: Any) -> int:
    """Run ``action(engine)``; expected failures are one line without the password."""
    import sqlalchemy as sa
    from fortis.services.common import sqldb
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


def cmd_upgrade(ns: argparse.Namespace) -> int:
    from fortis.services.common import sqldb

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
    from fortis.services.common import sqldb

    def act(engine: Any) -> int:
        current, head = sqldb.current_revision(engine), sqldb.head_revision()
        print(json.dumps({"database": sqldb.shown(engine.url), "current": current,
                          "head": head, "at_head": current == head}))
        return EXIT_FAILED if ns.check and current != head else 0
    return _run(ns, act)
