"""Sequential acceptance end to end (``acceptance: {sequential: true}``): the same plan run
whole and sequentially through the real services and the real Fashion-MNIST CNN reaches the
same verdict with fewer target queries (counted in the proxy's ledger), each decided
criterion's time-uniform interval covers the value the whole run measured, and a criterion
whose threshold is the whole run's exact value is never decided early: its settings run on
every image and end with the whole run's verdict."""

from __future__ import annotations

import json

import pytest
from fortis.client import FortisClient, progress_of

from tests.conftest import API_KEY

pytestmark = pytest.mark.slow

PLAN = """
name: e2e-sequential
seed: 7
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 256}
correctness: {mode: top1}
corruptions:
  - {id: gaussian_noise, severities: [1, 3, 5]}
  - {id: contrast, severities: [1, 5]}
  - {id: brightness, severities: [2]}
attacks:
  - {id: fgsm, surrogate: fmnist-surrogate, params: {epsilon: 0.1}}
  - {id: square, params: {epsilon: 0.1, max_queries: 30}, limit: 32}
execution: {batch_size: 32}
acceptance:
%s
"""

CRITERIA = """  accuracy: ">= 0.6"
  average_robustness_corr: ">= 0.3"
  corruptions.contrast.mean: ">= 0.05"
  attacks.fgsm.success_rate: "<= 0.9"
"""


def _run(fc: FortisClient, text: str, out) -> dict:
    ev = fc.submit(text)
    final = fc.wait(ev.evaluation_id)
    assert progress_of(final).state == "SUCCEEDED", final.error.message
    js, _ = fc.write_report(ev.evaluation_id, out)
    return json.loads(js.read_text())


def _value(report: dict, metric: str) -> float:
    m = report["metrics"]
    if metric == "accuracy" or metric.startswith("average"):
        return m[metric]["value"]
    if metric.startswith("corruptions."):
        _, name, what = metric.split(".")
        return m["corruptions"][name][what]["robustness"]
    _, name, what = metric.split(".")
    return m["attacks"][name][what]


@pytest.fixture(scope="module")
def module_stack(tmp_path_factory, fmnist_target, fmnist_surrogate):
    """The five services in one process, shared by this module's evaluations."""
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    s = start_stack(StackSettings(
        state_dir=tmp_path_factory.mktemp("state"), api_keys={API_KEY: "tenant-a"},
        targets=[TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn")],
        max_message_bytes=8 * 1024 * 1024))
    yield s
    s.stop(0)


@pytest.fixture(scope="module")
def runs(module_stack, tmp_path_factory):
    out = tmp_path_factory.mktemp("seq")
    with FortisClient(module_stack.address, api_key=API_KEY) as fc:
        whole = _run(fc, PLAN % CRITERIA, out / "whole")
        seq = _run(fc, PLAN % ("  sequential: true\n" + CRITERIA), out / "seq")
    return whole, seq


def test_the_same_verdict_with_fewer_queries(runs):
    whole, seq = runs
    assert [(c["metric"], c["outcome"]) for c in seq["verdict"]["criteria"]] == \
        [(c["metric"], c["outcome"]) for c in whole["verdict"]["criteria"]]
    assert seq["verdict"]["status"] == whole["verdict"]["status"] == "pass"
    assert seq["ledger"]["total_queries"] < whole["ledger"]["total_queries"]
    rows = {r["setting"]: r for r in seq["sequential"]["settings"]}
    # the corruptions the average reads stopped early, all on the same prefix
    used = {rows[k]["images_used"] for k in rows if "@" in k}
    assert len(used) == 1 and used.pop() < 256
    # the ledger's corruption session holds exactly the images the settings were sent
    eid = seq["evaluation"]["id"]
    assert seq["ledger"]["sessions"][f"{eid}/corruptions"] == sum(
        r["images_used"] for k, r in rows.items() if "@" in k)
    # square: no criterion reads it, so it ran on every image of its limit
    assert rows["square"]["status"] == "full" and rows["square"]["images_used"] == 32
    # the clean pass runs on every image (the attacks' success rates are counted over it)
    assert seq["ledger"]["sessions"][f"{eid}/clean"] == 256
    # the saved queries are the planned ones not sent (fixed settings: exact)
    fixed = [r for r in rows.values() if r["queries_saved_kind"].startswith("exact")]
    assert all(r["queries_saved_estimate"] == r["images_planned"] - r["images_used"]
               for r in fixed)
    # the metrics tree counts each stopped setting over the images it was sent (M_j)
    g = seq["metrics"]["corruptions"]["gaussian_noise"]["5"]
    assert g["m"] == rows["gaussian_noise@5"]["images_used"]


def test_decided_intervals_cover_the_whole_runs_value_and_are_time_uniform(runs):
    whole, seq = runs
    crit = {c["metric"]: c for c in seq["sequential"]["criteria"]}
    assert set(crit) == {"accuracy", "average_robustness_corr", "corruptions.contrast.mean",
                         "attacks.fgsm.success_rate"}
    for metric, c in crit.items():
        lo, hi = c["interval"]
        assert lo <= _value(whole, metric) <= hi, (metric, c, _value(whole, metric))
        assert c["outcome"] in ("pass", "fail")
    # accuracy's clean pass saw every image: its interval is the exact value
    acc = crit["accuracy"]
    assert acc["images"] == acc["population"] == 256
    assert acc["interval"][0] == pytest.approx(acc["interval"][1], abs=1e-3)
    # the verdict reads the time-uniform interval, not the Wilson interval of the prefix
    judged = {c["metric"]: c for c in seq["verdict"]["criteria"]}
    avg = judged["average_robustness_corr"]
    assert avg["interval"] == "time-uniform" and avg["ci95"] == crit[
        "average_robustness_corr"]["interval"]
    assert "sequential" in avg["text"] and avg["confidence"] == "conclusive"
    # the report's tests say how many images each setting was sent
    tests = {t.get("id"): t for t in seq["tests"]}
    assert tests["gaussian_noise"]["sequential"]["status"].startswith("stopped")


def test_a_criterion_at_its_exact_value_is_never_decided_early(runs, module_stack,
                                                               tmp_path):
    """The threshold is the whole run's value of gaussian_noise@5, so the setting can only be
    decided early by a confidence sequence that excludes the true value: it runs on every
    image and is judged on the exact value, as the whole run judged it.

    The sequence covers the true value at every prefix with 95 % over the random order,
    not always: under seed 29 the first 64 images in the order held 4 of the 50 images
    robust at that severity (a 1-in-1,200 hypergeometric draw) and the criterion was
    decided, wrongly, at 64 images -- what a 95 % procedure may do on a rare order. The
    rates over many orders are measured by ``bench/sequential.py``."""
    whole, _ = runs
    exact = whole["metrics"]["corruptions"]["gaussian_noise"]["5"]["robustness"]
    crit = f'  sequential: true\n  corruptions.gaussian_noise.5: ">= {exact!r}"\n'
    with FortisClient(module_stack.address, api_key=API_KEY) as fc:
        rep = _run(fc, PLAN % crit, tmp_path)
    rows = {r["setting"]: r for r in rep["sequential"]["settings"]}
    assert rows["gaussian_noise@5"]["images_used"] == 256
    assert not rows["gaussian_noise@5"]["stopped_early"]
    (c,) = rep["verdict"]["criteria"]
    assert c["outcome"] == "pass" and c["value"] == pytest.approx(exact)
    # settings no criterion reads ran on every image (the default, ``unreferenced: run``)
    assert rows["contrast@1"]["images_used"] == 256 and rows["fgsm"]["images_used"] == 256


def test_unreferenced_settings_are_skipped_when_the_plan_says_so(module_stack, tmp_path):
    crit = ('  sequential: {unreferenced: skip}\n'
            '  attacks.fgsm.success_rate: "<= 0.95"\n')
    with FortisClient(module_stack.address, api_key=API_KEY) as fc:
        rep = _run(fc, PLAN % crit, tmp_path)
    eid = rep["evaluation"]["id"]
    rows = {r["setting"]: r for r in rep["sequential"]["settings"]}
    assert rows["square"]["status"] == "skip" and rows["square"]["images_used"] == 0
    assert all(rows[k]["status"] == "skip" for k in rows if "@" in k)
    sessions = rep["ledger"]["sessions"]
    assert f"{eid}/corruptions" not in sessions or sessions[f"{eid}/corruptions"] == 0
    assert not any("/attack/square/" in s for s in sessions)
    assert rows["fgsm"]["stopped_early"] and rep["verdict"]["status"] == "pass"
    tests = {t.get("id"): t for t in rep["tests"]}
    assert tests["square"]["sequential"]["status"].startswith("skipped")


def test_a_query_attack_stops_after_the_chunks_in_flight(module_stack, tmp_path):
    """A query attack advances as many chunks as it keeps in flight (four); once its
    success-rate criterion is decided no further chunk session is opened."""
    plan = PLAN.replace("limit: 32}", "limit: 256}") % (
        '  sequential: true\n  attacks.square.success_rate: "<= 0.99"\n')
    with FortisClient(module_stack.address, api_key=API_KEY) as fc:
        rep = _run(fc, plan, tmp_path)
    rows = {r["setting"]: r for r in rep["sequential"]["settings"]}
    sq = rows["square"]
    assert sq["images_used"] == 4 * 32 and sq["stopped_early"] and sq["images_planned"] == 256
    chunks = sorted(s for s in rep["ledger"]["sessions"] if "/attack/square/" in s)
    assert [c.split("/")[-2] for c in chunks] == ["00000", "00001", "00002", "00003"]
    assert sq["queries_used"] == sum(rep["ledger"]["sessions"][c] for c in chunks)
    assert sq["queries_upper_bound"] == 256 * 30 and 0 < sq["queries_saved_estimate"] <= 128 * 30
    assert rep["metrics"]["attacks"]["square"]["m"] == 128
    (c,) = rep["sequential"]["criteria"]
    assert c["outcome"] == "pass" and c["images"] == 128 and c["interval"][1] < 0.99
