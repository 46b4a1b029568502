"""Several workers, one evaluation: work items taken by exclusive, leased claims. Each worker
takes a shard of work items from the database and runs the same worker entry point.

A worker walks the stages exactly as the single-process runner does (the same stage code,
the same item keys, the same seeds: CAN-9's determinism makes any worker's result the one
the runner would have computed) but, before running an item, it claims it in the store:

- ``claimed``: the item is this worker's under a lease; it runs it and commits the result
  with :meth:`~.store.EvaluationStorage.finish_claimed`, which *adds* its counts to the
  evaluation's progress (workers never overwrite each other's);
- ``done``: another worker finished it; its stored result is used (a later stage that needs
  it, e.g. nothing today, would read it the same way);
- ``leased``: another worker is running it; the item is set aside and this worker goes on
  with the next free one, coming back to the set-aside items when nothing else is free. An
  item whose holder died (its lease ran out: no heartbeat) is claimed again and rerun.

A heartbeat thread renews this worker's leases every third of the lease, so a long item
(a query attack chunk) is never taken from a live worker. Queries sent by a worker that died
mid-item stay in the proxy's ledger; the rerun of a query-attack chunk shares the chunk's
session and so its Q_m (SPEC IEEE-A8, as a resumed attempt does), and the ledger's idempotent
attempt keys keep a retried call from being counted twice.

Domain code: no gRPC.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from fortis.services.evaluation.answers import pack, unpack
from fortis.services.evaluation.keys import WorkItemKey

if TYPE_CHECKING:
    from fortis.services.evaluation.store import EvaluationStorage

log = structlog.get_logger("fortis.evaluation.claims")

Job = tuple[WorkItemKey, int, Callable[[int], tuple[dict[str, Any], int]]]



class RunContext(Protocol):
    """What claims need of the stages' run context (``stages.base.RunContext``)."""

    @property
    def progress(self) -> Any: ...

    def check_cancelled(self) -> None: ...


#: Default lease of a claimed item (renewed every third of it while the worker lives).
DEFAULT_LEASE_S = 60.0


class ItemClaims:
    """One worker's claims on one evaluation's items (see the module docstring)."""

    def __init__(self, store: EvaluationStorage, evaluation_id: str, worker_id: str, *,
                 lease_s: float = DEFAULT_LEASE_S, poll_s: float = 0.5,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.store = store
        self.evaluation_id = evaluation_id
        self.worker_id = worker_id
        self.lease_s = lease_s
        self.poll_s = poll_s
        self._sleep = sleep
        #: Items this worker ran to the end / found done by others / waited for.
        self.ran = 0
        self.reused = 0
        self.waited = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    # -- lifetime ---------------------------------------------------------------------------
    def start(self) -> ItemClaims:
        """Start the heartbeat that keeps this worker's leases alive."""
        self._beat = threading.Thread(target=self._heartbeat, name="lease-heartbeat",
                                      daemon=True)
        self._beat.start()
        return self

    def close(self, *, release: bool = True) -> None:
        """Stop the heartbeat and (by default) give back the leases of unfinished items, so
        other workers claim them at once instead of after the lease runs out."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5.0)
        if release:
            try:
                n = self.store.release_items(self.evaluation_id, self.worker_id)
                if n:
                    log.info("leases_released", items=n, worker=self.worker_id)
            except Exception as exc:  # noqa: BLE001 - the leases expire anyway
                log.warning("leases_not_released", worker=self.worker_id, error=str(exc)[:200])

    def _heartbeat(self) -> None:
        every = max(self.lease_s / 3.0, 0.05)
        while not self._stop.wait(every):
            try:
                self.store.renew_leases(self.evaluation_id, self.worker_id, lease_s=self.lease_s)
            except Exception as exc:  # noqa: BLE001 - retried at the next beat
                log.warning("lease_renewal_failed", worker=self.worker_id, error=str(exc)[:200])

    # -- running items ----------------------------------------------------------------------
    def run(self, ctx: RunContext, jobs: Sequence[Job], parallel: int) -> list[dict[str, Any]]:
        """Results of ``jobs`` in order: each run here if this worker can claim it, read from
        the store if another worker finished it, waited for while another holds it.
        ``parallel`` threads take items; the first failure stops the rest and is raised."""
        results: list[dict[str, Any] | None] = [None] * len(jobs)
        todo = deque(range(len(jobs)))
        aside: deque[int] = deque()
        failed: list[BaseException] = []

        def take() -> tuple[int, bool] | None:
            with self._lock:
                if failed:
                    return None
                if todo:
                    return todo.popleft(), False
                if aside:
                    return aside.popleft(), True
                return None

        def loop() -> None:
            while (nxt := take()) is not None:
                i, again = nxt
                try:
                    out = self._one(ctx, *jobs[i])
                except BaseException as exc:
                    with self._lock:
                        failed.append(exc)
                    return
                if out is None:                     # held by another worker
                    with self._lock:
                        aside.append(i)
                    if again:
                        with self._lock:
                            self.waited += 1
                        self._sleep(self.poll_s)
                else:
                    results[i] = out

        n = max(1, min(parallel, len(jobs)))
        if n == 1:
            loop()
        else:
            with ThreadPoolExecutor(max_workers=n, thread_name_prefix="claim") as pool:
                for f in [pool.submit(loop) for _ in range(n)]:
                    f.result()
        if failed:
            raise failed[0]
        assert all(r is not None for r in results)
        return [r for r in results if r is not None]

    def _one(self, ctx: RunContext, key: WorkItemKey, images: int,
             work: Callable[[int], tuple[dict[str, Any], int]]) -> dict[str, Any] | None:
        """Run, reuse or set aside one item (None: another worker holds it)."""
        ctx.check_cancelled()
        name = key.format()
        eid = self.evaluation_id
        state = self.store.claim_key(eid, name, self.worker_id, lease_s=self.lease_s)
        if state == "leased":
            return None
        if state == "done":
            done, _, blob = self.store.item(eid, name)
            if done and blob is not None:
                with self._lock:
                    self.reused += 1
                return unpack(blob)
            return None                             # finished between two reads: look again
        attempt = self.store.start_item(eid, name)
        result, queries = work(attempt)
        # Not checked for a stop here: an item that ran to the end is committed, so a worker
        # told to stop (SIGTERM) stops at the next item boundary and none of the queries it
        # sent is sent again by the worker that would rerun it (IEEE-M6). Work cut
        # by the stop raises instead (a query attack's stream), and its rerun shares the
        # chunk's session (answers replayed from the ledger).
        first = self.store.finish_claimed(eid, name, self.worker_id, pack(result),
                                          images=images, queries=queries, message=name)
        ctx.progress.item_finished(images, queries)
        with self._lock:
            self.ran += 1
        if not first:   # our lease ran out and another worker finished it too: same result
            log.warning("item_finished_twice", item=name, worker=self.worker_id)
        return result
