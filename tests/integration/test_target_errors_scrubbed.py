"""Tenants see a target's name, operators its address: a real gRPC TargetService on loopback
fails with a message quoting its own address, a URL, a file path, a stack trace and a fake
secret. The tenant's Predict error, the ledger rows it can read, the evaluation's failure and
its report carry the target's NAME, a status code, a fixed reason and a correlation id, and
none of that text; the operator's log line under the same correlation id has all of it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from fortis.client import FortisClient
from fortis.common.v1 import common_pb2
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.target.v1 import target_pb2, target_pb2_grpc

from tests.conftest import API_KEY, MD

SECRET = "sk-FAKE-SECRET-0123456789"
PATH = "/srv/models/private/weights.pt"
URL = "http://10.9.8.7:8080/v1/predict"


class LeakyTarget(target_pb2_grpc.TargetServiceServicer):
    """A classifier whose Predict fails with ``code``, its message full of what a tenant
    must not read."""

    def __init__(self) -> None:
        self.address = ""
        self.code = grpc.StatusCode.INTERNAL

    def GetTargetInfo(self, request: Any, context: Any) -> target_pb2.GetTargetInfoResponse:
        return target_pb2.GetTargetInfoResponse(info=target_pb2.TargetInfo(
            name="leaky", task_type=common_pb2.TASK_TYPE_CLASSIFICATION,
            labels=[f"c{i}" for i in range(10)], output_kind=common_pb2.OUTPUT_KIND_FULL_SCORES,
            input=target_pb2.InputSpec(height=28, width=28, channels=1, max_batch_size=64)))

    def Predict(self, request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(self.code, (
            f"model server {self.address} could not load {PATH} (upstream {URL}, "
            f"api_key={SECRET})\nTraceback (most recent call last):\n  File \"/opt/app/"
            "serve.py\", line 12, in predict\nRuntimeError: CUDA out of memory"))


def _leaks(text: str, address: str) -> list[str]:
    port = address.rsplit(":", 1)[1]
    return [n for n in (address, f":{port}", PATH, "/srv/", URL, "10.9.8.7", SECRET,
                        "Traceback", "serve.py", "CUDA") if n in text]




@pytest.fixture()
def world(tmp_path: Path) -> Iterator[tuple[LeakyTarget, str, Any]]:
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack
    servicer = LeakyTarget()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    target_pb2_grpc.add_TargetServiceServicer_to_server(servicer, server)
    servicer.address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    stack = start_stack(StackSettings(
        state_dir=tmp_path / "state", api_keys={API_KEY: "tenant-a"},
        targets=[TargetConfig.parse(f"remote=grpc://{servicer.address}")]))
    yield servicer, servicer.address, stack
    stack.stop(0)
    server.stop(0)


def _image(k: int) -> common_pb2.Image:
    return common_pb2.Image(image_id=f"i{k}", tensor=common_pb2.Tensor(
        dtype=common_pb2.D_TYPE_UINT8, shape=[28, 28, 1], data=bytes([k]) * 784))


def _correlation(text: str) -> str:
    m = re.search(r"correlation id ([0-9a-f]{16})", text)
    assert m, text
    return m.group(1)


@pytest.mark.parametrize("code", [grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE])
def test_predict_error_and_ledger_name_the_target_only(world, captured, code):
    servicer, address, stack = world
    servicer.code = code
    with grpc.insecure_channel(stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        px.CreateSession(proxy_pb2.CreateSessionRequest(target="remote", session_id="s"),
                         metadata=MD)
        with pytest.raises(grpc.RpcError) as info:
            px.Predict(proxy_pb2.PredictRequest(session_id="s", origin="t",
                                                images=[_image(1), _image(2)]),
                       metadata=MD, timeout=60)
        rows = list(px.ListLedgerEntries(proxy_pb2.ListLedgerEntriesRequest(
            session_id="s", page_size=100), metadata=MD).entries)
    said = info.value.details()
    assert "target 'remote'" in said and code.name in said
    assert _leaks(said, address) == [] and len(said) <= 1024
    cid = _correlation(said)
    assert rows and all(_leaks(r.error, address) == [] for r in rows)
    assert any(cid in r.error for r in rows)
    # the operator's line: the same id, the whole story
    ops = [ln for ln in captured if ln.get("event") == "target_error"
           and ln.get("correlation_id") == cid]
    assert len(ops) == 1 and ops[0]["target"] == "remote"
    assert address in ops[0]["detail"] and SECRET in ops[0]["detail"] \
        and PATH in ops[0]["detail"]


def test_evaluation_failure_and_report_name_the_target_only(world, captured):
    servicer, address, stack = world
    plan = """
name: leaky
seed: 2
target: {name: remote, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 4}
corruptions:
  - {id: contrast, severities: [1]}
"""
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        ev = fc.submit(plan, evaluation_id="ev-leaky")
        final = fc.wait(ev.evaluation_id, timeout_s=240)
        seen = json.dumps(final.__dict__, default=str)
        try:
            seen += json.dumps(fc.report(ev.evaluation_id), default=str)
        except Exception as exc:  # noqa: BLE001 - a failed evaluation may have no report
            seen += str(exc)
    assert "remote" in seen and _leaks(seen, address) == [], _leaks(seen, address)
    ids = set(re.findall(r"correlation id ([0-9a-f]{16})", seen))
    assert ids, seen[:2000]
    logged = {ln.get("correlation_id") for ln in captured if ln.get("event") == "target_error"}
    assert ids <= logged
