"""Domain errors, shared by every service.

Domain code raises these; it never imports gRPC (DESIGN.md section 1). One interceptor in
``fortis.services.common.server`` maps them to gRPC status codes with rich error details:

    InvalidArgument     -> INVALID_ARGUMENT    + google.rpc.BadRequest (field violations)
    NotFound            -> NOT_FOUND           + google.rpc.ResourceInfo
    BudgetExhausted     -> RESOURCE_EXHAUSTED  + google.rpc.QuotaFailure
    FailedPrecondition  -> FAILED_PRECONDITION
    Unavailable         -> UNAVAILABLE
    Unauthenticated     -> UNAUTHENTICATED
    anything else       -> INTERNAL (no internals leaked)
"""

from __future__ import annotations

from dataclasses import dataclass, field


class FortisError(Exception):
    """Base class of every error Fortis domain code raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class FieldViolation:
    """One bad field: ``field`` is a dotted path into the request or plan."""

    field: str
    description: str


class InvalidArgument(FortisError):
    """The caller sent something invalid. Names the offending field(s)."""

    def __init__(self, field: str, description: str,
                 more: list[FieldViolation] | None = None) -> None:
        self.violations = [FieldViolation(field, description)] + list(more or [])
        text = "; ".join(f"{v.field}: {v.description}" for v in self.violations)
        super().__init__(text)

    @classmethod
    def from_violations(cls, violations: list[FieldViolation]) -> InvalidArgument:
        if not violations:
            raise ValueError("at least one violation is needed")
        first, *rest = violations
        return cls(first.field, first.description, rest)


class NotFound(FortisError):
    """A named resource does not exist."""

    def __init__(self, resource_type: str, name: str) -> None:
        self.resource_type = resource_type
        self.name = name
        super().__init__(f"{resource_type} '{name}' not found")


@dataclass(frozen=True)
class QuotaViolation:
    """One exhausted quota: ``subject`` names what was limited (session, image)."""

    subject: str
    description: str


class BudgetExhausted(FortisError):
    """A query budget would be exceeded: nothing was sent to the target."""

    def __init__(self, violations: list[QuotaViolation]) -> None:
        self.violations = violations
        super().__init__("query budget exhausted: " + "; ".join(
            f"{v.subject}: {v.description}" for v in violations))


class AlreadyExists(FortisError):
    """A resource with that id exists with different settings."""


class FailedPrecondition(FortisError):
    """The system is not in a state that allows the call (e.g. cancelling a finished run)."""


class Unavailable(FortisError):
    """A dependency (the target, another service) could not be reached."""


class Unauthenticated(FortisError):
    """Missing or unknown API key."""


@dataclass
class ErrorInfo:
    """Plain record of a per-item failure, stored in the ledger and reports."""

    code: str
    message: str
    details: dict[str, str] = field(default_factory=dict)
