"""Claims of one item at a time by workers walking the stages (worker mode: ``claim_key`` /
``finish_claimed`` and ``services/evaluation/claims.py``), on SQLite and on a real PostgreSQL,
the same assertions. SPEC CAN-9: each item is computed once and its result kept; progress counts
every item once whatever the number of workers.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from fortis.services.common import errors
from fortis.services.evaluation.answers import pack
from fortis.services.evaluation.claims import ItemClaims
from fortis.services.evaluation.keys import StageName, WorkItemKey

from tests.storage.conftest import Backend
from tests.storage.test_evaluation_store import open_store


@pytest.fixture()
def store(backend: Backend) -> Any:
    s = open_store(backend).for_tenant("tenant-a")
    s.insert(evaluation_id="ev", tenant="tenant-a", plan_text="p", plan_name="p")
    s.update_running("ev", state="RUNNING")
    yield s
    s.close()


def test_claim_key_is_exclusive_until_done_or_expired(store: Any) -> None:
    assert store.claim_key("ev", "k1", "w1", lease_s=60) == "claimed"
    assert store.claim_key("ev", "k1", "w2", lease_s=60) == "leased"
    assert store.claim_key("ev", "k1", "w1", lease_s=60) == "claimed"     # its own again
    assert store.finish_claimed("ev", "k1", "w1", pack({"x": 1}), images=8, queries=8,
                                message="k1")
    assert store.claim_key("ev", "k1", "w2", lease_s=60) == "done"
    # finished twice (a lease that ran out): the second neither overwrites nor re-counts
    assert not store.finish_claimed("ev", "k1", "w2", pack({"x": 2}), images=8, queries=8,
                                    message="k1")
    row = store.get("ev")
    assert (row.items_done, row.images_done, row.queries) == (1, 8, 8)
    # an expired lease is claimed by another worker
    assert store.claim_key("ev", "k2", "w1", lease_s=0.2) == "claimed"
    time.sleep(0.4)
    assert store.claim_key("ev", "k2", "w2", lease_s=60) == "claimed"
    assert store.leases("ev") == {"k2": "w2"}


def test_progress_adds_up_across_workers(store: Any) -> None:
    def work(w: str, keys: list[str]) -> None:
        for k in keys:
            if store.claim_key("ev", k, w, lease_s=60) == "claimed":
                store.finish_claimed("ev", k, w, pack({"k": k}), images=3, queries=5,
                                     message=k)

    keys = [f"k{i:02d}" for i in range(20)]
    ts = [threading.Thread(target=work, args=(f"w{i}", keys)) for i in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    row = store.get("ev")
    assert (row.items_done, row.images_done, row.queries) == (20, 60, 100)


def test_claim_key_refuses_bad_arguments(store: Any) -> None:
    with pytest.raises(errors.InvalidArgument, match="worker_id"):
        store.claim_key("ev", "k", "", lease_s=60)
    with pytest.raises(errors.InvalidArgument, match="lease_s"):
        store.claim_key("ev", "k", "w", lease_s=float("nan"))


def _take(claims: ItemClaims, jobs: list[Any], threads: int) -> list[Any]:
    """What a stage's run context does in worker mode: ``threads`` threads ask the queue for
    the next claim, run the item when it is theirs and commit it, reuse it when another
    worker finished it, ask again while another worker holds it."""
    queue = claims.queue([key.format() for key, _, _ in jobs])
    results: list[Any] = [None] * len(jobs)

    def loop() -> None:
        while (claim := queue.next()) is not None:
            if claim.state == "done":
                results[claim.index] = claim.result
            elif claim.state == "claimed":
                _, images, work = jobs[claim.index]
                result, queries = work(claim.attempt)
                claims.commit(claim.key, result, images=images, queries=queries)
                results[claim.index] = result

    ts = [threading.Thread(target=loop) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return results


def test_two_workers_share_items_and_wait_for_each_other(store: Any) -> None:
    """Two ItemClaims on one store run the same job list: every item runs exactly once, a
    worker waits for items the other holds, and both get every result in order."""
    ran: dict[str, list[str]] = {"a": [], "b": []}
    lock = threading.Lock()

    def jobs(who: str) -> list[Any]:
        def work(k: str) -> Any:
            def run(_attempt: int) -> tuple[dict[str, Any], int]:
                with lock:
                    ran[who].append(k)
                time.sleep(0.05)
                return {"key": k}, 1
            return run
        return [(WorkItemKey(StageName.CLEAN, chunk=i), 1, work(f"c{i}")) for i in range(12)]

    out: dict[str, list[Any]] = {}
    claims = {w: ItemClaims(store, "ev", w, lease_s=30, poll_s=0.02) for w in ("a", "b")}

    def worker(who: str) -> None:
        claims[who].start()
        try:
            out[who] = _take(claims[who], jobs(who), 2)
        finally:
            claims[who].close()

    ts = [threading.Thread(target=worker, args=(w,)) for w in ("a", "b")]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    everything = sorted(ran["a"] + ran["b"])
    assert everything == sorted(f"c{i}" for i in range(12))        # each exactly once
    assert ran["a"] and ran["b"]
    want = [{"key": f"c{i}"} for i in range(12)]
    assert [dict(r) for r in out["a"]] == want and [dict(r) for r in out["b"]] == want
    assert store.get("ev").items_done == 12
    # what each worker ran it committed; the rest it read back or waited for
    assert [claims[w].ran for w in ("a", "b")] == [len(ran["a"]), len(ran["b"])]
    assert claims["a"].reused + claims["b"].reused == 12
