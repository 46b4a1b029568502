"""Ruff and mypy clean on our code (generated stubs excluded)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CODE = ["core", "services", "adapters", "clients/python/fortis", "clients/cli"]


def test_ruff_clean():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", *CODE, "tests", "bench", "scripts"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


@pytest.mark.slow
def test_mypy_clean():
    r = subprocess.run([sys.executable, "-m", "mypy", *CODE], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
