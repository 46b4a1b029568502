"""A real PostgreSQL server for the tests of the PostgreSQL storage back ends.

Debian's ``postgresql`` (``scripts/setup.sh`` installs it): ``initdb`` + ``pg_ctl`` in a temp
dir, on a free loopback port (``listen_addresses=127.0.0.1``, the unix socket in the temp
dir, ``fsync=off``: a test server, durability is not what is tested), password
authentication (a random password, so the tests can check it is never shown), stopped at the
end of the session. ``initdb`` refuses to run as root: as root the server runs as the
``postgres`` user (``runuser -u postgres -- ...``). A missing binary fails the test with the
set-up step to run (CI installs it); nothing is skipped.

Fixtures: ``postgres_server`` (one per session) and ``postgres_url`` (a fresh, empty database
per test, dropped after it: tests are isolated).
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

SETUP_HINT = ("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): run `bash "
              "scripts/setup.sh` as root (it runs `apt-get install -y postgresql`), or install "
              "Debian's postgresql yourself")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if not found:
        pytest.fail(SETUP_HINT, pytrace=False)
    return Path(found[-1]).parent


class PostgresServer:
    """One PostgreSQL cluster in a temp dir; ``url(db)`` is a psycopg 3 URL with the password."""

    def __init__(self, *, fsync: bool = False) -> None:
        #: False for tests (durability is not what they test); True: commits reach the disk
        #: (``bench/storage.py`` compares durable ledgers).
        self.fsync = fsync
        self.bin = _bin_dir()
        self.port = _free_port()
        self.user = "fortis"
        self.password = "pw-" + secrets.token_hex(8)
        self.dir = Path(tempfile.mkdtemp(prefix="fortis-pg-"))
        self.data = self.dir / "data"
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")

    def _run(self, *args: str, timeout: float = 60.0) -> None:
        cmd = [*(["runuser", "-u", "postgres", "--"] if self._as_postgres else []), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{Path(args[0]).name} failed ({proc.returncode}): "
                               f"{(proc.stderr or proc.stdout)[-2000:]}")

    def start(self) -> PostgresServer:
        pwfile = self.dir / "pw"
        pwfile.write_text(self.password + "\n")
        if self._as_postgres:
            shutil.chown(pwfile, "postgres", "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user,
                  "--auth=scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8", "--no-locale",
                  "--no-sync")
        pwfile.unlink()
        self.start_server()
        return self

    def start_server(self) -> None:
        """Start (again) the server on the cluster made by :meth:`start`."""
        durability = "" if self.fsync else "-c fsync=off -c full_page_writes=off "
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 {durability}"
                "-c max_connections=200")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l",
                  str(self.dir / "server.log"), "-w", "-t", "60", "-o", opts, "start",
                  timeout=90)

    def stop_server(self) -> None:
        """Stop the server, keeping its data (a database that goes away while Fortis runs)."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop",
                  timeout=60)

    def url(self, database: str = "postgres") -> str:
        return (f"postgresql+psycopg://{self.user}:{self.password}@127.0.0.1:{self.port}/"
                f"{database}")

    def admin(self, sql: str) -> None:
        """Run one statement outside a transaction (CREATE/DROP DATABASE)."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=self.user,
                             password=self.password, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]

    def create_database(self) -> str:
        name = "t_" + secrets.token_hex(6)
        self.admin(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        if self.data.exists():
            try:
                self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                          "-w", "stop", timeout=60)
            except RuntimeError:
                pass            # not running
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture()
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh empty database of the session's server (no schema: tests migrate it)."""
    name = postgres_server.create_database()
    try:
        yield postgres_server.url(name)
    finally:
        postgres_server.drop_database(name)
