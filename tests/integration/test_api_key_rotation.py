"""API-key rotation without restart (transport security: API keys loaded from a file or
secret and stored hashed, key rotation without restart; SPEC section 0: many tenants on one
Fortis).

Real stacks on loopback with a real key file (``TENANT sha256:<hex>`` lines, written here
with hashlib):

- a key added to the file works on the next calls, no restart; a key removed is
  UNAUTHENTICATED on the next call while a stream opened with it runs to its end;
- a malformed file keeps the previous keys, says so in the log (the line number, neither
  keys nor hashes) and counts on the real /metrics endpoint
  (``fortis_api_keys_reload_errors_total``); an emptied file (or comments only) revokes
  every key: the next call is UNAUTHENTICATED;
- the table the server holds has digests only;
- ``fortis serve --api-keys-file`` (a real process, over TLS) re-reads the file on SIGHUP,
  and the CLI's remote commands reach it with ``--tls-ca``.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog
from fortis.evaluation.v1 import evaluation_pb2 as pb
from fortis.evaluation.v1 import evaluation_pb2_grpc
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc

K1, K2, K3 = "rot-key-one-0123456789", "rot-key-two-0123456789", "rot-key-three-012345678"


def _line(tenant: str, key: str) -> str:
    return f"{tenant} sha256:{hashlib.sha256(key.encode()).hexdigest()}"


def _write(path: Path, *lines: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("# fortis api keys\n" + "".join(ln + "\n" for ln in lines))
    os.replace(tmp, path)          # how a secret or config-management tool replaces it


def _call(ch: grpc.Channel, key: str) -> grpc.StatusCode:
    stub = proxy_pb2_grpc.TargetProxyServiceStub(ch)
    try:
        stub.ListTargets(proxy_pb2.ListTargetsRequest(), metadata=(("x-api-key", key),),
                         timeout=10)
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()


def _until(ch: grpc.Channel, key: str, code: grpc.StatusCode, within: float = 10.0) -> float:
    """Seconds until a call with ``key`` answers ``code`` (fails after ``within``)."""
    t0 = time.monotonic()
    while _call(ch, key) != code:
        assert time.monotonic() - t0 < within, f"key never answered {code}"
        time.sleep(0.05)
    return time.monotonic() - t0


@pytest.fixture()
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "secret" / "api-keys"
    path.parent.mkdir()
    _write(path, _line("tenant-a", K1))
    return path


@pytest.fixture()
def rot_stack(tmp_path: Path, key_file: Path, fmnist_target) -> Iterator[Any]:
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    s = start_stack(StackSettings(
        state_dir=tmp_path / "state", api_keys_file=key_file, api_keys_reload_s=0.1,
        metrics_port=0, metrics_host="127.0.0.1",
        targets=[TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn"),
                 TargetConfig.parse("fmnist-slow=builtin:fmnist-cnn?rate=20")],
        watch_heartbeat_s=0.3))
    yield s
    s.stop(0)


@pytest.fixture()
def ch(rot_stack) -> Iterator[grpc.Channel]:
    c = grpc.insecure_channel(rot_stack.address)
    yield c
    c.close()


def test_added_key_works_removed_key_refused_without_restart(rot_stack, key_file, ch) -> None:
    assert _call(ch, K1) == grpc.StatusCode.OK
    assert _call(ch, K2) == grpc.StatusCode.UNAUTHENTICATED
    _write(key_file, _line("tenant-a", K1), _line("tenant-a", K2))     # overlap: both work
    _until(ch, K2, grpc.StatusCode.OK)
    assert _call(ch, K1) == grpc.StatusCode.OK
    _write(key_file, _line("tenant-a", K2), _line("tenant-b", K3))     # K1 retired
    _until(ch, K1, grpc.StatusCode.UNAUTHENTICATED)
    assert _call(ch, K2) == _call(ch, K3) == grpc.StatusCode.OK
    assert rot_stack.key_table.tenants() == frozenset({"tenant-a", "tenant-b"})


def _metric(stack: Any, name: str) -> float:
    """``name``'s value scraped from the stack's real /metrics endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics_port}/metrics",
                                timeout=10) as r:
        for ln in r.read().decode().splitlines():
            if ln.startswith(name + " "):
                return float(ln.split()[1])
    raise AssertionError(f"{name} not exported")


def test_malformed_file_keeps_the_previous_keys_and_counts(rot_stack, key_file, ch) -> None:
    lines: list[dict[str, Any]] = []

    def keep(_l: Any, _n: str, event: Any) -> Any:
        lines.append(dict(event))
        raise structlog.DropEvent

    errors_total = "fortis_api_keys_reload_errors_total"
    last_ok = "fortis_api_keys_last_reload_success_timestamp_seconds"
    assert _metric(rot_stack, errors_total) == 0 and _metric(rot_stack, last_ok) > 0
    ok_before = _metric(rot_stack, last_ok)
    old = structlog.get_config()
    structlog.configure(processors=[keep], cache_logger_on_first_use=False)
    try:
        watcher = rot_stack.key_watcher
        for n, bad in enumerate(("tenant-a sha256:" + "0" * 10,      # truncated hash
                                 f"tenant-a {K2}"), 1):               # a plain key pasted
            _write(key_file, _line("tenant-a", K1), bad)
            deadline = time.monotonic() + 10
            while watcher.failures < n:
                assert time.monotonic() < deadline, "the bad file was never read"
                time.sleep(0.05)
            assert _call(ch, K1) == grpc.StatusCode.OK      # previous keys still in force
            assert _metric(rot_stack, errors_total) == n
        assert _call(ch, K2) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        structlog.configure(**old)
    assert _metric(rot_stack, last_ok) == ok_before      # no good reload since
    failed = [ln for ln in lines if ln.get("event") == "api_keys_reload_failed"]
    assert len(failed) == 2 and all(ev["kept_keys"] == 1 for ev in failed)
    assert all("line 3" in ev["reason"] for ev in failed)
    text = json.dumps(lines, default=str)
    digest = hashlib.sha256(K1.encode()).hexdigest()
    assert K1 not in text and K2 not in text and digest not in text and digest[:16] not in text
    # A good file again: in force on the next poll.
    _write(key_file, _line("tenant-a", K2))
    _until(ch, K2, grpc.StatusCode.OK)
    assert _call(ch, K1) == grpc.StatusCode.UNAUTHENTICATED
    assert _metric(rot_stack, last_ok) >= ok_before


def test_an_emptied_file_revokes_every_key(rot_stack, key_file, ch) -> None:
    _write(key_file, _line("tenant-a", K1), _line("tenant-b", K3))
    _until(ch, K3, grpc.StatusCode.OK)
    key_file.write_text("")                # the operator empties the file: all access cut
    _until(ch, K1, grpc.StatusCode.UNAUTHENTICATED)
    assert _call(ch, K3) == grpc.StatusCode.UNAUTHENTICATED
    assert _metric(rot_stack, "fortis_api_keys_reload_errors_total") == 0
    assert _metric(rot_stack, "fortis_api_keys_file_keys") == 0
    _write(key_file, _line("tenant-b", K3))   # comments only is the same: check, then back
    _until(ch, K3, grpc.StatusCode.OK)
    _write(key_file)                           # "# fortis api keys" and nothing else
    _until(ch, K3, grpc.StatusCode.UNAUTHENTICATED)


def test_a_call_in_flight_survives_the_removal_of_its_key(rot_stack, key_file, ch) -> None:
    """A WatchEvaluation stream opened with K1 keeps streaming after K1 is removed (auth is
    checked when a call starts); the next call with K1 is refused; K2 of the same tenant
    sees the same evaluation."""
    plan = ("name: rotation\nseed: 1\ntarget: {name: fmnist-slow, task: classification}\n"
            "dataset: {source: fashion-mnist, split: test, limit: 40}\n"
            "corruptions: [{id: contrast, severities: [1]}]\n")
    md1 = (("x-api-key", K1),)
    stub = evaluation_pb2_grpc.EvaluationServiceStub(ch)
    ev = stub.CreateEvaluation(pb.CreateEvaluationRequest(plan=plan), metadata=md1).evaluation
    received: list[tuple[float, int]] = []
    errors: list[BaseException] = []

    def follow() -> None:
        try:
            for resp in stub.WatchEvaluation(
                    pb.WatchEvaluationRequest(evaluation_id=ev.evaluation_id),
                    metadata=md1, timeout=120):
                received.append((time.monotonic(), resp.evaluation.state))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=follow)
    t.start()
    while not received:
        time.sleep(0.02)
    _write(key_file, _line("tenant-a", K2))
    _until(ch, K1, grpc.StatusCode.UNAUTHENTICATED)
    removed_at = time.monotonic()
    t.join(timeout=120)
    assert not errors, errors
    after = [state for at, state in received if at > removed_at]
    # 80 images at 20/s take about 4 s: the stream went on well after the key was gone.
    assert len(after) >= 2, "the stream ended before the key was removed: no in-flight test"
    assert after[-1] == pb.EVALUATION_STATE_SUCCEEDED
    with pytest.raises(grpc.RpcError) as ei:
        stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id=ev.evaluation_id), metadata=md1)
    assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
    got = stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id=ev.evaluation_id),
                             metadata=(("x-api-key", K2),)).evaluation
    assert got.state == pb.EVALUATION_STATE_SUCCEEDED


def test_the_server_holds_digests_only(rot_stack) -> None:
    table = rot_stack.key_table
    entries = table.entries()
    assert {e.tenant for e in entries} == {"tenant-a", "*"}    # the file's key + internal
    assert all(isinstance(e.digest, bytes) and len(e.digest) == 32 for e in entries)
    assert hashlib.sha256(K1.encode()).digest() in {e.digest for e in entries}
    assert not any(K1 in repr(v) for v in vars(table).values())


# -- fortis serve, a real process ---------------------------------------------------------------

def _fortis(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from fortis.server.cli import main; "
                           "raise SystemExit(main())", *args],
                          capture_output=True, text=True, timeout=120, **kw)


def test_fortis_serve_over_tls_reloads_its_key_file_on_sighup(tmp_path: Path) -> None:
    from tests.integration.test_tls import make_pki

    pki = make_pki(tmp_path / "pki")
    key_file = tmp_path / "api-keys"
    _write(key_file, _line("team-x", K1))
    proc = subprocess.Popen(
        [sys.executable, "-c", "from fortis.server.cli import main; raise SystemExit(main())",
         "serve", "--service", "evaluation", "--address", "127.0.0.1:0",
         "--state-dir", str(tmp_path / "state"), "--api-keys-file", str(key_file),
         "--api-keys-reload", "0", "--tls-cert", str(pki.server_crt),
         "--tls-key", str(pki.server_key), "--tls-ca", str(pki.ca_crt)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        started = json.loads(proc.stdout.readline())
        address = started["address"]
        assert "api_key" not in started           # a key file: no generated demo key
        base = ["--address", address, "--tls-ca", str(pki.ca_crt)]

        ok = _fortis("list", *base, "--api-key", K1)
        assert ok.returncode == 0, ok.stderr
        plain = _fortis("list", "--address", address, "--api-key", K1)
        assert plain.returncode == 1 and "Unavailable" in plain.stderr
        assert _fortis("list", *base, "--api-key", K2).returncode == 1

        _write(key_file, _line("team-x", K2))
        time.sleep(0.3)        # reload interval 0: nothing changes until the signal
        assert _fortis("list", *base, "--api-key", K1).returncode == 0
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 15
        while _fortis("list", *base, "--api-key", K2).returncode != 0:
            assert time.monotonic() < deadline, "SIGHUP did not reload the key file"
        refused = _fortis("list", *base, "--api-key", K1)
        assert refused.returncode == 1 and "Unauthenticated" in refused.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert '"api_keys_reloaded"' in err or "api_keys_reloaded" in err
    digests = [hashlib.sha256(k.encode()).hexdigest() for k in (K1, K2)]
    assert not any(s in err for s in (K1, K2, *digests)), "a key or hash in the server log"
