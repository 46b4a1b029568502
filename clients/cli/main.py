"""The ``fortis`` command line: the parser and the entry point.

Remote commands (``--address`` of a running Fortis, or ``watch``/``report``/``list``/
``cancel``) go through ``fortis.client`` only (``fortis.cli.remote``); local commands run the
engine in this process (``fortis.cli.local``, ``fortis.cli.catalogue``).
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import metadata

from fortis.cli import (
    artifacts,
    catalogue,
    compare,
    db,
    health,
    keys,
    local,
    remote,
    upload,
    worker,
)


def _version() -> str:
    try:
        return metadata.version("fortis")
    except metadata.PackageNotFoundError:    # running from a source tree without install
        return "unknown"


def _either(local_fn: remote.Command, remote_fn: remote.Command) -> remote.Command:
    """A command that runs locally, or through the client when ``--address`` is given."""
    def run(ns: argparse.Namespace) -> int:
        return remote_fn(ns) if getattr(ns, "address", None) else local_fn(ns)
    return run


def _remote_opts(sp: argparse.ArgumentParser, *, required: bool = False) -> None:
    sp.add_argument("--address", required=required,
                    help="a running Fortis (fortis serve), e.g. 127.0.0.1:50051")
    sp.add_argument("--api-key", help="API key (default: $FORTIS_API_KEY)")
    _tls_client_opts(sp)


def _tls_client_opts(sp: argparse.ArgumentParser) -> None:
    """TLS to a server started with --tls-cert."""
    sp.add_argument("--tls-ca", metavar="FILE",
                    help="connect with TLS, trusting this CA (default: $FORTIS_TLS_CA)")
    sp.add_argument("--tls-cert", metavar="FILE", help="client certificate, when the server "
                    "requires one (mTLS; default: $FORTIS_TLS_CERT)")
    sp.add_argument("--tls-key", metavar="FILE", help="the client certificate's key "
                    "(default: $FORTIS_TLS_KEY)")
    sp.add_argument("--tls-server-name", metavar="NAME",
                    help="the name to verify in the server's certificate (default: the host)")


def _pipeline_opts(sp: argparse.ArgumentParser) -> None:
    """What a pipeline does with a finished report (docs/pipelines.md)."""
    g = sp.add_argument_group("pipelines: the acceptance gate and exports")
    g.add_argument("--strict", action="store_true",
                   help="inconclusive acceptance criteria (the 95%% CI straddles the "
                        "threshold) fail too (exit 3)")
    g.add_argument("--junit", metavar="FILE", help="write JUnit XML: one test case per "
                   "setting and per acceptance criterion")
    g.add_argument("--pdf", metavar="FILE", help="also print the HTML report to PDF "
                   "(headless Chromium)")
    g.add_argument("--mlflow-uri", metavar="URI", help="log metrics, parameters and the "
                   "report files to this MLflow tracking store (file:///DIR/mlruns, "
                   "sqlite:///mlflow.db, http://HOST:PORT; needs fortis[mlflow])")
    g.add_argument("--mlflow-experiment", metavar="NAME",
                   help="the MLflow experiment (default: the plan's name)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fortis", description="Robustness testing of image-recognition services (IEEE Std 3129-2023)")
    p.add_argument("--version", action="version", version=f"fortis {_version()}")
    sub = p.add_subparsers(dest="command", required=True)

    def client_opts(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--address", help="a running Fortis (fortis serve); default: start one embedded")
        sp.add_argument("--api-key", help="API key (default: $FORTIS_API_KEY)")
        sp.add_argument("--state-dir", help="where embedded runs keep state (default: $FORTIS_STATE or .fortis-state)")
        _tls_client_opts(sp)

    sp = sub.add_parser("demo", help="evaluate the Fashion-MNIST demo plan, everything embedded")
    sp.add_argument("--out", required=True, help="folder for report.json and report.html")
    sp.add_argument("--task", choices=["classification", "detection", "segmentation"],
                    default="classification",
                    help="classification: the Fashion-MNIST CNN (default); detection: OpenCV Haar "
                         "faces on offline photos; segmentation: U2-Net-p salient objects")
    sp.add_argument("--id", help="evaluation id (default: generated)")
    sp.add_argument("--quiet", action="store_true")
    client_opts(sp)
    _pipeline_opts(sp)
    sp.set_defaults(fn=local.cmd_demo)

    sp = sub.add_parser("run", help="run a test plan and write its report")
    sp.add_argument("plan")
    sp.add_argument("--out", required=True)
    sp.add_argument("--id", help="evaluation id (idempotent: the same id returns the same evaluation)")
    sp.add_argument("--quiet", action="store_true")
    client_opts(sp)
    _pipeline_opts(sp)
    sp.set_defaults(fn=local.cmd_run)

    sp = sub.add_parser("validate", help="check a plan (locally, or by a running Fortis with "
                        "--address: its catalogue and targets)")
    sp.add_argument("plan")
    _remote_opts(sp)
    sp.set_defaults(fn=_either(local.cmd_validate, remote.cmd_validate))

    sp = sub.add_parser("serve", help="serve all services in one process, or one with --service")
    sp.add_argument("--address", default="127.0.0.1:50051")
    sp.add_argument("--service", choices=["proxy", "perturbation", "scoring", "report", "evaluation"])
    sp.add_argument("--state-dir")
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
    sp.add_argument("--data-root", help="folder of server-side datasets: manifest plans name "
                    "paths relative to it (default: none, manifest plans are refused)")
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
    sp.set_defaults(fn=local.cmd_serve)
    worker.add_parser(sub)
    health.add_parser(sub)
    db.add_parser(sub)
    artifacts.add_parser(sub)

    sp = sub.add_parser("ledger", help="query counts from the proxy's ledger")
    sp.add_argument("--session", help="session id")
    sp.add_argument("--evaluation", help="every session of an evaluation (local ledger)")
    sp.add_argument("--tenant", help="only this tenant's sessions (local ledger; default: "
                    "every tenant, the operator's view)")
    sp.add_argument("--database-url", metavar="URL",
                    help="read the ledger the proxies share in this PostgreSQL (read-only; "
                    "default: $FORTIS_DATABASE_URL when set, else the SQLite ledger in "
                    "--state-dir)")
    sp.add_argument("--json", action="store_true")
    client_opts(sp)
    sp.set_defaults(fn=local.cmd_ledger)

    sp = sub.add_parser("perturbations", help="the catalogue: corruptions, styles, degradation "
                        "operators and safety properties (attacks: `fortis attacks`)")
    sp.add_argument("--json", action="store_true", help="everything, with parameters and level tables")
    sp.add_argument("--kind", choices=["corruption", "style", "degradation", "property"],
                    help="only this kind")
    _remote_opts(sp)
    sp.set_defaults(fn=_either(catalogue.cmd_perturbations, remote.cmd_perturbations))

    sp = sub.add_parser("attacks", help="the attack registry: transfer, score- and "
                        "decision-based attacks with their norms and parameter schemas")
    sp.add_argument("--json", action="store_true", help="everything, with parameter schemas")
    sp.add_argument("--kind", choices=["transfer", "score", "decision"], help="only this kind")
    _remote_opts(sp)
    sp.set_defaults(fn=_either(catalogue.cmd_attacks, remote.cmd_attacks))

    sp = sub.add_parser("watch", help="follow an evaluation of a running Fortis until it ends")
    sp.add_argument("evaluation_id")
    sp.add_argument("--timeout", type=float, help="give up after this many seconds")
    sp.add_argument("--quiet", action="store_true")
    _remote_opts(sp, required=True)
    sp.set_defaults(fn=remote.cmd_watch)

    sp = sub.add_parser("report", help="write the report of a finished evaluation")
    sp.add_argument("evaluation_id")
    sp.add_argument("--out", required=True, help="folder for report.json and report.html")
    _remote_opts(sp, required=True)
    _pipeline_opts(sp)
    sp.set_defaults(fn=remote.cmd_report)

    sp = sub.add_parser("gate", help="re-check a report.json against its plan's acceptance "
                        "criteria offline (exit 3 when they fail)")
    sp.add_argument("report", help="a report.json")
    sp.add_argument("--strict", action="store_true",
                    help="inconclusive criteria (the 95%% CI straddles the threshold) fail too")
    sp.add_argument("--criterion", action="append", metavar="'METRIC OP NUMBER'",
                    help="judge these criteria instead of the plan's (repeatable), e.g. "
                    "'accuracy >= 0.9' or 'attacks.square.success_rate <= 30%%'")
    sp.add_argument("--junit", metavar="FILE", help="also write JUnit XML")
    sp.set_defaults(fn=local.cmd_gate)

    compare.add_parser(sub)

    sp = sub.add_parser("mlflow-export", help="log an existing report.json (and the files "
                        "beside it) to an MLflow tracking store")
    sp.add_argument("report", help="a report.json")
    sp.add_argument("--mlflow-uri", required=True, metavar="URI",
                    help="file:///DIR/mlruns, sqlite:///mlflow.db or http://HOST:PORT")
    sp.add_argument("--mlflow-experiment", metavar="NAME",
                    help="the experiment (default: the plan's name)")
    sp.add_argument("--artifact", action="append", metavar="FILE",
                    help="another file to log (repeatable; report.json, and report.html / "
                    "report.pdf / junit.xml beside it, are logged anyway)")
    sp.set_defaults(fn=local.cmd_mlflow_export)

    sp = sub.add_parser("list", help="the evaluations of a running Fortis, newest first")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--page-size", type=int, default=50, help="evaluations fetched per call")
    _remote_opts(sp, required=True)
    sp.set_defaults(fn=remote.cmd_list)

    sp = sub.add_parser("cancel", help="cancel a pending or running evaluation")
    sp.add_argument("evaluation_id")
    _remote_opts(sp, required=True)
    sp.set_defaults(fn=remote.cmd_cancel)

    sp = sub.add_parser("sheets", help="example sheets: one image under every perturbation at a "
                        "few levels, as PNG grids")
    sp.add_argument("--out", required=True, help="folder for the PNG sheets")
    sp.add_argument("--image", default="astronaut",
                    help="a PNG/JPEG path, or a built-in photo: astronaut, chelsea, coffee, "
                         "eagle, dog, fashion-mnist (default: astronaut)")
    sp.add_argument("--kind", action="append",
                    choices=["corruption", "style", "degradation", "property"],
                    help="only these kinds (repeatable; default: all)")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--size", type=int, default=160, help="tile size in pixels (default: 160)")
    sp.set_defaults(fn=local.cmd_sheets)

    sp = sub.add_parser("score", help="compute a catalogue metric from recorded predictions (a JSON file)")
    sp.add_argument("file", nargs="?", help="scoring file: {metric, params, arrays}")
    sp.add_argument("--out", help="write the result here (default: stdout)")
    sp.add_argument("--list", action="store_true", help="list the metric catalogue")
    sp.add_argument("--json", action="store_true", help="with --list: as JSON")
    sp.set_defaults(fn=local.cmd_score)

    keys.add_parser(sub)
    upload.add_parsers(sub, _remote_opts)

    sp = sub.add_parser("train", help="train the Fashion-MNIST target and surrogate now")
    sp.set_defaults(fn=local.cmd_train)
    return p


def main(argv: list[str] | None = None) -> int:
    from fortis.services.common import ast_guard

    ast_guard.install()         # threads parse (.npz headers): CPython 3.11 race, see there
    ns = build_parser().parse_args(argv)
    if ns.command != "serve":
        from fortis.cli.logs import configure
        configure("warning")
    try:
        return int(ns.fn(ns))
    except BrokenPipeError:          # `fortis perturbations | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
