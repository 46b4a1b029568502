"""``helm upgrade`` from the previous release's chart keeps the data (Fortis 0.2.0, commit
8f43618: ``tests/fixtures/release-0.2.0/chart-0.2.0.tgz`` is ``git archive`` of that commit's
``deploy/helm/fortis``).

No cluster exists here, so nothing is applied. Instead both charts are rendered offline with
Helm's own Go SDK (``helm-python-sdk``) with the same values, as the install (revision 1) and
as the upgrade to the current chart (revision 2), and the objects are compared for what an
upgrade would have to change and cannot, or would lose data by changing:

- every PersistentVolumeClaim is kept under the same name with the same (immutable) spec:
  a renamed or dropped claim is deleted by ``helm upgrade``, its volume with it;
- every Deployment keeps its name, its (immutable) label selector, the claim its state volume
  mounts, the mount path and ``--state-dir``; with a claim, ``Recreate``: the old pod stops
  before the new one opens (and migrates) the SQLite files;
- Services keep their (immutable) ``clusterIP`` and selector, the proxy's
  PodDisruptionBudget its selector;
- with PostgreSQL the migration Job is a ``pre-install,pre-upgrade`` hook (Helm runs it to
  completion before it applies the new Deployments) deleted before it is created again (its
  immutable spec is never patched), running ``fortis db upgrade`` with the same secret the
  services read.

What this does not verify (no cluster): that a real API server accepts the patch, that the
storage class keeps the volume, the hook's actual ordering and wait, and the pods' rollout;
the data itself surviving is shown by ``tests/storage/test_upgrade_previous_release.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

try:
    import helm_python as helm  # dev extra: helm-python-sdk==0.2.2
except ImportError as exc:  # pragma: no cover - the dev extra installs it
    raise ImportError("helm-python-sdk is missing: pip install -e '.[dev]' "
                      "(helm-python-sdk==0.2.2)") from exc

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "fortis"
PREVIOUS = ROOT / "tests" / "fixtures" / "release-0.2.0" / "chart-0.2.0.tgz"
NAME, NAMESPACE = "fortis-team-a", "team-a"

_SECRETS = {"apiKeys": {"existingSecret": "team-a-api-keys"},
            "internalKey": {"existingSecret": "team-a-internal-key"}}
#: The single-machine shape: SQLite files on the evaluation pod's claim.
SQLITE = {"secrets": _SECRETS, "proxy": {"replicas": 1},
          "evaluation": {"persistence": {"enabled": True, "size": "20Gi",
                                         "storageClass": "standard"}}}
#: The production shape: PostgreSQL and Redis shared by the replicas.
POSTGRES = {"secrets": {**_SECRETS, "database": {"existingSecret": "team-a-database"},
                        "redis": {"existingSecret": "team-a-redis"}},
            "networkPolicy": {"database": {"to": [{"ipBlock": {"cidr": "10.10.0.5/32"}}]},
                              "redis": {"to": [{"ipBlock": {"cidr": "10.10.0.6/32"}}]}}}


def render(chart: Path, values: dict[str, Any], *, upgrade: bool) -> dict[tuple[str, str], Any]:
    loaded = helm.Chart.load(chart)
    if upgrade:
        out = loaded.render(values, name=NAME, namespace=NAMESPACE, revision=2,
                            is_upgrade=True)
    else:
        out = loaded.render(values, name=NAME, namespace=NAMESPACE, revision=1,
                            is_install=True)
    objs: dict[tuple[str, str], Any] = {}
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        for o in yaml.safe_load_all(text):
            if o:
                key = (o["kind"], o["metadata"]["name"])
                assert key not in objs, key
                objs[key] = o
    return objs


@pytest.fixture(params=["sqlite", "postgres"])
def both(request: pytest.FixtureRequest) -> tuple[str, dict[Any, Any], dict[Any, Any]]:
    values = SQLITE if request.param == "sqlite" else POSTGRES
    return (request.param, render(PREVIOUS, values, upgrade=False),
            render(CHART, values, upgrade=True))


def of_kind(objs: dict[tuple[str, str], Any], kind: str) -> dict[str, Any]:
    return {name: o for (k, name), o in objs.items() if k == kind}


def _hook(o: Any) -> str:
    return str(o["metadata"].get("annotations", {}).get("helm.sh/hook", ""))


def test_the_previous_chart_is_the_previous_release() -> None:
    chart = helm.Chart.load(PREVIOUS)
    assert chart is not None
    prev = render(PREVIOUS, SQLITE, upgrade=False)
    assert ("PersistentVolumeClaim", f"{NAME}-evaluation-state") in prev


def test_no_object_holding_data_is_dropped_or_renamed(both: Any) -> None:
    _, prev, cur = both
    kept = ("PersistentVolumeClaim", "Deployment", "Service", "ConfigMap", "ServiceAccount")
    for kind, name in prev:
        if kind in kept:
            assert (kind, name) in cur, f"helm upgrade would delete {kind} {name}"


def test_persistent_volume_claims_keep_name_and_spec(both: Any) -> None:
    shape, prev, cur = both
    before, after = of_kind(prev, "PersistentVolumeClaim"), of_kind(cur, "PersistentVolumeClaim")
    assert set(before) == set(after)
    assert (shape == "sqlite") == bool(before)
    for name, old in before.items():
        new = after[name]
        old_spec, new_spec = dict(old["spec"]), dict(new["spec"])
        # only the requested size may change (and only grow: volume expansion)
        old_size = old_spec.pop("resources")["requests"]["storage"]
        new_size = new_spec.pop("resources")["requests"]["storage"]
        assert old_spec == new_spec, name
        assert old_size == new_size, name
        assert _hook(new) == ""                 # a hook's objects are not the release's


def test_deployments_keep_selectors_and_state_volumes(both: Any) -> None:
    shape, prev, cur = both
    before, after = of_kind(prev, "Deployment"), of_kind(cur, "Deployment")
    assert set(before) == set(after)
    for name, old in before.items():
        new = after[name]
        assert old["spec"]["selector"] == new["spec"]["selector"], name     # immutable
        labels = new["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v
                   for k, v in new["spec"]["selector"]["matchLabels"].items()), name

        def state(d: Any) -> tuple[Any, str, list[str]]:
            pod = d["spec"]["template"]["spec"]
            volume = next(v for v in pod["volumes"] if v["name"] == "state")
            container = pod["containers"][0]
            mount = next(m["mountPath"] for m in container["volumeMounts"]
                         if m["name"] == "state")
            return ({k: v for k, v in volume.items() if k != "name"}, mount,
                    [a for a in container["args"] if a.startswith("--state-dir")])
        assert state(old) == state(new), name
        claim = state(new)[0].get("persistentVolumeClaim")
        if claim:
            assert ("PersistentVolumeClaim", claim["claimName"]) in cur
            # one pod on the ReadWriteOnce claim at a time: the old one has closed the SQLite
            # files before the new one opens and migrates them
            assert new["spec"]["strategy"]["type"] == "Recreate", name
    evaluation = after[f"{NAME}-evaluation"]
    volume = next(v for v in evaluation["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == "state")
    assert ("persistentVolumeClaim" in volume) == (shape == "sqlite")


def test_services_and_disruption_budgets_keep_immutable_fields(both: Any) -> None:
    _, prev, cur = both
    for name, old in of_kind(prev, "Service").items():
        new = cur[("Service", name)]
        for field in ("clusterIP", "type", "selector"):
            assert old["spec"].get(field) == new["spec"].get(field), (name, field)
    for name, old in of_kind(prev, "PodDisruptionBudget").items():
        assert old["spec"]["selector"] == cur[("PodDisruptionBudget", name)]["spec"]["selector"]


def test_the_migration_hook_runs_before_the_new_pods(both: Any) -> None:
    shape, prev, cur = both
    jobs = {n: j for n, j in of_kind(cur, "Job").items() if "pre-upgrade" in _hook(j)}
    if shape == "sqlite":
        # no hook: nothing else can open the claim while the old pod holds it (ReadWriteOnce);
        # the new evaluation pod migrates its SQLite files when it starts (after Recreate has
        # stopped the old one), copying each first
        assert jobs == {}
        return
    assert list(jobs) == [f"{NAME}-migrate"] and f"{NAME}-migrate" in of_kind(prev, "Job")
    job = jobs[f"{NAME}-migrate"]
    ann = job["metadata"]["annotations"]
    assert set(ann["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    assert "before-hook-creation" in ann["helm.sh/hook-delete-policy"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["db", "upgrade"]
    env = {e["name"]: e for e in container["env"]}
    secret = env["FORTIS_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    for name in ("evaluation", "proxy"):
        pod = cur[("Deployment", f"{NAME}-{name}")]["spec"]["template"]["spec"]
        penv = {e["name"]: e for e in pod["containers"][0].get("env", [])}
        assert penv["FORTIS_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == secret
        assert _hook(cur[("Deployment", f"{NAME}-{name}")]) == ""   # applied after the hooks
    assert container["image"] == cur[("Deployment", f"{NAME}-evaluation")][
        "spec"]["template"]["spec"]["containers"][0]["image"]          # the new code migrates
