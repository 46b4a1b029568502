#!/usr/bin/env python3
"""docs/performance.md from the saved output of every benchmark in bench/.

Each benchmark prints JSON. ``--run NAME[,NAME...]`` runs those benchmarks (the command in
``BENCHMARKS``, from the repository root, with this interpreter) and saves what each printed
under ``bench/results/NAME/<UTC time>.json`` (the last ``KEEP`` runs are kept); then, as
without ``--run``, the page is written from the saved runs: per benchmark its command, the
machine of its latest run and, for each of its latest three runs, every goal it printed
(``"goals": [{"name", "ratio", "target", "met"}]``, at any depth of its JSON) or, for a
benchmark without goals, the ratios it printed (keys naming a ratio). Nothing in the page is
typed by hand; ``--check`` exits 1 when the page differs from what the saved runs give (a
test runs it).

    python scripts/performance_table.py [--run proxy,evaluation [--times 3]] [--check]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "docs" / "performance.md"
#: Saved runs kept per benchmark (the page shows the latest three).
KEEP = 3
#: Ratios shown for a benchmark that prints no goals.
MAX_RATIOS = 8

#: Every benchmark, with the command ``--run`` uses (short settings: each runs in minutes on
#: a 2-core machine; each benchmark's docstring gives the settings that scale it up).
BENCHMARKS: dict[str, list[str]] = {
    "proxy": ["bench/proxy.py", "--n", "300", "--threads", "4"],
    "proxy_pg_redis": ["bench/proxy.py", "--n", "300", "--threads", "4",
                       "--database-url", "auto"],
    "evaluation": ["bench/evaluation.py"],
    "attack_stage": ["bench/attack_stage.py"],
    "attacks": ["bench/attacks.py"],
    "attacks_vs_art": ["bench/attacks_vs_art.py"],
    "answer_copy": ["bench/answer_copy.py"],
    "codec": ["bench/codec.py"],
    "compare": ["bench/compare.py"],
    "corruptions": ["bench/corruptions.py"],
    "defended": ["bench/defended.py", "--n", "200"],
    "fuzz": ["bench/fuzz.py"],
    "matrix": ["bench/matrix.py"],
    "noisy_neighbour": ["bench/noisy_neighbour.py"],
    "proxy_fairness": ["bench/proxy_fairness.py"],
    "query_plan": ["bench/query_plan.py"],
    "scale": ["bench/scale.py"],
    "scoring": ["bench/scoring.py"],
    "sequential": ["bench/sequential.py"],
    "sequential_plans": ["bench/sequential_plans.py"],
    "storage": ["bench/storage.py"],
    "transfer": ["bench/transfer.py"],
    "transfer_more": ["bench/transfer_more.py"],
    "transfer_optim": ["bench/transfer_optim.py"],
}


def _json_of(text: str) -> Any:
    """The JSON a benchmark printed: the whole output, else its last JSON document (some
    print progress lines first)."""
    text = text.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    for start in [i for i, ch in enumerate(text) if ch in "{["][::-1]:
        try:
            return json.loads(text[start:])
        except json.JSONDecodeError:
            continue
    raise ValueError("no JSON in the benchmark's output")


def run(name: str) -> Path:
    """Run benchmark ``name``; save what it printed; the saved file."""
    if name not in BENCHMARKS:
        raise SystemExit(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    argv = [sys.executable, *BENCHMARKS[name]]
    print(f"running {name}: {' '.join(BENCHMARKS[name])}", file=sys.stderr, flush=True)
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"benchmark {name} failed (exit {done.returncode})")
    out = _json_of(done.stdout)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    folder = RESULTS / name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stamp}.json"
    sys.path.insert(0, str(ROOT / "bench"))
    from _report import machine  # bench/_report.py: the machine this ran on

    saved = {"benchmark": name, "command": "python " + " ".join(BENCHMARKS[name]),
             "measured_at": stamp, "machine": machine(), "output": out}
    path.write_text(json.dumps(saved, indent=1) + "\n", encoding="utf-8")
    for old in sorted(folder.glob("*.json"))[:-KEEP]:
        old.unlink()
    return path


def goals_in(doc: Any) -> list[dict[str, Any]]:
    """Every goal a benchmark printed, at any depth (a row's goals named after its row)."""
    found: list[dict[str, Any]] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "goals" and isinstance(value, list):
                    for g in value:
                        if isinstance(g, dict):
                            one = _goal(g, where)
                            if one is not None:
                                found.append(one)
                else:
                    walk(value, where)
        elif isinstance(node, list):
            for item in node:
                label = ""
                if isinstance(item, dict):
                    label = " ".join(str(item[k]) for k in ("row", "model", "budget", "name")
                                     if k in item and not isinstance(item[k], (dict, list)))
                walk(item, f"{label}: " if label else where)

    walk(doc, "")
    return found


def _goal(g: dict[str, Any], where: str) -> dict[str, Any] | None:
    """One goal in either shape the benchmarks print: ``{name, ratio, target, met}``, or
    bench/attacks.py's ``{row, model, budget, goal, ratio, factor, pass}``."""
    name, met = g.get("name", g.get("goal")), g.get("met", g.get("pass"))
    if name is None or met is None or "ratio" not in g:
        return None
    t, r = g.get("target"), g.get("ratio")
    if isinstance(t, (int, float)) and isinstance(r, (int, float)) and t != r:
        # a bare number: its direction is the one the benchmark's verdict agrees with
        g = {**g, "target": f"{'>=' if (r > t) == bool(met) else '<='} {t:g}"}
    own = " ".join(str(g[k]) for k in ("row", "model", "budget") if k in g)
    lower_is_better = "at_most" in str(name) or g.get("metric") in (
        "compute_ms_per_image", "median_norm")
    target = g.get("target", f"{'<=' if lower_is_better else '>='} {g['factor']:g}x"
                   if "factor" in g else "")
    return {"name": f"{where}{own + ': ' if own else ''}{name}", "ratio": g["ratio"],
            "target": target, "met": bool(met)}


def ratios_in(doc: Any) -> list[tuple[str, float]]:
    """Numbers a benchmark printed under a key naming a ratio (top level and one level of
    objects below), for a benchmark without goals."""
    out: list[tuple[str, float]] = []
    if not isinstance(doc, dict):
        return out

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def names_ratio(key: str) -> bool:
        if key.endswith(("_seconds", "_s", "_ms", "_us")):
            return False            # a time, whatever it is of
        return any(w in key for w in ("ratio", "_over_", "speedup", "share"))

    for key, value in doc.items():
        if number(value) and names_ratio(key):
            out.append((key, float(value)))
        elif isinstance(value, dict):
            out += [(f"{key}.{k}", float(v)) for k, v in value.items()
                    if number(v) and (names_ratio(k) or names_ratio(key))]
    return out[:MAX_RATIOS]


def _machine(saved: dict[str, Any]) -> str:
    out = saved["output"]
    m = out.get("machine") if isinstance(out, dict) else None
    m = m if isinstance(m, dict) else saved.get("machine")
    if not isinstance(m, dict):
        return "not printed by this benchmark"
    parts = [str(m.get("cpu", "")), f"{m['cpus']} CPUs" if "cpus" in m else "",
             str(m.get("platform", "")), f"Python {m['python']}" if "python" in m else "",
             f"torch {m['torch']}" if "torch" in m else ""]
    return ", ".join(p for p in parts if p)


def _fmt(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def page(results: Path = RESULTS) -> str:
    """The whole page from the saved runs under ``results``."""
    lines = [
        "# Performance",
        "",
        "Generated by `python scripts/performance_table.py` from the saved output of each",
        "benchmark (`bench/results/`); do not edit by hand. Re-measure a benchmark with",
        "`python scripts/performance_table.py --run NAME`. Every figure is a ratio measured in",
        "one run against a reference measured in the same run (the bare model, the direct call,",
        "a reference tool), because the machines are shared and noisy: absolute times travel",
        "badly, ratios better. The latest three runs of each benchmark are shown.",
        "",
        "| Benchmark | Runs saved | Goals met (latest run) |",
        "|---|---|---|",
    ]
    body: list[str] = []
    for name, argv in BENCHMARKS.items():
        runs = sorted((results / name).glob("*.json")) if (results / name).is_dir() else []
        saved = [json.loads(p.read_text(encoding="utf-8")) for p in runs][-3:]
        if not saved:
            lines.append(f"| [{name}](#{name}) | 0 | no saved run |")
            body += [f"## {name}", "", f"`python {' '.join(argv)}`", "",
                     "No saved run yet.", ""]
            continue
        latest_goals = goals_in(saved[-1]["output"])
        met = (f"{sum(g['met'] for g in latest_goals)} of {len(latest_goals)}"
               if latest_goals else "no goals printed")
        lines.append(f"| [{name}](#{name}) | {len(runs)} | {met} |")
        body += [f"## {name}", "", f"`{saved[-1]['command']}`", "",
                 f"Machine (latest run): {_machine(saved[-1])}.", ""]
        stamps = [s["measured_at"] for s in saved]
        if latest_goals:
            body += ["| Goal | Target | " + " | ".join(stamps) + " | Met (latest) |",
                     "|---|---|" + "---|" * len(stamps) + "---|"]
            per_run = [{g["name"]: g for g in goals_in(s["output"])} for s in saved]
            for g in latest_goals:
                cells = [_fmt(r[g["name"]]["ratio"]) if g["name"] in r
                         and r[g["name"]]["ratio"] is not None else "-" for r in per_run]
                body.append(f"| {g['name']} | {g.get('target', '')} | " + " | ".join(cells)
                            + f" | {'yes' if g['met'] else '**no**'} |")
        else:
            ratios = [dict(ratios_in(s["output"])) for s in saved]
            keys = list(ratios[-1])
            if not keys:
                body.append("This benchmark prints no ratio; see its JSON in bench/results.")
            else:
                body += ["| Ratio | " + " | ".join(stamps) + " |",
                         "|---|" + "---|" * len(stamps)]
                body += [f"| {k} | " + " | ".join(_fmt(r[k]) if k in r else "-"
                                                  for r in ratios) + " |" for k in keys]
        body.append("")
    return "\n".join(lines + [""] + body).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="", help="benchmarks to run first (comma-separated)")
    ap.add_argument("--times", type=int, default=1, help="runs of each (default 1)")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when docs/performance.md is not what the saved runs give")
    ns = ap.parse_args(argv)
    for name in filter(None, ns.run.split(",")):
        for _ in range(ns.times):
            run(name.strip())
    text = page()
    if ns.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current != text:
            print("docs/performance.md is out of date: run python scripts/performance_table.py",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
