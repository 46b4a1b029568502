"""End to end: transfer attacks (IEEE-A7) on a detector and a segmenter, in plans, through the
real services and the target proxy, scored per IEEE-C4 / IEEE-C5.

PGD is crafted white-box on the built-in differentiable surrogates -- ``mtcnn-surrogate``
(MTCNN's nets in torch) for the detection targets, ``u2netp-surrogate`` (U2-Net-p converted
from ONNX to torch) for the segmenter -- against each image's ground truth (the plan's
manifest), then the uint8 images go to the target through the proxy: the OpenCV Haar
cascade ``haar-face`` (a different model family: a true transfer) and facenet-pytorch's
``mtcnn`` (the surrogate's own model behind its cascade), and the ``u2netp`` segmenter on
onnxruntime. Photos as the other e2e vision tests: the astronaut at 160 x 160, beside its
mirror image at 160 x 320 and the coffee cup (no face) at 142 x 213; the astronaut at
128 x 128 for the segmenter.

Each plan's report carries the transfer setting scored by the plan's IEEE-C4 / C5 rule: its
correct count equals this test's own judgement (the scoring service's
``detection_correct`` / ``segmentation_correct`` on the in-process model's answers to the
stored uint8 adversarials), the ledger counted one query per image, and every adversarial
is within the plan's L-inf bound. The transfer figures (clean accuracy, robustness under
the attack, success rate = correct-on-clean images now wrong) are printed for the notes.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fortis.client import FortisClient, progress_of

# the same photos, ground truth and manifests as the query-attack e2e tests
from tests.e2e.test_attacks_tasks import _detection_data, _segmentation_data

KEY = "test-key-transfer-tasks"
EPS = {"detection": 0.05, "segmentation": 0.03}
STEPS = {"detection": 20, "segmentation": 3}


class _Stack:
    def __init__(self, task: str, root: Path, targets: tuple[str, ...]) -> None:
        from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

        self.task, self.root = task, root
        data = root / "data"
        data.mkdir(parents=True)
        self.images, self.truth = (_detection_data if task == "detection"
                                   else _segmentation_data)(data)
        if task == "detection":
            self.section = ("detection: {mode: threshold, iou_threshold: 0.5, "
                            "confidence_threshold: 0.5, aggregate: all}")
            self.rule = {"mode": "threshold", "iou_threshold": 0.5, "confidence_threshold": 0.5}
        else:
            self.section = "segmentation: {classes: [1], miou_threshold: 0.5}"
        self.stack = start_stack(StackSettings(
            state_dir=root / "state", api_keys={KEY: "tenant-a"}, data_root=data,
            whitebox_grants={"tenant-a": frozenset({"*"})},  # twins: granted
            targets=[TargetConfig.parse(f"{t}=builtin:{t}") for t in targets],
            metrics_port=0, metrics_host="127.0.0.1"))

    def correct(self, model: Any, name: str, img: np.ndarray) -> bool:
        """The scoring service's IEEE-C4 / C5 verdict on ``model``'s answer to ``img``."""
        if self.task == "detection":
            from fortis.core.criteria import DetectionCriterion
            from fortis.services.scoring.correctness import detection_correct
            from fortis.services.scoring.correctness.boxes import Detections

            d = model._answer_batch([img])[0]
            boxes = np.array([[b.x_min, b.y_min, b.x_max, b.y_max] for b in d.boxes]).reshape(-1, 4)
            scores = np.array([b.score for b in d.boxes])
            t = self.truth[name]
            size = (img.shape[1], img.shape[0])
            truth = Detections(boxes=t, labels=np.zeros(len(t), np.int64), image_size=size)
            pred = Detections(boxes=boxes, labels=np.zeros(len(boxes), np.int64), scores=scores,
                              image_size=size)
            return bool(detection_correct([truth], [pred], DetectionCriterion.from_dict(self.rule))[0])
        from fortis.core.criteria import SegmentationCriterion
        from fortis.core.tensors import tensor_to_array
        from fortis.services.scoring.correctness.segmentation import segmentation_correct

        cmap = np.asarray(tensor_to_array(model._answer_batch([img])[0].class_map, "class_map"), np.int64)
        crit = SegmentationCriterion(classes=(1,), miou_threshold=0.5)
        return bool(segmentation_correct([cmap], [self.truth[name]], crit)[0])

    def run(self, target: str, model: Any, surrogate: str) -> dict[str, Any]:
        n = len(self.images)
        eps, steps = EPS[self.task], STEPS[self.task]
        plan = f"""
name: transfer-{self.task}-{target}
seed: 11
roles: {{tester: {{name: pytest, organisation: Fortis CI}}}}
target: {{name: {target}, task: {self.task}}}
dataset: {{source: manifest, path: manifest.jsonl, limit: {n}}}
{self.section}
attacks:
  - {{id: pgd, surrogate: {surrogate}, params: {{epsilon: {eps}, steps: {steps}}}}}
"""
        with FortisClient(self.stack.address, api_key=KEY) as fc:
            ev = fc.submit(plan)
            final = fc.wait(ev.evaluation_id)
            assert progress_of(final).state == "SUCCEEDED", final.error.message
            eid = ev.evaluation_id
            report = json.loads(fc.write_report(eid, self.root / eid)[0].read_text())
            session = f"{eid}/attack/pgd"
            stats = fc.session_stats(session)
        metrics = report["metrics"]
        m = metrics["attacks"]["pgd"]
        assert m["kind"] == "transfer" and m["m"] == n and m["query_budget"] is None
        # one query per image through the proxy, counted in the ledger
        assert stats.queries_ok == n == report["ledger"]["sessions"][session]
        assert set(stats.per_image) == set(self.images)
        # IEEE-C4 / C5 on the uint8 images the target received, within the bound (IEEE-A9)
        arts = self.stack.manager.store.for_tenant("tenant-a")
        npz = np.load(io.BytesIO(arts.artifact(eid, "adversarial/pgd-00000.npz")))
        ids = [str(i) for i in npz["image_ids"]]
        advs = [npz["adversarial_uint8"][k] for k in range(len(ids))] \
            if "adversarial_uint8" in npz.files else \
            [npz[f"adversarial_uint8_{k:05d}"] for k in range(len(ids))]
        clean = {i: self.correct(model, i, self.images[i]) for i in ids}
        judged = {}
        for i, a in zip(ids, advs, strict=True):
            assert a.shape == self.images[i].shape and a.dtype == np.uint8
            assert np.abs(a.astype(np.int64) - self.images[i]).max() <= int(eps * 255)
            judged[i] = self.correct(model, i, a)
        assert metrics["accuracy"]["correct"] == sum(clean.values())
        assert m["correct"] == sum(judged.values()), (m, judged)
        assert m["successes"] == sum(clean[i] and not judged[i] for i in ids)
        test = next(x for x in report["tests"] if x["id"] == "pgd")
        assert test["surrogate"] == surrogate
        rate = m["success_rate"]
        print(f"\n[transfer] {self.task} target {target} <- PGD L-inf {eps} x{steps} on "
              f"{surrogate}: clean accuracy {metrics['accuracy']['correct']}/{n}, robustness "
              f"under attack {m['correct']}/{n}, success rate {m['successes']}/"
              f"{m['success_rate_n']}" + (f" ({rate:.2f})" if rate is not None else "")
              + "; per image clean -> adversarial: "
              + ", ".join(f"{i} {clean[i]}->{judged[i]}" for i in ids))
        return m


@pytest.fixture(scope="module")
def detection(tmp_path_factory: pytest.TempPathFactory, vision_setup: None) -> Iterator[_Stack]:
    s = _Stack("detection", tmp_path_factory.mktemp("tdet"), ("haar-face", "mtcnn"))
    yield s
    s.stack.stop(0)


@pytest.fixture(scope="module")
def segmentation(tmp_path_factory: pytest.TempPathFactory, vision_setup: None) -> Iterator[_Stack]:
    s = _Stack("segmentation", tmp_path_factory.mktemp("tseg"), ("u2netp",))
    yield s
    s.stack.stop(0)


def test_pgd_on_the_mtcnn_surrogate_transfers_to_the_detectors(detection: _Stack):
    from fortis.adapters.vision_targets.haar import HaarFaceTarget
    from fortis.adapters.vision_targets.mtcnn import MtcnnTarget

    haar = detection.run("haar-face", HaarFaceTarget(), "mtcnn-surrogate")
    assert haar["success_rate_n"] >= 2            # the faces are found on the clean photos
    mt = detection.run("mtcnn", MtcnnTarget(), "mtcnn-surrogate")
    # the surrogate's own model behind the cascade: its faces are gone
    assert mt["success_rate_n"] >= 2 and mt["successes"] >= 2


def test_pgd_on_the_u2netp_surrogate_transfers_to_the_segmenter(segmentation: _Stack):
    from fortis.adapters.vision_targets.u2netp import U2NetpTarget

    m = segmentation.run("u2netp", U2NetpTarget(), "u2netp-surrogate")
    assert m["success_rate_n"] == 1 and m["successes"] == 1


def test_a_surrogate_of_another_task_is_refused(detection: _Stack):
    """The plan names a segmentation surrogate for a detection target: refused at submission,
    naming the field."""
    from fortis.services.common import errors

    with FortisClient(detection.stack.address, api_key=KEY) as fc, \
            pytest.raises(errors.InvalidArgument) as e:
        fc.submit(f"""
name: wrong-surrogate
seed: 1
target: {{name: haar-face, task: detection}}
dataset: {{source: manifest, path: manifest.jsonl, limit: 3}}
{detection.section}
attacks:
  - {{id: fgsm, surrogate: u2netp-surrogate, params: {{epsilon: 0.05}}}}
""")
    assert "attacks[0].surrogate" in str(e.value) and "mtcnn-surrogate" in str(e.value)
