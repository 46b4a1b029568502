"""Detection and segmentation example images as people read them (IEEE-C4, IEEE-C5), and the
answers of every example marked by the plan's correctness rule rather than by a change from
the clean answer.

- The rule's per-image verdicts travel from the scoring service over the contract
  (``ScoreEvaluationResponse.verdicts``) to the evaluation service's examples: one
  implementation of each rule.
- The evaluation service's examples carry the ground truth and the target's boxes (label,
  score) or class maps, read from what the stages recorded (no target query).
- The report service checks them as a caller's input and draws them: boxes with a tag,
  dashed ground truth, masks filled, ground-truth outlines; a failing answer framed red.
- Every setting the table lists keeps its picture when the examples' byte budget runs short
  (the same clean photo on every cell used to crowd out the last corruptions: "n/a").

Real parts: OpenCV's Haar face detector answers the demo's generated scenes, the perturbation
engine makes the corrupted images, the scoring service's own domain code judges them."""

from __future__ import annotations

import base64
import io
import re
from html.parser import HTMLParser
from typing import Any

import numpy as np
import pytest
from fortis.common.v1 import common_pb2
from fortis.report.v1 import report_pb2
from fortis.scoring.v1 import scoring_pb2
from fortis.services.common.errors import InvalidArgument
from fortis.services.evaluation.answers import DetectionAnswers, SegmentationAnswers
from fortis.services.evaluation.convert import (
    EXAMPLES_TOTAL_BYTES,
    example_image,
    example_images,
    scoring_setup,
    setting,
    setting_verdicts,
)
from fortis.services.evaluation.examples import build_examples
from fortis.services.evaluation.ports import (
    Example,
    ExampleBox,
    ScoringSetup,
    Setting,
    TargetDescription,
)
from fortis.services.report import annotate
from fortis.services.report.convert import build_report
from fortis.services.report.render import render_html
from fortis.services.scoring.convert import read_evaluation, response_from_scores
from fortis.services.scoring.evaluation_scoring import judge_setting, score_evaluation
from PIL import Image

from tests.unit.report_parts import make_parts

pytestmark = pytest.mark.usefixtures("one_thread")

MAGENTA, CYAN = np.array(annotate.ANSWER_COLOUR), np.array(annotate.TRUTH_COLOUR)


def _png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def _decode(uri: str) -> np.ndarray:
    data = base64.b64decode(uri.split(",", 1)[1])
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


class _Imgs(HTMLParser):
    def __init__(self, page: str) -> None:
        super().__init__()
        self.imgs: list[dict[str, str]] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.imgs.append({k: v or "" for k, v in attrs})


def _near(pixel: np.ndarray, colour: np.ndarray, tol: int = 3) -> bool:
    return bool(np.abs(pixel.astype(int) - colour).max() <= tol)


# -- drawing ------------------------------------------------------------------------------------

def test_boxes_are_drawn_with_label_and_score_and_the_ground_truth_dashed():
    img = np.full((128, 128, 3), 90, np.uint8)
    out = annotate.draw(img, boxes=[{"box": [20, 40, 80, 100], "label": "face", "score": 0.87}],
                        truth_boxes=[{"box": [30, 30, 90, 90], "label": "face"}])
    s = annotate.DISPLAY_SIDE / 128                          # 2x: drawn at display size
    assert out.shape == (256, 256, 3)
    # the answer's box: solid on all four edges
    for y, x in ((70 * s, 20 * s), (70 * s, 80 * s), (40 * s + 0.5, 50 * s), (100 * s, 50 * s)):
        assert _near(out[int(y), int(x)], MAGENTA), (y, x)
    # the ground truth: dashed (cyan dashes with gaps along its right edge)
    edge = out[int(35 * s):int(85 * s), int(90 * s)]
    cyan = [_near(p, CYAN) for p in edge]
    assert 0.3 < np.mean(cyan) < 0.9
    # the tag above the box: magenta fill with dark text "face 0.87"
    tag = out[int(40 * s) - 14:int(40 * s), int(20 * s):int(20 * s) + 50]
    assert np.mean([_near(p, MAGENTA) for p in tag.reshape(-1, 3)]) > 0.4
    assert (tag.reshape(-1, 3).max(axis=1) < 80).sum() > 10
    # the ground-truth panel tags the truth instead
    gt = annotate.draw(img, truth_boxes=[{"box": [30, 30, 90, 90], "label": "face"}],
                       truth_labels=True)
    assert np.mean([_near(p, CYAN) for p in gt[int(30 * s) - 12:int(30 * s), 62:90]
                    .reshape(-1, 3)]) > 0.4


def test_masks_are_filled_and_the_ground_truth_outlined():
    img = np.full((64, 64, 3), 100, np.uint8)
    pred = np.zeros((64, 64), np.uint8)
    pred[10:40, 10:40] = 1
    truth = np.zeros((64, 64), np.uint8)
    truth[20:50, 20:50] = 1
    out = annotate.draw(img, mask=pred, truth_mask=truth)
    s = annotate.DISPLAY_SIDE // 64
    inside = out[25 * s, 15 * s].astype(int)      # inside the answer's mask only
    fill = (1 - 0.4) * 100 + 0.4 * MAGENTA
    assert np.abs(inside - fill).max() <= 2
    assert _near(out[10 * s, 25 * s], MAGENTA)      # the answer's outline
    assert _near(out[49 * s + 3, 35 * s], CYAN)     # the truth's outline (bottom edge)
    assert _near(out[60 * s, 60 * s], np.array([100, 100, 100]))   # untouched


# -- verdicts over the contract -------------------------------------------------------------------

def _det_truth(boxes: list[list[float]]) -> dict[str, Any]:
    return {"boxes": boxes, "labels": [0] * len(boxes), "box_format": "xyxy", "label_base": 0,
            "image_size": [100, 100]}


def _det_answers(per_image: list[list[list[float]]]) -> DetectionAnswers:
    boxes = [b for img in per_image for b in img]
    return DetectionAnswers(boxes=np.array(boxes, np.float32).reshape(-1, 4),
                            labels=np.zeros(len(boxes), np.int64),
                            scores=np.linspace(0.9, 0.5, len(boxes)).astype(np.float32),
                            counts=np.array([len(b) for b in per_image], np.int64),
                            errors=("",) * len(per_image))


def test_the_scoring_services_verdicts_reach_the_evaluation_service():
    """IEEE-C4 verdicts judged once, by the scoring service, read back per setting."""
    truth = [_det_truth([[10, 10, 50, 50]]), _det_truth([[20, 20, 60, 60]]), _det_truth([])]
    setup = ScoringSetup(image_ids=("a", "b", "c"), task="detection", truth=truth,
                         criterion={"mode": "threshold", "iou_threshold": 0.5})
    clean = Setting(kind="clean", answers=_det_answers([[[11, 10, 50, 51]], [], []]))
    noisy = Setting(kind="corruption", name="gaussian_noise", level=3,
                    answers=_det_answers([[[30, 30, 70, 70]], [[20, 20, 60, 61]],
                                          [[1, 1, 9, 9]]]))
    reqs = [scoring_pb2.ScoreEvaluationRequest(setup=scoring_setup(setup))]
    reqs += [scoring_pb2.ScoreEvaluationRequest(setting=setting(s)) for s in (clean, noisy)]
    dsetup, dsettings = read_evaluation(reqs)
    resp = response_from_scores(score_evaluation(dsetup, dsettings))
    back = setting_verdicts(scoring_pb2.ScoreEvaluationResponse.FromString(
        resp.SerializeToString()))
    assert back[("clean", "", 0)].tolist() == [True, False, True]
    # moved box (IoU 0.14), found, a box where there is no face
    assert back[("corruption", "gaussian_noise", 3)].tolist() == [False, True, False]
    for s, d in zip((clean, noisy), dsettings, strict=True):
        assert back[(s.kind, s.name, s.level)].tolist() == judge_setting(dsetup, d).tolist()


# -- the examples the evaluation service builds -------------------------------------------------

DET_PLAN = """
name: drawing-unit
seed: 11
target: {name: haar-face, task: detection}
dataset: {source: manifest, path: m.jsonl}
detection: {mode: threshold, iou_threshold: 0.5, aggregate: all}
corruptions:
  - {id: contrast, severities: [1, 5]}
"""


class _Engine:
    """The perturbation service's part, in-process (its real algorithms)."""

    def perturb(self, perturbation_id: str, level: int, seed: int, images: Any,
                params: Any = None, **_: Any) -> list[np.ndarray]:
        from fortis.services.perturbation.engine import perturb
        return perturb(perturbation_id, level, seed, images, params=params)


def _haar(images: list[np.ndarray]) -> DetectionAnswers:
    from fortis.adapters.vision_targets.haar import HaarFaceTarget
    from fortis.services.common.codec import image_msg
    target = HaarFaceTarget()
    return DetectionAnswers.from_proto(target.predict([image_msg(str(i), im, raw=True)
                                                       for i, im in enumerate(images)]))


def test_detection_examples_carry_the_truth_the_boxes_and_the_rules_verdicts():
    """The demo's scenes answered by the real Haar cascade, clean and under contrast 1 / 5,
    judged by the scoring service: each example carries the ground truth, the recorded boxes
    with labels and scores, and the verdicts the scoring service gave that image."""
    from fortis.adapters.vision_demo import detection_scenes
    from fortis.server.app.stack import local_catalogue
    from fortis.services.evaluation.plan import load_plan
    from fortis.services.evaluation.stages.base import RunContext
    from fortis.services.perturbation.engine import perturb

    plan = load_plan(DET_PLAN, local_catalogue())
    scenes = list(detection_scenes(6, seed=12))     # its first scene: two faces, both found
    images = [(i, img, ()) for i, img, _ in scenes]
    truth = [_det_truth(b) | {"image_size": [256, 256]} for _, _, b in scenes]
    settings = [Setting(kind="clean", answers=_haar([img for _, img, _ in scenes]))]
    for sev in (1, 5):
        sent = perturb("contrast", sev, plan.seed, [(i, img) for i, img, _ in images])
        settings.append(Setting(kind="corruption", name="contrast", level=sev,
                                answers=_haar([np.asarray(x) for x in sent])))
    setup = ScoringSetup(image_ids=tuple(i for i, _, _ in images), task="detection",
                         truth=truth, criterion=plan.detection)
    reqs = [scoring_pb2.ScoreEvaluationRequest(setup=scoring_setup(setup))]
    reqs += [scoring_pb2.ScoreEvaluationRequest(setting=setting(s)) for s in settings]
    metrics = response_from_scores(score_evaluation(*read_evaluation(reqs)))
    verdicts = setting_verdicts(metrics)
    target = TargetDescription(name="haar-face", task="detection", labels=("face",),
                               output_kind="boxes", top_k=0, input_height=0, input_width=0,
                               input_channels=3, version="1")
    ctx = RunContext(evaluation_id="ev", plan=plan, plan_text=DET_PLAN, store=None,  # type: ignore[arg-type]
                     proxy=None, perturbation=_Engine(), scoring=None,  # type: ignore[arg-type]
                     report=None, images=images, target=target,  # type: ignore[arg-type]
                     progress=None)  # type: ignore[arg-type]
    examples = build_examples(ctx, settings, metrics, truths=truth)
    assert [(e.setting, e.level) for e in examples] == [("contrast", 1), ("contrast", 5)]
    k = next(i for i in range(6) if verdicts[("clean", "", 0)][i])    # first right: the sample
    clean = settings[0].answers
    start = int(clean.counts[:k].sum())
    for e, s in zip(examples, settings[1:], strict=True):
        assert e.image_id == images[k][0]
        assert [b.box for b in e.truth_boxes] == [tuple(b) for b in scenes[k][2]]
        assert all(b.label == "face" and b.score is None for b in e.truth_boxes)
        assert [b.box for b in e.original_boxes] == \
            [tuple(float(v) for v in clean.boxes[start + j]) for j in range(clean.counts[k])]
        assert all(b.label == "face" and 0 < b.score <= 1 for b in e.original_boxes)
        assert e.original_correct is True
        assert e.perturbed_correct is bool(verdicts[("corruption", "contrast", e.level)][k])
        assert len(e.perturbed_boxes) == int(s.answers.counts[k])
        assert e.original_answer.startswith(f"{len(e.original_boxes)} box")
        assert ": face 0." in e.original_answer or ": face 1.00" in e.original_answer
    # contrast 5 washes the faces out: that example fails the rule
    assert examples[1].perturbed_correct is False and examples[0].perturbed_correct is True


def test_segmentation_examples_carry_class_slot_masks_and_the_miou():
    """Ground truth and class maps as 0 / k maps of the classes of interest (k = the k-th),
    the ignored label left out; the words carry the mIoU."""
    from fortis.server.app.stack import local_catalogue
    from fortis.services.evaluation.plan import load_plan
    from fortis.services.evaluation.stages.base import RunContext

    plan = load_plan(DET_PLAN.replace("task: detection", "task: segmentation").replace(
        "detection: {mode: threshold, iou_threshold: 0.5, aggregate: all}",
        "segmentation: {classes: [2, 1], miou_threshold: 0.5}"), local_catalogue())
    img = np.full((16, 16, 3), 120, np.uint8)
    truth = np.zeros((16, 16), np.int64)
    truth[2:10, 2:10] = 1
    truth[12:, 12:] = 2
    truth[0, 0] = 255
    clean = truth.copy()
    clean[0, 0] = 2                        # ignored in the truth: not drawn
    washed = np.zeros_like(truth)          # the answer under contrast 5: nothing found
    answers = [SegmentationAnswers(class_maps=m[None], errors=("",), shapes=((16, 16),))
               for m in (clean, washed, washed)]
    settings = [Setting(kind="clean", answers=answers[0])] + [
        Setting(kind="corruption", name="contrast", level=sev, answers=a)
        for sev, a in ((1, answers[1]), (5, answers[2]))]
    setup = ScoringSetup(image_ids=("x",), task="segmentation", truth=[truth],
                         criterion=plan.segmentation)
    reqs = [scoring_pb2.ScoreEvaluationRequest(setup=scoring_setup(setup))]
    reqs += [scoring_pb2.ScoreEvaluationRequest(setting=setting(s)) for s in settings]
    metrics = response_from_scores(score_evaluation(*read_evaluation(reqs)))
    target = TargetDescription(name="seg", task="segmentation",
                               labels=("background", "cup", "saucer"), output_kind="masks",
                               top_k=0, input_height=0, input_width=0, input_channels=3,
                               version="1")
    ctx = RunContext(evaluation_id="ev", plan=plan, plan_text="", store=None,  # type: ignore[arg-type]
                     proxy=None, perturbation=_Engine(), scoring=None,  # type: ignore[arg-type]
                     report=None, images=[("x", img, ())], target=target,  # type: ignore[arg-type]
                     progress=None)  # type: ignore[arg-type]
    e = build_examples(ctx, settings, metrics, truths=[truth])[1]
    assert e.mask_classes == ("saucer", "cup")                     # value 1 = class 2
    assert e.truth_mask is not None and e.truth_mask.dtype == np.uint8
    assert e.truth_mask[3, 3] == 2 and e.truth_mask[13, 13] == 1 and e.truth_mask[0, 0] == 0
    assert e.original_mask is not None and e.original_mask[0, 0] == 1   # the answer as given
    assert e.perturbed_mask is not None and not e.perturbed_mask.any()
    assert (e.original_correct, e.perturbed_correct) == (True, False)
    assert e.original_answer.endswith("mIoU 1.00") and e.perturbed_answer.endswith("mIoU 0.00")


# -- the report service: checked, kept in report.json, drawn, marked by the rule ---------------

def _det_parts(*examples: report_pb2.ExampleImage):
    parts = make_parts()
    parts.target.task = common_pb2.TASK_TYPE_DETECTION
    parts.target.detection.CopyFrom(scoring_pb2.DetectionCriterion(iou_threshold=0.5))
    parts.examples.extend(examples)
    return parts


def _det_example(level: int, boxes: list[tuple[float, ...]], verdict: int,
                 **kw: Any) -> report_pb2.ExampleImage:
    img = np.full((100, 120, 3), 80, np.uint8)
    fields: dict[str, Any] = dict(
        kind=report_pb2.EXAMPLE_KIND_CORRUPTION, setting="contrast", level=level,
        image_id="faces-001", original_png=_png(img), perturbed_png=_png(img),
        original_answer="1 box: face 0.98", perturbed_answer=f"{len(boxes)} boxes",
        original_verdict=report_pb2.EXAMPLE_VERDICT_CORRECT, perturbed_verdict=verdict,
        truth_boxes=[report_pb2.ExampleBox(x_min=20, y_min=20, x_max=60, y_max=60,
                                           label="face")],
        original_boxes=[report_pb2.ExampleBox(x_min=22, y_min=21, x_max=61, y_max=60,
                                              label="face", score=0.98)],
        perturbed_boxes=[report_pb2.ExampleBox(x_min=b[0], y_min=b[1], x_max=b[2],
                                               y_max=b[3], label="face", score=0.5)
                         for b in boxes])
    fields.update(kw)
    return report_pb2.ExampleImage(**fields)


def test_detection_examples_in_the_report_are_drawn_and_marked_by_the_rule():
    ok = _det_example(1, [(21, 20, 60, 61)], report_pb2.EXAMPLE_VERDICT_CORRECT)
    # a box is there, so the answer reads like the clean one, but the rule says it misses
    miss = _det_example(3, [(70, 50, 110, 90)], report_pb2.EXAMPLE_VERDICT_INCORRECT,
                        perturbed_answer="1 box: face 0.98")
    report = build_report(_det_parts(ok, miss))
    ex = report["examples"]
    assert ex[0]["truth_boxes"] == [{"box": [20.0, 20.0, 60.0, 60.0], "label": "face",
                                     "score": None}]
    assert ex[1]["perturbed_boxes"][0]["box"] == [70.0, 50.0, 110.0, 90.0]
    assert ex[1]["perturbed_boxes"][0]["score"] == pytest.approx(0.5)
    assert (ex[1]["original_verdict"], ex[1]["perturbed_verdict"]) == ("correct", "incorrect")
    assert "truth_mask" not in ex[0]                     # a detection report draws boxes
    page = render_html(report)
    grid = page[page.index('<table class="grid drawn">'):]
    grid = grid[:grid.index("</table>")]
    assert "<th>ground truth</th>" in grid
    imgs = {i["alt"]: i for i in _Imgs(grid).imgs}
    s = annotate.DISPLAY_SIDE / 120
    shot = imgs["contrast at severity 3"]
    assert "fail" in shot["class"].split() and "vis" in shot["class"].split()
    drawn = _decode(shot["src"])
    assert drawn.shape[:2] == (round(100 * s), 256)
    assert _near(drawn[int(70 * s), int(70 * s)], MAGENTA)     # left edge of the answer's box
    assert _near(drawn[int(70 * s), int(110 * s)], MAGENTA)    # right edge
    assert "fail" not in imgs["contrast at severity 1"]["class"].split()
    # the words: red + "fail" by the rule, although "1 box: face 0.98" equals the clean answer
    assert re.search(r'class="ans fail">1 box: face 0.98</span><span class="rule fail">fail',
                     grid)
    assert grid.count('class="rule pass">pass') == 2          # clean and severity 1
    assert "changed" not in grid
    assert "IEEE-C4: every ground-truth object matched by a box of its class with IoU above " \
           "0.5" in page


def test_without_verdicts_the_page_marks_a_changed_answer_as_before():
    parts = make_parts()
    img = _png(np.zeros((8, 8), np.uint8))
    parts.examples.append(report_pb2.ExampleImage(
        kind=report_pb2.EXAMPLE_KIND_CORRUPTION, setting="gaussian_noise", level=1,
        image_id="i", original_png=img, perturbed_png=img, original_answer="Bag (0.9)",
        perturbed_answer="Coat (0.8)"))
    page = render_html(build_report(parts))
    assert 'class="ans changed">Coat (0.8)' in page and 'class="rule' not in page
    assert "Red: the answer differs from its answer on the clean image." in page


def test_a_classification_answer_is_red_when_the_rule_fails_it_not_when_it_changes():
    parts = make_parts()
    img = _png(np.zeros((8, 8), np.uint8))
    ok, bad = report_pb2.EXAMPLE_VERDICT_CORRECT, report_pb2.EXAMPLE_VERDICT_INCORRECT
    for level, answer, verdict in ((1, "Coat (0.8)", ok), (2, "Bag (0.4)", bad)):
        parts.examples.append(report_pb2.ExampleImage(
            kind=report_pb2.EXAMPLE_KIND_CORRUPTION, setting="gaussian_noise", level=level,
            image_id="i", original_png=img, perturbed_png=img, original_answer="Bag (0.9)",
            perturbed_answer=answer, original_verdict=ok, perturbed_verdict=verdict))
    page = render_html(build_report(parts))
    # top-k rule: "Coat" is not the clean answer yet passes; "Bag" is and fails
    assert 'class="ans pass">Coat (0.8)' in page and 'class="ans fail">Bag (0.4)' in page
    assert "Pass / fail: the plan's rule against the ground truth (IEEE-C2" in page


def test_a_segmentation_report_draws_masks_and_checks_them():
    parts = make_parts()
    parts.target.task = common_pb2.TASK_TYPE_SEGMENTATION
    parts.target.segmentation.CopyFrom(scoring_pb2.SegmentationCriterion(
        classes=[1], miou_threshold=0.6))
    img = np.full((32, 32, 3), 100, np.uint8)
    truth = np.zeros((32, 32), np.uint8)
    truth[8:24, 8:24] = 1
    answer = np.zeros((32, 32), np.uint8)
    answer[4:20, 4:20] = 1
    ex = dict(kind=report_pb2.EXAMPLE_KIND_CORRUPTION, setting="fog", level=3, image_id="o",
              original_png=_png(img), perturbed_png=_png(img), mask_classes=["salient"],
              truth_mask_png=_png(truth), original_mask_png=_png(truth),
              perturbed_mask_png=_png(answer),
              original_verdict=report_pb2.EXAMPLE_VERDICT_CORRECT,
              perturbed_verdict=report_pb2.EXAMPLE_VERDICT_INCORRECT)
    parts.examples.append(report_pb2.ExampleImage(**ex))
    report = build_report(parts)
    e = report["examples"][0]
    assert e["mask_classes"] == ["salient"] and "truth_boxes" not in e
    assert np.array_equal(_decode(e["perturbed_mask"])[:, :, 0], answer)
    page = render_html(report)
    imgs = {i["alt"]: i for i in _Imgs(page).imgs}
    drawn = _decode(imgs["fog at severity 3"]["src"])
    s = annotate.DISPLAY_SIDE // 32
    assert _near(drawn[4 * s, 10 * s], MAGENTA)               # the answer's outline
    assert _near(drawn[23 * s + s - 1, 16 * s], CYAN)         # the truth's outline
    assert "fail" in imgs["fog at severity 3"]["class"].split()
    gt = _decode(imgs["ground truth of image o"]["src"])
    assert not _near(gt[16 * s, 16 * s], np.array([100, 100, 100]))   # truth tinted
    # the report service refuses masks that do not fit the images or the classes
    for bad, field in ((dict(perturbed_mask_png=_png(answer[:16])), "perturbed_mask_png"),
                       (dict(truth_mask_png=_png(truth * 2)), "truth_mask_png"),
                       (dict(original_boxes=[report_pb2.ExampleBox(x_min=1, y_min=1, x_max=2,
                                                                   y_max=2)]),
                        "original_boxes")):
        parts.ClearField("examples")
        parts.examples.append(report_pb2.ExampleImage(**{**ex, **bad}))
        with pytest.raises(InvalidArgument) as ei:
            build_report(parts)
        assert ei.value.violations[0].field == f"parts.examples[0].{field}"


def test_bad_boxes_are_refused_naming_the_field():
    for box, field in (((5, 5, 1, 9), "perturbed_boxes[0]"),
                       ((0, 0, float("nan"), 9), "perturbed_boxes[0]")):
        parts = _det_parts(_det_example(1, [box], report_pb2.EXAMPLE_VERDICT_CORRECT))
        with pytest.raises(InvalidArgument) as ei:
            build_report(parts)
        assert ei.value.violations[0].field == f"parts.examples[0].{field}"
    many = [(1, 1, 2, 2)] * 201
    with pytest.raises(InvalidArgument):
        build_report(_det_parts(_det_example(1, many, report_pb2.EXAMPLE_VERDICT_CORRECT)))


# -- the examples' byte budget ------------------------------------------------------------------

def test_every_cell_of_a_one_photo_grid_fits_the_budget():
    """Five corruptions at three severities on one 512 x 512 photo (the earlier demo's): each
    example carries the clean PNG (~0.6 MB) and its corrupted one (noise: ~1 MB), 15 x ~1.5
    MB over an 8 MiB budget. The last cells (contrast 3 and 5 ...) used to be left out and
    the page said n/a where the table had values; now the sweep is shown reduced, alike."""
    import skimage.data
    from fortis.services.perturbation.engine import perturb

    photo = np.ascontiguousarray(skimage.data.astronaut())
    examples = []
    for cid in ("gaussian_noise", "defocus_blur", "fog", "contrast", "jpeg_compression"):
        for sev in (1, 3, 5):
            out = perturb(cid, sev, 1, [("astronaut", photo)])[0]
            examples.append(Example(kind="corruption", setting=cid, level=sev,
                                    image_id="astronaut", original=photo,
                                    perturbed=np.asarray(out), original_answer="1 box",
                                    perturbed_answer="1 box"))
    assert sum(len(example_image(e).original_png) + len(example_image(e).perturbed_png)
               for e in examples) > EXAMPLES_TOTAL_BYTES
    out = example_images(examples)
    assert [(m.setting, m.level) for m in out] == [(e.setting, e.level) for e in examples]
    assert sum(len(m.original_png) + len(m.perturbed_png) for m in out) <= EXAMPLES_TOTAL_BYTES
    assert all("shown reduced 2 times" in m.note for m in out)      # one scale for the grid
    page = render_html(build_report(_with(make_parts(), out)))
    assert 'alt="contrast at severity 5"' in page


def _with(parts: Any, examples: list[report_pb2.ExampleImage]) -> Any:
    parts.examples.extend(examples)
    return parts


def test_boxes_and_masks_are_reduced_with_their_images():
    img = np.zeros((64, 48, 3), np.uint8)
    mask = np.zeros((64, 48), np.uint8)
    mask[10:30, 4:20] = 1
    e = Example(kind="corruption", setting="fog", level=1, image_id="x", original=img,
                perturbed=img, truth_boxes=(ExampleBox(box=(8, 10, 40, 50), label="face"),),
                truth_mask=mask, mask_classes=("salient",), perturbed_correct=False)
    msg = example_image(e, factor=2)
    assert msg is not None and msg.perturbed_verdict == report_pb2.EXAMPLE_VERDICT_INCORRECT
    b = msg.truth_boxes[0]
    assert (b.x_min, b.y_min, b.x_max, b.y_max, b.label) == (4, 5, 20, 25, "face")
    assert not b.HasField("score")
    with Image.open(io.BytesIO(msg.truth_mask_png)) as im:
        small = np.asarray(im)
    assert small.shape == (32, 24) and np.array_equal(small, mask[::2, ::2])
    assert msg.original_verdict == report_pb2.EXAMPLE_VERDICT_UNSPECIFIED
