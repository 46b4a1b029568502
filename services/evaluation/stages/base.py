"""What every stage of an evaluation shares: the run context, resumable work items and
progress. Domain code, no gRPC.

A work item (a chunk of images under one test setting) commits its result to the store when
it finishes; a rerun skips finished items (CAN-9). Every random draw is derived from the
plan's seed and the item's identity, so a redone item gives the same numbers. Progress moves
per item and, inside long items (query attacks), per image, so a watcher never sees a stalled
bar while work is being done.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import structlog
from fortis.infra.serving import tracing
from fortis.services.common import errors
from fortis.services.evaluation.answers import Answers, pack, unpack
from fortis.services.evaluation.keys import WorkItemKey
from fortis.services.evaluation.plan import Plan
from fortis.services.evaluation.ports import (
    PerturbationPort,
    ProxyPort,
    ReportPort,
    RunStore,
    ScoringPort,
    Setting,
    SettingFailure,
    TargetDescription,
    TestDefinition,
)

if TYPE_CHECKING:
    from fortis.services.evaluation.claims import ItemClaims
    from fortis.services.evaluation.sequential import SequentialRun

__all__ = ["Cancelled", "LabeledImage", "Progress", "RunContext", "Stage", "chunks",
           "failed_result", "guarded", "in_rounds", "is_failed", "safe_artifact_part",
           "setting_failure"]

log = structlog.get_logger("fortis.evaluation.stages")

#: (image id, uint8 HxWxC image, acceptable labels)
LabeledImage = tuple[str, np.ndarray, tuple[int, ...]]


class Cancelled(errors.Cancelled):
    """The evaluation was cancelled by a caller (CANCELLED, from the one error mapping)."""


#: Errors that end the whole evaluation (resumable: its finished items are kept) instead of
#: one setting: a stop asked for, the target or a service out of reach after the proxy's
#: retries, the tenant's quota or credentials (an outage every later setting would meet
#: too). Anything else a setting's work raises, a target's error on that setting's images
#: included, fails that setting alone (IEEE-P4: every test is listed with its outcome) and
#: the evaluation goes on with the others.
_EVALUATION_ERRORS: tuple[type[BaseException], ...] = (
    errors.Cancelled, errors.Unavailable, errors.DeadlineExceeded, errors.QuotaExceeded,
    errors.Unauthenticated, errors.PermissionDenied)

Work = Callable[[int], tuple[dict[str, Any], int]]

#: Work items a stage keeps in flight in one process. Two left the target idle while both
#: waited on commits (each chunk: a durable ledger commit before it is sent, its item's commit
#: after): in two A/B runs of the Fashion-MNIST CNN's corruption stage (bench/evaluation.py,
#: median of three interleaved rounds each, 2 shared cores) four gave 0.74x and 0.35x the bare
#: model where two gave 0.58x and 0.26x. Memory: four chunks of the plan's batch size are
#: held at once.
ITEMS_IN_FLIGHT = 4


def failed_result(exc: BaseException) -> dict[str, Any]:
    """A work item's result when its setting failed: the error as a caller may see it
    (``google.rpc`` code and message; an unexpected exception is "internal error")."""
    message = str(exc) if isinstance(exc, errors.FortisError) else "internal error"
    return {"failed": True, "code": int(errors.code_for(exc)), "message": message[:2000]}


def is_failed(result: Mapping[str, Any]) -> bool:
    return bool(result.get("failed"))


def guarded(name: str, work: Work) -> Work:
    """``work`` with a failure of its setting committed as the item's result (see
    ``_EVALUATION_ERRORS`` for what still ends the evaluation): a rerun does not retry it,
    the same seeds would fail the same way."""
    def run(attempt: int) -> tuple[dict[str, Any], int]:
        try:
            return work(attempt)
        except _EVALUATION_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - the setting fails, the evaluation goes on
            log.warning("setting_failed", item=name, error=str(exc)[:300],
                        exc_info=not isinstance(exc, errors.FortisError))
            return failed_result(exc), 0
    return run


def setting_failure(results: Sequence[Mapping[str, Any]],
                    sizes: Sequence[int]) -> SettingFailure | None:
    """The failure of a setting whose work items gave ``results`` (of ``sizes`` images each):
    its first failed item's error, and the images of the items that finished; None when
    every item finished."""
    bad = [r for r in results if is_failed(r)]
    if not bad:
        return None
    done = sum(n for r, n in zip(results, sizes, strict=True) if not is_failed(r))
    return SettingFailure(code=int(bad[0]["code"]), message=str(bad[0]["message"]),
                          images_done=done, images_planned=sum(sizes))


def chunks(n: int, size: int) -> list[tuple[int, int]]:
    """[start, end) ranges of consecutive chunks of at most ``size`` images."""
    return [(s, min(s + size, n)) for s in range(0, n, size)]


class Progress:
    """Counts finished work and writes it to the store, at most a few times a second for
    image-level updates (every finished item is written at once, with its result)."""

    def __init__(self, store: RunStore, evaluation_id: str, *,
                 min_interval_s: float = 0.5) -> None:
        self.store = store
        self.eid = evaluation_id
        self.items_done = 0
        self.images_done = 0
        self.queries = 0
        self._partial = 0
        self._last = 0.0
        self._min = min_interval_s
        self._lock = threading.Lock()

    def stage(self, stage: str, message: str = "") -> None:
        self.store.update_running(self.eid, stage=stage, message=message)

    def images(self, n: int, message: str = "") -> None:
        """``n`` more images of the current item are done (not yet committed)."""
        with self._lock:
            self._partial += n
            now = time.monotonic()
            if now - self._last < self._min:
                return
            self._last = now
            done = self.images_done + self._partial
        self.store.update_running(self.eid, images_done=done, message=message)

    def item_finished(self, images: int, queries: int) -> tuple[int, int, int]:
        with self._lock:
            self.items_done += 1
            self.images_done += images
            self.queries += queries
            self._partial = 0
            return self.items_done, self.images_done, self.queries


class WorkerProgress(Progress):
    """Progress of one of several workers on an evaluation: it counts its own
    items but writes nothing absolute to the store (each finished item adds its counts
    there, :meth:`~.store.EvaluationStorage.finish_claimed`); the stage shown is the
    orchestrator's."""

    def stage(self, stage: str, message: str = "") -> None:
        return None

    def images(self, n: int, message: str = "") -> None:
        return None


@dataclass(kw_only=True)
class RunContext:
    """Everything a stage needs, and the one place items are run and committed."""

    evaluation_id: str
    plan: Plan
    plan_text: str
    store: RunStore
    proxy: ProxyPort
    perturbation: PerturbationPort
    scoring: ScoringPort
    report: ReportPort
    images: Sequence[LabeledImage]
    target: TargetDescription
    progress: Progress
    cancelled: Callable[[], bool] = lambda: False
    chunk_ranges: list[tuple[int, int]] = field(default_factory=list)
    #: Work items of a stage in flight at once (see ``items``).
    parallel: int = ITEMS_IN_FLIGHT
    #: Worker mode: items are claimed in the store before they run, so several
    #: workers share the evaluation (``claims.py``). None: this process runs every item.
    claims: ItemClaims | None = None
    #: Detection / segmentation ground truth per image id (the dataset port's ``truths``):
    #: the references of the query attacks' IEEE-C4 / C5 criteria. Empty: classification.
    truths: Mapping[str, Any] = field(default_factory=dict)
    #: Sequential acceptance (``sequential.py``): which settings are still sent images.
    #: None: every setting runs on every image.
    sequential: SequentialRun | None = None
    _commit: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def ids(self) -> list[str]:
        return [i for i, _, _ in self.images]

    def check_cancelled(self) -> None:
        if self.cancelled():
            raise Cancelled("cancelled by a caller")

    def item(self, key: WorkItemKey, images: int,
             work: Callable[[int], tuple[dict[str, Any], int]]) -> dict[str, Any]:
        """Run ``work(attempt) -> (result, queries)`` unless the item is already done; commit
        its result. Returns the result (as stored)."""
        if self.claims is not None:
            return self._claimed([(key, images, work)], 1)[0]
        self.check_cancelled()
        name = key.format()
        done, _, blob = self.store.item(self.evaluation_id, name)
        if done and blob is not None:
            return unpack(blob)
        attempt = self.store.start_item(self.evaluation_id, name)
        result, queries = work(attempt)
        # Not checked for a stop here (as in worker mode, ``claims.py``): an item that ran to
        # its end is committed, so a cancel or a shutdown (SIGTERM) stops at the next item
        # boundary and a resumed run never sends its images again (IEEE-M6, CAN-9).
        # Work cut by the stop raises instead (a query attack's stream).
        blob = pack(result)
        with self._commit:      # counts and their commit in one order, whatever the thread
            items_done, images_done, total_queries = self.progress.item_finished(images, queries)
            self.store.finish_item(self.evaluation_id, name, blob, items_done=items_done,
                                   images_done=images_done, queries=total_queries, message=name)
        return result

    def items(self, jobs: Sequence[tuple[WorkItemKey, int, Callable[[int], tuple[dict[str, Any], int]]]],
              parallel: int | None = None) -> list[dict[str, Any]]:
        """Run independent work items, ``parallel`` (default: the context's) at a time,
        results in ``jobs`` order.

        Items of the measuring stages only depend on their own images, so several in flight
        keep the cores busy: one chunk is perturbed while another is with the target and
        others wait for a durable commit (the proxy's write-ahead ledger rows, the item's own
        commit). The CPU-heavy pieces still take turns on the server's fair share of the
        cores (``WorkShare``), so more items in flight do not oversubscribe them. The first
        failure stops the rest (items already committed stay committed; a rerun resumes).
        In worker mode the items are claimed first: another worker's are waited for."""
        parallel = self.parallel if parallel is None else parallel
        if self.claims is not None:
            return self._claimed(jobs, parallel)
        if parallel <= 1 or len(jobs) <= 1:
            return [self.item(key, n, work) for key, n, work in jobs]
        with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="item") as pool:
            item = tracing.in_context(self.item)    # each item's calls in the run's trace
            futures = [pool.submit(item, key, n, work) for key, n, work in jobs]
            try:
                return [f.result() for f in futures]
            except BaseException:
                for f in futures:
                    f.cancel()
                raise

    def _claimed(self, jobs: Sequence[tuple[WorkItemKey, int, Work]],
                 parallel: int) -> list[dict[str, Any]]:
        """Worker mode: ``jobs``' results in order, each run here when this worker claims
        it, read from the store when another worker finished it, asked for again while
        another worker holds it (``claims.py``). ``parallel`` threads take claims; the first
        failure (a cancel included) stops the rest and is raised."""
        assert self.claims is not None
        claims = self.claims
        queue = claims.queue([key.format() for key, _, _ in jobs])
        results: list[dict[str, Any] | None] = [None] * len(jobs)
        failed: list[BaseException] = []

        def take() -> None:
            try:
                while True:
                    self.check_cancelled()
                    claim = queue.next()
                    if claim is None:
                        return
                    if claim.state == "done":
                        results[claim.index] = claim.result
                    elif claim.state == "claimed":
                        _, images, work = jobs[claim.index]
                        result, queries = work(claim.attempt)
                        claims.commit(claim.key, result, images=images, queries=queries)
                        self.progress.item_finished(images, queries)
                        results[claim.index] = result
            except BaseException as exc:
                queue.stop()
                failed.append(exc)

        n = max(1, min(parallel, len(jobs)))
        if n == 1:
            take()
        else:
            with ThreadPoolExecutor(max_workers=n, thread_name_prefix="claim") as pool:
                traced_take = tracing.in_context(take)
                for f in [pool.submit(traced_take) for _ in range(n)]:
                    f.result()
        if failed:
            raise failed[0]
        assert all(r is not None for r in results)
        return [r for r in results if r is not None]

    def answers(self, session: str, origin: str,
                part: Sequence[tuple[str, np.ndarray]]) -> Answers:
        return self.proxy.predict(session_id=session, origin=origin,
                                  task=self.plan.target.task, images=part)

    def save_adversarials(self, name: str, chunk: int, ids: Sequence[str],
                          adversarial: Sequence[np.ndarray],
                          adversarial_float: Sequence[np.ndarray]) -> str:
        """Keep an attack chunk's adversarials (uint8 as sent, and float; CAN-9) as the
        artifact ``adversarial/<attack>-<chunk>.npz`` of the evaluation (arrays
        ``image_ids``, ``adversarial_uint8``, ``adversarial_float``; images of different sizes:
        ``adversarial_uint8_<k>`` / ``adversarial_float_<k>`` per image k); returns its name.

        Written to the evaluation store (the tenant's view), not to this process's
        disk, so the artifacts of every worker (pods with no shared volume) land in the one
        shared store; a retried item saving the same chunk again stores it once. The attack
        name is reduced to a safe charset and the store checks the whole name (no
        evaluation id or attack name makes an export write outside its folder)."""
        safe = safe_artifact_part(name, default="attack")
        key = f"adversarial/{safe}-{chunk:05d}.npz"
        buf = io.BytesIO()
        u8, fl = list(adversarial), list(adversarial_float)
        if len({np.shape(a) for a in u8}) <= 1:
            np.savez_compressed(buf, image_ids=np.array(list(ids)),
                                adversarial_uint8=np.stack(u8), adversarial_float=np.stack(fl))
        else:       # images of different sizes (detection photos): one array per image
            arrays: dict[str, Any] = {f"adversarial_uint8_{k:05d}": a for k, a in enumerate(u8)}
            arrays.update({f"adversarial_float_{k:05d}": a for k, a in enumerate(fl)})
            np.savez_compressed(buf, image_ids=np.array(list(ids)), **arrays)
        self.store.put_artifact(self.evaluation_id, key, buf.getvalue())
        return key

    def load_adversarials(self, name: str, chunk: int,
                          ids: Sequence[str]) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
        """The adversarials :meth:`save_adversarials` kept for this chunk (uint8, float), when
        they are there and are of exactly these images, in order; else None. A transfer
        attack crafts once per (attack, surrogate, image) and a resumed evaluation sends what
        was crafted instead of crafting again (CAN-9)."""
        safe = safe_artifact_part(name, default="attack")
        data = self.store.artifact(self.evaluation_id, f"adversarial/{safe}-{chunk:05d}.npz")
        if data is None:
            return None
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                if [str(i) for i in z["image_ids"]] != [str(i) for i in ids]:
                    return None
                if "adversarial_uint8" in z.files:
                    return list(z["adversarial_uint8"]), list(z["adversarial_float"])
                n = len(ids)
                return ([z[f"adversarial_uint8_{k:05d}"] for k in range(n)],
                        [z[f"adversarial_float_{k:05d}"] for k in range(n)])
        except (OSError, ValueError, KeyError):
            return None       # unreadable: craft again (never send a broken image)


def safe_artifact_part(name: str, *, default: str) -> str:
    """``name`` as one part of an artifact name: ASCII letters, digits, '-', '_', '.' kept,
    anything else '_', at most 100 characters, no leading '.'."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_"
                   for c in name)[:100].lstrip(".") or default


class Stage(Protocol):
    """One stage of the run: its work items, its run, and what it gives scoring and the
    report."""

    progress_stage: str

    def keys(self) -> list[WorkItemKey]:
        """Every work item of the stage, in execution order."""
        ...

    def images_total(self) -> int:
        """Image-level work of the stage (images x settings)."""
        ...

    def run(self, ctx: RunContext) -> list[Setting]:
        """Run (or resume) the stage; the settings it measured, for scoring."""
        ...

    def tests(self) -> list[TestDefinition]:
        """Its tests, as the report lists them."""
        ...


Job = tuple[WorkItemKey, int, Work]


def in_rounds(ctx: RunContext, plans: Sequence[tuple[tuple[Any, ...], Sequence[Job]]],
              prefix: Callable[[tuple[Any, ...], list[dict[str, Any]]], Any], *,
              per_round: int = 1, parallel: int | None = None) -> dict[tuple[Any, ...],
                                                                      list[dict[str, Any]]]:
    """Sequential acceptance (``sequential.py``): run each setting's chunk jobs in rounds of
    ``per_round`` chunks, every setting still open side by side, and after each round let
    ``ctx.sequential`` judge the open criteria on every setting's prefix (``prefix(key,
    results)`` -> the Setting so far); a setting stops once the criteria reading it are
    decided, or at its first failed chunk. Returns each setting's results, in chunk order."""
    seq = ctx.sequential
    assert seq is not None
    done: dict[tuple[Any, ...], list[dict[str, Any]]] = {k: [] for k, _ in plans}
    r = 0
    while True:
        batch: list[Job] = []
        owners: list[tuple[Any, ...]] = []
        for k, jobs in plans:
            if any(is_failed(x) for x in done[k]) or not seq.is_open(k):
                continue
            part = list(jobs[r * per_round:(r + 1) * per_round])
            batch += part
            owners += [k] * len(part)
        if not batch:
            return done
        for k, res in zip(owners, ctx.items(batch, parallel), strict=True):
            done[k].append(res)
        seq.update([prefix(k, done[k]) for k, _ in plans
                    if seq.status(k) == "open" and done[k]
                    and not any(is_failed(x) for x in done[k])])
        r += 1
