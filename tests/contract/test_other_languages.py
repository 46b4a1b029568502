"""Other languages generate clients in one command: `buf generate` with protos/buf.gen.yaml.

Why: the contracts are the language-neutral seam. This builds the Go client that `buf generate`
writes, plus clients/go/example/main.go, with Debian's Go toolchain (scripts/setup_go.sh
installs it when missing; GOPATH mode, no module proxy here), and runs it against the real
stack: it lists the tenant's targets and decodes the google.rpc.BadRequest of a refused plan
with the error-detail types generated from the vendored protos.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import API_KEY
from tests.toolchains import ensure

ROOT = Path(__file__).resolve().parents[2]
BUF = ROOT / "node_modules" / ".bin" / "buf"
EXAMPLE = ROOT / "clients" / "go" / "example" / "main.go"


@pytest.fixture(scope="module")
def go() -> str:
    """The go binary, installed from Debian by scripts/setup_go.sh on first use."""
    return ensure("setup_go.sh", "go", "protoc-gen-go", "protoc-gen-go-grpc")


def build_go_client(go: str, work: Path) -> Path:
    src = work / "src"
    src.mkdir(parents=True)
    r = subprocess.run([str(BUF), "generate", "-o", str(src)], cwd=ROOT / "protos",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    pkg = src / "github.com" / "fortis-robustness" / "fortis" / "gen" / "go" / "fortis"
    assert (pkg / "evaluation" / "v1" / "evaluation_grpc.pb.go").exists()
    assert (src / "google.golang.org/genproto/googleapis/rpc/errdetails/error_details.pb.go"
            ).exists()
    (src / "fortisexample").mkdir()
    shutil.copy(EXAMPLE, src / "fortisexample" / "main.go")
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": f"{work}:/usr/share/gocode",
           "GOFLAGS": "", "GOCACHE": os.environ.get("GOCACHE", str(work / "gocache"))}
    binary = work / "fortis-example"
    r = subprocess.run([go, "build", "-o", str(binary), "."], cwd=src / "fortisexample",
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return binary


@pytest.mark.slow
def test_go_client_from_buf_generate_compiles_and_calls_the_stack(go, stack, tmp_path):
    binary = build_go_client(go, tmp_path)
    # a valid call: the tenant's targets
    r = subprocess.run([str(binary), "-address", stack.address, "-api-key", API_KEY],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "target fmnist-cnn\n" in r.stdout
    # a refused plan: INVALID_ARGUMENT, BadRequest field violations decoded in Go
    r = subprocess.run([str(binary), "-address", stack.address, "-api-key", API_KEY,
                        "-plan", "name: x"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "invalid plan: InvalidArgument" in r.stdout
    assert "violation target: " in r.stdout and "violation dataset.source: " in r.stdout
    # a wrong key: UNAUTHENTICATED from the same binary
    r = subprocess.run([str(binary), "-address", stack.address, "-api-key", "wrong"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "unknown API key" in r.stderr
