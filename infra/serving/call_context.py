"""What a server call knows about its caller, for the servicers and for the calls they make on
the caller's behalf: the metadata keys, the call's tenant and credentials (context variables set
by the interceptor), its request id and its share of the server's CPU.

No gRPC here: servicers and helpers read these without importing the transport.
"""

from __future__ import annotations

import contextvars
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fortis.infra.serving.workshare import WorkShare
from fortis.services.common.stopping import StopCheck, caller_stop

#: Metadata key carrying the API key.
API_KEY_HEADER = "x-api-key"
#: Metadata key carrying an OpenID Connect / JWT bearer token (``Bearer <jwt>``).
AUTHORIZATION_HEADER = "authorization"
#: Metadata key with which an internal service key acts for a tenant.
TENANT_HEADER = "x-fortis-tenant"
#: Tenant value of an internal service key (may act for any tenant).
SERVICE_TENANT = "*"

T = TypeVar("T")

#: Metadata key of a per-call request id: taken from the caller when safe, else generated,
#: returned in the trailing metadata and bound to every log line of the call (for the audit).
REQUEST_ID_HEADER = "x-request-id"
_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")


def request_id_from(metadata: Mapping[str, str]) -> str:
    """The caller's request id when it is short and plain (it goes into log lines, so no
    control characters or unbounded text), else a fresh one."""
    given = metadata.get(REQUEST_ID_HEADER, "")
    if isinstance(given, str) and _SAFE_REQUEST_ID.fullmatch(given):
        return given
    return uuid.uuid4().hex

current_tenant: contextvars.ContextVar[str] = contextvars.ContextVar("fortis_tenant", default="")
current_api_key: contextvars.ContextVar[str] = contextvars.ContextVar("fortis_api_key", default="")
#: The caller's bearer token, forwarded like its API key when a service calls another on the
#: caller's behalf (perturbation -> proxy for a query attack) so the callee sees the same tenant.
current_bearer: contextvars.ContextVar[str] = contextvars.ContextVar("fortis_bearer", default="")
#: True when the call came with the internal service key (one Fortis service calling another),
#: or when authentication is off (the single-user mode: its one user holds every trust).
current_internal: contextvars.ContextVar[bool] = contextvars.ContextVar("fortis_internal",
                                                                        default=False)
#: Gives back the call's seat (a streaming call's after its first message); set per call.
current_seat: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "fortis_seat", default=None)
#: This server's work share, for the servicers' :func:`work_slot` (set per call).
current_work: contextvars.ContextVar[WorkShare | None] = contextvars.ContextVar(
    "fortis_work", default=None)


def in_work_slot(context: Any, fn: Callable[[], T]) -> T:
    """A servicer's costly part, ``fn()``, in the calling tenant's share of the server's CPU
    (``WorkShare.run``: on the share's lower-priority threads); waiting for a slot ends with
    the call's deadline or cancellation."""
    share = current_work.get()
    if share is None or not share.enabled:
        return fn()
    return share.run(current_tenant.get() or "default", fn, stop_of(context))


def stop_of(context: Any) -> StopCheck:
    """The call's stop check (deadline, cancellation); a test double may lack either."""
    return caller_stop(getattr(context, "is_active", lambda: True),
                       getattr(context, "time_remaining", lambda: None))

