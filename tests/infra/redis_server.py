"""A real Redis server for the tests (proxy replicas share rate limits and budgets through
Redis). ``redis-server`` from Debian (``scripts/setup.sh`` installs it) on a free loopback port,
in a temp dir, no persistence (``--save '' --appendonly no``), stopped at the end. A missing
binary fails the test with the set-up step to run (CI installs it).

Fixtures: ``redis_server`` (one per test module; tests use their own ``namespace``) and
``redis_factory`` (servers of the test's own, e.g. to kill and restart one).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SETUP_HINT = ("redis-server is not installed: run `bash scripts/setup.sh` as root (it runs "
              "`apt-get install -y redis-server`), or install Debian's redis-server yourself")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process; ``stop()``/``start()`` again on the same port (a restart
    loses every key: nothing is saved)."""

    def __init__(self, port: int | None = None, *, password: str = "") -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail(SETUP_HINT, pytrace=False)
        self.binary = binary
        self.port = port or _free_port()
        self.password = password
        self.dir = Path(tempfile.mkdtemp(prefix="fortis-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.dir), "--protected-mode", "yes",
             *(["--requirepass", self.password] if self.password else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode} on port "
                                   f"{self.port}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith((b"+PONG", b"-NOAUTH")):
                        return self
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        """Kill the server (SIGKILL: as a crash would)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture()
def redis_factory() -> Iterator[type[RedisServer]]:
    started: list[RedisServer] = []

    class Factory(RedisServer):
        def __init__(self, port: int | None = None, *, password: str = "") -> None:
            super().__init__(port, password=password)
            started.append(self)

    try:
        yield Factory
    finally:
        for s in started:
            s.close()
