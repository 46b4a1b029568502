"""The Fortis container images, built for the tests with podman (shared by the modules that
run them: tests/deploy/test_image.py and the chart's pods under ``podman kube play``).

``ensure_image(role)`` builds the image of a role once per test session through
``scripts/build_image.sh`` (the build a platform team runs; podman's layer cache is kept, so a
rebuild after a source change redoes only the layers after the sources are copied) and returns
its tag; the test is skipped, with the reason shown by ``pytest -rs``, where podman cannot run
here (not root, the tools or their containers.conf missing: ``scripts/setup_containers.sh``
installs both). A build that fails is a test failure, never a skip. ``podman_env()`` is the
environment every podman command of the tests runs with.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build_image.sh"
# Written by scripts/setup_containers.sh: runc + cgroupfs (crun fails on hybrid-cgroup hosts).
CONTAINERS_CONF = Path(os.environ.get("FORTIS_CONTAINERS_CONF",
                                      "/etc/containers/fortis-containers.conf"))
# One tag per role for the tests, apart from the release tags scripts/build_image.sh defaults to.
TEST_TAG = os.environ.get("FORTIS_TEST_IMAGE", "localhost/fortis:test")
ROLES = ("full", "slim")
BUILD_TIMEOUT_S = 1800
# Two sessions on one machine (helpers, CI retries) must not build the same tag at once.
_LOCK = Path("/tmp/fortis-image-build.lock")

_built: dict[str, str] = {}
# What each build measured (scripts/build_image.sh's JSON line plus wall seconds), per role.
BUILDS: dict[str, dict] = {}
_unavailable: list[str] = []


def tag_for(role: str) -> str:
    if role == "full":
        return TEST_TAG
    name, _, tag = TEST_TAG.rpartition(":")
    return f"{name}-{role}:{tag}"


def podman_env() -> dict[str, str]:
    """os.environ with CONTAINERS_CONF pointing at the set-up's containers.conf."""
    env = dict(os.environ)
    env["CONTAINERS_CONF"] = str(CONTAINERS_CONF)
    return env


def podman(*args: str, timeout: float = 120, check: bool = True,
           input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``podman ARGS`` with the tests' configuration; on failure (check) the assertion
    message carries podman's stderr."""
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                       env=podman_env(), input=input)
    if check:
        assert r.returncode == 0, f"podman {' '.join(args)} -> {r.returncode}: {r.stderr[-2000:]}"
    return r


def unavailable() -> str | None:
    """Why podman cannot build and run images here, or None when it can."""
    if _unavailable:
        return _unavailable[0]
    reason = _why_unavailable()
    if reason:
        _unavailable.append(reason)
    return reason


def _why_unavailable() -> str | None:
    if os.environ.get("FORTIS_SKIP_IMAGE"):
        return "FORTIS_SKIP_IMAGE is set"
    if os.geteuid() != 0:
        return "container image tests need root (rootful podman, mmdebstrap): run as root"
    missing = [t for t in ("podman", "mmdebstrap", "runc") if shutil.which(t) is None]
    if missing:
        return (f"{', '.join(missing)} missing: run scripts/setup_containers.sh as root "
                "(apt-get install buildah podman mmdebstrap fuse-overlayfs runc)")
    if not CONTAINERS_CONF.is_file():
        return f"{CONTAINERS_CONF} missing: run scripts/setup_containers.sh as root"
    try:
        r = subprocess.run(["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"],
                           capture_output=True, text=True, timeout=60, env=podman_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"podman info did not answer: {exc}"
    if r.returncode != 0:
        return f"podman does not run here: {r.stderr.strip().splitlines()[-1:]}"
    return None


def ensure_image(role: str = "full") -> str:
    """The tag of the ``role`` image ("full": every service, torch, the built-in models;
    "slim": proxy, scoring and report without torch), built from the working tree once per
    session; skips the calling test when podman cannot run here."""
    assert role in ROLES, role
    if role in _built:
        return _built[role]
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    tag = tag_for("full")
    _LOCK.touch(exist_ok=True)
    with open(_LOCK, "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            t0 = time.monotonic()
            if not _background:         # else the background build has looked already
                prune_if_crowded()
            r = subprocess.run(["bash", str(BUILD_SCRIPT), "--target", role, "--no-check", tag],
                               capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                               env=podman_env(), cwd=ROOT)
            wall = time.monotonic() - t0
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    if r.returncode != 0:
        pytest.fail(f"scripts/build_image.sh --target {role} failed ({r.returncode}):\n"
                    f"{r.stderr[-4000:]}", pytrace=False)
    measured = json.loads(r.stdout.strip().splitlines()[-1])
    measured["wall_s"] = round(wall, 1)
    BUILDS[role] = measured
    _built[role] = tag_for(role)
    return _built[role]


#: Free bytes on podman's storage below which a session removes the images no tag points at
#: before it builds. Every source change leaves the previous build's images dangling (about
#: 3 GB for both roles; a machine that ran the suite again and again filled its disk, 46 GB
#: after a day). But a prune also drops podman's layer cache -- the intermediate images of the
#: current build are untagged too: the next build of an unchanged tree took 170 s instead of
#: 20 s -- so it is done only when the disk needs it, and never between a session's builds.
PRUNE_BELOW_FREE_BYTES = 25 * 1024 ** 3


def prune_if_crowded() -> None:
    """Remove the dangling images when podman's disk has less than ``PRUNE_BELOW_FREE_BYTES``
    free (see there). Run by the background build before it builds, and by ``ensure_image``
    where there was none."""
    env = podman_env()
    try:
        root = subprocess.run(["podman", "info", "--format", "{{.Store.GraphRoot}}"],
                              capture_output=True, text=True, timeout=120,
                              env=env).stdout.strip()
        if shutil.disk_usage(root or "/var/lib/containers").free >= PRUNE_BELOW_FREE_BYTES:
            return
        print(f"fewer than {PRUNE_BELOW_FREE_BYTES >> 30} GiB free: removing dangling images",
              flush=True)
        subprocess.run(["podman", "image", "prune", "-f"], capture_output=True, text=True,
                       timeout=600, env=env)
    except (OSError, subprocess.TimeoutExpired):
        pass


def run_args(*, read_only: bool = True, network: str = "host") -> list[str]:
    """``podman run`` options of a pod under the restricted Pod Security Standard: read-only
    root, the image's non-root user, no capabilities, no privilege escalation, /tmp on a
    tmpfs; the state and cache folders are the image's volumes."""
    args = ["--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--tmpfs", "/tmp:rw,mode=1777", f"--network={network}"]
    if read_only:
        args.insert(0, "--read-only")
    return args


def image_labels(tag: str) -> dict[str, str]:
    out = podman("image", "inspect", "--format", "{{json .Labels}}", tag).stdout
    return json.loads(out) or {}


def image_size(tag: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())


def exec_in(name: str, argv: Sequence[str], timeout: float = 120,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    return podman("exec", name, *argv, timeout=timeout, check=check)


# ---- the build, overlapped with the rest of the suite ----------------------------------------
#: Test modules that need the images: run last, so the build started at collection overlaps
#: with everything before them (a cold build is minutes; on 2 cores most of it is pip and
#: file copying, which leaves the other tests a core).
IMAGE_MODULES = ("tests/deploy/test_image.py", "tests/deploy/test_chart_pods.py")
_background: list[subprocess.Popen] = []


def start_background_build() -> None:
    """Warm podman's layer cache for both roles in a child process holding the build lock;
    ``ensure_image`` then waits on the lock and its own build finds every layer cached.
    Its log: /tmp/fortis-image-background.log. Nothing starts where podman cannot run."""
    if _background or unavailable():
        return
    log = open("/tmp/fortis-image-background.log", "w")  # noqa: SIM115 - the child owns it
    script = (
        "import fcntl, subprocess, sys\n"
        f"lock = open({str(_LOCK)!r}, 'a')\n"
        "fcntl.flock(lock.fileno(), fcntl.LOCK_EX)\n"
        "from tests.deploy.image import prune_if_crowded\n"
        "prune_if_crowded()\n"
        f"rc = subprocess.call(['bash', {str(BUILD_SCRIPT)!r}, '--target', 'all', "
        f"'--no-check', {tag_for('full')!r}])\n"
        "sys.exit(rc)\n")
    _LOCK.touch(exist_ok=True)
    _background.append(subprocess.Popen(
        ["nice", "-n", "5", sys.executable, "-c", script],
        stdout=log, stderr=subprocess.STDOUT, env=podman_env(), cwd=ROOT,
        start_new_session=True))


def stop_background_build() -> None:
    """At the session's end: a build still running (the session was cut short) is stopped."""
    for proc in _background:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, 15)
                proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
