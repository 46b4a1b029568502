"""Domain errors as google.rpc.Status messages (protobuf only, no gRPC).

Used by the server interceptor for whole-call failures and by streaming servicers for
per-item failures carried in a response's ``error`` field.
"""

from __future__ import annotations

from typing import Any

from fortis.services.common import errors
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2


def status_for(exc: BaseException) -> status_pb2.Status:
    """The google.rpc.Status (with rich details) a domain error becomes."""
    details: list[Any] = []
    if isinstance(exc, errors.InvalidArgument):
        code = code_pb2.INVALID_ARGUMENT
        br = error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
            for v in exc.violations])
        details.append(br)
    elif isinstance(exc, errors.BudgetExhausted):
        code = code_pb2.RESOURCE_EXHAUSTED
        details.append(error_details_pb2.QuotaFailure(violations=[
            error_details_pb2.QuotaFailure.Violation(subject=v.subject, description=v.description)
            for v in exc.violations]))
    elif isinstance(exc, errors.NotFound):
        code = code_pb2.NOT_FOUND
        details.append(error_details_pb2.ResourceInfo(
            resource_type=exc.resource_type, resource_name=exc.name))
    elif isinstance(exc, errors.AlreadyExists):
        code = code_pb2.ALREADY_EXISTS
    elif isinstance(exc, errors.FailedPrecondition):
        code = code_pb2.FAILED_PRECONDITION
    elif isinstance(exc, errors.Unavailable):
        code = code_pb2.UNAVAILABLE
    elif isinstance(exc, errors.Unauthenticated):
        code = code_pb2.UNAUTHENTICATED
    elif isinstance(exc, errors.FortisError):
        code = code_pb2.INTERNAL
    else:
        return status_pb2.Status(code=code_pb2.INTERNAL, message="internal error")
    packed = []
    for d in details:
        a = any_pb2.Any()
        a.Pack(d)
        packed.append(a)
    return status_pb2.Status(code=code, message=str(exc), details=packed)
