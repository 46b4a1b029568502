#!/usr/bin/env python3
"""Scale-out of an evaluation's work items (work fan-out performance).

One plan of corruptions over Fashion-MNIST is run end to end (clean pass, every corruption
at every severity, scoring, report) by:

- ``embedded``: one process, the evaluation service's own worker threads, SQLite files in a
  temp folder (the embedded default). Every other mode's metrics are compared with its;
- ``embedded-postgresql`` (``--embedded-postgres``, with a database): the same one process,
  its evaluation store and proxy ledger in PostgreSQL (what the database alone costs);
- ``processes-K``: the evaluation service with ``--executor processes`` and K local
  ``fortis worker`` processes (``JOB_COMPLETION_INDEX`` 0..K-1) sharing the items through
  leased claims in the store, with K perturbation replicas (``fortis serve --service
  perturbation``): worker i corrupts on replica i mod K, so the corruption compute is spread
  over processes as Kubernetes spreads it over perturbation pods. The store and the ledger
  are PostgreSQL with ``--database-url`` (``auto``: a throw-away server of our own,
  ``tests/infra/postgres.py`` with fsync on, one fresh migrated database per mode), SQLite
  files otherwise.

For each mode: the wall time of the whole evaluation (submit to SUCCEEDED), images/s
through the proxy (every image sent to the target is a ledger row), the corruption stage's
own throughput (its images over the span of their ``sent_at`` in the ledger: first to last
image sent), the items each worker ran, whether the ledger's rows equal the images the
report counts, and whether the metrics equal the embedded run's (they must: workers compute
the same items, CAN-9). The target is the built-in Fashion-MNIST CNN inside the evaluation
service's process, behind its proxy. Prints JSON (and writes it to ``--out``); never part
of the test run.

``--full`` is the issue's end-to-end preset: the whole Fashion-MNIST test set (M = 10,000,
the standard's recommended size) under all 19 ImageNet-C corruptions x 5 severities
(950,000 corrupted images), embedded vs 2 workers on PostgreSQL (``auto`` unless a URL is
given).

    python bench/scale.py [--images 1000] [--corruptions all|gaussian_noise,contrast,...]
                          [--severities 1,2,3,4,5] [--workers 1,2,4] [--batch 64]
                          [--database-url URL|auto] [--embedded-postgres] [--full]
                          [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KEY = "bench-key"
TENANT = "bench"
INTERNAL = "bench-internal-key"
#: The 19 ImageNet-C corruptions (Hendrycks & Dietterich 2019: 15 + 4 held-out).
IMAGENET_C = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur",
              "motion_blur", "zoom_blur", "snow", "frost", "fog", "brightness", "contrast",
              "elastic_transform", "pixelate", "jpeg_compression", "speckle_noise",
              "gaussian_blur", "spatter", "saturate")


def _plan(n: int, corruptions: list[str], severities: list[int], batch: int) -> str:
    corr = ", ".join(f"{{id: {c}, severities: [{', '.join(map(str, severities))}]}}"
                     for c in corruptions)
    return (f"name: scale\nseed: 3\ntarget: {{name: fmnist-cnn, task: classification}}\n"
            f"dataset: {{source: fashion-mnist, split: test, limit: {n}}}\n"
            f"correctness: {{mode: top1}}\ncorruptions: [{corr}]\n"
            f"execution: {{batch_size: {batch}}}\n")


def _log(msg: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _replica(state: Path) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, FORTIS_INTERNAL_KEY=INTERNAL, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "fortis.server.cli", "serve", "--address",
                             "127.0.0.1:0", "--service", "perturbation", "--state-dir",
                             str(state), "--no-auth", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line:
        raise SystemExit("a perturbation replica did not start")
    return proc, json.loads(line)["address"]


@contextlib.contextmanager
def databases(url: str | None) -> Iterator[Callable[[], str | None]]:
    """A function giving each mode its database URL: None without one (SQLite); with
    ``auto``, a fresh migrated database on a durable server of our own (fsync on, as
    ``bench/storage.py`` starts it); with a URL, that database migrated to head (modes
    share it, their rows told apart by evaluation id)."""
    from fortis.infra.storage import sqldb

    def migrated(u: str) -> str:
        engine = sqldb.create_engine(u)
        try:
            sqldb.upgrade(engine)
        finally:
            engine.dispose()
        return u

    if not url:
        yield lambda: None
        return
    if url != "auto":
        migrated(url)
        yield lambda: url
        return
    sys.path.insert(0, str(ROOT))
    from tests.infra.postgres import PostgresServer

    server = PostgresServer(fsync=True).start()
    try:
        yield lambda: migrated(server.url(server.create_database()))
    finally:
        server.stop()


def _ledger_and_items(state: Path, database_url: str | None, eid: str) -> dict[str, Any]:
    """From the ledger: images sent, and the corruption stage's images and sent_at span;
    from the store: done items per worker (lease owner)."""
    session = f"{eid}/corruptions"
    sent_q = ("SELECT COUNT(*) FROM queries WHERE session_id LIKE :e"
              " AND error NOT LIKE 'not sent:%'")
    stage_q = ("SELECT COUNT(*), MIN(sent_at), MAX(sent_at) FROM queries WHERE session_id=:s"
               " AND error NOT LIKE 'not sent:%'")
    items_q = ("SELECT lease_owner, COUNT(*) FROM items WHERE evaluation_id=:e AND done"
               " GROUP BY lease_owner")
    if database_url:
        import sqlalchemy as sa
        from fortis.infra.storage import sqldb

        engine = sqldb.create_engine(database_url)
        try:
            with engine.connect() as conn:
                sent = conn.execute(sa.text(sent_q), {"e": f"{eid}/%"}).scalar()
                n, first, last = conn.execute(sa.text(stage_q), {"s": session}).one()
                owners = conn.execute(sa.text(items_q), {"e": eid}).all()
        finally:
            engine.dispose()
    else:
        with contextlib.closing(sqlite3.connect(state / "ledger.sqlite")) as led:
            sent = led.execute(sent_q.replace(":e", "?"), (f"{eid}/%",)).fetchone()[0]
            n, first, last = led.execute(stage_q.replace(":s", "?"), (session,)).fetchone()
        with contextlib.closing(sqlite3.connect(state / "evaluations.sqlite")) as st:
            owners = st.execute(items_q.replace(":e", "?"), (eid,)).fetchall()
    span = float(last - first) if n else 0.0
    return {"ledger_images_sent": int(sent or 0),
            "corruption_stage": {"images": int(n or 0), "seconds": round(span, 2),
                                 "images_per_s": round(n / span, 1) if span > 0 else 0.0},
            "items_by_worker": sorted((int(c) for o, c in owners if o), reverse=True),
            "items_by_service": sum(int(c) for o, c in owners if not o)}


def run(mode: str, workers: int, plan: str, database_url: str | None) -> dict[str, Any]:
    from fortis.client import FortisClient, progress_of
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    _log(f"{mode}: starting ({'postgresql' if database_url else 'sqlite'})")
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="fortis-scale-") as tmp:
        state_dir = Path(tmp) / "state"
        replicas: list[tuple[subprocess.Popen, str]] = []
        extra: dict[str, Any] = {}
        if workers:
            replicas = [_replica(Path(tmp) / f"pt{i}") for i in range(workers)]
            extra = {"executor": "processes", "worker_processes": workers,
                     "worker_perturbation_addresses": [a for _, a in replicas]}
        if database_url:
            extra["database_url"] = database_url
        stack = start_stack(StackSettings(
            state_dir=state_dir, api_keys={KEY: TENANT}, internal_key=INTERNAL,
            targets=[TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn")], **extra))
        try:
            with FortisClient(stack.address, api_key=KEY, timeout_s=600) as fc:
                t0 = time.perf_counter()
                ev = fc.submit(plan)
                final = fc.wait(ev.evaluation_id, timeout_s=4 * 3600)
                seconds = time.perf_counter() - t0
                state = progress_of(final).state
                report = fc.report(ev.evaluation_id) if state == "SUCCEEDED" else {}
        finally:
            stack.stop(0)
            for proc, _ in replicas:
                proc.terminate()
                proc.wait(30)
        db = _ledger_and_items(state_dir, database_url, ev.evaluation_id)
    sent = sum(int(v) for v in report.get("ledger", {}).get("sessions", {}).values())
    row = {"mode": mode, "workers": workers,
           "store": "postgresql" if database_url else "sqlite", "state": state,
           "seconds": round(seconds, 2), "images_sent": sent,
           "images_per_s": round(sent / seconds, 1) if seconds else 0.0, **db,
           "ledger_equals_report": db["ledger_images_sent"] == sent,
           "load_avg_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],
           "metrics": report.get("metrics")}
    _log(f"{mode}: {state} in {row['seconds']} s, {row['images_per_s']} images/s, "
         f"corruption stage {db['corruption_stage']['images_per_s']} images/s")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--images", type=int, default=None, help="M (default 1000; --full 10000)")
    ap.add_argument("--corruptions", default=None, help="ids, or 'all' (every corruption in "
                    "the catalogue), or 'imagenet-c' (the 19); default 5 of them")
    ap.add_argument("--severities", default=None, help="default 1,3,5 (--full 1,2,3,4,5)")
    ap.add_argument("--workers", default=None, help="worker counts (default 1,2,4; --full 2)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--database-url", default=os.environ.get("FORTIS_DATABASE_URL") or None,
                    help="PostgreSQL for the store and ledger of every mode but 'embedded' "
                    "(default $FORTIS_DATABASE_URL; 'auto': a throw-away durable server of "
                    "our own; none: SQLite; --full: auto)")
    ap.add_argument("--embedded-postgres", action="store_true",
                    help="also run the embedded mode on the database")
    ap.add_argument("--full", action="store_true", help="M = 10,000 x the 19 ImageNet-C "
                    "corruptions x 5 severities, embedded vs 2 workers on PostgreSQL")
    ap.add_argument("--out", help="also write the JSON here")
    ns = ap.parse_args()
    if ns.full:
        ns.images = ns.images or 10_000
        ns.corruptions = ns.corruptions or "imagenet-c"
        ns.severities = ns.severities or "1,2,3,4,5"
        ns.workers = ns.workers or "2"
        ns.database_url = ns.database_url or "auto"
    ns.images = ns.images or 1000
    ns.severities = ns.severities or "1,3,5"
    ns.workers = "1,2,4" if ns.workers is None else ns.workers
    from fortis.server.app.stack import local_catalogue
    from fortis.server.cli.logs import configure

    configure("error")
    known = sorted(k for k, e in local_catalogue().perturbations.items()
                   if e.kind == "corruption")
    spec = ns.corruptions or "gaussian_noise,contrast,brightness,defocus_blur,jpeg_compression"
    corruptions = (known if spec == "all" else list(IMAGENET_C) if spec == "imagenet-c"
                   else spec.split(","))
    missing = [c for c in corruptions if c not in known]
    if missing:
        raise SystemExit(f"not in the catalogue: {', '.join(missing)}")
    severities = [int(s) for s in ns.severities.split(",")]
    plan = _plan(ns.images, corruptions, severities, ns.batch)
    started = datetime.datetime.now(datetime.UTC)
    with databases(ns.database_url) as database:
        rows = [run("embedded", 0, plan, None)]
        if ns.database_url and ns.embedded_postgres:
            rows.append(run("embedded-postgresql", 0, plan, database()))
        for k in (int(w) for w in ns.workers.split(",") if w):
            rows.append(run(f"processes-{k}", k, plan, database()))
    ref = rows[0]["metrics"]
    for r in rows:
        r["metrics_equal_embedded"] = ref is not None and r.pop("metrics") == ref
        r["speedup_vs_embedded"] = round(rows[0]["seconds"] / r["seconds"], 3) \
            if r["seconds"] else 0.0
    out = {"benchmark": "work fan-out", "started_utc": started.isoformat(
               timespec="seconds"), "images": ns.images, "corruptions": corruptions,
           "severities": severities, "batch": ns.batch,
           "corrupted_images": ns.images * len(corruptions) * len(severities),
           "database": ("auto: own PostgreSQL, fsync=on" if ns.database_url == "auto"
                        else "given URL" if ns.database_url else "none (SQLite)"),
           "cpus": os.cpu_count(), "python": platform.python_version(),
           "conditions": "load_avg_1min per row: [at start, at end]; other processes on "
                         "this machine were not stopped", "rows": rows}
    text = json.dumps(out, indent=2)
    if ns.out:
        Path(ns.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
