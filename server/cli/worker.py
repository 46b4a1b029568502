"""``fortis worker``: one worker of an evaluation's work fan-out. Kubernetes' Indexed Job starts
it in every pod with ``JOB_COMPLETION_INDEX``; the evaluation service's ``--executor processes``
starts it as local processes. Settings come from flags or the environment the Job sets
(``FORTIS_EVALUATION_ID``, ``FORTIS_TENANT``, ``FORTIS_DATABASE_URL``, ``FORTIS_PROXY_ADDRESS``,
``FORTIS_PERTURBATION_ADDRESS``, ``FORTIS_INTERNAL_KEY``: the key only ever from the
environment, a secret).

Exit codes: 0 every item of the evaluation is finished (or it already ended), 1 failed (a
transient failure: the Job's backoff retries the pod; a permanent one is also recorded on the
evaluation), 2 bad settings, 143 stopped by SIGTERM at an item boundary (its unfinished
items given back for the other workers).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from pathlib import Path

from fortis.server.cli.output import EXIT_BAD_INPUT, err

EXIT_FAILED = 1
EXIT_STOPPED = 143


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    sp = sub.add_parser("worker", help="run the work items of one evaluation with other "
                        "workers (an Indexed Job pod, or --executor processes)")
    env = os.environ.get
    sp.add_argument("--evaluation-id", default=env("FORTIS_EVALUATION_ID", ""),
                    help="the evaluation (default: $FORTIS_EVALUATION_ID)")
    sp.add_argument("--tenant", default=env("FORTIS_TENANT", ""),
                    help="its tenant (default: $FORTIS_TENANT)")
    sp.add_argument("--index", default=env("JOB_COMPLETION_INDEX", "0"),
                    help="this worker's index (default: $JOB_COMPLETION_INDEX, else 0)")
    sp.add_argument("--state-dir", default=env("FORTIS_STATE", ".fortis-state"),
                    help="the evaluation service's state folder, when no database URL is given "
                         "(default: $FORTIS_STATE or .fortis-state)")
    sp.add_argument("--database-url", default=env("FORTIS_DATABASE_URL", ""),
                    help="PostgreSQL of the evaluation service (default: $FORTIS_DATABASE_URL)")
    sp.add_argument("--proxy-address", default=env("FORTIS_PROXY_ADDRESS", ""),
                    help="the proxy (default: $FORTIS_PROXY_ADDRESS), e.g. "
                         "dns:///fortis-proxy.team-a.svc.cluster.local:50051")
    sp.add_argument("--perturbation-address", default=env("FORTIS_PERTURBATION_ADDRESS", ""),
                    help="the perturbation service (default: $FORTIS_PERTURBATION_ADDRESS); a "
                         "comma-separated list: worker i uses the (i mod n)-th")
    sp.add_argument("--data-root", default=env("FORTIS_DATA_ROOT", ""),
                    help="the operator's dataset folder, as the evaluation service has it")
    sp.add_argument("--dataset-stores", default=env("FORTIS_DATASET_STORES", ""),
                    help="the operator's dataset stores file (S3 credentials per tenant), as "
                         "the evaluation service has it")
    sp.add_argument("--lease", type=float, default=60.0,
                    help="seconds a claimed item stays this worker's without a heartbeat "
                         "(renewed every third of it; default 60)")
    sp.add_argument("--parallel", type=int, default=2,
                    help="items in flight at once in this worker (default 2)")
    sp.add_argument("--tls-cert", default=env("FORTIS_TLS_CERT", ""),
                    help="this worker's certificate for mTLS to the services")
    sp.add_argument("--tls-key", default=env("FORTIS_TLS_KEY", ""))
    sp.add_argument("--tls-ca", default=env("FORTIS_TLS_CA", ""),
                    help="the CA the services' certificates are signed by")
    sp.add_argument("--tls-server-name", default=env("FORTIS_TLS_SERVER_NAME", ""))
    sp.add_argument("--log-level", default=env("FORTIS_LOG_LEVEL", "info"),
                    choices=["debug", "info", "warning", "error"])
    sp.set_defaults(fn=cmd_worker)


def _settings(ns: argparse.Namespace) -> object:
    from fortis.infra.serving.tls import TlsSettings
    from fortis.server.app.worker import WorkerSettings
    from fortis.services.common.errors import InvalidArgument

    try:
        index = int(str(ns.index).strip())
    except ValueError:
        raise InvalidArgument("index", f"JOB_COMPLETION_INDEX must be a whole number, not "
                              f"'{str(ns.index)[:40]}'") from None
    tls = None
    if ns.tls_cert or ns.tls_key:
        if not (ns.tls_cert and ns.tls_key):
            raise InvalidArgument("tls_cert", "--tls-cert and --tls-key go together")
        tls = TlsSettings(cert_file=Path(ns.tls_cert), key_file=Path(ns.tls_key),
                          ca_file=Path(ns.tls_ca) if ns.tls_ca else None,
                          server_name=ns.tls_server_name or "")
    return WorkerSettings(
        evaluation_id=ns.evaluation_id, tenant=ns.tenant, index=index,
        state_dir=Path(ns.state_dir), database_url=ns.database_url or None,
        proxy_address=ns.proxy_address, perturbation_address=ns.perturbation_address,
        internal_key=os.environ.get("FORTIS_INTERNAL_KEY", ""), tls=tls,
        data_root=Path(ns.data_root) if ns.data_root else None,
        dataset_stores=Path(ns.dataset_stores) if ns.dataset_stores else None, lease_s=float(ns.lease),
        parallel=int(ns.parallel))


def cmd_worker(ns: argparse.Namespace) -> int:
    from fortis.server.app.worker import run_worker
    from fortis.server.cli.logs import configure
    from fortis.services.common.errors import DeadlineExceeded, FortisError, Unavailable

    configure(ns.log_level)
    try:
        settings = _settings(ns)
    except FortisError as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        result = run_worker(settings, stop)  # type: ignore[arg-type]
    except (Unavailable, DeadlineExceeded) as exc:
        err(f"worker: {exc} (transient: the Job retries this pod)")
        return EXIT_FAILED
    except FortisError as exc:          # bad settings found on start (store, addresses)
        err(f"worker: {exc}")
        return EXIT_BAD_INPUT
    print(json.dumps({"state": result.state, "ran": result.ran, "reused": result.reused,
                      "waited": result.waited, "seconds": result.seconds,
                      **({"message": result.message} if result.message else {})}), flush=True)
    if result.state == "failed":
        return EXIT_FAILED
    if result.state == "stopped" and stop.is_set():
        return EXIT_STOPPED
    return 0
