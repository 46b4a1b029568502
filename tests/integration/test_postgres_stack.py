"""Pluggable state, PostgreSQL at scale, end to end: a whole Fortis stack with
``database_url`` keeps its evaluation store and its proxy ledger in a real PostgreSQL
(``tests/infra/postgres.py``) and gives the same results as the embedded SQLite stack.
SPEC: IEEE-M6 (queries counted per image at the proxy, from the ledger), CAN-9 (state in the
store); bad settings named precisely.

- The same Fashion-MNIST plan (corruptions, a transfer attack and a query attack) on the
  SQLite stack and on the PostgreSQL stack: equal metrics; the PostgreSQL ledger's rows are
  exactly the images the (recording, gRPC) target received, and its answered rows are the
  queries the report states.
- ``fortis serve --database-url``: a bad URL, an unreachable server or a database not
  migrated is refused at start with exit 2, one line naming ``database_url`` (and ``fortis db
  upgrade``), no traceback, the password never printed.
- The database stops while the stack runs: calls that need it are UNAVAILABLE with a clear
  message, never INTERNAL; the stack serves again once the database is back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from fortis.client import FortisClient, progress_of
from fortis.infra.storage import sqldb
from fortis.services.common import errors

from tests.conftest import API_KEY
from tests.e2e._crash_target import start_target
from tests.infra.postgres import PostgresServer
from tests.storage.conftest import migrate

PLAN = """
name: pg-stack
seed: 11
target: {name: own, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 32}
correctness: {mode: top1}
corruptions:
  - {id: gaussian_noise, severities: [2]}
  - {id: contrast, severities: [3]}
attacks:
  - {id: fgsm, surrogate: fmnist-surrogate, params: {epsilon: 0.15}}
  - {id: square, params: {epsilon: 0.1, max_queries: 20}}
execution: {batch_size: 8}
"""


def _start(tmp: Path, target_address: str, **kw: Any) -> Any:
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    return start_stack(StackSettings(
        state_dir=tmp / "state", api_keys={API_KEY: "tenant-a"},
        targets=[TargetConfig.parse(f"own=grpc://{target_address}")],
        internal_key="internal-test-key", **kw))


def _run(stack: Any, evaluation_id: str) -> dict:
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        fc.submit(PLAN, evaluation_id=evaluation_id)
        final = fc.wait(evaluation_id, timeout_s=600)
        assert progress_of(final).state == "SUCCEEDED", progress_of(final)
        return fc.report(evaluation_id)


@pytest.fixture()
def recording(fmnist_target: Any) -> Iterator[tuple[str, Any]]:
    server, address, target = start_target(fmnist_target)
    yield address, target
    server.stop(0)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: Any, fmnist_target: Any,
              fmnist_surrogate: Any) -> tuple[dict, int]:
    """The plan on the embedded SQLite stack: its report and the images its target got."""
    server, address, target = start_target(fmnist_target)
    stack = _start(tmp_path_factory.mktemp("sqlite"), address)
    try:
        return _run(stack, "ev-pg"), target.count()
    finally:
        stack.stop(0)
        server.stop(0)


@pytest.mark.slow
def test_the_postgres_stack_equals_the_sqlite_stack(tmp_path: Path, postgres_url: str,
                                                    recording: tuple[str, Any],
                                                    reference: tuple[dict, int]) -> None:
    address, target = recording
    migrate(postgres_url)
    stack = _start(tmp_path / "postgres", address, database_url=postgres_url)
    try:
        pg_report, pg_received = _run(stack, "ev-pg"), target.count()
    finally:
        stack.stop(0)
    sq_report, sq_received = reference
    assert pg_report["metrics"] == sq_report["metrics"]
    assert pg_received == sq_received > 0
    # nothing went to SQLite files in PostgreSQL mode
    assert (tmp_path / "postgres" / "state").is_dir()
    assert not (tmp_path / "postgres" / "state" / "ledger.sqlite").exists()
    assert not (tmp_path / "postgres" / "state" / "evaluations.sqlite").exists()
    engine = sqldb.create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            sent, answered = conn.execute(sa.text(
                "SELECT COUNT(*) FILTER (WHERE error NOT LIKE 'not sent:%'),"
                " COUNT(*) FILTER (WHERE status='OK') FROM queries"
                " WHERE tenant='tenant-a' AND session_id LIKE 'ev-pg/%'")).one()
            state = conn.execute(sa.text(
                "SELECT state FROM evaluations WHERE evaluation_id='ev-pg'")).scalar()
    finally:
        engine.dispose()
    assert state == "SUCCEEDED"
    assert sent == pg_received                           # the ledger is what the target saw
    reported = sum(int(v) for v in pg_report["ledger"]["sessions"].values())
    assert answered == reported == sum(int(v) for v in sq_report["ledger"]["sessions"].values())


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "FORTIS_DATABASE_URL"}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "fortis.server.cli", "serve", "--address",
                           "127.0.0.1:0", "--no-auth", "--no-default-targets", *args],
                          capture_output=True, text=True, timeout=120, env=full)


def test_serve_refuses_a_bad_or_unready_database(tmp_path: Path,
                                                 postgres_server: PostgresServer) -> None:
    pw = postgres_server.password
    state = ["--state-dir", str(tmp_path / "state")]
    fresh = postgres_server.create_database()
    try:
        cases = [
            (_serve(*state, "--database-url", "postgresql://u:hunter2-x@127.0.0.1:1/db"),
             "cannot connect to postgresql+psycopg://u:***@127.0.0.1:1/db", "hunter2-x"),
            (_serve(*state, env={"FORTIS_DATABASE_URL": "mysql://u:hunter2-y@h/db"}),
             "unsupported scheme", "hunter2-y"),
            (_serve(*state, env={"FORTIS_DATABASE_URL": postgres_server.url(fresh)}),
             "has no Fortis schema: run `fortis db upgrade", pw),
        ]
    finally:
        postgres_server.drop_database(fresh)
    for proc, mentions, secret in cases:
        out = proc.stdout + proc.stderr
        assert proc.returncode == 2, out
        assert secret not in out and "Traceback" not in out, out
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("fortis: ")]
        # the step that failed, then the field
        assert len(errors) == 1, out
        assert errors[0].startswith("fortis: startup failed at 'state': database_url: "), out
        assert mentions in errors[0], errors[0]
    assert not (tmp_path / "state" / "ledger.sqlite").exists()     # no fallback to SQLite


def test_a_database_lost_while_running_is_unavailable_then_recovers(
        tmp_path: Path, recording: tuple[str, Any]) -> None:
    """Its own PostgreSQL server (stopped mid-test; the session's one is shared)."""
    from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc

    address, target = recording
    pg = PostgresServer().start()
    try:
        url = pg.url()
        migrate(url)
        stack = _start(tmp_path, address, database_url=url)
        ch = grpc.insecure_channel(stack.address)
        md = (("x-api-key", API_KEY),)
        try:
            proxy = proxy_pb2_grpc.TargetProxyServiceStub(ch)
            proxy.CreateSession(proxy_pb2.CreateSessionRequest(
                target="own", session_id="s1"), metadata=md, timeout=30)
            pg.stop_server()
            with FortisClient(stack.address, api_key=API_KEY) as fc, pytest.raises(
                    errors.Unavailable, match="evaluation store unavailable: the database"):
                fc.submit(PLAN, evaluation_id="ev-lost")
            with pytest.raises(grpc.RpcError) as refused:
                proxy.CreateSession(proxy_pb2.CreateSessionRequest(
                    target="own", session_id="s2"), metadata=md, timeout=30)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "proxy ledger unavailable" in (refused.value.details() or "")
            pg.start_server()
            deadline = time.monotonic() + 30
            while True:                       # the pools reconnect (pre-ping) on their own
                try:
                    proxy.CreateSession(proxy_pb2.CreateSessionRequest(
                        target="own", session_id="s2"), metadata=md, timeout=30)
                    break
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                    assert time.monotonic() < deadline, exc.details()
                    time.sleep(0.2)
        finally:
            ch.close()
            stack.stop(0)
    finally:
        pg.stop()


@pytest.mark.slow
def test_worker_processes_share_the_postgres_store(tmp_path: Path, postgres_url: str,
                                                   recording: tuple[str, Any],
                                                   reference: tuple[dict, int]) -> None:
    """``--executor processes`` with ``database_url``: the workers claim the items in
    PostgreSQL (FORTIS_DATABASE_URL is handed to them), nothing is computed twice and the
    ledger rows are the images the target received."""
    address, target = recording
    migrate(postgres_url)
    stack = _start(tmp_path, address, database_url=postgres_url, executor="processes",
                   worker_processes=2)
    try:
        report = _run(stack, "ev-w")
    finally:
        stack.stop(0)
    engine = sqldb.create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            owners = dict(conn.execute(sa.text(
                "SELECT lease_owner, COUNT(*) FROM items WHERE evaluation_id='ev-w' AND done"
                " GROUP BY lease_owner")).all())
            sent = conn.execute(sa.text(
                "SELECT COUNT(*) FROM queries WHERE session_id LIKE 'ev-w/%'"
                " AND error NOT LIKE 'not sent:%'")).scalar()
    finally:
        engine.dispose()
    assert report["metrics"] == reference[0]["metrics"]
    assert len([o for o in owners if o]) == 2, owners         # both workers ran items
    assert sent == target.count() > 0
    assert sum(int(v) for v in report["ledger"]["sessions"].values()) == target.count()
