"""Shared by the Open Inference Protocol adapter tests (test_kserve_v2_*.py): paths, the
proxy stack and the small helpers that talk to it."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import numpy as np
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
