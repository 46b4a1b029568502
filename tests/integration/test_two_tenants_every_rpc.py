"""Two tenants, every RPC: this adversarial module covers the tenant isolation of every RPC
(everything is tenant-scoped).

Tenant A owns evaluations (one finished with a report and artifacts, one running, one
cancelled), proxy sessions with ledger rows, and a target only A may use. Tenant B, with its
own valid API key, attacks each RPC of each service with A's ids: read, list, watch, cancel,
reuse (create the same id), exhaust (budgets, rate), and replay A's page tokens. For every
RPC B gets exactly what an unknown id gets (same code, same message once the id is swapped,
same rich details), never A's data, and A's state, budget, rate and results do not move.

The RPCs are enumerated from the contracts (every ``service`` in ``protos/fortis/**.proto``
via its generated descriptor), so a new RPC without a case here fails
``test_two_tenant_case[<its name>]``. Services that hold no tenant state (catalogues, scoring,
report rendering, perturbations) get a case too: B's answer to A's exact request equals A's
(nothing tenant-specific is kept or returned). The client is written from the protos alone:
raw generated stubs, ``x-api-key`` metadata and hand-built tensors, no Fortis SDK.
Real parts: one stack on loopback, real SQLite state, the project's Fashion-MNIST CNN.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf import json_format, struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

ROOT = Path(__file__).resolve().parents[2]
KEY_A, KEY_B = "two-tenants-key-a", "two-tenants-key-b"
MD_A, MD_B = (("x-api-key", KEY_A),), (("x-api-key", KEY_B),)
#: B's own rate (images/s across every target): B's heavy use is capped by it.
B_RATE = 10.0
#: The shared, rate-limited target (images/s at the target, all tenants together).
SHARED_RATE = 40.0

PLAN = """
name: two-tenants
seed: 5
target: {name: TARGET, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 12}
corruptions: [{id: gaussian_noise, severities: [1]}]
attacks:
  - {id: square, params: {epsilon: 0.05, max_queries: 15}, limit: 3}
execution: {batch_size: 6}
"""
SLOW_PLAN = """
name: two-tenants-slow
seed: 6
target: {name: slow, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 256}
corruptions: [{id: gaussian_noise, severities: [1, 2, 3]}]
execution: {batch_size: 8}
"""


# -- the contracts: every RPC of every service ---------------------------------------------------

def _proto_modules() -> list[Any]:
    mods = []
    for proto in sorted((ROOT / "protos" / "fortis").rglob("*.proto")):
        rel = proto.relative_to(ROOT / "protos").with_suffix("")
        mods.append(importlib.import_module(".".join(rel.parts) + "_pb2"))
    return mods


def _all_rpcs() -> list[str]:
    return sorted(f"{svc.full_name}/{m.name}" for mod in _proto_modules()
                  for svc in mod.DESCRIPTOR.services_by_name.values() for m in svc.methods)


def _pb(area: str, name: str = "") -> Any:
    return importlib.import_module(f"fortis.{area}.v1.{name or area}_pb2")


def _stub(area: str, service: str, ch: grpc.Channel, name: str = "") -> Any:
    return getattr(importlib.import_module(f"fortis.{area}.v1.{name or area}_pb2_grpc"),
                   f"{service}Stub")(ch)


common = _pb("common")
ev_pb, px_pb, pt_pb = _pb("evaluation"), _pb("proxy"), _pb("perturbation")
sc_pb, rp_pb, tg_pb = _pb("scoring"), _pb("report"), _pb("target")
FINAL = {ev_pb.EVALUATION_STATE_SUCCEEDED, ev_pb.EVALUATION_STATE_FAILED,
         ev_pb.EVALUATION_STATE_CANCELLED}


def _image(image_id: str, pixels: np.ndarray) -> Any:
    """A raw uint8 tensor image, built from common.proto alone."""
    return common.Image(image_id=image_id, tensor=common.Tensor(
        dtype=common.D_TYPE_UINT8, shape=list(pixels.shape), data=pixels.tobytes()))


# -- failures compared with an unknown id's --------------------------------------------------------

@dataclass(frozen=True)
class Failure:
    code: grpc.StatusCode
    message: str
    details: tuple[str, ...]

    def swapped(self, old: str, new: str) -> Failure:
        return Failure(self.code, self.message.replace(old, new),
                       tuple(d.replace(old, new) for d in self.details))


def _details(exc: grpc.RpcError) -> tuple[str, ...]:
    st = rpc_status.from_call(exc)
    out = []
    for d in (st.details if st is not None else ()):
        for cls in (error_details_pb2.ResourceInfo, error_details_pb2.BadRequest,
                    error_details_pb2.QuotaFailure, error_details_pb2.PreconditionFailure):
            msg = cls()
            if d.Unpack(msg):
                out.append(f"{cls.__name__}:{json_format.MessageToJson(msg, sort_keys=True)}")
    return tuple(out)


def failure(fn: Callable[[], Any]) -> Failure:
    """The failure of ``fn()`` (a stream is read to its end)."""
    try:
        res = fn()
        if isinstance(res, Iterator) or hasattr(res, "__next__"):
            for _ in res:
                pass
    except grpc.RpcError as exc:
        return Failure(exc.code(), exc.details() or "", _details(exc))
    raise AssertionError("the call succeeded")


def same_as_unknown(call: Callable[[str], Any], a_id: str, unknown: str,
                    code: grpc.StatusCode = grpc.StatusCode.NOT_FOUND) -> Failure:
    """B's call with A's id fails exactly as with an id nobody has."""
    seen = failure(lambda: call(a_id))
    never = failure(lambda: call(unknown))
    assert seen.code == code, seen
    assert seen.swapped(a_id, unknown) == never
    return seen


# -- the world: A's resources on one stack ---------------------------------------------------------

@dataclass
class World:
    stack: Any
    ch: grpc.Channel
    images: np.ndarray
    labels: np.ndarray
    a_sessions: dict[str, Any] = field(default_factory=dict)     # id -> Session as created
    hammer: dict[str, Any] = field(default_factory=dict)

    def stub(self, area: str, service: str) -> Any:
        return _stub(area, service, self.ch)

    @property
    def ev(self) -> Any:
        return self.stub("evaluation", "EvaluationService")

    @property
    def px(self) -> Any:
        return self.stub("proxy", "TargetProxyService")

    def get(self, eid: str, md: Any = MD_A) -> Any:
        return self.ev.GetEvaluation(ev_pb.GetEvaluationRequest(evaluation_id=eid),
                                     metadata=md).evaluation

    def wait(self, eid: str, timeout: float = 300) -> Any:
        deadline = time.time() + timeout
        while time.time() < deadline:
            e = self.get(eid)
            if e.state in FINAL:
                return e
            time.sleep(0.1)
        raise AssertionError(f"{eid} did not end")

    def ledger(self, sid: str, md: Any = MD_A) -> list[Any]:
        return list(self.px.ListLedgerEntries(px_pb.ListLedgerEntriesRequest(session_id=sid),
                                              metadata=md).entries)

    def a_state(self) -> tuple:
        """Everything of A's that B must not move: evaluations (minus progress of the running
        one), sessions with their budgets, ledger rows."""
        evs = tuple(sorted((e.evaluation_id, e.plan_text, e.tenant,
                            e.state if e.evaluation_id != "ev-a-slow" else 0,
                            e.summary.SerializeToString(deterministic=True))
                           for e in self.ev.ListEvaluations(ev_pb.ListEvaluationsRequest(
                               page_size=1000), metadata=MD_A).evaluations))
        sessions = tuple((sid, s.target, s.query_budget, s.queries_used,
                          len(self.ledger(sid)))
                         for sid in sorted(self.a_sessions)
                         for s in [self.px.GetSession(px_pb.GetSessionRequest(session_id=sid),
                                                      metadata=MD_A).session])
        return evs, sessions


def _hammer(world: World, stop: threading.Event) -> None:
    """B's heavy use while A's evaluation runs: B squats A's evaluation's session names with a
    budget of 1 and exhausts them, and sends as fast as its rate allows."""
    px, imgs = world.px, world.images
    counts = world.hammer.setdefault("sent", [0])
    k = 0
    while not stop.is_set():
        batch = [_image(f"h{(k + j) % 64}", imgs[(k + j) % len(imgs)]) for j in range(4)]
        px.Predict(px_pb.PredictRequest(session_id="b-hammer", images=batch), metadata=MD_B)
        counts[0] += len(batch)
        k += 4


@pytest.fixture(scope="module")
def world(tmp_path_factory, fmnist_target, fmnist_surrogate, fmnist_test_images) -> Iterator[World]:
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    images, labels = fmnist_test_images
    stack = start_stack(StackSettings(
        state_dir=tmp_path_factory.mktemp("two-tenants") / "state",
        api_keys={KEY_A: "tenant-a", KEY_B: "tenant-b"},
        targets=[TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn"),
                 TargetConfig.parse(f"shared-limited=builtin:fmnist-cnn?rate={SHARED_RATE:g}"),
                 TargetConfig.parse("slow=builtin:fmnist-cnn?rate=30"),
                 TargetConfig.parse("a-only=builtin:fmnist-cnn?tenants=tenant-a")],
        tenant_rates={"tenant-b": B_RATE}, max_message_bytes=8 * 1024 * 1024))
    ch = grpc.insecure_channel(stack.address)
    w = World(stack=stack, ch=ch, images=images, labels=labels)
    try:
        px, ev = w.px, w.ev
        # A's sessions: one with a budget and rows, one B never names itself, one on a-only
        for sid, target, budget, n in (("sess-a", "fmnist-cnn", 10, 3),
                                       ("sess-a-only", "fmnist-cnn", 0, 2),
                                       ("sess-a-private", "a-only", 5, 1)):
            w.a_sessions[sid] = px.CreateSession(px_pb.CreateSessionRequest(
                target=target, session_id=sid, query_budget=budget), metadata=MD_A).session
            px.Predict(px_pb.PredictRequest(session_id=sid, origin="a", images=[
                _image(f"a{k}", images[k]) for k in range(n)]), metadata=MD_A)
        # A's finished evaluation, run while B hammers; then the same plan in quiet
        # B squats the session names A's evaluation will use (budget 1, spent), then sends
        # as fast as B's rate allows while A's evaluation runs
        for sid in ("ev-a/clean", "ev-a/corruptions", "ev-a/query_attacks"):
            px.CreateSession(px_pb.CreateSessionRequest(target="fmnist-cnn", session_id=sid,
                                                        query_budget=1), metadata=MD_B)
            px.Predict(px_pb.PredictRequest(session_id=sid, images=[_image("h", images[0])]),
                       metadata=MD_B)
        px.CreateSession(px_pb.CreateSessionRequest(target="fmnist-cnn", session_id="b-hammer"),
                         metadata=MD_B)
        stop = threading.Event()
        hammer = threading.Thread(target=_hammer, args=(w, stop), daemon=True)
        t0 = time.monotonic()
        hammer.start()
        while w.hammer.get("sent", [0])[0] < 4 and time.monotonic() - t0 < 10:
            time.sleep(0.02)
        ev.CreateEvaluation(ev_pb.CreateEvaluationRequest(
            plan=PLAN.replace("TARGET", "fmnist-cnn"), evaluation_id="ev-a"), metadata=MD_A)
        w.wait("ev-a")
        stop.set()
        hammer.join(30)
        w.hammer["seconds"] = time.monotonic() - t0
        ev.CreateEvaluation(ev_pb.CreateEvaluationRequest(
            plan=PLAN.replace("TARGET", "fmnist-cnn"), evaluation_id="ev-a-quiet"),
            metadata=MD_A)
        w.wait("ev-a-quiet")
        # one cancelled, one running for the whole module
        ev.CreateEvaluation(ev_pb.CreateEvaluationRequest(
            plan=PLAN.replace("TARGET", "a-only"), evaluation_id="ev-a-c"), metadata=MD_A)
        ev.CancelEvaluation(ev_pb.CancelEvaluationRequest(evaluation_id="ev-a-c"), metadata=MD_A)
        w.wait("ev-a-c")
        ev.CreateEvaluation(ev_pb.CreateEvaluationRequest(plan=SLOW_PLAN,
                                                          evaluation_id="ev-a-slow"), metadata=MD_A)
        yield w
    finally:
        try:
            w.ev.CancelEvaluation(ev_pb.CancelEvaluationRequest(evaluation_id="ev-a-slow"),
                                  metadata=MD_A)
        except grpc.RpcError:
            pass
        ch.close()
        stack.stop(0)


# -- the cases, one per RPC --------------------------------------------------------------------

CASES: dict[str, Callable[[World], None]] = {}


def case(*rpcs: str) -> Callable[[Callable[[World], None]], Callable[[World], None]]:
    def add(fn: Callable[[World], None]) -> Callable[[World], None]:
        for r in rpcs:
            assert r not in CASES, r
            CASES[r] = fn
        return fn
    return add


EV, PX = "fortis.evaluation.v1.EvaluationService", "fortis.proxy.v1.TargetProxyService"
PT, SC = "fortis.perturbation.v1.PerturbationService", "fortis.scoring.v1.ScoringService"
RP, TG = "fortis.report.v1.ReportService", "fortis.target.v1.TargetService"


def _bad_request(fn: Callable[[], Any]) -> Failure:
    f = failure(fn)
    assert f.code == grpc.StatusCode.INVALID_ARGUMENT, f
    return f


@case(f"{EV}/ValidatePlan")
def _validate_plan(w: World) -> None:
    """A plan naming A's private target fails like one naming a target nobody has; its list
    of available targets is B's."""
    def call(target: str) -> Any:
        return w.ev.ValidatePlan(ev_pb.ValidatePlanRequest(plan=PLAN.replace("TARGET", target)),
                                 metadata=MD_B)
    seen = same_as_unknown(call, "a-only", "zz-none", grpc.StatusCode.INVALID_ARGUMENT)
    assert "a-only" not in seen.message.split("available:")[-1]
    assert w.ev.ValidatePlan(ev_pb.ValidatePlanRequest(plan=PLAN.replace("TARGET", "a-only")),
                             metadata=MD_A).plan_name == "two-tenants"


@case(f"{EV}/CreateEvaluation")
def _create_evaluation(w: World) -> None:
    """B reuses A's evaluation id: B gets its own evaluation (no ALREADY_EXISTS, nothing of
    A's plan or state); on A's private target it fails as on an unknown one."""
    before = w.a_state()
    mine = w.ev.CreateEvaluation(ev_pb.CreateEvaluationRequest(
        plan=PLAN.replace("TARGET", "fmnist-cnn").replace("seed: 5", "seed: 9"),
        evaluation_id="ev-a-c"), metadata=MD_B).evaluation
    assert (mine.tenant, mine.evaluation_id) == ("tenant-b", "ev-a-c")
    assert "seed: 9" in mine.plan_text and mine.state != ev_pb.EVALUATION_STATE_CANCELLED
    w.ev.CancelEvaluation(ev_pb.CancelEvaluationRequest(evaluation_id="ev-a-c"), metadata=MD_B)

    def call(target: str) -> Any:
        return w.ev.CreateEvaluation(ev_pb.CreateEvaluationRequest(
            plan=PLAN.replace("TARGET", target), evaluation_id="ev-a"), metadata=MD_B)
    same_as_unknown(call, "a-only", "zz-none", grpc.StatusCode.INVALID_ARGUMENT)
    assert w.a_state() == before
    assert w.get("ev-a-c").state == ev_pb.EVALUATION_STATE_CANCELLED


@case(f"{EV}/GetEvaluation")
def _get_evaluation(w: World) -> None:
    for a_id in ("ev-a", "ev-a-slow", "ev-a-quiet"):
        same_as_unknown(lambda i: w.get(i, MD_B), a_id, "zz-none-0")


@case(f"{EV}/ListEvaluations")
def _list_evaluations(w: World) -> None:
    """B's list holds none of A's evaluations; A's page token gives B nothing of A's."""
    listed = w.ev.ListEvaluations(ev_pb.ListEvaluationsRequest(page_size=1000),
                                  metadata=MD_B).evaluations
    assert all(e.tenant == "tenant-b" for e in listed)
    first = w.ev.ListEvaluations(ev_pb.ListEvaluationsRequest(page_size=1), metadata=MD_A)
    assert first.next_page_token
    _token_is_useless(lambda: w.ev.ListEvaluations(ev_pb.ListEvaluationsRequest(
        page_size=1, page_token=first.next_page_token), metadata=MD_B).evaluations)


def _token_is_useless(read: Callable[[], Any]) -> None:
    """A's page token, replayed by B: INVALID_ARGUMENT, or an empty page (never A's data)."""
    try:
        got = list(read())
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
        return
    assert got == [], got


@case(f"{EV}/CancelEvaluation")
def _cancel_evaluation(w: World) -> None:
    before = w.get("ev-a-slow").state
    same_as_unknown(lambda i: w.ev.CancelEvaluation(ev_pb.CancelEvaluationRequest(
        evaluation_id=i), metadata=MD_B), "ev-a-slow", "zz-none-1")
    after = w.get("ev-a-slow").state
    assert after != ev_pb.EVALUATION_STATE_CANCELLED and (before, after) != (
        ev_pb.EVALUATION_STATE_RUNNING, ev_pb.EVALUATION_STATE_PENDING)


@case(f"{EV}/WatchEvaluation")
def _watch_evaluation(w: World) -> None:
    for a_id in ("ev-a-slow", "ev-a"):
        same_as_unknown(lambda i: w.ev.WatchEvaluation(ev_pb.WatchEvaluationRequest(
            evaluation_id=i), metadata=MD_B, timeout=30), a_id, "zz-none-2")


@case(f"{EV}/GetEvaluationReport")
def _get_report(w: World) -> None:
    same_as_unknown(lambda i: w.ev.GetEvaluationReport(ev_pb.GetEvaluationReportRequest(
        evaluation_id=i), metadata=MD_B), "ev-a", "zz-none-3")
    assert w.ev.GetEvaluationReport(ev_pb.GetEvaluationReportRequest(evaluation_id="ev-a"),
                                    metadata=MD_A).report_json


@case(f"{PX}/ListTargets")
def _list_targets(w: World) -> None:
    names_b = {t.name for t in w.px.ListTargets(px_pb.ListTargetsRequest(), metadata=MD_B).targets}
    names_a = {t.name for t in w.px.ListTargets(px_pb.ListTargetsRequest(), metadata=MD_A).targets}
    assert names_a - names_b == {"a-only"}
    first = w.px.ListTargets(px_pb.ListTargetsRequest(page_size=1), metadata=MD_A)
    _token_is_useless(lambda: w.px.ListTargets(px_pb.ListTargetsRequest(
        page_token=first.next_page_token), metadata=MD_B).targets)


@case(f"{PX}/GetTargetInfo")
def _get_target_info(w: World) -> None:
    same_as_unknown(lambda t: w.px.GetTargetInfo(px_pb.GetTargetInfoRequest(target=t),
                                                 metadata=MD_B), "a-only", "zz-none-4")


def _b_session(w: World, sid: str, budget: int = 2) -> Any:
    """B's own session of A's id ``sid`` (idempotent: same settings, same session)."""
    return w.px.CreateSession(px_pb.CreateSessionRequest(target="fmnist-cnn", session_id=sid,
                                                         query_budget=budget),
                              metadata=MD_B).session


@case(f"{PX}/CreateSession")
def _create_session(w: World) -> None:
    """B reuses A's session id: its own session (its budget, no usage of A's); on A's private
    target, as on an unknown target."""
    before = w.a_state()
    mine = _b_session(w, "sess-a")
    assert (mine.tenant, mine.query_budget) == ("tenant-b", 2) and mine.queries_used <= 2
    same_as_unknown(lambda t: w.px.CreateSession(px_pb.CreateSessionRequest(
        target=t, session_id="b-x"), metadata=MD_B), "a-only", "zz-none-5")
    assert w.a_state() == before


@case(f"{PX}/GetSession")
def _get_session(w: World) -> None:
    same_as_unknown(lambda i: w.px.GetSession(px_pb.GetSessionRequest(session_id=i),
                                              metadata=MD_B), "sess-a-only", "zz-none-6")
    same_as_unknown(lambda i: w.px.GetSession(px_pb.GetSessionRequest(session_id=i),
                                              metadata=MD_B), "sess-a-private", "zz-none-6")


@case(f"{PX}/Predict")
def _predict(w: World) -> None:
    """B sends on A's session ids (unknown to B) and exhausts its own "sess-a": nothing of
    A's moves (checked around every case)."""
    imgs = [_image("p0", w.images[0])]
    for a_id in ("sess-a-only", "sess-a-private"):
        same_as_unknown(lambda i: w.px.Predict(px_pb.PredictRequest(session_id=i, images=imgs),
                                               metadata=MD_B), a_id, "zz-none-7")
    _exhaust_b_sess_a(w)


def _exhaust_b_sess_a(w: World) -> None:
    _b_session(w, "sess-a")
    exhausted = None
    for _ in range(4):
        try:
            w.px.Predict(px_pb.PredictRequest(session_id="sess-a", images=[
                _image("p0", w.images[0])]), metadata=MD_B)
        except grpc.RpcError as exc:
            exhausted = exc.code()
    assert exhausted == grpc.StatusCode.RESOURCE_EXHAUSTED


@case(f"{PX}/PredictStream")
def _predict_stream(w: World) -> None:
    before = w.a_state()

    def call(sid: str) -> Any:
        out = list(w.px.PredictStream(iter([px_pb.PredictStreamRequest(
            request_id="r", session_id=sid, images=[_image("q", w.images[1])])]),
            metadata=MD_B))
        assert len(out) == 1 and out[0].HasField("error")
        return (out[0].error.code, out[0].error.message.replace(sid, "ID"),
                [json_format.MessageToJson(_unpacked(d), sort_keys=True).replace(sid, "ID")
                 for d in out[0].error.details])
    assert call("sess-a-only") == call("zz-none-8")
    assert call("sess-a-only")[0] == grpc.StatusCode.NOT_FOUND.value[0]
    assert w.a_state() == before


def _unpacked(detail: Any) -> Any:
    for cls in (error_details_pb2.ResourceInfo, error_details_pb2.ErrorInfo,
                error_details_pb2.BadRequest, error_details_pb2.QuotaFailure):
        msg = cls()
        if detail.Unpack(msg):
            return msg
    raise AssertionError(f"unexpected detail {detail.type_url}")


@case(f"{PX}/GetSessionStats")
def _get_session_stats(w: World) -> None:
    same_as_unknown(lambda i: w.px.GetSessionStats(px_pb.GetSessionStatsRequest(session_id=i),
                                                   metadata=MD_B), "sess-a-only", "zz-none-9")


@case(f"{PX}/GetTenantUsage")
def _get_tenant_usage(w: World) -> None:
    """Names no tenant: each caller gets its own day's count and rate, never A's."""
    b = w.px.GetTenantUsage(px_pb.GetTenantUsageRequest(), metadata=MD_B)
    b_stats = w.px.GetSessionStats(px_pb.GetSessionStatsRequest(session_id="b-hammer"),
                                   metadata=MD_B)
    assert (b.queries_today, b.images_per_second) == (b_stats.tenant_queries_today, B_RATE)
    a = w.px.GetTenantUsage(px_pb.GetTenantUsageRequest(), metadata=MD_A)
    assert a.images_per_second == 0 and a.queries_today > 0


@case(f"{PX}/GetBuiltinTargets")
def _list_builtin_targets(w: World) -> None:
    """For the services' own key only: a tenant learns nothing of which model a target runs."""
    for md in (MD_A, MD_B):
        with pytest.raises(grpc.RpcError) as exc:
            w.px.GetBuiltinTargets(px_pb.GetBuiltinTargetsRequest(), metadata=md)
        assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED, exc.value
        assert "internal" in exc.value.details()


@case(f"{PX}/ListLedgerEntries")
def _list_ledger(w: World) -> None:
    same_as_unknown(lambda i: w.px.ListLedgerEntries(px_pb.ListLedgerEntriesRequest(
        session_id=i), metadata=MD_B), "sess-a-only", "zz-none-10")
    # A's token for A's "sess-a", replayed by B on B's own "sess-a"
    _b_session(w, "sess-a")
    first = w.px.ListLedgerEntries(px_pb.ListLedgerEntriesRequest(session_id="sess-a",
                                                                  page_size=1), metadata=MD_A)
    assert first.next_page_token
    a_ids = {e.entry_id for e in w.ledger("sess-a")}

    def read() -> Any:
        got = w.px.ListLedgerEntries(px_pb.ListLedgerEntriesRequest(
            session_id="sess-a", page_token=first.next_page_token), metadata=MD_B).entries
        assert not a_ids & {e.entry_id for e in got}
        return got
    _token_is_useless(read)


def _same_for_both(call: Callable[[Any], Any]) -> None:
    """A service holding no tenant state: B's answer to A's exact request is A's answer."""
    a = call(MD_A)
    assert a, "A's request must succeed for the comparison to mean something"
    assert call(MD_B) == a


@case(f"{PT}/ListPerturbations", f"{PT}/ListAttacks")
def _catalogue(w: World) -> None:
    pt = w.stub("perturbation", "PerturbationService")
    for method, req in ((pt.ListPerturbations, pt_pb.ListPerturbationsRequest),
                        (pt.ListAttacks, pt_pb.ListAttacksRequest)):
        first = method(req(page_size=2), metadata=MD_A)
        _same_for_both(lambda md, m=method, r=req, t=first.next_page_token:
                       m(r(page_size=2, page_token=t), metadata=md))


@case(f"{PT}/ApplyPerturbation")
def _apply(w: World) -> None:
    pt = w.stub("perturbation", "PerturbationService")
    req = pt_pb.ApplyPerturbationRequest(perturbation_id="gaussian_noise", severity=2, seed=4,
                                         images=[_image("x", w.images[2])])
    _same_for_both(lambda md: pt.ApplyPerturbation(req, metadata=md))


@case(f"{PT}/ApplyPerturbationStream")
def _apply_stream(w: World) -> None:
    pt = w.stub("perturbation", "PerturbationService")
    req = pt_pb.ApplyPerturbationStreamRequest(request_id="s", perturbation_id="contrast",
                                               severity=1, seed=4,
                                               images=[_image("x", w.images[3])])
    _same_for_both(lambda md: list(pt.ApplyPerturbationStream(iter([req]), metadata=md)))


@case(f"{PT}/RunAttack")
def _run_attack(w: World) -> None:
    """A query attack on A's session id: as on an unknown session; nothing reaches A's
    ledger."""
    pt = w.stub("perturbation", "PerturbationService")
    before = w.a_state()
    params = struct_pb2.Struct()
    params.update({"epsilon": 0.05, "max_queries": 5})

    def call(sid: str) -> Any:
        return pt.RunAttack(pt_pb.RunAttackRequest(
            attack_id="square", params=params, seed=1, proxy_session_id=sid,
            images=[pt_pb.LabeledImage(image=_image("r", w.images[4]),
                                       labels=[int(w.labels[4])])]), metadata=MD_B, timeout=60)
    same_as_unknown(call, "sess-a-only", "zz-none-11")
    assert w.a_state() == before


@case(f"{PT}/ValidateAttack")
def _validate_attack(w: World) -> None:
    """Holds no tenant state: B's answer to A's request is A's; a refusal is the same too."""
    pt = w.stub("perturbation", "PerturbationService")
    ok = pt_pb.ValidateAttackRequest(attack_id="pgd")
    ok.params.update({"epsilon": 0.1})
    _same_for_both(lambda md: pt.ValidateAttack(ok, metadata=md))
    bad = pt_pb.ValidateAttackRequest(attack_id="pgd")
    bad.params.update({"epsilon": 5.0})
    answers = []
    for md in (MD_A, MD_B):
        with pytest.raises(grpc.RpcError) as e:
            pt.ValidateAttack(bad, metadata=md)
        answers.append((e.value.code(), e.value.details()))
    assert answers[0] == answers[1] and answers[0][0] == grpc.StatusCode.INVALID_ARGUMENT


@case(f"{SC}/ListMetrics")
def _list_metrics(w: World) -> None:
    sc = w.stub("scoring", "ScoringService")
    first = sc.ListMetrics(sc_pb.ListMetricsRequest(page_size=2), metadata=MD_A)
    _same_for_both(lambda md: sc.ListMetrics(sc_pb.ListMetricsRequest(
        page_size=2, page_token=first.next_page_token), metadata=md))


@case(f"{SC}/Compute")
def _compute(w: World) -> None:
    sc = w.stub("scoring", "ScoringService")
    probs = np.full((4, 3), 1 / 3, dtype=np.float32)
    probs[:, 0] += 0.1
    probs /= probs.sum(1, keepdims=True)
    t = common.Tensor(dtype=common.D_TYPE_FLOAT32, shape=[4, 3], data=probs.tobytes())
    req = sc_pb.ComputeRequest(metric="ndcg", arrays={"perturbed_probs": t, "benign_probs": t})
    _same_for_both(lambda md: sc.Compute(req, metadata=md))


@case(f"{SC}/ScoreEvaluation")
def _score(w: World) -> None:
    sc = w.stub("scoring", "ScoringService")
    labels = np.array([1, 2], dtype=np.int64)
    reqs = [sc_pb.ScoreEvaluationRequest(setup=sc_pb.ScoringSetup(
                image_ids=["a", "b"], classification=sc_pb.ClassificationTruth(labels=[
                    sc_pb.LabelSet(labels=[1]), sc_pb.LabelSet(labels=[2])]),
                correctness=sc_pb.CorrectnessRule(mode=sc_pb.CORRECTNESS_MODE_TOP1))),
            sc_pb.ScoreEvaluationRequest(setting=sc_pb.SettingAnswers(
                kind=sc_pb.SETTING_KIND_CLEAN, name="clean", image_index=[0, 1],
                classification=sc_pb.ClassificationAnswers(labels=common.Tensor(
                    dtype=common.D_TYPE_INT64, shape=[2, 1], data=labels.tobytes()))))]
    _same_for_both(lambda md: sc.ScoreEvaluation(iter(reqs), metadata=md))


@case(f"{RP}/RenderReport")
def _render(w: World) -> None:
    """Rendering takes every part in the request; B's rendering of A's parts says nothing
    more than the parts (no stored report of A's is reachable by id: there is no id)."""
    rp = w.stub("report", "ReportService")
    req = rp_pb.RenderReportRequest(parts=rp_pb.ReportParts(
        plan_text=PLAN.replace("TARGET", "fmnist-cnn"),
        evaluation=rp_pb.EvaluationInfo(evaluation_id="ev-a")))
    try:
        _same_for_both(lambda md: rp.RenderReport(req, metadata=md))
    except grpc.RpcError as exc:        # parts the renderer refuses: refused alike for both
        assert failure(lambda: rp.RenderReport(req, metadata=MD_A)) == \
            failure(lambda: rp.RenderReport(req, metadata=MD_B)), exc


@case(f"{TG}/GetTargetInfo", f"{TG}/Predict", f"{TG}/PredictStream")
def _target_service(w: World) -> None:
    """The target contract is not served by Fortis's port: built-in targets are reachable
    through the proxy only, for every tenant alike."""
    tg = w.stub("target", "TargetService")
    for md in (MD_A, MD_B):
        for fn in (lambda m=md: tg.GetTargetInfo(tg_pb.GetTargetInfoRequest(), metadata=m),
                   lambda m=md: tg.Predict(tg_pb.PredictRequest(
                       images=[_image("t", w.images[0])]), metadata=m),
                   lambda m=md: tg.PredictStream(iter([tg_pb.PredictStreamRequest()]),
                                                 metadata=m)):
            assert failure(fn).code == grpc.StatusCode.UNIMPLEMENTED


UP = "fortis.evaluation.v1.UploadService"


def _uploads(w: World) -> tuple[Any, Any]:
    return _pb("evaluation", "uploads"), _stub("evaluation", "UploadService", w.ch, "uploads")


def _upload(w: World, md: Any, data: bytes) -> Any:
    up_pb, up = _uploads(w)
    return up.UploadBlob(iter([
        up_pb.UploadBlobRequest(header=up_pb.UploadHeader(kind=up_pb.BLOB_KIND_IMAGE,
                                                          size=len(data))),
        up_pb.UploadBlobRequest(chunk=data)]), metadata=md)


def _a_blobs(w: World) -> list[tuple[str, bytes]]:
    """Two image blobs of A's (PNG bytes made with OpenCV, sent with uploads.proto alone)."""
    import cv2
    out = []
    for i in (5, 6):
        ok, buf = cv2.imencode(".png", w.images[i])
        assert ok
        out.append((_upload(w, MD_A, buf.tobytes()).blob.blob_id, buf.tobytes()))
    return out


@case(f"{UP}/GetBlob", f"{UP}/DeleteBlob")
def _get_delete_blob(w: World) -> None:
    """A's blob id behaves for B exactly as an id nobody has; A's blob stays."""
    up_pb, up = _uploads(w)
    (a_id, _), _ = _a_blobs(w)
    unknown = "sha256:" + "e" * 64
    same_as_unknown(lambda i: up.GetBlob(up_pb.GetBlobRequest(blob_id=i), metadata=MD_B),
                    a_id, unknown)
    same_as_unknown(lambda i: up.DeleteBlob(up_pb.DeleteBlobRequest(blob_id=i), metadata=MD_B),
                    a_id, unknown)
    assert up.GetBlob(up_pb.GetBlobRequest(blob_id=a_id), metadata=MD_A).blob.blob_id == a_id


@case(f"{UP}/ListBlobs")
def _list_blobs(w: World) -> None:
    up_pb, up = _uploads(w)
    a_ids = {i for i, _ in _a_blobs(w)}
    assert not a_ids & {b.blob_id for b in up.ListBlobs(up_pb.ListBlobsRequest(),
                                                          metadata=MD_B).blobs}
    first = up.ListBlobs(up_pb.ListBlobsRequest(page_size=1), metadata=MD_A)
    assert first.next_page_token
    _token_is_useless(lambda: up.ListBlobs(up_pb.ListBlobsRequest(
        page_token=first.next_page_token), metadata=MD_B).blobs)


@case(f"{UP}/UploadBlob")
def _upload_blob(w: World) -> None:
    """B uploading A's exact bytes gets a blob of its own (not "already existed"), and
    deleting it leaves A's."""
    up_pb, up = _uploads(w)
    (a_id, data), _ = _a_blobs(w)
    got = _upload(w, MD_B, data)
    assert got.blob.blob_id == a_id and not got.already_existed
    up.DeleteBlob(up_pb.DeleteBlobRequest(blob_id=a_id), metadata=MD_B)
    assert up.GetBlob(up_pb.GetBlobRequest(blob_id=a_id), metadata=MD_A).blob.size == len(data)


ALL_RPCS = _all_rpcs()


def test_every_rpc_of_every_contract_is_enumerated():
    services = {r.rsplit("/", 1)[0] for r in ALL_RPCS}
    assert {EV, PX, PT, SC, RP, TG} <= services
    assert f"{EV}/WatchEvaluation" in ALL_RPCS and f"{PX}/ListLedgerEntries" in ALL_RPCS
    assert set(CASES) <= set(ALL_RPCS), set(CASES) - set(ALL_RPCS)


@pytest.mark.parametrize("rpc", ALL_RPCS)
def test_two_tenant_case(rpc: str, world: World) -> None:
    fn = CASES.get(rpc)
    assert fn is not None, f"{rpc} has no two-tenant case: add one to this module"
    before = world.a_state()
    fn(world)
    after = world.a_state()
    assert after == before, f"tenant B's use of {rpc} changed tenant A's state"


# -- B's heavy use does not change A's results, budget or rate ---------------------------------------

def test_b_hammering_does_not_change_a_results(world: World) -> None:
    """ev-a ran while B squatted its session names and hammered the same target; ev-a-quiet
    ran the same plan with B idle. Same numbers, same queries per session."""
    assert world.hammer["sent"][0] > 0
    loud, quiet = world.get("ev-a"), world.get("ev-a-quiet")
    assert loud.state == quiet.state == ev_pb.EVALUATION_STATE_SUCCEEDED, loud.error.message
    assert loud.summary == quiet.summary
    for stage in ("clean", "corruptions", "query_attacks"):
        try:
            a = world.px.GetSessionStats(px_pb.GetSessionStatsRequest(
                session_id=f"ev-a/{stage}"), metadata=MD_A)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND
            continue
        q = world.px.GetSessionStats(px_pb.GetSessionStatsRequest(
            session_id=f"ev-a-quiet/{stage}"), metadata=MD_A)
        assert (a.queries_ok, a.queries_attempted, a.calls_refused) == \
            (q.queries_ok, q.queries_attempted, q.calls_refused)
        assert a.session.tenant == "tenant-a"
    # B's squats are B's own: budget 1 each, spent
    b = world.px.GetSession(px_pb.GetSessionRequest(session_id="ev-a/clean"),
                            metadata=MD_B).session
    assert (b.tenant, b.query_budget, b.queries_used) == ("tenant-b", 1, 1)


def test_b_exhausting_its_session_leaves_a_its_budget(world: World) -> None:
    """B's "sess-a" (same id as A's) spent to exhaustion: A's budget is untouched and A can
    still spend exactly what it has left, not one query more."""
    _exhaust_b_sess_a(world)
    a = world.px.GetSession(px_pb.GetSessionRequest(session_id="sess-a"), metadata=MD_A).session
    assert a.queries_used == 3                                     # what A sent at setup
    left = a.query_budget - a.queries_used
    resp = world.px.Predict(px_pb.PredictRequest(session_id="sess-a", images=[
        _image(f"l{k}", world.images[k]) for k in range(left)]), metadata=MD_A)
    assert resp.queries_left == 0
    with pytest.raises(grpc.RpcError) as ei:
        world.px.Predict(px_pb.PredictRequest(session_id="sess-a", images=[
            _image("l-extra", world.images[0])]), metadata=MD_A)
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    world.a_sessions.pop("sess-a")          # A changed it itself; no longer a fixed point


def test_b_heavy_use_leaves_a_its_rate(world: World) -> None:
    """B sends to the shared rate-limited target as fast as it can from three threads; B is
    held to its own rate (B_RATE), so A still gets the rest of the target's rate."""
    px, imgs = world.px, world.images
    for md, sid in ((MD_A, "rate-a"), (MD_B, "rate-b")):
        px.CreateSession(px_pb.CreateSessionRequest(target="shared-limited", session_id=sid),
                         metadata=md)
    stop = threading.Event()
    sent_b = [0]

    def hammer() -> None:
        while not stop.is_set():
            px.Predict(px_pb.PredictRequest(session_id="rate-b", images=[
                _image("b", imgs[5])]), metadata=MD_B)
            sent_b[0] += 1

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(1.0)                                        # B at full speed first
    n, batch = 40, 5
    b0, t0 = sent_b[0], time.monotonic()
    for k in range(0, n, batch):
        px.Predict(px_pb.PredictRequest(session_id="rate-a", images=[
            _image(f"r{k + j}", imgs[(k + j) % len(imgs)]) for j in range(batch)]), metadata=MD_A)
    elapsed = time.monotonic() - t0
    b_during = sent_b[0] - b0
    stop.set()
    for t in threads:
        t.join(10)
    a_share = SHARED_RATE - B_RATE
    # A's n images at A's share take n / a_share s (+ one interval of pacing); twice that plus
    # a second of slack for this 2-core machine. Without the tenant limit B's three threads
    # would take three quarters of the target and A would need about 2.7x longer.
    assert elapsed <= 2 * n / a_share + 1.0, (elapsed, b_during)
    # and B stayed within its own rate meanwhile (one burst interval of slack)
    assert b_during <= B_RATE * elapsed + 2, (b_during, elapsed)
