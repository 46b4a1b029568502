"""Storage back ends for the parametrised tests: every test that takes ``backend`` runs once on
SQLite files (the embedded default) and once on a real PostgreSQL (``tests/infra/postgres.py``:
a fresh database per test, migrated to head by ``fortis db upgrade``'s code path), with the same
assertions."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Backend:
    """Where a test's state lives: ``kind`` is "sqlite" (files under ``dir``) or
    "postgres" (``url``, already at the schema head)."""

    kind: str
    dir: Path
    url: str = ""


def migrate(url: str) -> None:
    from fortis.infra.storage import sqldb

    engine = sqldb.create_engine(url)
    try:
        sqldb.upgrade(engine)
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        yield Backend("sqlite", tmp_path)
        return
    url = request.getfixturevalue("postgres_url")
    migrate(url)
    yield Backend("postgres", tmp_path, url)
