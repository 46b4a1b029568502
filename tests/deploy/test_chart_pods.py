"""The Helm chart's pods, run for real as far as this machine allows: the objects the chart
renders for a tenant run as containers of the built Fortis image on one podman network
(``scripts/kube_play.py``: ``podman kube play`` of each rendered pod), and a client outside the
pods, written from the protos alone (the generated stubs, not the ``fortis.client`` SDK),
submits a plan through them over mTLS.

The tenant: the built-in Fashion-MNIST CNN as its only target (no model server), SQLite state
on the pods' volumes (no PostgreSQL, no Redis, so one proxy replica: the chart refuses more
without Redis); every other value the chart's default, perturbation's 2 replicas included.
Two variants: ``mtls`` (``secrets.tls`` with ``clientAuth: require``; the probes are exec
``fortis health`` with the pod's certificate) and ``plain`` (no TLS, Kubernetes' gRPC probes,
``evaluation.persistence`` on). The image is ``tests/deploy/image.py``'s (``ensure_image``),
or ``FORTIS_KUBE_PLAY_IMAGE``. The Fashion-MNIST models trained on this host
(``$FORTIS_CACHE/models``, the conftest trains them once) are mounted read-only into the pods'
cache volume: otherwise each pod would train them on first use (about 5 minutes here).

What differs from a cluster (the driver's docstring says how each is converted):
- Service DNS: no cluster DNS. Each headless Service's names map, in every pod's /etc/hosts
  (hostAliases), to the static addresses of the pods its selector matches; a pod that stops
  stays listed (no endpoints controller), and a new name needs the pods re-played.
- NetworkPolicy: not enforced. Every pod reaches every other pod and the host, and the host
  (the "client outside", like a pod of any namespace) reaches every pod.
- Probes: run by the driver, not a kubelet, until every pod is ready, then never again; a
  liveness failure restarts nothing (podman does restart a container that exits). gRPC probes dial the pod's address from the host as the
  kubelet does; exec probes (the TLS variant's) go through ``podman exec``.
- Replicas: each Deployment's replicas are played as that many pods (``<deployment>-<i>``);
  no ReplicaSet replaces a pod that dies; the HPA and the PodDisruptionBudget are left out.
- Volumes: emptyDirs are podman named volumes, one per pod and volume, with no sizeLimit;
  the PVC (evaluation.persistence, plain variant) is a named volume of the claim's name, kept
  by ``--down``, with no storage class, size or access mode. Image VOLUMEs the pod spec does
  not mount get writable anonymous volumes (Kubernetes ignores them).
- Jobs: the migration hook Job is only rendered with a database (none here); executor
  kubernetes' worker Jobs need an API server: not run. ServiceAccount, Role and RoleBinding
  are left out, and no token is mounted (the chart mounts none for this tenant either).
- Secrets are podman secrets named ``<namespace>.<name>`` (podman has no namespaces), made by
  the driver as ``kubectl create secret`` would be; the API key by ``fortis keys new``.
- Resources: limits become cgroup limits; requests schedule nothing (one node).
- ``$(VAR)`` in args is expanded by the driver, the namespace fieldRef written in, and
  ``ports`` dropped (podman 4.3.1 would bind every containerPort on the host).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "scripts" / "kube_play.py"
RELEASE, NAMESPACE = "fortis-kp", "kp-team"
EVALUATION = f"{RELEASE}-evaluation"
CLAIM = f"{RELEASE}-evaluation-state"
_PLAY_LOCK = Path("/tmp/fortis-kube-play.lock")
# the first test of a variant waits for its pods (image build included when not cached)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
PLAN = """
name: chart-pods
seed: 3
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 6}
corruptions: [{id: gaussian_noise, severities: [1]}]
execution: {batch_size: 6}
"""


def _image() -> str:
    """The image the chart runs: the project's build helper's (built with podman's layer
    cache, or a skip saying why not); ``FORTIS_KUBE_PLAY_IMAGE`` names one already built."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (apt-get install podman buildah runc)")
    if os.geteuid() != 0:
        pytest.skip("the pods are played with rootful podman: run as root")
    if os.environ.get("FORTIS_KUBE_PLAY_IMAGE"):
        return os.environ["FORTIS_KUBE_PLAY_IMAGE"]
    try:
        from tests.deploy.image import ensure_image
    except ImportError:
        pytest.skip("tests/deploy/image.py (ensure_image) is not there to build the image")
    return ensure_image(role="full")


def _podman_env() -> dict[str, str]:
    """$CONTAINERS_CONF when set, else the image helper's (the set-up's containers.conf),
    else the driver's own (it writes one with runc + cgroupfs)."""
    if os.environ.get("CONTAINERS_CONF"):
        return dict(os.environ)
    try:
        from tests.deploy.image import podman_env
        env = dict(podman_env())
        if Path(env["CONTAINERS_CONF"]).is_file():
            return env
    except ImportError:
        pass
    sys.path.insert(0, str(ROOT / "scripts"))
    from kube_play import podman_env as driver_env  # type: ignore[import-not-found]
    return driver_env()


def _driver(*args: str, timeout: float) -> dict[str, Any]:
    r = subprocess.run([sys.executable, str(DRIVER), *args], capture_output=True, text=True,
                       timeout=timeout, env=_podman_env(), cwd=ROOT)
    assert r.returncode == 0, f"kube_play.py {' '.join(args)} failed:\n{r.stderr[-6000:]}"
    return json.loads(r.stdout)


def _hold_play_lock(request: pytest.FixtureRequest) -> None:
    _PLAY_LOCK.touch(exist_ok=True)
    lock = open(_PLAY_LOCK, "a")  # noqa: SIM115 - held until the requester's teardown
    fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
    request.addfinalizer(lock.close)


def test_a_failed_up_leaves_nothing_behind(request: pytest.FixtureRequest,
                                           tmp_path: Path) -> None:
    """A pod that cannot start (here: its image does not exist) fails ``up`` with podman's
    reason, and the driver removes what it had made: no pod, secret or network of the
    release stays to collide with the next ``up``."""
    _image()                      # the same skips as the played variants
    _hold_play_lock(request)
    net = f"kp-{NAMESPACE}-failed"
    r = subprocess.run([sys.executable, str(DRIVER), "--workdir", str(tmp_path / "w"),
                        "--image", "localhost/fortis-no-such-image:0", "--release", RELEASE,
                        "--namespace", NAMESPACE, "--network", net],
                       capture_output=True, text=True, timeout=300, env=_podman_env(), cwd=ROOT)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "fortis-no-such-image" in r.stderr, r.stderr[-3000:]
    pods = _podman("pod", "ls", "--format", "{{.Name}}").split()
    assert not [p for p in pods if p.startswith(RELEASE + "-")], pods
    assert subprocess.run(["podman", "network", "exists", net], env=_podman_env(),
                          capture_output=True, timeout=60).returncode != 0
    secrets = _podman("secret", "ls", "--format", "{{.Name}}").split()
    assert not [s for s in secrets if s.startswith(NAMESPACE + ".")], secrets
    assert not (tmp_path / "w" / "state.json").exists()


@pytest.fixture(scope="module", params=["mtls", "plain"])
def played(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """The tenant's pods, up and ready: ``mtls`` with secrets.tls and clientAuth require
    (the probes are then exec ``fortis health`` with the pod's certificate), ``plain``
    without TLS (the probes are Kubernetes' gRPC probes) and with evaluation.persistence
    (the PersistentVolumeClaim's stand-in, a named volume)."""
    image = _image()
    workdir = tmp_path_factory.mktemp(f"kube-play-{request.param}")
    tls = "require" if request.param == "mtls" else "off"
    extra: list[str] = []
    if request.param == "plain":
        # the evaluation's SQLite state on the chart's PersistentVolumeClaim (a named volume)
        values = workdir / "values.yaml"
        values.write_text("evaluation: {persistence: {enabled: true}}\n")
        extra = ["--values", str(values)]
        subprocess.run(["podman", "volume", "rm", "-f", CLAIM], capture_output=True,
                       env=_podman_env(), timeout=60)
    # the pods', network's and secrets' names are the host's: another session playing the
    # same release (a second checkout's tests, a CI run on this machine) waits for this one
    _hold_play_lock(request)
    t0 = time.monotonic()
    up = _driver("--workdir", str(workdir), "--tls", tls, "--image", image, *extra,
                 "--release", RELEASE, "--namespace", NAMESPACE, "--helm-test", timeout=600)
    up["up_s"] = round(time.monotonic() - t0, 1)
    up["workdir"] = str(workdir)
    up["variant"] = request.param
    print(f"\nkube_play up ({request.param}): "
          f"{json.dumps({k: up[k] for k in ('up_s', 'times_s')})}")
    yield up
    _driver("--down", "--workdir", str(workdir), timeout=300)
    if request.param == "plain":       # --down keeps a claim's volume, as a PVC outlives pods
        subprocess.run(["podman", "volume", "rm", "-f", CLAIM], capture_output=True,
                       env=_podman_env(), timeout=60)


def _pem(up: dict[str, Any], name: str) -> bytes:
    return Path(up["pki"][name]).read_bytes()


def _channel(up: dict[str, Any], service: str, *, client_cert: bool = True) -> grpc.Channel:
    """A channel to one service's pod from outside; with TLS it verifies the certificate's
    Service name (the pod is dialled at its address, as a client of the headless Service)."""
    svc = up["services"][f"{RELEASE}-{service}"]
    address = f"{svc['ips'][0]}:50051"
    if up["variant"] == "plain":
        return grpc.insecure_channel(address)
    creds = grpc.ssl_channel_credentials(
        _pem(up, "ca.crt"), *((_pem(up, "client.key"), _pem(up, "client.crt"))
                              if client_cert else (None, None)))
    return grpc.secure_channel(address, creds,
                               options=[("grpc.ssl_target_name_override", svc["names"][0])])


def _metric(ip: str, method: str) -> float:
    """A pod's count of OK calls of one RPC, from its Prometheus endpoint (port 9090)."""
    import urllib.request

    text = urllib.request.urlopen(f"http://{ip}:9090/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("fortis_rpc_requests_total{")
               and f'method="{method}"' in line and 'code="OK"' in line)


def _podman(*args: str) -> str:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=True,
                          env=_podman_env(), timeout=60).stdout


def test_every_pod_runs_the_rendered_spec_restricted(played) -> None:
    """Every Deployment's replicas run with the chart's args ($(VAR) expanded from the
    ConfigMap), its env from the ConfigMap and Secrets, its mounts, uid 10001, a read-only
    root, no capabilities and no-new-privileges; each passed its startup and readiness probe."""
    pods = played["pods"]
    comps = sorted(n.rsplit("-", 1)[0].removeprefix(f"{RELEASE}-") for n in pods)
    assert comps == ["evaluation", "perturbation", "perturbation", "proxy", "report",
                     "scoring"]                                 # perturbation: 2 replicas
    for name, p in pods.items():
        assert p["ready_s"] >= p["started_s"] >= 0, name
        c = json.loads(_podman("inspect", p["container"]))[0]
        args = c["Config"]["Cmd"] or []
        assert args[0] == "serve" and not [a for a in args if "$(" in a], args
        assert "--max-calls-per-tenant=16" in args
        assert ("--tls-client-auth=require" in args) == (played["variant"] == "mtls"), args
        if name.startswith(EVALUATION):
            assert (f"--proxy-address=dns:///{RELEASE}-proxy.{NAMESPACE}.svc.cluster.local"
                    ":50051") in args
        assert c["HostConfig"]["ReadonlyRootfs"] is True, name
        assert "no-new-privileges" in c["HostConfig"]["SecurityOpt"], name
        mounts = {m["Destination"] for m in c["Mounts"]}
        assert {"/tmp", "/var/lib/fortis", "/var/cache/fortis", "/var/cache/fortis/models",
                "/etc/fortis/api-keys"} <= mounts, (name, mounts)
        assert ("/etc/fortis/tls" in mounts) == (played["variant"] == "mtls"), mounts
        state, = [m for m in c["Mounts"] if m["Destination"] == "/var/lib/fortis"]
        # each pod's own emptyDir; the plain variant's evaluation state on the claim's volume
        assert state["Name"] == (CLAIM if played["variant"] == "plain"
                                 and name.startswith(EVALUATION) else f"{name}-state"), state
        inside = _podman("exec", p["container"], "sh", "-c",
                         "id -u; grep CapEff /proc/1/status; "
                         "test -n \"$FORTIS_INTERNAL_KEY\" && echo internal-key; "
                         "echo $FORTIS_EVALUATION_WORKERS $POD_NAMESPACE; "
                         "touch /opt/x 2>/dev/null || echo read-only; "
                         "getent hosts " f"{RELEASE}-perturbation.{NAMESPACE}.svc.cluster.local")
        lines = inside.split("\n")
        assert lines[0] == "10001" and lines[1].split()[1] == "0000000000000000", inside
        assert lines[2] == "internal-key" and lines[3] == f"2 {NAMESPACE}", inside
        assert lines[4] == "read-only", inside
        # the headless Service's name gives every perturbation replica's address
        assert set(played["services"][f"{RELEASE}-perturbation"]["ips"]) <= set(inside.split())


def test_helm_test_pod_passes(played) -> None:
    """The chart's ``helm test`` pod: ``fortis health`` of every Service by its DNS name
    (over mTLS in the mtls variant), one container each, all exit 0."""
    (name, result), = played["helm_test"].items()
    assert result["passed"], result
    assert len(result["exit_codes"]) == 5


def test_a_plan_completes_through_the_pods(played) -> None:
    """From outside the pods: CreateEvaluation of a small Fashion-MNIST plan with the
    tenant's API key (over mTLS in the mtls variant), SUCCEEDED, the report fetched. The
    evaluation pod called the perturbation, proxy, scoring and report pods at their Service
    names: the proxy's ledger holds the 6 clean and 6 corrupted queries, and the calls to the
    perturbation Service reached both of its replicas (its name gives both addresses, the
    services' channels use round_robin)."""
    from fortis.evaluation.v1 import evaluation_pb2 as ev
    from fortis.evaluation.v1 import evaluation_pb2_grpc as ev_grpc

    md = (("x-api-key", played["api_key"]),)
    replicas = played["services"][f"{RELEASE}-perturbation"]["ips"]
    apply = "/fortis.perturbation.v1.PerturbationService/ApplyPerturbation"
    with _channel(played, "evaluation") as ch:
        stub = ev_grpc.EvaluationServiceStub(ch)

        def run() -> tuple[Any, Any, float]:
            t0 = time.monotonic()
            created = stub.CreateEvaluation(ev.CreateEvaluationRequest(plan=PLAN),
                                            metadata=md, timeout=60).evaluation
            assert created.tenant == NAMESPACE
            e = created
            while e.state in (ev.EVALUATION_STATE_PENDING, ev.EVALUATION_STATE_RUNNING):
                assert time.monotonic() - t0 < 300, e
                time.sleep(0.5)
                e = stub.GetEvaluation(ev.GetEvaluationRequest(
                    evaluation_id=created.evaluation_id), metadata=md, timeout=30).evaluation
            assert e.state == ev.EVALUATION_STATE_SUCCEEDED, e.error
            report = stub.GetEvaluationReport(
                ev.GetEvaluationReportRequest(evaluation_id=e.evaluation_id), metadata=md,
                timeout=60)
            return e, report, time.monotonic() - t0

        e, report, took = run()
        print(f"\nplan through the pods ({played['variant']}): {took:.1f} s")
        assert e.summary.m == 6 and e.summary.HasField("accuracy")
        rep = json.loads(report.report_json)
        assert rep["evaluation"]["id"] == e.evaluation_id and rep["evaluation"]["images"] == 6
        assert [t["id"] for t in rep["tests"]] == ["gaussian_noise"]
        assert rep["ledger"]["total_queries"] == 12           # answered by the proxy pod
        assert report.report_html.lstrip().lower().startswith("<!doctype html")
        # a second evaluation when the first one's perturbation calls all went to one replica
        # (a replica not yet connected is skipped by round_robin)
        for _ in range(3):
            if all(_metric(ip, apply) >= 1 for ip in replicas):
                break
            run()
    assert len(replicas) == 2 and all(_metric(ip, apply) >= 1 for ip in replicas), \
        {ip: _metric(ip, apply) for ip in replicas}


def test_without_a_client_certificate_the_pods_refuse(played) -> None:
    """clientAuth require: a caller trusting the CA but presenting no certificate fails the
    handshake (UNAVAILABLE), at the evaluation pod and at the proxy pod."""
    if played["variant"] != "mtls":
        pytest.skip("the plain variant has no TLS")
    from fortis.evaluation.v1 import evaluation_pb2 as ev
    from fortis.evaluation.v1 import evaluation_pb2_grpc as ev_grpc
    from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc

    with _channel(played, "evaluation", client_cert=False) as ch:
        with pytest.raises(grpc.RpcError) as info:
            ev_grpc.EvaluationServiceStub(ch).ListEvaluations(
                ev.ListEvaluationsRequest(), metadata=(("x-api-key", played["api_key"]),),
                timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    with _channel(played, "proxy", client_cert=False) as ch:
        with pytest.raises(grpc.RpcError) as info:
            proxy_pb2_grpc.TargetProxyServiceStub(ch).ListTargets(
                proxy_pb2.ListTargetsRequest(), metadata=(("x-api-key", played["api_key"]),),
                timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_api_key_is_what_the_secret_holds(played) -> None:
    """The proxy pod answers the tenant whose key the driver put in the API-keys Secret (the
    ``fortis keys new`` line, mounted as a file) and refuses a call without it."""
    from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc

    with _channel(played, "proxy") as ch:
        stub = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        names = [t.name for t in stub.ListTargets(
            proxy_pb2.ListTargetsRequest(), metadata=(("x-api-key", played["api_key"]),),
            timeout=10).targets]
        assert names == ["fmnist-cnn"]
        with pytest.raises(grpc.RpcError) as info:
            stub.ListTargets(proxy_pb2.ListTargetsRequest(), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_down_stops_every_pod_with_sigterm(played) -> None:
    """``--down``: every pod gets SIGTERM at once and its terminationGracePeriodSeconds (the
    chart's shutdownGraceSeconds 3 + 8) before SIGKILL; every service exits by itself,
    status 0, within about grace + 3 s, well before it."""
    out = _driver("--down", "--workdir", played["workdir"], timeout=300)
    served = {n: s for n, s in out["stopped"].items() if "test-health" not in n}
    assert set(served) == set(played["pods"])
    print("\nseconds from SIGTERM to exit: " + json.dumps(
        {n: list(s["seconds_after_sigterm"].values())[0] for n, s in served.items()}))
    for name, s in served.items():
        assert list(s["exit_codes"].values()) == [0], (name, s)
        assert s["grace_s"] == 3 + 8, (name, s)
        took, = s["seconds_after_sigterm"].values()
        assert took is not None and took < s["grace_s"], (name, s)     # not SIGKILLed
