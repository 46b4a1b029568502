"""The slim client distribution (clients/python, ``fortis-client``) as a team that only submits
plans uses it: installed (not editable) into a fresh venv with no torch, numpy or OpenCV, it
submits a plan to a real ``fortis serve``, watches it with a timeout and downloads the report;
and it installs and calls the server from another Python version grpcio supports."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CLIENT_DIR = ROOT / "clients" / "python"
KEY = "slim-client-key"
PLAN = """
name: slim-client
seed: 7
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 32}
corruptions:
  - {id: gaussian_noise, severities: [1, 3]}
execution: {batch_size: 32}
"""
SCRIPT = textwrap.dedent("""
    import json, sys
    from fortis.client import FortisClient, State
    address, key, out = sys.argv[1:4]
    with FortisClient(address, api_key=key, timeout_s=30) as fc:
        ev = fc.submit(sys.stdin.read())
        seen = []
        for e in fc.watch(ev.evaluation_id, timeout_s=300):
            seen.append(e.progress.stage)
        assert e.state == State.SUCCEEDED, (e.state, e.error)
        fc.write_report(ev.evaluation_id, out)
        print(json.dumps({"id": ev.evaluation_id, "stages": seen,
                          "listed": [x.evaluation_id for x in fc.iter_evaluations(page_size=1)]}))
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    """This environment minus anything that would let the fresh venv see the project's code."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _venv(python: str, where: Path) -> Path:
    """A fresh venv at ``where`` with ``pip install ./clients/python`` (not editable)."""
    subprocess.run([python, "-m", "venv", str(where)], check=True, capture_output=True, timeout=120,
                   env=_env())
    py = where / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        str(CLIENT_DIR)], capture_output=True, text=True, timeout=600, env=_env())
    if r.returncode != 0:
        raise RuntimeError(r.stdout[-3000:] + r.stderr[-3000:])
    return py


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, fmnist_target: object,
           fmnist_surrogate: object) -> Iterator[str]:
    """A real ``fortis serve`` (the project's venv) on a free port; its address."""
    state = tmp_path_factory.mktemp("slim-state")
    port = _free_port()
    fortis = Path(sys.executable).parent / "fortis"
    proc = subprocess.Popen([str(fortis), "serve", "--address", f"127.0.0.1:{port}",
                             "--api-key", f"{KEY}=tenant-a", "--state-dir", str(state),
                             "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"fortis serve did not start: {proc.stderr.read()[-3000:] if proc.stderr else ''}")
        yield json.loads(line)["address"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_fresh_venv_without_torch_submits_watches_and_downloads(tmp_path: Path,
                                                                 server: str) -> None:
    py = _venv(shutil.which("python3.11") or sys.executable, tmp_path / "venv")
    listed = subprocess.run([str(py), "-m", "pip", "list", "--format=json"], check=True,
                            capture_output=True, text=True, env=_env()).stdout
    names = {p["name"].lower() for p in json.loads(listed)}
    assert "fortis-client" in names
    assert not names & {"torch", "numpy", "opencv-python", "opencv-python-headless",
                        "scikit-image", "fortis"}, names
    # the installed package is typed and has no server code
    site = subprocess.run([str(py), "-c", "import fortis.client, os; "
                           "print(os.path.dirname(fortis.client.__file__))"],
                          check=True, capture_output=True, text=True, env=_env()).stdout.strip()
    assert (Path(site) / "py.typed").exists()
    assert not (Path(site).parent / "services").exists()
    out = tmp_path / "report"
    r = subprocess.run([str(py), "-c", SCRIPT, server, KEY, str(out)], input=PLAN, env=_env(),
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["stages"][-1] == "done" and result["id"] in result["listed"]
    report = json.loads((out / "report.json").read_text())
    assert report["metrics"]["accuracy"]["m"] == 32
    assert set(report["metrics"]["corruptions"]["gaussian_noise"]) >= {"1", "3"}
    assert "<html" in (out / "report.html").read_text().lower()


@pytest.mark.parametrize("version", ["3.13.0", "3.10.13", "3.9.18"])
def test_other_python_versions(tmp_path: Path, server: str, version: str) -> None:
    python = Path(f"/root/.pyenv/versions/{version}/bin/python3")
    if not python.exists():
        pytest.skip(f"Python {version} is not installed here")
    if version.startswith("3.9"):
        # grpcio 1.81.1, the oldest grpcio the generated stubs accept, has no 3.9 wheel and
        # requires Python >= 3.10; pip must refuse rather than install something broken.
        with pytest.raises(RuntimeError, match="(?i)requires a different python|python"):
            _venv(str(python), tmp_path / "venv")
        pytest.skip("fortis-client needs Python >= 3.10 (grpcio >= 1.81.1); pip refused 3.9")
    t0 = time.monotonic()
    try:
        py = _venv(str(python), tmp_path / "venv")
    except RuntimeError as exc:
        if "No matching distribution" in str(exc):
            pytest.skip(f"no grpcio wheel for Python {version} on this index: {str(exc)[-300:]}")
        raise
    code = ("import sys; from fortis.client import FortisClient\n"
            "with FortisClient(sys.argv[1], api_key=sys.argv[2]) as fc:\n"
            "    print(sorted(t.name for t in fc.targets()))")
    r = subprocess.run([str(py), "-c", code, server, KEY], capture_output=True, text=True,
                       timeout=120, env=_env())
    assert r.returncode == 0, (r.stderr[-3000:], time.monotonic() - t0)
    assert "fmnist-cnn" in r.stdout
