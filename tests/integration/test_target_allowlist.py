"""Targets declared with the tenants allowed to use them: targets are tenant-scoped like
everything else, and ListTargets shows only yours.

``--target NAME=builtin:MODEL?tenants=a,b`` (and ``grpc://``, and every registry scheme); no
``tenants`` = every tenant. For a tenant outside the list the target does not exist: ListTargets
does not show it, and GetTargetInfo, CreateSession, Predict and plan validation (IEEE-P3: the
plan names its target) answer exactly what an unknown target's name gets. The internal service
key acting for a tenant (``x-fortis-tenant``) gets that tenant's view. Real stacks on loopback,
a real ``TargetService`` behind the ``grpc://`` target, real SQLite state reused across restarts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from fortis.evaluation.v1 import evaluation_pb2 as epb
from fortis.evaluation.v1 import evaluation_pb2_grpc
from fortis.infra.serving.server import call_metadata
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.server.app.stack import StackSettings, TargetConfig, start_stack, start_target_server
from fortis.services.common import errors
from fortis.services.common.codec import image_msg
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from tests.conftest import API_KEY, MD, OTHER_KEY, OTHER_MD

PLAN = """
name: allow
seed: 1
target: {name: TARGET, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 4}
corruptions: [{id: gaussian_noise, severities: [1]}]
"""


# -- parsing -----------------------------------------------------------------------------------

def test_parse_tenants_on_every_scheme():
    b = TargetConfig.parse("m=builtin:fmnist-cnn?output=top_k&top_k=3&tenants=tenant-a,team.b")
    assert (b.builtin, b.output, b.top_k, b.tenants) == ("fmnist-cnn", "top_k", 3,
                                                         frozenset({"tenant-a", "team.b"}))
    g = TargetConfig.parse("r=grpc://127.0.0.1:7000?rate=5&tenants=tenant-b")
    assert (g.address, g.images_per_second, g.tenants) == ("127.0.0.1:7000", 5.0,
                                                           frozenset({"tenant-b"}))
    # a registry scheme: the allow-list is Fortis's, so the back end's URL no longer carries it
    u = TargetConfig.parse("k=kserve+grpc://127.0.0.1:8001/m?tenants=tenant-a&rate=2")
    assert u.tenants == frozenset({"tenant-a"}) and "tenants" not in u.url
    assert u.url == "kserve+grpc://127.0.0.1:8001/m?rate=2" and u.images_per_second == 2.0
    # no tenants: every tenant may use it (the default, documented in docs/security.md)
    assert TargetConfig.parse("open=builtin:fmnist-cnn").tenants == frozenset()


@pytest.mark.parametrize("bad", ["", ",", "a,,b", "a b", "x" * 65, "é", "../a"])
def test_a_bad_allow_list_is_refused_naming_the_setting(bad):
    with pytest.raises(errors.InvalidArgument) as ei:
        TargetConfig.parse(f"m=builtin:fmnist-cnn?tenants={bad}")
    assert ei.value.violations[0].field == "target"
    assert len(str(ei.value)) < 1024


# -- a stack with allow-lists ------------------------------------------------------------------

def _targets(remote: str, a_only_tenants: str = "tenant-a") -> list[TargetConfig]:
    return [TargetConfig.parse("shared=builtin:fmnist-cnn"),
            TargetConfig.parse(f"a-only=builtin:fmnist-cnn?tenants={a_only_tenants}"),
            TargetConfig.parse("b-label=builtin:fmnist-cnn?output=label_only&tenants=tenant-b,tenant-c"),
            TargetConfig.parse(f"a-remote=grpc://{remote}?tenants=tenant-a")]


def _start(state: Path, targets: list[TargetConfig]):
    return start_stack(StackSettings(
        state_dir=state, api_keys={API_KEY: "tenant-a", OTHER_KEY: "tenant-b"}, targets=targets,
        max_message_bytes=8 * 1024 * 1024))


@pytest.fixture()
def remote(fmnist_target) -> Iterator[str]:
    """A real TargetService on its own loopback port, reached by the proxy over grpc://."""
    srv = start_target_server(TargetConfig.parse("r=builtin:fmnist-cnn"))
    yield srv.address
    srv.stop(0)


@pytest.fixture()
def allow_stack(tmp_path: Path, remote, fmnist_surrogate) -> Iterator:
    s = _start(tmp_path / "state", _targets(remote))
    yield s
    s.stop(0)


@pytest.fixture()
def px(allow_stack) -> Iterator[proxy_pb2_grpc.TargetProxyServiceStub]:
    with grpc.insecure_channel(allow_stack.address) as ch:
        yield proxy_pb2_grpc.TargetProxyServiceStub(ch)


def _names(px, md) -> set[str]:
    return {t.name for t in px.ListTargets(proxy_pb2.ListTargetsRequest(), metadata=md).targets}


def _failure(call, req, md) -> tuple[grpc.StatusCode, str, tuple[str, str]]:
    """(code, message, ResourceInfo) of a failed call."""
    with pytest.raises(grpc.RpcError) as ei:
        call(req, metadata=md)
    st = rpc_status.from_call(ei.value)
    info = ("", "")
    for d in (st.details if st is not None else ()):
        ri = error_details_pb2.ResourceInfo()
        if d.Unpack(ri):
            info = (ri.resource_type, ri.resource_name)
    return ei.value.code(), ei.value.details(), info


def _as_unknown(failure, name: str, unknown: str):
    code, msg, (rtype, rname) = failure
    return code, msg.replace(name, unknown), (rtype, rname.replace(name, unknown))


def test_list_targets_shows_only_the_callers(px, allow_stack):
    assert _names(px, MD) == {"shared", "a-only", "a-remote"}
    assert _names(px, OTHER_MD) == {"shared", "b-label"}
    # the internal service key acting for a tenant gets that tenant's view
    internal = allow_stack.internal_key
    assert _names(px, call_metadata(internal, "tenant-b")) == {"shared", "b-label"}
    assert _names(px, call_metadata(internal, "tenant-a")) == {"shared", "a-only", "a-remote"}
    assert _names(px, call_metadata(internal, "tenant-c")) == {"shared", "b-label"}


@pytest.mark.parametrize("forbidden", ["a-only", "a-remote"])
def test_a_forbidden_target_is_an_unknown_target(px, forbidden):
    # A may use it: info and a session work (the grpc:// one through the real remote server)
    info = px.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target=forbidden), metadata=MD).info
    assert info.labels
    for md in (OTHER_MD,):
        for call, req in (
                (px.GetTargetInfo, lambda t: proxy_pb2.GetTargetInfoRequest(target=t)),
                (px.CreateSession, lambda t: proxy_pb2.CreateSessionRequest(
                    target=t, session_id="s-1", query_budget=5))):
            seen = _failure(call, req(forbidden), md)
            unknown = _failure(call, req("no-such-target"), md)
            assert seen[0] == grpc.StatusCode.NOT_FOUND
            assert _as_unknown(seen, forbidden, "no-such-target") == unknown
    # B's session of the same id on a target it may use is its own and works
    px.CreateSession(proxy_pb2.CreateSessionRequest(target="shared", session_id="s-1"),
                     metadata=OTHER_MD)


def test_plans_naming_a_forbidden_target_fail_validation_like_an_unknown_one(allow_stack):
    with grpc.insecure_channel(allow_stack.address) as ch:
        ev = evaluation_pb2_grpc.EvaluationServiceStub(ch)
        ok = ev.ValidatePlan(epb.ValidatePlanRequest(plan=PLAN.replace("TARGET", "a-only")),
                             metadata=MD)
        assert ok.plan_name == "allow"
        for call, req in ((ev.ValidatePlan, epb.ValidatePlanRequest),
                          (ev.CreateEvaluation, epb.CreateEvaluationRequest)):
            forbidden = _bad_request(call, req(plan=PLAN.replace("TARGET", "a-only")))
            unknown = _bad_request(call, req(plan=PLAN.replace("TARGET", "zz-unknown")))
            assert forbidden[0] == grpc.StatusCode.INVALID_ARGUMENT
            assert forbidden[1] == "target.name"
            assert (forbidden[0], forbidden[1], forbidden[2].replace("a-only", "zz-unknown")) \
                == unknown
            # the message lists what B may use, never A's targets
            assert "a-remote" not in forbidden[2] and "shared" in forbidden[2]
        listed = ev.ListEvaluations(epb.ListEvaluationsRequest(), metadata=OTHER_MD)
        assert list(listed.evaluations) == []


def _bad_request(call, req) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(grpc.RpcError) as ei:
        call(req, metadata=OTHER_MD)
    st = rpc_status.from_call(ei.value)
    fields = []
    for d in (st.details if st is not None else ()):
        br = error_details_pb2.BadRequest()
        if d.Unpack(br):
            fields += [v.field for v in br.field_violations]
    return ei.value.code(), ",".join(fields), ei.value.details()


def test_predict_on_a_target_no_longer_allowed_is_an_unknown_target(tmp_path, remote,
                                                                    fmnist_test_images):
    """A session made while the tenant was allowed; the operator then narrows the allow-list
    (restart on the same state): Predict answers as if the target were gone, and nothing is
    sent (no ledger row)."""
    images, _ = fmnist_test_images
    state = tmp_path / "state"
    batch = [image_msg(f"i{k}", images[k]) for k in range(2)]
    s = _start(state, _targets(remote))
    try:
        with grpc.insecure_channel(s.address) as ch:
            px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
            px.CreateSession(proxy_pb2.CreateSessionRequest(target="a-only", session_id="old"),
                             metadata=MD)
            px.Predict(proxy_pb2.PredictRequest(session_id="old", images=batch), metadata=MD)
    finally:
        s.stop(0)
    answers = []
    for targets in (_targets(remote, a_only_tenants="tenant-c"),          # narrowed
                    [t for t in _targets(remote) if t.name != "a-only"]):  # removed
        s = _start(state, targets)
        try:
            with grpc.insecure_channel(s.address) as ch:
                px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
                answers.append(_failure(px.Predict, proxy_pb2.PredictRequest(
                    session_id="old", images=batch), MD))
                stream = px.PredictStream(iter([proxy_pb2.PredictStreamRequest(
                    request_id="r", session_id="old", images=batch)]), metadata=MD)
                err = next(iter(stream)).error
                answers.append((err.code, err.message))
                rows = px.ListLedgerEntries(proxy_pb2.ListLedgerEntriesRequest(
                    session_id="old"), metadata=MD).entries
                assert len(rows) == 2          # the first run's two images, nothing since
        finally:
            s.stop(0)
    narrowed_unary, narrowed_stream, removed_unary, removed_stream = answers
    assert narrowed_unary[0] == grpc.StatusCode.NOT_FOUND
    assert narrowed_unary == removed_unary and narrowed_stream == removed_stream
    assert narrowed_stream[0] == grpc.StatusCode.NOT_FOUND.value[0]
