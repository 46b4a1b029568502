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

    python bench/matrix.py [--targets cnn,haar] [--batches default,1] [--entries square,fog]
                           [--profile full|quick] [--out matrix.json] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.matrix.catalogue import (  # noqa: E402
    BATCHES,
    FULL,
    TARGETS,
    Matrix,
    quick_profile,
    restrict,
    summary,
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", choices=("full", "quick"), default="full")
    ap.add_argument("--targets", help=f"comma-separated, of {','.join(t.key for t in TARGETS)}")
    ap.add_argument("--batches", help=f"comma-separated, of {','.join(BATCHES)}")
    ap.add_argument("--entries", help="comma-separated registry ids or setting names")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--keep", help="keep the state, data and reports in this folder")
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

    m = Matrix(profile, root, log=log)
    try:
        log(f"{len(m.cells)} cells in {len(m.groups())} evaluations")

        def on_result(r):  # noqa: ANN001, ANN202
            if not r.ok:
                log(f"FAIL {r.cell.id}: {'; '.join(r.problems)[:500]}")
        results = m.run(on_result)
    finally:
        m.close()
        if not ns.keep:
            shutil.rmtree(root, ignore_errors=True)
    doc = summary(results, time.monotonic() - t0, profile)
    text = json.dumps(doc, indent=2)
    print(text)
    if ns.out:
        Path(ns.out).write_text(text + "\n")
    return 1 if doc["failing"] else 0


if __name__ == "__main__":
    sys.exit(main())
