"""Scores one whole evaluation from answers held as arrays: the domain side of ScoreEvaluation.
Domain code: no gRPC.

Each test setting is judged in one vectorised call over all its images: classification
top-1 / top-k / threshold straight from the (n, k) label and score matrices (IEEE-C1..C3,
``correctness.classification_correct``), detection through ``DetectionBatch`` (IEEE-C4),
segmentation through the mIoU (IEEE-C5). The per-image booleans then make the IEEE-M1..M8
tree of ``ieee.compute_ieee_metrics``, the very tree ``outcomes.score_classification`` /
``score_detection`` / ``score_segmentation`` give on per-record answers, so an evaluation's
report does not change with the transport. On top of it, as the evaluation runner used to
compute them through ``Compute``:

- attack perturbation sizes (IEEE-A9, PER-4): mean/max L-inf, mean L2, and mean/median L2 of
  the adversarials that misled the target (query attacks, which report success);
- per query attack, its success rate against queries (``success_by_queries``, from the
  ledger's per-image counts, IEEE-M6) and the PER-4 fooling rate at T, its threshold and the
  share never fooled over the images attacked (``fooling_rate``, ``fooling_threshold``,
  ``never_fooled``; None for transfer attacks and attacks without L2 sizes);
- NDCG@1..10 and DRR@5 of every corruption and transfer-attack setting against the clean
  answers (RANK-1..3), via the ``ndcg`` / ``drr`` catalogue entries
  (:mod:`~fortis.services.scoring.evaluation_extras`);
- degradation profiles and failure points per operator (DEG-2..4), via
  ``degradation_profile``;
- the failed queries per setting, each scored as incorrect.

A failed query (a non-empty ``errors`` entry) is incorrect in every task. Bad input raises
:class:`InvalidArgument` naming the request field (``setting[3].classification.labels``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from fortis.core.task import Task
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.stopping import StopCheck, never, raise_if_stopped
from fortis.services.scoring.correctness import (
    DetectionBatch,
    DetectionCriterion,
    SegmentationCriterion,
    classification_correct,
    detection_correct,
    segmentation_correct,
)
from fortis.services.scoring.evaluation_data import (
    ATTACK_KINDS,
    ClassificationAnswers,
    ClassificationTruth,
    DetectionAnswers,
    DetectionTruth,
    EvaluationSetup,
    SegmentationAnswers,
    SegmentationTruth,
    SettingData,
)
from fortis.services.scoring.evaluation_extras import (
    check_class_answers,
    degradation,
    fooling,
    query_errors,
    ranking,
    success_by_queries,
)
from fortis.services.scoring.ieee import AttackImageOutcome, CorrectnessRule, compute_ieee_metrics

__all__ = ["check_class_answers", "judge_setting", "score_evaluation"]

#: Corruption severities (IEEE-M7) and degradation levels (DEG-1) accepted.
SEVERITIES = range(1, 6)
MAX_LEVEL = 1000


def score_evaluation(setup: EvaluationSetup, settings: Sequence[SettingData],
                     should_stop: StopCheck = never) -> dict[str, Any]:
    """The metrics of one evaluation: ``{"ieee": IEEE-M1..M8 tree with attack distances,
    "ranking": RANK-1..3, "degradation": {operator: DEG-2..4 profile}, "query_errors": ...,
    "verdicts": [{kind, name, level, correct: (n,) bool}, ...]}``, the last one per setting
    in the order given: the per-image verdicts the tree counts (query attacks: the IEEE-M3
    outcome), so a caller showing single answers never judges them a second way.

    ``settings`` holds exactly one clean setting; corruption severities are 1..5 and each
    (name, severity) appears once; attack names are unique; degradation (classification only)
    levels are >= 1, each (operator, level) once. ``should_stop`` is polled between
    settings and stages, so the caller's deadline or cancellation stops the work.
    """
    ids = list(setup.image_ids)
    m = len(ids)
    if m == 0:
        raise InvalidArgument(f"{setup.field}.image_ids", "at least one image is needed (M >= 1)")
    if len(set(ids)) != m:
        raise InvalidArgument(f"{setup.field}.image_ids", "image ids must be unique")
    _check_settings(setup, settings)
    judge = _Judge(setup)
    clean_setting = next(s for s in settings if s.kind == "clean")
    clean = judge(clean_setting)
    corruptions: dict[str, dict[int, np.ndarray]] = {}
    corr_cover: dict[str, dict[int, np.ndarray]] = {}
    attacks: dict[str, list[AttackImageOutcome]] = {}
    budgets: dict[str, int | None] = {}
    coverage: dict[str, list[str]] = {}
    verdicts: list[dict[str, Any]] = []
    for s in settings:
        raise_if_stopped(should_stop, "scoring")
        if s.kind == "clean":
            correct = clean
        elif s.kind == "corruption":
            correct = judge(s)
            idx = s.covered(m)
            if s.image_index is not None and idx.size < m:
                # sequential acceptance sent this setting its first images only: counted
                # over those (M_j = their number), never as wrong on the others
                full = np.zeros(m, dtype=bool)
                full[idx] = correct
                corruptions.setdefault(s.name, {})[s.level] = full
                corr_cover.setdefault(s.name, {})[s.level] = idx
            else:
                corruptions.setdefault(s.name, {})[s.level] = correct
        elif s.kind in ATTACK_KINDS:
            idx = s.covered(m)
            coverage[s.name] = [ids[i] for i in idx.tolist()]
            attacks[s.name] = _attack_outcomes(s, idx, ids, clean, judge)
            budgets[s.name] = (s.query.budget or None) if s.query is not None else None
            correct = np.array([o.correct for o in attacks[s.name]], dtype=bool)
        else:                               # degradation: its answers under the same rule
            correct = judge(s)
        verdicts.append({"kind": s.kind, "name": s.name, "level": s.level,
                         "correct": np.asarray(correct, dtype=bool)})
    tree = compute_ieee_metrics(clean=clean, corruptions=corruptions, attacks=attacks,
                                attack_budgets=budgets, image_ids=ids, attack_coverage=coverage,
                                corruption_coverage=corr_cover)
    for s in settings:
        if s.kind in ATTACK_KINDS:
            attacked = np.array([o.attacked for o in attacks[s.name]], dtype=bool)
            misled = np.array([o.misled for o in attacks[s.name]], dtype=bool)
            node = tree["attacks"][s.name]
            node["excluded_reason"] = s.excluded_reason if node.get("excluded") else ""
            _add_attack_distances(node, s, attacked, misled)
            _add_query_curves(node, s, attacked)
    raise_if_stopped(should_stop, "scoring")
    ranks = ranking(setup, settings)
    raise_if_stopped(should_stop, "scoring")
    profiles = degradation(setup, settings)
    return {"ieee": tree, "ranking": ranks, "degradation": profiles,
            "query_errors": query_errors(setup, settings), "verdicts": verdicts}


def judge_setting(setup: EvaluationSetup, s: SettingData) -> np.ndarray:
    """(n,) bool: whether each covered image's answer is correct under the setup's criterion
    (one vectorised call for the whole setting)."""
    return _Judge(setup)(s)


def _check_settings(setup: EvaluationSetup, settings: Sequence[SettingData]) -> None:
    """Structure shared by every task: one clean setting, unique names, sane levels, the
    coverage, errors and outcomes each as long as the covered images."""
    m = len(setup.image_ids)
    cleans = [s for s in settings if s.kind == "clean"]
    if not cleans:
        raise InvalidArgument("setting", "exactly one setting of kind CLEAN is needed, got none")
    if len(cleans) > 1:
        raise InvalidArgument(f"{cleans[1].field}.kind", "a second CLEAN setting (exactly one "
                                                         "is needed)")
    seen: dict[tuple[str, str, int], str] = {}
    for s in settings:
        if s.kind != "clean" and not s.name:
            raise InvalidArgument(f"{s.field}.name", "required for every setting but CLEAN")
        if s.kind == "corruption" and s.level not in SEVERITIES:
            raise InvalidArgument(f"{s.field}.level", f"a corruption severity must be in 1..5, "
                                                      f"got {s.level}")
        if s.kind == "degradation":
            if setup.task != Task.CLASSIFICATION:
                raise InvalidArgument(f"{s.field}.kind", "degradation profiles (DEG-2..4) need "
                                                         f"a classification target, not "
                                                         f"{setup.task}")
            if not 1 <= s.level <= MAX_LEVEL:
                raise InvalidArgument(f"{s.field}.level", f"a degradation level must be in "
                                                          f"1..{MAX_LEVEL}, got {s.level}")
        group = "attack" if s.kind in ATTACK_KINDS else s.kind
        key = (group, s.name, s.level if group != "attack" else 0)
        if key in seen:
            raise InvalidArgument(f"{s.field}.name", f"'{s.label}' was already given by "
                                                     f"{seen[key]}")
        seen[key] = s.field
        idx = s.image_index
        if idx is not None:
            if s.kind not in (*ATTACK_KINDS, "corruption") and \
                    not np.array_equal(idx, np.arange(m)):
                raise InvalidArgument(f"{s.field}.image_index", "only an attack or a "
                                                                "corruption may cover a "
                                                                "subset of the images")
            if idx.size == 0 or idx.min() < 0 or idx.max() >= m:
                raise InvalidArgument(f"{s.field}.image_index", f"indices must lie in "
                                                                f"[0, {m - 1}]")
            if np.unique(idx).size != idx.size:
                raise InvalidArgument(f"{s.field}.image_index", "an image is listed twice")
        n = m if idx is None else int(idx.size)
        if s.errors and len(s.errors) != n:
            raise InvalidArgument(f"{s.field}.errors", f"{len(s.errors)} entries for {n} "
                                                       "covered images (or none)")
        _check_payload(s, n)


def _check_payload(s: SettingData, n: int) -> None:
    if s.kind == "query_attack":
        if s.answers is not None:
            raise InvalidArgument(f"{s.field}.answers", "a query attack carries its outcomes "
                                                        "(query_attack), not answers")
        q = s.query
        if q is None:
            raise InvalidArgument(f"{s.field}.query_attack", "required for a query attack")
        if q.success.shape != (n,):
            raise InvalidArgument(f"{s.field}.query_attack.success",
                                  f"{q.success.size} outcomes for {n} covered images")
        if q.queries is not None and (q.queries.shape != (n,) or (q.queries < 0).any()):
            raise InvalidArgument(f"{s.field}.query_attack.queries",
                                  f"one count >= 0 per covered image ({n}), or none")
        if q.budget < 0:
            raise InvalidArgument(f"{s.field}.query_attack.query_budget", "must be >= 0")
    else:
        if s.answers is None:
            raise InvalidArgument(f"{s.field}.answers", "required: the target's answers")
        if s.query is not None:
            raise InvalidArgument(f"{s.field}.query_attack", "only a query attack carries "
                                                             "outcomes")
    if (s.linf is None) != (s.l2 is None):
        raise InvalidArgument(f"{s.field}.sizes", "give both linf and l2, or neither")
    for what, arr in (("linf", s.linf), ("l2", s.l2)):
        if arr is None:
            continue
        if s.kind not in ATTACK_KINDS:
            raise InvalidArgument(f"{s.field}.sizes", "only attacks have perturbation sizes")
        if arr.shape != (n,):
            raise InvalidArgument(f"{s.field}.sizes.{what}", f"{arr.size} values for {n} "
                                                             "covered images")
        if not (np.isfinite(arr).all() and (arr >= 0).all()):
            raise InvalidArgument(f"{s.field}.sizes.{what}", "must be finite and >= 0")
    if s.fraction_changed is not None:
        if s.kind != "degradation":
            raise InvalidArgument(f"{s.field}.fraction_of_pixels_changed",
                                  "only a degradation setting has it")
        if not 0.0 <= s.fraction_changed <= 1.0:          # NaN fails both comparisons
            raise InvalidArgument(f"{s.field}.fraction_of_pixels_changed",
                                  f"must be in [0, 1], got {s.fraction_changed}")


class _Judge:
    """The setup's criterion applied to one setting's answers (vectorised per setting)."""

    def __init__(self, setup: EvaluationSetup) -> None:
        self.setup = setup
        self.m = len(setup.image_ids)
        self._truth_batch: DetectionBatch | None = None

    def __call__(self, s: SettingData) -> np.ndarray:
        idx = s.covered(self.m)
        failed = s.failed(int(idx.size))
        truth = self.setup.truth
        if isinstance(truth, ClassificationTruth):
            return self._classification(s, idx, failed, truth)
        if isinstance(truth, DetectionTruth):
            return self._detection(s, idx, failed, truth)
        return self._segmentation(s, idx, failed, truth)

    def _ids(self, idx: np.ndarray) -> list[str]:
        return [self.setup.image_ids[i] for i in idx.tolist()]

    def _classification(self, s: SettingData, idx: np.ndarray, failed: np.ndarray,
                        truth: ClassificationTruth) -> np.ndarray:
        a = s.answers
        f = f"{s.field}.classification"
        if not isinstance(a, ClassificationAnswers):
            raise InvalidArgument(f"{s.field}.answers", "classification answers are needed")
        labels, scores = check_class_answers(a, int(idx.size), f)
        rule = self.setup.criterion
        assert isinstance(rule, CorrectnessRule)
        if rule.mode == "threshold" and scores is None:
            raise InvalidArgument(f"{f}.scores", "the threshold rule (IEEE-C2 Alternative 3) "
                                                 "needs scores; this setting has labels only")
        tr = truth.labels if idx.size == self.m and s.image_index is None else truth.labels[idx]
        return classification_correct(labels, tr[:, None, :], rule, ranked_scores=scores,
                                      failed=failed)

    def _detection(self, s: SettingData, idx: np.ndarray, failed: np.ndarray,
                   truth: DetectionTruth) -> np.ndarray:
        a = s.answers
        f = f"{s.field}.detection"
        if not isinstance(a, DetectionAnswers):
            raise InvalidArgument(f"{s.field}.answers", "detection answers are needed")
        if a.counts.shape != (idx.size,):
            raise InvalidArgument(f"{f}.counts", f"{a.counts.size} counts for {idx.size} "
                                                 "covered images")
        if self._truth_batch is None:
            self._truth_batch = DetectionBatch.from_images(
                list(truth.images), field=f"{self.setup.field}.detection.images",
                image_ids=list(self.setup.image_ids))
        ids = self._ids(idx)
        pred = DetectionBatch.from_arrays(boxes=a.boxes, labels=a.labels, counts=a.counts,
                                          scores=a.scores, failed=failed, image_ids=ids, field=f)
        t = self._truth_batch if s.image_index is None else self._truth_batch.take(idx)
        crit = self.setup.criterion
        assert isinstance(crit, DetectionCriterion)
        return detection_correct(t, pred, crit)

    def _segmentation(self, s: SettingData, idx: np.ndarray, failed: np.ndarray,
                      truth: SegmentationTruth) -> np.ndarray:
        a = s.answers
        f = f"{s.field}.segmentation.class_maps"
        if not isinstance(a, SegmentationAnswers):
            raise InvalidArgument(f"{s.field}.answers", "segmentation answers are needed")
        maps = a.class_maps
        if maps is None:
            raise InvalidArgument(f, "segmentation answers need their class maps")
        tm = truth.class_maps if s.image_index is None else truth.class_maps[idx]
        if maps.shape != tm.shape:
            raise InvalidArgument(f, f"shape {list(maps.shape)} does not match the covered "
                                     f"ground truth {list(tm.shape)}")
        if not np.issubdtype(maps.dtype, np.integer):
            raise InvalidArgument(f, f"class maps must be integers, got {maps.dtype}")
        crit = self.setup.criterion
        assert isinstance(crit, SegmentationCriterion)
        return segmentation_correct(maps, tm, crit, failed=failed, image_ids=self._ids(idx),
                                    field=f)


def _attack_outcomes(s: SettingData, idx: np.ndarray, ids: list[str], clean: np.ndarray,
                     judge: _Judge) -> list[AttackImageOutcome]:
    """IEEE-M3/M6 outcome per covered image. Transfer: judged on the target's answer to the
    adversarial. Query: right on the clean image and not misled within the budget. An image
    the plan's criterion left out (``SettingData.excluded``) keeps its clean verdict."""
    n = int(idx.size)
    errors = s.errors or ("",) * n
    init = clean[idx].tolist()
    names = [ids[i] for i in idx.tolist()]
    out_ = s.left_out(n).tolist()
    if s.kind == "transfer_attack":
        ok = judge(s).tolist()
        return [AttackImageOutcome(image_id=i, correct=c, initially_correct=c0, success=None,
                                   queries=None, error=e or None, excluded=x)
                for i, c, c0, e, x in zip(names, ok, init, errors, out_, strict=True)]
    assert s.query is not None
    succ = s.query.success.tolist()
    queries = s.query.queries.tolist() if s.query.queries is not None else [None] * n
    return [AttackImageOutcome(image_id=i, correct=c0 and (x or not w), initially_correct=c0,
                               success=bool(w) if c0 and not x else None, queries=q,
                               error=e or None, excluded=x)
            for i, c0, w, q, e, x in zip(names, init, succ, queries, errors, out_, strict=True)]


def _add_attack_distances(node: dict[str, Any], s: SettingData, attacked: np.ndarray,
                          misled: np.ndarray) -> None:
    """IEEE-A9 / IEEE-M6 / PER-3 sizes of an attack's adversarials, over the images it
    misled among those it attacked (answered, right on the clean image, not left out: as the
    success rate and PER-4's fooling rate count them; an image already wrong is no success
    with a zero perturbation), and apart from them the sizes of the attacked images it did
    not mislead (a minimal-norm attack's last point lies outside the bound when it fails:
    it must not pass for the size of a success)."""
    if s.linf is None or s.l2 is None:
        return
    won, lost = misled, attacked & ~misled
    node["mean_linf"] = float(np.mean(s.linf[won])) if won.any() else None
    node["max_linf"] = float(np.max(s.linf[won])) if won.any() else None
    node["mean_l2"] = node["mean_l2_successful"] = \
        float(np.mean(s.l2[won])) if won.any() else None
    node["median_l2_successful"] = float(np.median(s.l2[won])) if won.any() else None
    node["unsuccessful_mean_l2"] = float(np.mean(s.l2[lost])) if lost.any() else None
    node["unsuccessful_max_linf"] = float(np.max(s.linf[lost])) if lost.any() else None


def _add_query_curves(node: dict[str, Any], s: SettingData, attacked: np.ndarray) -> None:
    """A query attack's success-vs-queries curve and PER-4 fooling rate (module docstring),
    over the images it attacked: right on the clean image (Clean_Result), answered and not
    left out by the criterion, the success rate's denominator (IEEE-M6)."""
    node["success_by_queries"] = None
    node.update(fooling_rate=None, fooling_threshold=None, never_fooled=None)
    q = s.query
    if q is None:
        return
    if q.queries is not None:
        node["success_by_queries"] = success_by_queries(q.success, q.queries, attacked,
                                                        q.budget) or None
    if s.l2 is not None:
        node.update(fooling(q.success, s.l2, q.queries, attacked))
