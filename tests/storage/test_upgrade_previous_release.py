"""Upgrades keep data: state written by the previous release (Fortis 0.2.0, commit 8f43618)
opens with the current code with nothing lost, and the schema version of every embedded
SQLite file is checked when it is opened (``infra/storage/sqlite_schema.py``).

The fixtures in ``tests/fixtures/release-0.2.0`` were written by that release's own code
(its ``fortis serve``, ``fortis run``, ``fortis upload``: see that folder's README and
``make_fixtures.py``); ``expected-*.json`` is what that code read back from them
(``snapshot.py``: every evaluation with its report, items and artifacts, every ledger row and
recorded reply, every blob's bytes). Here the current code reads the same state after
migration and must find exactly the same. Real SQLite files and a real PostgreSQL server
(``tests/infra/postgres.py``); nothing is mocked.

Besides the released layout, the ledger and store layouts of development builds before
tenant-scoped keys (from git history: commit 55f2506's ledger, bbac79c^'s store) are
migrated with every row kept; a file newer than the code, a damaged file, a file of another
kind and a migration that fails half-way are refused or rolled back, never used half-way.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fortis.infra.storage import sqlite_schema
from fortis.infra.storage.blobs import INDEX_SCHEMA, BlobStore
from fortis.services.evaluation.store import STORE_SCHEMA, EvaluationStore
from fortis.services.proxy.ledger import LEDGER_SCHEMA, Ledger

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "release-0.2.0"
sys.path.insert(0, str(FIXTURES))
from snapshot import TENANTS, snapshot  # noqa: E402  (the fixtures' own reader)

FILES = (("evaluations.sqlite", STORE_SCHEMA), ("ledger.sqlite", LEDGER_SCHEMA),
         ("blobs/blobs.sqlite", INDEX_SCHEMA))
KEYS = {"team-a": "key-team-a", "team-b": "key-team-b"}


def expected(kind: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"expected-{kind}.json").read_text())


def previous_state(tmp_path: Path) -> Path:
    """A fresh copy of the state folder the previous release wrote."""
    with tarfile.open(FIXTURES / "state.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "state"


def header(path: Path) -> tuple[int, int]:
    conn = sqlite3.connect(path)
    try:
        return (conn.execute("PRAGMA user_version").fetchone()[0],
                conn.execute("PRAGMA application_id").fetchone()[0])
    finally:
        conn.close()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def dump(path: Path) -> list[str]:
    """The file's schema and rows as SQL (the backup API copies pages, not the header's
    counters, so copies are compared by content)."""
    conn = sqlite3.connect(path)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def fortis(*args: str, env: dict[str, str] | None = None,
           timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items()
            if k not in ("FORTIS_DATABASE_URL", "FORTIS_STATE", "FORTIS_API_KEY")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "fortis.server.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=full)


def open_sqlite(state: Path, *, migrate: bool = True) -> tuple[Any, Any, Any]:
    return (EvaluationStore(state / "evaluations.sqlite", migrate=migrate),
            Ledger(state / "ledger.sqlite", synchronous="NORMAL", migrate=migrate),
            BlobStore(state / "blobs", sweep=migrate))


def close_all(*parts: Any) -> None:
    for p in parts:
        p.close()


# -- the previous release's SQLite state folder -------------------------------------------------
def test_the_previous_releases_state_folder_opens_with_nothing_lost(tmp_path: Path) -> None:
    state = previous_state(tmp_path)
    for name, _ in FILES:
        assert header(state / name) == (0, 0)           # 0.2.0 recorded no version
    originals = {name: dump(state / name) for name, _ in FILES}
    parts = open_sqlite(state)                          # what `fortis serve` does at start
    try:
        got = snapshot(*parts)
    finally:
        close_all(*parts)
    assert got == expected("sqlite")
    # every kind of state is really there (the comparison is not of two empty snapshots)
    evals = got["evaluations"]
    assert evals["team-a"]["order"] == ["fixture-a-cancelled", "fixture-a-1"]
    assert evals["team-b"]["order"] == ["fixture-b-1"]
    assert evals["team-a"]["evaluations"]["fixture-a-1"]["state"] == "SUCCEEDED"
    assert evals["team-a"]["evaluations"]["fixture-a-cancelled"]["state"] == "CANCELLED"
    assert evals["team-a"]["evaluations"]["fixture-a-1"]["artifacts"]
    assert sum(s["rows"] for s in got["ledger"]["sessions"].values()) > 300
    assert any(s["replies"] for s in got["ledger"]["sessions"].values())
    assert len(got["blobs"]["team-b"]) == 8
    for name, schema in FILES:
        assert header(state / name) == (schema.head, schema.application_id)
        backup = sqlite_schema.backup_path(state / name, 0)
        assert dump(backup) == originals[name]          # the copy taken before migrating
        assert header(backup) == (0, 0)
    # opened again: already at head, nothing migrated, nothing copied again
    for name, _ in FILES:
        sqlite_schema.backup_path(state / name, 0).unlink()
    parts = open_sqlite(state, migrate=False)
    try:
        assert snapshot(*parts) == expected("sqlite")
    finally:
        close_all(*parts)
    assert not list(state.rglob("*.bak"))


def test_fortis_db_upgrade_migrates_a_state_folder_that_readers_refused(tmp_path: Path) -> None:
    state = previous_state(tmp_path)
    before = fortis("ledger", "--state-dir", str(state), "--session", "fixture-a-1/clean",
                    "--tenant", "team-a", "--json")
    assert before.returncode == 2, before.stderr
    assert f"fortis db upgrade --state-dir {state}" in before.stderr
    assert "Traceback" not in before.stderr
    assert header(state / "ledger.sqlite") == (0, 0)    # a reader changed nothing

    check = fortis("db", "current", "--state-dir", str(state), "--check")
    assert check.returncode == 1
    assert [json.loads(line)["version"] for line in check.stdout.splitlines()] == [0, 0, 0]

    up = fortis("db", "upgrade", "--state-dir", str(state))
    assert up.returncode == 0, up.stderr
    lines = [json.loads(line) for line in up.stdout.splitlines()]
    assert [(x["kind"], x["before"], x["after"]) for x in lines] == [
        ("evaluation store", 0, STORE_SCHEMA.head), ("proxy ledger", 0, LEDGER_SCHEMA.head),
        ("blob index", 0, INDEX_SCHEMA.head)]
    assert all(Path(x["backup"]).is_file() for x in lines)

    assert fortis("db", "current", "--state-dir", str(state), "--check").returncode == 0
    again = fortis("db", "upgrade", "--state-dir", str(state))
    assert [json.loads(line)["before"] for line in again.stdout.splitlines()] == [
        STORE_SCHEMA.head, LEDGER_SCHEMA.head, INDEX_SCHEMA.head]

    after = fortis("ledger", "--state-dir", str(state), "--session", "fixture-a-1/clean",
                   "--tenant", "team-a", "--json")
    assert after.returncode == 0, after.stderr
    want = expected("sqlite")["ledger"]["sessions"]["team-a/fixture-a-1/clean"]
    assert json.loads(after.stdout)["queries_ok"] == want["queries_ok"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def served_previous_state(tmp_path: Path) -> Iterator[str]:
    """The current ``fortis serve`` started on the previous release's state folder."""
    state = previous_state(tmp_path)
    address = f"127.0.0.1:{_free_port()}"
    env = {k: v for k, v in os.environ.items()
           if k not in ("FORTIS_DATABASE_URL", "FORTIS_STATE", "FORTIS_API_KEY")}
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fortis.server.cli", "serve", "--address", address, "--state-dir",
         str(state), "--metrics-port", "0", "--no-default-targets",
         *[a for t, k in KEYS.items() for a in ("--api-key", f"{k}={t}")]],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while fortis("health", "--address", address).returncode != 0:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "fortis serve did not start"
            time.sleep(0.5)
        yield address
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()


def test_the_current_server_serves_the_previous_releases_evaluations(
        served_previous_state: str) -> None:
    """Through the API, as each tenant: every evaluation listed and got, every report the
    same bytes, every blob listed, every session's ledger rows counted."""
    from fortis.client import FortisClient

    want = expected("sqlite")
    for tenant in TENANTS:
        with FortisClient(served_previous_state, api_key=KEYS[tenant]) as client:
            evals = want["evaluations"][tenant]
            assert [e.evaluation_id for e in client.list()] == evals["order"]
            for evaluation_id, e in evals["evaluations"].items():
                assert client.get(evaluation_id).state == e["state"]
                if e["state"] == "SUCCEEDED":
                    report_json, report_html = client.report_files(evaluation_id)
                    assert hashlib.sha256(report_json.encode()).hexdigest() == e["report_json"]
                    assert hashlib.sha256(report_html.encode()).hexdigest() == e["report_html"]
            assert {b.blob_id for b in client.list_blobs().items} == set(want["blobs"][tenant])
            for key, s in want["ledger"]["sessions"].items():
                owner, session_id = key.split("/", 1)
                if owner == tenant:
                    assert client.session_stats(session_id).queries_ok == s["queries_ok"]


# -- the previous release's PostgreSQL database -------------------------------------------------
def test_the_previous_releases_postgres_dump_upgrades_with_nothing_lost(
        postgres_server: Any, tmp_path: Path) -> None:
    from fortis.infra.storage.blobs_pg import PgBlobStore
    from fortis.services.evaluation.store_pg import PgEvaluationStore
    from fortis.services.proxy.ledger_pg import PgLedger

    name = postgres_server.create_database()
    try:
        url = postgres_server.url(name)
        import gzip
        dump = gzip.decompress((FIXTURES / "postgres.sql.gz").read_bytes())
        subprocess.run([str(postgres_server.bin / "psql"), "-q", "-v", "ON_ERROR_STOP=1",
                        "--dbname", url.replace("+psycopg", "")], input=dump, check=True,
                       capture_output=True, timeout=120)
        up = fortis("db", "upgrade", env={"FORTIS_DATABASE_URL": url})
        assert up.returncode == 0, up.stderr
        result = json.loads(up.stdout)
        assert result["before"] == "0003" and result["after"] == result["head"]
        assert fortis("db", "current", "--check",
                      env={"FORTIS_DATABASE_URL": url}).returncode == 0
        parts = (PgEvaluationStore(url), PgLedger(url, read_only=True),
                 PgBlobStore(url, cache_dir=tmp_path / "cache"))
        try:
            got = snapshot(*parts)
        finally:
            close_all(*parts)
        assert got == expected("postgres")
        assert got["evaluations"]["team-a"]["evaluations"]["fixture-a-1"]["artifacts"]
        assert sum(s["rows"] for s in got["ledger"]["sessions"].values()) > 150
        assert len(got["blobs"]["team-b"]) == 8
    finally:
        postgres_server.drop_database(name)


# -- layouts of development builds before tenant-scoped keys (git history) ----------------------
#: The ledger of commit 55f2506: sessions keyed by their id alone, no replies, no position.
LEDGER_55F2506 = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, target TEXT NOT NULL,
    query_budget INTEGER NOT NULL, per_image_budget INTEGER NOT NULL,
    description TEXT NOT NULL, created_at REAL NOT NULL,
    calls_refused INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS queries (
    entry_id INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL,
    session_id TEXT NOT NULL, target TEXT NOT NULL, origin TEXT NOT NULL,
    image_id TEXT NOT NULL, input_sha256 TEXT NOT NULL, output_summary TEXT NOT NULL,
    latency_ms REAL NOT NULL, status TEXT NOT NULL, error TEXT NOT NULL,
    sent_at REAL NOT NULL, call_id TEXT NOT NULL, attempts INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS queries_session ON queries(session_id, image_id);
"""
#: The evaluation store of commit bbac79c^: evaluations and items keyed without the tenant.
STORE_BEFORE_BBAC79C = """
CREATE TABLE IF NOT EXISTS evaluations (
    evaluation_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, state TEXT NOT NULL,
    plan_text TEXT NOT NULL, plan_name TEXT NOT NULL, created_at REAL NOT NULL,
    updated_at REAL NOT NULL, error_code TEXT NOT NULL DEFAULT '',
    error_message TEXT NOT NULL DEFAULT '', resumed_count INTEGER NOT NULL DEFAULT 0,
    stage TEXT NOT NULL DEFAULT 'plan', items_done INTEGER NOT NULL DEFAULT 0,
    items_total INTEGER NOT NULL DEFAULT 0, queries INTEGER NOT NULL DEFAULT 0,
    message TEXT NOT NULL DEFAULT '', summary_json TEXT NOT NULL DEFAULT '',
    images_done INTEGER NOT NULL DEFAULT 0, images_total INTEGER NOT NULL DEFAULT 0,
    error_status BLOB, report_json TEXT NOT NULL DEFAULT '',
    report_html TEXT NOT NULL DEFAULT '', started_at REAL NOT NULL DEFAULT 0,
    finished_at REAL NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS items (
    evaluation_id TEXT NOT NULL, item_key TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, done INTEGER NOT NULL DEFAULT 0, result BLOB,
    PRIMARY KEY (evaluation_id, item_key));
"""


def _old_ledger(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(LEDGER_55F2506)
    conn.executemany("INSERT INTO sessions VALUES (?,?,?,?,?,?,?,?)", [
        ("s1", "team-a", "clf", 100, 10, "first", 1.0, 2),
        ("s2", "team-b", "clf", 50, 5, "second", 2.0, 0)])
    conn.executemany(
        "INSERT INTO queries (tenant, session_id, target, origin, image_id, input_sha256,"
        " output_summary, latency_ms, status, error, sent_at, call_id, attempts)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        [("team-a", "s1", "clf", "attack", f"img{i % 3}", f"{i:064x}", "top1=3", 1.5,
          "OK" if i % 4 else "UNAVAILABLE", "", 1000.0 + i, f"c{i // 2}", 1)
         for i in range(10)]
        + [("team-b", "s2", "clf", "clean", "imgX", "f" * 64, "top1=1", 2.0, "OK", "", 5.0,
            "cb", 1)])
    conn.commit()
    conn.close()


def test_a_ledger_from_before_tenant_scoped_keys_is_migrated_with_every_row(
        tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    _old_ledger(path)
    conn = sqlite3.connect(path)
    rows_before = conn.execute("SELECT * FROM queries ORDER BY entry_id").fetchall()
    conn.close()
    led = Ledger(path)
    try:
        s1 = led.get_session("s1", "team-a")
        assert s1 is not None and (s1.query_budget, s1.calls_refused) == (100, 2)
        assert led.get_session("s1", "team-b") is None          # now in its tenant's namespace
        assert led.get_session("s2", "team-b") is not None
        entries = led.entries("s1", tenant="team-a")
        assert [tuple(e) for e in entries] == [r[:14] for r in rows_before[:10]]
        stats = led.stats("s1", "team-a")
        assert (stats.queries_ok, stats.queries_failed, stats.calls_refused) == (7, 3, 2)
        assert led.attempt_counts("s2", "team-b") == {"imgX": 1}
        # the same session id in another tenant is now possible, and rows stay idempotent
        from fortis.services.proxy.ledger import QueryRow, SessionRecord
        led.insert_session(SessionRecord(session_id="s1", tenant="team-b", target="clf",
                                         query_budget=1, per_image_budget=1, description="",
                                         created_at=3.0))
        row = QueryRow(tenant="team-a", session_id="s1", target="clf", origin="attack",
                       image_id="img0", input_sha256="0" * 64, output_summary="",
                       latency_ms=0.0, status="OK", error="", sent_at=9.0, call_id="c0",
                       attempts=1)
        first = led.reserve([row])
        assert led.reserve([row]) == first and first[0] > 11
    finally:
        led.close()
    assert header(path) == (LEDGER_SCHEMA.head, sqlite_schema.LEDGER_ID)
    assert sqlite_schema.backup_path(path, 0).is_file()


def test_a_store_from_before_tenant_namespaces_is_migrated_with_every_row(
        tmp_path: Path) -> None:
    path = tmp_path / "evaluations.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(STORE_BEFORE_BBAC79C)
    conn.execute("INSERT INTO evaluations (evaluation_id, tenant, state, plan_text, plan_name,"
                 " created_at, updated_at, report_json) VALUES"
                 " ('e1','team-a','SUCCEEDED','name: p','p',1.0,2.0,'{\"ok\": 1}'),"
                 " ('e2','team-b','RUNNING','name: q','q',3.0,3.0,'')")
    conn.execute("INSERT INTO items VALUES ('e1','clean/0',1,1,x'0102'),"
                 " ('e2','clean/0',2,0,NULL), ('gone','clean/0',1,1,x'03')")
    conn.commit()
    conn.close()
    store = EvaluationStore(path)
    try:
        a, b = store.for_tenant("team-a"), store.for_tenant("team-b")
        e1 = a.get("e1")
        assert e1 is not None and e1.state == "SUCCEEDED"
        assert a.report("e1") == ('{"ok": 1}', "")
        assert a.item("e1", "clean/0") == (True, 1, b"\x01\x02")
        assert b.get("e1") is None                              # not another tenant's
        assert [r.evaluation_id for r in store.active()] == ["e2"]
        assert b.item("e2", "clean/0") == (False, 2, None)
        assert b.claim_items("e2", "w", limit=5, lease_s=60) == ["clean/0"]
        conn = sqlite3.connect(path)
        # an item whose evaluation is gone is kept (in no tenant's namespace), not dropped
        assert conn.execute("SELECT tenant FROM items WHERE evaluation_id='gone'"
                            ).fetchall() == [("",)]
        conn.close()
    finally:
        store.close()
    assert header(path) == (STORE_SCHEMA.head, sqlite_schema.EVALUATION_STORE_ID)


# -- refusals: never opened half-way ------------------------------------------------------------
def test_a_file_newer_than_this_fortis_is_refused_naming_both_versions(tmp_path: Path) -> None:
    state = previous_state(tmp_path)
    close_all(*open_sqlite(state))
    for name, schema in FILES:
        path = state / name
        conn = sqlite3.connect(path)
        conn.execute(f"PRAGMA user_version={schema.head + 1}")
        conn.close()
        before = digest(path)
        with pytest.raises(sqlite_schema.SchemaError) as info:
            sqlite_schema.open_db(path, schema).close()
        msg = str(info.value)
        assert msg.startswith("state_dir: ")
        assert f"schema version {schema.head + 1}, newer than this Fortis knows (version " \
               f"{schema.head})" in msg and str(path) in msg
        assert digest(path) == before
    up = fortis("db", "upgrade", "--state-dir", str(state))
    assert up.returncode == 2 and "newer than this Fortis" in up.stderr
    assert "Traceback" not in up.stderr


def test_the_services_refuse_a_newer_file_at_start(tmp_path: Path) -> None:
    state = previous_state(tmp_path)
    close_all(*open_sqlite(state))
    conn = sqlite3.connect(state / "ledger.sqlite")
    conn.execute(f"PRAGMA user_version={LEDGER_SCHEMA.head + 5}")
    conn.close()
    with pytest.raises(sqlite_schema.SchemaError, match="newer than this Fortis"):
        Ledger(state / "ledger.sqlite")
    proc = fortis("serve", "--address", f"127.0.0.1:{_free_port()}", "--state-dir",
                  str(state), "--no-auth", "--no-default-targets", "--metrics-port", "0",
                  timeout=180)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "newer than this Fortis" in out and "ledger.sqlite" in out, out[-2000:]


def test_damaged_files_are_refused_and_left_as_they_are(tmp_path: Path) -> None:
    # not a database at all
    junk = tmp_path / "junk" / "evaluations.sqlite"
    junk.parent.mkdir()
    junk.write_bytes(b"this is no SQLite file, " * 200)
    with pytest.raises(sqlite_schema.SchemaError, match="cannot be read as a SQLite database"):
        EvaluationStore(junk)
    assert junk.read_bytes() == b"this is no SQLite file, " * 200

    # claims the head version but lacks part of it
    state = previous_state(tmp_path)
    close_all(*open_sqlite(state))
    conn = sqlite3.connect(state / "ledger.sqlite")
    conn.execute("DROP INDEX queries_attempt_key")
    conn.close()
    before = digest(state / "ledger.sqlite")
    with pytest.raises(sqlite_schema.SchemaError) as info:
        Ledger(state / "ledger.sqlite")
    assert "index queries_attempt_key is missing" in str(info.value)
    assert "damaged or was changed by hand" in str(info.value)
    assert digest(state / "ledger.sqlite") == before
    current = fortis("db", "current", "--state-dir", str(state), "--check")
    assert current.returncode == 1 and "queries_attempt_key" in current.stdout

    # an unversioned file of a layout no release wrote (a column it does not know)
    odd = tmp_path / "odd.sqlite"
    conn = sqlite3.connect(odd)
    conn.executescript(STORE_BEFORE_BBAC79C.replace("result BLOB", "result_json TEXT"))
    conn.execute("INSERT INTO items VALUES ('e', 'k', 1, 1, '{}')")
    conn.commit()
    conn.close()
    before = digest(odd)
    with pytest.raises(sqlite_schema.SchemaError, match="column items.result_json"):
        EvaluationStore(odd)
    assert digest(odd) == before and header(odd) == (0, 0)


def test_a_file_of_another_kind_is_refused(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "ledger.sqlite")
    led.close()
    with pytest.raises(sqlite_schema.SchemaError, match="is a proxy ledger, not the "
                                                         "evaluation store"):
        EvaluationStore(tmp_path / "ledger.sqlite")


def test_a_migration_that_fails_half_way_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    """A step that fails after changing the file (here: after adding an index and a table):
    the whole migration is rolled back; the file keeps its version, layout and rows."""
    state = previous_state(tmp_path)
    path = state / "evaluations.sqlite"
    before = dump(path)

    def breaks(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half (x)")
        conn.execute("SELECT no_such_column FROM evaluations")

    failing = sqlite_schema.Schema(
        kind=STORE_SCHEMA.kind, application_id=STORE_SCHEMA.application_id,
        baseline=STORE_SCHEMA.baseline, derived=STORE_SCHEMA.derived,
        steps=(*STORE_SCHEMA.steps, sqlite_schema.Step(STORE_SCHEMA.head + 1, "fails", breaks)))
    with pytest.raises(sqlite_schema.SchemaError):
        sqlite_schema.open_db(path, failing).close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
        assert "half" not in sqlite_schema.tables(conn)
        assert "evaluations_state" not in sqlite_schema.indexes(conn)
    finally:
        conn.close()
    parts = open_sqlite(state)          # the real schema still migrates it, nothing lost
    try:
        assert snapshot(*parts)["evaluations"] == expected("sqlite")["evaluations"]
    finally:
        close_all(*parts)
    assert dump(sqlite_schema.backup_path(path, 0)) == before


def _open_in_child(path: str, out: Any) -> None:
    try:
        store = EvaluationStore(path)
        out.put(len(store.list("team-a", limit=100)))
        store.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put(repr(exc))


def test_two_processes_opening_an_old_file_at_once_migrate_it_once(tmp_path: Path) -> None:
    state = previous_state(tmp_path)
    path = state / "evaluations.sqlite"
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_open_in_child, args=(str(path), out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert results == [2, 2]
    assert header(path) == (STORE_SCHEMA.head, sqlite_schema.EVALUATION_STORE_ID)
    assert [p.name for p in state.glob("*.bak")] == ["evaluations.sqlite.v0.bak"]
    shutil.rmtree(state)


def test_a_file_at_an_older_version_runs_only_the_steps_after_it(tmp_path: Path) -> None:
    """Version 1 (0.2.0's layout, recorded) to the head: the numbered steps alone run."""
    state = previous_state(tmp_path)
    close_all(*open_sqlite(state))
    path = state / "ledger.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("DROP INDEX queries_sent_at")          # what step 2 adds
    conn.execute("PRAGMA user_version=1")
    conn.close()
    with pytest.raises(sqlite_schema.SchemaError, match=f"is at schema version 1; this Fortis "
                       f"needs version {LEDGER_SCHEMA.head}: run `fortis db upgrade "
                       f"--state-dir {state}`"):
        Ledger(path, migrate=False)
    assert header(path)[0] == 1
    led = Ledger(path)
    try:
        assert led.last_entry_id() == expected("sqlite")["ledger"]["last_entry_id"]
    finally:
        led.close()
    conn = sqlite3.connect(path)
    try:
        assert "queries_sent_at" in sqlite_schema.indexes(conn)
        assert conn.execute("PRAGMA user_version").fetchone()[0] == LEDGER_SCHEMA.head
    finally:
        conn.close()
    assert sqlite_schema.backup_path(path, 1).is_file()
