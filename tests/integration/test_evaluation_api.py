"""The evaluation service as a first-time caller meets it (issue "One clear house": bugs found
from a client written from the protos alone), over a real loopback server with raw stubs:

- a plan naming a target the server does not have is refused at CreateEvaluation (and by
  ValidatePlan) with the field named, not accepted and failed later;
- NOT_FOUND reads "evaluation 'x' not found" (once), for an unknown id and for another
  tenant's id alike;
- an attack that does not fit the target is refused at CreateEvaluation with the field named;
- WatchEvaluation never goes silent while an evaluation runs (heartbeats) and progress moves
  image by image inside a query attack;
- after CancelEvaluation no late item overwrites "cancelled by a caller";
- page tokens are opaque and validated; pagination reaches every evaluation exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from fortis.evaluation.v1 import evaluation_pb2 as pb
from fortis.evaluation.v1 import evaluation_pb2_grpc
from google.rpc import error_details_pb2

from tests.conftest import API_KEY, MD, OTHER_KEY, OTHER_MD

PLAN = """
name: api-small
seed: 5
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 32}
corruptions: [{id: gaussian_noise, severities: [1]}]
attacks:
  - {id: square, params: {epsilon: 0.05, max_queries: 60}, limit: 8}
execution: {batch_size: 8}
"""


@pytest.fixture()
def quick_stack(tmp_path: Path, fmnist_target, fmnist_surrogate) -> Iterator:
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    s = start_stack(StackSettings(
        state_dir=tmp_path / "state", api_keys={API_KEY: "tenant-a", OTHER_KEY: "tenant-b"},
        targets=[TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn"),
                 TargetConfig.parse("fmnist-cnn-label=builtin:fmnist-cnn?output=label_only")],
        watch_heartbeat_s=0.5))
    yield s
    s.stop(0)


@pytest.fixture()
def stub(quick_stack) -> Iterator[evaluation_pb2_grpc.EvaluationServiceStub]:
    ch = grpc.insecure_channel(quick_stack.address)
    yield evaluation_pb2_grpc.EvaluationServiceStub(ch)
    ch.close()


def _details(exc: grpc.RpcError) -> list:
    from grpc_status import rpc_status
    st = rpc_status.from_call(exc)
    return list(st.details) if st else []


def _violations(details) -> list[str]:
    out = []
    for d in details:
        br = error_details_pb2.BadRequest()
        if d.Unpack(br):
            out += [v.field for v in br.field_violations]
    return out


def _wait(stub, eid: str, md=MD, timeout: float = 240) -> pb.Evaluation:
    deadline = time.time() + timeout
    while time.time() < deadline:
        ev = stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id=eid), metadata=md).evaluation
        if ev.state in (pb.EVALUATION_STATE_SUCCEEDED, pb.EVALUATION_STATE_FAILED,
                        pb.EVALUATION_STATE_CANCELLED):
            return ev
        time.sleep(0.1)
    raise AssertionError(f"{eid} did not end")


def test_a_missing_target_is_refused_at_create(stub):
    bad = PLAN.replace("name: fmnist-cnn,", "name: no-such-model,")
    for call, req in ((stub.CreateEvaluation, pb.CreateEvaluationRequest(plan=bad)),
                      (stub.ValidatePlan, pb.ValidatePlanRequest(plan=bad))):
        with pytest.raises(grpc.RpcError) as ei:
            call(req, metadata=MD)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert _violations(_details(ei.value)) == ["target.name"]
        assert "no-such-model" in ei.value.details() and "fmnist-cnn" in ei.value.details()
    ok = stub.ValidatePlan(pb.ValidatePlanRequest(plan=PLAN), metadata=MD)
    assert (ok.plan_name, ok.corruptions, ok.attacks) == ("api-small", 1, 1)
    assert stub.ListEvaluations(pb.ListEvaluationsRequest(), metadata=MD).evaluations == []


def test_not_found_reads_once_and_another_tenants_id_is_unknown(stub):
    ev = stub.CreateEvaluation(pb.CreateEvaluationRequest(plan=PLAN), metadata=MD).evaluation
    stub.CancelEvaluation(pb.CancelEvaluationRequest(evaluation_id=ev.evaluation_id), metadata=MD)
    msgs = []
    for eid, md in (("ev-nope", MD), (ev.evaluation_id, OTHER_MD)):
        with pytest.raises(grpc.RpcError) as ei:
            stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id=eid), metadata=md)
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND
        assert ei.value.details() == f"evaluation '{eid}' not found"
        msgs.append(ei.value.details().replace(eid, "ID"))
    assert msgs[0] == msgs[1]       # another tenant's id behaves exactly as an unknown one


def test_an_attack_that_does_not_fit_the_target_is_refused_with_its_field(stub):
    """A score-based attack on a labels-only target (IEEE-A8) is refused at CreateEvaluation
    and ValidatePlan (it was a FAILED run before) with the BadRequest field violation
    naming ``attacks[0].id``; nothing is created. (A failed evaluation keeping its status
    details is checked in test_tenant_quotas.py: RESOURCE_EXHAUSTED with QuotaFailure.)"""
    bad = PLAN.replace("name: fmnist-cnn,", "name: fmnist-cnn-label,")
    for call, req in ((stub.CreateEvaluation, pb.CreateEvaluationRequest(plan=bad)),
                      (stub.ValidatePlan, pb.ValidatePlanRequest(plan=bad))):
        with pytest.raises(grpc.RpcError) as ei:
            call(req, metadata=MD)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert _violations(_details(ei.value)) == ["attacks[0].id"]
        assert "fmnist-cnn-label" in ei.value.details() and len(ei.value.details()) < 1024
    assert stub.ListEvaluations(pb.ListEvaluationsRequest(), metadata=MD).evaluations == []


def test_watch_never_goes_silent_and_moves_inside_an_attack(stub):
    ev = stub.CreateEvaluation(pb.CreateEvaluationRequest(plan=PLAN), metadata=MD).evaluation
    times, attack_images = [], []
    for resp in stub.WatchEvaluation(pb.WatchEvaluationRequest(evaluation_id=ev.evaluation_id),
                                     metadata=MD, timeout=240):
        times.append(time.monotonic())
        p = resp.evaluation.progress
        if p.stage == pb.STAGE_QUERY_ATTACKS:
            attack_images.append((p.items_done, p.images_done))
    assert resp.evaluation.state == pb.EVALUATION_STATE_SUCCEEDED
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert max(gaps) < 0.5 + 1.5          # heartbeat 0.5 s (+ scheduling slack on 2 cores)
    # inside the one query-attack item (8 images), images_done moved before the item ended
    within = {img for items, img in attack_images if items == attack_images[0][0]}
    assert len(within) >= 2, attack_images
    final = resp.evaluation.progress
    assert final.images_total == 32 + 32 + 8 and final.images_done == final.images_total


def test_cancel_is_never_overwritten_by_a_late_item(stub):
    plan = PLAN.replace("limit: 32}", "limit: 400}").replace("severities: [1]", "severities: [1, 2, 3, 4, 5]")
    ev = stub.CreateEvaluation(pb.CreateEvaluationRequest(plan=plan), metadata=MD).evaluation
    deadline = time.time() + 120
    while time.time() < deadline:
        cur = stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id=ev.evaluation_id), metadata=MD).evaluation
        if cur.progress.stage == pb.STAGE_CORRUPTIONS:
            break
        time.sleep(0.02)
    c = stub.CancelEvaluation(pb.CancelEvaluationRequest(evaluation_id=ev.evaluation_id), metadata=MD).evaluation
    assert c.state == pb.EVALUATION_STATE_CANCELLED
    time.sleep(1.5)                      # an item in flight finishes meanwhile
    later = stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id=ev.evaluation_id), metadata=MD).evaluation
    assert later.state == pb.EVALUATION_STATE_CANCELLED
    assert later.progress.message == "cancelled by a caller"
    assert later.progress.items_done == c.progress.items_done


def test_page_tokens_are_opaque_and_pagination_is_complete(stub):
    ids = set()
    for _ in range(3):
        ev = stub.CreateEvaluation(pb.CreateEvaluationRequest(plan=PLAN), metadata=MD).evaluation
        stub.CancelEvaluation(pb.CancelEvaluationRequest(evaluation_id=ev.evaluation_id), metadata=MD)
        ids.add(ev.evaluation_id)
    seen, token = [], ""
    while True:
        r = stub.ListEvaluations(pb.ListEvaluationsRequest(page_size=1, page_token=token), metadata=MD)
        seen += [e.evaluation_id for e in r.evaluations]
        token = r.next_page_token
        if not token:
            break
        float_like = True
        try:
            float(token)
        except ValueError:
            float_like = False
        assert not float_like
    assert sorted(seen) == sorted(ids) and len(seen) == 3
    assert stub.ListEvaluations(pb.ListEvaluationsRequest(), metadata=OTHER_MD).evaluations == []
    for bad in ("nan", "inf", "1795458120.5", "x" * 5000, "eyJrIjoidGFyZ2V0cyIsIm8iOjF9",
                "eyJrIjogImV2YWx1YXRpb25zIiwgInQiOiAibmFuIiwgImlkIjogIiJ9"):
        with pytest.raises(grpc.RpcError) as ei:
            stub.ListEvaluations(pb.ListEvaluationsRequest(page_token=bad), metadata=MD)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert _violations(_details(ei.value)) == ["page_token"]
    with pytest.raises(grpc.RpcError) as ei:
        stub.ListEvaluations(pb.ListEvaluationsRequest(page_size=100000), metadata=MD)
    assert _violations(_details(ei.value)) == ["page_size"]
