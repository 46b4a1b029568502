"""The targets the proxy reaches: how one is reached (:class:`TargetBackend`), its entry in
the proxy (rate limiter, batch size, tenants allowed), the retry policy, and what a tenant is
told when a target fails (a fixed, scrubbed reason: never the target's own text).

Domain code: the protocol is implemented over gRPC in ``backends.py``.
"""


from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from fortis.common.v1 import common_pb2
from fortis.services.common import errors
from fortis.services.common.errors import code_for
from fortis.services.proxy.ratelimit import RateLimiter
from fortis.target.v1 import target_pb2
from google.rpc import code_pb2

log = structlog.get_logger("fortis.proxy")


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
    #: Price per 1000 queries the operator declared (``?price_per_1000=``); None: none.
    price_per_1000: float | None = None

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


def _info_of(entry: TargetEntry) -> Any:
    """The target's description; its errors scrubbed as a query's are (target_failure)."""
    try:
        return entry.backend.info()
    except errors.FortisError as exc:
        raise target_failure(entry.name, exc) from None
