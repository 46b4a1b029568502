"""Other languages' toolchains for the client tests, installed from Debian on first use by their
set-up scripts (scripts/setup_go.sh, scripts/setup_java.sh; idempotent, quick once ready)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ensure(script: str, *binaries: str) -> str:
    """Run ``scripts/<script>``; the path of the first of ``binaries`` once all are on PATH.
    Skipped, with the script's own reason, only where the toolchain cannot be installed; a
    script that succeeds without them is a failure."""
    r = subprocess.run(["bash", str(ROOT / "scripts" / script)], capture_output=True,
                       text=True, timeout=1200)
    if r.returncode != 0:
        pytest.skip(f"toolchain cannot be installed here (scripts/{script}): "
                    + (r.stderr or r.stdout).strip()[-500:])
    paths = [shutil.which(b) for b in binaries]
    assert all(paths), f"scripts/{script} succeeded but {binaries} are not all on PATH"
    return str(paths[0])
