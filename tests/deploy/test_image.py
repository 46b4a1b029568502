"""The images that ship are the images that are tested: both targets of the Dockerfile are
built with podman (tests/deploy/image.py: scripts/build_image.sh, layer cache kept) and run
as a restricted pod would run them: read-only root filesystem, uid 10001, no capabilities,
no privilege escalation, /tmp on a tmpfs.

- full (every service, torch, the built-in models): gRPC health SERVING with every default
  target loaded (the built-in models' packages are in the image), a small plan completes
  through ``fortis worker`` processes started by the evaluation service in the container
  (``--executor processes``), a separate worker container starts against that evaluation and
  the serving container's ports, and ``fortis db upgrade`` migrates a real PostgreSQL.
- slim (proxy, scoring, report; no torch): much smaller, serves the scoring and report
  services and the proxy with an external target, refuses a torch-needing service naming it.
- supply chain: the OCI labels (version from pyproject.toml, revision = git HEAD), the base
  pinned by digest, and a CycloneDX SBOM of the image's Python environment.

The Fashion-MNIST models are trained once per machine (tests/conftest.py trains them before
the session) and the host's model cache is mounted read-only as the container's: training them
again in the image would cost about 5 minutes of a cold CI run. Containers share the host's
network (``--network host``, loopback ports) so the host-side client and the worker container
reach the server without a podman network.

Skipped, with the reason shown by ``pytest -rs``, where podman cannot run (not root, tools
missing: ``scripts/setup_containers.sh``).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.image import (
    BUILDS,
    ROOT,
    ensure_image,
    exec_in,
    image_labels,
    image_size,
    podman,
    run_args,
)

pytestmark = pytest.mark.timeout(1800)

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
SMALL_PLAN = """
name: image-small
seed: 5
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 24}
corruptions:
  - {id: gaussian_noise, severities: [1, 3]}
attacks:
  - {id: fgsm, surrogate: fmnist-surrogate, params: {epsilon: 0.1}}
  - {id: square, params: {epsilon: 0.1, max_queries: 20}, limit: 4}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _models_volume(dest: Path) -> Path:
    """A models folder for the containers' cache, copied from the host's trained models
    (tests/conftest.py trains any missing before the session; a few MB): the host's files are
    private to root (0600), and the container runs as 10001. Mounted read-only: a cache hit
    reads, never locks or writes."""
    import shutil

    from fortis.adapters.torch_models.fmnist import KINDS, model_paths

    for kind in KINDS:
        for src in model_paths(kind):
            assert src.is_file(), f"fmnist-{kind} not trained: {src}"
            shutil.copyfile(src, dest / src.name)
            (dest / src.name).chmod(0o644)
    dest.chmod(0o755)
    return dest


def _fortis_host(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fortis.server.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def _wait_serving(name: str, address: str, timeout_s: float = 240) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        r = podman("exec", name, "fortis", "health", "--address", address, "--timeout", "2",
                   check=False, timeout=60)
        if r.returncode == 0 and json.loads(r.stdout)["status"] == "SERVING":
            return time.monotonic() - t0
        state = podman("inspect", "--format", "{{.State.Running}}", name, check=False).stdout
        if state.strip() != "true":
            logs = podman("logs", name, check=False).stderr[-3000:]
            pytest.fail(f"{name} exited before SERVING:\n{logs}", pytrace=False)
        time.sleep(1)
    logs = podman("logs", name, check=False)
    pytest.fail(f"{name} not SERVING within {timeout_s} s:\n{(logs.stdout + logs.stderr)[-3000:]}",
                pytrace=False)


class Served:
    def __init__(self, name: str, address: str, state: Path, key: str, tag: str) -> None:
        self.name, self.address, self.state, self.key, self.tag = name, address, state, key, tag
        self.start_to_serving_s = 0.0


@pytest.fixture(scope="module")
def full() -> str:
    return ensure_image("full")


@pytest.fixture(scope="module")
def slim() -> str:
    return ensure_image("slim")


@pytest.fixture(scope="module")
def served(full: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The full image serving everything, as the chart's all-in-one pod: every default
    target, evaluations run by ``fortis worker`` processes; state on a host folder owned by
    10001 (the pod's fsGroup volume), which a worker container mounts too."""
    state = tmp_path_factory.mktemp("image-state")
    os.chown(state, 10001, 10001)
    port = _free_port()
    address = f"127.0.0.1:{port}"
    name = f"fortis-test-{uuid.uuid4().hex[:8]}"
    key = uuid.uuid4().hex
    podman("run", "-d", "--name", name, *run_args(),
           "-v", f"{_models_volume(tmp_path_factory.mktemp('models'))}:/var/cache/fortis/models:ro",
           "-v", f"{state}:/var/lib/fortis",
           "-e", f"FORTIS_INTERNAL_KEY={key}", full,
           "serve", "--address", address, "--no-auth", "--executor", "processes",
           "--worker-processes", "1")
    srv = Served(name, address, state, key, full)
    try:
        srv.start_to_serving_s = _wait_serving(name, address)
        yield srv
    finally:
        podman("rm", "-f", "-t", "5", name, check=False)


# ---- the full image under a restricted pod's settings ------------------------------------

def test_full_image_serves_under_restricted_settings(served: Served) -> None:
    r = _fortis_host("health", "--address", served.address, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "SERVING", r.stdout
    # The image's own HEALTHCHECK (the Dockerfile's; `fortis health` on 50051) is not used
    # here: this server listens on a free port of the shared host network.
    assert exec_in(served.name, ["id", "-u"]).stdout.strip() == "10001"
    assert exec_in(served.name, ["id", "-g"]).stdout.strip() == "10001"
    status = exec_in(served.name, ["cat", "/proc/self/status"]).stdout
    caps = dict(re.findall(r"^(Cap\w+):\s+([0-9a-f]+)$", status, re.M))
    assert int(caps["CapEff"], 16) == 0 and int(caps["CapPrm"], 16) == 0, caps
    assert re.search(r"^NoNewPrivs:\s+1$", status, re.M), "no-new-privileges not in force"
    for path in ("/opt/fortis/x", "/etc/x", "/x"):
        r = exec_in(served.name, ["touch", path], check=False)
        assert r.returncode != 0 and "Read-only file system" in r.stderr, (path, r.stderr)
    exec_in(served.name, ["touch", "/tmp/x", "/var/lib/fortis/x"])     # its volumes: writable
    mounts = exec_in(served.name, ["cat", "/proc/mounts"]).stdout
    assert re.search(r"^\S+ / \S+ ro[ ,]", mounts, re.M), "root is not mounted read-only"
    assert re.search(r"^tmpfs /tmp tmpfs ", mounts, re.M)


def test_small_plan_completes_through_worker_processes(served: Served, tmp_path: Path) -> None:
    """Submitted from the host; the evaluation service in the container hands it to a
    ``fortis worker`` process (the image's worker entry point) that calls the proxy and the
    perturbation service over gRPC."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(SMALL_PLAN)
    out = tmp_path / "out"
    t0 = time.monotonic()
    r = _fortis_host("run", str(plan), "--out", str(out), "--address", served.address,
                     "--id", "ev-image", "--quiet")
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    report = json.loads((out / "report.json").read_text())
    assert (out / "report.html").is_file()
    text = json.dumps(report)
    assert "gaussian_noise" in text and "square" in text
    logs = podman("logs", served.name).stdout + podman("logs", served.name).stderr
    assert "workers_started" in logs, logs[-3000:]
    served.plan_s = time.monotonic() - t0     # type: ignore[attr-defined]


def test_worker_container_starts_against_the_serving_container(served: Served) -> None:
    """``fortis worker`` as the Indexed Job's pods run it: its own container, the shared
    state volume, the serving container's proxy and perturbation ports. The evaluation has
    ended (the plan test ran it), so the worker opens the store, finds nothing left to run
    and exits 0."""
    r = podman("run", "--rm", *run_args(), "-v", f"{served.state}:/var/lib/fortis",
               "-e", f"FORTIS_INTERNAL_KEY={served.key}", "-e", "JOB_COMPLETION_INDEX=0",
               served.tag, "worker", "--evaluation-id", "ev-image", "--tenant", "default",
               "--proxy-address", served.address, "--perturbation-address", served.address,
               check=False, timeout=300)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["state"] in ("done", "stopped") and result["ran"] == 0, result
    if result["state"] == "stopped":
        assert "the evaluation is" in result.get("message", ""), result


def test_db_upgrade_migrates_a_real_postgresql(full: str, postgres_url: str) -> None:
    env = ["-e", f"FORTIS_DATABASE_URL={postgres_url}"]      # the password stays out of argv
    r = podman("run", "--rm", *run_args(), *env, full, "db", "upgrade", check=False, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    r = podman("run", "--rm", *run_args(), *env, full, "db", "current", "--check",
               check=False, timeout=300)
    assert r.returncode == 0, (r.stdout, r.stderr[-2000:])


# ---- the slim image: proxy, scoring and report without torch ------------------------------

def _serve_slim(slim: str, *args: str) -> tuple[str, str]:
    port = _free_port()
    name = f"fortis-slim-{uuid.uuid4().hex[:8]}"
    podman("run", "-d", "--name", name, *run_args(), slim, "serve", "--address",
           f"127.0.0.1:{port}", "--no-auth", *args)
    return name, f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def host_target() -> Iterator[str]:
    """An external target for the slim proxy: the Fashion-MNIST CNN behind TargetService,
    served by this test process on a loopback port."""
    from fortis.server.app.stack import TargetConfig, start_target_server

    srv = start_target_server(TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn"))
    try:
        yield srv.address
    finally:
        srv.stop(None)


def test_slim_image_has_no_torch_and_serves_its_roles(slim: str, full: str,
                                                      host_target: str) -> None:
    assert image_size(slim) < image_size(full) * 0.6
    r = podman("run", "--rm", *run_args(), "--entrypoint", "python", slim, "-c",
               "import importlib.util as u; print(u.find_spec('torch') is None)")
    assert r.stdout.strip() == "True"
    names = []
    try:
        for service in ("scoring", "report"):
            name, address = _serve_slim(slim, "--service", service)
            names.append(name)
            _wait_serving(name, address, timeout_s=120)
        # the proxy with an external target only: the full image's built-in model over gRPC
        name, address = _serve_slim(slim, "--service", "proxy", "--no-default-targets",
                                    "--target", f"remote=grpc://{host_target}")
        names.append(name)
        _wait_serving(name, address, timeout_s=120)
    finally:
        for name in names:
            podman("rm", "-f", "-t", "2", name, check=False)


def test_slim_image_refuses_torch_services_naming_torch(slim: str) -> None:
    r = podman("run", "--rm", *run_args(), slim, "serve", "--service", "perturbation",
               "--address", f"127.0.0.1:{_free_port()}", "--no-auth", check=False, timeout=120)
    assert r.returncode != 0
    assert "torch" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


# ---- supply chain -------------------------------------------------------------------------

def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


@pytest.mark.parametrize("role", ["full", "slim"])
def test_labels_name_version_revision_source_and_base_digest(role: str) -> None:
    labels = image_labels(ensure_image(role))
    assert labels["org.opencontainers.image.version"] == VERSION
    # git HEAD when the image was built (-dirty: built with uncommitted changes), a commit
    # of this checkout's history (HEAD may have moved on since)
    revision = labels["org.opencontainers.image.revision"]
    assert revision == BUILDS[role]["revision"]
    commit = revision.removesuffix("-dirty")
    assert re.fullmatch(r"[0-9a-f]{40}", commit), revision
    assert _git("merge-base", "--is-ancestor", commit, "HEAD").returncode == 0, revision
    assert labels["org.opencontainers.image.source"] not in ("", "unknown")
    created = labels["org.opencontainers.image.created"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", created), created
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", labels["org.opencontainers.image.base.digest"])


@pytest.mark.parametrize("role", ["full", "slim"])
def test_sbom_is_cyclonedx_of_the_images_python_environment(role: str) -> None:
    tag = ensure_image(role)
    r = podman("run", "--rm", *run_args(), "--entrypoint", "cat", tag, "/opt/fortis/sbom.cdx.json")
    bom = json.loads(r.stdout)
    assert bom["bomFormat"] == "CycloneDX" and bom["specVersion"].startswith("1.")
    versions = {c["name"].lower(): c.get("version") for c in bom["components"]}
    assert versions.get("fortis") == VERSION and "fortis-client" in versions
    assert ("torch" in versions) == (role == "full"), sorted(versions)
    if role == "full":
        assert versions["torch"] == "2.13.0+cpu"
    # every package the environment holds is listed (pip's view inside the image)
    r = podman("run", "--rm", *run_args(), "--entrypoint", "python", tag, "-m", "pip", "list",
               "--format", "json", "--disable-pip-version-check")
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(r.stdout)}
    listed = {n.replace("_", "-") for n in versions}
    assert installed - {"pip", "setuptools", "wheel"} <= listed, sorted(installed - listed)
