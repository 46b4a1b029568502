"""Worker Jobs reach services that listen with TLS only (work fan-out on Kubernetes
itself, with the chart's ``secrets.tls``; deploy/README's former "Not covered": "the worker
Jobs' pods do not mount the TLS secret").

The evaluation service runs as the chart runs it with ``secrets.tls`` and ``executor:
kubernetes``: ``fortis serve --service evaluation`` with its certificate (mTLS required,
a certificate naming only ``fortis.internal``), the other services' addresses, PostgreSQL,
and ``--executor kubernetes --job-tls-secret team-a-tls``. The other four services serve
over the same mTLS, in this process. Certificates are made here with ``openssl``
(tests/integration/test_tls.py's PKI).

**Faked, and only these:** the Kubernetes API server (an HTTP server of the test's own with
the ``batch/v1`` Job endpoints, tests/integration/test_k8s_indexed_jobs.py; the service's
official ``kubernetes`` client reaches it through a kubeconfig) and the kubelet's part: the
test runs each pod of the created Job itself, the container's command and arguments with
the environment the manifest gives (secret references resolved from the test's secrets, the
TLS secret's files written where the pod would mount them, ``JOB_COMPLETION_INDEX`` set),
then marks the Job complete as the Job controller would. No cluster can run here.

Checked: the Job the service created is valid in strict mode and mounts the TLS secret
read-only; ``fortis worker`` run from it calls the services over mTLS and runs every work
item, the evaluation then scores and SUCCEEDS; the same pod without the TLS settings (what
the manifest gave before) cannot reach the services and exits 1 (transient: retried).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from fortis.client import FortisClient, progress_of

from tests.conftest import API_KEY
from tests.integration.test_k8s_indexed_jobs import FakeBatchApi
from tests.integration.test_tls import Pki, make_pki
from tests.storage.conftest import migrate

NAMESPACE = "team-a"
INTERNAL_KEY = "internal-test-key"
SERVER_NAME = "fortis.internal"
PLAN = """
name: workers-over-tls
seed: 7
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 32}
correctness: {mode: top1}
corruptions:
  - {id: gaussian_noise, severities: [1, 3]}
execution: {batch_size: 8}
"""
ITEMS = 4 + 2 * 4        # the clean pass and two settings, 4 chunks of 8 images each


@pytest.fixture()
def fake_api() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeBatchApi)
    server.jobs, server.requests, server.forbidden = {}, [], False  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def _kubeconfig(path: Path, port: int) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "evaluation", "user": {"token": "fake-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "evaluation",
                                                  "namespace": NAMESPACE}}]}))
    return path


def _pod_command(job: dict[str, Any], index: int, secrets: dict[tuple[str, str], str],
                 secret_files: dict[str, dict[str, bytes]], root: Path
                 ) -> tuple[list[str], dict[str, str]]:
    """What the kubelet runs for pod ``index`` of ``job``: the container's command line and
    environment, secret volumes written under ``root`` (paths in the environment that point
    into a mount rewritten to there)."""
    spec = job["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    moved: dict[str, str] = {}
    for m in c["volumeMounts"]:
        secret = volumes[m["name"]].get("secret")
        if secret is None:
            continue                                    # emptyDir scratch: the real /tmp
        d = root / m["mountPath"].lstrip("/")
        d.mkdir(parents=True)
        for name, data in secret_files[secret["secretName"]].items():
            (d / name).write_bytes(data)
        moved[m["mountPath"]] = str(d)
    env = {k: v for k, v in os.environ.items()          # the image's environment
           if not k.startswith(("FORTIS_", "JOB_", "KUBECONFIG", "POD_"))}
    for e in c["env"]:
        if "value" in e:
            value = e["value"]
            for mount, d in moved.items():
                if value.startswith(mount + "/"):
                    value = d + value[len(mount):]
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            value = secrets[(ref["name"], ref["key"])]
        env[e["name"]] = value
    env["JOB_COMPLETION_INDEX"] = str(index)             # Indexed completion mode
    fortis = str(Path(sys.executable).with_name(c["command"][0]))    # the image's PATH
    return [fortis, *c["command"][1:], *c["args"]], env


@pytest.mark.slow
def test_worker_pods_of_a_tls_deployment_reach_the_services_over_mtls(
        tmp_path: Path, postgres_url: str, fake_api: ThreadingHTTPServer, fmnist_target) -> None:
    from fortis.infra.serving.tls import TlsSettings
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    pki: Pki = make_pki(tmp_path / "pki")
    migrate(postgres_url)
    tls = TlsSettings(cert_file=pki.internal_crt, key_file=pki.internal_key, ca_file=pki.ca_crt,
                      client_auth="require", server_name=SERVER_NAME)
    others = start_stack(StackSettings(
        state_dir=tmp_path / "others", api_keys={API_KEY: NAMESPACE}, tls=tls,
        targets=[TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn")],
        internal_key=INTERNAL_KEY))
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", fake_api.server_address[1])
    log = tmp_path / "evaluation.log"
    args = [sys.executable, "-m", "fortis.server.cli", "serve", "--service=evaluation",
            "--address=127.0.0.1:0", f"--state-dir={tmp_path / 'evaluation'}",
            f"--tls-cert={pki.internal_crt}", f"--tls-key={pki.internal_key}",
            f"--tls-ca={pki.ca_crt}", "--tls-client-auth=require",
            f"--tls-server-name={SERVER_NAME}", "--log-level=info",
            *(f"--{o}-address={others.address}" for o in ("proxy", "perturbation", "scoring",
                                                           "report")),
            "--executor=kubernetes", "--job-image=registry.local/fortis:test",
            f"--job-namespace={NAMESPACE}", "--job-shards=2",
            "--job-service-account=fortis-team-a-worker",
            "--job-secret-env=FORTIS_DATABASE_URL=team-a-database:url",
            "--job-secret-env=FORTIS_INTERNAL_KEY=team-a-internal-key:internal-key",
            "--job-tls-secret=team-a-tls"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FORTIS_", "POD_"))}
    env.update(FORTIS_API_KEYS=f"{API_KEY}={NAMESPACE}", FORTIS_INTERNAL_KEY=INTERNAL_KEY,
               FORTIS_DATABASE_URL=postgres_url, KUBECONFIG=str(kubeconfig))
    with log.open("w") as err:
        service = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    secrets = {("team-a-database", "url"): postgres_url,
               ("team-a-internal-key", "internal-key"): INTERNAL_KEY}
    secret_files = {"team-a-tls": {"tls.crt": pki.internal_crt.read_bytes(),
                                   "tls.key": pki.internal_key.read_bytes(),
                                   "ca.crt": pki.ca_crt.read_bytes()}}
    try:
        line = service.stdout.readline() if service.stdout else ""
        assert line, f"the evaluation service did not start:\n{log.read_text()[-3000:]}"
        address = json.loads(line)["address"]
        with FortisClient(address, api_key=API_KEY, tls_ca=pki.ca_crt, tls_cert=pki.client_crt,
                          tls_key=pki.client_key, tls_server_name=SERVER_NAME) as fc:
            fc.submit(PLAN, evaluation_id="ev-tls")
            deadline = time.monotonic() + 120
            while not fake_api.jobs:                            # type: ignore[attr-defined]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.1)
            ((ns, name), job), = fake_api.jobs.items()          # type: ignore[attr-defined]
            assert ns == NAMESPACE
            kubernetes_validate.validate({k: v for k, v in job.items() if k != "status"},
                                         "1.30.0", strict=True)
            (c,) = job["spec"]["template"]["spec"]["containers"]
            assert {"name": "tls", "mountPath": "/etc/fortis/tls", "readOnly": True} in \
                c["volumeMounts"]

            # the pod as it was before (no TLS settings), beside the real ones: it cannot
            # reach the services
            cmd, pod_env = _pod_command(job, 0, secrets, secret_files, tmp_path / "pod-plain")
            plain_env = {k: v for k, v in pod_env.items() if not k.startswith("FORTIS_TLS_")}
            plain = subprocess.Popen(cmd, env=plain_env, cwd=tmp_path, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            pods = []
            for index in range(int(job["spec"]["completions"])):
                cmd, pod_env = _pod_command(job, index, secrets, secret_files,
                                            tmp_path / f"pod-{index}")
                pods.append(subprocess.Popen(cmd, env=pod_env, cwd=tmp_path, text=True,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE))
            outs = [p.communicate(timeout=300) for p in pods]
            _, plain_err = plain.communicate(timeout=120)
            assert plain.returncode == 1, (plain.returncode, plain_err[-2000:])
            assert "transient" in plain_err, plain_err[-2000:]
            for p, (_out, err_text) in zip(pods, outs, strict=True):
                assert p.returncode == 0, (p.returncode, err_text[-3000:])
            results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
            assert [r["state"] for r in results] == ["done", "done"], results
            assert sum(r["ran"] for r in results) == ITEMS, results    # all by the pods
            # the Job controller: every index succeeded
            job["status"] = {"succeeded": 2, "conditions": [{"type": "Complete",
                                                             "status": "True"}]}
            final = fc.wait("ev-tls", timeout_s=120)
            assert progress_of(final).state == "SUCCEEDED", final.error.message
            report = fc.report("ev-tls")
            assert report["metrics"]["m"] == 32
    finally:
        if service.poll() is None:
            service.terminate()
            try:
                service.wait(30)
            except subprocess.TimeoutExpired:
                service.kill()
        others.stop(0)


def _serve_refused(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FORTIS_", "POD_"))}
    return subprocess.run([sys.executable, "-m", "fortis.server.cli", "serve", "--service=evaluation",
                           "--address=127.0.0.1:0", "--executor=kubernetes",
                           f"--job-namespace={NAMESPACE}", "--job-image=i:1", *args],
                          capture_output=True, text=True, timeout=120, env=env)


def test_tls_and_executor_kubernetes_go_with_a_job_tls_secret(tmp_path: Path) -> None:
    """With TLS the worker pods need the certificate: ``fortis serve`` refuses to start
    without ``--job-tls-secret`` (its workers could not reach the services), and refuses a
    ``--job-tls-secret`` the plain-text services have no use for; exit 2 naming it."""
    state = f"--state-dir={tmp_path}"
    r = _serve_refused(state, "--tls-cert=c.pem", "--tls-key=k.pem")
    assert r.returncode == 2 and "job_tls_secret" in r.stderr, r.stderr
    r = _serve_refused(state, "--job-tls-secret=team-a-tls")
    assert r.returncode == 2 and "job_tls_secret" in r.stderr, r.stderr
