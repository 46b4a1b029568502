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
``TargetBackend`` protocol, implemented over gRPC in ``backends.py``.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from fortis.common.v1 import common_pb2
from fortis.services.common import errors
from fortis.services.common.codec import image_sha256, summarize
from fortis.services.common.errors import code_for
from fortis.services.common.limits import byte_batches
from fortis.services.common.stopping import StopCheck, never
from fortis.services.common.workshare import WorkShare
from fortis.services.target_proxy.ledger import (
    IN_FLIGHT,
    IN_FLIGHT_NOTE,
    NOT_SENT_PREFIX,
    LedgerStorage,
    Outcome,
    QueryRow,
    SessionRecord,
    wall_clock_of,
)
from fortis.services.target_proxy.metrics import ProxyMetrics
from fortis.services.target_proxy.quotas import DailyQueryQuotas, Hold
from fortis.services.target_proxy.ratelimit import (
    CompositeLimiter,
    Limiter,
    RateLimiter,
    TenantLimits,
)
from fortis.services.target_proxy.shared import SharedBudgets
from fortis.target.v1 import target_pb2
from google.rpc import code_pb2

log = structlog.get_logger("fortis.proxy")

#: Session ids: letters, digits, '-', '_', '.', '/'; not starting with '.'; at most 200;
#: no empty, '.' or '..' segment (evaluation sessions are "<evaluation id>/<stage>/...").
SESSION_ID_MAX = 200
_SESSION_ID = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]*(/[A-Za-z0-9_.\-]+)*")
#: Longest error text kept in a ledger row.
ERROR_MAX = 500
#: Largest recorded answer (compressed) kept for replay; a larger one (e.g. a big mask) is
#: not kept, and a resumed attempt sends that query again (charged, within Q_m).
REPLY_MAX_BYTES = 64 * 1024


def check_session_id(session_id: str) -> None:
    """InvalidArgument (field ``session_id``, never echoing the id) unless ``session_id`` is
    a safe id."""
    if not session_id:
        raise errors.InvalidArgument("session_id", "session_id is required")
    if (len(session_id) > SESSION_ID_MAX or not _SESSION_ID.fullmatch(session_id)
            or any(seg in (".", "..") for seg in session_id.split("/"))):
        raise errors.InvalidArgument(
            "session_id", f"use at most {SESSION_ID_MAX} letters, digits, '-', '_', '.' or '/',"
            " not starting with '.', without empty, '.' or '..' segments")


#: A permanent failure of the target (one error model: ``fortis.client.errors.TargetFailed``).
TargetFailed = errors.TargetFailed


#: The target's field names kept in a scrubbed INVALID_ARGUMENT (``images[3].encoded``);
#: anything else is reported as ``images``.
_SAFE_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,40}(\[[0-9]{1,6}\])?(\.[A-Za-z_][A-Za-z0-9_]{0,40}"
                         r"(\[[0-9]{1,6}\])?){0,4}")
#: What a tenant is told of a target's failure, by class: fixed words, never the target's
#: own text (it may quote addresses, URLs, file paths, stack traces or secrets).
_REASONS: dict[int, str] = {
    code_pb2.UNAVAILABLE: "the target did not answer (down, overloaded or timed out)",
    code_pb2.DEADLINE_EXCEEDED: "the target did not answer in time",
    code_pb2.INVALID_ARGUMENT: "the target refused this input",
    code_pb2.INTERNAL: "the target failed or gave an answer that could not be used",
}


#: What a reason may not carry to a tenant, each replaced by a placeholder: a stack trace
#: (everything from it on), URLs, addresses (IPv4/IPv6/host with a port), file paths and
#: credentials written as name=value.
_SCRUB: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"Traceback \(most recent call last\).*|^\s*File \".*",
                re.DOTALL | re.MULTILINE), ""),
    (re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]{1,15}://\S+"), "[url]"),
    (re.compile(r"(?i)\b(api[_-]?key|x-api-key|token|secret|password|passwd|authorization|"
                r"bearer|credentials?)\b(\s*[:=]\s*|\s+)\S+"), r"\1=[redacted]"),
    (re.compile(r"\[[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*\](?::\d+)?|\b(?:\d{1,3}\.){3}\d{1,3}"
                r"(?::\d+)?\b|\b[A-Za-z0-9][A-Za-z0-9.-]*:\d{2,5}\b"), "[address]"),
    (re.compile(r"(?<![\w.\]])(?:[A-Za-z]:)?[/\\](?:[\w.~-]+[/\\])*[\w.~-]+"), "[path]"),
)
#: Longest reason a tenant reads.
REASON_MAX = 200


def scrub_reason(text: str) -> str:
    """``text`` without stack traces, URLs, addresses, file paths or name=value credentials,
    on one line and at most REASON_MAX characters ("" when nothing is left)."""
    for pattern, repl in _SCRUB:
        text = pattern.sub(repl, text)
    text = " ".join(text.split())
    return text if len(text) <= REASON_MAX else text[:REASON_MAX - 1] + "\u2026"


def target_failure(target: str, exc: errors.FortisError) -> errors.FortisError:
    """What a tenant gets for a back end's error: the target's NAME, a status code and a
    fixed, bounded reason with a correlation id; the error itself (which quotes the target's
    address, URL or its own exception text) goes to the operator's log under that id
    (``target_error``). ``Unavailable`` stays Unavailable (retried, Retry-After kept), the
    target's INVALID_ARGUMENT keeps its field names (``images[3].encoded``), and everything
    else the target did wrong is ``TargetFailed`` (FAILED_PRECONDITION, not retried)."""
    code = code_for(exc)
    cid = uuid.uuid4().hex[:16]
    log.warning("target_error", target=target, correlation_id=cid,
                code=code_pb2.Code.Name(code), error_class=type(exc).__name__,
                detail=str(getattr(exc, "operator_detail", "") or exc)[:4000])
    reason = scrub_reason(str(exc)) or _REASONS.get(code, "the target answered with an error")
    said = f"target '{target}': {code_pb2.Code.Name(code)}: {reason} (correlation id {cid})"
    out: errors.FortisError
    if isinstance(exc, errors.Unavailable):
        out = errors.Unavailable(said)
        if getattr(exc, "retry_after_s", None) is not None:
            out.retry_after_s = exc.retry_after_s  # type: ignore[attr-defined]
    elif isinstance(exc, errors.DeadlineExceeded):
        out = errors.DeadlineExceeded(said)
    elif isinstance(exc, errors.InvalidArgument):
        fields = list(dict.fromkeys(v.field if _SAFE_FIELD.fullmatch(v.field) else "images"
                                    for v in exc.violations[:20]))
        out = errors.InvalidArgument.from_violations(
            [errors.FieldViolation(f, said) for f in fields])
    else:
        out = TargetFailed(f"{said}; not retried")
    out.correlation_id = cid  # type: ignore[attr-defined]
    return out


class TargetBackend(Protocol):
    """How the proxy reaches one target."""

    def info(self) -> target_pb2.TargetInfo: ...

    def predict(self, images: Sequence[common_pb2.Image]) -> list[common_pb2.Prediction]:
        """Raise ``errors.Unavailable`` when the target cannot be reached or is overloaded
        (retried with backoff; set ``exc.retry_after_s`` to ask for a given wait, e.g. from an
        HTTP Retry-After header). Other ``FortisError``s fail the call at once; both are
        recorded in the ledger for each image."""
        ...


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    max_attempts: int = 4
    initial_backoff_s: float = 0.05
    multiplier: float = 2.0
    max_backoff_s: float = 1.0
    max_retry_after_s: float = 30.0     # longest Retry-After honoured


@dataclass(kw_only=True)
class TargetEntry:
    name: str
    backend: TargetBackend
    limiter: RateLimiter
    #: Most images in one call to the target: the operator's cap (``?max_batch=N``), lowered
    #: to what the target declares (``TargetInfo.input.max_batch_size``) once known.
    max_batch: int = 64
    #: Tenants allowed to use this target; empty = every tenant.
    tenants: frozenset[str] = frozenset()
    #: The built-in model this target serves (``builtin:<model>``); "" for any other target.
    builtin_model: str = ""
    #: The target's own ``max_batch_size`` (0: it declares none), read from its info on the
    #: first call that needs it; None until then.
    declared_batch: int | None = None
    #: The task the target declares (a TaskType value), read once; None until then.
    task_type: int | None = None

    def allows(self, tenant: str) -> bool:
        return not self.tenants or tenant in self.tenants

    def batch_limit(self) -> int:
        """Images per call to the target: the operator's cap and the target's declared
        maximum, whichever is smaller. The declared one is read once; a target that cannot
        be asked now is sent the operator's cap and asked again at the next call."""
        if self.declared_batch is None:
            try:
                self.declared_batch = max(0, int(self.backend.info().input.max_batch_size))
            except errors.FortisError:
                return max(1, self.max_batch)
        declared = self.declared_batch
        return max(1, min(self.max_batch, declared) if declared else self.max_batch)


@dataclass
class _Budget:
    """A session's counts: ``used_*`` every attempt the target received (the hard budgets),
    ``answered`` the queries it answered (IEEE-M6). With ``shared`` the hard
    budgets are checked and charged in the shared store, so replicas hold them in total;
    ``used_*`` then mirror the store's counts as of this replica's last call."""

    record: SessionRecord
    used_total: int
    used_per_image: dict[str, int]
    answered: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Per image id: (input hash, ledger row) of answers recorded before this process
    #: started, in send order; a resumed attempt's identical queries are answered from them.
    replay: dict[str, deque[tuple[str, int]]] = field(default_factory=dict)
    shared: SharedBudgets | None = None
    #: The ledger's attempts per image id now (the shared store's starting point).
    initial: Callable[[], dict[str, int]] = dict

    def reserve(self, images: Sequence[common_pb2.Image]) -> list[errors.QuotaViolation]:
        """Check and charge ``images`` at once: the violations (nothing charged), or none
        (charged). The caller holds ``lock``; ``errors.Unavailable`` from a shared store."""
        if self.shared is None or not (self.record.query_budget
                                       or self.record.per_image_budget):
            out = self.violations(images)
            if not out:
                self.charge(images)
            return out
        ok, total, per_image = self.shared.reserve(self.record, images, self.initial)
        self.used_total = total
        self.used_per_image.update(per_image)
        if ok:
            return []
        return self.violations(images) or [errors.QuotaViolation(
            f"sessions/{self.record.session_id}", "query budget used by other replicas")]

    def violations(self, images: Sequence[common_pb2.Image]) -> list[errors.QuotaViolation]:
        rec, n = self.record, len(images)
        out = []
        if rec.query_budget and self.used_total + n > rec.query_budget:
            out.append(errors.QuotaViolation(
                f"sessions/{rec.session_id}",
                f"{self.used_total} of {rec.query_budget} queries used; {n} more requested"))
        if rec.per_image_budget:
            counts: dict[str, int] = {}
            for img in images:
                counts[img.image_id] = counts.get(img.image_id, 0) + 1
            for image_id, k in counts.items():
                used = self.used_per_image.get(image_id, 0)
                if used + k > rec.per_image_budget:
                    out.append(errors.QuotaViolation(
                        f"sessions/{rec.session_id}/images/{image_id[:200]}",
                        f"{used} of {rec.per_image_budget} queries used; {k} more requested"))
                    if len(out) >= 20:
                        break
        return out

    def charge(self, images: Sequence[common_pb2.Image], sign: int = 1) -> None:
        """Count (or, ``sign=-1``, release) ``images``; the caller holds ``lock``."""
        if sign < 0 and self.shared is not None and (self.record.query_budget
                                                     or self.record.per_image_budget):
            self.shared.refund(self.record, images)
        self.used_total += sign * len(images)
        for img in images:
            self.used_per_image[img.image_id] = self.used_per_image.get(img.image_id, 0) + sign


@dataclass(frozen=True, kw_only=True)
class PredictResult:
    predictions: list[common_pb2.Prediction]
    queries_left: int   # -1 = unlimited


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
        self._budgets: dict[tuple[str, str], _Budget] = {}
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

    def _budget(self, tenant: str, session_id: str) -> _Budget:
        with self._lock:
            b = self._budgets.get((tenant, session_id))
            if b is None:
                rec = self.session(tenant, session_id)
                per_image = self.ledger.attempt_counts(session_id, tenant)
                answered = sum(self.ledger.ok_counts(session_id, tenant).values())
                replay = {} if not rec.per_image_budget else {
                    k: deque(v) for k, v in self.ledger.replayable(
                        session_id, tenant, up_to=self._replay_up_to).items()}
                b = _Budget(record=rec, used_total=sum(per_image.values()),
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
            if img.WhichOneof("content") is None:
                raise errors.InvalidArgument(f"images[{i}]", "image has no content")

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

    def _replays(self, budget: _Budget, images: Sequence[common_pb2.Image]
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

    def _send(self, entry: TargetEntry, budget: _Budget, origin: str,
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
            rows = [QueryRow(tenant=rec.tenant, session_id=rec.session_id, target=rec.target,
                             origin=origin, image_id=img.image_id, input_sha256=h,
                             output_summary="", latency_ms=0.0, status=IN_FLIGHT,
                             error=IN_FLIGHT_NOTE, sent_at=time.time(),
                             call_id=call_id, attempts=attempt)
                    for img, h in zip(images, hashes, strict=True)]
            entry_ids = self.ledger.reserve(rows)
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
            if failure is None:
                with budget.lock:
                    budget.answered += n
                for img, p in zip(images, preds, strict=True):
                    p.image_id = img.image_id
                return preds
            if not isinstance(failure, errors.Unavailable) or attempt >= self.retry.max_attempts:
                raise failure
            # A retry is sent again: it must fit the hard budgets, or it is not sent.
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
            # A target that says when to come back (HTTP 429/503 Retry-After) is honoured,
            # up to the policy's cap.
            hint = getattr(failure, "retry_after_s", None)
            wait = delay if not hint else min(max(delay, float(hint)), self.retry.max_retry_after_s)
            self._sleep(wait)
            delay = min(delay * self.retry.multiplier, self.retry.max_backoff_s)

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


def _replies(entry_ids: Sequence[int], preds: Sequence[common_pb2.Prediction]
             ) -> list[tuple[int, bytes]]:
    """Answers kept for a resumed attempt's replay: compressed, at most REPLY_MAX_BYTES."""
    out = []
    for eid, p in zip(entry_ids, preds, strict=True):
        blob = zlib.compress(p.SerializeToString(), 1)
        if len(blob) <= REPLY_MAX_BYTES:
            out.append((eid, blob))
    return out


def _info_of(entry: TargetEntry) -> Any:
    """The target's description; its errors scrubbed as a query's are (target_failure)."""
    try:
        return entry.backend.info()
    except errors.FortisError as exc:
        raise target_failure(entry.name, exc) from None


def _bounded(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= ERROR_MAX else text[:ERROR_MAX - 1] + "\u2026"


def _log_refused(reason: str, *, tenant: str, session_id: str, target: str,
                 **extra: object) -> None:
    """Audit line of a refused query: who, which session and target, and why. The
    runner names sessions ``<evaluation>/<part>``, so the evaluation is the prefix."""
    evaluation_id = session_id.partition("/")[0] if "/" in session_id else ""
    log.warning("query_refused", reason=reason, tenant=tenant, session=session_id,
                evaluation_id=evaluation_id, target=target, **extra)
