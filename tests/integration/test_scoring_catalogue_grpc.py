"""The scoring service over real gRPC on loopback: ScoreEvaluation streams a whole evaluation
as arrays and answers typed metrics (IEEE-M1..M8, RANK-1..3, DEG-2..4) equal to the in-process
domain, malformed streams get INVALID_ARGUMENT naming the field; the metric catalogue:
ListMetrics lists every family with its inputs; Compute runs one by name on tensors and JSON
params and gives the same numbers as the domain code in-process; bad input gets a precise
INVALID_ARGUMENT naming the field and the service keeps serving. Also `fortis score` on a
file in the documented format (inline arrays and .npz references)."""

from __future__ import annotations

import json
import subprocess
import sys

import grpc
import numpy as np
import pytest
from fortis.core.tensors import array_to_tensor
from fortis.scoring.v1 import scoring_pb2, scoring_pb2_grpc
from fortis.services.scoring.catalogue import compute
from fortis.services.scoring.ranking import drr
from google.protobuf import json_format
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from tests.conftest import MD


def _fields(exc: grpc.RpcError) -> list[str]:
    st = rpc_status.from_call(exc)
    assert st is not None
    for d in st.details:
        br = error_details_pb2.BadRequest()
        if d.Unpack(br):
            return [v.field for v in br.field_violations]
    raise AssertionError("no BadRequest detail")


def _probs(m: int, c: int, seed: int) -> np.ndarray:
    z = np.random.default_rng(seed).normal(size=(m, c)) * 3
    e = np.exp(z - z.max(1, keepdims=True))
    return (e / e.sum(1, keepdims=True)).astype(np.float64)


@pytest.fixture()
def sc(channel):
    return scoring_pb2_grpc.ScoringServiceStub(channel)


def _request(metric: str, arrays: dict[str, np.ndarray], params: dict | None = None):
    req = scoring_pb2.ComputeRequest(metric=metric)
    for k, v in arrays.items():
        req.arrays[k].CopyFrom(array_to_tensor(v))
    if params:
        req.params.update(params)
    return req


def test_list_metrics_covers_the_families(sc):
    items = sc.ListMetrics(scoring_pb2.ListMetricsRequest(), metadata=MD).metrics
    refs = {r for m in items for r in m.refs}
    assert {"RANK-1", "RANK-2", "DEG-2", "CAN-1", "CAN-2", "CAN-3", "CAN-4", "CAN-5"} <= refs
    for m in items:
        assert m.description and m.inputs, m.id


def test_compute_over_grpc_equals_in_process(sc):
    """RANK-2 and CAN-1/CAN-4 through the wire give the in-process numbers (float64 and
    uint8 tensors survive the trip)."""
    benign, pert = _probs(50, 10, 1), _probs(50, 10, 2)
    cls = benign.argmax(1).astype(np.int64)
    resp = sc.Compute(_request("drr", {"perturbed_probs": pert, "benign_class": cls}, {"k": 3}),
                      metadata=MD)
    got = json_format.MessageToDict(resp.result)
    local = compute("drr", {"perturbed_probs": pert, "benign_class": cls}, {"k": 3})
    assert got == json.loads(json.dumps(local))
    # the per-image value is the seed's DRR (RANK-2) recomputed independently
    one = drr(pert[0], int(cls[0]), k=3)
    assert np.isclose(got["per_image"]["drr"][0] or 0.0, one["drr"] or 0.0)
    rng = np.random.default_rng(0)
    clean = rng.integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
    adv = np.clip(clean.astype(int) + rng.integers(-8, 9, clean.shape), 0, 255).astype(np.uint8)
    resp = sc.Compute(_request("canary.perturbation_cost", {"clean": clean, "adversarial": adv}), metadata=MD)
    pc = json_format.MessageToDict(resp.result)
    assert np.isclose(pc["AMD"]["value"], np.abs(adv.astype(float) - clean).max(axis=(1, 2, 3)).mean() / 255)
    labels = cls
    cap = json_format.MessageToDict(sc.Compute(_request("canary.model_capability",
                                                        {"labels": labels, "clean": benign}), metadata=MD).result)
    assert cap["CA"]["value"] == 1.0      # labels are the argmax of the clean answers


@pytest.mark.parametrize("metric,arrays,params,field", [
    ("nope", {}, None, "metric"),
    ("drr", {"perturbed_probs": np.zeros((2, 3))}, None, "arrays.benign_class"),
    ("drr", {"perturbed_probs": np.zeros((2, 3)), "benign_class": np.zeros(2, np.int64)}, {"kk": 1}, "params.kk"),
    ("canary.attack_cost", {}, None, "params.kind"),
])
def test_bad_compute_names_the_field(sc, metric, arrays, params, field):
    with pytest.raises(grpc.RpcError) as ei:
        sc.Compute(_request(metric, arrays, params), metadata=MD)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in _fields(ei.value), ei.value.details()
    # a tensor whose bytes do not match its shape
    req = scoring_pb2.ComputeRequest(metric="drr")
    req.arrays["perturbed_probs"].CopyFrom(array_to_tensor(np.zeros((2, 3))))
    req.arrays["perturbed_probs"].shape[:] = [5, 3]
    with pytest.raises(grpc.RpcError) as ei:
        sc.Compute(req, metadata=MD)
    assert "arrays.perturbed_probs.data" in _fields(ei.value)
    assert sc.ListMetrics(scoring_pb2.ListMetricsRequest(), metadata=MD).metrics   # still serving


def test_fortis_score_reads_the_documented_file_format(tmp_path):
    benign, pert = _probs(20, 6, 3), _probs(20, 6, 4)
    np.savez(tmp_path / "outputs.npz", pert=pert, cls=benign.argmax(1))
    (tmp_path / "drr.json").write_text(json.dumps({
        "metric": "drr", "params": {"k": 5},
        "arrays": {"perturbed_probs": "outputs.npz:pert", "benign_class": "outputs.npz:cls"}}))
    r = subprocess.run([sys.executable, "-m", "fortis.server.cli", "score", str(tmp_path / "drr.json")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["metric"] == "drr"
    assert out["result"] == json.loads(json.dumps(compute(
        "drr", {"perturbed_probs": pert, "benign_class": benign.argmax(1)}, {"k": 5})))
    # inline arrays
    (tmp_path / "cap.json").write_text(json.dumps({
        "metric": "canary.model_capability",
        "arrays": {"labels": [0, 1, 1], "clean": [[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]}}))
    r = subprocess.run([sys.executable, "-m", "fortis.server.cli", "score", str(tmp_path / "cap.json")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert abs(json.loads(r.stdout)["result"]["CA"]["value"] - 2 / 3) < 1e-9
    # bad files: exit 2 with the reason
    (tmp_path / "bad.json").write_text(json.dumps({"metric": "drr", "arrays": {}}))
    r = subprocess.run([sys.executable, "-m", "fortis.server.cli", "score", str(tmp_path / "bad.json")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "arrays.perturbed_probs" in r.stderr


def test_ieee_scoring_of_all_three_task_types_from_recorded_answers(sc):
    """IEEE-C2/C4/C5 and IEEE-M1/M2/M4 re-scored by name from recorded answers (the `fortis
    score` file format), for classification, detection (normalised boxes, 1-indexed labels)
    and segmentation (mIoU over the classes of interest), over gRPC."""
    cls = {"rule": {"mode": "topk", "k": 2},
           "labels": {"a": [3], "b": [1]},
           "tests": [{"kind": "clean", "predictions": {"a": {"labels": [0, 3], "scores": [0.6, 0.3]},
                                                       "b": {"labels": [1, 2], "scores": [0.9, 0.1]}}},
                     {"kind": "corruption", "perturbation_id": "fog", "severity": 2,
                      "predictions": {"a": {"labels": [0, 2]}, "b": {"labels": [2, 1]}}}]}
    r = json_format.MessageToDict(sc.Compute(_request("ieee.classification", {}, cls), metadata=MD).result)
    assert r["accuracy"]["value"] == 1.0                        # top-2 holds for both
    assert r["corruptions"]["fog"]["2"]["robustness"] == 0.5    # a lost its label, b kept it
    assert r["worstcase_robustness_corr"]["value"] == 0.5
    det = {"criterion": {"mode": "threshold", "iou_threshold": 0.5},
           "truths": {"x": {"boxes": [[10, 10, 50, 50]], "labels": [2], "box_format": "xyxy"}},
           "tests": [{"kind": "clean", "predictions": {"x": {
                          "boxes": [[0.1, 0.1, 0.4, 0.4]], "labels": [3], "scores": [0.9],
                          "box_format": "xywhn", "label_base": 1, "image_size": [100, 100]}}},
                     {"kind": "corruption", "perturbation_id": "snow", "severity": 5, "predictions": {
                         "x": {"boxes": [[60, 60, 90, 90]], "labels": [2], "scores": [0.9]}}}]}
    r = json_format.MessageToDict(sc.Compute(_request("ieee.detection", {}, det), metadata=MD).result)
    assert r["accuracy"]["value"] == 1.0            # normalised xywh, label 3 (1-based) = 2
    assert r["corruptions"]["snow"]["5"]["robustness"] == 0.0
    truth = np.zeros((2, 8, 8), np.int64)
    truth[:, 2:6, 2:6] = 1
    good = truth.copy()
    bad = np.zeros_like(truth)
    seg = {"criterion": {"classes": [1], "miou_threshold": 0.5},
           "tests": [{"kind": "clean"}, {"kind": "corruption", "perturbation_id": "blur", "severity": 1}]}
    r = json_format.MessageToDict(sc.Compute(_request("ieee.segmentation",
                                                      {"truth": truth, "masks@0": good, "masks@1": bad}, seg),
                                             metadata=MD).result)
    assert r["accuracy"]["value"] == 1.0 and r["corruptions"]["blur"]["1"]["robustness"] == 0.0
    with pytest.raises(grpc.RpcError) as ei:
        sc.Compute(_request("ieee.segmentation", {"truth": truth, "masks@0": good}, seg), metadata=MD)
    assert "arrays.masks@1" in _fields(ei.value)


def test_list_metrics_pages_with_opaque_tokens(sc):
    whole = [m.id for m in sc.ListMetrics(scoring_pb2.ListMetricsRequest(), metadata=MD).metrics]
    got, token = [], ""
    while True:
        page = sc.ListMetrics(scoring_pb2.ListMetricsRequest(page_size=4, page_token=token),
                              metadata=MD)
        assert len(page.metrics) <= 4
        got += [m.id for m in page.metrics]
        token = page.next_page_token
        if not token:
            break
    assert got == whole and len(whole) > 4
    assert all(i.kind in (scoring_pb2.INPUT_KIND_ARRAY, scoring_pb2.INPUT_KIND_PARAM)
               for m in page.metrics for i in m.inputs)
    for bad in ("garbage!", "bWV0cmljcy1vZmZzZXQ6OTk5OQ", "AAAA"):
        with pytest.raises(grpc.RpcError) as ei:
            sc.ListMetrics(scoring_pb2.ListMetricsRequest(page_token=bad), metadata=MD)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert _fields(ei.value) == ["page_token"]
    with pytest.raises(grpc.RpcError) as ei:
        sc.ListMetrics(scoring_pb2.ListMetricsRequest(page_size=-1), metadata=MD)
    assert _fields(ei.value) == ["page_size"]


def test_compute_reads_integer_params_from_struct_doubles(sc):
    """Struct numbers are doubles: an entry takes 3.0 as the integer 3 and names a param that
    is not integral (no generic repair of the whole tree)."""
    benign, pert = _probs(30, 6, 5), _probs(30, 6, 6)
    got = json_format.MessageToDict(sc.Compute(_request(
        "ndcg", {"perturbed_probs": pert, "benign_probs": benign}, {"positions": 3}),
        metadata=MD).result)
    assert len(got["mean"]["ndcg_at"]) == 3
    with pytest.raises(grpc.RpcError) as ei:
        sc.Compute(_request("drr", {"perturbed_probs": pert,
                                    "benign_class": benign.argmax(1).astype(np.int64)},
                            {"k": 2.5}), metadata=MD)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and _fields(ei.value) == ["params.k"]


def test_score_evaluation_over_grpc_equals_in_process(sc):
    """A whole evaluation streamed as arrays (clean, corruptions, a transfer attack on a
    subset, a query attack, degradation levels; failed queries) gives the typed response the
    domain computes in-process, and the per-record IEEE numbers (IEEE-M1..M8)."""
    from fortis.services.scoring.convert import read_evaluation, response_from_scores
    from fortis.services.scoring.evaluation_scoring import score_evaluation
    from fortis.services.scoring.ieee import CorrectnessRule

    from tests.unit.scoring_arrays_cases import random_case, requests

    case = random_case(11, rule=CorrectnessRule(mode="topk", k=3))
    reqs = requests(case)
    resp = sc.ScoreEvaluation(iter(reqs), metadata=MD)
    local = response_from_scores(score_evaluation(*read_evaluation(reqs)))
    assert resp == local
    assert resp.ieee.m == 60 and resp.ieee.accuracy.HasField("ci95_low")
    assert {a.name: a.kind for a in resp.ieee.attacks} == {
        "fgsm": scoring_pb2.ATTACK_SCORING_TRANSFER, "square": scoring_pb2.ATTACK_SCORING_QUERY}
    assert resp.ieee.m_per_attack["fgsm"] == 30 and resp.ieee.m_per_attack["square"] == 20
    assert resp.ranking.applicable and {s.name for s in resp.ranking.settings} == {
        "fog@1", "fog@3", "noise@1", "noise@3", "fgsm"}
    assert resp.degradation[0].name == "blur" and resp.query_errors.total > 0


def _setup_msg(**kw):
    base = dict(image_ids=["a", "b"],
                classification=scoring_pb2.ClassificationTruth(labels=[
                    scoring_pb2.LabelSet(labels=[1]), scoring_pb2.LabelSet(labels=[2])]),
                correctness=scoring_pb2.CorrectnessRule(mode=scoring_pb2.CORRECTNESS_MODE_TOP1))
    base.update(kw)
    return scoring_pb2.ScoreEvaluationRequest(setup=scoring_pb2.ScoringSetup(**base))


def _clean_msg(labels=None, **kw):
    s = scoring_pb2.SettingAnswers(kind=scoring_pb2.SETTING_KIND_CLEAN, **kw)
    s.classification.labels.CopyFrom(array_to_tensor(
        np.array([[1], [0]], np.int64) if labels is None else labels))
    return scoring_pb2.ScoreEvaluationRequest(setting=s)


def test_malformed_streams_are_invalid_argument_naming_the_field(sc):
    ok = [_setup_msg(), _clean_msg()]
    broken_tensor = _clean_msg()
    broken_tensor.setting.classification.labels.shape[:] = [3, 1]
    nan_rule = _setup_msg(correctness=scoring_pb2.CorrectnessRule(
        mode=scoring_pb2.CORRECTNESS_MODE_THRESHOLD, threshold=float("nan")))
    cases = [
        ([], "setup"),
        (ok[1:], "setup"),
        (ok + ok[:1], "setup"),
        ([ok[0], scoring_pb2.ScoreEvaluationRequest()], "setting[0]"),
        ([ok[0], scoring_pb2.ScoreEvaluationRequest(setting=scoring_pb2.SettingAnswers())],
         "setting[0].kind"),
        ([ok[0], broken_tensor], "setting[0].classification.labels.data"),
        ([ok[0], _clean_msg(np.array([[1], [0], [2]], np.int64))],
         "setting[0].classification.labels"),
        ([_setup_msg(image_ids=["a", "b", "c"]), ok[1]], "setup.classification.labels"),
        ([nan_rule, ok[1]], "setup.correctness.threshold"),
        ([_setup_msg(correctness=scoring_pb2.CorrectnessRule(mode=9)), ok[1]],
         "setup.correctness.mode"),
        ([_setup_msg(correctness=None, detection_criterion=scoring_pb2.DetectionCriterion()),
          ok[1]], "setup.correctness"),
        ([ok[0]], "setting"),
        ([ok[0], _clean_msg(errors=["x"])], "setting[0].errors"),
        ([ok[0], ok[1], _clean_msg()], "setting[1].kind"),
    ]
    for stream, field in cases:
        with pytest.raises(grpc.RpcError) as ei:
            sc.ScoreEvaluation(iter(stream), metadata=MD)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (field, ei.value.details())
        assert _fields(ei.value)[0] == field, ei.value.details()
    resp = sc.ScoreEvaluation(iter(ok), metadata=MD)                  # still serving
    assert resp.ieee.accuracy.value == 0.5 and resp.ieee.accuracy.correct == 1
    assert not resp.ranking.applicable
