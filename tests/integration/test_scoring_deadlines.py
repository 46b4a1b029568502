"""One tenant must not stall every tenant, over real gRPC on loopback (``Compute("irt")``
used to take ``chain_length: 1e9`` and work on after the caller's deadline):
a parameter past its documented bound is INVALID_ARGUMENT naming ``params.<key>`` before any
work; a call with the largest allowed chain and a 0.5 s deadline gets DEADLINE_EXCEEDED and
the server stops working on it (a small call right after answers within 2 s, and the
process's CPU goes quiet); arrays over the element bound are refused from their shapes."""

from __future__ import annotations

import time
from typing import Any

import grpc
import numpy as np
from fortis.core.tensors import array_to_tensor
from fortis.scoring.v1 import scoring_pb2, scoring_pb2_grpc
from fortis.services.scoring.limits import MAX_ARRAY_ELEMENTS, MAX_CHAIN_LENGTH
from google.protobuf import json_format, struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from tests.conftest import MD


def _fields(exc: grpc.RpcError) -> list[str]:
    st = rpc_status.from_call(exc)
    assert st is not None
    for d in st.details:
        br = error_details_pb2.BadRequest()
        if d.Unpack(br):
            return [v.field for v in br.field_violations]
    raise AssertionError("no BadRequest detail")


def _irt_params(chain_length: float, subjects: int = 40, metrics: int = 12) -> struct_pb2.Struct:
    g = np.random.default_rng(0)
    params: dict[str, Any] = {
        "subjects": [f"s{i}" for i in range(subjects)],
        "metrics": [{"name": f"m{j}", "category": f"c{j % 3}",
                     "values": [float(v) for v in g.random(subjects)],
                     "higher_is_better": True} for j in range(metrics)],
        "chain_length": chain_length, "burn_in": 0}
    s = struct_pb2.Struct()
    json_format.ParseDict(params, s)
    return s


def _small_drr(stub: scoring_pb2_grpc.ScoringServiceStub) -> scoring_pb2.ComputeResponse:
    probs = np.random.default_rng(1).dirichlet(np.ones(5), size=8)
    return stub.Compute(scoring_pb2.ComputeRequest(
        metric="drr", arrays={"perturbed_probs": array_to_tensor(probs),
                              "benign_class": array_to_tensor(np.zeros(8, dtype=np.int64))}),
        metadata=MD, timeout=10)


def test_chain_length_past_its_bound_is_refused_naming_the_field(channel: grpc.Channel) -> None:
    stub = scoring_pb2_grpc.ScoringServiceStub(channel)
    t0 = time.monotonic()
    try:
        stub.Compute(scoring_pb2.ComputeRequest(metric="irt", params=_irt_params(1e9)),
                     metadata=MD, timeout=10)
        raise AssertionError("chain_length 1e9 was accepted")
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert _fields(exc) == ["params.chain_length"]
        assert str(MAX_CHAIN_LENGTH) in (exc.details() or "")
    assert time.monotonic() - t0 < 2.0           # refused before any work


def test_deadline_stops_the_largest_allowed_chain(channel: grpc.Channel) -> None:
    stub = scoring_pb2_grpc.ScoringServiceStub(channel)
    request = scoring_pb2.ComputeRequest(metric="irt", params=_irt_params(MAX_CHAIN_LENGTH))
    t0 = time.monotonic()
    try:
        stub.Compute(request, metadata=MD, timeout=0.5)
        raise AssertionError("the largest chain finished within 0.5 s: the test needs more work")
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - t0 < 2.0

    t1 = time.monotonic()
    answer = _small_drr(stub)                    # the server is free right after
    assert time.monotonic() - t1 < 2.0
    assert answer.result.fields

    # The stack runs in this process: were the sampler still going, it would burn about a
    # core-second per second; stopped, the process is close to idle.
    time.sleep(0.3)
    cpu0, wall0 = time.process_time(), time.monotonic()
    time.sleep(1.0)
    cpu = time.process_time() - cpu0
    assert cpu < 0.5 * (time.monotonic() - wall0), f"server still busy: {cpu:.2f} s CPU"


def test_arrays_over_the_element_bound_are_refused_from_the_shapes(
        channel: grpc.Channel) -> None:
    stub = scoring_pb2_grpc.ScoringServiceStub(channel)
    huge = array_to_tensor(np.zeros((1, 2), dtype=np.float32))
    del huge.shape[:]
    huge.shape.extend([MAX_ARRAY_ELEMENTS, 2])   # 8 bytes of data: refused from the shape
    try:
        stub.Compute(scoring_pb2.ComputeRequest(metric="drr", arrays={"perturbed_probs": huge}),
                     metadata=MD, timeout=10)
        raise AssertionError("accepted")
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert _fields(exc) == ["arrays.perturbed_probs.shape"]
