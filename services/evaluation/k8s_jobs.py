"""Work fan-out on Kubernetes itself: one Indexed Job per evaluation.

The evaluation service, running in a tenant's namespace, creates a ``batch/v1`` Job with
``completionMode: Indexed`` and ``completions = parallelism = shards``, with the official
``kubernetes`` Python client. Kubernetes starts one pod per index with
``JOB_COMPLETION_INDEX`` set; each runs the same worker entry point (``fortis worker``), which
claims work items of the evaluation from the database (a claim is exclusive, so two pods never
run the same item, and the items of a pod that died are claimed again when its lease runs
out). Failed pods are retried by the Job's own backoff (``backoffLimit``); the evaluation
service watches the Job's conditions (``Complete`` / ``Failed``) and deletes the Job when the
evaluation is cancelled. Query attacks still go through the proxy, so its rate limit and
ledger hold whatever the number of pods.

Only this module talks to the Kubernetes API; it imports ``kubernetes`` lazily, so the
embedded mode needs no Kubernetes library. Domain code, no gRPC. The manifest is plain data
(``job_manifest``): tests validate it against the Kubernetes schemas in strict mode.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fortis.infra.serving import tracing
from fortis.services.common import errors

__all__ = ["JobOutcome", "JobSettings", "IndexedJobExecutor", "job_manifest", "job_name"]

#: Label keys on every Job and pod (selectable by NetworkPolicy and by ``kubectl``).
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_EVALUATION = "fortis.dev/evaluation"
LABEL_TENANT = "fortis.dev/tenant"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: A Secret's name (DNS-1123 subdomain).
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
#: Where a worker pod mounts the TLS secret (as the chart mounts it in the services' pods).
TLS_MOUNT = "/etc/fortis/tls"


@dataclass(frozen=True, kw_only=True)
class JobSettings:
    """How worker Jobs are made (the Helm chart's ``workers.jobs`` values)."""

    namespace: str
    image: str
    service_account: str = "fortis-worker"
    #: pods per evaluation (indexes 0..shards-1)
    shards: int = 2
    #: retries of failed pods, Job-wide (``spec.backoffLimit``)
    backoff_limit: int = 6
    #: finished Jobs are deleted after this long (``ttlSecondsAfterFinished``)
    ttl_s: int = 3600
    #: a Job running longer is failed by Kubernetes (``activeDeadlineSeconds``; 0 = none)
    active_deadline_s: int = 0
    #: the worker's arguments before the evaluation's own (``fortis worker ...``)
    command: Sequence[str] = ("fortis", "worker")
    #: plain environment variables of the worker container
    env: Mapping[str, str] = field(default_factory=dict)
    #: environment variables from secrets: name -> (secret name, key), e.g. the database URL
    secret_env: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    requests: Mapping[str, str] = field(default_factory=lambda: {"cpu": "500m",
                                                                 "memory": "1Gi"})
    limits: Mapping[str, str] = field(default_factory=lambda: {"cpu": "2", "memory": "4Gi"})
    #: a writable scratch volume at /tmp (the root filesystem is read-only)
    scratch_size: str = "1Gi"
    #: The services' TLS secret (``tls.crt``, ``tls.key``, ``ca.crt``: the chart's
    #: ``secrets.tls``), mounted read-only at ``TLS_MOUNT`` in every worker pod, whose
    #: ``fortis worker`` then calls the services over (m)TLS with it (``$FORTIS_TLS_*``).
    #: "": plain text, as the services then listen.
    tls_secret: str = ""
    #: The name the workers verify in the services' certificates (``--tls-server-name`` of
    #: the evaluation service); "": the host they dial.
    tls_server_name: str = ""

    def __post_init__(self) -> None:
        if not _DNS_LABEL.fullmatch(self.namespace) or len(self.namespace) > 63:
            raise errors.InvalidArgument("jobs.namespace", "must be a DNS-1123 label")
        if not self.image or any(c.isspace() for c in self.image):
            raise errors.InvalidArgument("jobs.image", "must name a container image")
        if not 1 <= self.shards <= 1000:
            raise errors.InvalidArgument("jobs.shards", "must be from 1 to 1000")
        if not 0 <= self.backoff_limit <= 100:
            raise errors.InvalidArgument("jobs.backoff_limit", "must be from 0 to 100")
        if self.tls_secret and (len(self.tls_secret) > 253
                                or not _SECRET_NAME.fullmatch(self.tls_secret)):
            raise errors.InvalidArgument("jobs.tls_secret", "must name a Secret (lower-case "
                                         "letters, digits, '-' and '.')")
        if self.tls_server_name and not self.tls_secret:
            raise errors.InvalidArgument("jobs.tls_server_name", "goes with jobs.tls_secret")


def job_name(tenant: str, evaluation_id: str) -> str:
    """A stable DNS-1123 name for the evaluation's Job: the same evaluation (a resumed one too)
    always maps to the same Job, and no id (any charset, any length) can break the name."""
    digest = hashlib.sha256(f"{tenant}\0{evaluation_id}".encode()).hexdigest()[:20]
    return f"fortis-eval-{digest}"


def _label_value(text: str) -> str:
    """A Kubernetes label value (<= 63 of [A-Za-z0-9-_.], alphanumeric at both ends)."""
    v = re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:63].strip("-_.")
    return v or "x"


def job_manifest(settings: JobSettings, *, tenant: str, evaluation_id: str,
                 worker_args: Sequence[str] = (),
                 trace_env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``batch/v1`` Indexed Job of one evaluation, as a plain dict (what the API gets).
    ``trace_env`` (``TRACEPARENT``/``TRACESTATE``) makes the workers' spans children of the
    evaluation's run."""
    name = job_name(tenant, evaluation_id)
    labels = {"app.kubernetes.io/name": "fortis", "app.kubernetes.io/managed-by": "fortis",
              LABEL_COMPONENT: "worker", LABEL_TENANT: _label_value(tenant),
              LABEL_EVALUATION: _label_value(evaluation_id)}
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(settings.env.items())]
    env += [{"name": k, "valueFrom": {"secretKeyRef": {"name": s, "key": key}}}
            for k, (s, key) in sorted(settings.secret_env.items())]
    env += [{"name": "FORTIS_EVALUATION_ID", "value": evaluation_id},
            {"name": "FORTIS_TENANT", "value": tenant},
            {"name": "FORTIS_SHARDS", "value": str(settings.shards)}]
    env += [{"name": k, "value": v} for k, v in sorted((trace_env or {}).items())]
    mounts: list[dict[str, Any]] = [{"name": "scratch", "mountPath": "/tmp"}]
    volumes: list[dict[str, Any]] = [{"name": "scratch",
                                      "emptyDir": {"sizeLimit": settings.scratch_size}}]
    if settings.tls_secret:     # workers reach services that listen with TLS only
        env += [{"name": "FORTIS_TLS_CERT", "value": f"{TLS_MOUNT}/tls.crt"},
                {"name": "FORTIS_TLS_KEY", "value": f"{TLS_MOUNT}/tls.key"},
                {"name": "FORTIS_TLS_CA", "value": f"{TLS_MOUNT}/ca.crt"}]
        if settings.tls_server_name:
            env.append({"name": "FORTIS_TLS_SERVER_NAME", "value": settings.tls_server_name})
        mounts.append({"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True})
        volumes.append({"name": "tls", "secret": {"secretName": settings.tls_secret}})
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": settings.shards,
        "parallelism": settings.shards,
        "backoffLimit": settings.backoff_limit,
        "ttlSecondsAfterFinished": settings.ttl_s,
        "template": {
            "metadata": {"labels": labels},
            "spec": {
                "restartPolicy": "Never",
                "serviceAccountName": settings.service_account,
                "automountServiceAccountToken": False,
                "securityContext": {"runAsNonRoot": True, "runAsUser": 10001,
                                    "runAsGroup": 10001, "fsGroup": 10001,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "worker",
                    "image": settings.image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": list(settings.command),
                    "args": list(worker_args),
                    "env": env,
                    "resources": {"requests": dict(settings.requests),
                                  "limits": dict(settings.limits)},
                    "securityContext": {"allowPrivilegeEscalation": False,
                                        "readOnlyRootFilesystem": True,
                                        "runAsNonRoot": True,
                                        "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": mounts,
                }],
                "volumes": volumes,
            },
        },
    }
    if settings.active_deadline_s:
        spec["activeDeadlineSeconds"] = settings.active_deadline_s
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
            "spec": spec}


@dataclass(frozen=True)
class JobOutcome:
    """How a Job ended: ``state`` is ``succeeded``, ``failed`` or ``stopped`` (the caller
    stopped waiting); ``reason`` is Kubernetes' condition reason/message when failed."""

    state: str
    succeeded: int = 0
    failed: int = 0
    reason: str = ""


class IndexedJobExecutor:
    """Creates, watches and deletes evaluation Jobs through the Kubernetes API.

    ``api`` is a ``kubernetes.client.BatchV1Api`` (default: built from the in-cluster service
    account, or ``~/.kube/config`` outside a cluster). Errors from the API server become
    Fortis errors naming what failed; a Job that already exists (a resumed evaluation) is
    reused, not duplicated.
    """

    def __init__(self, settings: JobSettings, api: Any = None, *,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.settings = settings
        self._api = api
        self._sleep = sleep

    @property
    def shards(self) -> int:
        return self.settings.shards

    @property
    def api(self) -> Any:
        if self._api is None:
            from kubernetes import client, config
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            self._api = client.BatchV1Api()
        return self._api

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError as TransportError
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            detail = f"{what}: Kubernetes API answered {exc.status} {exc.reason}"
            if exc.status in (401, 403):
                raise errors.PermissionDenied(
                    detail + " (the evaluation service's Role must allow batch/jobs)") from None
            if exc.status == 404:
                raise errors.NotFound("Kubernetes Job", what) from None
            if exc.status in (409,):
                raise errors.AlreadyExists(detail) from None
            if exc.status in (400, 422):
                raise errors.InvalidArgument("jobs", detail) from None
            raise errors.Unavailable(detail) from None
        except (OSError, TransportError) as exc:    # refused, DNS, timeouts, retries spent
            raise errors.Unavailable(f"{what}: Kubernetes API unreachable: "
                                     f"{type(exc).__name__}") from None

    def submit(self, *, tenant: str, evaluation_id: str,
               worker_args: Sequence[str] = ()) -> str:
        """Create the evaluation's Job (or find the one a previous attempt created)."""
        body = job_manifest(self.settings, tenant=tenant, evaluation_id=evaluation_id,
                            worker_args=worker_args, trace_env=tracing.env_carrier())
        name = body["metadata"]["name"]
        try:
            self._call("create Job", self.api.create_namespaced_job, self.settings.namespace,
                       body)
        except errors.AlreadyExists:
            pass                        # resumed: the Job of the earlier attempt goes on
        return str(name)

    def status(self, name: str) -> JobOutcome | None:
        """The Job's outcome if it has ended, else None."""
        job = self._call("read Job status", self.api.read_namespaced_job_status, name,
                         self.settings.namespace)
        st = job.status
        succeeded, failed = int(st.succeeded or 0), int(st.failed or 0)
        for cond in st.conditions or ():
            if cond.status != "True":
                continue
            if cond.type == "Complete":
                return JobOutcome("succeeded", succeeded, failed)
            if cond.type == "Failed":
                why = f"{cond.reason or 'Failed'}: {cond.message or ''}".strip(": ")
                return JobOutcome("failed", succeeded, failed, why[:500])
        return None

    def wait(self, name: str, *, should_stop: Callable[[], bool] = lambda: False,
             poll_s: float = 2.0, timeout_s: float = 0.0) -> JobOutcome:
        """Poll the Job until it ends, the caller stops waiting, or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s if timeout_s else None
        while True:
            outcome = self.status(name)
            if outcome is not None:
                return outcome
            if should_stop() or (deadline is not None and time.monotonic() > deadline):
                return JobOutcome("stopped")
            self._sleep(poll_s)

    def delete(self, name: str) -> None:
        """Delete the Job and its pods (cancelled evaluation); a Job already gone is fine."""
        from kubernetes import client
        try:
            self._call("delete Job", self.api.delete_namespaced_job, name,
                       self.settings.namespace,
                       body=client.V1DeleteOptions(propagation_policy="Background"))
        except errors.NotFound:
            pass
