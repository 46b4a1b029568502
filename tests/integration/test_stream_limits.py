"""Bidirectional streams check every message against the documented limits in band (bounded
work; ``services/common/limits.py``): the proxy's and the target adapter's
``PredictStream`` answer an over-limit message with an ``error`` naming the field, never echo
an over-long ``request_id``, and go on answering the next message of the same stream."""

from __future__ import annotations

from typing import Any

import grpc
from fortis.common.v1 import common_pb2
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common import limits
from fortis.target.v1 import target_pb2, target_pb2_grpc
from google.rpc import code_pb2, error_details_pb2

from tests.conftest import MD


def _img(i: int) -> common_pb2.Image:
    return common_pb2.Image(image_id=f"i{i}", tensor=common_pb2.Tensor(
        dtype=common_pb2.D_TYPE_UINT8, shape=[28, 28, 1], data=bytes([i % 256]) * 784))


def _fields(status: Any) -> list[str]:
    out = []
    for d in status.details:
        br = error_details_pb2.BadRequest()
        if d.Unpack(br):
            out += [v.field for v in br.field_violations]
    return out


def _check(answers: list[Any]) -> None:
    long_id, too_many, fine = answers
    assert long_id.request_id == "" and long_id.error.code == code_pb2.INVALID_ARGUMENT
    assert "request_id" in _fields(long_id.error)
    assert too_many.request_id == "many" and too_many.error.code == code_pb2.INVALID_ARGUMENT
    assert "images" in _fields(too_many.error)
    assert fine.request_id == "ok" and not fine.HasField("error")
    assert [p.image_id for p in fine.predictions] == ["i0", "i1"]


def test_proxy_predict_stream_checks_each_message_in_band(channel: grpc.Channel) -> None:
    stub = proxy_pb2_grpc.TargetProxyServiceStub(channel)
    stub.CreateSession(proxy_pb2.CreateSessionRequest(target="fmnist-cnn", session_id="stream-lim",
                                                      query_budget=10), metadata=MD)
    n = limits.MAX_IMAGES_PER_REQUEST + 1
    reqs = [proxy_pb2.PredictStreamRequest(request_id="r" * (limits.MAX_ID_CHARS + 1),
                                           session_id="stream-lim", images=[_img(0)]),
            proxy_pb2.PredictStreamRequest(request_id="many", session_id="stream-lim",
                                           images=[_img(i) for i in range(n)]),
            proxy_pb2.PredictStreamRequest(request_id="ok", session_id="stream-lim",
                                           images=[_img(0), _img(1)])]
    _check(list(stub.PredictStream(iter(reqs), metadata=MD, timeout=60)))
    stats = stub.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id="stream-lim"),
                                 metadata=MD)
    assert stats.queries_ok == 2          # the refused messages sent nothing to the target


def test_target_adapter_predict_stream_checks_each_message_in_band(fmnist_target: Any) -> None:
    from fortis.server.app.stack import TargetConfig, start_target_server
    server = start_target_server(TargetConfig.parse("t=builtin:fmnist-cnn"),
                                 max_message_bytes=8 * 1024 * 1024)
    try:
        with grpc.insecure_channel(server.address) as ch:
            n = limits.MAX_IMAGES_PER_REQUEST + 1
            reqs = [target_pb2.PredictStreamRequest(request_id="r" * (limits.MAX_ID_CHARS + 1),
                                                    images=[_img(0)]),
                    target_pb2.PredictStreamRequest(request_id="many",
                                                    images=[_img(i) for i in range(n)]),
                    target_pb2.PredictStreamRequest(request_id="ok", images=[_img(0), _img(1)])]
            _check(list(target_pb2_grpc.TargetServiceStub(ch).PredictStream(iter(reqs),
                                                                            timeout=60)))
    finally:
        server.stop(0)
