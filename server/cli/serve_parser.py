"""The options of ``fortis serve``, one function per group, in the order ``--help`` lists them."""

from __future__ import annotations

import argparse
import os

from fortis.server.cli import local


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("serve", help="serve all services in one process, or one with --service")
    sp.add_argument("--address", default="127.0.0.1:50051")
    sp.add_argument("--service", choices=["proxy", "perturbation", "scoring", "report", "evaluation"])
    sp.add_argument("--state-dir")
    _identity_opts(sp)
    _tls_opts(sp)
    _target_opts(sp)
    _shared_state_opts(sp)
    _quota_opts(sp)
    _data_opts(sp)
    _memory_opts(sp)
    _runtime_opts(sp)
    _executor_opts(sp)
    sp.set_defaults(fn=local.cmd_serve)


def _identity_opts(sp: argparse.ArgumentParser) -> None:
    """API keys, bearer tokens and certificate tenants: who a call is from."""
    sp.add_argument("--api-key", action="append", help="KEY=TENANT (repeatable; also $FORTIS_API_KEYS)")
    sp.add_argument("--no-auth", action="store_true", help="accept calls without an API key (local use only)")
    sp.add_argument("--api-keys-file", metavar="FILE",
                    help="API keys as 'TENANT sha256:<hex>' lines (fortis keys new), e.g. a "
                         "Kubernetes secret mount; re-read when it changes and on SIGHUP")
    sp.add_argument("--api-keys-reload", type=float, default=2.0, metavar="SECONDS",
                    help="how often the key file is checked for changes (default 2; 0: "
                         "only on SIGHUP)")
    sp.add_argument("--oidc-issuer", action="append", metavar="URL[,KEY=VALUE...]",
                    help="accept bearer tokens (authorization: Bearer <jwt>) of this OpenID "
                    "Connect issuer, e.g. the corporate IdP or the Kubernetes API server's "
                    "service-account issuer (repeatable; also $FORTIS_OIDC_ISSUER, several "
                    "separated by spaces). Per issuer, overriding the flags below: "
                    "audience=A, tenant-claim=C, tenants=T1:T2, tenant-prefix=P, jwks-url=U, "
                    "ca-file=F, algorithms=RS256:ES256, leeway=S. Each issuer needs tenants= "
                    "and/or tenant-prefix=")
    sp.add_argument("--oidc-audience", action="append", metavar="AUD",
                    help="the audience (aud) tokens must be made for (repeatable; also "
                    "$FORTIS_OIDC_AUDIENCE)")
    sp.add_argument("--oidc-tenant-claim", metavar="CLAIM",
                    help="the claim naming the tenant, dotted for nested claims (e.g. "
                    "kubernetes.io.namespace; also $FORTIS_OIDC_TENANT_CLAIM)")
    sp.add_argument("--oidc-tenants", metavar="T1:T2",
                    help="the tenants tokens may name, ':'-separated ('*': any; tenant names "
                    "are shared with API keys, so say which; also $FORTIS_OIDC_TENANTS)")
    sp.add_argument("--oidc-tenant-prefix", metavar="PREFIX",
                    help="put in front of the claim's value, so tokens' tenants are apart from "
                    "every other name (e.g. k8s- for namespaces; also "
                    "$FORTIS_OIDC_TENANT_PREFIX)")
    sp.add_argument("--oidc-jwks-url", metavar="URL",
                    help="the issuer's JWKS (default: jwks_uri of its "
                    "/.well-known/openid-configuration; also $FORTIS_OIDC_JWKS_URL)")
    sp.add_argument("--oidc-ca-file", metavar="FILE",
                    help="CA bundle verifying the JWKS host (default: the system's; also "
                    "$FORTIS_OIDC_CA_FILE)")
    sp.add_argument("--tls-tenant-from", metavar="CN|O|SAN-URI=PREFIX",
                    help="take the tenant of a call without an API key or token from its "
                    "verified client certificate (needs --tls-client-auth require; also "
                    "$FORTIS_TLS_TENANT_FROM)")


def _tls_opts(sp: argparse.ArgumentParser) -> None:
    """TLS of the server and of the internal channels between services."""
    sp.add_argument("--tls-cert", metavar="FILE", help="serve TLS only, with this certificate "
                    "(PEM; re-read when it changes)")
    sp.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    sp.add_argument("--tls-ca", metavar="FILE", help="CA of client certificates (with "
                    "--tls-client-auth require) and of the other services' certificates "
                    "(the internal channels use mTLS with this service's certificate)")
    sp.add_argument("--tls-client-auth", choices=["none", "require"], default="none",
                    help="require: every client presents a certificate signed by --tls-ca")
    sp.add_argument("--tls-server-name", metavar="NAME", help="the name internal channels "
                    "verify in the services' certificates (default: the host they dial)")


def _target_opts(sp: argparse.ArgumentParser) -> None:
    """The targets, the other services' addresses (one service per process) and the proxy's ledger and rates."""
    sp.add_argument("--target", action="append",
                    help="NAME=builtin:MODEL[?output=full_scores|top_k|label_only&top_k=K&rate=N] or NAME=grpc://HOST:PORT[?rate=N]")
    sp.add_argument("--no-default-targets", action="store_true")
    for s in ("proxy", "perturbation", "scoring", "report"):
        sp.add_argument(f"--{s}-address", help=f"the {s} service (when running one service)")
    sp.add_argument("--ledger-sync", choices=["FULL", "NORMAL"], default="FULL",
                    help="FULL (default): every query's ledger row is on disk (fsync) before "
                         "its image is sent, its outcome within 50 ms of the answer (a power cut "
                         "in between: the row reads INTERRUPTED, still charged); NORMAL: "
                         "survives a crash of Fortis but not of the machine, one fsync (about "
                         "0.5 ms on this class of disk) less per query")
    sp.add_argument("--tenant-rate", action="append", metavar="TENANT=N",
                    help="images/s for one tenant across all targets (repeatable; exact: no "
                         "1-second window at a target holds more)")


def _shared_state_opts(sp: argparse.ArgumentParser) -> None:
    """State shared by replicas: Redis for limits and budgets, PostgreSQL for the store and ledger."""
    sp.add_argument("--redis-url", metavar="URL",
                    help="Redis shared by proxy replicas (redis://[:PASSWORD@]HOST:PORT/DB; "
                    "default: $FORTIS_REDIS_URL, which keeps a password out of the process "
                    "list): rate limits, session budgets and queries per day hold in total; if "
                    "Redis cannot be reached calls are refused (UNAVAILABLE). Default: none, "
                    "all in this process")
    sp.add_argument("--redis-namespace", metavar="NAME",
                    help="prefix of this deployment's Redis keys (default: "
                    "$FORTIS_REDIS_NAMESPACE or 'default'); replicas sharing limits use the same")
    sp.add_argument("--database-url", metavar="URL",
                    help="PostgreSQL for the evaluation store and the proxy ledger, shared by "
                    "replicas and workers (postgresql://USER:PASSWORD@HOST:PORT/DB; default: "
                    "$FORTIS_DATABASE_URL, which keeps the password out of the process list); "
                    "its schema must be at head (`fortis db upgrade`). Default: none, SQLite "
                    "files in the state folder")


def _quota_opts(sp: argparse.ArgumentParser) -> None:
    """Per-tenant quotas and the server's capacity (threads, work slots, processes)."""
    sp.add_argument("--max-running-per-tenant", type=int, default=0, metavar="N",
                    help="evaluations one tenant runs at once (default 0: no limit); the "
                    "others wait, started round-robin across tenants")
    sp.add_argument("--max-queued-per-tenant", type=int, default=0, metavar="N",
                    help="evaluations one tenant may have waiting to start; CreateEvaluation "
                    "beyond it is RESOURCE_EXHAUSTED (default 0: no limit)")
    sp.add_argument("--max-queries-per-day-per-tenant", type=int, default=0, metavar="N",
                    help="images the proxy sends for one tenant per UTC day, retries included "
                    "(default 0: no limit)")
    sp.add_argument("--max-calls-per-tenant", type=int, default=16, metavar="N",
                    help="calls of one tenant in progress at once on this server (default 16; "
                    "0: no limit); one more is RESOURCE_EXHAUSTED at once, so no tenant can "
                    "hold every worker thread (see --server-workers)")
    sp.add_argument("--max-call-rate-per-tenant", type=int, default=None, metavar="N",
                    help="calls one tenant starts per second on this server (default 50; 0: "
                    "no limit); a call beyond it waits its turn (up to 2 s), else "
                    "RESOURCE_EXHAUSTED")
    sp.add_argument("--server-workers", type=int, default=64, metavar="N",
                    help="the server's worker threads; each call in progress holds one "
                    "(default 64)")
    sp.add_argument("--work-slots", type=int, default=None, metavar="N",
                    help="CPU-heavy pieces of work (perturbations, white-box attacks, "
                    "built-in targets' inference, metrics, reports) run at once, shared "
                    "fairly between the tenants that want them (default: one per core; "
                    "0: no sharing)")
    sp.add_argument("--work-processes", type=int, default=None, metavar="N",
                    help="worker processes that run the scoring service's metrics, so a long "
                    "metric does not hold the interpreter lock other tenants' calls need "
                    "(default: one per work slot; 0: in the server's own threads)")
    sp.add_argument("--tenant-quota", action="append",
                    metavar="TENANT=running:N,queued:N,queries_per_day:N,calls:N,calls_per_second:N",
                    help="one tenant's quotas, overriding the defaults above (repeatable; "
                    "each quota may be left out; 0 = no limit)")
    sp.add_argument("--evaluation-workers", type=int, default=2, metavar="N",
                    help="evaluations running at once on this server (default 2)")


def _data_opts(sp: argparse.ArgumentParser) -> None:
    """Server-side datasets, operator surrogates, white-box grants and upload quotas."""
    sp.add_argument("--data-root", help="folder of server-side datasets: manifest plans name "
                    "paths relative to it (default: none, manifest plans are refused)")
    sp.add_argument("--dataset-stores", default=os.environ.get("FORTIS_DATASET_STORES", ""),
                    metavar="FILE",
                    help="YAML file of each tenant's named S3 credentials (secret references) "
                    "and allowed endpoints, for plans reading datasets from S3 "
                    "(dataset.store; default: $FORTIS_DATASET_STORES, else none)")
    sp.add_argument("--surrogate-dir", default=os.environ.get("FORTIS_SURROGATE_DIR", ""),
                    metavar="DIR",
                    help="folder of operator surrogates: <name>.json manifests (the plan's "
                    "surrogates schema, model = a file in DIR) named in plans like the "
                    "built-ins (default: $FORTIS_SURROGATE_DIR, else none)")
    sp.add_argument("--whitebox-grant", action="append", metavar="TENANT=TARGET[,TARGET]",
                    help="let TENANT use surrogates that share those targets' weights (a "
                    "built-in twin such as fmnist-cnn, or an operator surrogate declared "
                    "twin_of them; TENANT=* for every target; repeatable). Default: no tenant, "
                    "except the one tenant of --no-auth or of the generated key")
    sp.add_argument("--upload-quota-bytes", type=int, default=2 * 1024 ** 3, metavar="N",
                    help="bytes each tenant may keep in uploaded images, manifests and models "
                    "(fortis upload; default 2 GiB)")


def _memory_opts(sp: argparse.ArgumentParser) -> None:
    """Decoded-bytes limits per request and per tenant, and memory kept for reuse."""
    sp.add_argument("--max-request-decoded-bytes", type=int, default=128 * 1024 ** 2,
                    metavar="N",
                    help="bytes the images and arrays of one request may take once decoded, "
                    "read from their PNG/JPEG headers and tensor shapes before anything is "
                    "decoded (default 128 MiB: one 40 M-pixel RGB image; 0: no limit); more "
                    "is RESOURCE_EXHAUSTED naming the field")
    sp.add_argument("--max-tenant-decoded-bytes", type=int, default=256 * 1024 ** 2,
                    metavar="N",
                    help="decoded bytes one tenant's calls in progress may hold together on "
                    "this server (default 256 MiB; 0: no limit); a call past it is "
                    "RESOURCE_EXHAUSTED at once, the bytes given back when each call ends")
    sp.add_argument("--keep-freed-mib", type=int, default=256, metavar="N",
                    help="free memory the process keeps for reuse instead of giving it back "
                    "(glibc only): large answers are then copied without faulting in fresh "
                    "pages while every other call waits (default 256; 0: the C library's "
                    "defaults; docs/limits.md)")


def _runtime_opts(sp: argparse.ArgumentParser) -> None:
    """Metrics, logging and shutdown."""
    sp.add_argument("--metrics-address", metavar="HOST:PORT",
                    help="serve Prometheus metrics (RPCs and proxy queries, labelled by tenant) "
                    "at http://HOST:PORT/metrics; bind 0.0.0.0 only on purpose")
    sp.add_argument("--metrics-port", type=int,
                    help="the same as --metrics-address 127.0.0.1:PORT")
    sp.add_argument("--log-level", default="info")
    sp.add_argument("--shutdown-grace", type=float, default=10.0, metavar="SECONDS",
                    help="on SIGTERM/SIGINT: seconds in-flight calls get before they are cut "
                    "(health says NOT_SERVING meanwhile and new calls are refused, UNAVAILABLE); "
                    "the process ends within about this plus 3 s, running evaluations resume "
                    "on the next start (default 10)")


def _executor_opts(sp: argparse.ArgumentParser) -> None:
    """Who runs an evaluation's work items (the executor)."""
    ex = sp.add_argument_group("work fan-out: who runs an evaluation's work items")
    ex.add_argument("--executor", choices=["local", "processes", "kubernetes"],
                    default=os.environ.get("FORTIS_EXECUTOR", "local"),
                    help="local: this service's worker threads (default); processes: "
                    "--worker-processes local `fortis worker` processes; kubernetes: one "
                    "Indexed Job per evaluation in --job-namespace (default: $FORTIS_EXECUTOR)")
    ex.add_argument("--worker-processes", type=int, default=2, metavar="N",
                    help="with --executor processes: workers per evaluation (default 2)")
    ex.add_argument("--job-image", default=os.environ.get("FORTIS_JOB_IMAGE", ""),
                    metavar="IMAGE", help="with --executor kubernetes: the workers' image")
    ex.add_argument("--job-shards", type=int, default=2, metavar="N",
                    help="with --executor kubernetes: pods per evaluation (default 2)")
    ex.add_argument("--job-namespace", default=os.environ.get("POD_NAMESPACE", ""),
                    metavar="NS", help="with --executor kubernetes: the namespace (default: "
                    "$POD_NAMESPACE, else the pod's own service-account namespace)")
    ex.add_argument("--job-service-account", default="fortis-worker", metavar="NAME",
                    help="with --executor kubernetes: the workers' service account")
    ex.add_argument("--job-secret-env", action="append", metavar="VAR=SECRET:KEY",
                    help="with --executor kubernetes: an environment variable of the workers "
                    "from a secret (repeatable), e.g. FORTIS_DATABASE_URL=fortis-db:url")
    ex.add_argument("--job-tls-secret", default=os.environ.get("FORTIS_JOB_TLS_SECRET", ""),
                    metavar="NAME", help="with --executor kubernetes and --tls-cert: the "
                    "Secret holding this certificate (tls.crt, tls.key, ca.crt), mounted "
                    "read-only in the workers' pods so they call the services over (m)TLS "
                    "(default: $FORTIS_JOB_TLS_SECRET)")
