"""Every numeric request field of every RPC, one past its documented limit (bounded work:
bad input is INVALID_ARGUMENT naming the field), over real gRPC on the
loopback stack of every service.

Systematic, not random (helper D's hypothesis suite in tests/fuzz/ fuzzes): for each numeric
field that services/common/limits.py bounds, a request with just that field set to limit + 1
(or limit - 1 when limit + 1 does not fit the wire type), and, for floating-point fields, NaN
and +Inf. Each must answer INVALID_ARGUMENT whose BadRequest names that field as the caller
wrote it (``images[0].tensor.shape[0]``, ``setting.query_attack.queries[0]``), within a second,
and the server keeps serving. ApplyPerturbationStream answers in band (the stream goes on).

Not sent here: the TargetService (served by the adapters' own servers, not the stack) and the
proxy's bidirectional PredictStream, whose messages the servicer checks as it decodes them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from fortis.evaluation.v1 import evaluation_pb2, uploads_pb2
from fortis.perturbation.v1 import perturbation_pb2
from fortis.proxy.v1 import proxy_pb2
from fortis.report.v1 import report_pb2
from fortis.scoring.v1 import scoring_pb2
from fortis.services.common import limits
from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from tests.conftest import MD

MODULES = (evaluation_pb2, uploads_pb2, perturbation_pb2, proxy_pb2, report_pb2, scoring_pb2)
_WIRE = {FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
         FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
         FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
         FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
         FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1), FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1)}
_FLOATS = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)
#: Bidirectional streams the stack does not check on the walk (see the module docstring).
_NOT_SENT = {"fortis.proxy.v1.TargetProxyService.PredictStream"}


@dataclass(frozen=True)
class Case:
    method: MethodDescriptor
    path: str                 # as limits.request_fields writes it
    value: Any
    expected_field: str

    @property
    def id(self) -> str:
        return f"{self.method.name}:{self.path}={self.value!r}"


def _bad_values(fd: FieldDescriptor, lim: limits.Limit) -> list[Any]:
    assert lim.lo is not None and lim.hi is not None
    if fd.type in _FLOATS:
        return [math.nan, math.inf, float(lim.hi) * 2 + 1]
    lo, hi = _WIRE[fd.type]
    if lim.hi + 1 <= hi:
        return [int(lim.hi) + 1]
    if lim.lo - 1 >= lo:
        return [int(lim.lo) - 1]
    return []


def _cases() -> list[Case]:
    out = []
    for mod in MODULES:
        for svc in mod.DESCRIPTOR.services_by_name.values():
            for m in svc.methods:
                if m.full_name in _NOT_SENT:
                    continue
                for path, fd in limits.request_fields(m.input_type):
                    lim = limits.limit_for(fd)
                    if lim is None or lim.kind not in ("integer", "number"):
                        continue
                    expected = path.replace("[].value.", ".a.").replace("[]", "[0]")
                    if fd.is_repeated:
                        expected += "[0]"
                    out += [Case(m, path, v, expected) for v in _bad_values(fd, lim)]
    return out


CASES = _cases()


def _request(case: Case) -> Any:
    """The method's request with only ``case.path`` set (one entry of each list on the way)."""
    root = message_factory.GetMessageClass(case.method.input_type)()
    msg: Any = root
    parts = case.path.split(".")
    skip = False
    for part in parts[:-1]:
        if skip:                                        # a map entry's "value"
            skip = False
            continue
        name = part.removesuffix("[]")
        fd = msg.DESCRIPTOR.fields_by_name[name]
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            msg, skip = getattr(msg, name)["a"], True   # named arrays.a.<field>
        elif part.endswith("[]"):
            msg = getattr(msg, name).add()
        else:
            msg = getattr(msg, name)
    leaf = parts[-1]
    fd = msg.DESCRIPTOR.fields_by_name[leaf]
    if fd.is_repeated:
        getattr(msg, leaf).append(case.value)
    else:
        setattr(msg, leaf, case.value)
    return root


def _call(channel: grpc.Channel, case: Case, request: Any) -> Any:
    m = case.method
    name = f"/{m.containing_service.full_name}/{m.name}"
    out_cls = message_factory.GetMessageClass(m.output_type)
    kw = {"request_serializer": type(request).SerializeToString,
          "response_deserializer": out_cls.FromString}
    if m.client_streaming and m.server_streaming:
        return list(channel.stream_stream(name, **kw)(iter([request]), metadata=MD, timeout=10))
    if m.client_streaming:
        return channel.stream_unary(name, **kw)(iter([request]), metadata=MD, timeout=10)
    if m.server_streaming:
        return list(channel.unary_stream(name, **kw)(request, metadata=MD, timeout=10))
    return channel.unary_unary(name, **kw)(request, metadata=MD, timeout=10)


def _fields_of(status: status_pb2.Status) -> list[str]:
    for d in status.details:
        br = error_details_pb2.BadRequest()
        if d.Unpack(br):
            return [v.field for v in br.field_violations]
    raise AssertionError(f"no BadRequest detail in {status.message[:200]!r}")


def test_the_cases_cover_every_service() -> None:
    services = {c.method.containing_service.name for c in CASES}
    assert services == {"PerturbationService", "TargetProxyService", "ScoringService",
                        "ReportService", "EvaluationService", "UploadService"}
    assert len(CASES) > 60


@pytest.fixture(scope="module")
def module_stack(tmp_path_factory: pytest.TempPathFactory, fmnist_target,
                 fmnist_surrogate) -> Iterator[grpc.Channel]:
    """One stack for all cases (each case is one refused call)."""
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    from tests.conftest import API_KEY, OTHER_KEY

    s = start_stack(StackSettings(
        state_dir=tmp_path_factory.mktemp("state"),
        api_keys={API_KEY: "tenant-a", OTHER_KEY: "tenant-b"},
        targets=[TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn")]))
    ch = grpc.insecure_channel(s.address)
    yield ch
    ch.close()
    s.stop(0)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_one_past_the_limit_is_refused_naming_the_field(module_stack: grpc.Channel,
                                                        case: Case) -> None:
    request = _request(case)
    t0 = time.monotonic()
    try:
        answer = _call(module_stack, case, request)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details())
        status = rpc_status.from_call(exc)
        assert status is not None
        assert case.expected_field in _fields_of(status), (status.message, case.expected_field)
        assert len(exc.details() or "") < 2000
    else:
        # Only a bidirectional stream answers in band.
        assert case.method.client_streaming and case.method.server_streaming, answer
        assert len(answer) == 1 and answer[0].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert case.expected_field in _fields_of(answer[0].error)
    assert time.monotonic() - t0 < 2.0


def test_the_stack_still_serves_after_every_case(module_stack: grpc.Channel) -> None:
    from fortis.perturbation.v1 import perturbation_pb2_grpc

    stub = perturbation_pb2_grpc.PerturbationServiceStub(module_stack)
    assert stub.ListAttacks(perturbation_pb2.ListAttacksRequest(), metadata=MD,
                            timeout=10).attacks
