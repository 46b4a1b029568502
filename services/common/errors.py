"""Domain errors, shared by every service: the one error model of ``fortis.client.errors``.

Domain code raises these (``from fortis.services.common.errors import InvalidArgument``); it
never imports gRPC (docs/architecture.md, section 4). The classes live in the client
distribution so that a client catches exactly the class the server raised, rebuilt from the
status details; the one class -> status-code table (``CODES``/``code_for``) and the Status
conversion (``to_status``/``from_status``) live there too. See that module for the mapping.
"""

from __future__ import annotations

from fortis.client.errors import (
    CODES,
    AlreadyExists,
    BudgetExhausted,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    FieldViolation,
    FortisError,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
    QuotaViolation,
    TargetFailed,
    Unauthenticated,
    Unavailable,
    code_for,
)

__all__ = [
    "CODES", "AlreadyExists", "BudgetExhausted", "Cancelled", "DeadlineExceeded",
    "FailedPrecondition", "FieldViolation", "FortisError", "Internal", "InvalidArgument",
    "NotFound", "PermissionDenied", "QuotaExceeded", "QuotaViolation", "TargetFailed",
    "Unauthenticated", "Unavailable",
    "code_for",
]
