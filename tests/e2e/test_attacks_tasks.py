"""End to end: query attacks on a detector and a segmenter, in plans, through the
real services and the target proxy, judged per IEEE-C4 / IEEE-C5.

The built-in OpenCV Haar face detector (``haar-face``, what ``fortis demo --task detection``
evaluates) and U2-Net-p salient-object segmenter (``u2netp``, ``fortis demo --task
segmentation``) on the demo's offline photos, made small (the astronaut at 160 x 160, the
astronaut beside its mirror image at 160 x 320 and the coffee cup, no face, at 142 x 213:
three image sizes in one attack call, an image without objects of interest; the astronaut at
128 x 128 for the segmenter) so each test stays well under 40 s.

Attacks: the registry's query attacks whose ``SPEC.tasks`` include the task, restricted to
Square, HSJA and Boundary (required) and SimBA and Bandits (whenever registered).
Each test runs one plan with one attack and checks:

- the ledger (the proxy's count of answered queries) equals the queries the report states,
  per image and in total, and no image went past its budget Q_m;
- success is judged per IEEE-C4 / IEEE-C5: each adversarial the attack returned (the uint8
  image the target received) is answered again by the same model here and judged with the
  scoring service's own rule (``detection_correct`` / ``segmentation_correct``): the report's
  successes are exactly the initially correct images that rule now calls incorrect;
- the report states the signal the attack read ("boxes" / "masks" / "probabilities", or the
  decisions taken from them) and the criterion in words.

The plan's thresholds are set from the clean answers (confidence / mIoU a little below the
clean image's) so a small budget can show successes; the checks hold whatever the outcome.
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

KEY = "test-key-attacks-tasks"
REQUIRED = ("square", "hsja", "boundary")
OPTIONAL = ("simba", "bandits")
#: Per-image budget Q_m per task (small: the segmenter answers in ~0.3-1.5 s here).
BUDGET = {"detection": 24, "segmentation": 6}


def _registered(task: str) -> list[str]:
    from fortis.services.perturbation.attacks.registry import ATTACKS

    return [a for a in REQUIRED + OPTIONAL
            if a in ATTACKS and ATTACKS[a].is_query_attack and task in (ATTACKS[a].tasks or ())]


def test_required_attacks_declare_detection_and_segmentation():
    for task in ("detection", "segmentation"):
        assert set(REQUIRED) <= set(_registered(task)), task


def _params(attack: str, task: str, shape: tuple[int, int, int]) -> dict[str, Any] | None:
    """The attack's plan parameters: its budget and bound (L-inf 0.1; L2 the same
    image-wide, 0.1 * sqrt(pixels)); None when it needs a parameter this test does not know."""
    from fortis.services.perturbation.attacks.registry import ATTACKS

    spec = ATTACKS[attack]
    out: dict[str, Any] = {"max_queries": BUDGET[task]}
    for p in spec.params:
        if p.name == "epsilon":
            out["epsilon"] = 0.1 if spec.norm == "linf" else \
                round(0.1 * float(np.sqrt(np.prod(shape))), 3)
        elif p.default is None and p.name not in out:
            return None
    return out


# -- photos, ground truth and in-process answers ------------------------------------------


def _detection_data(root: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    from fortis.adapters.vision_demo import ASTRONAUT_FACE, _photos

    photos = _photos()
    a = photos["astronaut"]
    s = 160 / a.shape[0]
    face = np.array(ASTRONAUT_FACE) * s
    small = cv2.resize(a, (160, 160), interpolation=cv2.INTER_AREA)
    pair = np.ascontiguousarray(np.concatenate([small, small[:, ::-1]], axis=1))
    mirror = np.array([320 - face[2], face[1], 320 - face[0], face[3]])
    coffee = cv2.resize(photos["coffee"], (213, 142), interpolation=cv2.INTER_AREA)
    images = {"astronaut": small, "astronaut-pair": pair, "coffee": coffee}
    truth = {"astronaut": face[None], "astronaut-pair": np.stack([face, mirror]),
             "coffee": np.zeros((0, 4))}
    rows = []
    for name, img in images.items():
        cv2.imwrite(str(root / f"{name}.png"), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
        rows.append({"id": name, "image": f"{name}.png", "boxes": truth[name].tolist(),
                     "labels": [0] * len(truth[name]), "box_format": "xyxy"})
    (root / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return images, truth


def _segmentation_data(root: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    from fortis.adapters.vision_demo import ASTRONAUT_POLYGON, _photos

    a = _photos()["astronaut"]
    mask = cv2.fillPoly(np.zeros((512, 512), np.uint8), [np.array(ASTRONAUT_POLYGON, np.int32)], 1)
    img = cv2.resize(a, (128, 128), interpolation=cv2.INTER_AREA)
    m = cv2.resize(mask, (128, 128), interpolation=cv2.INTER_NEAREST)
    cv2.imwrite(str(root / "astronaut.png"), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
    cv2.imwrite(str(root / "astronaut-mask.png"), m)
    (root / "manifest.jsonl").write_text(json.dumps(
        {"id": "astronaut", "image": "astronaut.png", "mask": "astronaut-mask.png"}) + "\n")
    return {"astronaut": img}, {"astronaut": m.astype(np.int64)}


def _detect(model: Any, img: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = model._answer(img)
    boxes = np.array([[b.x_min, b.y_min, b.x_max, b.y_max] for b in d.boxes]).reshape(-1, 4)
    return boxes, np.array([b.score for b in d.boxes])


def _segment(model: Any, img: np.ndarray) -> np.ndarray:
    from fortis.core.tensors import tensor_to_array

    seg = model._answer(img)
    return np.asarray(tensor_to_array(seg.class_map, "class_map"), dtype=np.int64)


class _Task:
    def __init__(self, task: str, root: Path) -> None:
        from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

        self.task, self.root = task, root
        self._clean: dict[str, bool] = {}
        data = root / "data"
        data.mkdir(parents=True)
        if task == "detection":
            from fortis.adapters.vision_targets.haar import HaarFaceTarget

            self.target, self.model = "haar-face", HaarFaceTarget()
            self.images, self.truth = _detection_data(data)
            scores = [_detect(self.model, im)[1] for im in self.images.values()]
            # the weakest clean face a little above the threshold: margins move early
            conf = round(float(min(s.min() for s in scores if len(s))) - 0.01, 4)
            self.section = (f"detection: {{mode: threshold, iou_threshold: 0.5, "
                            f"confidence_threshold: {conf}, aggregate: all}}")
            self.rule = {"mode": "threshold", "iou_threshold": 0.5,
                         "confidence_threshold": conf}
        else:
            from fortis.adapters.vision_targets.u2netp import U2NetpTarget

            self.target, self.model = "u2netp", U2NetpTarget()
            self.images, self.truth = _segmentation_data(data)
            miou = self._miou(next(iter(self.images.values())), next(iter(self.truth.values())))
            self.threshold = round(miou - 0.01, 4)
            self.section = f"segmentation: {{classes: [1], miou_threshold: {self.threshold}}}"
        self.stack = start_stack(StackSettings(
            state_dir=root / "state", api_keys={KEY: "tenant-a"}, data_root=data,
            targets=[TargetConfig.parse(f"{self.target}=builtin:{self.target}")],
            metrics_port=0, metrics_host="127.0.0.1"))

    def _miou(self, img: np.ndarray, truth: np.ndarray) -> float:
        from fortis.core.criteria import SegmentationCriterion
        from fortis.services.scoring.correctness.segmentation import segmentation_miou

        crit = SegmentationCriterion(classes=(1,), miou_threshold=0.5)
        return float(segmentation_miou([_segment(self.model, img)], [truth], crit)[0])

    def clean_correct(self, name: str) -> bool:
        if name not in self._clean:
            self._clean[name] = self.correct(name, self.images[name])
        return self._clean[name]

    def correct(self, name: str, img: np.ndarray) -> bool:
        """The scoring service's IEEE-C4 / C5 verdict on the model's answer to ``img``."""
        if self.task == "detection":
            from fortis.core.criteria import DetectionCriterion
            from fortis.services.scoring.correctness import detection_correct
            from fortis.services.scoring.correctness.boxes import Detections

            boxes, scores = _detect(self.model, img)
            t = self.truth[name]
            truth = Detections(boxes=t, labels=np.zeros(len(t), np.int64),
                               image_size=(img.shape[1], img.shape[0]))
            pred = Detections(boxes=boxes, labels=np.zeros(len(boxes), np.int64), scores=scores,
                              image_size=(img.shape[1], img.shape[0]))
            crit = DetectionCriterion.from_dict(self.rule)
            return bool(detection_correct([truth], [pred], crit)[0])
        from fortis.core.criteria import SegmentationCriterion
        from fortis.services.scoring.correctness.segmentation import segmentation_correct

        crit = SegmentationCriterion(classes=(1,), miou_threshold=self.threshold)
        return bool(segmentation_correct([_segment(self.model, img)], [self.truth[name]],
                                         crit)[0])


@pytest.fixture(scope="module")
def detection(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Task]:
    t = _Task("detection", tmp_path_factory.mktemp("det"))
    yield t
    t.stack.stop(0)


@pytest.fixture(scope="module")
def segmentation(tmp_path_factory: pytest.TempPathFactory,
                 vision_setup: None) -> Iterator[_Task]:
    # U2-Net-p runs on onnxruntime, installed by scripts/setup_vision.sh (never skipped)
    t = _Task("segmentation", tmp_path_factory.mktemp("seg"))
    yield t
    t.stack.stop(0)


def _run(t: _Task, attack: str) -> None:
    shape = next(iter(t.images.values())).shape
    params = _params(attack, t.task, shape)
    if params is None:
        pytest.skip(f"{attack} needs parameters this test does not set")
    n = len(t.images)
    plan = f"""
name: {t.task}-{attack}
seed: 7
roles: {{tester: {{name: pytest, organisation: Fortis CI}}}}
target: {{name: {t.target}, task: {t.task}}}
dataset: {{source: manifest, path: manifest.jsonl, limit: {n}}}
{t.section}
attacks:
  - {{id: {attack}, params: {json.dumps(params)}}}
"""
    with FortisClient(t.stack.address, api_key=KEY) as fc:
        ev = fc.submit(plan)
        final = fc.wait(ev.evaluation_id)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
        eid = ev.evaluation_id
        report = json.loads(fc.write_report(eid, t.root / eid)[0].read_text())
        session = f"{eid}/attack/{attack}/00000/a1"
        stats = fc.session_stats(session)
    budget = params["max_queries"]
    m = report["metrics"]["attacks"][attack]
    assert m["m"] == n and m["query_budget"] == budget
    # ledger == queries reported; Q_m never exceeded; the clean image counted first
    assert report["ledger"]["sessions"][session] == stats.queries_ok
    assert stats.queries_ok == round(m["mean_queries"] * n)
    assert set(stats.per_image) == set(t.images)
    assert all(1 <= q <= budget for q in stats.per_image.values()), stats.per_image
    assert stats.calls_refused == 0 or max(stats.per_image.values()) == budget
    # success judged per IEEE-C4 / C5 on the uint8 images the target received
    arts = t.stack.manager.store.for_tenant("tenant-a")
    npz = np.load(io.BytesIO(arts.artifact(eid, f"adversarial/{attack}-00000.npz")))
    ids = [str(i) for i in npz["image_ids"]]
    advs = [npz["adversarial_uint8"][k] for k in range(len(ids))] \
        if "adversarial_uint8" in npz.files else \
        [npz[f"adversarial_uint8_{k:05d}"] for k in range(len(ids))]
    from fortis.services.perturbation.attacks.registry import ATTACKS

    norm = ATTACKS[attack].norm
    clean_ok = {i: t.clean_correct(i) for i in ids}
    broken = 0
    for i, a in zip(ids, advs, strict=True):
        assert a.shape == t.images[i].shape and a.dtype == np.uint8
        d = (a.astype(np.float64) - t.images[i]) / 255.0
        size = float(np.abs(d).max()) if norm == "linf" else float(np.sqrt((d * d).sum()))
        # success = the rule calls the answer to the uint8 image incorrect, within the bound
        broken += clean_ok[i] and size <= params["epsilon"] + 1e-9 and not t.correct(i, a)
    assert m["successes"] == broken, (m, clean_ok)
    # the report says what the attack read and the criterion
    test = next(x for x in report["tests"] if x["id"] == attack)
    expected = {"detection": {"boxes", "decisions from boxes"},
                "segmentation": {"masks", "probabilities", "decisions from masks"}}[t.task]
    assert test["signal"] in expected and test["signal_note"], test
    assert ("IEEE-C4" if t.task == "detection" else "IEEE-C5") in test["criterion"]
    print(f"{t.task} {attack}: successes {m['successes']}/{n}, queries "
          f"{dict(stats.per_image)} (ledger {stats.queries_ok}), signal {test['signal']}")


@pytest.mark.slow
@pytest.mark.parametrize("attack", _registered("detection"))
def test_query_attack_on_detector(detection: _Task, attack: str):
    _run(detection, attack)


@pytest.mark.slow
@pytest.mark.parametrize("attack", _registered("segmentation"))
def test_query_attack_on_segmenter(segmentation: _Task, attack: str):
    _run(segmentation, attack)


def test_report_states_a_weaker_classifier_signal(stack, tmp_path):
    """Classifiers: Square on a top-3 target reads top-k scores and HSJA on a label-only
    target reads labels; the report says so (IEEE-A8: a weaker signal than full scores)."""
    from tests.conftest import API_KEY

    plans = {"fmnist-cnn-top3": ("square", '{"epsilon": 0.1, "max_queries": 30}', "top_k"),
             "fmnist-cnn-label": ("hsja", '{"epsilon": 2.0, "max_queries": 30}', "labels")}
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        for target, (attack, params, signal) in plans.items():
            ev = fc.submit(f"""
name: signal-{target}
seed: 2
target: {{name: {target}, task: classification}}
dataset: {{source: fashion-mnist, split: test, limit: 4}}
attacks:
  - {{id: {attack}, params: {params}}}
""")
            final = fc.wait(ev.evaluation_id)
            assert progress_of(final).state == "SUCCEEDED", final.error.message
            report = json.loads(fc.write_report(ev.evaluation_id, tmp_path / target)[0]
                                .read_text())
            test = next(x for x in report["tests"] if x["id"] == attack)
            assert test["signal"] == signal, test
            note = test["signal_note"]
            assert ("weaker" in note) if signal == "top_k" else ("labels only" in note), note
            session = f"{ev.evaluation_id}/attack/{attack}/00000/a1"
            stats = fc.session_stats(session)
            m = report["metrics"]["attacks"][attack]
            assert stats.queries_ok == round(m["mean_queries"] * 4) == \
                report["ledger"]["sessions"][session]
            assert max(stats.per_image.values()) <= 30


def test_query_attack_with_a_surrogate_prior(stack, tmp_path):
    """A query attack that takes a surrogate prior (``AttackSpec.uses_surrogate``, e.g. ODS)
    gets the plan's ``surrogate:`` next to its proxy session; its queries are the target's,
    counted in the ledger. Attacks that take none refuse one, naming the field."""
    from fortis.services.common import errors
    from fortis.services.perturbation.attacks.registry import ATTACKS

    from tests.conftest import API_KEY

    prior = [s for s in ATTACKS.values() if s.uses_surrogate and s.is_query_attack
             and "classification" in (s.tasks or ())]
    if not prior:
        pytest.skip("no query attack with a surrogate prior is registered")
    spec = prior[0]
    eps = 0.1 if spec.norm == "linf" else 2.0
    plan = f"""
name: prior
seed: 2
target: {{name: fmnist-cnn, task: classification}}
dataset: {{source: fashion-mnist, split: test, limit: 4}}
attacks:
  - {{id: {spec.id}, surrogate: fmnist-surrogate, params: {{epsilon: {eps}, max_queries: 40}}}}
"""
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        ev = fc.submit(plan)
        final = fc.wait(ev.evaluation_id)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
        report = json.loads(fc.write_report(ev.evaluation_id, tmp_path / "p")[0].read_text())
        session = f"{ev.evaluation_id}/attack/{spec.id}/00000/a1"
        stats = fc.session_stats(session)
        with pytest.raises(errors.InvalidArgument) as ei:
            fc.submit(plan.replace(f"id: {spec.id}", "id: square"))
        assert "attacks[0].surrogate" in str(ei.value)
    test = next(x for x in report["tests"] if x["id"] == spec.id)
    assert test["surrogate"] == "fmnist-surrogate" and test["signal"] == "scores"
    m = report["metrics"]["attacks"][spec.id]
    assert stats.queries_ok == round(m["mean_queries"] * 4) == report["ledger"]["sessions"][session]
    assert max(stats.per_image.values()) <= 40
    print(f"{spec.id}: successes {m['successes']}/4, queries {dict(stats.per_image)}")


def test_every_query_attack_in_one_classifier_plan(stack, tmp_path):
    """A plan can use each query attack on a classifier: one plan naming every query
    attack of the registry (IEEE-A8; PertKnob aside: it needs a property), untargeted, on the
    Fashion-MNIST CNN with full scores, through the real services and the proxy. The
    evaluation succeeds; per attack the report lists it with its norm, the ledger's count of its
    session equals the queries it reports and no image passed its budget Q_m."""
    from fortis.services.perturbation.attacks.registry import ATTACKS

    from tests.conftest import API_KEY

    budget, n = 12, 3
    eps = {"linf": 0.1, "l2": 2.0, "l0": 5}
    lines = []
    ids = [k for k, s in ATTACKS.items() if s.is_query_attack and k != "pertknob"
           and "classification" in (s.tasks or ())]
    assert len(ids) >= 18
    for k in ids:
        spec = ATTACKS[k]
        sur = ", surrogate: fmnist-surrogate" if spec.uses_surrogate else ""
        lines.append(f"  - {{id: {k}{sur}, params: {{epsilon: {eps[spec.norm]}, "
                     f"max_queries: {budget}}}}}")
    plan = f"""
name: every-query-attack
seed: 5
target: {{name: fmnist-cnn, task: classification}}
dataset: {{source: fashion-mnist, split: test, limit: {n}}}
attacks:
""" + "\n".join(lines) + "\n"
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        ev = fc.submit(plan)
        final = fc.wait(ev.evaluation_id)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
        report = json.loads(fc.write_report(ev.evaluation_id, tmp_path / "r")[0].read_text())
        per_image = {k: fc.session_stats(f"{ev.evaluation_id}/attack/{k}/00000/a1").per_image
                     for k in ids}
    tests = {x["id"]: x for x in report["tests"]}
    for k in ids:
        assert k in tests and k in report["metrics"]["attacks"], k
        m = report["metrics"]["attacks"][k]
        session = f"{ev.evaluation_id}/attack/{k}/00000/a1"
        assert report["ledger"]["sessions"][session] == round(m["mean_queries"] * n), k
        assert per_image[k] and max(per_image[k].values()) <= budget, (k, per_image[k])
        assert 0 <= m["successes"] <= n


def test_every_transfer_attack_in_one_classifier_plan(stack, tmp_path):
    """A plan can use each transfer attack with a built-in surrogate, on classifiers: one plan
    naming every transfer attack of the registry (IEEE-A7: the twelve and the generator) on
    the Fashion-MNIST CNN, crafted on fmnist-surrogate, the images sent through the real
    services and the proxy. The evaluation succeeds; each attack is in the report with its
    surrogate and norm, scored on the target's answers (IEEE-M3), and the proxy's transfer
    session of each received exactly its images."""
    from fortis.services.perturbation.attacks.registry import ATTACKS

    from tests.conftest import API_KEY

    n = 3
    quick = {"bim": {"epsilon": 0.1, "steps": 3}, "pgd": {"epsilon": 0.1, "steps": 3},
             "mi_fgsm": {"epsilon": 0.1, "steps": 3, "di_prob": 0.5, "ti_kernel": 3},
             "fgsm": {"epsilon": 0.1},
             "spatial": {"rotation_steps": 5, "translation_steps": 3},
             "sparse_l1": {"steps": 5},
             "dispersion_reduction": {"epsilon": 0.1, "steps": 5},
             "fast_feature": {"epsilon": 0.1, "steps": 5},
             "advgan": {"epsilon": 0.1, "epochs": 2},
             "cw_l2": {"steps": 10, "binary_search_steps": 2, "initial_const": 0.1},
             "ead": {"steps": 10, "binary_search_steps": 2, "initial_const": 0.1},
             "ddn": {"steps": 10}, "fab": {"steps": 5}}
    ids = [k for k, s in ATTACKS.items() if s.kind == "transfer"]
    assert set(ids) == set(quick), "a new transfer attack: give it quick params here"
    lines = [f"  - {{id: {k}, surrogate: fmnist-surrogate, params: {json.dumps(quick[k])}}}"
             for k in ids]
    plan = f"""
name: every-transfer-attack
seed: 5
target: {{name: fmnist-cnn, task: classification}}
dataset: {{source: fashion-mnist, split: test, limit: {n}}}
attacks:
""" + "\n".join(lines) + "\n"
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        ev = fc.submit(plan)
        final = fc.wait(ev.evaluation_id, timeout_s=600)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
        report = json.loads(fc.write_report(ev.evaluation_id, tmp_path / "r")[0].read_text())
        sessions = {k: fc.session_stats(f"{ev.evaluation_id}/attack/{k}").per_image
                    for k in ids}
    tests = {x["id"]: x for x in report["tests"]}
    for k in ids:
        assert k in tests, k
        assert tests[k].get("surrogate") == "fmnist-surrogate", tests[k]
        assert tests[k].get("norm") == ATTACKS[k].norm, (k, tests[k].get("norm"))
        # the target received each of the attack's images once (its ledger)
        assert sorted(sessions[k].values()) == [1] * n, (k, sessions[k])
    text = json.dumps(report["metrics"])
    for k in ids:
        assert k in text, k
