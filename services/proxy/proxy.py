"""The target proxy's domain logic: sessions, budgets, rate limit, retries, ledger.

Every query to a target passes here. Queries are counted per image; a session's budget
(total and per image id, the Q_m of IEEE-M6) is checked before anything is sent, and a call
that would exceed it is refused whole (``BudgetExhausted``) with nothing sent.

The ledger is what the target saw: before images are handed to the
back end their rows are *reserved* (status ``IN_FLIGHT``) and committed; after, they are
*completed* with the outcome. When the target is unavailable the call is retried with
exponential backoff; each retry is sent again, so it is its own set of rows (attempt
number), passes the rate limiter again, and counts against the session's hard budgets
(``query_budget`` and per-image Q_m count every attempt the target received; a retry the
budget cannot pay is not sent). Answered queries (``queries_used``, the ledger's OK rows) are
what IEEE-M6 counts. A back end answering the wrong number of predictions, or failing in an
unexpected way, completes its rows as failed (bounded message), never missing: a target's own
error or malformed answer is ``TargetFailed`` (FAILED_PRECONDITION naming the target, not
retried), a bug in an in-process back end INTERNAL.

After a crash, resumed attempts never push an image past Q_m: the budgets are
rebuilt from the ledger's rows, interrupted ones included, so a query attack's session keeps
its per-image Q_m across every attempt of a chunk. In such a session (per-image budget set)
answers are recorded, and a resumed attempt that repeats the previous process's queries (a
seeded attack redoes the same queries in the same order) gets them from the ledger without
the target being asked again: its results are those of an uninterrupted run, except where an
interrupted row's unknown answer has to be sent again, and that row stays charged.

Sessions live in their tenant's namespace: keys are (tenant, id), and
another tenant's id behaves exactly like a free one. Session ids are restricted to a safe
charset (``check_session_id``). Domain code: the target is reached through the
``TargetBackend`` protocol, implemented over gRPC in ``backends.py``. The targets and what
a tenant is told of their failures are in ``targets.py``, session ids and budgets in
``sessions.py``; this module is the send path.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence

import structlog
from fortis.common.v1 import common_pb2
from fortis.infra.serving.workshare import WorkShare
from fortis.services.common import errors
from fortis.services.common.codec import image_sha256, summarize, tensor_to_array
from fortis.services.common.errors import code_for
from fortis.services.common.limits import byte_batches
from fortis.services.common.stopping import StopCheck, never
from fortis.services.proxy.ledger import (
    IN_FLIGHT,
    IN_FLIGHT_NOTE,
    NOT_SENT_PREFIX,
    LedgerStorage,
    Outcome,
    QueryRow,
    SessionRecord,
    wall_clock_of,
)
from fortis.services.proxy.metrics import ProxyMetrics
from fortis.services.proxy.quotas import DailyQueryQuotas, Hold
from fortis.services.proxy.ratelimit import (
    CompositeLimiter,
    Limiter,
    TenantLimits,
)
from fortis.services.proxy.sessions import (
    ERROR_MAX,
    REPLY_MAX_BYTES,
    SESSION_ID_MAX,
    PredictResult,
    SessionBudget,
    _bounded,
    _log_refused,
    _replies,
    check_session_id,
)
from fortis.services.proxy.shared import SharedBudgets
from fortis.services.proxy.targets import (
    REASON_MAX,
    RetryPolicy,
    TargetBackend,
    TargetEntry,
    TargetFailed,
    _info_of,
    scrub_reason,
    target_failure,
)
from fortis.target.v1 import target_pb2
from google.rpc import code_pb2

log = structlog.get_logger("fortis.proxy")


#: The proxy's public names, the targets' and sessions' parts defined in ``targets.py`` and
#: ``sessions.py`` and importable from here as before.
__all__ = [
    "ERROR_MAX", "REASON_MAX", "REPLY_MAX_BYTES", "SESSION_ID_MAX", "PredictResult",
    "RetryPolicy", "TargetBackend", "TargetEntry", "TargetFailed", "TargetProxy",
    "check_session_id", "scrub_reason", "target_failure",
]


class TargetProxy:
    """Sessions, budgets, rate limits, retries and the ledger, for a set of targets."""

    def __init__(self, ledger: LedgerStorage, targets: Sequence[TargetEntry], *,
                 retry: RetryPolicy = RetryPolicy(),
                 sleep: Callable[[float], None] = time.sleep,
                 metrics: ProxyMetrics | None = None,
                 tenant_limits: TenantLimits | None = None,
                 daily_quotas: DailyQueryQuotas | None = None,
                 shared_budgets: SharedBudgets | None = None,
                 work: WorkShare | None = None) -> None:
        self.ledger = ledger
        #: The process's tenant-fair share of CPU-heavy work: a built-in target's inference
        #: runs in this process, so each call to one takes a slot of the calling tenant's.
        self.work = work
        #: Session budgets shared by proxy replicas; None: this process only.
        self.shared_budgets = shared_budgets
        self.metrics = metrics
        #: Per-tenant images/s across every target, so one tenant cannot take another's
        #: share of a target; tenants without a limit add nothing.
        self.tenant_limits = tenant_limits or TenantLimits()
        self.targets = {t.name: t for t in targets}
        self.retry = retry
        self._sleep = sleep
        self._budgets: dict[tuple[str, str], SessionBudget] = {}
        self._lock = threading.Lock()
        # The ledger's one writer starts: rows a dead process left in flight become
        # INTERRUPTED (still charged to the budgets: the target may have received them), and
        # answers recorded so far may be replayed to resumed attempts (CAN-9).
        self.interrupted_at_start = ledger.mark_interrupted()
        self._replay_up_to = ledger.last_entry_id()
        #: Queries per UTC day per tenant, counted from the ledger's rows of
        #: today at start-up (a restart does not reset it), then in memory (``quotas.py``).
        self.daily_quotas = daily_quotas or DailyQueryQuotas()
        self.daily_quotas.load_from(ledger)
        if self.interrupted_at_start:
            log.warning("ledger_rows_interrupted", rows=self.interrupted_at_start)

    # -- targets ----------------------------------------------------------------------------
    def target(self, name: str, tenant: str | None = None) -> TargetEntry:
        """The target ``name`` as ``tenant`` sees it: a target outside the tenant's allow-list
        is NOT_FOUND exactly like an unknown name (targets are declared with the tenants
        allowed to use them). ``tenant=None``: the operator's view (no allow-list)."""
        if not name:
            raise errors.InvalidArgument("target", "target name is required")
        entry = self.targets.get(name)
        if entry is None or (tenant is not None and not entry.allows(tenant)):
            raise errors.NotFound("target", name[:200])
        return entry

    def visible_targets(self, tenant: str) -> list[TargetEntry]:
        """The targets ``tenant`` may use, by name (what ListTargets shows it)."""
        return sorted((t for t in self.targets.values() if t.allows(tenant)), key=lambda t: t.name)

    def builtin_targets(self) -> dict[str, list[str]]:
        """Built-in model -> the names of every target serving it (all tenants' targets: a
        twin surrogate is white-box access to the model whoever may query it)."""
        out: dict[str, list[str]] = {}
        for t in sorted(self.targets.values(), key=lambda t: t.name):
            if t.builtin_model:
                out.setdefault(t.builtin_model, []).append(t.name)
        return out

    def task_type(self, name: str, tenant: str | None = None) -> int:
        """The target's task as it describes itself, asked once without retries; 0 (unknown)
        when it cannot answer now: a target that is down then fails the query itself, with
        its attempts in the ledger, rather than failing before anything is recorded."""
        entry = self.target(name, tenant)
        if entry.task_type is None:
            try:
                entry.task_type = int(entry.backend.info().task_type)
            except errors.FortisError:
                return 0
        return entry.task_type

    def target_info(self, name: str, tenant: str | None = None) -> target_pb2.TargetInfo:
        """The target's description, with the largest batch the proxy sends it in one call
        (its declared ``max_batch_size`` capped by the operator's ``max_batch``): a caller
        that keeps its calls within it gets each target failure on its own images only."""
        entry = self.target(name, tenant)
        info = self._with_retries(lambda: _info_of(entry))[0]
        if entry.declared_batch is None:
            entry.declared_batch = max(0, int(info.input.max_batch_size))
        out = target_pb2.TargetInfo()
        out.CopyFrom(info)
        out.input.max_batch_size = entry.batch_limit()
        return out

    # -- sessions ---------------------------------------------------------------------------
    def create_session(self, *, tenant: str, target: str, session_id: str = "",
                       query_budget: int = 0, per_image_budget: int = 0,
                       description: str = "") -> SessionRecord:
        """Create (or, same settings, return) the tenant's session ``session_id``. Another
        tenant's session of that id is invisible: it neither conflicts nor is returned."""
        self.target(target, tenant)
        if query_budget < 0:
            raise errors.InvalidArgument("query_budget", "must be >= 0 (0 = unlimited)")
        if per_image_budget < 0:
            raise errors.InvalidArgument("per_image_budget", "must be >= 0 (0 = unlimited)")
        if session_id:
            check_session_id(session_id)
        if len(description) > 1000:
            raise errors.InvalidArgument("description", "at most 1000 characters")
        sid = session_id or f"ses-{uuid.uuid4().hex[:16]}"
        with self._lock:
            stored = self.ledger.get_session(sid, tenant)
            if stored is None:
                # Insert-or-get: a replica creating the same session at the same moment
                # (replicas on one PostgreSQL) yields one row, and each caller is
                # compared with that row, as if it had come second.
                stored = self.ledger.insert_session(SessionRecord(
                    session_id=sid, tenant=tenant, target=target, query_budget=query_budget,
                    per_image_budget=per_image_budget, description=description,
                    created_at=time.time()))
            same = (stored.target == target and stored.query_budget == query_budget
                    and stored.per_image_budget == per_image_budget)
            if not same:
                raise errors.AlreadyExists(f"session '{sid}' exists with other settings")
            return stored

    def session(self, tenant: str, session_id: str) -> SessionRecord:
        check_session_id(session_id)
        rec = self.ledger.get_session(session_id, tenant)
        if rec is None:
            raise errors.NotFound("session", session_id)
        return rec

    def session_record(self, tenant: str, session_id: str) -> SessionRecord:
        """The session as :meth:`session` gives it, from the budgets this process keeps
        (a session's settings never change once created): no ledger read on a query's path."""
        return self._budget(tenant, session_id).record

    def _budget(self, tenant: str, session_id: str) -> SessionBudget:
        with self._lock:
            b = self._budgets.get((tenant, session_id))
            if b is None:
                rec = self.session(tenant, session_id)
                per_image = self.ledger.attempt_counts(session_id, tenant)
                answered = sum(self.ledger.ok_counts(session_id, tenant).values())
                replay = {} if not rec.per_image_budget else {
                    k: deque(v) for k, v in self.ledger.replayable(
                        session_id, tenant, up_to=self._replay_up_to).items()}
                b = SessionBudget(record=rec, used_total=sum(per_image.values()),
                            used_per_image=per_image, answered=answered, replay=replay,
                            shared=self.shared_budgets,
                            initial=lambda: self.ledger.attempt_counts(session_id, tenant))
                self._budgets[(tenant, session_id)] = b
            return b

    def queries_used(self, tenant: str, session_id: str) -> int:
        """Queries the target answered in this session (IEEE-M6 counts these)."""
        return self._budget(tenant, session_id).answered

    def queries_attempted(self, tenant: str, session_id: str) -> int:
        """Queries the target received in this session, retries included (the hard budgets
        count these)."""
        return self._budget(tenant, session_id).used_total

    # -- predict ----------------------------------------------------------------------------
    @staticmethod
    def _check_images(images: Sequence[common_pb2.Image]) -> None:
        if not images:
            raise errors.InvalidArgument("images", "at least one image is required")
        for i, img in enumerate(images):
            if not img.image_id:
                raise errors.InvalidArgument(f"images[{i}].image_id", "image_id is required")
            kind = img.WhichOneof("content")
            if kind is None:
                raise errors.InvalidArgument(f"images[{i}]", "image has no content")
            if kind == "tensor":
                # A tensor's shape, dtype and byte count are the contract's, whatever the
                # target: one that contradicts itself is refused before it is charged,
                # recorded or sent.
                tensor_to_array(img.tensor, f"images[{i}].tensor")

    def predict(self, *, tenant: str, session_id: str, origin: str,
                images: Sequence[common_pb2.Image],
                should_stop: StopCheck = never) -> PredictResult:
        """Answer ``images``: replayed from the ledger where a resumed attempt repeats a query
        answered before this process started (same session, image id and bytes, in the same
        order; the target is not asked again, no row is added), sent to the target otherwise.

        ``should_stop`` (the caller's deadline or cancellation) is checked while a chunk
        waits for the rate limit: a caller gone stops waiting, and what was not sent is
        recorded "not sent" and given back to the budgets."""
        self._check_images(images)
        budget = self._budget(tenant, session_id)
        self.target(budget.record.target, tenant)
        replies = self._replays(budget, images) if budget.replay else {}
        if not replies:
            return self._predict_sent(tenant=tenant, session_id=session_id, origin=origin,
                                      images=images, should_stop=should_stop)
        rest = [img for i, img in enumerate(images) if i not in replies]
        if rest:
            res = self._predict_sent(tenant=tenant, session_id=session_id, origin=origin,
                                     images=rest, should_stop=should_stop)
            sent, left = iter(res.predictions), res.queries_left
        else:
            rec = budget.record
            sent = iter(())
            left = max(0, rec.query_budget - budget.used_total) if rec.query_budget else -1
        return PredictResult(predictions=[replies[i] if i in replies else next(sent)
                                          for i in range(len(images))], queries_left=left)

    def _replays(self, budget: SessionBudget, images: Sequence[common_pb2.Image]
                 ) -> dict[int, common_pb2.Prediction]:
        """Recorded answers for the images that repeat, in order, what the session sent
        before this process started; an image that departs from its record is sent from then
        on (its record dropped)."""
        out: dict[int, common_pb2.Prediction] = {}
        with budget.lock:
            for i, img in enumerate(images):
                queue = budget.replay.get(img.image_id)
                if not queue:
                    continue
                sha, entry_id = queue[0]
                blob = self.ledger.reply(entry_id) if sha == image_sha256(img) else None
                if blob is None:
                    del budget.replay[img.image_id]
                    continue
                queue.popleft()
                pred = common_pb2.Prediction.FromString(zlib.decompress(blob))
                pred.image_id = img.image_id
                out[i] = pred
        return out

    def _predict_sent(self, *, tenant: str, session_id: str, origin: str,
                      images: Sequence[common_pb2.Image],
                      should_stop: StopCheck = never) -> PredictResult:
        """Send ``images`` to the target within the session's budgets (write-ahead rows)."""
        self._check_images(images)
        budget = self._budget(tenant, session_id)
        rec = budget.record
        entry = self.target(rec.target, tenant)
        n = len(images)
        # Reserve the queries atomically, or refuse the whole call.
        with budget.lock:
            try:        # check and charge (across replicas with a shared store)
                violations = budget.reserve(images)
            except errors.Unavailable:
                self._store_refused(tenant, session_id, rec.target, n)
                raise
            if violations:
                self.ledger.add_refused(session_id, tenant=tenant)
                if self.metrics is not None:
                    self.metrics.refused_call(rec.target, tenant)
                _log_refused("budget", tenant=tenant, session_id=session_id,
                             target=rec.target, images=n)
                raise errors.BudgetExhausted(violations)
            try:    # the tenant's queries per day: the whole call fits, or nothing is sent
                hold = self.daily_quotas.admit(tenant, n)
            except errors.Unavailable:
                budget.charge(images, -1)
                self._store_refused(tenant, session_id, rec.target, n)
                raise
            except errors.QuotaExceeded:
                budget.charge(images, -1)
                self.ledger.add_refused(session_id, tenant=tenant)
                if self.metrics is not None:
                    self.metrics.quota_refused(rec.target, tenant, "queries_per_day")
                _log_refused("quota", tenant=tenant, session_id=session_id,
                             target=rec.target, images=n, quota="queries_per_day")
                raise
        predictions: list[common_pb2.Prediction] = []
        tenant_limiter = self.tenant_limits.limiter_for(rec.tenant)
        limiter: Limiter = entry.limiter if tenant_limiter.unlimited else \
            CompositeLimiter(entry.limiter, tenant_limiter)
        chunk = max(1, min(entry.batch_limit(), limiter.max_chunk()))
        sent = 0

        def sent_up_to(k: int) -> Callable[[], None]:
            def mark() -> None:
                nonlocal sent
                sent = k
            return mark

        try:
            for start, stop in byte_batches([img.ByteSize() for img in images],
                                            max_images=chunk):
                predictions += self._send(entry, budget, origin, images[start:stop],
                                          sent_up_to(stop), limiter, hold, should_stop)
        finally:
            hold.release()      # what was held for images never sent
            if sent < n:
                # Release what was reserved but never sent to the target.
                with budget.lock:
                    budget.charge(images[sent:], -1)
        left = -1
        if rec.query_budget:
            left = max(0, rec.query_budget - budget.used_total)
        return PredictResult(predictions=predictions, queries_left=left)

    @contextlib.contextmanager
    def _work_slot(self, entry: TargetEntry, tenant: str, should_stop: StopCheck
                   ) -> Iterator[WorkShare | None]:
        """A built-in target computes in this process: its calls take the tenant's share of
        the CPU, from before the rate limiter's grant (so the grant's time stays the send
        time) to its answer; the waits for the grant give the slot back
        (``WorkShare.yielded``), so a call held by a rate limit holds no core and costs its
        tenant no share. Yields the share, or None where a call takes none (a remote
        target's calls wait on the network)."""
        if self.work is None or not self.work.enabled or not entry.builtin_model:
            yield None
            return
        with self.work.slot(tenant, should_stop):
            yield self.work

    def _send(self, entry: TargetEntry, budget: SessionBudget, origin: str,
              images: Sequence[common_pb2.Image], on_sent: Callable[[], None],
              limiter: Limiter, hold: Hold,
              should_stop: StopCheck = never) -> list[common_pb2.Prediction]:
        """Send one chunk (its first attempt already charged), retrying on UNAVAILABLE while
        the policy and the session's budget allow; every attempt is write-ahead rows."""
        rec = budget.record
        n = len(images)
        call_id = uuid.uuid4().hex[:16]
        hashes = [image_sha256(img) for img in images]
        delay = self.retry.initial_backoff_s
        attempt = 0
        while True:
            attempt += 1
            # Reserve first (a durable commit), then take the rate limiter's grant and send
            # at once: no disk wait between the grant and the target (the limit holds at the
            # target); the row's send time is the grant's, written with the outcome.
            entry_ids = self._reserve_rows(rec, origin, images, hashes, call_id, attempt)
            with self._work_slot(entry, rec.tenant, should_stop) as work:
                try:
                    # the target's and the tenant's limits, in fair turns between tenants
                    granted = limiter.acquire(n, rec.tenant, should_stop,
                                              idle=None if work is None else work.yielded)
                except BaseException as exc:
                    self._not_sent(rec, entry_ids, exc, attempt, n)
                    raise
                if attempt == 1:
                    on_sent()
                    hold.take(n)        # sent: these rows count for the tenant's day
                t0 = time.perf_counter()
                attempt_once = functools.partial(self._attempt, entry, images)
                preds, failure = attempt_once() if work is None else \
                    work.run(rec.tenant, attempt_once)
                latency = (time.perf_counter() - t0) * 1000.0
            self._record(rec, entry_ids, preds, failure, latency, granted, attempt)
            if failure is None:
                with budget.lock:
                    budget.answered += n
                for img, p in zip(images, preds, strict=True):
                    p.image_id = img.image_id
                return preds
            if not isinstance(failure, errors.Unavailable) or attempt >= self.retry.max_attempts:
                raise failure
            self._charge_retry(budget, images, failure)
            # A target that says when to come back (HTTP 429/503 Retry-After) is honoured,
            # up to the policy's cap.
            hint = getattr(failure, "retry_after_s", None)
            wait = delay if not hint else min(max(delay, float(hint)), self.retry.max_retry_after_s)
            self._sleep(wait)
            delay = min(delay * self.retry.multiplier, self.retry.max_backoff_s)

    def _reserve_rows(self, rec: SessionRecord, origin: str,
                      images: Sequence[common_pb2.Image], hashes: Sequence[str], call_id: str,
                      attempt: int) -> list[int]:
        """One attempt's write-ahead rows (``IN_FLIGHT``), committed before anything is sent."""
        rows = [QueryRow(tenant=rec.tenant, session_id=rec.session_id, target=rec.target,
                         origin=origin, image_id=img.image_id, input_sha256=h,
                         output_summary="", latency_ms=0.0, status=IN_FLIGHT,
                         error=IN_FLIGHT_NOTE, sent_at=time.time(),
                         call_id=call_id, attempts=attempt)
                for img, h in zip(images, hashes, strict=True)]
        return self.ledger.reserve(rows)

    def _record(self, rec: SessionRecord, entry_ids: Sequence[int],
                preds: Sequence[common_pb2.Prediction], failure: errors.FortisError | None,
                latency: float, granted: float, attempt: int) -> None:
        """Complete an attempt's rows with its outcome, and count it in the metrics."""
        n = len(entry_ids)
        status = "OK" if failure is None else code_pb2.Code.Name(code_for(failure))
        error = "" if failure is None else _bounded(failure)
        self.ledger.complete([
            (eid, Outcome(status=status, error=error, latency_ms=latency,
                          sent_at=wall_clock_of(granted),
                          output_summary=summarize(preds[i]) if failure is None else ""))
            for i, eid in enumerate(entry_ids)],
            # a query attack's answers, for a resumed attempt's replay (CAN-9, IEEE-M6)
            replies=_replies(entry_ids, preds) if failure is None and rec.per_image_budget
            else ())
        if self.metrics is not None:
            self.metrics.call(rec.target, status, n, latency / 1000.0,
                              2 if attempt > 1 else 1, rec.tenant)

    def _charge_retry(self, budget: SessionBudget, images: Sequence[common_pb2.Image],
                      failure: errors.FortisError) -> None:
        """Charge a retry to the session's hard budgets and the tenant's day; ``failure`` is
        raised, nothing charged, when it does not fit (a retry is sent again: it must fit,
        or it is not sent)."""
        rec, n = budget.record, len(images)
        with budget.lock:
            if budget.reserve(images):
                raise failure
            try:
                fits = self.daily_quotas.try_charge(rec.tenant, n)
            except errors.Unavailable:
                budget.charge(images, -1)
                raise
            if not fits:
                budget.charge(images, -1)
                raise failure

    def _not_sent(self, rec: SessionRecord, entry_ids: Sequence[int], exc: BaseException,
                  attempt: int, n: int) -> None:
        """The grant never came (a stop, the limiter's store unanswering): the reserved rows
        say why nothing was sent, and a retry's images leave the tenant's day."""
        if isinstance(exc, errors.FortisError):
            _log_refused("rate", tenant=rec.tenant, session_id=rec.session_id,
                         target=rec.target, images=n, error=str(exc)[:200])
        self.ledger.complete([(eid, Outcome(status=code_pb2.Code.Name(code_for(exc)),
                                            error=NOT_SENT_PREFIX + _bounded(exc)))
                              for eid in entry_ids])
        if attempt > 1:     # a "not sent" row is not in the tenant's day
            self.daily_quotas.refund(rec.tenant, n)

    def _store_refused(self, tenant: str, session_id: str, target: str, n: int) -> None:
        """Refused: the shared store cannot answer; nothing was sent."""
        self.ledger.add_refused(session_id, tenant=tenant)
        if self.metrics is not None:
            self.metrics.refused_call(target, tenant)
        _log_refused("store", tenant=tenant, session_id=session_id, target=target, images=n)

    @staticmethod
    def _attempt(entry: TargetEntry, images: Sequence[common_pb2.Image]
                 ) -> tuple[list[common_pb2.Prediction], errors.FortisError | None]:
        """One call to the back end: its predictions, or the failure to record. Anything
        the back end raises, or a wrong number of predictions, is a failure (INTERNAL for
        the unexpected), so the reserved rows are always completed."""
        try:
            preds = list(entry.backend.predict(images))
        except errors.FortisError as exc:
            return [], target_failure(entry.name, exc)
        except Exception as exc:  # noqa: BLE001 - recorded, then INTERNAL to the caller
            cid = uuid.uuid4().hex[:16]
            log.error("target_error", target=entry.name, correlation_id=cid, code="INTERNAL",
                      error_class=type(exc).__name__, detail=str(exc)[:4000], exc_info=True)
            return [], errors.Internal(f"target '{entry.name}' back end failed "
                                       f"(correlation id {cid})")
        if len(preds) != len(images):
            return [], TargetFailed(
                f"target '{entry.name}' answered {len(preds)} predictions for {len(images)} "
                "images (a malformed answer; not retried)")
        return preds, None

    def _with_retries(self, fn, entry: TargetEntry | None = None):  # type: ignore[no-untyped-def]
        """``fn()`` retried on UNAVAILABLE (target descriptions; queries retry in ``_send``)."""
        delay = self.retry.initial_backoff_s
        for attempt in range(1, self.retry.max_attempts + 1):
            try:
                result = fn()
                return result, attempt
            except errors.Unavailable as exc:
                if attempt == self.retry.max_attempts:
                    exc.attempts = attempt  # type: ignore[attr-defined]
                    raise
                hint = getattr(exc, "retry_after_s", None)
                wait = delay if not hint else min(max(delay, float(hint)), self.retry.max_retry_after_s)
                self._sleep(wait)
                delay = min(delay * self.retry.multiplier, self.retry.max_backoff_s)
        raise AssertionError("unreachable")
