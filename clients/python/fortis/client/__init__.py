"""Fortis's Python client: submit a test plan, follow it, fetch the report.

    from fortis.client import FortisClient
    with FortisClient("127.0.0.1:50051", api_key="...") as fc:
        ev = fc.submit(open("plan.yaml").read())
        final = fc.wait(ev.evaluation_id, timeout_s=3600,
                        on_progress=lambda p: print(p.stage, p.items_done, p.items_total))
        report = fc.report(ev.evaluation_id)          # dict of report.json
        fc.write_report(ev.evaluation_id, "out/")     # report.json + report.html

Installed alone as the ``fortis-client`` distribution (grpcio + protobuf, no torch): a team
that only submits plans needs nothing of the engine. Errors are :mod:`fortis.client.errors`
classes (``InvalidArgument`` with ``.violations`` naming each bad field of the plan,
``NotFound``, ``DeadlineExceeded``, ...), the same classes the server raised.
"""

from typing import TYPE_CHECKING, Any

from fortis.client.errors import (
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
    QuotaViolation,
    Unauthenticated,
    Unavailable,
)
from fortis.client.types import (
    Attack,
    Evaluation,
    LedgerEntry,
    Page,
    Perturbation,
    Progress,
    SessionStats,
    State,
    Target,
    progress_of,
)

__all__ = [
    "AlreadyExists", "Attack", "BudgetExhausted", "Cancelled", "DeadlineExceeded", "Evaluation",
    "FailedPrecondition", "FieldViolation", "FortisClient", "FortisError", "Internal",
    "InvalidArgument", "LedgerEntry", "NotFound", "Page", "PermissionDenied", "Perturbation",
    "Progress", "QuotaViolation", "SessionStats", "State", "Target", "Unauthenticated",
    "Unavailable", "progress_of",
]

if TYPE_CHECKING:
    from fortis.client._client import FortisClient


def __getattr__(name: str) -> Any:
    """``FortisClient`` is imported on first use: the error model and the result types load
    without grpc, so the server's domain code can share them (it never imports gRPC)."""
    if name == "FortisClient":
        from fortis.client._client import FortisClient
        return FortisClient
    raise AttributeError(f"module 'fortis.client' has no attribute {name!r}")
