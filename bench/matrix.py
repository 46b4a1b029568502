#!/usr/bin/env python3
"""The catalogue matrix (tests/matrix/catalogue.py), whole: every perturbation and every
attack x each task it declares x each target signal it supports x the default batch size, 1
and the largest allowed, through the real services and the proxy, at the entries' default
parameters (what an entry requires is filled by rule; slow targets' budgets capped, as the
JSON's ``notes`` say). Each cell checks that its evaluation succeeded, no image exceeded Q_m
(the ledger), the stored uint8 images respect the bound where the attack is bound-limited,
every reported success is confirmed by the target model itself, and the report renders.

Prints one JSON document: cells, failing cells with their problems, the runtime. Exit 1 when
a cell fails. ``make test`` runs a slice of it (tests/e2e/test_catalogue_matrix.py).

The whole matrix takes hours on a small machine (36 evaluations; a classifier's attacks at
the default batch size are about half an hour each on 2 cores), so it can be run in parts:
``--progress FILE`` appends each finished evaluation's cells to FILE (JSON lines, with the
commit it ran on), and a later run with the same FILE skips the evaluations recorded there
for the same commit; the printed document then covers every recorded and new cell, its
``seconds`` the sum of the evaluations' own times.

    python bench/matrix.py [--targets cnn,haar] [--batches default,1] [--entries square,fog]
                           [--profile full|quick] [--out matrix.json] [--keep DIR]
                           [--progress matrix-progress.jsonl]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.matrix.catalogue import (  # noqa: E402
    BATCHES,
    FULL,
    TARGETS,
    CellResult,
    Matrix,
    quick_profile,
    restrict,
    summary,
)


def commit() -> str:
    """The checkout's commit (with ``-dirty`` when files differ): recorded evaluations are
    reused only by a run of the same code."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT,
                              timeout=30).stdout.strip()
    head = git("rev-parse", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def recorded(path: Path, rev: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The evaluations FILE holds for ``rev``, by (target, batch, group); the last wins."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue            # a line cut by a kill: that evaluation runs again
            if doc.get("commit") == rev:
                out[tuple(doc["group"])] = doc
    return out


def results_of(doc: dict[str, Any]) -> list[CellResult]:
    return [CellResult(SimpleNamespace(id=c["id"], kind=c["kind"], target=c["target"]),
                       list(c["problems"]), c["seconds"]) for c in doc["cells"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", choices=("full", "quick"), default="full")
    ap.add_argument("--targets", help=f"comma-separated, of {','.join(t.key for t in TARGETS)}")
    ap.add_argument("--batches", help=f"comma-separated, of {','.join(BATCHES)}")
    ap.add_argument("--entries", help="comma-separated registry ids or setting names")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--keep", help="keep the state, data and reports in this folder")
    ap.add_argument("--progress", help="append each finished evaluation here (JSON lines) and "
                    "skip those it already holds for this commit")
    ns = ap.parse_args()
    profile = FULL if ns.profile == "full" else quick_profile()

    def split(s: str | None) -> list[str] | None:
        return [x for x in s.split(",") if x] if s else None
    profile = restrict(profile, targets=split(ns.targets), batches=split(ns.batches),
                       entries=split(ns.entries))
    root = Path(ns.keep) if ns.keep else Path(tempfile.mkdtemp(prefix="fortis-matrix-"))
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    def log(s: str) -> None:
        print(f"[{time.monotonic() - t0:7.0f}s] {s}", file=sys.stderr, flush=True)

    # the services' log lines go to stderr: stdout is the JSON document
    import structlog
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    rev = commit()
    progress = Path(ns.progress) if ns.progress else None
    done = recorded(progress, rev) if progress else {}
    m = Matrix(profile, root, log=log)
    results: list[CellResult] = []
    seconds = 0.0
    try:
        groups = m.groups()

        def reusable(key: tuple[str, str, str], cells: list[Any]) -> bool:
            return key in done and {c["id"] for c in done[key]["cells"]} == {c.id for c in cells}
        n_done = sum(reusable((t.key, b, g), cs) for t, b, g, cs in groups)
        log(f"{len(m.cells)} cells in {len(groups)} evaluations"
            + (f"; {n_done} recorded in {progress} for {rev[:12]}" if n_done else ""))
        for t, batch, group, cells in groups:
            key = (t.key, batch, group)
            if reusable(key, cells):
                got = results_of(done[key])
                seconds += done[key]["seconds"]
                log(f"{t.key} batch={batch} {group}: recorded, "
                    f"{sum(r.ok for r in got)} ok, {sum(not r.ok for r in got)} failing")
            else:
                t1 = time.monotonic()
                got = m.run_group(t, batch, group, cells)
                took = time.monotonic() - t1
                seconds += took
                if progress:
                    with progress.open("a") as f:
                        f.write(json.dumps({
                            "commit": rev, "group": list(key), "seconds": round(took, 1),
                            "cells": [{"id": r.cell.id, "kind": r.cell.kind,
                                       "target": r.cell.target, "problems": r.problems,
                                       "seconds": round(r.seconds, 2)} for r in got]}) + "\n")
            for r in got:
                if not r.ok:
                    log(f"FAIL {r.cell.id}: {'; '.join(r.problems)[:500]}")
            results += got
    finally:
        m.close()
        if not ns.keep:
            shutil.rmtree(root, ignore_errors=True)
    doc = summary(results, seconds if progress else time.monotonic() - t0, profile)
    doc["commit"] = rev
    text = json.dumps(doc, indent=2)
    print(text)
    if ns.out:
        Path(ns.out).write_text(text + "\n")
    return 1 if doc["failing"] else 0


if __name__ == "__main__":
    sys.exit(main())
