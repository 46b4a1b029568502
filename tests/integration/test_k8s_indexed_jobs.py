"""Evaluation Jobs on Kubernetes: the work fan-out runs on Kubernetes itself.

The manifest ``k8s_jobs.job_manifest`` builds is validated against the Kubernetes 1.30
schemas in strict mode (``kubernetes-validate``, bundled schemas) and checked field by field
(Indexed completion mode, one pod per shard, non-root, read-only root filesystem, no service
account token, resources, the evaluation's labels).

``IndexedJobExecutor`` is driven through the official ``kubernetes`` client against a
**fake Kubernetes API server**: an HTTP server of the test's own that implements the three
``batch/v1`` Job endpoints the executor uses (create, read status, delete) with the API's
JSON shapes. It is the only fake: no cluster can run on this machine (no container engine,
no kubelet), so the API server is the part outside our control that cannot run here.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kubernetes  # pyproject dependency: never skipped
import kubernetes_validate  # dev extra
import pytest
from fortis.services.common import errors
from fortis.services.evaluation.k8s_jobs import (
    IndexedJobExecutor,
    JobSettings,
    job_manifest,
    job_name,
)

SETTINGS = JobSettings(namespace="team-a", image="registry.local/fortis:0.2.0", shards=3,
                       secret_env={"FORTIS_DATABASE_URL": ("fortis-db", "url"),
                                   "FORTIS_INTERNAL_KEY": ("fortis-internal", "key")},
                       env={"FORTIS_PROXY_ADDRESS": "dns:///fortis-proxy.team-a.svc:50051"})


# -- the manifest -------------------------------------------------------------------------------
def test_the_manifest_is_a_valid_indexed_job_in_strict_mode() -> None:
    m = job_manifest(SETTINGS, tenant="team-a", evaluation_id="nightly/../Ω" * 20,
                     worker_args=["--log-level", "info"])
    kubernetes_validate.validate(m, "1.30.0", strict=True)     # raises on any error
    spec = m["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["requests"] and c["resources"]["limits"]
    env = {e["name"]: e for e in c["env"]}
    assert env["FORTIS_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "fortis-db",
                                                                       "key": "url"}
    assert env["FORTIS_EVALUATION_ID"]["value"] == "nightly/../Ω" * 20   # as given, in env only
    for value in m["metadata"]["labels"].values():                     # labels stay legal
        assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", value), value
    assert m["metadata"]["namespace"] == "team-a"


def test_with_tls_the_pods_mount_the_secret_and_the_worker_gets_its_files() -> None:
    """Services that listen with TLS only are reached by workers that have the
    certificate. The TLS secret is mounted read-only where the chart mounts it for the
    services, and ``fortis worker`` is told where its files are ($FORTIS_TLS_*, the
    variables its flags default to) and which name to verify; still strictly valid."""
    tls = JobSettings(**{**SETTINGS.__dict__, "tls_secret": "team-a-tls",
                         "tls_server_name": "fortis.internal"})
    m = job_manifest(tls, tenant="team-a", evaluation_id="e1")
    kubernetes_validate.validate(m, "1.30.0", strict=True)
    pod = m["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert {"name": "tls", "mountPath": "/etc/fortis/tls", "readOnly": True} in c["volumeMounts"]
    assert {"name": "tls", "secret": {"secretName": "team-a-tls"}} in pod["volumes"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert (env["FORTIS_TLS_CERT"], env["FORTIS_TLS_KEY"], env["FORTIS_TLS_CA"]) == (
        "/etc/fortis/tls/tls.crt", "/etc/fortis/tls/tls.key", "/etc/fortis/tls/ca.crt")
    assert env["FORTIS_TLS_SERVER_NAME"] == "fortis.internal"
    # without a TLS secret, nothing of it (the plain-text services)
    plain = job_manifest(SETTINGS, tenant="team-a", evaluation_id="e1")["spec"]["template"]
    assert [v["name"] for v in plain["spec"]["volumes"]] == ["scratch"]
    assert not [e for e in plain["spec"]["containers"][0]["env"]
                if e["name"].startswith("FORTIS_TLS_")]


def test_job_names_are_stable_legal_and_distinct_per_tenant() -> None:
    a = job_name("team-a", "e1")
    assert a == job_name("team-a", "e1")                 # a resumed evaluation finds its Job
    assert a != job_name("team-b", "e1") != job_name("team-a", "e2")
    for name in (a, job_name("t", "x" * 10_000), job_name("t", "../..")):
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63


@pytest.mark.parametrize("kw, field", [({"namespace": "Team_A"}, "jobs.namespace"),
                                       ({"image": ""}, "jobs.image"),
                                       ({"shards": 0}, "jobs.shards"),
                                       ({"backoff_limit": -1}, "jobs.backoff_limit"),
                                       ({"tls_secret": "Team_TLS"}, "jobs.tls_secret"),
                                       ({"tls_server_name": "x"}, "jobs.tls_server_name")])
def test_bad_job_settings_name_the_setting(kw: dict[str, Any], field: str) -> None:
    base = {"namespace": "team-a", "image": "img:1"}
    with pytest.raises(errors.InvalidArgument) as err:
        JobSettings(**{**base, **kw})
    assert field in str(err.value)


# -- the executor against a fake API server --------------------------------------------------
class FakeBatchApi(BaseHTTPRequestHandler):
    """``batch/v1`` Jobs: POST .../namespaces/{ns}/jobs, GET .../jobs/{name}/status,
    DELETE .../jobs/{name}. ``server.jobs`` holds what was created; tests set a Job's
    ``status`` as Kubernetes' Job controller would."""

    server: Any
    _PATH = re.compile(r"^/apis/batch/v1/namespaces/([^/]+)/jobs(?:/([^/]+))?(/status)?$")

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: int, reason: str) -> None:
        self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                          "reason": reason, "code": code})

    def do_POST(self) -> None:  # noqa: N802
        m = self._PATH.match(self.path.split("?")[0])
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(("POST", self.path, body))
        if not m or m.group(2):
            return self._status(404, "NotFound")
        if self.server.forbidden:
            return self._status(403, "Forbidden")
        name = body["metadata"]["name"]
        if (m.group(1), name) in self.server.jobs:
            return self._status(409, "AlreadyExists")
        body["status"] = {}
        self.server.jobs[(m.group(1), name)] = body
        self._send(201, body)

    def do_GET(self) -> None:  # noqa: N802
        m = self._PATH.match(self.path.split("?")[0])
        self.server.requests.append(("GET", self.path, None))
        job = self.server.jobs.get((m.group(1), m.group(2))) if m else None
        if job is None:
            return self._status(404, "NotFound")
        self._send(200, job)

    def do_DELETE(self) -> None:  # noqa: N802
        m = self._PATH.match(self.path.split("?")[0])
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.server.requests.append(("DELETE", self.path, body))
        if not m or self.server.jobs.pop((m.group(1), m.group(2)), None) is None:
            return self._status(404, "NotFound")
        self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})


@pytest.fixture()
def fake_api() -> Iterator[tuple[Any, Any]]:
    """(the fake server, a ``BatchV1Api`` pointed at it)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeBatchApi)
    server.jobs, server.requests, server.forbidden = {}, [], False
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    cfg = kubernetes.client.Configuration()
    cfg.host = f"http://127.0.0.1:{server.server_address[1]}"
    api = kubernetes.client.BatchV1Api(kubernetes.client.ApiClient(cfg))
    try:
        yield server, api
    finally:
        server.shutdown()


def test_submit_creates_the_job_once_and_a_resumed_evaluation_reuses_it(fake_api) -> None:
    server, api = fake_api
    ex = IndexedJobExecutor(SETTINGS, api)
    name = ex.submit(tenant="team-a", evaluation_id="e1", worker_args=["--x"])
    assert name == job_name("team-a", "e1")
    created = server.jobs[("team-a", name)]
    assert created == {**job_manifest(SETTINGS, tenant="team-a", evaluation_id="e1",
                                      worker_args=["--x"]), "status": {}}
    assert ex.submit(tenant="team-a", evaluation_id="e1", worker_args=["--x"]) == name
    assert len(server.jobs) == 1                         # 409 on the second: reused
    assert ex.status(name) is None                       # running: no condition yet


def test_wait_reads_the_jobs_conditions(fake_api) -> None:
    server, api = fake_api
    sleeps: list[float] = []
    ex = IndexedJobExecutor(SETTINGS, api, sleep=sleeps.append)
    ok = ex.submit(tenant="team-a", evaluation_id="ok")
    bad = ex.submit(tenant="team-a", evaluation_id="bad")
    server.jobs[("team-a", ok)]["status"] = {
        "succeeded": 3, "conditions": [{"type": "Complete", "status": "True"}]}
    server.jobs[("team-a", bad)]["status"] = {
        "failed": 7, "succeeded": 1, "conditions": [
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
             "message": "Job has reached the specified backoff limit"}]}
    assert ex.wait(ok) == ex.status(ok) and ex.status(ok).state == "succeeded"
    out = ex.wait(bad)
    assert (out.state, out.failed, out.succeeded) == ("failed", 7, 1)
    assert out.reason.startswith("BackoffLimitExceeded")
    # a running Job: wait polls until the caller stops it
    running = ex.submit(tenant="team-a", evaluation_id="running")
    calls = iter([False, False, True])
    assert ex.wait(running, should_stop=lambda: next(calls), poll_s=0.5).state == "stopped"
    assert sleeps == [0.5, 0.5]


def test_delete_removes_the_job_with_background_propagation(fake_api) -> None:
    server, api = fake_api
    ex = IndexedJobExecutor(SETTINGS, api)
    name = ex.submit(tenant="team-a", evaluation_id="cancel-me")
    ex.delete(name)
    assert ("team-a", name) not in server.jobs
    method, _, body = server.requests[-1]
    assert method == "DELETE" and body["propagationPolicy"] == "Background"
    ex.delete(name)                                      # already gone: fine


def test_api_errors_become_fortis_errors_that_say_what_to_fix(fake_api) -> None:
    server, api = fake_api
    server.forbidden = True
    with pytest.raises(errors.PermissionDenied) as err:
        IndexedJobExecutor(SETTINGS, api).submit(tenant="team-a", evaluation_id="e")
    assert "Role" in str(err.value) and "403" in str(err.value)
    with pytest.raises(errors.NotFound):
        IndexedJobExecutor(SETTINGS, api).status("fortis-eval-missing")
    cfg = kubernetes.client.Configuration()
    cfg.host = "http://127.0.0.1:9"          # nothing listens on the discard port
    cfg.retries = 0
    down = kubernetes.client.BatchV1Api(kubernetes.client.ApiClient(cfg))
    with pytest.raises(errors.Unavailable) as err2:
        IndexedJobExecutor(SETTINGS, down).submit(tenant="team-a", evaluation_id="e")
    assert "unreachable" in str(err2.value)


def test_the_job_of_a_traced_run_carries_its_trace_context(fake_api) -> None:
    """Submitted inside the evaluation run's span, the Job's pods get ``TRACEPARENT``: the
    workers' spans join the run's trace (``fortis worker`` reads it back)."""
    from fortis.infra.serving import tracing
    from opentelemetry import context as otel_context

    server, api = fake_api
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    token = otel_context.attach(tracing.extract({"traceparent": parent}))
    try:
        name = IndexedJobExecutor(SETTINGS, api).submit(tenant="team-a", evaluation_id="tr")
    finally:
        otel_context.detach(token)
    env = server.jobs[("team-a", name)]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "TRACEPARENT", "value": parent} in env
