"""ScoreEvaluation's domain side on arrays (IEEE-M1..M8 with IEEE-C1..C5, RANK-1..3, DEG-2..4)
against the per-record reference: ``outcomes.score_classification`` on ``ClassPrediction``s
(``is_correct`` semantics) and the evaluation runner's former ranking / degradation /
query-error code through ``Compute`` on dense score matrices. Same numbers, vectorised."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from fortis.core import criteria as common_criteria
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring import correctness as cr
from fortis.services.scoring.catalogue import compute
from fortis.services.scoring.convert import read_evaluation, response_from_scores
from fortis.services.scoring.correctness import (
    DetectionCriterion,
    Detections,
    SegmentationCriterion,
)
from fortis.services.scoring.evaluation_data import (
    ClassificationAnswers,
    DetectionAnswers,
    DetectionTruth,
    EvaluationSetup,
    SegmentationAnswers,
    SegmentationTruth,
    SettingData,
)
from fortis.services.scoring.evaluation_scoring import score_evaluation
from fortis.services.scoring.ieee import CorrectnessRule, is_correct
from fortis.services.scoring.outcomes import (
    TestRecord,
    score_classification,
    score_detection,
    score_segmentation,
)

from tests.unit.scoring_arrays_cases import Case, pred_json, predictions, random_case, requests

RULES = [CorrectnessRule(mode="top1"), CorrectnessRule(mode="topk", k=3),
         CorrectnessRule(mode="threshold", threshold=0.3)]


# -- the per-record reference ---------------------------------------------------------------

def _records(case: Case) -> tuple[list[TestRecord[Any]], dict[str, dict[str, Any]]]:
    """The case as the runner recorded it: TestRecords and JSON answers per setting label."""
    ids = list(case.setup.image_ids)
    tests: list[TestRecord[Any]] = []
    answers: dict[str, dict[str, Any]] = {}
    for s in case.settings:
        idx = s.covered(len(ids))
        cover = [ids[i] for i in idx.tolist()]
        if s.kind == "query_attack":
            assert s.query is not None
            tests.append(TestRecord(kind="attack", perturbation_id=s.name,
                                    image_ids=tuple(cover), query_budget=s.query.budget,
                                    success=dict(zip(cover, s.query.success.tolist(), strict=True)),
                                    queries=dict(zip(cover, s.query.queries.tolist(), strict=True))))
            continue
        assert isinstance(s.answers, ClassificationAnswers)
        preds = dict(zip(cover, predictions(s.answers, s.errors), strict=True))
        answers[s.label] = {i: pred_json(p) for i, p in preds.items()}
        if s.kind == "degradation":
            continue
        kind = "attack" if s.kind == "transfer_attack" else s.kind
        tests.append(TestRecord(kind=kind, perturbation_id=s.name, severity=s.level,
                                predictions=preds,
                                image_ids=tuple(cover) if kind == "attack" else ()))
    return tests, answers


def _dense(preds: Mapping[str, Any], ids: Sequence[str], c: int) -> np.ndarray:
    out = np.full((len(ids), c), np.nan)
    for r, i in enumerate(ids):
        p = preds[i]
        if p.get("scores") and not p.get("error"):
            out[r, p["labels"]] = p["scores"]
    return out


def _ref_ranking(case: Case, answers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    c = case.setup.num_classes
    clean = answers["clean"]
    ids = [i for i in clean if not clean[i].get("error") and clean[i].get("scores")]
    settings: dict[str, Any] = {}
    for s in case.settings:
        if s.kind not in ("corruption", "transfer_attack"):
            continue
        preds = answers[s.label]
        keep = [i for i in ids if i in preds and not preds[i].get("error") and preds[i].get("scores")]
        if not keep:
            continue
        benign, pert = _dense(clean, keep, c), _dense(preds, keep, c)
        nd = compute("ndcg", {"perturbed_probs": pert, "benign_probs": benign})
        dr = compute("drr", {"perturbed_probs": pert, "benign_class": np.nanargmax(benign, axis=1)})
        settings[s.label] = {"kind": s.kind, "m": len(keep), "ndcg_1": nd["mean"]["ndcg_1"],
                             "ndcg_at": nd["mean"]["ndcg_at"], "drr_5": dr["mean"]["drr"],
                             "drr_n": dr["m_applicable"], "applicable": bool(nd["applicable"])}
    return settings


def _ref_degradation(case: Case, answers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    ids, c = list(case.setup.image_ids), case.setup.num_classes
    scored = case.settings[0].answers.scores is not None  # type: ignore[union-attr]

    def ranked(preds: Mapping[str, Any]) -> np.ndarray:
        out = np.full((len(ids), 20), -1, dtype=np.int64)
        for r, i in enumerate(ids):
            if not preds[i].get("error"):
                out[r, :len(preds[i]["labels"])] = preds[i]["labels"]
        return out

    arrays = {"true_labels": np.array([s[0] for s in case.label_sets]),
              "labels@0": ranked(answers["clean"])}
    if scored:
        arrays["probs@0"] = _dense(answers["clean"], ids, c)
    changes = {}
    for s in case.settings:
        if s.kind == "degradation":
            arrays[f"labels@{s.level}"] = ranked(answers[s.label])
            if scored:
                arrays[f"probs@{s.level}"] = _dense(answers[s.label], ids, c)
            changes[str(s.level)] = {"fraction_of_pixels_changed": round(s.fraction_changed or 0, 6)}
    return {"blur": compute("degradation_profile", arrays,
                            {"image_ids": ids, "changes": changes, "num_classes": c})}


def _clean_right(case: Case, rule: CorrectnessRule) -> list[bool]:
    """Clean_Result per image, judged record by record (``is_correct``)."""
    clean = next(s for s in case.settings if s.kind == "clean")
    assert isinstance(clean.answers, ClassificationAnswers)
    return [is_correct(p, case.label_sets[i], rule)
            for i, p in enumerate(predictions(clean.answers, clean.errors))]


def _ref_curves(tree: dict[str, Any], case: Case, rule: CorrectnessRule) -> None:
    """IEEE-M6 success-vs-queries and PER-4, image by image: an image attacked is right on
    its clean record (``is_correct``) and answered; at q, the share misled within q queries;
    fooled at T when its L2 < T (T = mean L2 of those misled)."""
    ids = list(case.setup.image_ids)
    right = _clean_right(case, rule)
    for s in case.settings:
        if s.kind not in ("transfer_attack", "query_attack"):
            continue
        node = tree["attacks"][s.name]
        node.update(success_by_queries=None, fooling_rate=None, fooling_threshold=None,
                    never_fooled=None)
        if s.query is None:
            continue
        idx = s.covered(len(ids)).tolist()
        err = list(s.errors) or [""] * len(idx)
        att = [r for r, i in enumerate(idx) if right[i] and not err[r]]
        won = [r for r in att if s.query.success[r]]
        if not att:
            continue
        if s.query.queries is not None:
            qs = [int(s.query.queries[r]) for r in won]
            pts = [[q, sum(x <= q for x in qs) / len(att)] for q in sorted(set(qs))]
            if s.query.budget and (not pts or s.query.budget > pts[-1][0]):
                pts.append([s.query.budget, len(won) / len(att)])
            node["success_by_queries"] = pts or None
        if s.l2 is not None:
            found = [float(s.l2[r]) for r in won]
            t = sum(found) / len(found) if found else None
            node["fooling_threshold"] = t
            node["fooling_rate"] = sum(v < t for v in found) / len(att) if found else None
            node["never_fooled"] = (len(att) - len(won)) / len(att)


def _ref_distances(tree: dict[str, Any], case: Case, rule: CorrectnessRule) -> None:
    """IEEE-A9 / M6 / PER-3 sizes, image by image: those of the adversarials that misled the
    target among the images attacked (right on the clean record, answered; a transfer attack
    misleads when its adversarial's record is wrong), apart from those that did not."""
    ids = list(case.setup.image_ids)
    right = _clean_right(case, rule)
    for s in case.settings:
        if s.kind not in ("transfer_attack", "query_attack"):
            continue
        node = tree["attacks"][s.name]
        node["excluded_reason"] = ""
        if s.linf is None or s.l2 is None:
            continue
        idx = s.covered(len(ids)).tolist()
        err = list(s.errors) or [""] * len(idx)
        if s.query is not None:
            misled = [bool(x) for x in s.query.success]
        else:
            assert isinstance(s.answers, ClassificationAnswers)
            misled = [not is_correct(p, case.label_sets[i], rule) for p, i in
                      zip(predictions(s.answers, s.errors), idx, strict=True)]
        att = [r for r, i in enumerate(idx) if right[i] and not err[r]]
        won = [r for r in att if misled[r]]
        lost = [r for r in att if not misled[r]]
        linf, l2 = [float(s.linf[r]) for r in won], [float(s.l2[r]) for r in won]
        node.update(mean_linf=float(np.mean(linf)) if won else None,
                    max_linf=max(linf) if won else None,
                    mean_l2=float(np.mean(l2)) if won else None,
                    mean_l2_successful=float(np.mean(l2)) if won else None,
                    median_l2_successful=float(np.median(l2)) if won else None,
                    unsuccessful_mean_l2=float(np.mean([float(s.l2[r]) for r in lost]))
                    if lost else None,
                    unsuccessful_max_linf=max(float(s.linf[r]) for r in lost)
                    if lost else None)


def _close(a: Any, b: Any, path: str = "") -> None:
    """Equal trees, floats to float32 precision (scores travel as float32)."""
    if isinstance(a, Mapping):
        assert isinstance(b, Mapping) and list(a) == list(b), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for n, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{n}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9), (path, a, b)
    else:
        assert a == b, (path, a, b)


# -- classification --------------------------------------------------------------------------

@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.mode)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_arrays_give_the_per_record_metrics(rule: CorrectnessRule, seed: int) -> None:
    """IEEE-M1..M8 (C1/C2 top-1, top-k, threshold; label sets; attacks on subsets in any
    order; failed queries), RANK-1/2 and DEG-2..4 equal the per-record path."""
    case = random_case(seed, rule=rule)
    out = score_evaluation(case.setup, case.settings)
    tests, answers = _records(case)
    labels = {i: s for i, s in zip(case.setup.image_ids, case.label_sets, strict=True)}
    ref = score_classification(rule, labels, tests)
    _ref_distances(ref, case, rule)
    _ref_curves(ref, case, rule)
    _close(out["ieee"], ref)
    assert out["ranking"]["applicable"] is True
    _close(out["ranking"]["settings"], _ref_ranking(case, answers))
    _close(out["degradation"], _ref_degradation(case, answers))
    q = out["query_errors"]
    assert q["total"] == sum(sum(bool(e) for e in s.errors) for s in case.settings)
    assert list(q["settings"])[0] == "clean" and "blur@level1" in q["settings"]
    # and the typed response carries it
    resp = response_from_scores(out)
    assert resp.ieee.accuracy.value == ref["accuracy"]["value"]
    assert {a.name for a in resp.ieee.attacks} == {"fgsm", "square"}
    assert resp.degradation[0].name == "blur" and len(resp.degradation[0].failure_points) == 3


@pytest.mark.parametrize("rule", RULES[:2], ids=lambda r: r.mode)
def test_label_only_targets(rule: CorrectnessRule) -> None:
    """A labels-only target: same IEEE metrics; ranking not applicable (RANK-3), never 0;
    degradation profiles without probabilities."""
    case = random_case(5, rule=rule, label_only=True)
    out = score_evaluation(case.setup, case.settings)
    tests, answers = _records(case)
    ref = score_classification(rule, dict(zip(case.setup.image_ids, case.label_sets,
                                              strict=True)), tests)
    _ref_distances(ref, case, rule)
    _ref_curves(ref, case, rule)
    _close(out["ieee"], ref)
    assert out["ranking"] == {"applicable": False, "settings": {},
                              "reason": "the target returns labels only; NDCG and DRR need "
                                        "scores (RANK-3)"}
    _close(out["degradation"], _ref_degradation(case, answers))
    with pytest.raises(InvalidArgument) as ei:
        score_evaluation(EvaluationSetup(**{**case.setup.__dict__,
                                            "criterion": CorrectnessRule(mode="threshold")}),
                         case.settings)
    assert ei.value.violations[0].field == "setting[0].classification.scores"


def test_each_record_agrees_with_is_correct() -> None:
    """The verdict of every single image equals ``is_correct`` on its record."""
    from fortis.services.scoring.evaluation_scoring import judge_setting
    for rule in RULES:
        case = random_case(7, rule=rule, degradation=False)
        for s in case.settings:
            if s.kind == "query_attack":
                continue
            assert isinstance(s.answers, ClassificationAnswers)
            idx = s.covered(len(case.setup.image_ids))
            got = judge_setting(case.setup, s)
            want = [is_correct(p, case.label_sets[i], rule)
                    for p, i in zip(predictions(s.answers, s.errors), idx.tolist(), strict=True)]
            assert got.tolist() == want


# -- detection and segmentation ------------------------------------------------------------

def test_detection_and_segmentation_equal_the_record_path() -> None:
    rng = np.random.default_rng(3)
    ids = [f"d{i}" for i in range(12)]
    truths = {}
    for i in ids:
        n = int(rng.integers(0, 3))
        xy = rng.uniform(0, 60, (n, 2))
        truths[i] = Detections(boxes=np.hstack([xy, xy + rng.uniform(10, 30, (n, 2))]),
                               labels=rng.integers(1, 4, n), label_base=1, image_size=(100, 100))
    crit = DetectionCriterion.from_dict({"mode": "threshold", "iou_threshold": 0.5})

    def answers(jitter: float, failed: int = -1) -> tuple[DetectionAnswers, dict[str, Detections]]:
        boxes, labels, scores, counts, per = [], [], [], [], {}
        for n, i in enumerate(ids):
            if n == failed:                                   # a failed query: no rows
                counts.append(0)
                per[i] = Detections(boxes=np.zeros((0, 4)), labels=[], error="down")
                continue
            t = truths[i]
            shift = rng.normal(0, jitter, (len(t.labels), 2))
            b = np.asarray(t.boxes, dtype=np.float64) + np.hstack([shift, shift])
            lab = np.asarray(t.labels) - 1
            sc = rng.uniform(0.3, 1.0, len(lab))
            boxes.append(b), labels.append(lab), scores.append(sc), counts.append(len(lab))
            per[i] = Detections(boxes=b, labels=lab, scores=sc)
        return (DetectionAnswers(boxes=np.concatenate(boxes).astype(np.float32),
                                 labels=np.concatenate(labels).astype(np.int64),
                                 scores=np.concatenate(scores).astype(np.float32),
                                 counts=np.asarray(counts)), per)

    clean, clean_p = answers(1.0)
    fog, fog_p = answers(8.0, failed=4)
    errors = tuple("down" if n == 4 else "" for n in range(len(ids)))
    setup = EvaluationSetup(image_ids=tuple(ids), truth=DetectionTruth(images=tuple(truths.values())),
                            criterion=crit)
    out = score_evaluation(setup, [SettingData(kind="clean", answers=clean),
                                   SettingData(kind="corruption", name="fog", level=2, answers=fog,
                                               errors=errors)])
    # float32 answers: the reference sees the same rounded boxes
    r32 = {i: Detections(boxes=np.asarray(p.boxes, np.float32).astype(np.float64), labels=p.labels,
                         scores=None if p.scores is None else np.asarray(p.scores, np.float32),
                         error=p.error) for i, p in fog_p.items()}
    c32 = {i: Detections(boxes=np.asarray(p.boxes, np.float32).astype(np.float64), labels=p.labels,
                         scores=np.asarray(p.scores, np.float32)) for i, p in clean_p.items()}
    ref = score_detection(crit, truths, [TestRecord(kind="clean", predictions=c32),
                                         TestRecord(kind="corruption", perturbation_id="fog",
                                                    severity=2, predictions=r32)])
    assert out["ieee"] == ref
    assert out["ranking"]["applicable"] is False and out["query_errors"]["total"] == 1

    truth = np.zeros((6, 8, 8), np.int64)
    truth[:, 2:6, 2:6] = 1
    truth[3] = 0                                              # no class of interest at all
    good, bad = truth.copy(), np.zeros_like(truth)
    bad[0] = truth[0]
    seg = SegmentationCriterion.from_dict({"classes": [1], "miou_threshold": 0.5})
    sid = tuple(f"s{i}" for i in range(6))
    out = score_evaluation(
        EvaluationSetup(image_ids=sid, truth=SegmentationTruth(class_maps=truth), criterion=seg),
        [SettingData(kind="clean", answers=SegmentationAnswers(class_maps=good)),
         SettingData(kind="corruption", name="blur", level=1,
                     answers=SegmentationAnswers(class_maps=bad))])
    ref = score_segmentation(seg, {i: truth[n] for n, i in enumerate(sid)}, [
        TestRecord(kind="clean", predictions={i: cr.SegmentationPrediction(mask=good[n])
                                              for n, i in enumerate(sid)}),
        TestRecord(kind="corruption", perturbation_id="blur", severity=1,
                   predictions={i: cr.SegmentationPrediction(mask=bad[n])
                                for n, i in enumerate(sid)})])
    assert out["ieee"] == ref
    assert out["ieee"]["corruptions"]["blur"]["1"]["correct"] == 2   # s0 and the empty s3


# -- malformed input -----------------------------------------------------------------------

def _bad(case: Case, field: str, **change: Any) -> None:
    n = change.pop("at")
    settings = list(case.settings)
    settings[n] = SettingData(**{**settings[n].__dict__, **change})
    with pytest.raises(InvalidArgument) as ei:
        score_evaluation(case.setup, settings)
    assert ei.value.violations[0].field == field, ei.value.message


def test_bad_settings_name_the_field() -> None:
    case = random_case(1, rule=RULES[0])
    m = len(case.setup.image_ids)
    lab = case.settings[1].answers.labels  # type: ignore[union-attr]
    _bad(case, "setting[1].classification.labels", at=1,
         answers=ClassificationAnswers(labels=lab[:-1]))
    _bad(case, "setting[1].classification.scores", at=1,
         answers=ClassificationAnswers(labels=lab, scores=np.zeros((m, 1), np.float32)))
    _bad(case, "setting[1].level", at=1, level=9)
    _bad(case, "setting[2].name", at=2, name="fog", level=1)
    _bad(case, "setting[1].kind", at=1, kind="clean")
    _bad(case, "setting[1].errors", at=1, errors=("x",))
    # a corruption may cover its first images (sequential acceptance), with answers for
    # exactly those; a degradation level may not cover a subset
    _bad(case, "setting[1].errors", at=1, image_index=np.arange(3))
    _bad(case, "setting[7].image_index", at=7, image_index=np.arange(3))
    _bad(case, "setting[5].sizes.linf", at=5, linf=np.full(m // 2, np.nan))
    _bad(case, "setting[6].query_attack", at=6, query=None)
    _bad(case, "setting[7].fraction_of_pixels_changed", at=7, fraction_changed=float("nan"))
    with pytest.raises(InvalidArgument) as ei:
        score_evaluation(case.setup, case.settings[1:])
    assert ei.value.violations[0].field == "setting"


def test_stream_reading_is_strict() -> None:
    case = random_case(2, rule=RULES[1], degradation=False)
    reqs = requests(case)
    setup, settings = read_evaluation(reqs)
    assert len(settings) == len(case.settings)
    for stream, field in (([], "setup"), (reqs[1:], "setup"), (reqs + reqs[:1], "setup")):
        with pytest.raises(InvalidArgument) as ei:
            read_evaluation(stream)
        assert ei.value.violations[0].field == field


# -- shared criteria ---------------------------------------------------------------------

@pytest.mark.parametrize("section", [
    {"mode": "topk", "k": 2, "iou_threshold": 0.3, "aggregate": "at_least", "q": 2},
    {"mode": "nope", "k": 0, "iou_threshold": 1.5, "confidence_threshold": float("nan")},
    {"iou_threshold": float("nan"), "q": True, "extra": 1},
])
def test_common_detection_criterion_matches_correctness(section: dict[str, Any]) -> None:
    _same(lambda m: m.DetectionCriterion.from_dict(section, prefix="p"))


@pytest.mark.parametrize("section", [
    {"classes": [1, 2], "miou_threshold": 0.4, "ignore_label": None},
    {"classes": [1, 1], "miou_threshold": 1.0, "all_absent": "maybe"},
    {"classes": [255], "ignore_label": 255, "x": 1},
    {"miou_threshold": "a"},
])
def test_common_segmentation_criterion_matches_correctness(section: dict[str, Any]) -> None:
    _same(lambda m: m.SegmentationCriterion.from_dict(section, prefix="p"))


@pytest.mark.parametrize("section", [{"aggregate": "at_least", "q": 3}, {"aggregate": "x", "q": 0}])
def test_common_aggregation_rule_matches_correctness(section: dict[str, Any]) -> None:
    _same(lambda m: m.AggregationRule.from_dict(section, prefix="p"))
    rule = common_criteria.AggregationRule(mode="at_least", q=2)
    v = np.array([[True, True, False], [True, False, False]])
    assert rule.combine(v).tolist() == cr.AggregationRule(mode="at_least", q=2).combine(v).tolist()


def test_correctness_rule_is_the_shared_one() -> None:
    assert CorrectnessRule is common_criteria.CorrectnessRule
    with pytest.raises(InvalidArgument) as ei:
        common_criteria.CorrectnessRule.from_dict({"mode": "x", "k": 0}, prefix="setup.correctness")
    assert [v.field for v in ei.value.violations] == ["setup.correctness.mode",
                                                      "setup.correctness.k"]
    assert common_criteria.BOX_FORMATS == cr.BOX_FORMATS
    assert common_criteria.ALL_ABSENT_POLICIES == cr.ALL_ABSENT_POLICIES
    assert common_criteria.AGGREGATE_MODES == cr.AGGREGATE_MODES


def _same(build: Any) -> None:
    """The common criteria validate exactly like the scoring correctness package's."""
    results = []
    for module in (common_criteria, cr):
        try:
            results.append(("ok", build(module).to_dict()))
        except InvalidArgument as exc:
            results.append(("error", [(v.field, v.description) for v in exc.violations]))
    assert results[0] == results[1]
