"""The scoring service's metric catalogue over real gRPC on loopback (issue 4, item 7):
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
from fortis.scoring.v1 import scoring_pb2, scoring_pb2_grpc
from fortis.services.common.codec import array_to_tensor
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
    r = subprocess.run([sys.executable, "-m", "fortis.cli", "score", str(tmp_path / "drr.json")],
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
    r = subprocess.run([sys.executable, "-m", "fortis.cli", "score", str(tmp_path / "cap.json")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert abs(json.loads(r.stdout)["result"]["CA"]["value"] - 2 / 3) < 1e-9
    # bad files: exit 2 with the reason
    (tmp_path / "bad.json").write_text(json.dumps({"metric": "drr", "arrays": {}}))
    r = subprocess.run([sys.executable, "-m", "fortis.cli", "score", str(tmp_path / "bad.json")],
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
