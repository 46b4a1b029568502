"""The evaluation store on SQLite and on PostgreSQL, the same assertions (SPEC CAN-9: a
restarted service resumes from committed items).

Real back ends only: SQLite files in the test's temp dir, and a real PostgreSQL server
(``tests/infra/postgres.py``) with a fresh database per test. The claim tests run two worker
*processes* against one store and check that no item is handed to both.
"""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from fortis.services.common import errors
from fortis.services.evaluation.store import EvaluationStorage, EvaluationStore

from tests.storage.conftest import Backend


def open_store(backend: Backend) -> Any:
    if backend.kind == "sqlite":
        return EvaluationStore(backend.dir / "evaluations.sqlite")
    from fortis.services.evaluation.store_pg import PgEvaluationStore
    return PgEvaluationStore(backend.url)


@pytest.fixture()
def store(backend: Backend) -> Any:
    s = open_store(backend)
    yield s
    s.close()


class _Summary:
    accuracy, average_robustness_corr, average_robustness_adv, m = 0.75, 0.5, 0.25, 16


def test_both_back_ends_have_the_protocols_methods(store: Any) -> None:
    wanted = [n for n in dir(EvaluationStorage) if not n.startswith("_")]
    assert "claim_items" in wanted and "finish_item" in wanted
    missing = [n for n in wanted if not hasattr(store, n)]
    assert missing == []


def test_evaluation_rows_progress_and_final_state(store: Any) -> None:
    a = store.for_tenant("tenant-a")
    v0 = store.version
    a.insert(evaluation_id="ev-1", tenant="tenant-a", plan_text="p: 1", plan_name="plan")
    assert store.version > v0                     # watchers are woken by this process's writes
    row = a.get("ev-1")
    assert (row.state, row.plan_text, row.stage, row.items_done, row.error_status) == (
        "PENDING", "p: 1", "plan", 0, None)
    assert a.update_running("ev-1", state="RUNNING", items_total=3, images_total=30)
    assert [r.evaluation_id for r in store.active()] == ["ev-1"]
    a.update("ev-1", error_status=b"\x00\x01binary")
    assert a.get("ev-1").error_status == b"\x00\x01binary"
    a.mark_resumed("ev-1")
    assert a.get("ev-1").resumed_count == 1
    assert a.finish("ev-1", report_json="{}", report_html="<p>", summary=_Summary(),
                    finished_at=123.5)
    row = a.get("ev-1")
    assert (row.state, row.stage, row.finished_at) == ("SUCCEEDED", "done", 123.5)
    assert '"accuracy": 0.75' in row.summary_json
    assert a.report("ev-1") == ("{}", "<p>")
    # a final state is never overwritten by a late update of its worker
    assert not a.update_running("ev-1", state="RUNNING")
    assert a.get("ev-1").state == "SUCCEEDED"
    assert store.active() == []


def test_list_pages_newest_first(store: Any) -> None:
    a = store.for_tenant("tenant-a")
    for i in range(5):
        a.insert(evaluation_id=f"ev-{i}", tenant="tenant-a", plan_text="", plan_name="p")
        time.sleep(0.002)
    first = store.list("tenant-a", limit=2)
    assert [r.evaluation_id for r in first] == ["ev-4", "ev-3"]
    rest = store.list("tenant-a", limit=10,
                      after=(first[-1].created_at, first[-1].evaluation_id))
    assert [r.evaluation_id for r in rest] == ["ev-2", "ev-1", "ev-0"]


def test_items_attempts_results_and_progress_in_one_commit(store: Any) -> None:
    a = store.for_tenant("tenant-a")
    a.insert(evaluation_id="ev", tenant="tenant-a", plan_text="", plan_name="p")
    a.update_running("ev", state="RUNNING")
    assert a.item("ev", "k1") == (False, 0, None)
    assert a.start_item("ev", "k1") == 1
    assert a.start_item("ev", "k1") == 2                  # a redone item is a new attempt
    a.finish_item("ev", "k1", b"npz-bytes", items_done=1, images_done=8, queries=40,
                  message="1 of 2")
    assert a.item("ev", "k1") == (True, 2, b"npz-bytes")
    row = a.get("ev")
    assert (row.items_done, row.images_done, row.queries, row.message) == (1, 8, 40, "1 of 2")
    assert list(a.items("ev")) == [("k1", 2, True)]
    # a cancelled evaluation keeps its message: the item commits, the progress does not
    a.update_running("ev", state="CANCELLED", message="cancelled by a caller")
    a.start_item("ev", "k2")
    a.finish_item("ev", "k2", b"r2", items_done=2, images_done=16, queries=80, message="2 of 2")
    row = a.get("ev")
    assert (row.state, row.items_done, row.message) == ("CANCELLED", 1, "cancelled by a caller")
    assert a.item("ev", "k2")[0] is True


def test_tenants_see_only_their_own_evaluations_and_items(store: Any) -> None:
    a, b = store.for_tenant("tenant-a"), store.for_tenant("tenant-b")
    a.insert(evaluation_id="same", tenant="tenant-a", plan_text="A", plan_name="p")
    b.insert(evaluation_id="same", tenant="tenant-b", plan_text="B", plan_name="p")
    assert (a.get("same").plan_text, b.get("same").plan_text) == ("A", "B")
    a.start_item("same", "k")
    a.finish_item("same", "k", b"a", items_done=1, images_done=1, queries=0, message="")
    assert b.item("same", "k") == (False, 0, None)
    assert list(b.items("same")) == []
    b.add_items("same", ["k"])
    assert b.claim_items("same", "w", limit=5, lease_s=60) == ["k"]   # B's own item, not A's
    assert a.claim_items("same", "w", limit=5, lease_s=60) == []      # A's is done
    assert [r.plan_text for r in store.list("tenant-b", limit=10)] == ["B"]
    with pytest.raises(RuntimeError):
        store.get("same")                      # per-evaluation access needs a tenant's view


def test_claims_lease_release_renew_and_expire(store: Any) -> None:
    a = store.for_tenant("tenant-a")
    a.insert(evaluation_id="ev", tenant="tenant-a", plan_text="", plan_name="p")
    keys = [f"item-{i:02d}" for i in range(6)]
    assert a.add_items("ev", keys) == 6
    assert a.add_items("ev", keys[:2]) == 0               # known items are kept as they are
    assert list(a.items("ev")) == [(k, 0, False) for k in keys]
    w1 = a.claim_items("ev", "w1", limit=4, lease_s=60)
    w2 = a.claim_items("ev", "w2", limit=4, lease_s=60)
    assert w1 == keys[:4] and w2 == keys[4:]              # disjoint, in key order
    assert a.claim_items("ev", "w3", limit=4, lease_s=60) == []
    assert a.leases("ev") == {**{k: "w1" for k in w1}, **{k: "w2" for k in w2}}
    # w1 finishes one item and gives back one: only the given-back one is claimable again
    a.start_item("ev", w1[0])
    a.finish_item("ev", w1[0], b"r", items_done=1, images_done=1, queries=0, message="")
    assert a.release_items("ev", "w1", [w1[1]]) == 1
    assert a.claim_items("ev", "w3", limit=4, lease_s=60) == [w1[1]]
    # w2 dies: its short lease runs out and another worker takes its items
    assert a.renew_leases("ev", "w2", lease_s=0.3) == 2
    assert a.claim_items("ev", "w4", limit=4, lease_s=60) == []
    time.sleep(0.6)
    assert a.leases("ev").get(w2[0]) is None
    assert a.expire_leases("ev") == 2
    assert a.claim_items("ev", "w4", limit=4, lease_s=60) == w2
    assert a.renew_leases("ev", "w2", lease_s=60) == 0    # no longer its items
    assert a.release_items("ev", "w1") == 2               # the rest of w1's
    assert sorted(a.claim_items("ev", "w5", limit=10, lease_s=60)) == sorted(w1[2:4])


def test_claim_arguments_are_checked(store: Any) -> None:
    a = store.for_tenant("tenant-a")
    for kwargs, field in (({"worker_id": "", "limit": 1, "lease_s": 1}, "worker_id"),
                          ({"worker_id": "w", "limit": 0, "lease_s": 1}, "limit"),
                          ({"worker_id": "w", "limit": 1, "lease_s": 0}, "lease_s")):
        with pytest.raises(errors.InvalidArgument) as e:
            a.claim_items("ev", **kwargs)
        assert e.value.violations[0].field == field


def _claim_worker(kind: str, where: str, worker: str, start: Any, out: Any) -> None:
    """A worker process: claim two items at a time until none is left."""
    store = open_store(Backend(kind, Path(where), where if kind == "postgres" else ""))
    view = store.for_tenant("tenant-a")
    got: list[str] = []
    start.wait(30)
    while True:
        keys = view.claim_items("ev", worker, limit=2, lease_s=120)
        if not keys:
            break
        got += keys
        time.sleep(0.001)               # "work", so the two workers interleave
    store.close()
    out.put((worker, got))


def test_two_worker_processes_never_claim_the_same_item(store: Any, backend: Backend) -> None:
    a = store.for_tenant("tenant-a")
    a.insert(evaluation_id="ev", tenant="tenant-a", plan_text="", plan_name="p")
    keys = [f"k{i:04d}" for i in range(300)]
    a.add_items("ev", keys)
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    where = backend.url if backend.kind == "postgres" else str(backend.dir)
    procs = [ctx.Process(target=_claim_worker, args=(backend.kind, where, w, start, out))
             for w in ("w1", "w2")]
    for p in procs:
        p.start()
    time.sleep(1.5 if backend.kind == "postgres" else 1.0)     # both imported and connected
    start.set()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    w1, w2 = results["w1"], results["w2"]
    assert set(w1).isdisjoint(w2)
    assert sorted(w1 + w2) == keys and len(w1) + len(w2) == len(keys)   # none twice, none lost
    assert w1 and w2                          # both workers really took part
    assert a.leases("ev") == {**{k: "w1" for k in w1}, **{k: "w2" for k in w2}}


def test_a_sqlite_file_from_before_leases_gets_the_lease_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE items (tenant TEXT NOT NULL, evaluation_id TEXT NOT NULL, item_key TEXT"
        " NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, done INTEGER NOT NULL DEFAULT 0,"
        " result BLOB, PRIMARY KEY (tenant, evaluation_id, item_key));"
        "INSERT INTO items VALUES ('t', 'ev', 'old', 1, 0, NULL);")
    conn.close()
    store = EvaluationStore(path)
    try:
        view = store.for_tenant("t")
        assert list(view.items("ev")) == [("old", 1, False)]
        assert view.claim_items("ev", "w", limit=5, lease_s=60) == ["old"]
    finally:
        store.close()
