"""End to end: multi-target plans (CANARY benchmarks, CAN-5/7/8) on detectors and segmenters,
through the real services, the proxy and the built-in models.

- Detection: the facenet-pytorch ``mtcnn`` cascade and the OpenCV ``haar-face`` cascade, both
  standing for themselves through ``mtcnn-surrogate`` (MTCNN's nets in torch: haar-face has
  no differentiable twin, so the tester's face-detector surrogate stands for it too). PGD is
  crafted once on the surrogate and sent to both; the photos of the transfer e2e test
  (astronaut, astronaut beside its mirror image, the coffee cup without a face).
- Segmentation: ``u2netp`` (probabilities) and ``u2netp-masks`` (the same model behind an API
  that returns class maps only), both through ``u2netp-surrogate``, the second declared the
  "defended" version of the first so CAN-5 runs on per-image verdicts: the two answer alike,
  so AV, RR and SR are exactly 0 and the two rows of the matrix are equal.

Checks (properties and cross-checks, not recorded numbers): every entry of the K x S x M
matrix is the share of the images a model got right under the plan's IEEE-C4 / C5 rule that
the transfer examples make it get wrong -- re-judged here with the scoring service's own rule
on the in-process model's answers to the stored uint8 examples; each model's ledger session
of the shared setting received every image once and the examples were crafted once; the
examples respect the L-inf bound; the classifier-only CANARY metrics are "not applicable"
with a reason, never 0. The figures are printed for the notes.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from fortis.client import FortisClient, progress_of

from tests.e2e.test_attacks_tasks import _detection_data, _segmentation_data

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

KEY = "test-key-benchmark-tasks"
DET_RULE = {"mode": "threshold", "iou_threshold": 0.5, "confidence_threshold": 0.5}


def _segmentation_pair(root: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The segmentation e2e's astronaut and its mirror image (two images, one manifest)."""
    images, truth = _segmentation_data(root)
    img, mask = images["astronaut"], truth["astronaut"]
    flip, fmask = np.ascontiguousarray(img[:, ::-1]), np.ascontiguousarray(mask[:, ::-1])
    cv2.imwrite(str(root / "mirror.png"), cv2.cvtColor(flip, cv2.COLOR_RGB2BGR))
    cv2.imwrite(str(root / "mirror-mask.png"), fmask.astype(np.uint8))
    with open(root / "manifest.jsonl", "a") as f:
        f.write(json.dumps({"id": "mirror", "image": "mirror.png", "mask": "mirror-mask.png"})
                + "\n")
    return {**images, "mirror": flip}, {**truth, "mirror": fmask}


def _detection_correct(model: Any, truth: np.ndarray, img: np.ndarray) -> bool:
    """The scoring service's IEEE-C4 verdict on ``model``'s answer to ``img``."""
    from fortis.core.criteria import DetectionCriterion
    from fortis.services.scoring.correctness import detection_correct
    from fortis.services.scoring.correctness.boxes import Detections

    d = model._answer_batch([img])[0]
    boxes = np.array([[b.x_min, b.y_min, b.x_max, b.y_max] for b in d.boxes]).reshape(-1, 4)
    scores = np.array([b.score for b in d.boxes])
    size = (img.shape[1], img.shape[0])
    t = Detections(boxes=truth, labels=np.zeros(len(truth), np.int64), image_size=size)
    p = Detections(boxes=boxes, labels=np.zeros(len(boxes), np.int64), scores=scores,
                   image_size=size)
    return bool(detection_correct([t], [p], DetectionCriterion.from_dict(DET_RULE))[0])


def _segmentation_correct(model: Any, truth: np.ndarray, img: np.ndarray) -> bool:
    """The scoring service's IEEE-C5 verdict on ``model``'s answer to ``img``."""
    from fortis.core.criteria import SegmentationCriterion
    from fortis.core.tensors import tensor_to_array
    from fortis.services.scoring.correctness.segmentation import segmentation_correct

    cmap = np.asarray(tensor_to_array(model._answer_batch([img])[0].class_map, "class_map"),
                      np.int64)
    return bool(segmentation_correct([cmap], [truth], SegmentationCriterion(
        classes=(1,), miou_threshold=0.5))[0])


def stored_examples(stack: Any, eid: str, setting: str) -> dict[str, np.ndarray]:
    """The uint8 examples of a transfer setting's first chunk, by image id."""
    arts = stack.manager.store.for_tenant("tenant-a")
    npz = np.load(io.BytesIO(arts.artifact(eid, f"adversarial/{setting}-00000.npz")))
    ids = [str(i) for i in npz["image_ids"]]
    if "adversarial_uint8" in npz.files:
        return {i: npz["adversarial_uint8"][k] for k, i in enumerate(ids)}
    return {i: npz[f"adversarial_uint8_{k:05d}"] for k, i in enumerate(ids)}


def rejudged_mr(judge: Any, model: Any, images: dict[str, np.ndarray],
                truth: dict[str, np.ndarray], examples: dict[str, np.ndarray]
                ) -> tuple[float | None, dict[str, tuple[bool, bool]]]:
    """MR re-judged here: the share of images right on the clean image that the example makes
    wrong (None: no image right), and (clean, example) verdicts per image."""
    per = {i: (judge(model, truth[i], images[i]), judge(model, truth[i], examples[i]))
           for i in examples}
    right = [i for i, (c, _) in per.items() if c]
    return (sum(not per[i][1] for i in right) / len(right) if right else None), per


def _run(stack: Any, plan: str, root: Path) -> tuple[dict[str, Any], str, str]:
    with FortisClient(stack.address, api_key=KEY) as fc:
        ev = fc.submit(plan)
        final = fc.wait(ev.evaluation_id, timeout_s=800)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
        eid = ev.evaluation_id
        js, html = fc.report_files(eid)
        return json.loads(js), html, eid


def _start(root: Path, targets: tuple[str, ...]) -> Any:
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    return start_stack(StackSettings(
        state_dir=root / "state", api_keys={KEY: "tenant-a"}, data_root=root / "data",
        whitebox_grants={"tenant-a": frozenset({"*"})},  # twins: granted
        targets=[TargetConfig.parse(t) for t in targets]))


@pytest.fixture(scope="module")
def det(tmp_path_factory: pytest.TempPathFactory, vision_setup: None) -> Iterator[tuple]:
    root = tmp_path_factory.mktemp("bdet")
    (root / "data").mkdir()
    images, truth = _detection_data(root / "data")
    stack = _start(root, ("mtcnn=builtin:mtcnn", "haar-face=builtin:haar-face"))
    yield stack, root, images, truth
    stack.stop(0)


@pytest.fixture(scope="module")
def seg(tmp_path_factory: pytest.TempPathFactory, vision_setup: None) -> Iterator[tuple]:
    root = tmp_path_factory.mktemp("bseg")
    (root / "data").mkdir()
    images, truth = _segmentation_pair(root / "data")
    stack = _start(root, ("u2netp=builtin:u2netp", "u2netp-masks=builtin:u2netp?output=masks"))
    yield stack, root, images, truth
    stack.stop(0)


def _check_shared_setting(stack: Any, eid: str, setting: str, n: int, models: int) -> None:
    """Every model's session of the shared setting received every image once; the examples
    were crafted once (one artifact, no per-model copy)."""
    with FortisClient(stack.address, api_key=KEY) as fc:
        for k in range(models):
            prefix = eid if k == 0 else f"{eid}.m{k}"
            assert fc.session_stats(f"{prefix}/attack/{setting}").queries_ok == n
    names = [a.name for a in stack.manager.store.for_tenant("tenant-a").artifacts(eid)]
    assert names.count(f"adversarial/{setting}-00000.npz") == 1, names
    assert not any(a.endswith(f"/adversarial/{setting}-00000.npz") for a in names), names


def test_detection_benchmark_matrix_is_the_ieee_c4_transfer_rate(det):
    from fortis.adapters.vision_targets.haar import HaarFaceTarget
    from fortis.adapters.vision_targets.mtcnn import MtcnnTarget

    stack, root, images, truth = det
    n, eps = len(images), 0.05
    report, html, eid = _run(stack, f"""
name: benchmark-detection
seed: 11
targets:
  - {{name: mtcnn, task: detection, surrogate: mtcnn-surrogate}}
  - {{name: haar-face, task: detection, surrogate: mtcnn-surrogate}}
dataset: {{source: manifest, path: manifest.jsonl, limit: {n}}}
detection: {{mode: threshold, iou_threshold: 0.5, confidence_threshold: 0.5, aggregate: all}}
corruptions: [{{id: gaussian_noise, severities: [2]}}]
attacks:
  - {{id: pgd, params: {{epsilon: {eps}, steps: 20}}}}
""", root)
    b = report["benchmark"]
    assert b["task"] == "detection" and b["mode"] == "benchmark"
    assert b["model_names"] == ["mtcnn", "haar-face"] and b["sources"] == ["mtcnn-surrogate"]
    assert b["attacks"] == ["pgd"] and b["metric"] == "MR"
    m = b["matrix"]
    assert len(m) == 1 and len(m[0]) == 1 and len(m[0][0]) == 2
    examples = stored_examples(stack, eid, "pgd.mtcnn-surrogate")
    assert set(examples) == set(images)
    for i, a in examples.items():        # IEEE-A9: the images sent are within the bound
        assert a.shape == images[i].shape and a.dtype == np.uint8
        assert np.abs(a.astype(np.int64) - images[i]).max() <= int(eps * 255)
    figures = {}
    for j, model in enumerate((MtcnnTarget(), HaarFaceTarget())):
        mr, per = rejudged_mr(_detection_correct, model, images, truth, examples)
        figures[b["model_names"][j]] = (m[0][0][j], per)
        if mr is None:
            assert m[0][0][j] is None
        else:
            assert m[0][0][j] == pytest.approx(mr)
        own = b["models"][j]["attacks"]["pgd.mtcnn-surrogate"]["success_rate"]
        assert own == m[0][0][j]
    assert m[0][0][0] is not None and m[0][0][0] > 0        # MTCNN loses faces to its twin
    _check_shared_setting(stack, eid, "pgd.mtcnn-surrogate", n, 2)
    # the two models share one surrogate: both rows of the square matrix are its row
    assert b["twoway_models"] == ["mtcnn", "haar-face"]
    sq = b["matrix_square"][0]
    assert sq[0] == sq[1] == m[0][0]
    assert set(b["twoway"]["two_way"]["model_robustness"]["entries"]) == {"mtcnn", "haar-face"}
    assert set(b["irt"]["subjects"]) == {"mtcnn", "haar-face"}
    assert any("IEEE-C4" in note for note in b["notes"])
    assert 'id="benchmark-transfer"' in html
    print("\n[benchmark detection] PGD L-inf 0.05 x20 on mtcnn-surrogate, MR (clean -> "
          "example per image): " + "; ".join(
              f"{name} {v if v is None else round(v, 3)} ({per})"
              for name, (v, per) in figures.items()))


def test_segmentation_benchmark_and_defence_effect_on_verdicts(seg):
    from fortis.adapters.vision_targets.u2netp import U2NetpTarget

    stack, root, images, truth = seg
    n, eps = len(images), 0.03
    report, html, eid = _run(stack, f"""
name: benchmark-segmentation
seed: 11
targets:
  - {{name: u2netp, task: segmentation, surrogate: u2netp-surrogate}}
  - {{name: u2netp-masks, task: segmentation, surrogate: u2netp-surrogate, defends: u2netp}}
dataset: {{source: manifest, path: manifest.jsonl, limit: {n}}}
segmentation: {{classes: [1], miou_threshold: 0.5}}
attacks:
  - {{id: pgd, params: {{epsilon: {eps}, steps: 3}}}}
""", root)
    b = report["benchmark"]
    assert b["task"] == "segmentation" and b["sources"] == ["u2netp-surrogate"]
    m = b["matrix"]
    examples = stored_examples(stack, eid, "pgd.u2netp-surrogate")
    for i, a in examples.items():
        assert np.abs(a.astype(np.int64) - images[i]).max() <= int(eps * 255)
    mr, per = rejudged_mr(_segmentation_correct, U2NetpTarget(), images, truth, examples)
    assert mr is not None and m[0][0][0] == pytest.approx(mr)
    assert m[0][0][1] == m[0][0][0]          # the same model behind a masks-only API
    _check_shared_setting(stack, eid, "pgd.u2netp-surrogate", n, 2)
    # CAN-5 on per-image verdicts: identical answers, so nothing rectified or sacrificed
    (d,) = b["defence"]
    r = d["result"]
    assert (d["baseline"], d["defended"]) == ("u2netp", "u2netp-masks")
    assert r["AV"]["value"] == 0.0 and r["RR"]["value"] == 0.0 and r["SR"]["value"] == 0.0
    assert r["baseline"]["CA"]["value"] == report["metrics"]["accuracy"]["value"]
    for key in ("FV", "CV", "ARAC", "AITC"):
        assert r[key]["value"] is None and r[key]["status"] == "not applicable", key
        assert "IEEE-C5" in r[key]["reason"], r[key]
    acv = d["attacks"]["pgd"]["ACV"]["MR"]
    assert acv["value"] == 0.0 and acv["baseline"] == m[0][0][0]
    assert d["attacks"]["pgd"]["ARAC"]["status"] == "not applicable"
    assert 'id="benchmark-defence"' in html
    print(f"\n[benchmark segmentation] PGD L-inf {eps} x3 on u2netp-surrogate: MR u2netp "
          f"{m[0][0][0]}, u2netp-masks {m[0][0][1]} (clean -> example: {per}); CAN-5 AV "
          f"{r['AV']['value']}, RR {r['RR']['value']}, SR {r['SR']['value']}")
