"""Fortis's one error model, shared by the client and the services.

Every failure Fortis reports is one of these classes. The server turns an exception into a
``google.rpc.Status`` with rich details (:func:`to_status`); the client turns that status back
into the *same* class with the same details (:func:`from_status`, :func:`from_rpc_error`), so
``except NotFound`` works identically in-process and across the wire. There is exactly one
table from class to status code (:data:`CODES`, read by :func:`code_for`); nothing else decides
codes, so the interceptor, the streaming per-item errors and the client cannot drift apart.

    InvalidArgument     INVALID_ARGUMENT     google.rpc.BadRequest (one violation per field)
    NotFound            NOT_FOUND            google.rpc.ResourceInfo
    AlreadyExists       ALREADY_EXISTS
    FailedPrecondition  FAILED_PRECONDITION
    BudgetExhausted     RESOURCE_EXHAUSTED   google.rpc.QuotaFailure
      QuotaExceeded     RESOURCE_EXHAUSTED   QuotaFailure, reason QUOTA_EXCEEDED (tenant quota)
    Unavailable         UNAVAILABLE          google.rpc.RetryInfo (when a retry delay is known)
    Unauthenticated     UNAUTHENTICATED
    PermissionDenied    PERMISSION_DENIED
    DeadlineExceeded    DEADLINE_EXCEEDED
    Cancelled           CANCELLED
    Internal            INTERNAL             (also any other FortisError)
    anything else       INTERNAL, message "internal error": nothing of it leaks

Every status also carries a ``google.rpc.ErrorInfo`` (domain ``fortis``, reason the class's
UPPER_SNAKE name). Messages and detail strings are bounded, so an absurd input (a 1 MB id) is
never echoed back whole and never overflows gRPC's trailer limit.

This module needs protobuf and googleapis-common-protos only; grpc is imported lazily by
:func:`from_rpc_error`, so domain code can raise these without depending on gRPC.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2

#: ErrorInfo.domain of every Fortis error.
DOMAIN = "fortis"
#: Longest message a status carries, in UTF-8 bytes.
MAX_MESSAGE_BYTES = 1024
#: Largest serialized google.rpc.Status (message and details): it travels base64-encoded in
#: the grpc-status-details-bin trailer beside the percent-encoded grpc-message, and gRPC
#: clients refuse trailers over 8 KiB at random and over 16 KiB always (RESOURCE_EXHAUSTED
#: "Stream removed"); fewer violations are sent until it fits.
MAX_STATUS_BYTES = 3072
#: Longest single string inside a detail (field path, description, resource name).
MAX_DETAIL_CHARS = 256
#: Longest piece of a caller's id or name an error repeats (a 1 MB id is never echoed).
MAX_NAME_CHARS = 100
#: Most violations a BadRequest / QuotaFailure carries (the message says how many were cut).
MAX_VIOLATIONS = 32

__all__ = [
    "AlreadyExists", "BudgetExhausted", "Cancelled", "CODES", "DeadlineExceeded",
    "FailedPrecondition", "FieldViolation", "FortisError", "Internal", "InvalidArgument",
    "NotFound", "PermissionDenied", "QuotaExceeded", "QuotaViolation", "TargetFailed",
    "Unauthenticated", "Unavailable", "class_for", "code_for", "from_rpc_error", "from_status", "to_status",
]

_E = TypeVar("_E", bound="FortisError")


#: A quoted value ('...' opened after a non-word character, closed before one) longer than
#: MAX_NAME_CHARS: by convention Fortis quotes what the caller sent ("unknown perturbation
#: '<id>'"), so a 1 MB id is cut here whatever raised it.
_LONG_QUOTED = re.compile("(?<!\\w)'([^'\n]{" + str(MAX_NAME_CHARS - 1) + "})[^'\n]+('(?!\\w)|$)")
#: Characters of a text looked at before bounding (a message is at most 1 KB in the end).
_SCAN_CHARS = 65536


def _unquote_long(text: str) -> str:
    return _LONG_QUOTED.sub(lambda m: "'" + m.group(1) + "\u2026" + m.group(2),
                            text[:_SCAN_CHARS])


def _clip(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """``text`` cut to ``limit`` characters (long quoted values to MAX_NAME_CHARS), marked so
    a reader knows it was cut."""
    text = _unquote_long(text)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _clip_bytes(text: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    text = _unquote_long(text)
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    return raw[: limit - 3].decode("utf-8", "ignore") + "\u2026"


class FortisError(Exception):
    """Base class of every error Fortis raises on purpose.

    ``FortisError(message)`` itself maps to INTERNAL; raise a subclass to say what went wrong.
    """

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled with its attributes, whatever its constructor takes: an error raised where
        # a server ran a piece of work in another process reaches the call as the same class.
        return (_unpickle, (type(self), self.args, self.__dict__))

    @property
    def code(self) -> int:
        """The google.rpc.Code of this error (the code a foreign status carried, for codes
        Fortis has no class of, e.g. UNIMPLEMENTED)."""
        received: int | None = getattr(self, "_received_code", None)
        return received if received is not None else code_for(self)

    def details(self) -> list[Message]:
        """Rich details (besides ErrorInfo) this error adds to its status."""
        return []

    @classmethod
    def rebuild(cls: type[_E], message: str, details: Sequence[Message]) -> _E:
        """The error a status of this class's code carried (inverse of :meth:`details`)."""
        return cls(message)


def _unpickle(cls: type[_E], args: tuple[Any, ...], state: dict[str, Any]) -> _E:
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


@dataclass(frozen=True)
class FieldViolation:
    """One bad field: ``field`` is a dotted path into the request or plan."""

    field: str
    description: str


class InvalidArgument(FortisError):
    """The caller sent something invalid. Names the offending field(s) in ``violations``."""

    def __init__(self, field: str, description: str,
                 more: Sequence[FieldViolation] | None = None) -> None:
        self.violations = [FieldViolation(field, description)] + list(more or [])
        super().__init__("; ".join(f"{v.field}: {v.description}" for v in self.violations))

    @classmethod
    def from_violations(cls, violations: Sequence[FieldViolation]) -> InvalidArgument:
        if not violations:
            raise ValueError("at least one violation is needed")
        first, *rest = violations
        return cls(first.field, first.description, rest)

    def details(self) -> list[Message]:
        return [error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(
                field=_clip(v.field), description=_clip(v.description))
            for v in self.violations[:MAX_VIOLATIONS]])]

    @classmethod
    def rebuild(cls, message: str, details: Sequence[Message]) -> InvalidArgument:
        found = [FieldViolation(v.field, v.description)
                 for d in details if isinstance(d, error_details_pb2.BadRequest)
                 for v in d.field_violations]
        return cls.from_violations(found) if found else cls("request", message)


class NotFound(FortisError):
    """A named resource does not exist (``resource_type`` and ``name`` say which)."""

    def __init__(self, resource_type: str, name: str) -> None:
        self.resource_type = resource_type
        self.name = name
        super().__init__(f"{_clip(resource_type, MAX_NAME_CHARS)} "
                         f"'{_clip(name, MAX_NAME_CHARS)}' not found")

    def details(self) -> list[Message]:
        return [error_details_pb2.ResourceInfo(
            resource_type=_clip(self.resource_type, MAX_NAME_CHARS),
            resource_name=_clip(self.name, MAX_NAME_CHARS))]

    @classmethod
    def rebuild(cls, message: str, details: Sequence[Message]) -> NotFound:
        for d in details:
            if isinstance(d, error_details_pb2.ResourceInfo):
                return cls(d.resource_type, d.resource_name)
        err = cls("resource", "")
        err.message = message      # no ResourceInfo (another server): keep its words as they are
        err.args = (message,)
        return err


class AlreadyExists(FortisError):
    """A resource with that id exists with different settings."""


class FailedPrecondition(FortisError):
    """The system is not in a state that allows the call (e.g. the report of a running job)."""


class TargetFailed(FailedPrecondition):
    """A permanent failure of the target: it answered, but with an error of its own (INTERNAL,
    UNKNOWN, UNIMPLEMENTED, an error message too large to receive) or a malformed answer (a
    prediction too few, a body the adapter cannot use). Not retried; FAILED_PRECONDITION naming
    the target, with ErrorInfo reason ``TARGET_FAILED`` so a caller tells it from other
    preconditions (an evaluation records it as a failed query of those images). Transient
    failures are ``Unavailable``."""


@dataclass(frozen=True)
class QuotaViolation:
    """One exhausted quota: ``subject`` names what was limited (session, image)."""

    subject: str
    description: str


class BudgetExhausted(FortisError):
    """A query budget would be exceeded: nothing was sent to the target."""

    def __init__(self, violations: Sequence[QuotaViolation]) -> None:
        self.violations = list(violations)
        super().__init__("query budget exhausted: " + "; ".join(
            f"{v.subject}: {v.description}" for v in self.violations))

    def details(self) -> list[Message]:
        return [error_details_pb2.QuotaFailure(violations=[
            error_details_pb2.QuotaFailure.Violation(
                subject=_clip(v.subject), description=_clip(v.description))
            for v in self.violations[:MAX_VIOLATIONS]])]

    @classmethod
    def rebuild(cls, message: str, details: Sequence[Message]) -> BudgetExhausted:
        found = [QuotaViolation(v.subject, v.description)
                 for d in details if isinstance(d, error_details_pb2.QuotaFailure)
                 for v in d.violations]
        return cls(found or [QuotaViolation("?", message)])


class QuotaExceeded(BudgetExhausted):
    """A tenant's quota (evaluations running or queued, queries per day) would be exceeded:
    the request was refused, nothing stored or sent. RESOURCE_EXHAUSTED like its base, with
    the QuotaFailure (subject ``tenant:<name>``) and ErrorInfo reason ``QUOTA_EXCEEDED``."""

    def __init__(self, violations: Sequence[QuotaViolation]) -> None:
        self.violations = list(violations)
        FortisError.__init__(self, "tenant quota exceeded: " + "; ".join(
            f"{v.subject}: {v.description}" for v in self.violations))


class Unavailable(FortisError):
    """A dependency (the target, another service) could not be reached; retrying may help.

    ``retry_after_s``, when known (a 429's Retry-After), travels as google.rpc.RetryInfo.
    """

    def __init__(self, message: str = "unavailable", *, retry_after_s: float | None = None
                 ) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def details(self) -> list[Message]:
        if self.retry_after_s is None:
            return []
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(self.retry_after_s * 1e9))
        return [error_details_pb2.RetryInfo(retry_delay=delay)]

    @classmethod
    def rebuild(cls, message: str, details: Sequence[Message]) -> Unavailable:
        for d in details:
            if isinstance(d, error_details_pb2.RetryInfo):
                return cls(message, retry_after_s=d.retry_delay.ToNanoseconds() / 1e9)
        return cls(message)


class Unauthenticated(FortisError):
    """Missing or unknown API key."""


class PermissionDenied(FortisError):
    """The caller is known but may not do this (another tenant's resource). ``field``, when
    given, names the request's or plan's field that asked for it (a BadRequest detail)."""

    def __init__(self, message: str = "", *, field: str = "") -> None:
        self.field = field
        self.description = message
        super().__init__(f"{field}: {message}" if field else message)

    def details(self) -> list[Message]:
        if not self.field:
            return []
        return [error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(
                field=_clip(self.field), description=_clip(self.description))])]

    @classmethod
    def rebuild(cls, message: str, details: Sequence[Message]) -> PermissionDenied:
        for d in details:
            if isinstance(d, error_details_pb2.BadRequest) and d.field_violations:
                v = d.field_violations[0]
                return cls(v.description, field=v.field)
        return cls(message)


class DeadlineExceeded(FortisError):
    """The call, or a client-side wait, ran past its deadline."""


class Cancelled(FortisError):
    """The call was cancelled (by the caller, or the server shutting down)."""


class Internal(FortisError):
    """A bug or an unexpected failure on the server; its message says nothing internal."""


#: The one mapping from error class to google.rpc.Code. Subclasses inherit their base's code.
CODES: dict[type[FortisError], int] = {
    InvalidArgument: code_pb2.INVALID_ARGUMENT,
    NotFound: code_pb2.NOT_FOUND,
    AlreadyExists: code_pb2.ALREADY_EXISTS,
    FailedPrecondition: code_pb2.FAILED_PRECONDITION,
    BudgetExhausted: code_pb2.RESOURCE_EXHAUSTED,
    Unavailable: code_pb2.UNAVAILABLE,
    Unauthenticated: code_pb2.UNAUTHENTICATED,
    PermissionDenied: code_pb2.PERMISSION_DENIED,
    DeadlineExceeded: code_pb2.DEADLINE_EXCEEDED,
    Cancelled: code_pb2.CANCELLED,
    Internal: code_pb2.INTERNAL,
    FortisError: code_pb2.INTERNAL,
}
_CLASS_OF_CODE: dict[int, type[FortisError]] = {
    code: cls for cls, code in CODES.items() if cls is not FortisError}


def _reason(cls: type[FortisError]) -> str:
    """ErrorInfo.reason of a class: its name in UPPER_SNAKE_CASE (AIP-193)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).upper()


#: Subclasses with an ErrorInfo reason of their own (their code is their base's).
_REASONED: tuple[type[FortisError], ...] = (TargetFailed, QuotaExceeded)
_CLASS_OF_REASON: dict[str, type[FortisError]] = {
    _reason(c): c for c in (*_CLASS_OF_CODE.values(), *_REASONED)}


def code_for(exc: BaseException) -> int:
    """The google.rpc.Code of an exception: its class's (or nearest base's) entry in CODES;
    INTERNAL for anything that is not a FortisError."""
    for cls in type(exc).__mro__:
        if cls in CODES:
            return CODES[cls]      # type: ignore[index]
    return code_pb2.INTERNAL


def class_for(code: int) -> type[FortisError]:
    """The error class a status code becomes on the client (FortisError for unmapped codes
    such as UNKNOWN or UNIMPLEMENTED)."""
    return _CLASS_OF_CODE.get(code, FortisError)


def to_status(exc: BaseException) -> status_pb2.Status:
    """The google.rpc.Status, with rich details and a bounded message, of an exception.

    A non-Fortis exception is a bug: it becomes INTERNAL "internal error" and nothing of its
    text, type or traceback is sent (log it on the server instead).
    """
    if not isinstance(exc, FortisError):
        return status_pb2.Status(code=code_pb2.INTERNAL, message="internal error")
    base = next(c for c in type(exc).__mro__ if c in CODES or c in _REASONED)
    info = error_details_pb2.ErrorInfo(reason=_reason(base), domain=DOMAIN)  # type: ignore[arg-type]
    details = exc.details()
    message = _clip_bytes(str(exc))
    while True:
        status = status_pb2.Status(code=code_for(exc), message=message,
                                   details=[_packed(d) for d in [*details, info]])
        if status.ByteSize() <= MAX_STATUS_BYTES or not details:
            return status
        details = _shorter(details)


def _packed(detail: Message) -> any_pb2.Any:
    a = any_pb2.Any()
    a.Pack(detail)
    return a


def _shorter(details: list[Message]) -> list[Message]:
    """``details`` with the last violation of its longest BadRequest/QuotaFailure dropped, or
    (none left to drop) without its last detail."""
    lists = [(d, d.field_violations if isinstance(d, error_details_pb2.BadRequest)
              else d.violations) for d in details
             if isinstance(d, error_details_pb2.BadRequest | error_details_pb2.QuotaFailure)]
    lists = [(d, v) for d, v in lists if len(v) > 1]
    if not lists:
        return details[:-1]
    _, longest = max(lists, key=lambda dv: len(dv[1]))
    del longest[-1]
    return details


_DETAIL_TYPES: tuple[type[Message], ...] = (
    error_details_pb2.BadRequest, error_details_pb2.QuotaFailure, error_details_pb2.ResourceInfo,
    error_details_pb2.RetryInfo, error_details_pb2.ErrorInfo)


def _unpack(details: Sequence[any_pb2.Any]) -> list[Message]:
    out: list[Message] = []
    for a in details:
        for t in _DETAIL_TYPES:
            if a.Is(t.DESCRIPTOR):
                m = t()
                a.Unpack(m)
                out.append(m)
                break
    return out


def from_status(status: status_pb2.Status) -> FortisError:
    """The exception a google.rpc.Status stands for: the class of its code (or of its
    ErrorInfo reason, when the domain is Fortis), rebuilt with its details."""
    details = _unpack(status.details)
    cls = class_for(status.code)
    for d in details:
        if isinstance(d, error_details_pb2.ErrorInfo) and d.domain == DOMAIN:
            cls = _CLASS_OF_REASON.get(d.reason, cls)
    if cls is FortisError:
        name = code_pb2.Code.Name(status.code) if status.code in code_pb2.Code.values() \
            else str(status.code)
        err = FortisError(f"{name}: {status.message}")
        err._received_code = status.code      # type: ignore[attr-defined]
        return err
    return cls.rebuild(status.message, details)


def from_rpc_error(exc: Any) -> FortisError:
    """The exception a failed gRPC call carries (``grpc.RpcError``): rich details from the
    ``grpc-status-details-bin`` trailer when the server sent them, else code and message."""
    code = exc.code() if hasattr(exc, "code") else None
    message = exc.details() if hasattr(exc, "details") else str(exc)
    status = None
    if hasattr(exc, "trailing_metadata"):
        try:
            from grpc_status import rpc_status

            status = rpc_status.from_call(exc)
        except (ValueError, TypeError, AttributeError):
            status = None        # inconsistent or foreign trailers: fall back to code + message
    if status is None:
        value = code.value[0] if code is not None else code_pb2.UNKNOWN
        status = status_pb2.Status(code=value, message=message or "")
    return from_status(status)
