"""A proxy session's identity and counts: the safe session id charset, the session's
budget (attempts the target received, per image id and in total; answers kept for replay),
checked and charged before anything is sent (``proxy.py``), and what its ledger rows keep
(bounded error text, compressed answers) and its audit line when a query is refused.
"""

from __future__ import annotations

import re
import threading
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog
from fortis.common.v1 import common_pb2
from fortis.services.common import errors
from fortis.services.proxy.ledger import SessionRecord
from fortis.services.proxy.shared import SharedBudgets

log = structlog.get_logger("fortis.proxy")

#: Session ids: letters, digits, '-', '_', '.', '/'; not starting with '.'; at most 200;
#: no empty, '.' or '..' segment (evaluation sessions are "<evaluation id>/<stage>/...").
SESSION_ID_MAX = 200
_SESSION_ID = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]*(/[A-Za-z0-9_.\-]+)*")


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



@dataclass
class SessionBudget:
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


#: Longest error text kept in a ledger row.
ERROR_MAX = 500
#: Largest recorded answer (compressed) kept for replay; a larger one (e.g. a big mask) is
#: not kept, and a resumed attempt sends that query again (charged, within Q_m).
REPLY_MAX_BYTES = 64 * 1024


def _replies(entry_ids: Sequence[int], preds: Sequence[common_pb2.Prediction]
             ) -> list[tuple[int, bytes]]:
    """Answers kept for a resumed attempt's replay: compressed, at most REPLY_MAX_BYTES."""
    out = []
    for eid, p in zip(entry_ids, preds, strict=True):
        blob = zlib.compress(p.SerializeToString(), 1)
        if len(blob) <= REPLY_MAX_BYTES:
            out.append((eid, blob))
    return out


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
