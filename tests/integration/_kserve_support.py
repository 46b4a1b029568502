"""Shared by the Open Inference Protocol adapter tests (test_kserve_v2_*.py): paths, the
proxy stack and the small helpers that talk to it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from fortis.common.v1 import common_pb2
from fortis.proxy.v1 import proxy_pb2
from fortis.services.common.codec import image_msg

from tests.conftest import API_KEY, MD

ROOT = Path(__file__).resolve().parents[2]
MLSERVER_MODELS = ROOT / "tests" / "fixtures" / "mlserver"
MLSERVER_VENV = ROOT / os.environ.get("MLSERVER_VENV", ".venv-mlserver")   # as setup_mlserver.sh
SETUP_SCRIPT = ROOT / "scripts" / "setup_mlserver.sh"
NORM = "mean=0.485,0.456,0.406&std=0.229,0.224,0.225"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def run_mlserver(workdir: Path) -> Iterator[tuple[int, int]]:
    """A real MLServer 1.7.1 serving every model of tests/fixtures/mlserver/ on two free
    loopback ports; yields (REST port, gRPC port) and stops it after. Skips, with the reason,
    when it cannot be installed or started here."""
    setup = subprocess.run(["bash", str(SETUP_SCRIPT)], cwd=ROOT, capture_output=True, text=True,
                           timeout=1500)
    if setup.returncode != 0 or not (MLSERVER_VENV / "bin" / "mlserver").exists():
        tail = [ln for ln in (setup.stderr + setup.stdout).splitlines()
                if not ln.startswith("WARNING: Location")][-8:]
        pytest.skip(f"MLServer 1.7.1 could not be installed by {SETUP_SCRIPT.name} "
                    f"(exit {setup.returncode}): " + " | ".join(tail))
    http_port, grpc_port = free_port(), free_port()
    while grpc_port == http_port:
        grpc_port = free_port()
    env = {key: v for key, v in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(MLSERVER_HOST="127.0.0.1", MLSERVER_HTTP_PORT=str(http_port),
               MLSERVER_GRPC_PORT=str(grpc_port), MLSERVER_METRICS_ENDPOINT="",
               MLSERVER_PARALLEL_WORKERS="0", MLSERVER_LOAD_MODELS_AT_STARTUP="true",
               PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="2")
    log_path = workdir / "mlserver.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(MLSERVER_VENV / "bin" / "mlserver"), "start", str(MLSERVER_MODELS)],
                                cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        ready_url = f"http://127.0.0.1:{http_port}/v2/health/ready"
        deadline = time.monotonic() + 120
        while _http_status(ready_url) != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace").splitlines()[-12:]
                pytest.skip(f"MLServer did not start (exit {proc.poll()}): " + " | ".join(tail))
            time.sleep(0.25)
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
            grpc.channel_ready_future(ch).result(timeout=30)
        yield http_port, grpc_port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def start_stack_with(state_dir: Path, targets: dict[str, str]) -> Any:
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack
    return start_stack(StackSettings(
        state_dir=state_dir, api_keys={API_KEY: "tenant-a"},
        targets=[TargetConfig.parse(f"{name}={url}") for name, url in targets.items()]))


def images(n: int, size: int = 12) -> list[common_pb2.Image]:
    rng = np.random.default_rng(n)
    return [image_msg(f"img-{i}", rng.integers(0, 256, (size, size + 2, 3), dtype=np.uint8))
            for i in range(n)]


def session(px: Any, target: str) -> str:
    return px.CreateSession(proxy_pb2.CreateSessionRequest(target=target), metadata=MD).session.session_id


def ledger(px: Any, session_id: str) -> list[Any]:
    return list(px.ListLedgerEntries(proxy_pb2.ListLedgerEntriesRequest(session_id=session_id),
                                     metadata=MD).entries)
