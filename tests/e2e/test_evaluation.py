"""End to end: a plan goes in, real corrupted and adversarial images reach the real model
through the proxy, metrics come out, a report is written (IEEE-P2, P4). And a service
killed mid-evaluation resumes and finishes with the same numbers (CAN-9)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from fortis.client import FortisClient, progress_of
from fortis.services.common import errors

from tests.conftest import API_KEY

PLAN = """
name: e2e-small
seed: 11
roles:
  tester: {name: "pytest", organisation: "Fortis CI"}
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 64}
correctness: {mode: top1}
corruptions:
  - {id: gaussian_noise, severities: [1, 3, 5]}
  - {id: contrast, severities: [1, 5]}
attacks:
  - {id: fgsm, surrogate: fmnist-surrogate, params: {epsilon: 0.15}}
  - {id: square, params: {epsilon: 0.1, max_queries: 40}, limit: 16}
execution: {batch_size: 32}
"""


def test_evaluation_end_to_end(stack, tmp_path):
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        ev = fc.submit(PLAN)
        seen = []
        final = fc.wait(ev.evaluation_id, on_progress=seen.append)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
        assert seen and seen[-1].items_done == seen[-1].items_total == 2 + 5 * 2 + 2 + 1
        assert {p.stage for p in seen} >= {"done"}
        js, html = fc.write_report(ev.evaluation_id, tmp_path / "out")
        report = json.loads(js.read_text())
        # the same id again returns the same evaluation (idempotent create)
        again = fc.submit(PLAN, evaluation_id=ev.evaluation_id)
        assert again.evaluation_id == ev.evaluation_id
        assert [e.evaluation_id for e in fc.list()] == [ev.evaluation_id]
        stats = fc.session_stats(f"{ev.evaluation_id}/clean")
        assert stats.queries_ok == 64
    m = report["metrics"]
    for key in ("plan", "target", "tester", "environment"):
        assert key in report
    assert m["accuracy"]["m"] == 64 and 0.75 <= m["accuracy"]["value"] <= 1.0
    lo, hi = m["accuracy"]["ci95"]
    assert lo <= m["accuracy"]["value"] <= hi
    g = m["corruptions"]["gaussian_noise"]
    assert set(g) >= {"1", "3", "5"}
    assert g["5"]["robustness"] <= g["1"]["robustness"]        # IEEE-M7: falls with severity
    assert m["corruptions"]["contrast"]["5"]["robustness"] < m["corruptions"]["contrast"]["1"]["robustness"]
    assert m["worstcase_robustness_corr"]["value"] <= min(
        g[s]["robustness"] for s in ("1", "3", "5"))              # IEEE-M4 <= every setting
    sq = m["attacks"]["square"]
    assert sq["query_budget"] == 40 and sq["median_queries"] <= 40
    assert sq["m"] == 16 and m["attacks"]["fgsm"]["m"] == 64     # limit: scored over its subset
    assert m["attacks"]["fgsm"]["robustness_adv"] < m["accuracy"]["value"]
    assert m["average_robustness_adv"]["value"] is not None
    # queries read from the ledger match the report
    assert report["ledger"]["sessions"][f"{report['evaluation']['id']}/clean"] == 64
    assert report["ledger"]["sessions"][f"{report['evaluation']['id']}/corruptions"] == 64 * 5
    assert "<html" in html.read_text().lower()
    # RANK-1/RANK-2 against the clean answers, computed by the scoring service
    rk = m["ranking"]
    assert rk["applicable"] is True
    g1, g5 = rk["settings"]["gaussian_noise@1"], rk["settings"]["gaussian_noise@5"]
    assert 0.0 <= g5["ndcg_1"] <= g1["ndcg_1"] <= 1.0       # stronger noise, ranking drifts more
    assert 0.0 <= g5["drr_5"] <= 1.0 and g1["m"] == 64
    assert "NDCG" in html.read_text()
    # adversarial examples kept as float arrays and images (CAN-9), in the evaluation
    # store per tenant
    import io

    import numpy as np
    arts = stack.manager.store.for_tenant("tenant-a")
    eid = report["evaluation"]["id"]
    assert [a.name for a in arts.artifacts(eid)] == [
        "adversarial/fgsm-00000.npz", "adversarial/fgsm-00001.npz", "adversarial/square-00000.npz"]
    npz = np.load(io.BytesIO(arts.artifact(eid, "adversarial/square-00000.npz")))
    assert npz["adversarial_uint8"].dtype == np.uint8 and len(npz["image_ids"]) == 16
    assert npz["adversarial_float"].shape == npz["adversarial_uint8"].shape


def test_cancel_and_errors(stack):
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        ev = fc.submit(PLAN.replace("limit: 64", "limit: 2000"))
        c = fc.cancel(ev.evaluation_id)
        assert progress_of(c).state == "CANCELLED"
        with pytest.raises(errors.FailedPrecondition):
            fc.cancel(ev.evaluation_id)
        with pytest.raises(errors.FailedPrecondition):
            fc.report_files(ev.evaluation_id)
        with pytest.raises(errors.NotFound):
            fc.get("ev-does-not-exist")
        # a plan whose attack does not fit the target is refused at validation, field named
        # (a score-based attack on a label-only target, IEEE-A8)
        bad = PLAN.replace("name: fmnist-cnn,", "name: fmnist-cnn-label,")
        with pytest.raises(errors.InvalidArgument) as ei:
            fc.submit(bad)
        assert "attacks[1].id" in str(ei.value) and "fmnist-cnn-label" in str(ei.value)


# -- kill and restart ----------------------------------------------------------------------

RESUME_PLAN = PLAN.replace("limit: 64}", "limit: 96}").replace(
    "max_queries: 40}, limit: 16", "max_queries: 150}, limit: 64")
#: The query attack's work items in RESUME_PLAN (its 64 images in chunks of batch_size 32),
#: the last stage's.
SQUARE_CHUNKS = 2


def _serve(state: Path) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, FORTIS_API_KEYS=f"{API_KEY}=tenant-a", FORTIS_INTERNAL_KEY="internal-test-key")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fortis.server.cli", "serve", "--address", "127.0.0.1:0", "--state-dir", str(state),
         "--target", "fmnist-cnn=builtin:fmnist-cnn", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError("fortis serve did not start")
    return proc, json.loads(line)["address"]


def _run_to_end(address: str) -> tuple[str, dict]:
    with FortisClient(address, api_key=API_KEY) as fc:
        ev = fc.submit(RESUME_PLAN, evaluation_id="ev-resume")
        final = fc.wait(ev.evaluation_id)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
        return ev.evaluation_id, fc.report(ev.evaluation_id)


@pytest.mark.slow
def test_killed_service_resumes_with_the_same_numbers(tmp_path, fmnist_target, fmnist_surrogate):
    # Uninterrupted reference run.
    proc, address = _serve(tmp_path / "ref")
    try:
        _, ref = _run_to_end(address)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)

    # Interrupted run: kill -9 in the middle of the query attack.
    state = tmp_path / "killed"
    proc, address = _serve(state)
    killed_at = None
    try:
        with FortisClient(address, api_key=API_KEY) as fc:
            ev = fc.submit(RESUME_PLAN, evaluation_id="ev-resume")
            deadline = time.time() + 300
            while time.time() < deadline:
                p = progress_of(fc.get(ev.evaluation_id))
                # Every item before the query attack is done (stages run in order; a
                # stage's chunks in flight finish in any order, so the count says it, not
                # the last item's name) and the query attack's chunks are not: a
                # query-attack chunk is running.
                if (p.state == "RUNNING" and p.items_total
                        and p.items_total - SQUARE_CHUNKS <= p.items_done < p.items_total):
                    killed_at = p
                    break
                if p.state != "RUNNING" and p.state != "PENDING":
                    break
                time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait(30)
    assert killed_at is not None, "the evaluation finished before it could be killed"
    assert killed_at.items_done < killed_at.items_total

    proc, address = _serve(state)          # restart: resumes by itself
    try:
        with FortisClient(address, api_key=API_KEY) as fc:
            final = fc.wait("ev-resume")
            assert progress_of(final).state == "SUCCEEDED", final.error.message
            assert final.resumed_count == 1
            resumed = fc.report("ev-resume")
        interrupted = _interrupted_rows(address, resumed["ledger"]["sessions"])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)

    # no finished item was redone: the clean and corruption sessions saw each image once
    sessions = resumed["ledger"]["sessions"]
    assert sessions["ev-resume/clean"] == 96
    assert sessions["ev-resume/corruptions"] == 96 * 5
    if interrupted == 0:
        # the kill fell between two calls: the resumed attempt replays the answered queries
        # from the ledger and every number is the reference run's
        assert resumed["metrics"] == ref["metrics"]
        assert resumed["ledger"]["total_queries"] == ref["ledger"]["total_queries"]
        return
    # The kill fell while a call's images were at the target: those rows are INTERRUPTED
    # (the target may have answered them), stay charged to each image's Q_m (never
    # past the budget) and cannot be replayed. Everything but the query attack is identical;
    # the query attack differs by at most one query and one success per interrupted row.
    def without_query_attacks(m: dict) -> dict:
        return {k: ({a: x for a, x in v.items() if x["kind"] != "query"} if k == "attacks" else v)
                for k, v in m.items()}
    assert without_query_attacks(resumed["metrics"]) == without_query_attacks(ref["metrics"])
    for name, ref_q in ref["metrics"]["attacks"].items():
        if ref_q["kind"] != "query":
            continue
        got = resumed["metrics"]["attacks"][name]
        n = ref_q["success_rate_n"]
        assert got["success_rate_n"] == n and got["query_budget"] == ref_q["query_budget"]
        assert abs(got["successes"] - ref_q["successes"]) <= interrupted
        assert abs(got["mean_queries"] * n - ref_q["mean_queries"] * n) <= interrupted + 1e-6
    total, ref_total = resumed["ledger"]["total_queries"], ref["ledger"]["total_queries"]
    assert ref_total - interrupted <= total <= ref_total


def _interrupted_rows(address: str, sessions: dict) -> int:
    """Rows a kill left in flight (marked INTERRUPTED at restart), over the report's sessions."""
    from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
    with grpc.insecure_channel(address) as ch:
        stub = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        return sum(stub.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id=s),
                                        metadata=(("x-api-key", API_KEY),)).queries_in_flight
                   for s in sessions)


def test_ranking_metrics_not_applicable_for_a_labels_only_target(stack):
    """RANK-3: a target that returns labels only gets 'not applicable', never 0."""
    plan = """
name: labels-only
seed: 3
target: {name: fmnist-cnn-label, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 16}
corruptions:
  - {id: gaussian_noise, severities: [3]}
"""
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        ev = fc.submit(plan)
        final = fc.wait(ev.evaluation_id)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
        report = json.loads(fc.report_files(ev.evaluation_id)[0])
    rk = report["metrics"]["ranking"]
    assert rk["applicable"] is False and "labels only" in rk["reason"] and rk["settings"] == {}


def test_degradation_profiles_in_a_plan(stack, tmp_path):
    """DEG-1..DEG-4 end to end: incremental operators (incl. white-box model gradient descent
    on the surrogate) through the proxy, profiled on the images right at level 0, with
    failure points and the change made at each level, in report.json and report.html."""
    plan = """
name: degradation
seed: 4
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 32}
degradation:
  - {id: global_blur, levels: [1, 3, 10, 30]}
  - {id: model_gradient_descent, surrogate: fmnist-surrogate, levels: [5, 30]}
"""
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        ev = fc.submit(plan)
        final = fc.wait(ev.evaluation_id)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
        js, html = fc.write_report(ev.evaluation_id, tmp_path / "out")
        stats = fc.session_stats(f"{ev.evaluation_id}/degradation")
    report = json.loads(js.read_text())
    deg = report["metrics"]["degradation"]
    blur = deg["global_blur"]
    m_used = blur["m_used"]
    assert 20 <= m_used <= 32 and blur["m"] == 32                 # DEG-3: right at level 0
    acc = {r["level"]: r["value"] for r in blur["accuracy"]}
    assert acc[0] == 1.0 and acc[30] < acc[1]                      # DEG-2: falls with level
    ch = {r["level"]: r["change"]["fraction_of_pixels_changed"] for r in blur["changes"]}
    assert 0 < ch[1] <= ch[30] <= 1
    fp = blur["failure_points"]["0.9"]
    assert fp is None or fp["level"] in (1, 3, 10, 30)              # DEG-4
    mgd = {r["level"]: r["value"] for r in deg["model_gradient_descent"]["accuracy"]}
    assert mgd[30] < mgd[0]                                        # transfers from the surrogate
    assert stats.queries_ok == 32 * (4 + 2)                        # one query per image and level
    assert any(t["kind"] == "degradation" and t["id"] == "global_blur" for t in report["tests"])
    assert "Degradation profiles" in html.read_text()


def test_a_misbehaving_target_gives_per_query_errors_not_a_crashed_evaluation(tmp_path):
    """HTTP 500s, malformed JSON and timeouts from a target become per-query errors in
    the ledger and the report, and the evaluation still finishes. The target is an HTTP/JSON
    API reached through the real proxy and the http-json adapter; the service itself is a
    stand-in of the test's own (a local stdlib HTTP server), since no real API can misbehave
    on demand here."""
    import base64
    import http.server
    import threading

    import cv2
    import numpy as np
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    calls = {"n": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):  # noqa: ANN002 - quiet
            pass

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            img = cv2.imdecode(np.frombuffer(base64.b64decode(body["image"]), np.uint8), cv2.IMREAD_UNCHANGED)
            calls["n"] += 1
            mean = float(img.mean())
            if mean < 40:                       # dark images: the service fails
                self.send_response(500)
                self.end_headers()
                return
            if mean < 60:                       # some answers are not JSON
                out = b"{not json"
            else:
                out = json.dumps({"predictions": [{"className": str(int(mean) % 10),
                                                   "probability": 0.9}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(out)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    profile = tmp_path / "flaky.yaml"
    profile.write_text(f"""
name: flaky
task: classification
output: top_k
top_k: 1
labels: ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]
request:
  url: http://127.0.0.1:{srv.server_address[1]}/classify
  image: base64
  body: {{image: "${{image_base64}}"}}
  timeout_s: 5
response:
  items: predictions
  label: className
  score: probability
""")
    stack = start_stack(StackSettings(state_dir=tmp_path / "state", api_keys={API_KEY: "tenant-a"},
                                      targets=[TargetConfig.parse(f"flaky=http-json:{profile}")]))
    try:
        plan = """
name: flaky-target
seed: 2
target: {name: flaky, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 24}
corruptions:
  - {id: brightness, severities: [5]}
"""
        with FortisClient(stack.address, api_key=API_KEY) as fc:
            ev = fc.submit(plan)
            final = fc.wait(ev.evaluation_id)
            assert progress_of(final).state == "SUCCEEDED", final.error.message
            js, html = fc.write_report(ev.evaluation_id, tmp_path / "out")
            stats = fc.session_stats(f"{ev.evaluation_id}/clean")
        report = json.loads(js.read_text())
        qe = report["metrics"]["query_errors"]
        # the proxy sends the target at most the 4 images it declares per call, so a failure
        # is confined to those images: the report's errors are exactly the images the ledger
        # has no answer for (a retried image has several failed rows, one error)
        unanswered = [i for i in stats.raw.images if i.queries == 0]
        assert qe["total"] > 0 and qe["settings"]["clean"]["errors"] == len(unanswered) > 0
        assert stats.queries_failed >= len(unanswered)
        errs = " ".join(x["error"] for x in qe["settings"]["clean"]["examples"])
        assert "UNAVAILABLE" in errs or "500" in errs or "not valid JSON" in errs
        assert stats.queries_ok + len(unanswered) == 24 and stats.queries_ok > 0
        assert report["metrics"]["accuracy"]["m"] == 24            # failures scored as incorrect
        assert "Failed queries" in html.read_text()
    finally:
        stack.stop(0)
        srv.shutdown()


def test_pertknob_minimal_perturbation_search_through_the_proxy(stack):
    """PER-3/PER-4 in a plan: PertKnob (bisection over epsilon) on a real-world property,
    every query through the proxy and within Q_m; the report gives the success rate (share
    fooled), queries, and mean/median minimal L2 of the images fooled."""
    plan = """
name: pertknob
seed: 8
target: {name: fmnist-cnn-label, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 12}
attacks:
  - {id: pertknob, name: knob-contrast, params: {property: per_contrast_reduction, cells: 256, max_queries: 12}}
"""
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        ev = fc.submit(plan)
        final = fc.wait(ev.evaluation_id)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
        report = fc.report(ev.evaluation_id)
    a = report["metrics"]["attacks"]["knob-contrast"]
    assert a["query_budget"] == 12 and a["m"] == 12
    assert 0 < a["success_rate"] <= 1 and a["mean_queries"] <= 12
    assert a["median_l2_successful"] > 0 and a["mean_l2_successful"] > 0
    sessions = {k: v for k, v in report["ledger"]["sessions"].items() if "/attack/knob-contrast/" in k}
    assert sessions and sum(sessions.values()) <= 12 * 12          # never above Q_m per image
    with FortisClient(stack.address, api_key=API_KEY) as fc, \
            pytest.raises(errors.InvalidArgument) as ei:
        fc.submit(plan.replace("per_contrast_reduction", "gaussian_noise"))
    assert "attacks[0].params.property" in str(ei.value)
