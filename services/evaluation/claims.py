"""Several workers, one evaluation: work items taken by exclusive, leased claims. Each worker
takes a shard of work items from the database and runs the same worker entry point.

A worker walks the stages exactly as the single-process runner does (the same stage code,
the same item keys, the same seeds: CAN-9's determinism makes any worker's result the one
the runner would have computed) but, before running an item, it claims it in the store. The
stage's run context drives the loop: it asks a :class:`ClaimQueue` for the next
:class:`Claim` of its items, runs it when it is its own and commits it here; nothing in
this module calls back into the stage. A claim is:

- ``claimed``: the item is this worker's under a lease; the stage runs it and commits the
  result with :meth:`ItemClaims.commit` (``finish_claimed``), which *adds* its counts to the
  evaluation's progress (workers never overwrite each other's);
- ``done``: another worker finished it; its stored result is used (a later stage that needs
  it, e.g. nothing today, would read it the same way);
- ``leased``: another worker is running it; the item is set aside and the queue hands out
  the next free one, coming back to the set-aside items when nothing else is free. An
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
from dataclasses import dataclass
from typing import Any

import structlog
from fortis.services.evaluation.answers import pack, unpack
from fortis.services.evaluation.ports import RunStore

__all__ = ["DEFAULT_LEASE_S", "Claim", "ClaimQueue", "ItemClaims"]

log = structlog.get_logger("fortis.evaluation.claims")

#: Default lease of a claimed item (renewed every third of it while the worker lives).
DEFAULT_LEASE_S = 60.0


@dataclass(frozen=True, kw_only=True)
class Claim:
    """One answer of :meth:`ClaimQueue.next`: the item at ``index`` of the queue's keys is
    this worker's to run (``claimed``, at store attempt ``attempt``), was finished by
    another worker (``done``, with its stored ``result``), or is held by another worker
    (``leased``: ask again; the queue hands the item out once it is free or done)."""

    index: int
    key: str
    state: str
    attempt: int = 0
    result: dict[str, Any] | None = None


class ItemClaims:
    """One worker's claims on one evaluation's items (see the module docstring)."""

    def __init__(self, store: RunStore, evaluation_id: str, worker_id: str, *,
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

    # -- claiming and committing items ------------------------------------------------------
    def queue(self, keys: Sequence[str]) -> ClaimQueue:
        """The claims of ``keys`` (one stage's items, in order), handed out one at a time."""
        return ClaimQueue(self, keys)

    def claim(self, index: int, key: str) -> Claim:
        """Claim one item: run it (``claimed``), reuse it (``done``) or wait (``leased``)."""
        eid = self.evaluation_id
        state = self.store.claim_key(eid, key, self.worker_id, lease_s=self.lease_s)
        if state == "done":
            done, _, blob = self.store.item(eid, key)
            if not done or blob is None:            # finished between two reads: look again
                return Claim(index=index, key=key, state="leased")
            with self._lock:
                self.reused += 1
            return Claim(index=index, key=key, state="done", result=unpack(blob))
        if state == "leased":
            return Claim(index=index, key=key, state="leased")
        return Claim(index=index, key=key, state="claimed",
                     attempt=self.store.start_item(eid, key))

    def commit(self, key: str, result: dict[str, Any], *, images: int,
               queries: int) -> None:
        """Commit the result of an item this worker claimed and ran; its counts are added to
        the evaluation's progress."""
        # Not checked for a stop here: an item that ran to the end is committed, so a worker
        # told to stop (SIGTERM) stops at the next item boundary and none of the queries it
        # sent is sent again by the worker that would rerun it (IEEE-M6). Work cut
        # by the stop raises instead (a query attack's stream), and its rerun shares the
        # chunk's session (answers replayed from the ledger).
        first = self.store.finish_claimed(self.evaluation_id, key, self.worker_id,
                                          pack(result), images=images, queries=queries,
                                          message=key)
        with self._lock:
            self.ran += 1
        if not first:   # our lease ran out and another worker finished it too: same result
            log.warning("item_finished_twice", item=key, worker=self.worker_id)

    def waited_once(self) -> None:
        """An item set aside was still held by another worker: wait a poll before asking
        again."""
        with self._lock:
            self.waited += 1
        self._sleep(self.poll_s)


class ClaimQueue:
    """The claims of one list of items, handed out by :meth:`next` to the threads of a
    stage: free items first, in order; then, again and again, those another worker held,
    until each is this worker's or done. Thread-safe."""

    def __init__(self, claims: ItemClaims, keys: Sequence[str]) -> None:
        self._claims = claims
        self._keys = list(keys)
        self._todo = deque(range(len(self._keys)))
        self._aside: deque[int] = deque()
        self._lock = threading.Lock()
        self._stopped = False

    def next(self) -> Claim | None:
        """The next item's claim; None when every item was handed out or the queue was
        stopped. A ``leased`` claim's item is set aside and handed out again later."""
        with self._lock:
            if self._stopped:
                return None
            if self._todo:
                i, again = self._todo.popleft(), False
            elif self._aside:
                i, again = self._aside.popleft(), True
            else:
                return None
        claim = self._claims.claim(i, self._keys[i])
        if claim.state == "leased":
            with self._lock:
                self._aside.append(i)
            if again:
                self._claims.waited_once()
        return claim

    def stop(self) -> None:
        """Hand out nothing more (a thread of the stage failed: the others stop too)."""
        with self._lock:
            self._stopped = True
