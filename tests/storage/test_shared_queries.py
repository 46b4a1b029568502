"""The statements both twins share (``store_sql``, ``ledger_sql``), where they are cut into
statements of bounded size or check what they are given: the same assertions on SQLite and on
a real PostgreSQL (``tests/storage/conftest.py``).

Lists longer than one statement's share (``sql_dialects.IN_CHUNK`` keys, the ledger's rows
per INSERT) must add up across statements exactly as one statement would; a column name that
is not the evaluation row's is refused before it reaches any SQL text.
"""

from __future__ import annotations

from typing import Any

import pytest
from fortis.infra.storage.sql_dialects import IN_CHUNK

from tests.storage.conftest import Backend
from tests.storage.test_evaluation_store import open_store
from tests.storage.test_ledger import open_ledger, rows


@pytest.fixture()
def store(backend: Backend) -> Any:
    s = open_store(backend)
    yield s
    s.close()


@pytest.fixture()
def ledger(backend: Backend) -> Any:
    led = open_ledger(backend)
    yield led
    led.close()


def test_items_beyond_one_statement_are_added_claimed_and_released_once(store: Any) -> None:
    a = store.for_tenant("a")
    a.insert(evaluation_id="ev", tenant="a", plan_text="p", plan_name="p")
    keys = [f"k{i:05d}" for i in range(2 * IN_CHUNK + 3)]
    assert a.add_items("ev", keys) == len(keys)
    assert a.add_items("ev", keys) == 0                   # every chunk: known items kept
    held = a.claim_items("ev", "w1", limit=IN_CHUNK + 7, lease_s=60.0)
    assert held == keys[:IN_CHUNK + 7]
    assert a.release_items("ev", "w1", held) == len(held)
    assert a.leases("ev") == {}
    assert a.claim_items("ev", "w2", limit=len(keys), lease_s=60.0) == keys


def test_an_update_of_an_unknown_column_is_refused_and_writes_nothing(store: Any) -> None:
    a = store.for_tenant("a")
    a.insert(evaluation_id="ev", tenant="a", plan_text="p", plan_name="p")
    before = a.get("ev")
    with pytest.raises(ValueError, match="no such evaluation column: state; DROP"):
        a.update("ev", message="x", **{"state; DROP": "y"})
    with pytest.raises(ValueError, match="tenant"):
        a.update_running("ev", tenant="b")
    assert a.get("ev") == before


def test_a_reservation_beyond_one_insert_keeps_its_order_and_is_idempotent(ledger: Any
                                                                           ) -> None:
    many = rows(2345)
    ids = ledger.reserve(many)
    assert len(ids) == len(many) and ids == sorted(ids) and len(set(ids)) == len(ids)
    assert ledger.reserve(many) == ids                   # written before: the same ids
    entries = ledger.entries("s", tenant="a", limit=len(many))
    assert [e[0] for e in entries] == ids
    assert [e[5] for e in entries] == [r.image_id for r in many]


def test_an_sqlite_library_too_old_for_the_shared_sql_is_named_at_open(tmp_path, monkeypatch) -> None:
    """The shared query text needs SQLite 3.35 (``RETURNING``); an older library (Debian 11,
    RHEL 9) is refused when a state file is opened, naming both versions and the ways out,
    not as a syntax error at the first write. The library version is the machine's, so it is
    simulated here by the module attribute the check reads."""
    import sqlite3

    from fortis.client.errors import FailedPrecondition
    from fortis.infra.storage import sqlite_schema
    from fortis.services.evaluation.store import EvaluationStore
    from fortis.services.proxy.ledger import Ledger

    sqlite_schema.check_sqlite_version()                 # this machine's library is new enough
    sqlite_schema.check_sqlite_version((3, 35, 0))
    with pytest.raises(FailedPrecondition, match=r"3\.34\.1.*3\.35\.0.*--database-url"):
        sqlite_schema.check_sqlite_version((3, 34, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 31, 1))
    for opener, name in ((EvaluationStore, "evaluations.sqlite"), (Ledger, "ledger.sqlite")):
        with pytest.raises(FailedPrecondition, match=r"3\.31\.1"):
            opener(tmp_path / "state" / name)
    assert not (tmp_path / "state").exists()
