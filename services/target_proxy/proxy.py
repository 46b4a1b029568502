"""The target proxy's domain logic: sessions, budgets, rate limit, retries, ledger.

Every query to a target passes here. Queries are counted per image; a session's budget
(total and per image id, the Q_m of IEEE-M6) is checked before anything is sent, and a call
that would exceed it is refused whole (``BudgetExhausted``) with nothing sent. Every image
of every call is recorded in the ledger before the answer is returned. When the target is
unavailable the call is retried with exponential backoff; a call that still fails is
recorded as failed for each of its images. Domain code: the target is reached through the
``TargetBackend`` protocol, implemented over gRPC in ``backends.py``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from fortis.common.v1 import common_pb2
from fortis.services.common import errors
from fortis.services.common.codec import image_sha256, summarize
from fortis.services.common.errors import code_for
from fortis.services.target_proxy.ledger import Ledger, QueryRow, SessionRecord, wall_clock_of
from fortis.services.target_proxy.metrics import ProxyMetrics
from fortis.services.target_proxy.ratelimit import RateLimiter
from fortis.target.v1 import target_pb2
from google.rpc import code_pb2


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
    max_batch: int = 64


@dataclass
class _Budget:
    record: SessionRecord
    used_total: int
    used_per_image: dict[str, int]
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True, kw_only=True)
class PredictResult:
    predictions: list[common_pb2.Prediction]
    queries_left: int   # -1 = unlimited


class TargetProxy:
    """Sessions, budgets, rate limits, retries and the ledger, for a set of targets."""

    def __init__(self, ledger: Ledger, targets: Sequence[TargetEntry], *,
                 retry: RetryPolicy = RetryPolicy(),
                 sleep: Callable[[float], None] = time.sleep,
                 metrics: ProxyMetrics | None = None) -> None:
        self.ledger = ledger
        self.metrics = metrics
        self.targets = {t.name: t for t in targets}
        self.retry = retry
        self._sleep = sleep
        self._budgets: dict[str, _Budget] = {}
        self._lock = threading.Lock()

    # -- targets ----------------------------------------------------------------------------
    def target(self, name: str) -> TargetEntry:
        if not name:
            raise errors.InvalidArgument("target", "target name is required")
        entry = self.targets.get(name)
        if entry is None:
            raise errors.NotFound("target", name)
        return entry

    def target_info(self, name: str) -> target_pb2.TargetInfo:
        return self._with_retries(lambda: self.target(name).backend.info())[0]

    # -- sessions ---------------------------------------------------------------------------
    def create_session(self, *, tenant: str, target: str, session_id: str = "",
                       query_budget: int = 0, per_image_budget: int = 0,
                       description: str = "") -> SessionRecord:
        self.target(target)
        if query_budget < 0:
            raise errors.InvalidArgument("query_budget", "must be >= 0 (0 = unlimited)")
        if per_image_budget < 0:
            raise errors.InvalidArgument("per_image_budget", "must be >= 0 (0 = unlimited)")
        if session_id and (len(session_id) > 200 or not session_id.isprintable()):
            raise errors.InvalidArgument("session_id", "at most 200 printable characters")
        sid = session_id or f"ses-{uuid.uuid4().hex[:16]}"
        with self._lock:
            existing = self.ledger.get_session(sid)
            if existing is not None:
                same = (existing.tenant == tenant and existing.target == target
                        and existing.query_budget == query_budget
                        and existing.per_image_budget == per_image_budget)
                if not same:
                    raise errors.AlreadyExists(f"session '{sid}' exists with other settings")
                return existing
            rec = SessionRecord(session_id=sid, tenant=tenant, target=target,
                                query_budget=query_budget, per_image_budget=per_image_budget,
                                description=description, created_at=time.time())
            self.ledger.insert_session(rec)
            return rec

    def session(self, tenant: str, session_id: str) -> SessionRecord:
        if not session_id:
            raise errors.InvalidArgument("session_id", "session_id is required")
        rec = self.ledger.get_session(session_id)
        if rec is None or rec.tenant != tenant:
            raise errors.NotFound("session", session_id)
        return rec

    def _budget(self, tenant: str, session_id: str) -> _Budget:
        with self._lock:
            b = self._budgets.get(session_id)
            if b is None:
                rec = self.session(tenant, session_id)
                per_image = self.ledger.ok_counts(session_id)
                b = _Budget(record=rec, used_total=sum(per_image.values()),
                            used_per_image=per_image)
                self._budgets[session_id] = b
            elif b.record.tenant != tenant:
                raise errors.NotFound("session", session_id)
            return b

    def queries_used(self, tenant: str, session_id: str) -> int:
        return self._budget(tenant, session_id).used_total

    # -- predict ----------------------------------------------------------------------------
    def predict(self, *, tenant: str, session_id: str, origin: str,
                images: Sequence[common_pb2.Image]) -> PredictResult:
        if not images:
            raise errors.InvalidArgument("images", "at least one image is required")
        for i, img in enumerate(images):
            if not img.image_id:
                raise errors.InvalidArgument(f"images[{i}].image_id", "image_id is required")
            if img.WhichOneof("content") is None:
                raise errors.InvalidArgument(f"images[{i}]", "image has no content")
        budget = self._budget(tenant, session_id)
        rec = budget.record
        entry = self.target(rec.target)
        n = len(images)
        # Reserve the queries atomically, or refuse the whole call.
        with budget.lock:
            violations = []
            if rec.query_budget and budget.used_total + n > rec.query_budget:
                violations.append(errors.QuotaViolation(
                    f"sessions/{session_id}",
                    f"{budget.used_total} of {rec.query_budget} queries used; {n} more requested"))
            if rec.per_image_budget:
                counts: dict[str, int] = {}
                for img in images:
                    counts[img.image_id] = counts.get(img.image_id, 0) + 1
                for image_id, k in counts.items():
                    used = budget.used_per_image.get(image_id, 0)
                    if used + k > rec.per_image_budget:
                        violations.append(errors.QuotaViolation(
                            f"sessions/{session_id}/images/{image_id}",
                            f"{used} of {rec.per_image_budget} queries used; {k} more requested"))
            if violations:
                self.ledger.add_refused(session_id)
                if self.metrics is not None:
                    self.metrics.refused_call(rec.target)
                raise errors.BudgetExhausted(violations)
            budget.used_total += n
            for img in images:
                budget.used_per_image[img.image_id] = budget.used_per_image.get(img.image_id, 0) + 1
        predictions: list[common_pb2.Prediction] = []
        chunk = max(1, min(entry.max_batch, entry.limiter.max_chunk()))
        sent = 0
        try:
            for start in range(0, n, chunk):
                part = images[start:start + chunk]
                predictions += self._send(entry, rec, origin, part)
                sent = start + len(part)
        finally:
            if sent < n or len(predictions) < n:
                # Release what was reserved but not answered.
                failed = images[len(predictions):]
                with budget.lock:
                    budget.used_total -= len(failed)
                    for img in failed:
                        budget.used_per_image[img.image_id] -= 1
        left = -1
        if rec.query_budget:
            left = rec.query_budget - budget.used_total
        return PredictResult(predictions=predictions, queries_left=left)

    def _send(self, entry: TargetEntry, rec: SessionRecord, origin: str,
              images: Sequence[common_pb2.Image]) -> list[common_pb2.Prediction]:
        granted = entry.limiter.acquire(len(images))
        sent_at = wall_clock_of(granted)
        call_id = uuid.uuid4().hex[:16]
        hashes = [image_sha256(img) for img in images]
        t0 = time.perf_counter()
        status, error, preds, attempts = "OK", "", None, 0
        try:
            preds, attempts = self._with_retries(lambda: entry.backend.predict(images), entry)
            if len(preds) != len(images):
                raise errors.FortisError(
                    f"target answered {len(preds)} predictions for {len(images)} images")
        except errors.FortisError as exc:
            status = code_pb2.Code.Name(code_for(exc))   # the one error mapping
            error = str(exc)
            attempts = getattr(exc, "attempts", attempts) or 1
            failure: errors.FortisError = exc
        latency = (time.perf_counter() - t0) * 1000.0
        rows = [QueryRow(tenant=rec.tenant, session_id=rec.session_id, target=rec.target,
                         origin=origin, image_id=img.image_id, input_sha256=h,
                         output_summary=summarize(preds[i]) if preds else "",
                         latency_ms=latency, status=status, error=error, sent_at=sent_at,
                         call_id=call_id, attempts=attempts)
                for i, (img, h) in enumerate(zip(images, hashes, strict=True))]
        self.ledger.record(rows)
        if self.metrics is not None:
            self.metrics.call(rec.target, status, len(images), latency / 1000.0, attempts)
        if status != "OK":
            raise failure
        assert preds is not None
        for img, p in zip(images, preds, strict=True):
            p.image_id = img.image_id
        return preds

    def _with_retries(self, fn, entry: TargetEntry | None = None):  # type: ignore[no-untyped-def]
        delay = self.retry.initial_backoff_s
        for attempt in range(1, self.retry.max_attempts + 1):
            try:
                result = fn()
                return result, attempt
            except errors.Unavailable as exc:
                if attempt == self.retry.max_attempts:
                    exc.attempts = attempt  # type: ignore[attr-defined]
                    raise
                # A target that says when to come back (HTTP 429/503 Retry-After) is honoured,
                # up to the policy's cap.
                hint = getattr(exc, "retry_after_s", None)
                wait = delay if not hint else min(max(delay, float(hint)), self.retry.max_retry_after_s)
                self._sleep(wait)
                delay = min(delay * self.retry.multiplier, self.retry.max_backoff_s)
        raise AssertionError("unreachable")
