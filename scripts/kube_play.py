#!/usr/bin/env python3
"""Run the Helm chart's pods for real with podman, as far as one machine without a cluster allows.

    python scripts/kube_play.py --workdir DIR [--values FILE] [--tls off|none|require]
                                [--image TAG] [--release NAME] [--namespace NS] [--helm-test]
    python scripts/kube_play.py --down --workdir DIR

``up`` renders the chart (``deploy/helm/fortis``) with Helm's own Go SDK (helm-python-sdk, as
tests/deploy/test_helm_chart.py does), makes the Secrets the values reference (API keys in the
``fortis keys new`` format, the internal key, and with ``--tls`` a CA, one certificate naming
every Service and a client certificate for callers outside), and plays every Deployment's pod
with ``podman kube play`` on one podman network, each pod at a static address. It then runs
the chart's startup and readiness probes itself until every pod is ready, optionally plays the
chart's ``helm test`` pod, and prints one JSON object: the pods and their addresses, the API
key, the client certificate's files, what was converted and what was left out. ``--down``
stops the pods (SIGTERM, the chart's grace period) and removes everything ``up`` made.

What podman (4.3.1) takes as the chart renders it: the pod template's args, envFrom of the
ConfigMap (``--configmap``), env from Secrets (podman secrets), secret volumes, emptyDir,
security contexts (uid/gid 10001, fsGroup-owned volumes, read-only root, no capabilities,
no-new-privileges, podman's default seccomp profile), resource limits (cgroups), hostAliases.
What this driver converts first, and why:

- Deployment -> one ``kind: Pod`` per replica (``<deployment>-<i>``, as a ReplicaSet would):
  podman names an emptyDir after its volume name, so every pod with a ``tmp`` volume would
  share one; each replica's emptyDirs are renamed ``<pod>-<volume>`` to stay its own.
- Service -> hostAliases: each headless Service's names (``<svc>``, ``<svc>.<ns>``,
  ``<svc>.<ns>.svc``, ``<svc>.<ns>.svc.cluster.local``) map, in every pod's /etc/hosts, to
  the static addresses of the pods its selector matches, so the ``dns:///...`` addresses in
  the args resolve to all replicas, as the cluster DNS answers for a headless Service.
- ``$(VAR)`` in args is expanded from the container's env (ConfigMap and literal values), as
  the kubelet does; podman 4.3.1 passes it through literally.
- Secrets -> podman secrets named ``<namespace>.<name>`` (podman has no namespaces); the pod
  specs' references are renamed to match. podman 4.3.1 reads a secret used in env as a JSON
  map of base64 values but one mounted as a volume as a Kubernetes Secret whose ``data``
  values it writes without decoding them, so a secret is made in the form its use needs
  (the chart never uses one secret both ways).
- ``optional: false`` is set on secret volumes (podman 4.3.1 dereferences it unset and
  panics).
- The Fashion-MNIST models trained on this host (``$FORTIS_CACHE/models``, default
  ``~/.cache/fortis/models``) are copied, world-readable, into the workdir and mounted
  read-only at ``/var/cache/fortis/models`` inside the chart's cache volume, so the built-in
  targets load in seconds instead of training for minutes in each pod.
- persistentVolumeClaim -> the podman named volume of the claim's name (podman's own
  mapping), created when missing and kept by ``--down`` (helm uninstall keeps no PVC either,
  but a re-play should find the state, as a Recreate rollout does).
- fieldRef ``metadata.namespace`` -> its value (podman has no namespace to give).
- ``ports`` are dropped: a containerPort publishes nothing in Kubernetes, but podman 4.3.1
  binds it on the host; every pod is reached at its own address on the network instead.

Left out, each with a printed note: NetworkPolicy (nothing enforces it: every pod on the
network reaches every other and the host), PodDisruptionBudget, HorizontalPodAutoscaler,
ServiceAccount/Role/RoleBinding (no API server; no token is mounted), the migration hook Job
(only rendered with a database; its pod is not run). Probes are run by this driver, not a
kubelet: once at start-up until ready (startup then readiness, with their period, timeout and
failure threshold), never again after; a gRPC probe is a gRPC health check from the host to the
pod's address (as the kubelet dials the pod IP), an exec probe is ``podman exec``. podman
restarts a container that exits (restartPolicy Always), with no back-off; a restart before
the pod is ready fails ``up``, and a failed ``up`` removes what it made. Nothing replaces a
pod that is removed. Pod, network, secret and volume names are the host's: two drivers
playing the same release and namespace at once collide (the tests hold a lock).
"""

from __future__ import annotations

import argparse
import base64
import copy
import datetime as dt
import ipaddress
import json
import os
import re
import secrets as pysecrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "fortis"
DROPPED = {
    "NetworkPolicy": "not enforced: every pod on the podman network reaches every other pod "
                     "and the host, and the host reaches every pod",
    "PodDisruptionBudget": "no evictions happen here",
    "HorizontalPodAutoscaler": "no metrics server; the Deployment's replicas (or 1) are run",
    "ServiceAccount": "no API server; no token is mounted",
    "Role": "no API server",
    "RoleBinding": "no API server",
    "Job": "the migration hook (with a database only) is not run",
    "PersistentVolumeClaim": "a podman named volume of the claim's name stands in",
}


def log(msg: str) -> None:
    print(f"kube_play: {msg}", file=sys.stderr, flush=True)


# -- podman -----------------------------------------------------------------------------------

def podman_env() -> dict[str, str]:
    """The environment podman runs with: $CONTAINERS_CONF when set (the set-up's), else a
    containers.conf of this driver's with what this machine needs: runc + cgroupfs (crun
    fails on hybrid cgroups), file events (no journald), open-file limits big enough for
    gRPC."""
    if os.environ.get("CONTAINERS_CONF"):
        return dict(os.environ)
    conf = Path("/tmp/fortis-kube-play-containers.conf")
    if not conf.exists():
        conf.write_text('[containers]\ndefault_ulimits = ["nofile=20000:20000", '
                        '"nproc=32768:32768"]\n[engine]\nruntime = "runc"\n'
                        'cgroup_manager = "cgroupfs"\nevents_logger = "file"\n')
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def podman(*args: str, check: bool = True, timeout: float = 300,
           input: str | None = None) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                       env=podman_env(), input=input)
    if check and r.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args[:3])} failed ({r.returncode}): "
                           f"{(r.stderr or r.stdout)[-2000:]}")
    return r


# -- rendering --------------------------------------------------------------------------------

def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in patch.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def default_values(namespace: str, image: str, tls: str) -> dict[str, Any]:
    """A tenant that needs nothing outside the pods: the built-in Fashion-MNIST CNN as its one
    target, SQLite state on the pods' volumes (no PostgreSQL, no Redis: so one proxy), and
    with ``tls`` a TLS secret with client authentication ``none`` or ``require``."""
    repo, _, tag = image.rpartition(":")
    v: dict[str, Any] = {
        "image": {"repository": repo, "tag": tag, "pullPolicy": "IfNotPresent"},
        "secrets": {"apiKeys": {"existingSecret": f"{namespace}-api-keys"},
                    "internalKey": {"existingSecret": f"{namespace}-internal-key"}},
        "targets": [{"name": "fmnist-cnn", "builtin": "fmnist-cnn", "rate": 200,
                     "tenants": [namespace]}],
        "proxy": {"replicas": 1},
        "shutdownGraceSeconds": 3,
    }
    if tls != "off":
        v["secrets"]["tls"] = {"existingSecret": f"{namespace}-tls", "clientAuth": tls}
    return v


def render(values: dict[str, Any], release: str, namespace: str) -> list[dict[str, Any]]:
    import helm_python as helm  # dev extra: helm-python-sdk

    out = helm.Chart.load(CHART).render(values, name=release, namespace=namespace,
                                        is_install=True)
    objs: list[dict[str, Any]] = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        objs += [o for o in yaml.safe_load_all(text) if o]
    return objs


# -- secrets ----------------------------------------------------------------------------------

def api_key(tenant: str) -> dict[str, str]:
    """A key made by the real CLI (``fortis keys new``): the caller keeps ``api_key``, the
    Secret gets ``line`` ('TENANT sha256:<hex>')."""
    r = subprocess.run([sys.executable, "-m", "fortis.server.cli", "keys", "new", "--tenant", tenant,
                        "--json"], capture_output=True, text=True, check=True, timeout=60)
    return json.loads(r.stdout)


def make_pki(out: Path, dns_names: list[str]) -> dict[str, Path]:
    """A CA, one certificate every service serves and dials with (it names every Service, so
    both the servers and their mTLS clients verify), and a client certificate for callers
    outside the pods. EC P-256, one day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)

    def key() -> ec.EllipticCurvePrivateKey:
        return ec.generate_private_key(ec.SECP256R1())

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def pem_key(k: ec.EllipticCurvePrivateKey) -> bytes:
        return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption())

    ca_key = key()
    ca = (x509.CertificateBuilder().subject_name(name("fortis-kube-play-ca"))
          .issuer_name(name("fortis-kube-play-ca")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))

    def leaf(cn: str, sans: list[x509.GeneralName], usages: list[x509.ObjectIdentifier]
             ) -> tuple[bytes, bytes]:
        k = key()
        cert = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(ca.subject)
                .public_key(k.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                .sign(ca_key, hashes.SHA256()))
        return cert.public_bytes(serialization.Encoding.PEM), pem_key(k)

    out.mkdir(parents=True, exist_ok=True)
    files = {"ca.crt": ca.public_bytes(serialization.Encoding.PEM)}
    # the services' certificate is also their client certificate on the internal channels
    files["tls.crt"], files["tls.key"] = leaf(
        dns_names[0], [x509.DNSName(n) for n in dns_names],
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    files["client.crt"], files["client.key"] = leaf(
        "fortis-kube-play-client", [x509.DNSName("fortis-kube-play-client")],
        [ExtendedKeyUsageOID.CLIENT_AUTH])
    paths = {}
    for f, data in files.items():
        (out / f).write_bytes(data)
        (out / f).chmod(0o600)
        paths[f] = out / f
    return paths


def secret_uses(pod_specs: list[dict[str, Any]]) -> dict[str, set[str]]:
    """secret name -> {'env', 'volume'}: how the pods use it."""
    uses: dict[str, set[str]] = {}
    for spec in pod_specs:
        for c in spec.get("containers", []):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    uses.setdefault(ref["name"], set()).add("env")
        for v in spec.get("volumes", []):
            if "secret" in v:
                uses.setdefault(v["secret"]["secretName"], set()).add("volume")
    return uses


def podman_secret_payload(name: str, data: dict[str, bytes], use: set[str]) -> str:
    if use == {"env", "volume"}:
        raise SystemExit(f"kube_play: secret {name} is used both in env and as a volume; "
                         "podman 4.3.1 reads those two uses in different formats")
    if use == {"env"}:
        return json.dumps({k: base64.b64encode(v).decode() for k, v in data.items()})
    # a volume's files: podman 4.3.1 writes a Secret's ``data`` values as they are in the
    # document, without base64-decoding them (and ignores stringData), so the text goes in
    return json.dumps({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                       "type": "Opaque", "data": {k: v.decode() for k, v in data.items()}})


# -- conversion -------------------------------------------------------------------------------

def expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of command and args; ``$$`` escapes, undefined stays."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), arg)


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def service_names(svc: dict[str, Any]) -> list[str]:
    n, ns = svc["metadata"]["name"], svc["metadata"]["namespace"]
    return [f"{n}.{ns}.svc.cluster.local", f"{n}.{ns}.svc", f"{n}.{ns}", n]


def container_env(c: dict[str, Any], configmaps: dict[str, dict[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for src in c.get("envFrom", []):
        ref = src.get("configMapRef")
        if ref:
            env.update(configmaps.get(ref["name"], {}))
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
    return env


def convert_pod(name: str, namespace: str, labels: dict[str, str], spec: dict[str, Any], *,
                configmaps: dict[str, dict[str, str]], host_aliases: list[dict[str, Any]],
                models: Path | None) -> dict[str, Any]:
    spec = copy.deepcopy(spec)
    renamed = {}
    for v in spec.get("volumes", []):
        if "emptyDir" in v:
            renamed[v["name"]] = f"{name}-{v['name']}"
            v["name"] = renamed[v["name"]]
        if "secret" in v:
            v["secret"]["secretName"] = f"{namespace}.{v['secret']['secretName']}"
            v["secret"]["optional"] = False
    if models is not None:
        spec.setdefault("volumes", []).append(
            {"name": f"{name}-models", "hostPath": {"path": str(models), "type": "Directory"}})
    for c in spec.get("containers", []):
        # a containerPort publishes nothing in Kubernetes; podman 4.3.1 binds it on the host
        # (two pods' 9090 would clash): the pods are reached at their own addresses instead
        c.pop("ports", None)
        env = container_env(c, configmaps)
        for key in ("command", "args"):
            if key in c:
                c[key] = [expand(a, env) for a in c[key]]
        for e in c.get("env", []):
            vf = e.get("valueFrom", {})
            if vf.get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
                e.pop("valueFrom")
                e["value"] = namespace
            elif vf.get("fieldRef", {}).get("fieldPath") == "metadata.name":
                e.pop("valueFrom")
                e["value"] = name
            elif "secretKeyRef" in vf:
                vf["secretKeyRef"]["name"] = f"{namespace}.{vf['secretKeyRef']['name']}"
        for m in c.get("volumeMounts", []):
            m["name"] = renamed.get(m["name"], m["name"])
        if models is not None and any(m["mountPath"] == "/var/cache/fortis"
                                      for m in c.get("volumeMounts", [])):
            c["volumeMounts"].append({"name": f"{name}-models",
                                      "mountPath": "/var/cache/fortis/models", "readOnly": True})
    spec["hostAliases"] = spec.get("hostAliases", []) + host_aliases
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": spec}


def stage_models(workdir: Path) -> Path | None:
    src = Path(os.environ.get("FORTIS_CACHE", Path.home() / ".cache" / "fortis")) / "models"
    files = sorted(src.glob("fmnist-*-v*.pt")) + sorted(src.glob("fmnist-*-v*.json"))
    if not files:
        return None
    dst = workdir / "models"
    dst.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(f, dst / f.name)
        (dst / f.name).chmod(0o644)          # the pods run as uid 10001
    dst.chmod(0o755)
    return dst


# -- probes -----------------------------------------------------------------------------------

def grpc_health(address: str, timeout: float, tls: dict[str, Path] | None = None,
                server_name: str = "") -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    if tls:
        creds = grpc.ssl_channel_credentials(tls["ca.crt"].read_bytes(),
                                             tls["client.key"].read_bytes(),
                                             tls["client.crt"].read_bytes())
        opts = [("grpc.ssl_target_name_override", server_name)] if server_name else []
        ch = grpc.secure_channel(address, creds, options=opts)
    else:
        ch = grpc.insecure_channel(address)
    try:
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        return r.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False
    finally:
        ch.close()


def run_probe(probe: dict[str, Any], container: str, ip: str) -> tuple[bool, float]:
    """One probe, as a kubelet runs it (timeoutSeconds enforced, default 1 s)."""
    timeout = float(probe.get("timeoutSeconds", 1))
    t0 = time.monotonic()
    if "grpc" in probe:
        ok = grpc_health(f"{ip}:{probe['grpc']['port']}", timeout)
    elif "exec" in probe:
        try:
            ok = podman("exec", container, *probe["exec"]["command"], check=False,
                        timeout=timeout + 0.5).returncode == 0
        except subprocess.TimeoutExpired:
            ok = False
        # podman exec itself adds about a second here (runc exec); that part is not the
        # probe's: the kubelet's exec probes go through the CRI without it
    else:
        raise SystemExit(f"kube_play: probe kind not handled: {sorted(probe)}")
    return ok, time.monotonic() - t0


def wait_ready(pods: list[dict[str, Any]], deadline_s: float) -> dict[str, Any]:
    """Startup probe until it passes (at most failureThreshold x periodSeconds), then the
    readiness probe, for every pod's container; a container that exits fails at once."""
    t0 = time.monotonic()
    report: dict[str, Any] = {}
    pending: dict[str, dict[str, Any]] = {
        p["name"]: {"stage": "startupProbe", "fails": 0, "next": 0.0} for p in pods}
    by_name = {p["name"]: p for p in pods}
    while pending:
        now = time.monotonic()
        if now - t0 > deadline_s:
            raise RuntimeError(f"not ready after {deadline_s:.0f} s: {sorted(pending)}; "
                               + logs_tail(by_name[sorted(pending)[0]]))
        for name, st in list(pending.items()):
            if now < st["next"]:
                continue
            p = by_name[name]
            st_ = json.loads(podman("inspect", p["container"]).stdout)[0]
            # podman restarts an exited container (restartPolicy Always) as a kubelet would;
            # a restart before the pod is ready is a crash: fail now, with its logs
            if st_["State"]["Status"] != "running" or st_.get("RestartCount", 0):
                s = st_["State"]
                raise RuntimeError(f"{name}: container {s['Status']}, "
                                   f"{st_.get('RestartCount', 0)} restarts (last exit code "
                                   f"{s.get('ExitCode')}, OOM-killed {s.get('OOMKilled')}"
                                   f"{', error ' + s['Error'] if s.get('Error') else ''}); "
                                   + logs_tail(p))
            probe = p["probes"].get(st["stage"])
            if probe is None:
                ok, took = True, 0.0
            else:
                ok, took = run_probe(probe, p["container"], p["ip"])
            period = float((probe or {}).get("periodSeconds", 10))
            if ok:
                if st["stage"] == "startupProbe":
                    report.setdefault(name, {})["started_s"] = round(time.monotonic() - t0, 1)
                    st.update(stage="readinessProbe", fails=0, next=0.0)
                else:
                    report[name]["ready_s"] = round(time.monotonic() - t0, 1)
                    report[name]["probe_s"] = round(took, 2)
                    del pending[name]
            else:
                st["fails"] += 1
                if st["fails"] >= int((probe or {}).get("failureThreshold", 3)) \
                        and st["stage"] == "startupProbe":
                    raise RuntimeError(f"{name}: startup probe failed {st['fails']} times; "
                                       + logs_tail(p))
                # a failing readiness probe only keeps the pod out of its Service: retry
                st["next"] = time.monotonic() + min(period, 1.0)
        time.sleep(0.2)
    return report


def logs_tail(p: dict[str, Any]) -> str:
    r = podman("logs", "--tail", "30", p["container"], check=False)
    return f"logs of {p['container']}:\n{(r.stdout + r.stderr)[-3000:]}"


# -- up / down --------------------------------------------------------------------------------

def up(a: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(a.workdir).resolve()
    if (workdir / "state.json").exists():
        down(a)
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    values = default_values(a.namespace, a.image, a.tls)
    if a.values:
        values = merge(values, yaml.safe_load(Path(a.values).read_text()) or {})
    objs = render(values, a.release, a.namespace)
    notes: list[str] = []
    configmaps = {o["metadata"]["name"]: {k: str(v) for k, v in (o.get("data") or {}).items()}
                  for o in objs if o["kind"] == "ConfigMap"}
    deployments = [o for o in objs if o["kind"] == "Deployment"]
    services = [o for o in objs if o["kind"] == "Service"]
    tests = [o for o in objs if o["kind"] == "Pod"
             and o["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    for o in objs:
        if o["kind"] in DROPPED:
            notes.append(f"{o['kind']} {o['metadata']['name']}: left out ({DROPPED[o['kind']]})")

    state: dict[str, Any] = {"network": a.network or f"kp-{a.namespace}", "pods": [],
                             "secrets": [], "volumes": [], "configmap": None}
    # the network first, so its subnet gives the pods their static addresses
    net = state["network"]
    if podman("network", "exists", net, check=False).returncode != 0:
        podman("network", "create", net)
    (workdir / "state.json").write_text(json.dumps(state))
    subnet = ipaddress.ip_network(json.loads(podman("network", "inspect", net).stdout)[0]
                                  ["subnets"][0]["subnet"])
    hosts = iter(list(subnet.hosts())[9:])             # .1 is the gateway; leave a margin

    # replicas -> pods with their addresses (an HPA-owned Deployment has no replicas: 1)
    pods: list[dict[str, Any]] = []
    for d in deployments:
        n = int(d["spec"].get("replicas", 1) if a.max_replicas is None
                else min(int(d["spec"].get("replicas", 1)), a.max_replicas))
        for i in range(n):
            pods.append({"deployment": d["metadata"]["name"], "name": f"{d['metadata']['name']}-{i}",
                         "labels": d["spec"]["template"]["metadata"]["labels"],
                         "spec": d["spec"]["template"]["spec"], "ip": str(next(hosts))})
        if n != int(d["spec"].get("replicas", 1)):
            notes.append(f"Deployment {d['metadata']['name']}: {n} of "
                         f"{d['spec'].get('replicas', 1)} replicas run (--max-replicas)")
    aliases: list[dict[str, Any]] = []
    svc_ips: dict[str, list[str]] = {}
    for s in services:
        ips = [p["ip"] for p in pods if selects(s["spec"]["selector"], p["labels"])]
        svc_ips[s["metadata"]["name"]] = ips
        aliases += [{"ip": ip, "hostnames": service_names(s)} for ip in ips]

    # secrets the values reference
    tenant = a.namespace
    key = api_key(tenant)
    sec = values["secrets"]
    data: dict[str, dict[str, bytes]] = {
        sec["apiKeys"]["existingSecret"]: {sec["apiKeys"].get("key", "api-keys"):
                                           (key["line"] + "\n").encode()},
        sec["internalKey"]["existingSecret"]: {sec["internalKey"].get("key", "internal-key"):
                                               pysecrets.token_hex(24).encode()},
    }
    pki = None
    if sec.get("tls", {}).get("existingSecret"):
        names = [n for s in services for n in service_names(s)]
        if sec["tls"].get("serverName"):
            names.insert(0, sec["tls"]["serverName"])
        pki = make_pki(workdir / "pki", names)
        data[sec["tls"]["existingSecret"]] = {f: pki[f].read_bytes()
                                              for f in ("ca.crt", "tls.crt", "tls.key")}
    for which, url in (("database", a.database_url), ("redis", a.redis_url)):
        name = sec.get(which, {}).get("existingSecret")
        if name:
            if not url:
                raise SystemExit(f"kube_play: values reference secrets.{which}: give --{which}-url")
            data[name] = {sec[which].get("key", "url"): url.encode()}
    uses = secret_uses([p["spec"] for p in pods] + [t["spec"] for t in tests])
    for name, use in uses.items():
        if name not in data:
            raise SystemExit(f"kube_play: the pods use secret {name}, which this driver does "
                             "not know how to make")
        pname = f"{a.namespace}.{name}"
        podman("secret", "rm", pname, check=False)
        # podman 4.3.1 copies a secret volume's files into a named volume of the secret's name
        # once, and keeps it: a stale one would hide the new secret
        podman("volume", "rm", "-f", pname, check=False)
        state["volumes"].append(pname)
        podman("secret", "create", pname, "-", input=podman_secret_payload(name, data[name], use))
        state["secrets"].append(pname)
        (workdir / "state.json").write_text(json.dumps(state))

    for claim in sorted({v["persistentVolumeClaim"]["claimName"] for p in pods
                         for v in p["spec"].get("volumes", []) if "persistentVolumeClaim" in v}):
        if podman("volume", "exists", claim, check=False).returncode != 0:
            podman("volume", "create", claim)
        notes.append(f"PersistentVolumeClaim {claim}: podman volume {claim} (kept by --down)")
    models = stage_models(workdir)
    if models is None:
        notes.append("no trained Fashion-MNIST models on this host: the pods train them on "
                     "first use (minutes)")
    cm_file = workdir / "configmap.yaml"
    cm_file.write_text(yaml.safe_dump_all([o for o in objs if o["kind"] == "ConfigMap"]))
    for p in pods:
        pod = convert_pod(p["name"], a.namespace, p["labels"], p["spec"], configmaps=configmaps,
                          host_aliases=aliases, models=models)
        f = workdir / f"{p['name']}.yaml"
        f.write_text(yaml.safe_dump(pod, sort_keys=False))
        state["pods"].append(p["name"])
        state.setdefault("grace", {})[p["name"]] = int(
            pod["spec"].get("terminationGracePeriodSeconds", 30))
        state["volumes"] += [v["name"] for v in pod["spec"]["volumes"] if "emptyDir" in v]
        (workdir / "state.json").write_text(json.dumps(state))
        # --replace: a pod of this name left by a run that was killed is replaced, not an error
        podman("kube", "play", "--replace", "--network", net, "--ip", p["ip"],
               "--configmap", str(cm_file), str(f))
        c0 = pod["spec"]["containers"][0]
        p["container"] = f"{p['name']}-{c0['name']}"        # podman's <pod>-<container>
        p["probes"] = {k: c0[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")
                       if k in c0}
    t_played = time.monotonic()
    ready = wait_ready(pods, a.ready_timeout)
    t_ready = time.monotonic()
    result: dict[str, Any] = {
        "release": a.release, "namespace": a.namespace, "network": net, "subnet": str(subnet),
        "image": a.image, "tls": a.tls,
        "pods": {p["name"]: {"ip": p["ip"], "container": p["container"], **ready[p["name"]]}
                 for p in pods},
        "services": {n: {"names": service_names(s), "ips": svc_ips[n]}
                     for s in services for n in [s["metadata"]["name"]]},
        "api_key": key["api_key"], "tenant": tenant,
        "models": str(models) if models else None,
        "times_s": {"render_secrets_play": round(t_played - t0, 1),
                    "ready_after_play": round(t_ready - t_played, 1)},
        "notes": notes,
    }
    if pki:
        result["pki"] = {k: str(v) for k, v in pki.items()}
    if a.helm_test:
        result["helm_test"] = helm_test(tests, a.namespace, net, aliases, workdir, state)
    (workdir / "state.json").write_text(json.dumps(state))
    (workdir / "up.json").write_text(json.dumps(result, indent=2))
    return result


def helm_test(tests: list[dict[str, Any]], namespace: str, net: str,
              aliases: list[dict[str, Any]], workdir: Path, state: dict[str, Any]
              ) -> dict[str, Any]:
    """The chart's ``helm test`` pod: one ``fortis health`` container per Service, dialling
    the Services' names; passes when every container exits 0."""
    out: dict[str, Any] = {}
    for t in tests:
        name = t["metadata"]["name"]
        pod = convert_pod(name, namespace, t["metadata"].get("labels", {}), t["spec"],
                          configmaps={}, host_aliases=aliases, models=None)
        f = workdir / f"{name}.yaml"
        f.write_text(yaml.safe_dump(pod, sort_keys=False))
        state["pods"].append(name)
        state["volumes"] += [v["name"] for v in pod["spec"]["volumes"] if "emptyDir" in v]
        (workdir / "state.json").write_text(json.dumps(state))
        t0 = time.monotonic()
        podman("kube", "play", "--network", net, str(f))
        containers = [f"{name}-{c['name']}" for c in pod["spec"]["containers"]]
        codes: dict[str, int] = {}
        deadline = time.monotonic() + 120
        while len(codes) < len(containers) and time.monotonic() < deadline:
            for c in containers:
                st = json.loads(podman("inspect", c).stdout)[0]["State"]
                if st["Status"] == "exited":
                    codes[c] = st["ExitCode"]
            time.sleep(0.5)
        out[name] = {"exit_codes": codes, "seconds": round(time.monotonic() - t0, 1),
                     "passed": len(codes) == len(containers) and not any(codes.values())}
        if not out[name]["passed"]:
            out[name]["logs"] = {c: podman("logs", c, check=False).stdout[-800:]
                                 for c in containers}
    return out


def down(a: argparse.Namespace) -> dict[str, Any]:
    """SIGTERM every pod at once and give each its terminationGracePeriodSeconds before
    SIGKILL, as the kubelet does; then remove the pods, their volumes, the secrets and the
    network. Reports each container's exit status and how long it took to exit."""
    workdir = Path(a.workdir).resolve()
    sf = workdir / "state.json"
    if not sf.exists():
        return {"down": "nothing recorded in " + str(sf)}
    state = json.loads(sf.read_text())
    out: dict[str, Any] = {"stopped": {}}
    live = [n for n in state["pods"] if podman("pod", "exists", n, check=False).returncode == 0]
    grace = state.get("grace", {})
    t_term = dt.datetime.now(dt.UTC)
    procs = [subprocess.Popen(["podman", "pod", "stop", "-t", str(grace.get(n, 10)), n],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=podman_env()) for n in live]
    for proc in procs:
        proc.wait(timeout=300)
    for name in live:
        info = json.loads(podman("pod", "inspect", name, check=False).stdout or "{}")
        codes: dict[str, int | None] = {}
        secs: dict[str, float | None] = {}
        for c in info.get("Containers", []):
            if c["Name"].endswith("-infra"):
                continue
            st = json.loads(podman("inspect", c["Id"], check=False).stdout or "[{}]")[0]
            codes[c["Name"]] = st.get("State", {}).get("ExitCode")
            finished = st.get("State", {}).get("FinishedAt", "")
            try:     # podman prints nanoseconds; keep microseconds for fromisoformat
                f = dt.datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", finished)
                                              .replace("Z", "+00:00"))
                secs[c["Name"]] = round(max((f - t_term).total_seconds(), 0.0), 1)
            except ValueError:
                secs[c["Name"]] = None
        out["stopped"][name] = {"exit_codes": codes, "seconds_after_sigterm": secs,
                                "grace_s": grace.get(name)}
    for name in state["pods"]:
        podman("pod", "rm", "-f", name, check=False)
    for v in state["volumes"]:
        podman("volume", "rm", "-f", v, check=False)
    for s in state["secrets"]:
        podman("secret", "rm", s, check=False)
    if state.get("network"):
        podman("network", "rm", "-f", state["network"], check=False)
    sf.unlink()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True, help="where the rendered pods, secrets' "
                    "sources, certificates and state.json are kept")
    ap.add_argument("--down", action="store_true", help="stop and remove what --workdir's "
                    "state.json lists")
    ap.add_argument("--values", help="a values file merged over this driver's tenant")
    ap.add_argument("--tls", choices=("off", "none", "require"), default="off",
                    help="make a TLS secret; none|require: secrets.tls.clientAuth")
    ap.add_argument("--image", default="localhost/fortis:0.3.0")
    ap.add_argument("--release", default="fortis-team-a")
    ap.add_argument("--namespace", default="team-a", help="also the tenant of the API key")
    ap.add_argument("--network", help="podman network (default kp-<namespace>)")
    ap.add_argument("--max-replicas", type=int, help="run at most this many pods of a "
                    "Deployment (the machine's cores)")
    ap.add_argument("--database-url", help="for secrets.database (reachable from the pods)")
    ap.add_argument("--redis-url", help="for secrets.redis (reachable from the pods)")
    ap.add_argument("--ready-timeout", type=float, default=300)
    ap.add_argument("--helm-test", action="store_true", help="then run the chart's helm test pod")
    a = ap.parse_args(argv)
    if shutil.which("podman") is None:
        log("podman is not installed")
        return 2
    try:
        result = down(a) if a.down else up(a)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        log(str(exc))
        if not a.down:
            # a failed up leaves nothing behind: pod names and the network are the host's,
            # and a later up of another workdir would collide with them
            try:
                down(a)
            except (RuntimeError, subprocess.TimeoutExpired) as exc2:
                log(f"tearing down after the failure also failed: {exc2}")
        return 1
    for n in result.get("notes", []):
        log(n)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
