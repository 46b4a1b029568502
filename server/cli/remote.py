"""The CLI's remote commands: everything they do goes through ``fortis.client`` (the slim
client distribution), never through server code, so they behave exactly as any other client
of a running Fortis would.

    fortis run PLAN --address A --out DIR    submit, follow, write the report
    fortis watch ID --address A              follow until it ends (exit 0 only if it succeeded)
    fortis report ID --address A --out DIR   write report.json/html of a finished evaluation
    fortis list --address A                  every evaluation (all pages)
    fortis cancel ID --address A
    fortis ledger --session ID --address A   query counts of one proxy session
    fortis perturbations|attacks --address A the server's catalogue

``run``, ``demo`` and ``report`` end with :func:`finish_report`: the verdict against the
plan's acceptance criteria (exit 3 when it fails; ``--strict``: inconclusive ones fail too),
``--pdf``, ``--junit`` and ``--mlflow-uri`` (docs/pipelines.md). The verdict is the one the
server's report carries; the JUnit and MLflow writers are client-side modules of this package.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, TypedDict

from fortis.client import FortisClient, FortisError, InvalidArgument, Perturbation, State
from fortis.server.cli.output import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    err,
    follow,
    print_summary,
    print_violations,
)

Command = Callable[[argparse.Namespace], int]

#: Exit code of a finished evaluation whose acceptance criteria fail (docs/pipelines.md).
EXIT_ACCEPTANCE = 3


def api_key_of(ns: argparse.Namespace) -> str:
    return getattr(ns, "api_key", None) or os.environ.get("FORTIS_API_KEY", "")


class TlsArgs(TypedDict, total=False):
    """FortisClient's TLS keyword arguments."""

    tls_ca: str
    tls_cert: str
    tls_key: str
    tls_server_name: str


def tls_of(ns: argparse.Namespace) -> TlsArgs:
    """FortisClient's TLS arguments from ``--tls-ca/--tls-cert/--tls-key/--tls-server-name``
    (or $FORTIS_TLS_CA/_CERT/_KEY/_SERVER_NAME); empty: plain text."""
    env = os.environ.get
    args = TlsArgs(tls_ca=getattr(ns, "tls_ca", None) or env("FORTIS_TLS_CA", ""),
                   tls_cert=getattr(ns, "tls_cert", None) or env("FORTIS_TLS_CERT", ""),
                   tls_key=getattr(ns, "tls_key", None) or env("FORTIS_TLS_KEY", ""),
                   tls_server_name=(getattr(ns, "tls_server_name", None)
                                    or env("FORTIS_TLS_SERVER_NAME", "")))
    return TlsArgs(**{k: v for k, v in args.items() if v})  # type: ignore[typeddict-item]


def guarded(fn: Command) -> Command:
    """Run a command; a FortisError becomes one clear line (and each bad field) and an exit
    code: 2 for invalid input, 1 for anything else."""

    @functools.wraps(fn)
    def run(ns: argparse.Namespace) -> int:
        try:
            return fn(ns)
        except InvalidArgument as exc:
            err("invalid request:")
            print_violations(exc)
            return EXIT_BAD_INPUT
        except FortisError as exc:
            err(f"{type(exc).__name__}: {exc}")
            return EXIT_FAILED
    return run


def _client(ns: argparse.Namespace) -> FortisClient:
    return FortisClient(ns.address, api_key=api_key_of(ns), **tls_of(ns))


def submit_and_follow(address: str, api_key: str, plan_text: str, out: Path,
                      ns: argparse.Namespace, tls: TlsArgs | None = None) -> int:
    """Submit a plan to ``address``, follow it, write and summarise its report (``tls``:
    FortisClient's TLS arguments, :func:`tls_of`)."""
    with FortisClient(address, api_key=api_key, **(tls or TlsArgs())) as client:
        try:
            ev = client.submit(plan_text, evaluation_id=ns.id or "")
        except InvalidArgument as exc:
            err("the plan is invalid:")
            print_violations(exc)
            return EXIT_BAD_INPUT
        if not ns.quiet:
            print(f"Evaluation {ev.evaluation_id} submitted", file=sys.stderr, flush=True)
        final = follow(client, ev.evaluation_id, ns.quiet, getattr(ns, "timeout", None))
        if final.state != State.SUCCEEDED:
            why = final.error.message if final.error else "no error recorded"
            err(f"evaluation {ev.evaluation_id} ended {final.state.value}: {why}")
            return EXIT_FAILED
        client.write_report(ev.evaluation_id, out)
        report = client.report(ev.evaluation_id)
    return finish_report(report, out, ns)


@guarded
def cmd_watch(ns: argparse.Namespace) -> int:
    with _client(ns) as client:
        final = follow(client, ns.evaluation_id, ns.quiet, ns.timeout)
    why = f": {final.error.message}" if final.error else ""
    print(f"{final.evaluation_id} {final.state.value}{why}")
    return 0 if final.state == State.SUCCEEDED else EXIT_FAILED


@guarded
def cmd_report(ns: argparse.Namespace) -> int:
    out = Path(ns.out)
    with _client(ns) as client:
        client.write_report(ns.evaluation_id, out)
        report = client.report(ns.evaluation_id)
    return finish_report(report, out, ns)


def print_verdict(verdict: dict[str, Any], *, strict: bool = False) -> None:
    """The verdict's lines: the status, then one line per criterion with its sentence."""
    criteria = [c for c in verdict.get("criteria") or [] if isinstance(c, dict)]
    if verdict.get("status") == "no_criteria" or not criteria:
        print("Verdict: no acceptance criteria in the plan (add `acceptance:` to gate on it)")
        return
    ok = verdict_exit(verdict, strict=strict) == 0
    unrun = [c for c in criteria if c.get("outcome") == "not_evaluated"]
    bad = [c for c in criteria if c.get("outcome") not in ("pass", "not_evaluated")
           or (strict and (c in unrun or c.get("confidence") == "inconclusive"))]
    word = "FAIL" if not ok else "INCOMPLETE" if unrun else "PASS"
    met = len(criteria) - len(bad) - (0 if strict else len(unrun))
    print(f"Verdict{' (strict)' if strict else ''}: {word} "
          f"({met} of {len(criteria)} criteria met"
          f"{f', {len(unrun)} not evaluated (a setting failed)' if unrun else ''}; the point "
          "estimate decides, the 95% CI says whether it is conclusive)")
    for c in criteria:
        mark = ("FAIL" if c in bad else "n/e" if c in unrun else "pass") + (
            "?" if c.get("confidence") == "inconclusive" else "")
        print(f"  {mark:<5} {c.get('text') or c.get('metric')}")


def verdict_exit(verdict: dict[str, Any] | None, *, strict: bool = False,
                 report: dict[str, Any] | None = None) -> int:
    """0 when the verdict passes (``strict``: strict_passed, and no setting of ``report``
    failed to run), else EXIT_ACCEPTANCE."""
    if strict and report is not None and report.get("failed_settings"):
        return EXIT_ACCEPTANCE
    if not verdict:
        return 0
    return 0 if (verdict.get("strict_passed") if strict else verdict.get("passed")) is True \
        else EXIT_ACCEPTANCE


def finish_report(report: dict[str, Any], out: Path, ns: argparse.Namespace) -> int:
    """After a report is written to ``out``: the summary and the verdict, then ``--pdf``,
    ``--junit`` and ``--mlflow-uri``; the exit code: 1 when an export failed, else 3 when
    the acceptance criteria fail (``--strict``: or are inconclusive or not evaluated, or a
    setting failed to run), else 0."""
    strict = bool(getattr(ns, "strict", False))
    print_summary(report, out)
    verdict = report.get("verdict")
    if isinstance(verdict, dict):
        print_verdict(verdict, strict=strict)
    else:
        print("Verdict: this server's report carries none (check it with `fortis gate "
              f"{out / 'report.json'}`)")
    code = 0
    written = [out / "report.json", out / "report.html"]
    pdf = getattr(ns, "pdf", None)
    if pdf:
        try:
            from fortis.server.cli.pdf import export_pdf
        except ImportError:
            err("--pdf: the PDF export is not available in this installation")
            code = EXIT_FAILED
        else:
            try:
                written.append(export_pdf(out / "report.html", Path(pdf)))
                print(f"PDF: {written[-1]}")
            except Exception as exc:  # a browser failure: one line, not a traceback
                err(f"--pdf: {type(exc).__name__}: {str(exc)[:500]}")
                code = EXIT_FAILED
    junit = getattr(ns, "junit", None)
    if junit:
        from fortis.server.cli.junit import write_junit

        try:
            written.append(write_junit(Path(junit), report, verdict or {}, strict=strict))
            print(f"JUnit: {junit}")
        except OSError as exc:
            err(f"--junit: cannot write {junit}: {exc}")
            code = EXIT_FAILED
    uri = getattr(ns, "mlflow_uri", None)
    if uri:
        from fortis.server.cli.mlflow_export import MlflowExportError, export_report

        try:
            _, run_id = export_report(report, uri=uri,
                                      experiment=getattr(ns, "mlflow_experiment", None),
                                      artifacts=written, verdict=verdict)
            print(f"MLflow: run {run_id} at {uri}")
        except MlflowExportError as exc:
            err(f"--mlflow-uri: {exc}")
            code = EXIT_FAILED
    return code or verdict_exit(verdict if isinstance(verdict, dict) else None, strict=strict,
                                report=report)


@guarded
def cmd_list(ns: argparse.Namespace) -> int:
    with _client(ns) as client:
        evs = list(client.iter_evaluations(page_size=ns.page_size))
    if ns.json:
        print(json.dumps([{
            "evaluation_id": e.evaluation_id, "state": e.state.value, "plan_name": e.plan_name,
            "stage": e.progress.stage, "items_done": e.progress.items_done,
            "items_total": e.progress.items_total, "queries": e.progress.queries,
            "create_time": e.create_time.isoformat() if e.create_time else None,
            "summary": e.summary} for e in evs], indent=2))
        return 0
    for e in evs:
        created = e.create_time.strftime("%Y-%m-%d %H:%M") if e.create_time else "-"
        print(f"{e.evaluation_id:<32} {e.state.value:<10} {created:<16} "
              f"{e.progress.items_done}/{e.progress.items_total:<8} {e.plan_name}")
    return 0


@guarded
def cmd_cancel(ns: argparse.Namespace) -> int:
    with _client(ns) as client:
        ev = client.cancel(ns.evaluation_id)
    print(f"{ev.evaluation_id} {ev.state.value}")
    return 0


@guarded
def cmd_ledger(ns: argparse.Namespace) -> int:
    if not ns.session:
        err("with --address give --session ID (listing an evaluation's sessions needs the "
            "local ledger: --state-dir)")
        return EXIT_BAD_INPUT
    with _client(ns) as client:
        st = client.session_stats(ns.session)
    result = {"session_id": ns.session, "target": st.target, "queries_ok": st.queries_ok,
              "queries_failed": st.queries_failed, "calls_refused": st.calls_refused,
              "queries_attempted": int(st.raw.queries_attempted),
              "queries_in_flight": int(st.raw.queries_in_flight),
              "query_budget": st.query_budget, "per_image_budget": st.per_image_budget,
              "per_image": st.per_image,
              "per_image_attempted": {i.image_id: int(i.attempts)
                                      for i in sorted(st.raw.images, key=lambda i: i.image_id)},
              "per_origin": st.per_origin}
    print_ledger([result], ns)
    return 0


def print_ledger(results: list[dict[str, Any]], ns: argparse.Namespace) -> None:
    """Ledger counts as JSON (one object for --session, a list for --evaluation) or lines."""
    if ns.json:
        print(json.dumps(results[0] if ns.session else results, indent=2))
        return
    for r in results:
        print(f"{r['session_id']}  target={r['target']}  ok={r['queries_ok']}  "
              f"failed={r['queries_failed']}  refused={r['calls_refused']}  "
              + (f"interrupted={r['queries_interrupted']}  "
                 if r.get("queries_interrupted") else "")
              + f"images={len(r['per_image'])}")


def _catalogue(ns: argparse.Namespace, keep: Callable[[Perturbation], bool]) -> int:
    with _client(ns) as client:
        items = [p for p in client.perturbations() if keep(p)]
    if ns.json:
        print(json.dumps([{f.name: getattr(p, f.name) for f in fields(p) if f.name != "raw"}
                          for p in items], indent=2))
        return 0
    for p in items:
        print(f"{p.id:<28} {p.kind:<16} {p.family:<12} {','.join(p.refs):<14} {p.description}")
    return 0


@guarded
def cmd_perturbations(ns: argparse.Namespace) -> int:
    return _catalogue(ns, lambda p: not ns.kind or p.kind.startswith(ns.kind))


@guarded
def cmd_attacks(ns: argparse.Namespace) -> int:
    with _client(ns) as fc:
        items = [a for a in fc.attacks() if not ns.kind or a.kind == ns.kind]
    if ns.json:
        print(json.dumps([{f.name: getattr(a, f.name) for f in fields(a) if f.name != "raw"}
                          for a in items], indent=2))
        return 0
    for a in items:
        print(f"{a.id:<12} {a.kind:<9} {','.join(a.norms):<8} {'yes' if a.targeted else 'no':<9} "
              f"{','.join(a.refs):<28} {a.description}")
    return 0


@guarded
def cmd_validate(ns: argparse.Namespace) -> int:
    """The plan checked by a running server (its catalogue and its targets)."""
    try:
        text = Path(ns.plan).read_text()
    except OSError as exc:
        err(f"cannot read plan: {exc}")
        return EXIT_BAD_INPUT
    with _client(ns) as fc:
        r = fc.validate(text)
    print(f"plan '{r['plan_name']}' is valid on {ns.address}: {r['corruptions']} corruptions, "
          f"{r['attacks']} attacks, {r['degradation_operators']} degradation operators")
    return 0
