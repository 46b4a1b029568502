"""The ``fortis`` command line.

    fortis demo --out DIR                 evaluate the Fashion-MNIST demo plan, all embedded
    fortis run PLAN.yaml --out DIR        run a plan (embedded, or --address of a running Fortis)
    fortis serve [--service NAME]         serve all services in one process, or one of them
    fortis ledger --session ID [--json]   query counts from the proxy's ledger
    fortis perturbations [--json]         the catalogue of perturbations and attacks
    fortis sheets --out DIR               example sheets (PNG) of every perturbation
    fortis score FILE.json | --list       compute a metric from recorded predictions
    fortis validate PLAN.yaml             check a plan and list every problem
    fortis train                          train the Fashion-MNIST models now (else on first use)
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

from fortis import __version__

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


def _err(msg: str) -> None:
    print(f"fortis: {msg}", file=sys.stderr)


def _demo_plan_text() -> str:
    return resources.files("fortis").joinpath("plans/demo.yaml").read_text()


def _state_dir(ns: argparse.Namespace) -> Path:
    return Path(ns.state_dir or os.environ.get("FORTIS_STATE") or ".fortis-state")


def _targets_for_plan(plan: Any) -> list[Any]:
    from fortis.services.app import DEFAULT_TARGETS, TargetConfig

    if plan.target.endpoint:
        return [TargetConfig.parse(f"{plan.target.name}={plan.target.endpoint}")]
    for spec in DEFAULT_TARGETS:
        cfg = TargetConfig.parse(spec)
        if cfg.name == plan.target.name:
            return [cfg]
    from fortis.services.common.errors import InvalidArgument
    raise InvalidArgument("target.endpoint", f"target '{plan.target.name}' is not built in; give target.endpoint "
                          "(builtin:MODEL or grpc://HOST:PORT) or run against a Fortis that serves it (--address)")


def _needs_training(plan_text: str) -> bool:
    from fortis.adapters.torch_models.fmnist import KINDS, model_paths

    return "fmnist" in plan_text and not all(model_paths(k)[0].exists() for k in KINDS)


def _print_summary(report: dict[str, Any], out: Path) -> None:
    m = report["metrics"]
    acc = m["accuracy"]
    print(f"\nTarget {report['target']['name']}: clean accuracy {acc['value']:.4f} "
          f"(95% CI {acc['ci95'][0]:.3f}-{acc['ci95'][1]:.3f}, M={acc['m']})")
    arc = (m.get("average_robustness_corr") or {}).get("value")
    wrc = (m.get("worstcase_robustness_corr") or {}).get("value")
    if arc is not None:
        print(f"Average robustness to corruptions {arc:.4f}; worst case {wrc:.4f}")
    for name, a in (m.get("attacks") or {}).items():
        extra = ""
        if a.get("mean_queries") is not None:
            extra = f", success rate {a['success_rate']:.3f}, mean queries {a['mean_queries']:.1f} (budget {a['query_budget']})"
        print(f"  attack {name}: robustness {a['robustness_adv']:.4f}{extra}")
    print(f"Report: {out / 'report.json'}  {out / 'report.html'}")


def _follow(client: Any, evaluation_id: str, quiet: bool) -> Any:
    """Follow an evaluation: a live bar on a terminal; on a pipe or log file, one plain line
    per stage and at most one every 10 seconds, so CI logs stay readable."""
    import time

    from tqdm import tqdm

    tty = sys.stderr.isatty()
    bar = tqdm(total=1, unit="item", file=sys.stderr, dynamic_ncols=True) if tty and not quiet else None
    last_stage, last_t = [""], [0.0]

    def on_progress(p: Any) -> None:
        if quiet:
            return
        if bar is not None:
            bar.total = max(p.items_total, 1)
            bar.n = p.items_done
            bar.set_description(f"{p.stage}")
            bar.set_postfix_str(f"queries={p.queries}")
            bar.refresh()
            return
        now = time.monotonic()
        if p.stage != last_stage[0] or now - last_t[0] >= 10.0:
            last_stage[0], last_t[0] = p.stage, now
            print(f"  [{p.stage}] {p.items_done}/{p.items_total} items, {p.queries} queries",
                  file=sys.stderr, flush=True)

    try:
        return client.wait(evaluation_id, on_progress=on_progress)
    finally:
        if bar is not None:
            bar.close()


def _run_plan(plan_text: str, out: Path, ns: argparse.Namespace) -> int:
    from fortis.client import STATE_NAMES, FortisClient
    from fortis.services.common.errors import FortisError, InvalidArgument
    from fortis.services.evaluation.plan import load_plan

    try:
        plan = load_plan(plan_text)
    except InvalidArgument as exc:
        _err("the plan is invalid:")
        for v in exc.violations:
            print(f"  {v.field}: {v.description}", file=sys.stderr)
        return EXIT_BAD_INPUT
    stack = None
    address, api_key = ns.address, ns.api_key or os.environ.get("FORTIS_API_KEY", "")
    try:
        if not address:
            from fortis.services.app import StackSettings, start_stack
            from fortis.services.common.server import new_api_key

            api_key = new_api_key()
            targets = _targets_for_plan(plan)
            if not ns.quiet:
                print(f"Starting Fortis embedded (state in {_state_dir(ns)}); target {targets[0].name}",
                      file=sys.stderr)
                if _needs_training(plan_text):
                    print("First run: training the Fashion-MNIST target and surrogate (about 2 minutes on"
                          " 2 cores; cached afterwards)", file=sys.stderr)
            stack = start_stack(StackSettings(state_dir=_state_dir(ns), api_keys={api_key: "local"},
                                              targets=targets, resume=False))
            address = stack.address
        with FortisClient(address, api_key=api_key) as client:
            ev = client.submit(plan_text, evaluation_id=ns.id or "")
            if not ns.quiet:
                print(f"Evaluation {ev.evaluation_id} submitted", file=sys.stderr)
            final = _follow(client, ev.evaluation_id, ns.quiet)
            state = STATE_NAMES[final.state]
            if state != "SUCCEEDED":
                _err(f"evaluation {ev.evaluation_id} ended {state}: {final.error.message}")
                return EXIT_FAILED
            client.write_report(ev.evaluation_id, out)
            report = client.report(ev.evaluation_id)
        _print_summary(report, out)
        return 0
    except FortisError as exc:
        _err(str(exc))
        return EXIT_BAD_INPUT if isinstance(exc, InvalidArgument) else EXIT_FAILED
    finally:
        if stack is not None:
            stack.stop()


def cmd_demo(ns: argparse.Namespace) -> int:
    if ns.task == "classification":
        return _run_plan(_demo_plan_text(), Path(ns.out), ns)
    import subprocess

    from fortis.adapters.vision_demo import demo_plan, write_demo_manifest

    # The detection/segmentation models install on first use (about 30 s).
    setup = Path(__file__).resolve().parents[3] / "scripts" / "setup_vision.sh"
    if setup.exists():
        if not ns.quiet:
            print("Checking the vision models (scripts/setup_vision.sh) ...", file=sys.stderr)
        r = subprocess.run(["bash", str(setup)], env=dict(os.environ, FORTIS_VENV_PYTHON=sys.executable),
                           capture_output=True, text=True)
        if r.returncode != 0:
            _err(f"installing the vision models failed:\n{r.stderr[-2000:]}")
            return EXIT_FAILED
    manifest = write_demo_manifest(ns.task, Path(ns.out) / "data")
    return _run_plan(demo_plan(ns.task, manifest), Path(ns.out), ns)


def cmd_run(ns: argparse.Namespace) -> int:
    try:
        text = Path(ns.plan).read_text()
    except OSError as exc:
        _err(f"cannot read plan: {exc}")
        return EXIT_BAD_INPUT
    return _run_plan(text, Path(ns.out), ns)


def cmd_validate(ns: argparse.Namespace) -> int:
    from fortis.services.common.errors import InvalidArgument
    from fortis.services.evaluation.plan import load_plan

    try:
        plan = load_plan(Path(ns.plan).read_text())
    except OSError as exc:
        _err(f"cannot read plan: {exc}")
        return EXIT_BAD_INPUT
    except InvalidArgument as exc:
        for v in exc.violations:
            print(f"{v.field}: {v.description}")
        return EXIT_BAD_INPUT
    print(f"plan '{plan.name}' is valid: {len(plan.corruptions)} corruptions, {len(plan.attacks)} attacks")
    return 0


def cmd_serve(ns: argparse.Namespace) -> int:
    from fortis.logs import configure
    from fortis.services.app import DEFAULT_TARGETS, StackSettings, TargetConfig, start_stack
    from fortis.services.common.errors import FortisError
    from fortis.services.common.server import new_api_key, parse_api_keys

    configure(ns.log_level)
    try:
        keys = parse_api_keys(os.environ.get("FORTIS_API_KEYS", ""))
        for k in ns.api_key or []:
            keys.update(parse_api_keys(k))
        generated = ""
        if not keys and not ns.no_auth:
            generated = new_api_key()
            keys = {generated: "default"}
        targets = [TargetConfig.parse(t) for t in (ns.target or [])]
        if not targets and ns.service in ("", "proxy") and not ns.no_default_targets:
            targets = [TargetConfig.parse(t) for t in DEFAULT_TARGETS]
        stack = start_stack(StackSettings(
            address=ns.address, state_dir=_state_dir(ns), api_keys=keys, targets=targets,
            only=ns.service or "", proxy_address=ns.proxy_address or "",
            perturbation_address=ns.perturbation_address or "",
            scoring_address=ns.scoring_address or "", report_address=ns.report_address or "",
            internal_key=os.environ.get("FORTIS_INTERNAL_KEY", ""), metrics_port=ns.metrics_port,
            ledger_synchronous=ns.ledger_sync))
    except FortisError as exc:
        _err(str(exc))
        return EXIT_BAD_INPUT
    print(json.dumps({"address": stack.address, "services": ns.service or "all",
                      "targets": {n: s.address for n, s in stack.target_servers.items()},
                      **({"metrics_port": stack.metrics_port} if stack.metrics_port is not None else {}),
                      **({"api_key": generated} if generated else {})}), flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    stack.stop(grace=2.0)
    return 0


def cmd_ledger(ns: argparse.Namespace) -> int:
    from fortis.services.common.errors import FortisError

    if not ns.session and not ns.evaluation:
        _err("give --session ID or --evaluation ID")
        return EXIT_BAD_INPUT
    try:
        if ns.address:
            from fortis.client import FortisClient
            with FortisClient(ns.address, api_key=ns.api_key or os.environ.get("FORTIS_API_KEY", "")) as c:
                st = c.session_stats(ns.session)
                result = {"session_id": ns.session, "target": st.session.target,
                          "queries_ok": st.queries_ok, "queries_failed": st.queries_failed,
                          "calls_refused": st.calls_refused,
                          "query_budget": st.session.query_budget,
                          "per_image_budget": st.session.per_image_budget,
                          "per_image": {i.image_id: i.queries for i in st.images},
                          "per_origin": {o.origin: o.queries for o in st.origins}}
                results = [result]
        else:
            from fortis.services.target_proxy.ledger import Ledger
            path = _state_dir(ns) / "ledger.sqlite"
            if not path.exists():
                _err(f"no ledger at {path} (use --state-dir, or --address of a running Fortis)")
                return EXIT_BAD_INPUT
            led = Ledger(path, synchronous="NORMAL")
            ids = [ns.session] if ns.session else led.sessions_with_prefix(ns.evaluation + "/")
            results = []
            for sid in ids:
                rec = led.get_session(sid)
                if rec is None:
                    _err(f"session '{sid}' not found in {path}")
                    return EXIT_BAD_INPUT
                st = led.stats(sid)
                results.append({"session_id": sid, "target": rec.target, "queries_ok": st.queries_ok,
                                "queries_failed": st.queries_failed, "calls_refused": st.calls_refused,
                                "query_budget": rec.query_budget, "per_image_budget": rec.per_image_budget,
                                "per_image": {k: v[0] for k, v in sorted(st.per_image.items())},
                                "per_origin": {k: v[0] for k, v in sorted(st.per_origin.items())}})
            led.close()
    except FortisError as exc:
        _err(str(exc))
        return EXIT_FAILED
    if ns.json:
        print(json.dumps(results[0] if ns.session else results, indent=2))
    else:
        for r in results:
            print(f"{r['session_id']}  target={r['target']}  ok={r['queries_ok']}  failed={r['queries_failed']}"
                  f"  refused={r['calls_refused']}  images={len(r['per_image'])}")
    return 0


def cmd_perturbations(ns: argparse.Namespace) -> int:
    from fortis.services.perturbation.catalogue import list_catalogue

    items = [it for it in list_catalogue() if not ns.kind or it["kind"].startswith(ns.kind)]
    if ns.json:
        print(json.dumps(items, indent=2, default=str))
        return 0
    levels = {"severity": "sev 1-5", "level": "lvl 1-30", "epsilon": "eps 0-1", None: "-"}
    print(f"{'id':<28} {'kind':<16} {'family':<12} {'refs':<14} {'levels':<9} {'character':<9} description")
    for it in items:
        ch = it.get("characterisation")
        code = "-" if not ch else (ch["scope"][0] + ch["randomness"][0] + ch["domain"][0]).upper()
        print(f"{it['id']:<28} {it['kind']:<16} {it['family']:<12} {','.join(it['refs']):<14} "
              f"{levels[it['level_kind']]:<9} {code:<9} {it['description']}")
    if not ns.kind:
        print(f"\n{len(items)} entries. character: Global/Local, Deterministic/Stochastic, "
              "Colour/Pixel (DEG-5). Add --json for parameters and level tables.")
    return 0


def cmd_sheets(ns: argparse.Namespace) -> int:
    from fortis.services.common.errors import FortisError
    from fortis.services.perturbation.sheets import write_sheets

    if ns.size < 16:
        _err("--size must be at least 16")
        return EXIT_BAD_INPUT
    try:
        written = write_sheets(Path(ns.out), image=ns.image, kinds=ns.kind or None, seed=ns.seed,
                               size=ns.size)
    except FortisError as exc:
        _err(str(exc))
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
        _err(f"cannot read scoring file: {exc}")
        return EXIT_BAD_INPUT
    try:
        result = compute(metric, arrays, params)
    except FortisError as exc:
        _err(str(exc))
        return EXIT_BAD_INPUT
    text = json.dumps({"metric": metric, "result": result}, indent=2)
    if ns.out:
        Path(ns.out).write_text(text + "\n")
        print(ns.out)
    else:
        print(text)
    return 0


def cmd_train(ns: argparse.Namespace) -> int:
    from fortis.adapters.torch_models.fmnist import load_fmnist_model

    for kind in ("target", "surrogate"):
        t0 = time.time()
        _, meta = load_fmnist_model(kind, log=lambda s: print(s, file=sys.stderr))
        print(f"fmnist {kind}: test accuracy {meta['test_accuracy']:.4f} ({time.time() - t0:.1f} s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fortis", description="Robustness testing of image-recognition services (IEEE Std 3129-2023)")
    p.add_argument("--version", action="version", version=f"fortis {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    def client_opts(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--address", help="a running Fortis (fortis serve); default: start one embedded")
        sp.add_argument("--api-key", help="API key (default: $FORTIS_API_KEY)")
        sp.add_argument("--state-dir", help="where embedded runs keep state (default: $FORTIS_STATE or .fortis-state)")

    sp = sub.add_parser("demo", help="evaluate the Fashion-MNIST demo plan, everything embedded")
    sp.add_argument("--out", required=True, help="folder for report.json and report.html")
    sp.add_argument("--task", choices=["classification", "detection", "segmentation"],
                    default="classification",
                    help="classification: the Fashion-MNIST CNN (default); detection: OpenCV Haar "
                         "faces on offline photos; segmentation: U2-Net-p salient objects")
    sp.add_argument("--id", help="evaluation id (default: generated)")
    sp.add_argument("--quiet", action="store_true")
    client_opts(sp)
    sp.set_defaults(fn=cmd_demo)

    sp = sub.add_parser("run", help="run a test plan and write its report")
    sp.add_argument("plan")
    sp.add_argument("--out", required=True)
    sp.add_argument("--id", help="evaluation id (idempotent: the same id returns the same evaluation)")
    sp.add_argument("--quiet", action="store_true")
    client_opts(sp)
    sp.set_defaults(fn=cmd_run)

    sp = sub.add_parser("validate", help="check a plan")
    sp.add_argument("plan")
    sp.set_defaults(fn=cmd_validate)

    sp = sub.add_parser("serve", help="serve all services in one process, or one with --service")
    sp.add_argument("--address", default="127.0.0.1:50051")
    sp.add_argument("--service", choices=["proxy", "perturbation", "scoring", "report", "evaluation"])
    sp.add_argument("--state-dir")
    sp.add_argument("--api-key", action="append", help="KEY=TENANT (repeatable; also $FORTIS_API_KEYS)")
    sp.add_argument("--no-auth", action="store_true", help="accept calls without an API key (local use only)")
    sp.add_argument("--target", action="append",
                    help="NAME=builtin:MODEL[?output=full_scores|top_k|label_only&top_k=K&rate=N] or NAME=grpc://HOST:PORT[?rate=N]")
    sp.add_argument("--no-default-targets", action="store_true")
    for s in ("proxy", "perturbation", "scoring", "report"):
        sp.add_argument(f"--{s}-address", help=f"the {s} service (when running one service)")
    sp.add_argument("--ledger-sync", choices=["FULL", "NORMAL"], default="FULL",
                    help="FULL (default): every ledger row is on disk (fsync) before the answer "
                         "is returned; NORMAL: survives a crash of Fortis but not of the machine, "
                         "about 1 ms less per query on this class of disk")
    sp.add_argument("--metrics-port", type=int,
                    help="serve the proxy's Prometheus metrics at http://0.0.0.0:PORT/metrics")
    sp.add_argument("--log-level", default="info")
    sp.set_defaults(fn=cmd_serve)

    sp = sub.add_parser("ledger", help="query counts from the proxy's ledger")
    sp.add_argument("--session", help="session id")
    sp.add_argument("--evaluation", help="every session of an evaluation (local ledger)")
    sp.add_argument("--json", action="store_true")
    client_opts(sp)
    sp.set_defaults(fn=cmd_ledger)

    sp = sub.add_parser("perturbations", help="the catalogue: corruptions, styles, degradation "
                        "operators, safety properties and attacks")
    sp.add_argument("--json", action="store_true", help="everything, with parameters and level tables")
    sp.add_argument("--kind", choices=["corruption", "style", "degradation", "property",
                                       "transfer_attack", "score_attack", "decision_attack"],
                    help="only this kind")
    sp.set_defaults(fn=cmd_perturbations)

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
    sp.set_defaults(fn=cmd_sheets)

    sp = sub.add_parser("score", help="compute a catalogue metric from recorded predictions (a JSON file)")
    sp.add_argument("file", nargs="?", help="scoring file: {metric, params, arrays}")
    sp.add_argument("--out", help="write the result here (default: stdout)")
    sp.add_argument("--list", action="store_true", help="list the metric catalogue")
    sp.add_argument("--json", action="store_true", help="with --list: as JSON")
    sp.set_defaults(fn=cmd_score)

    sp = sub.add_parser("train", help="train the Fashion-MNIST target and surrogate now")
    sp.set_defaults(fn=cmd_train)
    return p


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    if ns.command != "serve":
        from fortis.logs import configure
        configure("warning")
    try:
        return int(ns.fn(ns))
    except BrokenPipeError:          # `fortis perturbations | head`
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
