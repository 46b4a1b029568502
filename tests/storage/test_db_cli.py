"""``fortis db upgrade`` / ``fortis db current`` against a real PostgreSQL (schema managed by
Alembic migrations; bad settings get a precise error naming the setting, never a traceback,
never the password).

The commands run as real processes (``python -m fortis.server.cli``), the database is the real
server of ``tests/infra/postgres.py`` (a fresh database per test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fortis.infra.storage import sqldb

from tests.infra.postgres import PostgresServer


def fortis(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "FORTIS_DATABASE_URL"}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "fortis.server.cli", *args], capture_output=True,
                          text=True, timeout=120, env=full_env)


def _password(url: str) -> str:
    return url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]


def _clean(proc: subprocess.CompletedProcess[str], password: str) -> None:
    out = proc.stdout + proc.stderr
    assert password not in out
    assert "Traceback" not in out


def test_upgrade_then_current(postgres_url: str) -> None:
    pw = _password(postgres_url)
    head = sqldb.head_revision()
    cur = fortis("db", "current", "--check", "--database-url", postgres_url)
    _clean(cur, pw)
    assert cur.returncode == 1, cur.stderr          # a fresh database is not at head
    assert json.loads(cur.stdout)["current"] is None
    up = fortis("db", "upgrade", "--database-url", postgres_url)
    _clean(up, pw)
    assert up.returncode == 0, up.stderr
    got = json.loads(up.stdout)
    assert (got["before"], got["after"], got["head"]) == (None, head, head)
    assert got["database"].startswith("postgresql+psycopg://fortis:***@127.0.0.1:")
    again = fortis("db", "upgrade", env={"FORTIS_DATABASE_URL": postgres_url})   # from the env
    _clean(again, pw)
    assert again.returncode == 0, again.stderr
    assert (json.loads(again.stdout)["before"], json.loads(again.stdout)["after"]) == (head, head)
    cur = fortis("db", "current", "--check", env={"FORTIS_DATABASE_URL": postgres_url})
    assert cur.returncode == 0, cur.stderr
    assert json.loads(cur.stdout)["at_head"] is True
    # the schema is really there: the stores open it
    from fortis.services.evaluation.store_pg import PgEvaluationStore
    from fortis.services.proxy.ledger_pg import PgLedger
    PgEvaluationStore(postgres_url).close()
    PgLedger(postgres_url).close()


def test_two_upgrades_at_once_both_succeed(postgres_url: str) -> None:
    with ThreadPoolExecutor(2) as pool:
        procs = list(pool.map(lambda _: fortis("db", "upgrade", "--database-url", postgres_url),
                              range(2)))
    assert [p.returncode for p in procs] == [0, 0], [p.stderr for p in procs]
    befores = sorted(str(json.loads(p.stdout)["before"]) for p in procs)
    assert befores == sorted(["None", sqldb.head_revision()])     # one migrated, one found it


def _refused(proc: subprocess.CompletedProcess[str], password: str, *, mentions: str) -> None:
    _clean(proc, password)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fortis: database_url: "), proc.stderr
    assert mentions in lines[0], lines[0]


def test_bad_urls_and_unreachable_servers_are_one_line_naming_the_setting(
        postgres_server: PostgresServer) -> None:
    pw = "s3cret-" + os.urandom(4).hex()
    cases: list[tuple[list[str], dict[str, Any], str]] = [
        (["db", "current"], {}, "give --database-url"),
        (["db", "upgrade", "--database-url", f"mysql://u:{pw}@h/x"], {}, "unsupported scheme"),
        (["db", "upgrade", "--database-url", f"postgresql://u:{pw}@127.0.0.1:1/x"], {},
         "cannot connect to postgresql+psycopg://u:***@127.0.0.1:1/x"),
        (["db", "current", "--database-url", f"postgresql://u:{pw}@127.0.0.1:99999/x"], {},
         "bad port"),
        (["db", "current", "--database-url", f"postgresql://u:{pw}@127.0.0.1/"], {},
         "names no database"),
        # the real server, a wrong password: refused by the server, still one line
        (["db", "upgrade"], {"FORTIS_DATABASE_URL": postgres_server.url().replace(
            postgres_server.password, pw)}, "password authentication failed"),
    ]
    for args, env, mentions in cases:
        _refused(fortis(*args, env=env), pw, mentions=mentions)
    # nor is the real password shown when the server refuses something else
    name = postgres_server.create_database()
    try:
        real = fortis("db", "upgrade", "--revision", "9999",
                      "--database-url", postgres_server.url(name))
    finally:
        postgres_server.drop_database(name)
    _clean(real, postgres_server.password)
    assert real.returncode == 2 and real.stderr.startswith("fortis: revision: "), real.stderr


def test_fortis_ledger_reads_the_shared_postgres_ledger(postgres_url: str) -> None:
    """``fortis ledger --database-url``: the operator reads the ledger the proxy replicas
    share (read-only: it takes no owner number and writes nothing), every tenant's or one
    tenant's sessions; a bad URL is exit 2 naming database_url, without the password."""
    from fortis.services.proxy.ledger import IN_FLIGHT, Outcome, QueryRow, SessionRecord
    from fortis.services.proxy.ledger_pg import PgLedger

    from tests.storage.conftest import migrate

    migrate(postgres_url)
    pw = _password(postgres_url)
    led = PgLedger(postgres_url)
    try:
        for tenant, n in (("a", 3), ("b", 2)):
            led.insert_session(SessionRecord(session_id=f"ev1/{tenant}-clean", tenant=tenant,
                                             target="t", query_budget=0, per_image_budget=0,
                                             description="", created_at=1.0))
            ids = led.reserve([QueryRow(
                tenant=tenant, session_id=f"ev1/{tenant}-clean", target="t", origin="clean",
                image_id=f"i{k}", input_sha256="0" * 64, output_summary="", latency_ms=0.0,
                status=IN_FLIGHT, error="", sent_at=1.0, call_id=f"{tenant}c", attempts=1)
                for k in range(n)])
            led.complete([(e, Outcome(status="OK")) for e in ids])
        before = led.last_entry_id()
    finally:
        led.close()
    every = fortis("ledger", "--evaluation", "ev1", "--json", "--database-url", postgres_url)
    _clean(every, pw)
    assert every.returncode == 0, every.stderr
    got = {r["session_id"]: (r["tenant"], r["queries_ok"]) for r in json.loads(every.stdout)}
    assert got == {"ev1/a-clean": ("a", 3), "ev1/b-clean": ("b", 2)}
    only_b = fortis("ledger", "--evaluation", "ev1", "--tenant", "b", "--json",
                    env={"FORTIS_DATABASE_URL": postgres_url})
    assert only_b.returncode == 0, only_b.stderr
    assert [r["session_id"] for r in json.loads(only_b.stdout)] == ["ev1/b-clean"]
    hidden = fortis("ledger", "--session", "ev1/a-clean", "--tenant", "b",
                    "--database-url", postgres_url)
    assert hidden.returncode == 2 and "not found" in hidden.stderr
    bad = fortis("ledger", "--session", "x", "--database-url", f"mysql://fortis:{pw}@127.0.0.1/x")
    _clean(bad, pw)
    assert bad.returncode == 2 and "database_url" in bad.stderr
    reader = PgLedger(postgres_url, read_only=True)     # the reads wrote nothing
    try:
        assert reader.last_entry_id() == before
    finally:
        reader.close()
