"""Two tenants on one real loopback stack, where ids used to be global.

Reproduced first, then fixed:
- tenant B created the proxy session ``<A's evaluation id>/clean`` and made A's evaluation
  fail; ALREADY_EXISTS told B that an id of A's exists while Get said NOT_FOUND;
- an evaluation id ``..`` wrote artifacts outside the artifacts folder.

Now ids live in the tenant's namespace: another tenant's id behaves exactly like a free one
(each tenant may create "X", each sees only its own, a foreign id is NOT_FOUND with the
unknown id's message), ids are restricted to a safe charset (INVALID_ARGUMENT naming the
field, the id never echoed), and artifacts are kept in the evaluation store under the
(tenant, evaluation, name) key (one shared store; names checked, so an export never
writes outside its folder).
"""

from __future__ import annotations

import time

import grpc
import pytest
from fortis.evaluation.v1 import evaluation_pb2 as pb
from fortis.evaluation.v1 import evaluation_pb2_grpc
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common.codec import image_msg
from google.rpc import error_details_pb2

from tests.conftest import MD, OTHER_MD

PLAN = """
name: tenants
seed: 3
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 16}
corruptions: [{id: gaussian_noise, severities: [1]}]
attacks:
  - {id: square, params: {epsilon: 0.05, max_queries: 20}, limit: 4}
execution: {batch_size: 8}
"""
_FINAL = (pb.EVALUATION_STATE_SUCCEEDED, pb.EVALUATION_STATE_FAILED,
          pb.EVALUATION_STATE_CANCELLED)


def _wait(ev_stub, eid: str, md, timeout: float = 240) -> pb.Evaluation:
    deadline = time.time() + timeout
    while time.time() < deadline:
        ev = ev_stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id=eid),
                                   metadata=md).evaluation
        if ev.state in _FINAL:
            return ev
        time.sleep(0.1)
    raise AssertionError(f"{eid} did not end")


def _field(exc: grpc.RpcError) -> str:
    from grpc_status import rpc_status
    st = rpc_status.from_call(exc)
    assert st is not None
    for d in st.details:
        br = error_details_pb2.BadRequest()
        if d.Unpack(br):
            return br.field_violations[0].field
    raise AssertionError("no BadRequest")


@pytest.fixture()
def stubs(channel):
    return (proxy_pb2_grpc.TargetProxyServiceStub(channel),
            evaluation_pb2_grpc.EvaluationServiceStub(channel))


def test_a_foreign_session_id_is_free(stubs, fmnist_test_images):
    px, _ = stubs
    images, _ = fmnist_test_images
    a = px.CreateSession(proxy_pb2.CreateSessionRequest(
        target="fmnist-cnn", session_id="shared/x", query_budget=3), metadata=MD).session
    # B's "shared/x" is its own: other settings, no ALREADY_EXISTS, no hint of A's
    b = px.CreateSession(proxy_pb2.CreateSessionRequest(
        target="fmnist-cnn-label", session_id="shared/x", query_budget=7),
        metadata=OTHER_MD).session
    assert (a.tenant, a.query_budget) == ("tenant-a", 3)
    assert (b.tenant, b.target, b.query_budget) == ("tenant-b", "fmnist-cnn-label", 7)
    px.Predict(proxy_pb2.PredictRequest(session_id="shared/x", origin="o", images=[
        image_msg(f"i{k}", images[k]) for k in range(2)]), metadata=OTHER_MD)
    sa = px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id="shared/x"),
                            metadata=MD)
    sb = px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id="shared/x"),
                            metadata=OTHER_MD)
    assert (sa.queries_ok, sa.session.query_budget) == (0, 3)
    assert (sb.queries_ok, sb.session.queries_used) == (2, 2)
    entries = px.ListLedgerEntries(proxy_pb2.ListLedgerEntriesRequest(session_id="shared/x"),
                                   metadata=MD).entries
    assert list(entries) == []                       # A sees none of B's rows
    # a session only A has is NOT_FOUND for B, worded as an unknown id
    px.CreateSession(proxy_pb2.CreateSessionRequest(target="fmnist-cnn", session_id="only-a"),
                     metadata=MD)
    msgs = []
    for sid in ("only-a", "never-made"):
        for call, req in ((px.GetSession, proxy_pb2.GetSessionRequest(session_id=sid)),
                          (px.GetSessionStats, proxy_pb2.GetSessionStatsRequest(session_id=sid)),
                          (px.ListLedgerEntries,
                           proxy_pb2.ListLedgerEntriesRequest(session_id=sid))):
            with pytest.raises(grpc.RpcError) as ei:
                call(req, metadata=OTHER_MD)
            assert ei.value.code() == grpc.StatusCode.NOT_FOUND
            msgs.append(ei.value.details().replace(sid, "ID"))
    assert len(set(msgs)) == 1


@pytest.mark.parametrize("bad", ["..", "../up", "a/../b", ".x", "a b", "a//b", "x" * (1 << 20)])
def test_unsafe_session_ids_are_refused_bounded(stubs, bad):
    px, _ = stubs
    for call, req in ((px.CreateSession, proxy_pb2.CreateSessionRequest(
            target="fmnist-cnn", session_id=bad)),
            (px.GetSession, proxy_pb2.GetSessionRequest(session_id=bad))):
        with pytest.raises(grpc.RpcError) as ei:
            call(req, metadata=MD)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert _field(ei.value) == "session_id" and len(ei.value.details()) < 1024


@pytest.mark.parametrize("bad", ["..", ".hidden", "a/b", "a b", "é", "x" * 101, "y" * (1 << 20)])
def test_unsafe_evaluation_ids_are_refused_bounded(stubs, bad):
    _, ev = stubs
    with pytest.raises(grpc.RpcError) as ei:
        ev.CreateEvaluation(pb.CreateEvaluationRequest(plan=PLAN, evaluation_id=bad),
                            metadata=MD)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _field(ei.value) == "evaluation_id" and len(ei.value.details()) < 1024
    with pytest.raises(grpc.RpcError) as ei:
        ev.GetEvaluation(pb.GetEvaluationRequest(evaluation_id=bad), metadata=MD)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(ei.value.details()) < 1024


def test_another_tenant_cannot_block_or_see_an_evaluation(stubs, stack):
    """B squats A's future proxy session and evaluation id; A's evaluation still runs, and
    both tenants' "ev-x" run side by side, each with its own items, ledger and artifacts."""
    px, ev = stubs
    # the squat of global ids: B's session "<A's evaluation id>/clean" with a budget of 1
    px.CreateSession(proxy_pb2.CreateSessionRequest(
        target="fmnist-cnn", session_id="ev-x/clean", query_budget=1), metadata=OTHER_MD)
    a = ev.CreateEvaluation(pb.CreateEvaluationRequest(plan=PLAN, evaluation_id="ev-x"),
                            metadata=MD).evaluation
    # B's own "ev-x": no ALREADY_EXISTS, another plan is fine
    b = ev.CreateEvaluation(pb.CreateEvaluationRequest(
        plan=PLAN.replace("seed: 3", "seed: 4"), evaluation_id="ev-x"),
        metadata=OTHER_MD).evaluation
    assert (a.tenant, b.tenant) == ("tenant-a", "tenant-b")
    fa, fb = _wait(ev, "ev-x", MD), _wait(ev, "ev-x", OTHER_MD)
    assert fa.state == pb.EVALUATION_STATE_SUCCEEDED, fa.error.message
    # B's run found its own squatted clean session (budget 1) and failed on it: its problem
    assert fb.state == pb.EVALUATION_STATE_FAILED
    assert "seed: 3" in fa.plan_text and "seed: 4" in fb.plan_text
    for md, tenant in ((MD, "tenant-a"), (OTHER_MD, "tenant-b")):
        listed = ev.ListEvaluations(pb.ListEvaluationsRequest(), metadata=md).evaluations
        assert [(e.evaluation_id, e.tenant) for e in listed] == [("ev-x", tenant)]
    st = px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id="ev-x/clean"),
                            metadata=MD)
    assert st.queries_ok == 16 and st.session.tenant == "tenant-a"
    # artifacts per tenant, in the evaluation store, none on the disk
    store = stack.manager.store
    assert [a.name for a in store.for_tenant("tenant-a").artifacts("ev-x")] == [
        "adversarial/square-00000.npz"]
    assert not (stack.settings.state_dir / "artifacts").exists()
    rep = ev.GetEvaluationReport(pb.GetEvaluationReportRequest(evaluation_id="ev-x"),
                                 metadata=MD)
    assert '"ev-x"' in rep.report_json
    with pytest.raises(grpc.RpcError) as ei:
        ev.GetEvaluationReport(pb.GetEvaluationReportRequest(evaluation_id="ev-x"),
                               metadata=OTHER_MD)
    assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION   # B's own, failed one


def test_artifacts_never_leave_the_export_folder(tmp_path):
    """Even an id that slipped past validation or an attack name that looks like a path
    cannot place an artifact outside the folder it is exported to (with the artifacts
    in the store, names are made safe and checked)."""
    import json
    import os
    import subprocess
    import sys
    from types import SimpleNamespace

    import numpy as np
    from fortis.services.evaluation.stages.base import RunContext
    from fortis.services.evaluation.store import EvaluationStore

    state = tmp_path / "state"
    store = EvaluationStore(state / "evaluations.sqlite").for_tenant("tenant-a")
    img = [np.zeros((2, 2), np.uint8)]
    for n, eid in enumerate(("..", "../../x", "/abs", "ev")):
        store.insert(evaluation_id=eid, tenant="tenant-a", plan_text="p", plan_name="p")
        ctx = SimpleNamespace(store=store, evaluation_id=eid)
        name = RunContext.save_adversarials(ctx, "../../evil name", 0, ["i"], img, img)  # type: ignore[arg-type]
        assert name == "adversarial/_.._evil_name-00000.npz"
        out = tmp_path / "out" / str(n)
        r = subprocess.run([sys.executable, "-m", "fortis.server.cli", "artifacts", "export", eid,
                            "--tenant", "tenant-a", "--state-dir", str(state), "--out",
                            str(out)], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "FORTIS_DATABASE_URL": ""})
        assert r.returncode == 0, r.stderr
        (written,) = json.loads(r.stdout)["files"]
        assert written["path"] == str((out / name).resolve())
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert all(p.is_relative_to(tmp_path / "out") or p.is_relative_to(state) for p in files)
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob("*.npz"))
