"""Contracts: Buf STANDARD lint, generated stubs up to date, and the architecture rule that
domain code never imports gRPC (docs/architecture.md, "Rules that keep the boundaries")."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUF = ROOT / "node_modules" / ".bin" / "buf"

#: Transport modules (gRPC clients and servers) inside the domain folders (core, services,
#: adapters); everything else there is domain code. kserve_v2's grpc_transport.py is the Open
#: Inference Protocol client (like backends.py). infra/ (the server plumbing) and server/ (the
#: composition root and the CLI) are transport by definition and not scanned.
TRANSPORT = {"servicer.py", "backends.py", "proxy_client.py", "clients.py", "torch_target.py",
             "grpc_transport.py"}
#: Transport modules named otherwise, by path: the UploadService servicer.
TRANSPORT_PATHS = {"services/evaluation/uploads.py"}


def test_buf_lint_standard():
    assert BUF.exists(), "buf is missing: run `npm install` (scripts/setup.sh does)"
    r = subprocess.run([str(BUF), "lint"], cwd=ROOT / "protos", capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_buf_build():
    r = subprocess.run([str(BUF), "build", "-o", "/dev/null"], cwd=ROOT / "protos",
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_generated_stubs_are_current():
    r = subprocess.run([sys.executable, "scripts/gen_protos.py", "--check"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_kserve_v2_stubs_are_current():
    """The Open Inference Protocol stubs (adapters/kserve_v2_protos) come from their proto by
    scripts/gen_kserve_protos.py, never edited by hand."""
    r = subprocess.run([sys.executable, "scripts/gen_kserve_protos.py", "--check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_domain_code_never_imports_grpc():
    offenders = []
    for folder in (ROOT / "core", ROOT / "services", ROOT / "adapters"):
        for path in folder.rglob("*.py"):
            if path.name in TRANSPORT or path.name.endswith("_pb2_grpc.py") \
                    or path.relative_to(ROOT).as_posix() in TRANSPORT_PATHS:     # generated stubs
                continue
            bad = {n for n in _imports(path)
                   if n == "grpc" or n.startswith("grpc.") or n.startswith("grpc_") or n.endswith("_pb2_grpc")
                   or n == "fortis.infra.serving.server"}
            if bad:
                offenders.append(f"{path.relative_to(ROOT)}: {sorted(bad)}")
    assert not offenders, "domain modules importing gRPC:\n" + "\n".join(offenders)


def test_every_proto_field_is_commented():
    """Every proto field has a comment (Buf STANDARD does not check comments)."""
    missing = []
    for proto in (ROOT / "protos" / "fortis").rglob("*.proto"):
        lines = proto.read_text().splitlines()
        for i, line in enumerate(lines):
            s = line.strip()
            if s.endswith(";") and "=" in s and not s.startswith(("option", "syntax", "package", "import", "//")):
                if not lines[i - 1].strip().startswith("//"):
                    missing.append(f"{proto.name}:{i + 1}: {s}")
    assert not missing, "\n".join(missing)
