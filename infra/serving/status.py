"""Domain errors as google.rpc.Status messages (protobuf only, no gRPC).

Used by the server interceptor for whole-call failures and by streaming servicers for
per-item failures carried in a response's ``error`` field. ``status_for`` is the one
conversion, ``fortis.client.errors.to_status`` (rich details, bounded message, nothing of an
unexpected exception leaked); ``error_for`` is its inverse.
"""

from __future__ import annotations

from fortis.client.errors import from_status, to_status

#: The google.rpc.Status (with rich details) a domain error becomes.
status_for = to_status
#: The domain error a google.rpc.Status stands for (e.g. a per-item ``error`` field).
error_for = from_status

__all__ = ["error_for", "status_for"]
