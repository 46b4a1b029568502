"""A plan's query estimate over a real loopback Fortis (raw stubs, the embedded stack with the
built-in Fashion-MNIST CNN):

- ValidatePlan's estimate of a small copy of the demo plan: its fixed part equals the ledger's
  counts of a real run's non-adaptive settings, and the whole run stays under its upper bound;
  a second estimate of the same plan expects what that run spent;
- the price from the plan's ``?price_per_1000=`` (taken off the endpoint) or, failing that,
  the operator's target configuration;
- a plan whose fixed queries exceed what is left of the tenant's daily quota is refused at
  CreateEvaluation (RESOURCE_EXHAUSTED, QuotaFailure on ``tenant:<name>``) before anything is
  stored or sent: no evaluation, no ledger row;
- hostile prices (NaN, negative, huge, twice, not a number) are refused naming the field;
- ``fortis estimate --json`` and ``fortis run --dry-run`` print the same estimate and run
  nothing.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from fortis.evaluation.v1 import evaluation_pb2 as pb
from fortis.evaluation.v1 import evaluation_pb2_grpc
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from google.rpc import error_details_pb2

from tests.conftest import API_KEY, MD, OTHER_KEY, OTHER_MD
from tests.integration._outsider_support import wait_final

M, FGSM_LIMIT, SQUARE_LIMIT, Q_M = 60, 40, 20, 30
SEVERITIES = {"gaussian_noise": [1, 3], "brightness": [2]}

#: A smaller copy of the demo plan: clean, two corruptions, a transfer and a query attack.
PLAN = f"""
name: estimate-small
seed: 7
target: {{name: fmnist-cnn, task: classification, endpoint: "builtin:fmnist-cnn?price_per_1000=2.5"}}
dataset: {{source: fashion-mnist, split: test, limit: {M}}}
corruptions:
  - {{id: gaussian_noise, severities: {SEVERITIES["gaussian_noise"]}}}
  - {{id: brightness, severities: {SEVERITIES["brightness"]}}}
attacks:
  - {{id: fgsm, surrogate: fmnist-surrogate, params: {{epsilon: 0.1}}, limit: {FGSM_LIMIT}}}
  - {{id: square, params: {{epsilon: 0.1, max_queries: {Q_M}}}, limit: {SQUARE_LIMIT}}}
execution: {{batch_size: 16}}
"""
#: What the stages send, from the plan: one query per image per non-adaptive setting.
FIXED = M + M * sum(len(v) for v in SEVERITIES.values()) + FGSM_LIMIT
UPPER = FIXED + Q_M * SQUARE_LIMIT


def _stack(tmp_path: Path, **kw):  # type: ignore[no-untyped-def]
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    return start_stack(
        StackSettings(
            state_dir=tmp_path / "state",
            api_keys={API_KEY: "tenant-a", OTHER_KEY: "tenant-b"},
            targets=[
                TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn"),
                TargetConfig.parse("fmnist-priced=builtin:fmnist-cnn?price_per_1000=4&rate=500"),
            ],
            **kw,
        )
    )


@pytest.fixture()
def stack(tmp_path: Path, fmnist_target, fmnist_surrogate) -> Iterator:
    s = _stack(tmp_path)
    yield s
    s.stop(0)


def _stubs(address: str):  # type: ignore[no-untyped-def]
    ch = grpc.insecure_channel(address)
    return (
        ch,
        evaluation_pb2_grpc.EvaluationServiceStub(ch),
        proxy_pb2_grpc.TargetProxyServiceStub(ch),
    )




def test_fixed_part_is_the_ledger_and_the_run_stays_under_the_upper_bound(stack) -> None:
    ch, ev_stub, px_stub = _stubs(stack.address)
    try:
        est = ev_stub.ValidatePlan(pb.ValidatePlanRequest(plan=PLAN), metadata=MD).estimate
        assert (est.images, est.fixed, est.upper_bound) == (M, FIXED, UPPER)
        assert not est.HasField("expected")  # nothing ran yet: the attack is unknown
        kinds = {s.setting: s.kind for s in est.settings}
        assert kinds["square"] == pb.QUERY_COUNT_KIND_UPPER_BOUND
        assert kinds["fgsm"] == kinds["gaussian_noise@3"] == pb.QUERY_COUNT_KIND_FIXED
        square = next(s for s in est.settings if s.setting == "square")
        assert (square.images, square.per_image, square.fixed) == (SQUARE_LIMIT, Q_M, 0)
        # the price the plan's endpoint declares, per 1000 answered queries
        assert est.price.source == "plan" and est.price.per_1000 == 2.5
        assert est.price.fixed == pytest.approx(FIXED / 1000 * 2.5)
        assert est.price.upper_bound == pytest.approx(UPPER / 1000 * 2.5)

        eid = ev_stub.CreateEvaluation(
            pb.CreateEvaluationRequest(plan=PLAN), metadata=MD
        ).evaluation.evaluation_id
        assert wait_final(ev_stub, eid, MD).state == pb.EVALUATION_STATE_SUCCEEDED
        report = json.loads(
            ev_stub.GetEvaluationReport(
                pb.GetEvaluationReportRequest(evaluation_id=eid), metadata=MD
            ).report_json
        )
        section = report["estimate"]
        assert (section["fixed"], section["upper_bound"]) == (FIXED, UPPER)

        # the proxy's own counts of each session, asked over its contract
        def ledger(session: str) -> int:
            return px_stub.GetSessionStats(
                proxy_pb2.GetSessionStatsRequest(session_id=f"{eid}/{session}"), metadata=MD
            ).queries_ok

        rows = {r["setting"]: r for r in section["per_setting"]}
        assert rows["clean"]["actual"] == ledger("clean") == M
        assert rows["fgsm"]["actual"] == ledger("attack/fgsm") == FGSM_LIMIT
        corr = next(r for r in section["per_setting"] if r["stage"] == "corruptions")
        assert (
            corr["kind"] == "fixed" and corr["actual"] == ledger("corruptions") == corr["estimated"]
        )
        fixed_actual = sum(r["actual"] for r in section["per_setting"] if r["kind"] == "fixed")
        assert fixed_actual == FIXED
        sq = rows["square"]
        assert sq["kind"] == "upper_bound" and 0 < sq["actual"] <= Q_M * SQUARE_LIMIT
        assert section["total_actual"] == report["ledger"]["total_queries"]
        assert FIXED < section["total_actual"] <= UPPER
        assert (
            "Estimated vs actual queries"
            in ev_stub.GetEvaluationReport(
                pb.GetEvaluationReportRequest(evaluation_id=eid), metadata=MD
            ).report_html
        )

        # the same plan again: what the finished run spent is what is expected
        again = ev_stub.ValidatePlan(pb.ValidatePlanRequest(plan=PLAN), metadata=MD).estimate
        assert again.expected_from == eid and again.expected == section["total_actual"]
        # the same plan in another layout, with a comment: the same document
        relaid = "# the same plan\n" + PLAN.replace("seed: 7", "seed:   7  # fixed")
        same = ev_stub.ValidatePlan(pb.ValidatePlanRequest(plan=relaid), metadata=MD).estimate
        assert same.expected_from == eid
        changed = PLAN.replace("seed: 7", "seed: 8")
        other_seed = ev_stub.ValidatePlan(pb.ValidatePlanRequest(plan=changed), metadata=MD)
        assert not other_seed.estimate.HasField("expected")
        # another tenant's runs are not this tenant's history
        other = ev_stub.ValidatePlan(pb.ValidatePlanRequest(plan=PLAN), metadata=OTHER_MD).estimate
        assert not other.HasField("expected") and other.expected_from == ""
    finally:
        ch.close()


def test_price_and_rate_of_the_operators_target_configuration(stack) -> None:
    ch, ev_stub, _ = _stubs(stack.address)
    plan = PLAN.replace(
        'name: fmnist-cnn, task: classification, endpoint: "builtin:fmnist-cnn?price_per_1000=2.5"',
        "name: fmnist-priced, task: classification",
    )
    try:
        est = ev_stub.ValidatePlan(pb.ValidatePlanRequest(plan=plan), metadata=MD).estimate
        assert est.price.source == "target" and est.price.per_1000 == 4.0
        assert est.price.fixed == pytest.approx(FIXED / 1000 * 4.0)
        rate = next(d for d in est.durations if d.limit == "target fmnist-priced")
        assert rate.unit == "images/s" and rate.rate == 500
        assert rate.seconds_fixed == pytest.approx(FIXED / 500)
        assert rate.seconds_upper_bound == pytest.approx(UPPER / 500)
        # the plan's own price wins over the operator's
        mine = plan.replace(
            "name: fmnist-priced, task: classification",
            'name: fmnist-priced, task: classification, endpoint: "x:y?a=1&price_per_1000=0.5"',
        )
        est = ev_stub.ValidatePlan(pb.ValidatePlanRequest(plan=mine), metadata=MD).estimate
        assert est.price.source == "plan" and est.price.per_1000 == 0.5
    finally:
        ch.close()


def test_a_multi_target_plan_counts_every_model(stack) -> None:
    """Each model runs every setting (its own queries); the price is left out while one
    model declares none, rather than a partial sum."""
    ch, ev_stub, _ = _stubs(stack.address)
    plan = f"""
name: estimate-multi
seed: 7
targets: [{{name: fmnist-cnn}}, {{name: fmnist-priced}}]
dataset: {{source: fashion-mnist, split: test, limit: {M}}}
corruptions: [{{id: brightness, severities: [1, 2]}}]
attacks: [{{id: square, params: {{epsilon: 0.1, max_queries: {Q_M}}}, limit: {SQUARE_LIMIT}}}]
"""
    try:
        est = ev_stub.ValidatePlan(pb.ValidatePlanRequest(plan=plan), metadata=MD).estimate
        per_model = {
            t: [s for s in est.settings if s.target == t] for t in ("fmnist-cnn", "fmnist-priced")
        }
        for settings in per_model.values():
            assert sum(s.fixed for s in settings) == M * 3
            assert sum(s.upper_bound for s in settings) == M * 3 + Q_M * SQUARE_LIMIT
        assert est.fixed == 2 * M * 3 and not est.HasField("price")
        assert [d.limit for d in est.durations] == ["target fmnist-priced"]
    finally:
        ch.close()


@pytest.mark.parametrize("price", ["nan", "-1", "1e12", "inf", "abc", "", "1&price_per_1000=2"])
def test_hostile_prices_are_refused_naming_the_field(stack, price: str) -> None:
    ch, ev_stub, _ = _stubs(stack.address)
    plan = PLAN.replace("price_per_1000=2.5", f"price_per_1000={price}")
    try:
        with pytest.raises(grpc.RpcError) as exc:
            ev_stub.ValidatePlan(pb.ValidatePlanRequest(plan=plan), metadata=MD)
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        fields = _bad_request(exc.value)
        assert "target.endpoint" in fields and "price_per_1000" in fields["target.endpoint"]
    finally:
        ch.close()


def test_hostile_prices_in_the_operators_configuration() -> None:
    from fortis.server.app.settings import TargetConfig
    from fortis.services.common.errors import InvalidArgument

    for bad in ("nan", "-3", "1e300", "x", "1&price_per_1000=1"):
        with pytest.raises(InvalidArgument) as exc:
            TargetConfig.parse(f"t=builtin:fmnist-cnn?price_per_1000={bad}")
        assert "price_per_1000" in str(exc.value)
    ok = TargetConfig.parse("t=kserve+http://127.0.0.1:1/v2/models/m?price_per_1000=3&x=%2F")
    assert ok.price_per_1000 == 3.0 and ok.url == "kserve+http://127.0.0.1:1/v2/models/m?x=%2F"


def test_over_quota_plan_is_refused_before_anything_is_sent(
    tmp_path: Path, fmnist_target, fmnist_surrogate
) -> None:
    from fortis.infra.serving.quotas import QuotaSettings

    quota = FIXED - 1
    s = _stack(tmp_path, quotas=QuotaSettings(queries_per_day=quota))
    ch, ev_stub, px_stub = _stubs(s.address)
    try:
        est = ev_stub.ValidatePlan(pb.ValidatePlanRequest(plan=PLAN), metadata=MD).estimate
        assert (est.tenant_queries_today, est.tenant_queries_per_day) == (0, quota)
        with pytest.raises(grpc.RpcError) as exc:
            ev_stub.CreateEvaluation(pb.CreateEvaluationRequest(plan=PLAN), metadata=MD)
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        violations = _quota_violations(exc.value)
        assert [v.subject for v in violations] == ["tenant:tenant-a"]
        text = violations[0].description
        assert f"planned {FIXED}" in text and "used today 0" in text and f"quota {quota}" in text
        # nothing stored, nothing sent, nothing charged
        assert not ev_stub.ListEvaluations(pb.ListEvaluationsRequest(), metadata=MD).evaluations
        usage = px_stub.GetTenantUsage(proxy_pb2.GetTenantUsageRequest(), metadata=MD)
        assert (usage.queries_today, usage.queries_per_day) == (0, quota)
        with sqlite3.connect(tmp_path / "state" / "ledger.sqlite") as db:
            assert db.execute("SELECT COUNT(*) FROM queries").fetchone()[0] == 0
        # a plan whose fixed part fits is accepted (its adaptive bound may not: the proxy
        # refuses any query past the quota while it runs)
        fits = PLAN.replace(f"limit: {M}}}", "limit: 8}").replace(
            "max_queries: 30", "max_queries: 200"
        )
        ok = ev_stub.ValidatePlan(pb.ValidatePlanRequest(plan=fits), metadata=MD).estimate
        assert ok.fixed <= quota < ok.upper_bound
        ev = ev_stub.CreateEvaluation(pb.CreateEvaluationRequest(plan=fits), metadata=MD).evaluation
        ev_stub.CancelEvaluation(
            pb.CancelEvaluationRequest(evaluation_id=ev.evaluation_id), metadata=MD
        )
    finally:
        ch.close()
        s.stop(0)


def test_cli_estimate_and_dry_run_print_the_estimate_and_run_nothing(
    stack, capsys, tmp_path: Path
) -> None:
    from fortis.server.cli.main import main

    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    assert (
        main(["estimate", str(plan), "--json", "--address", stack.address, "--api-key", API_KEY])
        == 0
    )
    e = json.loads(capsys.readouterr().out)
    assert (e["fixed"], e["upper_bound"], e["images"]) == (FIXED, UPPER, M)
    assert e["price"]["source"] == "plan"
    assert (
        main(["run", str(plan), "--dry-run", "--address", stack.address, "--api-key", API_KEY]) == 0
    )
    out = capsys.readouterr().out
    assert f"{FIXED:,}" in out and f"{UPPER:,}" in out and "upper bound" in out
    ch, ev_stub, _ = _stubs(stack.address)
    try:
        assert not ev_stub.ListEvaluations(pb.ListEvaluationsRequest(), metadata=MD).evaluations
    finally:
        ch.close()


def _bad_request(exc: grpc.RpcError) -> dict[str, str]:
    from grpc_status import rpc_status

    out = {}
    st = rpc_status.from_call(exc)
    for d in st.details if st else []:
        br = error_details_pb2.BadRequest()
        if d.Unpack(br):
            out.update({v.field: v.description for v in br.field_violations})
    return out


def _quota_violations(exc: grpc.RpcError) -> list:
    from grpc_status import rpc_status

    out: list = []
    st = rpc_status.from_call(exc)
    for d in st.details if st else []:
        qf = error_details_pb2.QuotaFailure()
        if d.Unpack(qf):
            out += list(qf.violations)
    return out
