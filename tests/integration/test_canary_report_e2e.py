"""A plan with ``canary: true`` through the real services (five gRPC services on loopback, the
real Fashion-MNIST CNN, real adversarials): the report's CANARY section (CAN-1..CAN-4 per
attack, computed by the scoring service's Compute) agrees with independent recomputations --
the model's own probabilities on the dataset images and on the adversarials the evaluation
stored, the report's own success counts and query means -- and each query attack's
success-vs-queries curve (IEEE-M6) ends at its success rate at the budget, with PER-4's
fooling rate over the images attacked."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from fortis.adapters.torch_models.datasets import load_fashion_mnist
from fortis.client import FortisClient, progress_of
from fortis.services.scoring.canary import attack_effect, model_capability, perturbation_cost

from tests.conftest import API_KEY

pytestmark = pytest.mark.usefixtures("one_thread")

M = 48
BATCH = 16
Q = 16           # images of each query attack (image 12 is misclassified: not attacked)
PLAN = f"""
name: canary-e2e
seed: 5
target: {{name: fmnist-cnn, task: classification}}
dataset: {{source: fashion-mnist, split: test, limit: {M}}}
correctness: {{mode: top1}}
canary: true
attacks:
  - {{id: fgsm, surrogate: fmnist-surrogate, params: {{epsilon: 0.15}}}}
  - {{id: square, params: {{epsilon: 0.2, max_queries: 40}}, limit: {Q}}}
  - {{id: pertknob, name: knob, params: {{property: per_contrast_reduction, cells: 256,
      max_queries: 12}}, limit: {Q}}}
execution: {{batch_size: {BATCH}}}
"""


def _adversarials(store: Any, eid: str, name: str, n: int) -> np.ndarray:
    """The uint8 adversarials the evaluation stored for ``name`` (CAN-9 artifacts)."""
    out = []
    for c in range(-(-n // BATCH)):
        with np.load(io.BytesIO(store.artifact(eid, f"adversarial/{name}-{c:05d}.npz"))) as z:
            out.append(z["adversarial_uint8"])
    return np.concatenate(out)


def _close(report: Any, direct: Any, path: str = "") -> None:
    """The report's Compute result equals the direct computation: numbers to float32
    precision (answers travel as float32), the same keys, statuses and Nones."""
    if isinstance(direct, dict):
        assert isinstance(report, dict) and set(report) == set(direct), (path, report, direct)
        for k in direct:
            _close(report[k], direct[k], f"{path}.{k}")
    elif isinstance(direct, float) and np.isfinite(direct):
        assert report == pytest.approx(direct, rel=1e-5, abs=1e-6), path
    elif isinstance(direct, float):
        assert report is None, path
    else:
        assert report == direct, path


def test_canary_section_and_query_curves(stack, fmnist_target) -> None:
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        ev = fc.submit(PLAN)
        final = fc.wait(ev.evaluation_id)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
        report = fc.report(ev.evaluation_id)
    eid = report["evaluation"]["id"]
    store = stack.manager.store.for_tenant("tenant-a")
    x, y = load_fashion_mnist("test", limit=M)
    clean_p = fmnist_target.predict_proba(x)
    m, can = report["metrics"], report["canary"]
    assert set(can) == {"model", "attacks", "notes"} and set(can["attacks"]) == {
        "fgsm", "square", "knob"}

    # CAN-1 on the model's own probabilities of the same images; CA is IEEE-M1's accuracy
    _close(can["model"], model_capability(y, clean_p), "model")
    assert can["model"]["CA"]["value"] == pytest.approx(m["accuracy"]["value"])
    assert can["model"]["CC"]["status"] == "ok"

    # CAN-2 of the transfer attack on the stored adversarials; MR = the report's success count
    fg, fgm = can["attacks"]["fgsm"], m["attacks"]["fgsm"]
    adv = _adversarials(store, eid, "fgsm", M)
    _close(fg["effect"], attack_effect(y, clean_p, fmnist_target.predict_proba(adv)), "effect")
    assert fg["effect"]["MR"]["value"] == pytest.approx(fgm["successes"] / fgm["success_rate_n"])
    assert fg["effect"]["n"] == fgm["success_rate_n"]
    # CAN-4 on the same stored images; AMD is the report's mean L-inf (IEEE-A9)
    _close(fg["perturbation"], perturbation_cost(x, adv), "perturbation")
    assert fg["perturbation"]["AMD"]["value"] == pytest.approx(fgm["mean_linf"], rel=1e-6)
    assert fg["perturbation"]["AMD"]["value"] == pytest.approx(
        float(np.max(np.abs(adv.astype(float) - x) / 255, axis=(1, 2, 3)).mean()))
    # CAN-3: crafted on the surrogate, nothing asked of the target while crafting
    assert fg["cost"]["kind"] == "transfer"
    assert fg["cost"]["QNC_F"]["value"] == 0 and fg["cost"]["QNC_B"]["value"] == 0
    # CAN-3 CTC: the stages time each crafted chunk / query-attack chunk
    assert fg["cost"]["CTC"]["status"] == "ok" and fg["cost"]["CTC"]["value"] > 0

    for name, kind, budget in (("square", "score", 40), ("knob", "decision", 12)):
        a, node = can["attacks"][name], m["attacks"][name]
        assert node["clean_mismatches"] == 0 and node["m"] == Q
        # CAN-3 from the ledger: QNC-F over the images attacked is IEEE-M6's mean queries
        assert a["cost"]["kind"] == kind and a["cost"]["QNC_B"]["value"] == 0
        assert a["cost"]["QNC_F"]["value"] == pytest.approx(node["mean_queries"])
        assert a["cost"]["n"] == node["success_rate_n"]
        assert a["effect"]["status"] == "not available"      # no answer on the final image
        # CAN-4 over the images attacked, on the stored adversarials
        qadv = _adversarials(store, eid, name, Q)
        right = clean_p[:Q].argmax(axis=1) == y[:Q]
        assert a["perturbation"]["n_total"] == node["success_rate_n"] == int(right.sum())
        _close(a["perturbation"], perturbation_cost(x[:Q][right], qadv[right]),
               f"{name}.perturbation")
        # IEEE-M6 curve: monotone, ends at the success rate at the budget
        curve = node["success_by_queries"]
        assert curve[-1] == [budget, pytest.approx(node["success_rate"])]
        assert [p[0] for p in curve] == sorted({p[0] for p in curve})
        assert [p[1] for p in curve] == sorted(p[1] for p in curve)
        assert all(0 < q <= budget for q, _ in curve)
        # PER-4 over the same images attacked, from the stored adversarials: misled = the
        # model is wrong on the adversarial; T = their mean L2; fooled at T when L2 < T
        misled = right & (fmnist_target.predict(qadv) != y[:Q])
        assert int(misled.sum()) == node["successes"] and node["successes"] > 0
        l2 = np.sqrt((((qadv.astype(float) - x[:Q]) / 255) ** 2).sum(axis=(1, 2, 3)))[misled]
        assert node["fooling_threshold"] == pytest.approx(l2.mean())
        assert node["fooling_rate"] == pytest.approx((l2 < l2.mean()).sum() / right.sum())
        assert node["never_fooled"] == pytest.approx(1 - node["success_rate"])
    assert all(a["cost"]["CTC"]["status"] == "ok" for a in can["attacks"].values())
    names = " ".join(u["name"] for u in report["metrics_used"])
    assert "CANARY attack effect" in names and "against queries" in names
    assert "Fooling rate" in names


@pytest.mark.parametrize(("target", "what"), [("fmnist-cnn-top3", "top-3"),
                                              ("fmnist-cnn-label", "labels only")])
def test_canary_on_top_k_and_label_only_targets(stack, fmnist_target, target, what) -> None:
    """A top-k or label-only target: CANARY gets the top-1 labels, the confidence metrics
    (CC, AIAC, ARTC) are "not available" and a note says why; a targeted attack's TAS is
    over the images whose true label is not the target (CAN-2 needs y_adv != y)."""
    n, goal = 16, 3
    plan = f"""
name: canary-{target}
seed: 5
target: {{name: {target}, task: classification}}
dataset: {{source: fashion-mnist, split: test, limit: {n}}}
canary: true
attacks:
  - {{id: fgsm, surrogate: fmnist-surrogate, params: {{epsilon: 0.3}}, targeted: {{label: {goal}}}}}
"""
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        ev = fc.submit(plan)
        final = fc.wait(ev.evaluation_id)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
        report = fc.report(ev.evaluation_id)
    can = report["canary"]
    x, y = load_fashion_mnist("test", limit=n)
    assert any(what in note and "CC, AIAC and ARTC" in note for note in can["notes"])
    assert can["model"]["CC"]["status"] == "not available"
    assert can["model"]["CA"]["value"] == pytest.approx(report["metrics"]["accuracy"]["value"])
    effect = can["attacks"]["fgsm"]["effect"]
    assert effect["AIAC"]["status"] == effect["ARTC"]["status"] == "not available"
    adv = _adversarials(stack.manager.store.for_tenant("tenant-a"), report["evaluation"]["id"],
                        "fgsm", n)
    keep = y != goal
    _close(effect, attack_effect(y[keep], fmnist_target.predict(x)[keep],
                                 fmnist_target.predict(adv)[keep],
                                 target_labels=np.full(int(keep.sum()), goal)), "effect")
    assert effect["TAS"]["status"] == "ok"
    assert not keep.all()               # image 13 is a class-3 image: left out, and said so
    assert any("left out of CAN-2" in note for note in can["notes"])
