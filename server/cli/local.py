"""The CLI's local commands: they run Fortis's engine in this process (``fortis serve``, an
embedded ``fortis run``/``demo``, ``validate``, ``sheets``, ``score``, ``train``, the local
ledger). Server modules are imported inside each command, so ``fortis --help`` and the
remote commands start fast.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from importlib import resources
from pathlib import Path
from typing import Any

from fortis.core.task import Task
from fortis.server.cli import remote
from fortis.server.cli.output import EXIT_BAD_INPUT, EXIT_FAILED, err, print_violations
from fortis.server.cli.serve_setup import (
    _address_in_use,
    _evaluation_workers,
    _executor_settings,
    _freeze_startup_objects,
    _identity_options,
    _memory_limits,
    _metrics_address,
    _quota_settings,
    _server_workers,
    _shutdown,
    _tenant_rates,
    _tls_settings,
    _work_processes,
    _work_slots,
)


def demo_plan_text() -> str:
    """The shipped demo plan (package data of ``fortis.server.cli``)."""
    return resources.files("fortis.server.cli").joinpath("plans/demo.yaml").read_text()


def _state_dir(ns: argparse.Namespace) -> Path:
    return Path(ns.state_dir or os.environ.get("FORTIS_STATE") or ".fortis-state")


def _targets_for_plan(plan: Any) -> list[Any]:
    from fortis.server.app.stack import DEFAULT_TARGETS, TargetConfig

    if plan.target.endpoint and not plan.members:
        return [TargetConfig.parse(f"{plan.target.name}={plan.target.endpoint}")]
    builtin = {cfg.name: cfg for cfg in map(TargetConfig.parse, DEFAULT_TARGETS)}
    out = []
    # a multi-target plan (CANARY benchmark): every model it names, the first first
    for i, name in enumerate([m.name for m in plan.members] or [plan.target.name]):
        if name not in builtin:
            from fortis.services.common.errors import InvalidArgument
            field = f"targets[{i}].name" if plan.members else "target.endpoint"
            raise InvalidArgument(field, f"target '{name}' is not built in; give target.endpoint "
                                  "(builtin:MODEL or grpc://HOST:PORT) or run against a Fortis "
                                  "that serves it (--address)")
        out.append(builtin[name])
    return out


def _load_plan(text: str) -> Any:
    """Parse and validate a plan in-process (raises InvalidArgument naming every bad field).
    The one place the CLI validates locally: ``validate`` and an embedded ``run``."""
    from fortis.server.app.stack import local_catalogue
    from fortis.services.evaluation.plan import load_plan

    return load_plan(text, local_catalogue())


def _needs_training(plan_text: str) -> bool:
    from fortis.adapters.torch_models.fmnist import KINDS, model_paths

    return "fmnist" in plan_text and not all(model_paths(k)[0].exists() for k in KINDS)


def _run_plan(plan_text: str, out: Path, ns: argparse.Namespace,
              data_root: Path | None = None) -> int:
    """Run a plan: against ``--address`` through the client only, else on an embedded stack
    started here (after checking the plan locally, so a bad plan starts nothing). With
    ``--dry-run`` (``fortis run --dry-run``, ``fortis estimate``): its estimate instead,
    nothing run."""
    if getattr(ns, "dry_run", False):
        from fortis.server.cli.estimate import estimate_action
        act = estimate_action(plan_text, bool(getattr(ns, "json", False)))
    else:
        def act(address: str, key: str, tls: Any = None) -> int:
            return remote.submit_and_follow(address, key, plan_text, out, ns, tls)
    if ns.address:
        return remote.guarded(lambda _: act(ns.address, remote.api_key_of(ns),
                                            remote.tls_of(ns)))(ns)
    from fortis.infra.serving.api_keys import new_api_key
    from fortis.server.app.stack import StackSettings, start_stack
    from fortis.services.common.errors import FortisError, InvalidArgument

    try:
        plan = _load_plan(plan_text)
        targets = _targets_for_plan(plan)
    except InvalidArgument as exc:
        err("the plan is invalid:")
        print_violations(exc)
        return EXIT_BAD_INPUT
    api_key = new_api_key()
    if not ns.quiet:
        print(f"Starting Fortis embedded (state in {_state_dir(ns)}); target {targets[0].name}",
              file=sys.stderr)
        if _needs_training(plan_text):
            print("First run: training the Fashion-MNIST target and surrogate (about 2 minutes"
                  " on 2 cores; cached afterwards)", file=sys.stderr)
    try:
        # one user, its own models: white-box access to its targets' twins is granted
        stack = start_stack(StackSettings(state_dir=_state_dir(ns), api_keys={api_key: "local"},
                                          targets=targets, resume=False,
                                          data_root=data_root,
                                          whitebox_grants={"local": frozenset({"*"})}))
    except FortisError as exc:
        err(str(exc))
        return EXIT_FAILED
    try:
        return remote.guarded(lambda _: act(stack.address, api_key))(ns)
    finally:
        stack.stop()


def cmd_demo(ns: argparse.Namespace) -> int:
    task = Task(ns.task)                # argparse let only the tasks' names through
    if task == Task.CLASSIFICATION:
        return _run_plan(demo_plan_text(), Path(ns.out), ns)
    import subprocess

    from fortis.adapters.vision_demo import demo_plan, describe, write_demo_manifest

    # The detection/segmentation models install on first use (about 30 s).
    setup = Path(__file__).resolve().parents[2] / "scripts" / "setup_vision.sh"
    if setup.exists():
        if not ns.quiet:
            print("Checking the vision models (scripts/setup_vision.sh) ...", file=sys.stderr)
        r = subprocess.run(["bash", str(setup)], env=dict(os.environ, FORTIS_VENV_PYTHON=sys.executable),
                           capture_output=True, text=True)
        if r.returncode != 0:
            err(f"installing the vision models failed:\n{r.stderr[-2000:]}")
            return EXIT_FAILED
    manifest = write_demo_manifest(task, Path(ns.out) / "data")
    if not ns.quiet:
        print(f"Demo data: {describe(task)}; written to {manifest.parent}", file=sys.stderr)
    # the demo's data folder is the embedded server's data root; the plan names the manifest in it
    return _run_plan(demo_plan(task, Path(manifest.name)), Path(ns.out), ns,
                     data_root=manifest.parent)


def cmd_run(ns: argparse.Namespace) -> int:
    if not ns.out and not ns.dry_run:
        err("--out is required (except with --dry-run)")
        return EXIT_BAD_INPUT
    try:
        text = Path(ns.plan).read_text()
    except OSError as exc:
        err(f"cannot read plan: {exc}")
        return EXIT_BAD_INPUT
    text, root = _embedded_manifest_root(text)
    return _run_plan(text, Path(ns.out or "."), ns, data_root=root)


def _embedded_manifest_root(text: str) -> tuple[str, Path | None]:
    """For an embedded run of a plan reading files (manifest, COCO, VOC): a data root holding
    them and the plan's paths rewritten relative to it (the server reads only under a root).
    A manifest's root is its folder, a COCO dataset's the folder holding both the JSON and its
    image folder, a VOC root's, an HF folder's, a class-folder tree's and WebDataset shards'
    their parent. A plan reading from an S3 store (``dataset.store``) is left as it is."""
    from fortis.services.common.errors import InvalidArgument
    from fortis.services.evaluation.plan import parse_plan_text

    try:
        doc = parse_plan_text(text)
    except InvalidArgument:
        return text, None            # reported by _run_plan's validation
    ds = doc.get("dataset")
    if not isinstance(ds, dict) or ds.get("store") is not None \
            or ds.get("source") not in ("manifest", "coco", "voc", "hf", "folders", "webdataset") \
            or not isinstance(ds.get("path"), str):
        return text, None
    path = Path(ds["path"]).expanduser().resolve()
    if ds["source"] == "coco":
        images = Path(ds["images"]).expanduser().resolve() \
            if isinstance(ds.get("images"), str) and ds["images"].strip() else path.parent
        root = Path(os.path.commonpath([path.parent, images]))
        doc["dataset"] = {**ds, "path": path.relative_to(root).as_posix(),
                          "images": images.relative_to(root).as_posix()}
        return json.dumps(doc), root
    doc["dataset"] = {**ds, "path": path.name}
    return json.dumps(doc), path.parent


def cmd_validate(ns: argparse.Namespace) -> int:
    from fortis.services.common.errors import InvalidArgument

    try:
        plan = _load_plan(Path(ns.plan).read_text())
    except OSError as exc:
        err(f"cannot read plan: {exc}")
        return EXIT_BAD_INPUT
    except InvalidArgument as exc:
        for v in exc.violations:
            print(f"{v.field}: {v.description}")
        return EXIT_BAD_INPUT
    print(f"plan '{plan.name}' is valid: {len(plan.corruptions)} corruptions, {len(plan.attacks)} attacks")
    return 0


def cmd_serve(ns: argparse.Namespace) -> int:
    from fortis.infra.serving.startup import StartupError
    from fortis.server.app.stack import start_stack
    from fortis.server.cli.logs import configure

    configure(ns.log_level)
    # before any thread of the server exists: a thread's allocator arena is fixed at its start
    from fortis.infra.serving.allocator import keep_freed_memory
    keep_mib = int(getattr(ns, "keep_freed_mib", 256))
    if keep_freed_memory(max(0, keep_mib) * 1024 ** 2):
        import structlog
        structlog.get_logger("fortis.serve").debug("allocator keeps freed memory",
                                                   keep_freed_mib=keep_mib)
    # Every step of the start names itself when it fails, with the exit code of its class
    # (infra/serving/startup.py; docs/pipelines.md "Exit codes of fortis serve").
    try:
        settings, generated = _serve_settings(ns)
        stack = start_stack(settings)
    except StartupError as exc:
        err(str(exc))
        return exc.exit_code
    _freeze_startup_objects()
    done = threading.Event()       # before the address line: a SIGTERM right after it drains
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    metrics_host = settings.metrics_host
    print(json.dumps({"address": stack.address, "services": ns.service or "all",
                      "targets": {n: s.address for n, s in stack.target_servers.items()},
                      **({"metrics_port": stack.metrics_port,
                          "metrics_address": f"{metrics_host}:{stack.metrics_port}"}
                         if stack.metrics_port is not None else {}),
                      **({"api_key": generated} if generated else {})}), flush=True)
    if stack.key_watcher is not None:     # SIGHUP: re-read the key file now
        watcher = stack.key_watcher
        signal.signal(signal.SIGHUP, lambda *_: threading.Thread(
            target=watcher.reload, name="api-keys-sighup", daemon=True).start())
    done.wait()
    return _shutdown(stack, float(ns.shutdown_grace))


def _serve_identity(ns: argparse.Namespace) -> tuple[list[Any], list[Any], str, str]:
    """The hashed API keys, the OIDC issuers, the certificate-tenant rule and, when none of
    them is given and auth is on, a generated key (printed once, for the single user)."""
    from fortis.infra.serving.api_keys import new_api_key, parse_api_keys
    from fortis.infra.serving.startup import step

    with step("API keys"):
        # Keys are hashed as they are parsed: the server never holds them in plain text.
        keys = parse_api_keys(os.environ.get("FORTIS_API_KEYS", ""), "FORTIS_API_KEYS")
        for k in ns.api_key or []:
            keys += parse_api_keys(k, "api_key")
    with step("API keys"):
        oidc, tenant_from = _identity_options(ns)
    generated = ""
    if not keys and not ns.api_keys_file and not ns.no_auth and not oidc and not tenant_from:
        generated = new_api_key()
        keys = parse_api_keys(f"{generated}=default")
    return keys, oidc, tenant_from, generated


def _serve_targets(ns: argparse.Namespace) -> list[Any]:
    from fortis.infra.serving.startup import step
    from fortis.server.app.stack import DEFAULT_TARGETS, TargetConfig

    with step("targets configuration"):
        targets = [TargetConfig.parse(t) for t in (ns.target or [])]
        # The built-in targets, unless told otherwise, wherever a proxy runs: all services
        # (no --service; argparse leaves it None) or the proxy alone.
        if not targets and ns.service in (None, "", "proxy") and not ns.no_default_targets:
            targets = [TargetConfig.parse(t) for t in DEFAULT_TARGETS]
    return targets


def _serve_settings(ns: argparse.Namespace) -> tuple[Any, str]:
    """``fortis serve``'s options as StackSettings, each checked in its start-up step (a
    busy port first, so it is one clear line); and the generated API key, if any."""
    from fortis.infra.serving.startup import EXIT_LISTEN, StartupError, step
    from fortis.server.app.stack import StackSettings

    with step("gRPC address", EXIT_LISTEN):
        if _address_in_use(ns.address):
            raise StartupError("gRPC address", f"cannot listen on {ns.address}: address "
                               "in use", EXIT_LISTEN)
    keys, oidc, tenant_from, generated = _serve_identity(ns)
    with step("options"):
        from fortis.services.common.whitebox import parse_grants
        grants = parse_grants(getattr(ns, "whitebox_grant", None) or [])
        if (generated or ns.no_auth) and not grants:
            # single-user default: its one tenant is the operator, who owns the targets
            grants = {"default": frozenset({"*"})}
    with step("TLS material"):
        tls = _tls_settings(ns)
    with step("metrics address"):
        metrics_host, metrics_port = _metrics_address(ns)
    targets = _serve_targets(ns)
    with step("options"):
        settings = StackSettings(
            address=ns.address, state_dir=_state_dir(ns), key_entries=keys, targets=targets,
            api_keys_file=Path(ns.api_keys_file) if ns.api_keys_file else None,
            api_keys_reload_s=max(0.0, float(ns.api_keys_reload)), tls=tls,
            oidc_issuers=oidc, tls_tenant_from=tenant_from,
            only=ns.service or "", proxy_address=ns.proxy_address or "",
            perturbation_address=ns.perturbation_address or "",
            scoring_address=ns.scoring_address or "", report_address=ns.report_address or "",
            internal_key=os.environ.get("FORTIS_INTERNAL_KEY", ""), metrics_port=metrics_port,
            metrics_host=metrics_host,
            ledger_synchronous=ns.ledger_sync,
            data_root=Path(ns.data_root) if ns.data_root else None,
            dataset_stores=Path(ns.dataset_stores) if getattr(ns, "dataset_stores", "") else None,
            surrogate_dir=Path(ns.surrogate_dir) if getattr(ns, "surrogate_dir", "") else None,
            whitebox_grants=grants,
            tenant_rates=_tenant_rates(ns.tenant_rate or []), quotas=_quota_settings(ns),
            evaluation_workers=_evaluation_workers(ns), server_workers=_server_workers(ns),
            work_slots=_work_slots(ns), work_processes=_work_processes(ns),
            redis_url=getattr(ns, "redis_url", None) or os.environ.get("FORTIS_REDIS_URL") or None,
            redis_namespace=getattr(ns, "redis_namespace", None)
            or os.environ.get("FORTIS_REDIS_NAMESPACE") or "default",
            database_url=getattr(ns, "database_url", None)
            or os.environ.get("FORTIS_DATABASE_URL") or None,
            upload_quota_bytes=max(0, int(getattr(ns, "upload_quota_bytes", 2 * 1024 ** 3))),
            memory=_memory_limits(ns),
            **_executor_settings(ns))
    return settings, generated


def _open_ledger(ns: argparse.Namespace) -> tuple[Any, str]:
    """The ledger ``fortis ledger`` reads, and how to name it: PostgreSQL (``--database-url``
    or ``$FORTIS_DATABASE_URL``; read-only) or the SQLite file in the state folder.
    InvalidArgument naming the setting when there is none."""
    from fortis.infra.storage import sqldb
    from fortis.services.common import errors

    url = getattr(ns, "database_url", None) or os.environ.get("FORTIS_DATABASE_URL", "")
    if url:
        from fortis.services.proxy.ledger_pg import PgLedger
        return PgLedger(url, read_only=True), sqldb.redact_url(url)
    from fortis.services.proxy.ledger import Ledger
    path = _state_dir(ns) / "ledger.sqlite"
    if not path.exists():
        raise errors.InvalidArgument("state_dir", f"no ledger at {path} (use --state-dir, "
                                     "--database-url, or --address of a running Fortis)")
    # a reader never migrates the file of a proxy that may be running on it: an older
    # ledger is refused naming `fortis db upgrade --state-dir DIR`
    return Ledger(path, synchronous="NORMAL", migrate=False), str(path)


def cmd_ledger(ns: argparse.Namespace) -> int:
    """Query counts from the local ledger (``--state-dir``) or the one the proxies share in
    PostgreSQL (``--database-url``); ``--address`` goes remote."""
    if ns.address:
        return remote.cmd_ledger(ns)
    from fortis.services.common.errors import FortisError

    if not ns.session and not ns.evaluation:
        err("give --session ID or --evaluation ID")
        return EXIT_BAD_INPUT
    try:
        led, where = _open_ledger(ns)
    except FortisError as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    tenant = getattr(ns, "tenant", None) or None
    results = []
    try:
        try:
            ids = ([ns.session] if ns.session
                   else led.sessions_with_prefix(ns.evaluation + "/", tenant))
            for sid in ids:
                rec = led.get_session(sid, tenant)
                if rec is None:
                    err(f"session '{sid}' not found in {where}")
                    return EXIT_BAD_INPUT
                st = led.stats(sid, rec.tenant)
                results.append({
                    "session_id": sid, "tenant": rec.tenant, "target": rec.target,
                    "queries_ok": st.queries_ok,
                    "queries_failed": st.queries_failed, "calls_refused": st.calls_refused,
                    # rows never completed: in flight, or interrupted by a crash
                    "queries_attempted": st.attempts, "queries_in_flight": st.in_flight,
                    "queries_interrupted": st.interrupted,
                    "query_budget": rec.query_budget, "per_image_budget": rec.per_image_budget,
                    # answered queries per image (IEEE-M6) and, beside them, every attempt
                    # the target received (retries, failures, interrupted rows: Q_m)
                    "per_image": {k: v[0] for k, v in sorted(st.per_image.items())},
                    "per_image_attempted": dict(sorted(st.per_image_attempts.items())),
                    "per_origin": {k: v[0] for k, v in sorted(st.per_origin.items())}})
        finally:
            led.close()
    except FortisError as exc:
        err(str(exc))
        return EXIT_FAILED
    remote.print_ledger(results, ns)
    return 0


def cmd_sheets(ns: argparse.Namespace) -> int:
    from fortis.services.common.errors import FortisError
    from fortis.services.perturbation.sheets import write_sheets

    if ns.size < 16:
        err("--size must be at least 16")
        return EXIT_BAD_INPUT
    try:
        from fortis.adapters.plan_sources import named_image
        written = write_sheets(Path(ns.out), image=named_image(ns.image), kinds=ns.kind or None,
                               seed=ns.seed, size=ns.size)
    except FortisError as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    for path in written:
        print(path)
    return 0


def _load_score_file(path: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """A scoring file (docs: README "Scoring recorded predictions"): JSON with ``metric``,
    ``params`` and ``arrays``; an array is inline (nested lists) or "FILE.npz:KEY" / "FILE.npy"
    relative to the JSON file."""
    import numpy as np

    doc = json.loads(path.read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("metric"), str):
        raise ValueError("the file must be a JSON object with a string 'metric'")
    arrays: dict[str, Any] = {}
    for name, value in (doc.get("arrays") or {}).items():
        if isinstance(value, str):
            fname, _, key = value.partition(":")
            src = (path.parent / fname)
            data = np.load(src, allow_pickle=False)
            arrays[name] = data[key] if key else data
        else:
            arrays[name] = np.asarray(value)
    return doc["metric"], doc.get("params") or {}, arrays


def cmd_score(ns: argparse.Namespace) -> int:
    from fortis.services.common.errors import FortisError
    from fortis.services.scoring.catalogue import compute, list_metrics

    if ns.list or not ns.file:
        items = list_metrics()
        if ns.json:
            print(json.dumps(items, indent=2))
        else:
            for m in items:
                print(f"{m['id']:<28} {','.join(m['refs']):<20} {m['description']}")
                for i in m["inputs"]:
                    req = "" if i["required"] else " (optional)"
                    print(f"    {i['kind']:<5} {i['name']:<24} {i['description']}{req}")
        return 0 if ns.list or ns.json else EXIT_BAD_INPUT
    try:
        metric, params, arrays = _load_score_file(Path(ns.file))
    except (OSError, ValueError, KeyError) as exc:
        err(f"cannot read scoring file: {exc}")
        return EXIT_BAD_INPUT
    try:
        result = compute(metric, arrays, params)
    except FortisError as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    text = json.dumps({"metric": metric, "result": result}, indent=2)
    if ns.out:
        Path(ns.out).write_text(text + "\n")
        print(ns.out)
    else:
        print(text)
    return 0


def _read_report(path: str) -> dict[str, Any]:
    """A report.json (ValueError when it is not one)."""
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("metrics"), dict):
        raise ValueError("not a Fortis report.json (no metrics)")
    return doc


def _gate_criteria(specs: list[str]) -> tuple[dict[str, str], list[Any]]:
    """``--criterion 'METRIC OP NUMBER'`` options as an acceptance mapping (the plan's
    grammar, services/common/acceptance.py), and a FieldViolation for each malformed one."""
    import re

    from fortis.services.common.errors import FieldViolation

    out: dict[str, str] = {}
    bad: list[Any] = []
    for n, spec in enumerate(specs):
        m = re.match(r"^\s*([^<>=\s]+)\s*((?:>=|<=|>|<).*)$", spec[:300])
        if m is None:
            bad.append(FieldViolation(f"criterion[{n}]", "must read 'METRIC OP NUMBER', e.g. "
                                      "'accuracy >= 0.9'"))
        else:
            out[m.group(1)] = m.group(2)
    return out, bad


def cmd_gate(ns: argparse.Namespace) -> int:
    """Re-check a report.json against its plan's acceptance criteria (or ``--criterion``)
    offline: the verdict recomputed from the report's metrics (services/report/verdict.py),
    exit 3 when it fails (``--strict``: or is inconclusive, or a setting failed to run)."""
    from fortis.server.cli.junit import write_junit
    from fortis.services.common.errors import InvalidArgument
    from fortis.services.report.verdict import report_verdict

    try:
        report = _read_report(ns.report)
    except (OSError, ValueError) as exc:
        err(f"report: cannot read {ns.report}: {exc}")
        return EXIT_BAD_INPUT
    acceptance, bad = _gate_criteria(ns.criterion) if ns.criterion else (None, [])
    try:
        verdict = report_verdict(report, acceptance=acceptance,
                                 path="criterion" if ns.criterion else "plan.acceptance")
    except InvalidArgument as exc:
        bad += exc.violations
    if bad:
        err("invalid acceptance criteria:")
        print_violations(InvalidArgument.from_violations(bad))
        return EXIT_BAD_INPUT
    remote.print_verdict(verdict, strict=ns.strict)
    if ns.junit:
        try:
            write_junit(Path(ns.junit), report, verdict, strict=ns.strict)
        except OSError as exc:
            err(f"--junit: cannot write {ns.junit}: {exc}")
            return EXIT_FAILED
        print(f"JUnit: {ns.junit}")
    return remote.verdict_exit(verdict, strict=ns.strict, report=report)


def cmd_mlflow_export(ns: argparse.Namespace) -> int:
    """Log an existing report.json, and the report files beside it, to an MLflow store."""
    from fortis.server.cli.mlflow_export import MlflowExportError, export_report

    try:
        report = _read_report(ns.report)
    except (OSError, ValueError) as exc:
        err(f"report: cannot read {ns.report}: {exc}")
        return EXIT_BAD_INPUT
    here = Path(ns.report)
    files = [here] + [here.with_name(n) for n in ("report.html", "report.pdf", "junit.xml")
                      if here.with_name(n).is_file()]
    for extra in ns.artifact or []:
        if not Path(extra).is_file():
            err(f"artifact: no file {extra}")
            return EXIT_BAD_INPUT
        files.append(Path(extra))
    verdict = report.get("verdict")
    if not isinstance(verdict, dict):
        from fortis.services.common.errors import InvalidArgument
        from fortis.services.report.verdict import report_verdict
        try:
            verdict = report_verdict(report)
        except InvalidArgument:
            verdict = None
    try:
        exp_id, run_id = export_report(report, uri=ns.mlflow_uri,
                                       experiment=ns.mlflow_experiment, artifacts=files,
                                       verdict=verdict)
    except MlflowExportError as exc:
        err(str(exc))
        return EXIT_FAILED
    print(json.dumps({"experiment_id": exp_id, "run_id": run_id, "uri": ns.mlflow_uri,
                      "artifacts": [str(f) for f in files]}))
    return 0


def cmd_train(ns: argparse.Namespace) -> int:
    from fortis.adapters.torch_models.fmnist import KINDS, load_fmnist_model

    for kind in KINDS:     # target, surrogate, mlp, robust (fmnist-cnn-at, adversarially trained)
        t0 = time.time()
        _, meta = load_fmnist_model(kind, log=lambda s: print(s, file=sys.stderr))
        print(f"fmnist {kind}: test accuracy {meta['test_accuracy']:.4f} ({time.time() - t0:.1f} s)")
    return 0


