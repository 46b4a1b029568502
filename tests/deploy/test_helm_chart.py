"""The Helm chart per tenant namespace (SPEC's multi-tenancy and deployment requirements):
rendered offline with Helm's own Go SDK (``helm-python-sdk``, dev extra), linted, and every
rendered object validated with ``kubernetes-validate --strict`` against the Kubernetes 1.30
schemas. Then the objects are checked for what a platform team asks of a tenant's install:
default-deny NetworkPolicy, namespaced RBAC only, no cluster-scoped kinds, restricted containers
with probes and resources, proxy replicas >= 2 with a PodDisruptionBudget, the migration hook,
two tenants side by side without clashing names, and values.schema.json refusing bad values.

No cluster exists here, so nothing is applied; instead the rendered Deployments' arguments
(after Kubernetes' ``$(VAR)`` expansion from the rendered ConfigMap) are given to the real
``fortis serve`` of every service, wired on loopback, and each must answer its gRPC health
check: the chart's command lines are ones the CLI accepts.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

try:
    import helm_python as helm  # dev extra: helm-python-sdk==0.2.2
except ImportError as exc:  # pragma: no cover - the dev extra installs it
    raise ImportError("helm-python-sdk is missing: pip install -e '.[dev]' "
                      "(helm-python-sdk==0.2.2)") from exc
import kubernetes_validate  # dev extra

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "fortis"
SERVICES = ("evaluation", "perturbation", "proxy", "scoring", "report")
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "PersistentVolume", "StorageClass", "PriorityClass", "ValidatingWebhookConfiguration",
                  "MutatingWebhookConfiguration", "APIService", "IngressClass", "RuntimeClass"}


def tenant_values(tenant: str) -> dict[str, Any]:
    """A production-shaped tenant: PostgreSQL, Redis, one external target, TLS off."""
    return {
        "secrets": {"apiKeys": {"existingSecret": f"{tenant}-api-keys"},
                    "internalKey": {"existingSecret": f"{tenant}-internal-key"},
                    "database": {"existingSecret": f"{tenant}-database"},
                    "redis": {"existingSecret": f"{tenant}-redis"}},
        "targets": [{"name": "classifier", "address": "classifier.models.svc.cluster.local:9000",
                     "rate": 50, "tenants": [tenant],
                     "networkPolicyTo": [{"namespaceSelector": {"matchLabels": {
                         "kubernetes.io/metadata.name": "models"}}}]}],
        "limits": {"tenantRates": {tenant: 20}, "tenantQuotas": {tenant: "running:2,queued:5"}},
        "networkPolicy": {
            "clients": [{"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": f"{tenant}-ci"}}}],
            "database": {"to": [{"ipBlock": {"cidr": "10.10.0.5/32"}}]},
            "redis": {"to": [{"ipBlock": {"cidr": "10.10.0.6/32"}}]}},
        "perturbation": {"autoscaling": {"enabled": True}},
    }


def render(values: dict[str, Any], *, name: str = "fortis-team-a",
           namespace: str = "team-a", hooks: bool = True) -> list[dict[str, Any]]:
    out = helm.Chart.load(CHART).render(values, name=name, namespace=namespace, is_install=True)
    objs = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt") or (not hooks and "/tests/" in path):
            continue
        objs += [o for o in yaml.safe_load_all(text) if o]
    return objs


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def pod_specs(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    specs = []
    for o in objs:
        if o["kind"] in ("Deployment", "Job"):
            specs.append((o["metadata"]["name"], o["spec"]["template"]["spec"]))
        elif o["kind"] == "Pod":
            specs.append((o["metadata"]["name"], o["spec"]))
    return specs


@pytest.fixture(scope="module")
def objs() -> list[dict[str, Any]]:
    return render(tenant_values("team-a"))


@pytest.mark.parametrize("values", ["tenant", "identity"])
def test_lint_is_clean(values):
    made = tenant_values if values == "tenant" else identity_values
    report = helm.lint(CHART, made("team-a"), strict=True, namespace="team-a",
                       kube_version="v1.30.0")
    # severity: 1 info, 2 warning, 3 error (Helm's lint levels)
    bad = [m for m in report["messages"] if m["severity"] >= 2]
    assert not bad and not report["errors"], report


def test_every_object_validates_strictly_against_kubernetes_1_30(objs):
    kinds = set()
    for o in objs:
        kubernetes_validate.validate(o, "1.30.0", strict=True)     # raises on any error
        kinds.add(o["kind"])
    assert {"Deployment", "Service", "ConfigMap", "ServiceAccount", "Role", "RoleBinding",
            "NetworkPolicy", "PodDisruptionBudget", "HorizontalPodAutoscaler", "Job",
            "Pod"} <= kinds


def test_the_validator_rejects_what_it_should(objs):
    """kubernetes-validate really checks: an unknown field in a Deployment is refused."""
    bad = copy.deepcopy(by_kind(objs, "Deployment")[0])
    bad["spec"]["template"]["spec"]["containers"][0]["runAsRoot"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.30.0", strict=True)


def test_no_cluster_scoped_objects_and_all_in_the_release_namespace(objs):
    assert not [o["kind"] for o in objs if o["kind"] in CLUSTER_SCOPED]
    assert {o["metadata"]["namespace"] for o in objs} == {"team-a"}
    role, = by_kind(objs, "Role")
    resources = {(g, r) for rule in role["rules"] for g in rule["apiGroups"]
                 for r in rule["resources"]}
    assert resources <= {("batch", "jobs"), ("batch", "jobs/status"), ("", "pods"),
                         ("", "pods/log")}
    assert ("batch", "jobs") in resources and ("", "pods") in resources
    binding, = by_kind(objs, "RoleBinding")
    assert binding["roleRef"]["kind"] == "Role"
    assert [s["namespace"] for s in binding["subjects"]] == ["team-a"]


def test_network_policy_default_deny_and_narrow_egress(objs):
    pols = {p["metadata"]["name"]: p["spec"] for p in by_kind(objs, "NetworkPolicy")}
    deny = pols["fortis-team-a-default-deny"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny and "egress" not in deny
    svc = pols["fortis-team-a-services"]
    ports = {(p["port"], p.get("protocol")) for rule in svc["egress"] for p in rule["ports"]}
    # the release's services, DNS, PostgreSQL, Redis and the target's port: nothing else
    assert ports == {(50051, "TCP"), (53, "UDP"), (53, "TCP"), (5432, "TCP"), (6379, "TCP"),
                     (9000, "TCP")}
    assert all(rule.get("to") for rule in svc["egress"])       # no rule open to everywhere
    peers = [p for rule in svc["ingress"] for p in rule["from"]]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-a-ci"}}} \
        in peers


def test_containers_are_restricted_with_probes_and_resources(objs):
    specs = pod_specs(objs)
    assert len(specs) == 7          # 5 services, the migration Job, the helm test pod
    for name, spec in specs:
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0, name
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert sc["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert sc["capabilities"] == {"drop": ["ALL"]}, (name, c["name"])
            assert c["resources"]["requests"] and c["resources"]["limits"], (name, c["name"])
            mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
            assert "/tmp" in mounts, (name, c["name"])         # writable scratch only on volumes
    for d in by_kind(objs, "Deployment"):
        spec = d["spec"]["template"]["spec"]
        c, = spec["containers"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["grpc"] == {"port": 50051}, (d["metadata"]["name"], probe)
        grace = int(next(a for a in c["args"] if a.startswith("--shutdown-grace="))
                    .split("=")[1])
        # fortis serve ends within about grace + 3 s; Kubernetes must not SIGKILL before
        assert spec["terminationGracePeriodSeconds"] >= grace + 3
        assert {"/var/lib/fortis", "/var/cache/fortis"} <= {
            m["mountPath"] for m in c["volumeMounts"]}
        # only the evaluation service with executor kubernetes needs an API token
        assert spec["automountServiceAccountToken"] is False


def test_proxy_replicas_pdb_and_headless_services(objs):
    deps = {d["metadata"]["name"]: d for d in by_kind(objs, "Deployment")}
    assert set(deps) == {f"fortis-team-a-{s}" for s in SERVICES}
    assert deps["fortis-team-a-proxy"]["spec"]["replicas"] >= 2
    assert "replicas" not in deps["fortis-team-a-perturbation"]["spec"]     # the HPA owns it
    pdb, = by_kind(objs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == \
        deps["fortis-team-a-proxy"]["spec"]["selector"]["matchLabels"]
    assert 1 <= pdb["spec"]["minAvailable"] < deps["fortis-team-a-proxy"]["spec"]["replicas"]
    for s in by_kind(objs, "Service"):
        assert s["spec"]["clusterIP"] == "None", s["metadata"]["name"]
    args = deps["fortis-team-a-evaluation"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--proxy-address=dns:///fortis-team-a-proxy.team-a.svc.cluster.local:50051" in args
    # the proxy's secrets come from existing secrets, never values in the manifest
    env = {e["name"]: e for e in
           deps["fortis-team-a-proxy"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["FORTIS_REDIS_URL"]["valueFrom"]["secretKeyRef"]["name"] == "team-a-redis"
    assert env["FORTIS_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "team-a-database"
    # uploads live in PostgreSQL (pods share no disk): the perturbation pods read neural_style
    # models there, so they get the database too; scoring and report do not
    for svc, wanted in (("perturbation", True), ("scoring", False), ("report", False)):
        names = {e["name"] for e in
                 deps[f"fortis-team-a-{svc}"]["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert ("FORTIS_DATABASE_URL" in names) == wanted, svc


def test_migration_hook_job(objs):
    job, = by_kind(objs, "Job")
    ann = job["metadata"]["annotations"]
    assert set(ann["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    assert "before-hook-creation" in ann["helm.sh/hook-delete-policy"]
    c, = job["spec"]["template"]["spec"]["containers"]
    assert c["args"] == ["db", "upgrade"]
    assert c["env"][0]["name"] == "FORTIS_DATABASE_URL"
    assert c["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "team-a-database"
    # without a database there is nothing to migrate: no hook
    v = tenant_values("team-a")
    del v["secrets"]["database"], v["secrets"]["redis"]
    v["proxy"] = {"replicas": 1}
    assert not by_kind(render(v), "Job")


def test_helm_test_pod_checks_every_service(objs):
    pod, = by_kind(objs, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    addrs = sorted(next(a for a in c["args"] if a.startswith("--address="))
                   for c in pod["spec"]["containers"])
    assert addrs == sorted(f"--address=dns:///fortis-team-a-{s}.team-a.svc.cluster.local:50051"
                           for s in SERVICES)
    assert all(c["args"][0] == "health" for c in pod["spec"]["containers"])


def test_two_tenants_side_by_side_do_not_clash():
    a = render(tenant_values("team-a"), name="fortis-team-a", namespace="team-a")
    b = render(tenant_values("team-b"), name="fortis-team-b", namespace="team-b")
    ids_a = {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]) for o in a}
    ids_b = {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]) for o in b}
    assert len(ids_a) == len(a) and len(ids_b) == len(b)        # no duplicate inside a release
    assert not ids_a & ids_b
    # names too, so that even one namespace could hold both releases
    names_a = {(k, n) for k, _, n in ids_a}
    assert not names_a & {(k, n) for k, _, n in ids_b}
    # each release's Service selectors select only its own pods
    for objs, rel in ((a, "fortis-team-a"), (b, "fortis-team-b")):
        for s in by_kind(objs, "Service"):
            assert s["spec"]["selector"]["app.kubernetes.io/instance"] == rel


@pytest.mark.parametrize("patch,setting", [
    ({"proxy": {"replicas": -1}}, "replicas"),
    ({"grpcPort": 70000}, "grpcPort"),
    ({"evaluation": {"executor": "ray"}}, "executor"),
    ({"secrets": {"tls": {"clientAuth": "maybe"}}}, "clientAuth"),
    ({"targets": [{"name": "Bad Name", "address": "x:1"}]}, "name"),
])
def test_values_schema_rejects_bad_values(patch, setting):
    chart = helm.Chart.load(CHART)
    chart.validate_schema(tenant_values("team-a"))              # the good values pass
    bad = _merge(tenant_values("team-a"), patch)
    with pytest.raises(helm.HelmError) as info:
        chart.validate_schema(bad)
    assert setting in str(info.value)
    with pytest.raises(helm.HelmError):
        chart.render(bad, name="fortis-team-a", namespace="team-a")


@pytest.mark.parametrize("patch,message", [
    ({"secrets": {"apiKeys": {"existingSecret": ""}}}, "secrets.apiKeys.existingSecret"),
    ({"secrets": {"redis": {"existingSecret": ""}}}, "proxy.replicas > 1 needs secrets.redis"),
    ({"networkPolicy": {"database": {"to": []}}}, "networkPolicy.database.to"),
    ({"evaluation": {"executor": "kubernetes"}}, "networkPolicy.kubernetesApi.to"),
])
def test_settings_that_cannot_work_fail_naming_the_setting(patch, message):
    with pytest.raises(helm.HelmError) as info:
        render(_merge(tenant_values("team-a"), patch))
    assert message in str(info.value)


def test_executor_kubernetes_wires_jobs_and_the_api_token():
    v = _merge(tenant_values("team-a"), {
        "evaluation": {"executor": "kubernetes", "jobs": {"shards": 4}},
        "networkPolicy": {"kubernetesApi": {"to": [{"ipBlock": {"cidr": "10.96.0.1/32"}}]}}})
    objs = render(v)
    for o in objs:
        kubernetes_validate.validate(o, "1.30.0", strict=True)
    ev, = [d for d in by_kind(objs, "Deployment") if d["metadata"]["name"].endswith("-evaluation")]
    spec = ev["spec"]["template"]["spec"]
    args = spec["containers"][0]["args"]
    assert spec["automountServiceAccountToken"] is True
    assert "--executor=kubernetes" in args and "--job-shards=4" in args
    assert "--job-service-account=fortis-team-a-worker" in args
    assert "--job-secret-env=FORTIS_DATABASE_URL=team-a-database:url" in args
    assert "--job-secret-env=FORTIS_INTERNAL_KEY=team-a-internal-key:internal-key" in args
    assert not [a for a in args if a.startswith("--job-tls-secret")]     # no TLS: none
    sas = {s["metadata"]["name"] for s in by_kind(objs, "ServiceAccount")}
    assert {"fortis-team-a", "fortis-team-a-worker"} <= sas
    # the Role is bound to the evaluation's account, not the workers'
    binding, = by_kind(objs, "RoleBinding")
    assert [s["name"] for s in binding["subjects"]] == [spec["serviceAccountName"]]


def test_tls_with_executor_kubernetes_gives_the_worker_pods_the_secret(monkeypatch):
    """With secrets.tls the services listen with TLS only, so the evaluation
    service is told the Secret its worker Jobs' pods mount (--job-tls-secret); the command
    line is one ``fortis serve`` accepts, and it builds Jobs that mount it."""
    from fortis.server.cli.local import _executor_settings
    from fortis.server.cli.main import build_parser

    v = _merge(tenant_values("team-a"), {
        "secrets": {"tls": {"existingSecret": "team-a-tls", "clientAuth": "require",
                            "serverName": "fortis.internal"}},
        "evaluation": {"executor": "kubernetes"},
        "networkPolicy": {"kubernetesApi": {"to": [{"ipBlock": {"cidr": "10.96.0.1/32"}}]}}})
    objs = render(v)
    for o in objs:
        kubernetes_validate.validate(o, "1.30.0", strict=True)
    ev, = [d for d in by_kind(objs, "Deployment") if d["metadata"]["name"].endswith("-evaluation")]
    args = ev["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--job-tls-secret=team-a-tls" in args
    # the rendered arguments as fortis serve parses them in the pod ($(VAR) references left
    # out; $POD_NAMESPACE from the downward API, as the chart sets it)
    env = {e["name"]: e for e in ev["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    monkeypatch.setenv("POD_NAMESPACE", "team-a")
    ns = build_parser().parse_args([a for a in args if "$(" not in a])
    job = _executor_settings(ns)["job_settings"]
    assert (job.tls_secret, job.tls_server_name) == ("team-a-tls", "fortis.internal")


def test_tls_switches_probes_to_exec_health_checks():
    v = _merge(tenant_values("team-a"), {"secrets": {"tls": {"existingSecret": "team-a-tls",
                                                             "clientAuth": "require"}}})
    objs = render(v)
    for o in objs:
        kubernetes_validate.validate(o, "1.30.0", strict=True)
    for d in by_kind(objs, "Deployment"):
        c = d["spec"]["template"]["spec"]["containers"][0]
        assert "--tls-client-auth=require" in c["args"]
        cmd = c["readinessProbe"]["exec"]["command"]        # Kubernetes' grpc probe has no TLS
        assert cmd[:2] == ["fortis", "health"] and "--tls-cert=/etc/fortis/tls/tls.crt" in cmd


# -- the rendered command lines run: real fortis serve processes, one per service ---------

def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in patch.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of container args (undefined: left as written)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)),
                  arg)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _rendered_services(objs: list[dict[str, Any]], tmp_path: Path, key_lines: list[str],
                       services: tuple[str, ...] = SERVICES,
                       files: dict[str, str] | None = None) -> Iterator[dict[str, int]]:
    """Start ``fortis serve`` of each of ``services`` with its rendered Deployment's args,
    expanded from the rendered ConfigMap as Kubernetes would; the addresses the chart gives
    (cluster DNS names) are rewritten to loopback ports, the mounted files' paths to local
    ones (``files``: mount path -> local path). Yields each service's loopback port once
    every one answers the gRPC health check the probes and ``helm test`` use."""
    cm, = by_kind(objs, "ConfigMap")
    ports = {s: _free_port() for s in SERVICES}
    keys = tmp_path / "api-keys"
    keys.write_text("".join(line + "\n" for line in key_lines))  # the secret's file
    procs: dict[str, subprocess.Popen[bytes]] = {}
    env = {**os.environ, **cm["data"], "FORTIS_INTERNAL_KEY": "internal-test-key"}
    try:
        for d in by_kind(objs, "Deployment"):
            c = d["spec"]["template"]["spec"]["containers"][0]
            svc = c["name"]
            if svc not in services:
                continue
            args = []
            for a in c["args"]:
                a = _expand(a, cm["data"])
                assert "$(" not in a, a                     # every reference is defined
                a = a.replace("0.0.0.0:50051", f"127.0.0.1:{ports[svc]}")
                for other, p in ports.items():
                    a = a.replace(f"dns:///fortis-team-a-{other}.team-a.svc.cluster.local:50051",
                                  f"127.0.0.1:{p}")
                a = a.replace("/etc/fortis/api-keys/api-keys", str(keys))
                a = a.replace("/var/lib/fortis", str(tmp_path / svc))
                a = a.replace("0.0.0.0:9090", "127.0.0.1:0")   # any free port: no race
                for mount, local in (files or {}).items():
                    a = a.replace(mount, local)
                args.append(a)
            procs[svc] = subprocess.Popen([sys.executable, "-m", "fortis.server.cli", *args], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert set(procs) == set(services)
        deadline = time.monotonic() + 120
        for svc in services:
            p = ports[svc]
            while True:
                assert procs[svc].poll() is None, \
                    f"{svc} exited: {procs[svc].stdout.read().decode()[-2000:]}"  # type: ignore[union-attr]
                r = subprocess.run([sys.executable, "-m", "fortis.server.cli", "health", "--address",
                                    f"127.0.0.1:{p}", "--timeout", "2"],
                                   capture_output=True, text=True)
                if r.returncode == 0:
                    assert json.loads(r.stdout)["status"] == "SERVING"
                    break
                assert time.monotonic() < deadline, f"{svc} not SERVING: {r.stdout}"
                time.sleep(0.5)
        yield ports
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def _key_line(tenant: str) -> tuple[str, str]:
    """A new API key of ``tenant``: (the key, its key-file line), from ``fortis keys new``."""
    out = json.loads(subprocess.run(
        [sys.executable, "-m", "fortis.server.cli", "keys", "new", "--tenant", tenant, "--json"],
        capture_output=True, text=True, check=True).stdout)
    return out["api_key"], out["line"]


def test_rendered_command_lines_start_every_service(tmp_path: Path) -> None:
    """Each rendered Deployment's args, expanded from the rendered ConfigMap as Kubernetes
    would, start the real ``fortis serve --service NAME``; the services reach each other at
    the addresses the chart gives (rewritten from the cluster DNS names to loopback ports)
    and each answers the gRPC health check the probes and ``helm test`` use."""
    v = {"secrets": {"apiKeys": {"existingSecret": "k"}, "internalKey": {"existingSecret": "i"}},
         "proxy": {"replicas": 1},
         "targets": [{"name": "fmnist", "builtin": "fmnist-cnn", "rate": 100}],
         "limits": {"tenantRates": {"team-a": 20}, "tenantQuotas": {"team-a": "running:2"}},
         "shutdownGraceSeconds": 2}
    with _rendered_services(render(v), tmp_path, [_key_line("team-a")[1]]):
        pass


@pytest.mark.parametrize("tenant", ["team-a", "team-b"])
def test_the_readme_examples_render_and_validate(tenant: str) -> None:
    """deploy/examples/<tenant>.yaml, as docs/kubernetes.md installs them, in their namespaces."""
    values = yaml.safe_load((CHART.parents[1] / "examples" / f"{tenant}.yaml").read_text())
    helm.Chart.load(CHART).validate_schema(values)
    objs = render(values, name=f"fortis-{tenant}", namespace=tenant)
    for o in objs:
        kubernetes_validate.validate(o, "1.30.0", strict=True)
    assert {o["metadata"]["namespace"] for o in objs} == {tenant}


# -- identity (OIDC, the client certificate), white-box grants, memory limits ----------------

CORP = {"url": "https://login.corp.example/realms/ml", "audiences": ["fortis", "fortis-ci"],
        "tenantClaim": "tenant", "tenants": ["team-a", "team-b"],
        "networkPolicyTo": [{"ipBlock": {"cidr": "203.0.113.10/32"}}]}
#: the cluster's own service-account issuer: the documented Kubernetes example of values.yaml
K8S = {"url": "https://kubernetes.default.svc.cluster.local", "audiences": ["fortis"],
       "tenantClaim": "kubernetes.io.namespace", "tenantPrefix": "k8s-",
       "jwksUrl": "https://kubernetes.default.svc/openid/v1/jwks",
       "caConfigMap": "kube-root-ca.crt", "algorithms": ["RS256"], "leewaySeconds": 10,
       "networkPolicyTo": [{"ipBlock": {"cidr": "10.0.0.10/32"}}], "networkPolicyPort": 6443}
SPIFFE = "SAN-URI=spiffe://corp.example/tenant/"


def identity_values(tenant: str) -> dict[str, Any]:
    return _merge(tenant_values(tenant), {
        "secrets": {"tls": {"existingSecret": f"{tenant}-tls", "clientAuth": "require"}},
        "identity": {"oidc": {"issuers": [CORP, K8S]}, "tlsTenantFrom": SPIFFE},
        "whiteboxGrants": [{"tenant": tenant, "target": "classifier"},
                           {"tenant": "red-team", "target": "*"}],
        "limits": {"maxRequestDecodedBytes": 64 * 2 ** 20,
                   "maxTenantDecodedBytes": 512 * 2 ** 20}})


def _serve_args(objs: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each service's container args, ``$(VAR)`` expanded from the rendered ConfigMap."""
    cm, = by_kind(objs, "ConfigMap")
    out = {}
    for d in by_kind(objs, "Deployment"):
        c = d["spec"]["template"]["spec"]["containers"][0]
        out[c["name"]] = [_expand(a, cm["data"]) for a in c["args"]]
    return out


def _parsed(args: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    from fortis.server.cli.main import build_parser
    for var in ("FORTIS_OIDC_ISSUER", "FORTIS_OIDC_AUDIENCE", "FORTIS_OIDC_TENANT_CLAIM",
                "FORTIS_OIDC_JWKS_URL", "FORTIS_OIDC_CA_FILE", "FORTIS_TLS_TENANT_FROM"):
        monkeypatch.delenv(var, raising=False)      # the flags alone, as rendered
    return build_parser().parse_args(args)


def test_defaults_add_no_identity_no_grants_and_the_cli_memory_limits(objs, monkeypatch):
    """Without the new values a release behaves as before: API keys only, no white-box
    grant, and the decoded-size limits ``fortis serve`` has by default."""
    from fortis.server.cli.local import _identity_options, _memory_limits
    from fortis.services.common import limits

    cm, = by_kind(objs, "ConfigMap")
    assert int(cm["data"]["FORTIS_MAX_REQUEST_DECODED_BYTES"]) == limits.MAX_REQUEST_DECODED_BYTES
    assert int(cm["data"]["FORTIS_MAX_TENANT_DECODED_BYTES"]) == limits.MAX_TENANT_DECODED_BYTES
    assert not [k for k in cm["data"] if k.startswith(("FORTIS_OIDC", "FORTIS_TLS_TENANT",
                                                       "FORTIS_WHITEBOX"))]
    for svc, args in _serve_args(objs).items():
        assert not [a for a in args if a.startswith(("--oidc", "--tls-tenant-from",
                                                     "--whitebox-grant"))], svc
        ns = _parsed(args, monkeypatch)
        assert _identity_options(ns) == ([], ""), svc
        mem = _memory_limits(ns)
        assert (mem.max_request_bytes, mem.max_tenant_bytes) == (
            limits.MAX_REQUEST_DECODED_BYTES, limits.MAX_TENANT_DECODED_BYTES), svc
    for d in by_kind(objs, "Deployment"):
        vols = {v["name"] for v in d["spec"]["template"]["spec"]["volumes"]}
        assert not [v for v in vols if v.startswith("oidc-ca")]


@pytest.mark.parametrize("limits,slots,rate", [
    ({}, None, 50),                                      # the CLI's defaults
    ({"workSlots": 3, "maxCallRatePerTenant": 20}, 3, 20),
    ({"workSlots": 0, "maxCallRatePerTenant": 0}, 0, 0)])  # sharing and the rate off
def test_work_slots_and_call_rate_render_into_every_service(monkeypatch, limits, slots,
                                                            rate) -> None:
    """Every service shares its own CPU between tenants and paces their calls: the rendered
    flags parse, in the real CLI, into the settings the server runs with."""
    from fortis.server.cli.local import _quota_settings, _work_slots

    values = tenant_values("team-a")
    values["limits"] = {**values.get("limits", {}), **limits}
    objs = render(values)
    for o in objs:
        kubernetes_validate.validate(o, "1.30.0", strict=True)
    for svc, args in _serve_args(objs).items():
        ns = _parsed(args, monkeypatch)
        assert _work_slots(ns) == slots, svc
        assert _quota_settings(ns).max_call_rate == rate, svc


def test_identity_grants_and_limits_render_into_the_services_that_use_them(monkeypatch):
    """Every service authenticates its own callers, so each gets the issuers, the
    certificate rule and the memory limits; only the perturbation service (the one that
    loads surrogates) gets the grants, with the targets as the proxy has them (a built-in
    model is a twin of the targets that serve it, by their names). The rendered flags are
    what the real CLI parses into the settings the server runs with."""
    from fortis.server.cli.local import _identity_options, _memory_limits
    from fortis.services.common.whitebox import parse_grants

    objs = render(identity_values("team-a"))
    for o in objs:
        kubernetes_validate.validate(o, "1.30.0", strict=True)
    ca_path = "/etc/fortis/oidc/1/ca.crt"
    for svc, args in _serve_args(objs).items():
        ns = _parsed(args, monkeypatch)
        issuers, tenant_from = _identity_options(ns)
        assert tenant_from == SPIFFE, svc
        corp, k8s = issuers
        assert (corp.issuer, corp.audiences, corp.tenant_claim, corp.jwks_url, corp.ca_file,
                corp.algorithms, corp.leeway_s) == (
            CORP["url"], ("fortis", "fortis-ci"), "tenant", "", None, ("RS256", "ES256"), 30.0)
        assert (k8s.issuer, k8s.audiences, k8s.tenant_claim, k8s.jwks_url, str(k8s.ca_file),
                k8s.algorithms, k8s.leeway_s) == (
            K8S["url"], ("fortis",), "kubernetes.io.namespace", K8S["jwksUrl"], ca_path,
            ("RS256",), 10.0)
        assert (corp.tenants, corp.tenant_prefix, k8s.tenants, k8s.tenant_prefix) == (
            ("team-a", "team-b"), "", (), "k8s-")
        mem = _memory_limits(ns)
        assert (mem.max_request_bytes, mem.max_tenant_bytes) == (64 * 2 ** 20, 512 * 2 ** 20)
        grants = parse_grants(ns.whitebox_grant or [])
        if svc == "perturbation":
            assert grants == {"team-a": frozenset({"classifier"}),
                              "red-team": frozenset({"*"})}
        else:
            assert grants == {}, svc
        # only the proxy has the targets; the perturbation service asks it for the twins
        assert bool(ns.target) == (svc == "proxy"), svc
    for d in by_kind(objs, "Deployment"):
        spec = d["spec"]["template"]["spec"]
        c, = spec["containers"]
        # the cluster's CA from the kube-root-ca.crt ConfigMap every namespace holds; the
        # pods still mount no service-account token
        assert {"name": "oidc-ca-1", "mountPath": "/etc/fortis/oidc/1", "readOnly": True} \
            in c["volumeMounts"]
        vol, = [v for v in spec["volumes"] if v["name"] == "oidc-ca-1"]
        assert vol["configMap"] == {"name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}]}
        assert spec["automountServiceAccountToken"] is False
    pols = {p["metadata"]["name"]: p["spec"] for p in by_kind(objs, "NetworkPolicy")}
    egress = pols["fortis-team-a-services"]["egress"]
    for iss, port in ((CORP, 443), (K8S, 6443)):
        assert {"to": iss["networkPolicyTo"], "ports": [{"port": port, "protocol": "TCP"}]} \
            in egress


@pytest.mark.parametrize("patch,setting", [
    # an issuer fetched over plain http could be answered by anyone on the path: its keys
    # would then sign tokens for any tenant
    ({"identity": {"oidc": {"issuers": [{**CORP, "url": "http://idp.example"}]}}}, "url"),
    ({"identity": {"oidc": {"issuers": [{**CORP, "jwksUrl": "http://idp.example/k"}]}}},
     "jwksUrl"),
    ({"identity": {"oidc": {"issuers": [{k: v for k, v in CORP.items() if k != "audiences"}]}}},
     "audiences"),
    ({"identity": {"oidc": {"issuers": [{**CORP, "audiences": []}]}}}, "audiences"),
    # tenant names are shared with keys: an issuer says which it may give, or keeps apart
    ({"identity": {"oidc": {"issuers": [{k: v for k, v in CORP.items() if k != "tenants"}]}}},
     "tenants"),
    ({"identity": {"oidc": {"issuers": [{**CORP, "tenants": ["a/b"]}]}}}, "tenants"),
    ({"identity": {"oidc": {"issuers": [{**K8S, "tenantPrefix": "k8s-,x=y"}]}}}, "tenantPrefix"),
    ({"identity": {"oidc": {"issuers": [{**CORP, "algorithms": ["HS256"]}]}}}, "algorithms"),
    ({"identity": {"oidc": {"issuers": [{**CORP, "leewaySeconds": 3600}]}}}, "leewaySeconds"),
    # one flag holds an issuer's options separated by commas: a value with a comma would
    # smuggle in another option (here its own JWKS)
    ({"identity": {"oidc": {"issuers": [
        {**CORP, "url": "https://idp.example,jwks-url=https://evil.example/k"}]}}}, "url"),
    ({"identity": {"oidc": {"issuers": [
        {**CORP, "audiences": ["fortis,jwks-url=https://evil.example/k"]}]}}}, "audiences"),
    ({"identity": {"oidc": {"issuers": [
        {**CORP, "tenantClaim": "tenant,jwks-url=https://evil.example/k"}]}}}, "tenantClaim"),
    ({"identity": {"oidc": {"issuers": [{**CORP, "tenant": "x"}]}}}, "tenant"),
    ({"identity": {"tlsTenantFrom": "CN=alice"}}, "tlsTenantFrom"),
    ({"identity": {"tlsTenantFrom": "email"}}, "tlsTenantFrom"),
    ({"whiteboxGrants": [{"tenant": "team-a"}]}, "target"),
    ({"whiteboxGrants": [{"tenant": "team a", "target": "classifier"}]}, "tenant"),
    ({"whiteboxGrants": [{"tenant": "team-a=red-team", "target": "classifier"}]}, "tenant"),
    ({"whiteboxGrants": [{"tenant": "team-a", "target": "classifier,other"}]}, "target"),
    ({"limits": {"maxRequestDecodedBytes": -1}}, "maxRequestDecodedBytes"),
    ({"limits": {"maxTenantDecodedBytes": "256Mi"}}, "maxTenantDecodedBytes"),
    ({"limits": {"workSlots": -1}}, "workSlots"),
    ({"limits": {"workSlots": "auto"}}, "workSlots"),
    ({"limits": {"maxCallRatePerTenant": -1}}, "maxCallRatePerTenant"),
])
def test_values_schema_rejects_bad_identity_grant_and_memory_values(patch, setting):
    chart = helm.Chart.load(CHART)
    chart.validate_schema(identity_values("team-a"))            # the good values pass
    bad = _merge(identity_values("team-a"), patch)
    with pytest.raises(helm.HelmError) as info:
        chart.validate_schema(bad)
    assert setting in str(info.value)
    with pytest.raises(helm.HelmError):
        chart.render(bad, name="fortis-team-a", namespace="team-a")


@pytest.mark.parametrize("patch,message", [
    ({"secrets": {"tls": {"existingSecret": ""}}},
     "identity.tlsTenantFrom needs secrets.tls.existingSecret"),
    ({"secrets": {"tls": {"clientAuth": "none"}}},
     "identity.tlsTenantFrom needs secrets.tls.clientAuth: require"),
    ({"whiteboxGrants": [{"tenant": "team-a", "target": "clasifier"}]},
     "target 'clasifier', which is not in targets"),
    ({"identity": {"oidc": {"issuers": [{k: v for k, v in CORP.items()
                                         if k != "networkPolicyTo"}]}}},
     "identity.oidc.issuers[https://login.corp.example/realms/ml].networkPolicyTo is required"),
])
def test_identity_and_grant_settings_that_cannot_work_fail_naming_the_setting(patch, message):
    with pytest.raises(helm.HelmError) as info:
        render(_merge(identity_values("team-a"), patch))
    assert message in str(info.value)


@contextlib.contextmanager
def _https_jwks(tmp_path: Path, jwks: dict[str, Any]) -> Iterator[tuple[str, Path]]:
    """A JWKS over HTTPS on loopback (a CA and a certificate for 127.0.0.1 made here):
    yields its URL and the CA file a ``caConfigMap`` would hold."""
    import datetime as dt
    import http.server
    import ipaddress
    import ssl
    import threading

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "idp test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "idp")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(ca_key, hashes.SHA256()))
    ca_file, cert_file, key_file = (tmp_path / n for n in ("idp-ca.crt", "idp.crt", "idp.key"))
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    body = json.dumps(jwks).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200 if self.path == "/jwks" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert_file, key_file)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/jwks", ca_file
    finally:
        server.shutdown()
        server.server_close()


def test_rendered_identity_grants_and_limits_hold_in_real_services(tmp_path: Path) -> None:
    """The proxy and perturbation services started from what the chart renders for an
    OIDC issuer (its JWKS over HTTPS, its CA from a ``caConfigMap``), a white-box grant and
    a small request memory limit, called with generated stubs as any client would:

    - the grant names the target as the operator sees it (``fmnist``, serving the built-in
      ``fmnist-cnn``): the granted tenant may craft on the ``fmnist-cnn`` surrogate, another
      tenant is PERMISSION_DENIED naming ``surrogate`` (the perturbation pod knows which
      target serves which model because the chart gives it the targets too);
    - a bearer token of the issuer names its tenant at the proxy; one made for another
      audience is UNAUTHENTICATED;
    - a request declaring more decoded bytes than ``limits.maxRequestDecodedBytes`` is
      RESOURCE_EXHAUSTED with a QuotaFailure, before anything is decoded."""
    import grpc
    import jwt
    import numpy as np
    from cryptography.hazmat.primitives.asymmetric import rsa
    from fortis.common.v1 import common_pb2
    from fortis.perturbation.v1 import perturbation_pb2, perturbation_pb2_grpc
    from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status
    from jwt.algorithms import RSAAlgorithm

    signing = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = {**RSAAlgorithm.to_jwk(signing.public_key(), as_dict=True), "kid": "k1",
           "alg": "RS256", "use": "sig"}
    issuer = "https://login.corp.example/realms/ml"

    def token(aud: str) -> str:
        t = int(time.time())
        return jwt.encode({"iss": issuer, "aud": aud, "sub": "ci-bot", "tenant": "team-c",
                           "iat": t, "exp": t + 300}, signing, algorithm="RS256",
                          headers={"kid": "k1"})

    (key_a, line_a), (key_b, line_b) = _key_line("team-a"), _key_line("team-b")
    with _https_jwks(tmp_path, {"keys": [jwk]}) as (jwks_url, ca_file):
        v = {"secrets": {"apiKeys": {"existingSecret": "k"},
                         "internalKey": {"existingSecret": "i"}},
             "proxy": {"replicas": 1},
             "targets": [{"name": "fmnist", "builtin": "fmnist-cnn", "rate": 100}],
             "identity": {"oidc": {"issuers": [{
                 "url": issuer, "audiences": ["fortis"], "tenantClaim": "tenant",
                 "tenants": ["team-c"], "jwksUrl": jwks_url, "caConfigMap": "corp-idp-ca",
                 "networkPolicyTo": [{"ipBlock": {"cidr": "127.0.0.1/32"}}]}]}},
             "whiteboxGrants": [{"tenant": "team-a", "target": "fmnist"}],
             "limits": {"maxRequestDecodedBytes": 2 ** 20},
             "shutdownGraceSeconds": 2}
        objs = render(v)
        with _rendered_services(objs, tmp_path, [line_a, line_b], ("proxy", "perturbation"),
                                files={"/etc/fortis/oidc/0/ca.crt": str(ca_file)}) as ports:
            pt_ch = grpc.insecure_channel(f"127.0.0.1:{ports['perturbation']}")
            px_ch = grpc.insecure_channel(f"127.0.0.1:{ports['proxy']}")
            try:
                pt = perturbation_pb2_grpc.PerturbationServiceStub(pt_ch)
                va = perturbation_pb2.ValidateAttackRequest(attack_id="fgsm",
                                                            surrogate="fmnist-cnn")
                va.params.update({"epsilon": 0.1})
                pt.ValidateAttack(va, metadata=(("x-api-key", key_a),), timeout=60)
                with pytest.raises(grpc.RpcError) as denied:
                    pt.ValidateAttack(va, metadata=(("x-api-key", key_b),), timeout=60)
                assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
                st = rpc_status.from_call(denied.value)
                assert st is not None
                fields = []
                for d in st.details:
                    if d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                        br = error_details_pb2.BadRequest()
                        d.Unpack(br)
                        fields += [fv.field for fv in br.field_violations]
                assert fields == ["surrogate"], (fields, denied.value.details())
                assert "fmnist" not in denied.value.details().replace("'fmnist-cnn'", "")

                px = proxy_pb2_grpc.TargetProxyServiceStub(px_ch)
                bearer = (("authorization", f"Bearer {token('fortis')}"),)
                session = px.CreateSession(proxy_pb2.CreateSessionRequest(target="fmnist"),
                                           metadata=bearer, timeout=30).session
                assert session.tenant == "team-c"
                with pytest.raises(grpc.RpcError) as unauth:
                    px.CreateSession(proxy_pb2.CreateSessionRequest(target="fmnist"),
                                     metadata=(("authorization",
                                                f"Bearer {token('another-service')}"),),
                                     timeout=30)
                assert unauth.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert "audience" in unauth.value.details()

                big = np.zeros((1100, 1100, 1), dtype=np.uint8)      # 1.15 MiB > 1 MiB
                req = proxy_pb2.PredictRequest(session_id=session.session_id, origin="chart")
                req.images.add().CopyFrom(common_pb2.Image(
                    image_id="big", tensor=common_pb2.Tensor(
                        dtype=common_pb2.D_TYPE_UINT8, shape=list(big.shape),
                        data=big.tobytes())))
                with pytest.raises(grpc.RpcError) as refused:
                    px.Predict(req, metadata=bearer, timeout=30)
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, \
                    refused.value.details()
                st = rpc_status.from_call(refused.value)
                assert st is not None and any(
                    d.Is(error_details_pb2.QuotaFailure.DESCRIPTOR) for d in st.details)
            finally:
                pt_ch.close()
                px_ch.close()


def test_service_account_carries_cloud_workload_identity():
    """IRSA / GKE / Azure workload identity: annotations on the services' account (the proxy
    signs cloud targets' requests with it, docs/targets.md), labels on their pods; the
    workers' account and the API-token setting are untouched."""
    v = _merge(tenant_values("team-a"), {"serviceAccount": {
        "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/fortis"},
        "podLabels": {"azure.workload.identity/use": "true"}}})
    objs = render(v)
    for o in objs:
        kubernetes_validate.validate(o, "1.30.0", strict=True)
    sas = {s["metadata"]["name"]: s for s in by_kind(objs, "ServiceAccount")}
    assert sas["fortis-team-a"]["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/fortis"}
    assert "annotations" not in sas["fortis-team-a-worker"]["metadata"]
    assert all(s["automountServiceAccountToken"] is False for s in sas.values())
    for d in by_kind(objs, "Deployment"):
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert labels["azure.workload.identity/use"] == "true"
        assert labels["app.kubernetes.io/instance"] == "fortis-team-a"    # selector kept
    default = render(tenant_values("team-a"))
    assert all("annotations" not in s["metadata"] for s in by_kind(default, "ServiceAccount"))
    chart = helm.Chart.load(CHART)
    for bad in ({"annotations": {"bad key!": "x"}}, {"podLabels": {"a": "not a label value!"}},
                {"annotation": {}}):
        with pytest.raises(helm.HelmError):
            chart.validate_schema(_merge(tenant_values("team-a"), {"serviceAccount": bad}))


def test_tracing_env_reaches_every_service_and_its_collector_only():
    """``tracing.env`` (the OTEL_* variables) is set on every service's pod, each named
    fortis-<service>; the collector is one more egress rule, on its port only. Without it
    no OTEL_* variable is rendered (no tracing) and no rule is added."""
    collector = [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "observability"}}}]
    v = _merge(tenant_values("team-a"), {"tracing": {
        "env": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel.observability.svc:4317",
                "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "0.25"},
        "networkPolicyTo": collector}})
    traced = render(v)
    for o in traced:
        kubernetes_validate.validate(o, "1.30.0", strict=True)
    for d in by_kind(traced, "Deployment"):
        env = {e["name"]: e.get("value") for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}
        component = d["metadata"]["name"].removeprefix("fortis-team-a-")
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel.observability.svc:4317"
        assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
        assert env["OTEL_SERVICE_NAME"] == f"fortis-{component}"
    pols = {p["metadata"]["name"]: p["spec"] for p in by_kind(traced, "NetworkPolicy")}
    for name in ("fortis-team-a-services", "fortis-team-a-jobs"):
        rules = [r for r in pols[name]["egress"] if r["to"] == collector]
        assert [r["ports"] for r in rules] == [[{"port": 4317, "protocol": "TCP"}]]

    plain = render(tenant_values("team-a"))
    for d in by_kind(plain, "Deployment"):
        env = d["spec"]["template"]["spec"]["containers"][0]["env"]
        assert not [e for e in env if e["name"].startswith("OTEL_")]
    with pytest.raises(helm.HelmError) as info:        # an endpoint and nowhere to reach it
        render(_merge(v, {"tracing": {"networkPolicyTo": []}}))
    assert "tracing.networkPolicyTo" in str(info.value)
    for bad in ({"PATH": "/x"},                                    # only OTEL_* variables
                {"OTEL_EXPORTER_OTLP_HEADERS": "authorization=k"}):  # credentials: a secret
        with pytest.raises(helm.HelmError) as info:
            helm.Chart.load(CHART).validate_schema(_merge(v, {"tracing": {"env": bad}}))
        assert next(iter(bad)) in str(info.value)       # the variable is named


def test_the_worker_jobs_get_the_evaluation_services_tracing_env(monkeypatch):
    """With executor kubernetes, ``fortis serve`` as the chart runs it (its rendered args and
    env) gives its worker Jobs the OTEL_* variables, not its own service name (the workers
    are fortis-worker)."""
    from fortis.server.cli.local import _executor_settings
    from fortis.server.cli.main import build_parser

    v = _merge(tenant_values("team-a"), {
        "evaluation": {"executor": "kubernetes"},
        "networkPolicy": {"kubernetesApi": {"to": [{"ipBlock": {"cidr": "10.96.0.1/32"}}]}},
        "tracing": {"env": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel.obs.svc:4317"},
                    "headersSecret": {"existingSecret": "otel-headers"},
                    "networkPolicyTo": [{"ipBlock": {"cidr": "10.20.0.9/32"}}]}})
    ev, = [d for d in by_kind(render(v), "Deployment")
           if d["metadata"]["name"].endswith("-evaluation")]
    container = ev["spec"]["template"]["spec"]["containers"][0]
    for e in container["env"]:
        if "value" in e:
            monkeypatch.setenv(e["name"], e["value"])
    monkeypatch.setenv("POD_NAMESPACE", "team-a")
    ns = build_parser().parse_args([a for a in container["args"] if "$(" not in a])
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=from-the-secret")
    job = _executor_settings(ns)["job_settings"]
    assert job.env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel.obs.svc:4317"
    assert "OTEL_SERVICE_NAME" not in job.env
    # the collector's credentials reach the Jobs from the secret, never as a plain value
    assert "OTEL_EXPORTER_OTLP_HEADERS" not in job.env
    assert job.secret_env["OTEL_EXPORTER_OTLP_HEADERS"] == ("otel-headers", "headers")
    env = {e["name"]: e for e in container["env"]}
    assert env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]["secretKeyRef"] == {
        "name": "otel-headers", "key": "headers"}
