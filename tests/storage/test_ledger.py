"""The proxy ledger on SQLite and on PostgreSQL, the same assertions (idempotent ledger writes,
group commit across concurrent calls, write-ahead rows, "not sent" rows are no queries, tenant
scoping, crash marking; SPEC IEEE-M6: answered queries are counted from the ledger; CAN-9: a
resumed attempt is answered from recorded replies).

Real back ends only: SQLite files in the test's temp dir and a real PostgreSQL server
(``tests/infra/postgres.py``, a fresh database per test migrated to head). A "dead proxy" is
a real process killed with SIGKILL while its rows are in flight.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fortis.services.common import errors
from fortis.services.proxy import ledger as ledger_mod
from fortis.services.proxy.ledger import (
    IN_FLIGHT,
    IN_FLIGHT_NOTE,
    NOT_SENT_PREFIX,
    Ledger,
    LedgerStorage,
    Outcome,
    QueryRow,
    SessionRecord,
)

from tests.storage.conftest import Backend, migrate

REPO = Path(__file__).resolve().parents[2]


def open_ledger(backend: Backend) -> Any:
    if backend.kind == "sqlite":
        return Ledger(backend.dir / "ledger.sqlite")
    from fortis.services.proxy.ledger_pg import PgLedger
    return PgLedger(backend.url)


@pytest.fixture()
def ledger(backend: Backend) -> Any:
    led = open_ledger(backend)
    yield led
    led.close()


def rows(n: int, *, call_id: str = "c1", attempts: int = 1, tenant: str = "a",
         session: str = "s", image: str = "img", sent_at: float = 1000.0) -> list[QueryRow]:
    return [QueryRow(tenant=tenant, session_id=session, target="t", origin="o",
                     image_id=f"{image}{i}", input_sha256=f"{i:064x}", output_summary="",
                     latency_ms=0.0, status=IN_FLIGHT, error=IN_FLIGHT_NOTE, sent_at=sent_at,
                     call_id=call_id, attempts=attempts) for i in range(n)]


def session(tenant: str = "a", sid: str = "s", target: str = "t") -> SessionRecord:
    return SessionRecord(session_id=sid, tenant=tenant, target=target, query_budget=0,
                         per_image_budget=0, description="", created_at=1.0)


def test_both_back_ends_implement_the_protocol(ledger: Any) -> None:
    wanted = [n for n in dir(LedgerStorage) if not n.startswith("_")]
    assert "reserve" in wanted and "mark_interrupted" in wanted
    assert [n for n in wanted if not hasattr(ledger, n)] == []


def test_a_reservation_written_twice_is_one_row(ledger: Any) -> None:
    first = ledger.reserve(rows(3))
    assert len(set(first)) == 3
    assert ledger.reserve(rows(3)) == first            # same (tenant, call, attempt, position)
    ledger.complete([(first[0], Outcome(status="OK", latency_ms=2.0))])
    assert ledger.reserve(rows(3)) == first            # and it does not undo the outcome
    assert ledger.entries("s", tenant="a")[0][9] == "OK"
    retry = ledger.reserve(rows(3, attempts=2))         # a retry is new rows
    other = ledger.reserve(rows(3, tenant="b"))         # so is another tenant's call
    assert len({*first, *retry, *other}) == 9
    assert len(ledger.entries("s", tenant="a")) == 6
    assert ledger.attempt_counts("s", "a") == {"img0": 2, "img1": 2, "img2": 2}


def test_concurrent_writers_share_transactions(ledger: Any) -> None:
    threads, calls, per_call = 8, 40, 2
    ids: dict[int, list[int]] = {}
    failures: list[BaseException] = []
    start = threading.Barrier(threads)

    def work(k: int) -> None:
        try:
            start.wait()
            got = []
            for c in range(calls):
                eids = ledger.reserve(rows(per_call, call_id=f"t{k}-c{c}", image=f"t{k}-"))
                ledger.complete([(e, Outcome(status="OK", latency_ms=1.0)) for e in eids])
                got += eids
            ids[k] = got
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            failures.append(exc)

    before = ledger.commits
    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert failures == []
    writes = threads * calls * 2                        # each call: a reserve and a complete
    commits = ledger.commits - before
    assert 0 < commits < writes, (commits, writes)      # group commit: several per transaction
    every = [e for k in ids for e in ids[k]]
    assert len(every) == len(set(every)) == threads * calls * per_call
    st = ledger.stats("s", "a")
    assert (st.queries_ok, st.in_flight, st.attempts) == (len(every), 0, len(every))
    assert len(ledger.entries("s", tenant="a", limit=10_000)) == len(every)


def test_rows_not_sent_are_in_no_count(ledger: Any) -> None:
    ledger.insert_session(session())
    a = ledger.reserve(rows(4, call_id="c1", sent_at=1000.0))
    ledger.complete([(a[0], Outcome(status="OK", latency_ms=5.0, sent_at=1001.0)),
                     (a[1], Outcome(status="OK", latency_ms=5.0, sent_at=1001.0)),
                     (a[2], Outcome(status="UNAVAILABLE", error="down", sent_at=1001.0)),
                     (a[3], Outcome(status="DEADLINE_EXCEEDED",
                                    error=NOT_SENT_PREFIX + "deadline"))])
    b = ledger.reserve(rows(2, call_id="c2", image="late", sent_at=2000.0))  # in flight
    ledger.complete([(b[1], Outcome(status="CANCELLED", error=NOT_SENT_PREFIX + "cancelled"))])
    ledger.add_refused("s", 2, tenant="a")
    st = ledger.stats("s", "a")
    # sent: img0, img1 (OK), img2 (failed), late0 (in flight); img3 and late1 never went
    assert (st.queries_ok, st.queries_failed, st.in_flight, st.attempts) == (2, 1, 1, 4)
    assert st.per_image == {"img0": (1, 0), "img1": (1, 0), "img2": (0, 1), "late0": (0, 0)}
    assert st.calls_refused == 2 and st.latency_p50_ms == 5.0
    assert ledger.attempt_counts("s", "a") == {"img0": 1, "img1": 1, "img2": 1, "late0": 1}
    assert ledger.ok_counts("s", "a") == {"img0": 1, "img1": 1}
    assert ledger.attempts_since(1001.0) == {"a": 4}   # img3's send time is 1000: not sent
    assert ledger.attempts_since(1500.0) == {"a": 1}
    # every reserved row has a send time (a row not sent keeps its reservation's)
    assert ledger.send_times("t") == [1000.0, 1001.0, 1001.0, 1001.0, 2000.0, 2000.0]


def test_tenants_see_only_their_own_sessions_and_rows(ledger: Any) -> None:
    ledger.insert_session(session("a", "ev_1/x", target="t-a"))
    ledger.insert_session(session("b", "ev_1/x", target="t-b"))
    ledger.insert_session(session("a", "ev%1/y"))
    ledger.reserve(rows(2, tenant="a", session="ev_1/x"))
    ledger.reserve(rows(3, tenant="b", session="ev_1/x"))
    assert ledger.get_session("ev_1/x", "a").target == "t-a"
    assert ledger.get_session("ev_1/x", "b").target == "t-b"
    assert ledger.get_session("ev_1/x", "c") is None
    assert ledger.get_session("ev_1/x").tenant == "a"          # the operator's view
    assert ledger.sessions_with_prefix("ev_1/", "a") == ["ev_1/x"]     # '_' is no wildcard
    assert ledger.sessions_with_prefix("ev%", "a") == ["ev%1/y"]       # nor '%'
    assert ledger.sessions_with_prefix("ev", "b") == ["ev_1/x"]
    assert sum(ledger.attempt_counts("ev_1/x", "a").values()) == 2
    assert sum(ledger.attempt_counts("ev_1/x", "b").values()) == 3
    assert sum(ledger.attempt_counts("ev_1/x").values()) == 5
    assert {e[1] for e in ledger.entries("ev_1/x", tenant="b")} == {"b"}
    ledger.add_refused("ev_1/x", tenant="b")
    assert (ledger.stats("ev_1/x", "a").calls_refused,
            ledger.stats("ev_1/x", "b").calls_refused) == (0, 1)


def test_recorded_replies_round_trip(ledger: Any) -> None:
    ids = ledger.reserve(rows(3, tenant="a"))
    ledger.complete([(e, Outcome(status="OK")) for e in ids],
                    replies=[(ids[0], b"\x00pred-0"), (ids[1], b"\xffpred-1")])
    ledger.complete([(ids[1], Outcome(status="OK"))], replies=[(ids[1], b"pred-1 again")])
    got = ledger.replayable("s", "a", up_to=ledger.last_entry_id())
    assert got == {"img0": [(f"{0:064x}", ids[0])], "img1": [(f"{1:064x}", ids[1])]}
    assert ledger.reply(ids[0]) == b"\x00pred-0"
    assert ledger.reply(ids[1]) == b"pred-1 again"
    assert ledger.reply(ids[2]) is None
    lo = min(ids[:2])                                   # up_to: only the rows up to it
    assert ledger.replayable("s", "a", up_to=lo) == {
        f"img{ids.index(lo)}": [(f"{ids.index(lo):064x}", lo)]}
    assert ledger.replayable("s", "b", up_to=ledger.last_entry_id()) == {}


def test_a_closed_ledger_is_unavailable(backend: Backend) -> None:
    led = open_ledger(backend)
    led.close()
    with pytest.raises(errors.Unavailable, match="closed"):
        led.reserve(rows(1))
    with pytest.raises(errors.Unavailable, match="closed"):
        led.stats("s", "a")
    led.close()                                    # twice is fine


#: A proxy-like process's start: its ledger ``led`` (argv: kind, file or URL), then its work.
_OPEN_IN_CHILD = """
import sys, time
sys.path.insert(0, {repo!r})
from tests.storage.test_ledger import rows
from fortis.services.proxy.ledger import Outcome
kind, where = sys.argv[1], sys.argv[2]
if kind == "sqlite":
    from fortis.services.proxy.ledger import Ledger
    led = Ledger(where)
else:
    from fortis.services.proxy.ledger_pg import PgLedger
    led = PgLedger(where)
"""

_DYING = _OPEN_IN_CHILD + """
led.reserve(rows(3, call_id="dying", tenant="dead"))
print(getattr(led, "owner", 0), flush=True)
time.sleep(600)
"""


def _killed_with_rows_in_flight(kind: str, where: str) -> int:
    """A real proxy-like process that reserved 3 rows, killed with SIGKILL; its owner."""
    proc = subprocess.Popen([sys.executable, "-c", _DYING.format(repo=str(REPO)), kind, where],
                            stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.strip(), f"the process did not reserve its rows (exit {proc.poll()})"
        return int(line)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)


def test_rows_of_a_killed_process_become_interrupted(backend: Backend) -> None:
    where = backend.url if backend.kind == "postgres" else str(backend.dir / "ledger.sqlite")
    _killed_with_rows_in_flight(backend.kind, where)
    led = _open_when_dead_released(backend)
    try:
        assert led.mark_interrupted() == 3
        assert led.mark_interrupted() == 0
        st = led.stats("s", "dead")
        assert (st.interrupted, st.in_flight, st.attempts) == (3, 3, 3)   # still charged
    finally:
        led.close()


def _open_when_dead_released(backend: Backend) -> Any:
    """The ledger, once the server has seen the killed process's connection close (PG)."""
    if backend.kind == "postgres":
        _wait_no_owner_locks(backend.url, keep=0)
    return open_ledger(backend)


def _wait_no_owner_locks(url: str, keep: int) -> None:
    """Wait until at most ``keep`` owners' advisory locks are held (a killed process's
    backend ends when the server reads the closed socket)."""
    import sqlalchemy as sa
    from fortis.infra.storage import sqldb
    from fortis.services.proxy.ledger_pg import OWNER_LOCK

    engine = sqldb.create_engine(url)
    try:
        deadline = time.monotonic() + 20
        while True:
            with engine.connect() as conn:
                n = conn.execute(sa.text(
                    "SELECT COUNT(*) FROM pg_locks WHERE locktype='advisory' AND classid=:k"
                    " AND database=(SELECT oid FROM pg_database WHERE datname="
                    "current_database())"), {"k": OWNER_LOCK}).scalar()
            if n <= keep:
                return
            assert time.monotonic() < deadline, "the killed process's lock was never released"
            time.sleep(0.1)
    finally:
        engine.dispose()


def test_a_starting_replica_marks_only_dead_replicas_rows(postgres_url: str) -> None:
    """PostgreSQL shared by replicas: a live replica's in-flight rows stay in flight."""
    from fortis.services.proxy.ledger_pg import PgLedger

    migrate(postgres_url)
    live = PgLedger(postgres_url)
    try:
        mine = live.reserve(rows(2, call_id="alive", tenant="live"))
        dead_owner = _killed_with_rows_in_flight("postgres", postgres_url)
        assert dead_owner != live.owner
        _wait_no_owner_locks(postgres_url, keep=1)       # only the live replica's
        starting = PgLedger(postgres_url)
        try:
            assert starting.mark_interrupted() == 3          # the dead one's rows only
            assert live.stats("s", "live").in_flight == 2
            assert live.stats("s", "live").interrupted == 0
            assert starting.stats("s", "dead").interrupted == 3
        finally:
            starting.close()
        live.complete([(e, Outcome(status="OK")) for e in mine])    # and it finishes them
        assert live.stats("s", "live").queries_ok == 2
    finally:
        live.close()


def test_a_lost_connection_is_unavailable_then_reconnected(postgres_url: str) -> None:
    """The database drops the ledger's connections (a failover, an admin's kill): the
    write in progress is UNAVAILABLE naming the ledger, never INTERNAL; the next works."""
    import sqlalchemy as sa
    from fortis.infra.storage import sqldb
    from fortis.services.proxy.ledger_pg import PgLedger

    migrate(postgres_url)
    led = PgLedger(postgres_url)
    admin = sqldb.create_engine(postgres_url)
    try:
        led.reserve(rows(1, call_id="before"))
        with admin.connect() as conn:
            killed = conn.execute(sa.text(
                "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE"
                " datname=current_database() AND pid<>pg_backend_pid()")).scalar()
        assert killed and killed >= 2                 # the writer and the owner lock's
        with pytest.raises(errors.Unavailable, match="proxy ledger unavailable"):
            led.reserve(rows(1, call_id="during"))
        assert len(led.reserve(rows(1, call_id="after"))) == 1
        assert sum(led.attempt_counts("s", "a").values()) == 2
    finally:
        admin.dispose()
        led.close()


def test_an_old_sqlite_ledger_gets_the_attempt_key_in_place(tmp_path: Path) -> None:
    """A ledger file from an older version (no ``position``): opened, it gains the column and
    the unique key; its rows (two of one attempt) keep counting; new rows are idempotent."""
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(ledger_mod.SCHEMA.replace(
        ",\n    position INTEGER NOT NULL DEFAULT 0", ""))
    old = ("a", "s", "t", "o", "img", "0" * 64, "", 1.0, "OK", "", 1000.0, "c1", 1)
    conn.executemany("INSERT INTO queries (tenant, session_id, target, origin, image_id,"
                     " input_sha256, output_summary, latency_ms, status, error, sent_at,"
                     " call_id, attempts) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", [old, old])
    conn.commit()
    assert "position" not in {r[1] for r in conn.execute("PRAGMA table_info(queries)")}
    conn.close()
    led = Ledger(path)
    try:
        assert led.attempt_counts("s", "a") == {"img": 2}
        first = led.reserve(rows(2, call_id="c1"))          # same call and attempt as old rows
        assert led.reserve(rows(2, call_id="c1")) == first
        assert sum(led.attempt_counts("s", "a").values()) == 4
    finally:
        led.close()
    again = Ledger(path)                                    # opening twice changes nothing
    try:
        assert sum(again.attempt_counts("s", "a").values()) == 4
    finally:
        again.close()


def test_an_owner_lock_lost_with_its_connection_is_taken_again(
        postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection holding a live replica's owner lock is dropped (a failover, an admin's
    kill): before writing more rows the replica takes its number again, so a replica that
    starts meanwhile does not take it for dead and leaves its in-flight rows alone."""
    import sqlalchemy as sa
    from fortis.infra.storage import sqldb
    from fortis.services.proxy import ledger_pg
    from fortis.services.proxy.ledger_pg import OWNER_LOCK, PgLedger

    migrate(postgres_url)
    live = PgLedger(postgres_url)
    admin = sqldb.create_engine(postgres_url)
    try:
        live.reserve(rows(1, call_id="before", tenant="live"))
        with admin.connect() as conn:
            killed = conn.execute(sa.text(
                "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_locks WHERE"
                " locktype='advisory' AND classid=:k"), {"k": OWNER_LOCK}).scalar()
        assert killed == 1                               # the holder, not the writer
        _wait_no_owner_locks(postgres_url, keep=0)
        monkeypatch.setattr(ledger_pg, "OWNER_CHECK_S", 0.0)    # check at the next write
        live.reserve(rows(2, call_id="after", tenant="live"))
        assert live.owner_retaken == 1
        starting = PgLedger(postgres_url)
        try:
            assert starting.mark_interrupted() == 0      # the live replica's rows stay
        finally:
            starting.close()
        st = live.stats("s", "live")
        assert (st.in_flight, st.interrupted) == (3, 0)
    finally:
        admin.dispose()
        live.close()


def test_two_replicas_creating_one_session_get_one_row(postgres_url: str) -> None:
    """Two proxy replicas on one PostgreSQL create the same session at the same moment: one
    row; with the same settings both get it, with other settings the second is refused
    (ALREADY_EXISTS) exactly as if it had come later."""
    from fortis.services.proxy.backends import GrpcTargetBackend
    from fortis.services.proxy.ledger_pg import PgLedger
    from fortis.services.proxy.proxy import TargetEntry, TargetProxy
    from fortis.services.proxy.ratelimit import RateLimiter

    migrate(postgres_url)
    ledgers = [PgLedger(postgres_url), PgLedger(postgres_url)]
    backend = GrpcTargetBackend("127.0.0.1:9")          # never called: sessions only
    replicas = [TargetProxy(led, [TargetEntry(name="t", backend=backend,
                                              limiter=RateLimiter(100.0))])
                for led in ledgers]
    rounds = 25
    outcomes: dict[tuple[int, int], Any] = {}
    start = threading.Barrier(2)

    def create(k: int) -> None:
        for r in range(rounds):
            start.wait()
            budget = 10 if r % 2 == 0 else 10 + k        # odd rounds: the two disagree
            try:
                outcomes[(k, r)] = replicas[k].create_session(
                    tenant="a", target="t", session_id=f"race-{r}", query_budget=budget)
            except errors.AlreadyExists as exc:
                outcomes[(k, r)] = exc

    try:
        ts = [threading.Thread(target=create, args=(k,)) for k in (0, 1)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        for r in range(rounds):
            got = [outcomes[(0, r)], outcomes[(1, r)]]
            stored = ledgers[0].get_session(f"race-{r}", "a")
            assert stored is not None
            if r % 2 == 0:
                assert got[0] == got[1] == stored        # one row, both callers get it
            else:
                ok = [g for g in got if isinstance(g, SessionRecord)]
                assert len(ok) == 1 and ok[0] == stored, got
                assert sum(isinstance(g, errors.AlreadyExists) for g in got) == 1
    finally:
        backend.close()
        for led in ledgers:
            led.close()


_COMPLETED_THEN_KILLED = _OPEN_IN_CHILD + """
ids = led.reserve(rows(2, call_id="answered", tenant="k"))
led.complete([(e, Outcome(status="OK", latency_ms=1.0, output_summary="top1=3"))
              for e in ids])
print("answered", flush=True)
time.sleep(600)
"""


def test_an_outcome_is_visible_at_once_and_survives_a_killed_process(backend: Backend) -> None:
    """For speed, an outcome is committed without its own fsync (the
    reservation before the send had one), but it is committed: another reader sees it as
    soon as ``complete`` returns, and a proxy killed right after answering loses nothing
    (only a power cut before the next fsync could, and then the row reads INTERRUPTED)."""
    where = backend.url if backend.kind == "postgres" else str(backend.dir / "ledger.sqlite")
    proc = subprocess.Popen([sys.executable, "-c", _COMPLETED_THEN_KILLED.format(
        repo=str(REPO)), backend.kind, where], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "answered"
        reader = open_ledger(backend)                   # a second process's view, at once
        try:
            assert [r[9] for r in reader.entries("s", tenant="k")] == ["OK", "OK"]
        finally:
            reader.close()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    led = _open_when_dead_released(backend)
    try:
        assert led.mark_interrupted() == 0
        st = led.stats("s", "k")
        assert (st.queries_ok, st.in_flight) == (2, 0)
        assert {r[7] for r in led.entries("s", tenant="k")} == {"top1=3"}
    finally:
        led.close()


def test_sqlite_outcomes_take_no_fsync_of_their_own(tmp_path: Path) -> None:
    """One client at a time (no group to share): every reservation is a durable commit of
    its own, every completion is not (it is on disk with the next reservation's fsync, or
    by the background flush within OUTCOME_DURABLE_WITHIN_S when none follows)."""
    led = Ledger(tmp_path / "ledger.sqlite")
    try:
        for c in range(10):
            ids = led.reserve(rows(1, call_id=f"c{c}"))
            led.complete([(ids[0], Outcome(status="OK"))])
        assert (led.commits, led.durable_commits) == (20, 10)
        deadline = time.monotonic() + 5
        while led._undurable.is_set():                  # the last outcome: flushed soon
            assert time.monotonic() < deadline, "the last outcome was never flushed"
            time.sleep(0.01)
    finally:
        led.close()
    normal = Ledger(tmp_path / "normal.sqlite", synchronous="NORMAL")   # no fsyncs asked for
    try:
        ids = normal.reserve(rows(1))
        normal.complete([(ids[0], Outcome(status="OK"))])
        assert normal.durable_commits == 2 and normal._flusher is None
    finally:
        normal.close()
