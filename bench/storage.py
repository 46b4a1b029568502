#!/usr/bin/env python3
"""Proxy ledger throughput, SQLite vs PostgreSQL, durable, with concurrent writers
(ledger writes group-committed across concurrent calls).

Each of ``--threads`` threads makes ``--calls`` proxy-like calls: ``reserve`` the call's
``--images`` rows (write-ahead, before the images would go), then ``complete`` them (the
outcome, before the answer would be returned) -- the two durable commits the proxy makes per
call. Measured on both ledgers of this repository:

- SQLite (``services/proxy/ledger.py``): WAL, ``synchronous=FULL`` (fsync per commit
  group), a file in a temp folder on this machine's disk;
- PostgreSQL (``services/proxy/ledger_pg.py``): a server of our own started with
  ``fsync=on`` and ``synchronous_commit=on`` (the defaults: a commit is on disk when it
  returns; data folder on the same disk), or ``--database-url URL`` (migrated to head here;
  its durability is whatever that server is configured with).

Reports rows/s and calls/s, the transactions committed (group commit: fewer than the
writes), and the p50/p90 latency of one call (reserve + complete) with one thread and with
all of them. Prints JSON. Never part of the test run.

    python bench/storage.py [--threads 8] [--calls 200] [--images 1] [--database-url URL|auto]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def postgres(url: str) -> Iterator[tuple[str, str]]:
    """(a database URL at the schema head, what its durability is). ``auto``: a durable
    server of our own (``tests/infra/postgres.py`` with fsync on) on a free loopback port."""
    from fortis.infra.storage import sqldb

    if url != "auto":
        engine = sqldb.create_engine(url)
        try:
            sqldb.upgrade(engine)
        finally:
            engine.dispose()
        yield url, "as the server given is configured"
        return
    sys.path.insert(0, str(ROOT))
    from tests.infra.postgres import PostgresServer

    server = PostgresServer(fsync=True).start()
    try:
        own = server.url(server.create_database())
        engine = sqldb.create_engine(own)
        try:
            sqldb.upgrade(engine)
        finally:
            engine.dispose()
        yield own, "own server: fsync=on, synchronous_commit=on, full_page_writes=on"
    finally:
        server.stop()


def _rows(k: int, c: int, images: int, run: str) -> list[Any]:
    from fortis.services.proxy.ledger import IN_FLIGHT, IN_FLIGHT_NOTE, QueryRow

    now = time.time()
    return [QueryRow(tenant="bench", session_id=f"s-{run}", target="t", origin="bench",
                     image_id=f"{k}-{c}-{i}", input_sha256="0" * 64, output_summary="",
                     latency_ms=0.0, status=IN_FLIGHT, error=IN_FLIGHT_NOTE, sent_at=now,
                     call_id=f"{run}-{k}-{c}", attempts=1) for i in range(images)]


def _load(ledger: Any, threads: int, calls: int, images: int, run: str) -> dict[str, Any]:
    """``threads`` writers x ``calls`` reserve+complete each; throughput and latencies."""
    from fortis.services.proxy.ledger import Outcome

    lat: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads + 1)

    def work(k: int) -> None:
        mine = []
        barrier.wait()
        for c in range(calls):
            rows = _rows(k, c, images, run)
            t0 = time.perf_counter()
            ids = ledger.reserve(rows)
            ledger.complete([(e, Outcome(status="OK", latency_ms=1.0, output_summary="7"))
                             for e in ids])
            mine.append((time.perf_counter() - t0) * 1000.0)
        with lock:
            lat.extend(mine)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    commits0 = ledger.commits
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    seconds = time.perf_counter() - t0
    n_calls = threads * calls
    lat.sort()
    st = ledger.stats(f"s-{run}", "bench")
    assert st.queries_ok == n_calls * images, (st.queries_ok, n_calls * images)
    return {"threads": threads, "calls": n_calls, "rows": n_calls * images,
            "seconds": round(seconds, 3), "rows_per_s": round(n_calls * images / seconds, 1),
            "calls_per_s": round(n_calls / seconds, 1),
            "transactions": ledger.commits - commits0, "writes": 2 * n_calls,
            "call_p50_ms": round(lat[len(lat) // 2], 3),
            "call_p90_ms": round(lat[int(len(lat) * 0.9)], 3)}


def measure(ledger: Any, ns: argparse.Namespace) -> dict[str, Any]:
    """One thread, then ``--threads``, ``--rounds`` times each; the round with the median
    rows/s of each (every round's rows/s listed)."""
    _load(ledger, 2, 20, ns.images, "warmup")
    out: dict[str, Any] = {}
    for name, threads, calls in (("one_thread", 1, max(50, ns.calls // 2)),
                                 (f"{ns.threads}_threads", ns.threads, ns.calls)):
        runs = [_load(ledger, threads, calls, ns.images, f"{name}-{r}")
                for r in range(ns.rounds)]
        runs.sort(key=lambda r: r["rows_per_s"])
        out[name] = {**runs[len(runs) // 2],
                     "rows_per_s_each_round": [r["rows_per_s"] for r in runs]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--calls", type=int, default=200, help="calls per thread")
    ap.add_argument("--images", type=int, default=1, help="rows per call")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--database-url", default=os.environ.get("FORTIS_DATABASE_URL") or "auto",
                    help="PostgreSQL to measure (default $FORTIS_DATABASE_URL, else 'auto': a "
                    "durable server of our own)")
    ns = ap.parse_args()
    from fortis.infra.storage import sqldb
    from fortis.services.proxy.ledger import Ledger
    from fortis.services.proxy.ledger_pg import PgLedger

    out: dict[str, Any] = {"benchmark": "ledger_reserve_complete", "images_per_call": ns.images}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        led = Ledger(Path(tmp) / "ledger.sqlite", synchronous="FULL")
        try:
            out["sqlite"] = {"durability": "WAL, synchronous=FULL (fsync per commit group)",
                             **measure(led, ns)}
        finally:
            led.close()
    with postgres(ns.database_url) as (url, durability):
        pg = PgLedger(url)
        try:
            out["postgresql"] = {"durability": durability, "server": sqldb.redact_url(url),
                                 **measure(pg, ns)}
        finally:
            pg.close()
    key = f"{ns.threads}_threads"
    out["pg_over_sqlite_rows_per_s"] = round(
        out["postgresql"][key]["rows_per_s"] / out["sqlite"][key]["rows_per_s"], 3)
    out["cpu_count"] = os.cpu_count()
    out["python"] = platform.python_version()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
