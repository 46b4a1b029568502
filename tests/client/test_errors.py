"""The one error model (fortis.client.errors): every error survives exception -> Status ->
exception as the same class with the same details; unknown exceptions leak nothing."""

from __future__ import annotations

import grpc
import pytest
from fortis.client import errors as E
from fortis.infra.serving.status import status_for
from fortis.services.common import errors as domain
from google.rpc import code_pb2, error_details_pb2

CASES: list[tuple[E.FortisError, int]] = [
    (E.InvalidArgument("plan.seed", "must be an integer",
                       [E.FieldViolation("dataset.limit", "must be >= 1")]), code_pb2.INVALID_ARGUMENT),
    (E.NotFound("evaluation", "ev-x"), code_pb2.NOT_FOUND),
    (E.AlreadyExists("evaluation 'ev-1' exists with another plan"), code_pb2.ALREADY_EXISTS),
    (E.FailedPrecondition("evaluation is RUNNING"), code_pb2.FAILED_PRECONDITION),
    (E.BudgetExhausted([E.QuotaViolation("session s1", "budget 10 used"),
                        E.QuotaViolation("image 7", "per-image budget 2 used")]),
     code_pb2.RESOURCE_EXHAUSTED),
    (E.Unavailable("target down", retry_after_s=1.5), code_pb2.UNAVAILABLE),
    (E.Unavailable("target down"), code_pb2.UNAVAILABLE),
    (E.Unauthenticated("unknown API key"), code_pb2.UNAUTHENTICATED),
    (E.PermissionDenied("another tenant's evaluation"), code_pb2.PERMISSION_DENIED),
    (E.DeadlineExceeded("too slow"), code_pb2.DEADLINE_EXCEEDED),
    (E.Cancelled("cancelled"), code_pb2.CANCELLED),
    (E.Internal("bug"), code_pb2.INTERNAL),
]

ATTRS = ("message", "violations", "resource_type", "name", "retry_after_s")


def _attrs(exc: E.FortisError) -> dict[str, object]:
    return {a: getattr(exc, a) for a in ATTRS if hasattr(exc, a)}


@pytest.mark.parametrize(("exc", "code"), CASES, ids=lambda c: type(c).__name__)
def test_round_trip_keeps_class_and_details(exc: E.FortisError, code: int) -> None:
    status = E.to_status(exc)
    assert status.code == code == E.code_for(exc) == exc.code
    assert E.class_for(code) is type(exc)
    back = E.from_status(status)
    assert type(back) is type(exc)
    assert _attrs(back) == _attrs(exc)
    assert str(back) == str(exc)


def test_not_found_names_the_resource_once() -> None:
    back = E.from_status(E.to_status(E.NotFound("evaluation", "x")))
    assert back.message == "evaluation 'x' not found"
    assert (back.resource_type, back.name) == ("evaluation", "x")


def test_domain_module_re_exports_the_same_classes() -> None:
    assert domain.InvalidArgument is E.InvalidArgument and domain.NotFound is E.NotFound
    assert status_for is E.to_status
    assert domain.FortisError("plain").message == "plain"
    assert E.code_for(domain.FortisError("plain")) == code_pb2.INTERNAL


def test_subclass_inherits_its_base_code() -> None:
    class TargetDown(E.Unavailable):
        pass

    status = E.to_status(TargetDown("gone"))
    assert status.code == code_pb2.UNAVAILABLE
    assert type(E.from_status(status)) is E.Unavailable


@pytest.mark.parametrize("exc", [RuntimeError("secret /etc/passwd at 0xdeadbeef"),
                                 KeyError("db-password"), ZeroDivisionError()])
def test_unknown_exceptions_are_internal_and_leak_nothing(exc: BaseException) -> None:
    status = E.to_status(exc)
    assert status.code == code_pb2.INTERNAL and E.code_for(exc) == code_pb2.INTERNAL
    assert status.message == "internal error" and not status.details
    back = E.from_status(status)
    assert isinstance(back, E.Internal) and str(back) == "internal error"


def test_huge_inputs_are_never_echoed_back_whole() -> None:
    huge = "x" * 1_000_000
    for exc in (E.NotFound("evaluation", huge), E.InvalidArgument("evaluation_id", huge),
                E.FailedPrecondition(huge)):
        status = E.to_status(exc)
        assert len(status.message.encode()) <= E.MAX_MESSAGE_BYTES
        assert status.ByteSize() < 4096
    many = E.InvalidArgument.from_violations(
        [E.FieldViolation(f"f{i}", "bad") for i in range(1000)])
    assert E.to_status(many).ByteSize() < 4096


def test_error_info_names_the_class() -> None:
    status = E.to_status(E.BudgetExhausted([E.QuotaViolation("s", "d")]))
    infos = []
    for a in status.details:
        info = error_details_pb2.ErrorInfo()
        if a.Unpack(info):
            infos.append(info)
    assert [(i.reason, i.domain) for i in infos] == [("BUDGET_EXHAUSTED", "fortis")]


def test_foreign_statuses() -> None:
    bare = E.from_status(E.status_pb2.Status(code=code_pb2.NOT_FOUND, message="no such thing"))
    assert isinstance(bare, E.NotFound) and bare.message == "no such thing"
    bare_ia = E.from_status(E.status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message="bad"))
    assert isinstance(bare_ia, E.InvalidArgument) and bare_ia.violations[0].field == "request"
    odd = E.from_status(E.status_pb2.Status(code=code_pb2.UNIMPLEMENTED, message="nope"))
    assert type(odd) is E.FortisError and odd.code == code_pb2.UNIMPLEMENTED
    assert "UNIMPLEMENTED" in str(odd)


class _FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def test_from_rpc_error_without_rich_details() -> None:
    err = E.from_rpc_error(_FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
    assert isinstance(err, E.DeadlineExceeded) and err.message == "Deadline Exceeded"
    err = E.from_rpc_error(_FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    assert isinstance(err, E.Unavailable)


def test_target_failed_keeps_its_own_reason_and_its_base_code() -> None:
    """Transient and permanent target errors are told apart: a permanent target failure
    is FAILED_PRECONDITION (its base's code) but comes back as ``TargetFailed`` (ErrorInfo
    reason TARGET_FAILED), so an evaluation records it per query while a plain
    FailedPrecondition still ends the evaluation."""
    st = status_for(E.TargetFailed("target 'x' failed (not retried): bad answer"))
    assert st.code == code_pb2.FAILED_PRECONDITION
    info = error_details_pb2.ErrorInfo()
    assert any(d.Unpack(info) and info.reason == "TARGET_FAILED" for d in st.details)
    back = E.from_status(st)
    assert type(back) is E.TargetFailed and isinstance(back, E.FailedPrecondition)
    plain = E.from_status(status_for(E.FailedPrecondition("report of a running job")))
    assert type(plain) is E.FailedPrecondition
