"""The ``fortis`` command line: the parser and the entry point.

Remote commands (``--address`` of a running Fortis, or ``watch``/``report``/``list``/
``cancel``) go through ``fortis.client`` only (``fortis.server.cli.remote``); local commands run the
engine in this process (``fortis.server.cli.local``, ``fortis.server.cli.catalogue``).
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import metadata

from fortis.server.cli import (
    artifacts,
    catalogue,
    compare,
    db,
    health,
    keys,
    local,
    remote,
    serve_parser,
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


def _client_opts(sp: argparse.ArgumentParser) -> None:
    """A command that runs embedded, or through a running Fortis with ``--address``."""
    sp.add_argument("--address", help="a running Fortis (fortis serve); default: start one embedded")
    sp.add_argument("--api-key", help="API key (default: $FORTIS_API_KEY)")
    sp.add_argument("--state-dir", help="where embedded runs keep state (default: $FORTIS_STATE or .fortis-state)")
    _tls_client_opts(sp)


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("demo", help="evaluate the Fashion-MNIST demo plan, everything embedded")
    sp.add_argument("--out", required=True, help="folder for report.json and report.html")
    sp.add_argument("--task", choices=["classification", "detection", "segmentation"],
                    default="classification",
                    help="classification: the Fashion-MNIST CNN (default); detection: OpenCV Haar "
                         "faces on offline photos; segmentation: U2-Net-p salient objects")
    sp.add_argument("--id", help="evaluation id (default: generated)")
    sp.add_argument("--quiet", action="store_true")
    _client_opts(sp)
    _pipeline_opts(sp)
    sp.set_defaults(fn=local.cmd_demo)


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("run", help="run a test plan and write its report")
    sp.add_argument("plan")
    sp.add_argument("--out", help="folder for report.json and report.html (required unless "
                    "--dry-run)")
    sp.add_argument("--id", help="evaluation id (idempotent: the same id returns the same evaluation)")
    sp.add_argument("--quiet", action="store_true")
    sp.add_argument("--dry-run", action="store_true",
                    help="print the plan's query estimate (as `fortis estimate`) and exit 0 "
                    "without running it")
    sp.add_argument("--json", action="store_true", help="with --dry-run: the estimate as JSON")
    _client_opts(sp)
    _pipeline_opts(sp)
    sp.set_defaults(fn=local.cmd_run)


def _cmd_estimate(ns: argparse.Namespace) -> int:
    """``fortis estimate PLAN``: ``fortis run PLAN --dry-run`` (embedded by default, or
    asked of ``--address``), quietly."""
    ns.dry_run, ns.out, ns.id, ns.quiet = True, None, None, True
    return local.cmd_run(ns)


def _add_estimate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("estimate", help="the target queries a plan will make (fixed, upper "
                        "bound, expected), the least time they take and their price; nothing "
                        "is sent")
    sp.add_argument("plan")
    sp.add_argument("--json", action="store_true", help="the estimate as JSON")
    _client_opts(sp)
    sp.set_defaults(fn=_cmd_estimate)


def _add_validate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("validate", help="check a plan (locally, or by a running Fortis with "
                        "--address: its catalogue and targets)")
    sp.add_argument("plan")
    _remote_opts(sp)
    sp.set_defaults(fn=_either(local.cmd_validate, remote.cmd_validate))


def _add_ledger(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    _client_opts(sp)
    sp.set_defaults(fn=local.cmd_ledger)


def _add_perturbations(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("perturbations", help="the catalogue: corruptions, styles, degradation "
                        "operators and safety properties (attacks: `fortis attacks`)")
    sp.add_argument("--json", action="store_true", help="everything, with parameters and level tables")
    sp.add_argument("--kind", choices=["corruption", "style", "degradation", "property"],
                    help="only this kind")
    _remote_opts(sp)
    sp.set_defaults(fn=_either(catalogue.cmd_perturbations, remote.cmd_perturbations))


def _add_attacks(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("attacks", help="the attack registry: transfer, score- and "
                        "decision-based attacks with their norms and parameter schemas")
    sp.add_argument("--json", action="store_true", help="everything, with parameter schemas")
    sp.add_argument("--kind", choices=["transfer", "score", "decision"], help="only this kind")
    _remote_opts(sp)
    sp.set_defaults(fn=_either(catalogue.cmd_attacks, remote.cmd_attacks))


def _add_watch(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("watch", help="follow an evaluation of a running Fortis until it ends")
    sp.add_argument("evaluation_id")
    sp.add_argument("--timeout", type=float, help="give up after this many seconds")
    sp.add_argument("--quiet", action="store_true")
    _remote_opts(sp, required=True)
    sp.set_defaults(fn=remote.cmd_watch)


def _add_report(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("report", help="write the report of a finished evaluation")
    sp.add_argument("evaluation_id")
    sp.add_argument("--out", required=True, help="folder for report.json and report.html")
    _remote_opts(sp, required=True)
    _pipeline_opts(sp)
    sp.set_defaults(fn=remote.cmd_report)


def _add_gate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def _add_mlflow_export(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def _add_list(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("list", help="the evaluations of a running Fortis, newest first")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--page-size", type=int, default=50, help="evaluations fetched per call")
    _remote_opts(sp, required=True)
    sp.set_defaults(fn=remote.cmd_list)


def _add_cancel(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("cancel", help="cancel a pending or running evaluation")
    sp.add_argument("evaluation_id")
    _remote_opts(sp, required=True)
    sp.set_defaults(fn=remote.cmd_cancel)


def _add_sheets(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def _add_score(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("score", help="compute a catalogue metric from recorded predictions (a JSON file)")
    sp.add_argument("file", nargs="?", help="scoring file: {metric, params, arrays}")
    sp.add_argument("--out", help="write the result here (default: stdout)")
    sp.add_argument("--list", action="store_true", help="list the metric catalogue")
    sp.add_argument("--json", action="store_true", help="with --list: as JSON")
    sp.set_defaults(fn=local.cmd_score)


def _add_train(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("train", help="train the Fashion-MNIST target and surrogate now")
    sp.set_defaults(fn=local.cmd_train)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fortis", description="Robustness testing of image-recognition services (IEEE Std 3129-2023)")
    p.add_argument("--version", action="version", version=f"fortis {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    # The sub-commands in the order ``fortis --help`` lists them.
    _add_demo(sub)
    _add_run(sub)
    _add_validate(sub)
    _add_estimate(sub)
    serve_parser.add_parser(sub)
    worker.add_parser(sub)
    health.add_parser(sub)
    db.add_parser(sub)
    artifacts.add_parser(sub)
    _add_ledger(sub)
    _add_perturbations(sub)
    _add_attacks(sub)
    _add_watch(sub)
    _add_report(sub)
    _add_gate(sub)
    compare.add_parser(sub)
    _add_mlflow_export(sub)
    _add_list(sub)
    _add_cancel(sub)
    _add_sheets(sub)
    _add_score(sub)
    keys.add_parser(sub)
    upload.add_parsers(sub, _remote_opts)
    _add_train(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from fortis.services.common import ast_guard

    ast_guard.install()         # threads parse (.npz headers): CPython 3.11 race, see there
    ns = build_parser().parse_args(argv)
    if ns.command != "serve":
        from fortis.server.cli.logs import configure
        configure("warning")
    try:
        return int(ns.fn(ns))
    except BrokenPipeError:          # `fortis perturbations | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
