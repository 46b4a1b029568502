"""PostgreSQL plumbing shared by the evaluation store and the proxy ledger (pluggable
state, PostgreSQL at scale): URL checks with the password redacted, the engine
(SQLAlchemy 2 Core + psycopg 3), the Alembic migrations shipped in
``infra/storage/migrations`` run programmatically (no alembic.ini), and the mapping of a
lost database to ``Unavailable``.

The embedded default stays SQLite (``services/evaluation/store.py``,
``services/proxy/ledger.py``): nothing here is imported unless a ``database_url`` is
given, and SQLAlchemy/psycopg/Alembic are imported lazily inside the functions.

Errors name the setting (``database_url``) and never repeat a password: every message that
shows the URL shows :func:`redact_url`'s form (``postgresql+psycopg://user:***@host/db``), and a
driver's message is scrubbed of the password before it is shown. Pure code: no gRPC, no
service imports (``tests/contract/test_boundaries.py``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fortis.services.common import errors

#: Where the Alembic environment and its ``versions/`` live (shipped inside the package).
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
#: The setting every start error names (``StackSettings.database_url``, ``--database-url``).
SETTING = "database_url"
#: What an operator runs to bring a database's schema to this Fortis's head.
UPGRADE_COMMAND = "fortis db upgrade --database-url URL"
_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")
_EXPECTED = ("expected postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE (PostgreSQL through "
             "psycopg 3; leave it unset for SQLite files in the state folder)")
_USERINFO = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (also for text that is no valid URL)."""
    return _USERINFO.sub(r"\1***@", url)


def scrub(text: str, password: str | None) -> str:
    """A driver's message with the password (if it appears) removed, one line, bounded."""
    if password:
        text = text.replace(password, "***")
    return redact_url(" ".join(text.split()))[:300]


def parse_url(url: str, setting: str = SETTING) -> Any:
    """The ``sqlalchemy.URL`` of a PostgreSQL ``url`` with the psycopg 3 driver
    (``postgresql://`` and ``postgres://`` are accepted as the same); InvalidArgument naming
    ``setting`` for anything else, without the password."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if not url or not url.strip():
        raise errors.InvalidArgument(setting, f"empty; {_EXPECTED}")
    try:
        u = make_url(url.strip())
    except (ArgumentError, ValueError):
        raise errors.InvalidArgument(setting, f"'{redact_url(url)[:200]}' is not a database "
                                     f"URL; {_EXPECTED}") from None
    if u.drivername not in _SCHEMES:
        raise errors.InvalidArgument(setting, f"unsupported scheme '{u.drivername[:40]}' in "
                                     f"'{redact_url(url)[:200]}'; {_EXPECTED}")
    if not u.database:
        raise errors.InvalidArgument(setting, f"'{redact_url(url)[:200]}' names no database; "
                                     f"{_EXPECTED}")
    try:
        port = u.port
    except ValueError:
        port = -1
    if port is not None and not 0 < port < 65536:
        raise errors.InvalidArgument(setting, f"bad port in '{redact_url(url)[:200]}' "
                                     "(1-65535)")
    return u.set(drivername="postgresql+psycopg")


def shown(url: Any) -> str:
    """The URL as every message shows it: password hidden."""
    return str(url.render_as_string(hide_password=True))


def create_engine(url: str, *, setting: str = SETTING, pool_size: int = 8,
                  connect_timeout_s: int = 5) -> Any:
    """An engine for ``url`` (validated by :func:`parse_url`) whose first connection is
    checked now: InvalidArgument naming ``setting`` when the server cannot be reached or
    refuses the login, with the reason and the redacted URL."""
    import sqlalchemy as sa

    u = parse_url(url, setting)
    engine = sa.create_engine(u, pool_pre_ping=True, pool_size=pool_size, max_overflow=pool_size,
                              connect_args={"connect_timeout": connect_timeout_s,
                                            "application_name": "fortis"})
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.DBAPIError as exc:
        engine.dispose()
        raise errors.InvalidArgument(setting, f"cannot connect to {shown(u)}: "
                                     f"{scrub(str(exc.orig), u.password)}") from None
    return engine


@contextlib.contextmanager
def unavailable_on_loss(what: str) -> Iterator[None]:
    """Map a database that stopped answering (connection refused, lost, timed out) to
    ``Unavailable`` naming ``what``; anything else passes through."""
    import sqlalchemy as sa

    try:
        yield
    except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
        raise errors.Unavailable(f"{what} unavailable: the database cannot be reached "
                                 f"({type(exc.orig).__name__})") from None
    except sa.exc.DBAPIError as exc:
        if exc.connection_invalidated:
            raise errors.Unavailable(f"{what} unavailable: the database connection was "
                                     "lost") from None
        raise


# -- migrations ------------------------------------------------------------------------------
def _alembic_config(conn: Any) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = conn
    return cfg


def head_revision() -> str:
    """The newest revision this Fortis ships."""
    from alembic.script import ScriptDirectory

    cfg = _alembic_config(None)
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    return str(head)


def current_revision(engine: Any) -> str | None:
    """The revision the database is at (None: no Fortis schema yet)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()  # type: ignore[no-any-return]


#: Advisory lock key under which migrations run (two ``fortis db upgrade`` at once, e.g. two
#: releases' hook Jobs, run one after the other).
_MIGRATION_LOCK = 0x46525444


def upgrade(engine: Any, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate the database to ``revision`` in one transaction (PostgreSQL's DDL is
    transactional: all or nothing); returns (revision before, revision after)."""
    import sqlalchemy as sa
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    with engine.begin() as conn:
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
        # read under the lock: a concurrent upgrade that got it first is seen as done
        before = MigrationContext.configure(conn).get_current_revision()
        command.upgrade(_alembic_config(conn), revision)
    return before, current_revision(engine)


def require_head(engine: Any, *, setting: str = SETTING) -> None:
    """Refuse a database whose schema is not this Fortis's head (never migrated, older, or
    newer), naming the command that fixes it."""
    current, head = current_revision(engine), head_revision()
    if current == head:
        return
    url = shown(engine.url)
    if current is None:
        what = "has no Fortis schema"
    else:
        what = f"is at schema revision {current}, this Fortis needs {head}"
    raise errors.InvalidArgument(setting, f"the database {url} {what}: run `{UPGRADE_COMMAND}` "
                                 "(the Helm chart's migration hook Job runs it)")
