"""Audit log: a real stack's log lines for a refused budget call, an unknown API key and
an evaluation's lifecycle carry tenant, evaluation, target and a request id, and never the
API key."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from fortis.client import FortisClient, progress_of
from fortis.infra.serving.server import channel as make_channel
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common.codec import image_msg

from tests.conftest import API_KEY, MD

PLAN = """
name: audit
seed: 5
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 16}
correctness: {mode: top1}
corruptions:
  - {id: contrast, severities: [1]}
"""




def _events(lines: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [ln for ln in lines if ln.get("event") == name]


def test_audit_lines_of_a_real_stack(stack, captured, fmnist_test_images):
    images, _ = fmnist_test_images
    ch = make_channel(stack.address)
    px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
    # an unknown key: auth_failed with the method and reason, never the key
    with pytest.raises(grpc.RpcError) as ei:
        px.ListTargets(proxy_pb2.ListTargetsRequest(),
                       metadata=(("x-api-key", "secret-wrong-key-123"),
                                 ("x-request-id", "req-auth-1")))
    assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert dict(ei.value.trailing_metadata() or ())["x-request-id"] == "req-auth-1"
    (failed,) = _events(captured, "auth_failed")
    assert failed["reason"] == "unknown_key" and failed["request_id"] == "req-auth-1"
    assert failed["method"].endswith("/ListTargets")

    # a refused budget call: query_refused with tenant, session, target, request id
    sess = px.CreateSession(proxy_pb2.CreateSessionRequest(target="fmnist-cnn", query_budget=2),
                            metadata=MD).session
    req = proxy_pb2.PredictRequest(session_id=sess.session_id, origin="clean",
                                   images=[image_msg(f"i{k}", images[k]) for k in range(3)])
    with pytest.raises(grpc.RpcError) as ei:
        px.Predict(req, metadata=(*MD, ("x-request-id", "req-budget-1")))
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    (refused,) = _events(captured, "query_refused")
    assert refused["reason"] == "budget" and refused["tenant"] == "tenant-a"
    assert refused["session"] == sess.session_id and refused["target"] == "fmnist-cnn"
    assert refused["request_id"] == "req-budget-1"
    # without a caller's id, one is generated and returned
    _, call = px.ListTargets.with_call(proxy_pb2.ListTargetsRequest(), metadata=MD)
    assert len(dict(call.trailing_metadata())["x-request-id"]) == 32

    # an evaluation's lifecycle
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        ev = fc.submit(PLAN, evaluation_id="ev-audit")
        final = fc.wait(ev.evaluation_id)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
    ch.close()
    (created,) = _events(captured, "evaluation_created")
    (started,) = _events(captured, "evaluation_started")
    finished = [ln for ln in _events(captured, "evaluation_finished")
                if ln.get("evaluation_id") == "ev-audit"]
    assert len(finished) == 1
    for line in (created, started, finished[0]):
        assert line["tenant"] == "tenant-a" and line["evaluation_id"] == "ev-audit"
        assert line["target"] == "fmnist-cnn" and line["request_id"]
    assert started["request_id"] == created["request_id"]      # followed into the worker
    assert finished[0]["state"] == "SUCCEEDED" and finished[0]["duration_s"] >= 0

    text = "\n".join(json.dumps(ln, default=str) for ln in captured)
    for key in (API_KEY, "secret-wrong-key-123", stack.internal_key):
        assert key not in text
