"""Random classification evaluations for the array scoring tests: the same answers as arrays
(ScoreEvaluation's input), as per-record ``ClassPrediction``s (the reference path) and as
ScoreEvaluation request messages (the wire)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from fortis.core.tensors import array_to_tensor
from fortis.scoring.v1 import scoring_pb2 as pb
from fortis.services.scoring.evaluation_data import (
    ClassificationAnswers,
    ClassificationTruth,
    EvaluationSetup,
    QueryOutcomes,
    SettingData,
)
from fortis.services.scoring.ieee import ClassPrediction, CorrectnessRule


@dataclass
class Case:
    setup: EvaluationSetup
    settings: list[SettingData]
    label_sets: list[list[int]]


def _answers(rng: np.random.Generator, n: int, c: int, k: int, truth: np.ndarray,
             p_right: float, label_only: bool) -> ClassificationAnswers:
    logits = rng.normal(size=(n, c))
    logits[np.arange(n), truth] += rng.uniform(0, 4) * (rng.random(n) < p_right)
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    labels = order.astype(np.int64)
    scores = np.take_along_axis(probs, order, axis=1).astype(np.float32)
    short = rng.random(n) < 0.2                              # some answers return fewer labels
    labels[short, k - 2:] = -1
    scores[short, k - 2:] = np.nan
    if label_only:
        return ClassificationAnswers(labels=labels[:, :1].copy(), scores=None)
    return ClassificationAnswers(labels=labels, scores=scores)


def _errors(rng: np.random.Generator, n: int, p: float = 0.05) -> tuple[str, ...]:
    return tuple(f"target down ({i})" if rng.random() < p else "" for i in range(n))


def random_case(seed: int, *, m: int = 60, c: int = 8, k: int = 5, rule: CorrectnessRule,
                label_only: bool = False, degradation: bool = True) -> Case:
    rng = np.random.default_rng(seed)
    ids = tuple(f"img-{i:03d}" for i in range(m))
    first = rng.integers(0, c, m)
    sets = [[int(t)] + ([int((t + 1) % c)] if rng.random() < 0.3 else []) for t in first]
    truth = np.full((m, 2), -1, np.int64)
    for i, s in enumerate(sets):
        truth[i, :len(s)] = s
    setup = EvaluationSetup(image_ids=ids, truth=ClassificationTruth(labels=truth),
                            criterion=rule, ranking_enabled=not label_only,
                            num_classes=c)
    settings = [SettingData(kind="clean", answers=_answers(rng, m, c, k, first, 0.8, label_only),
                            errors=_errors(rng, m), field="setting[0]")]
    for name in ("fog", "noise"):
        for sev in (1, 3):
            settings.append(SettingData(
                kind="corruption", name=name, level=sev, field=f"setting[{len(settings)}]",
                answers=_answers(rng, m, c, k, first, 0.8 - 0.1 * sev, label_only),
                errors=_errors(rng, m) if name == "fog" else ()))
    sub = rng.permutation(m)[: m // 2]                         # a plan limit, in any order
    settings.append(SettingData(
        kind="transfer_attack", name="fgsm", image_index=sub, field=f"setting[{len(settings)}]",
        answers=_answers(rng, sub.size, c, k, first[sub], 0.4, label_only),
        errors=_errors(rng, sub.size), linf=rng.uniform(0, 0.03, sub.size),
        l2=rng.uniform(0, 2, sub.size)))
    qsub = np.sort(rng.permutation(m)[: m // 3])
    settings.append(SettingData(
        kind="query_attack", name="square", image_index=qsub, field=f"setting[{len(settings)}]",
        query=QueryOutcomes(success=rng.random(qsub.size) < 0.5,
                            queries=rng.integers(1, 100, qsub.size), budget=100),
        linf=rng.uniform(0, 0.05, qsub.size), l2=rng.uniform(0, 3, qsub.size)))
    if degradation:
        for lv in (1, 2, 4):
            settings.append(SettingData(
                kind="degradation", name="blur", level=lv, field=f"setting[{len(settings)}]",
                answers=_answers(rng, m, c, k, first, 0.8 - 0.15 * lv, label_only),
                errors=_errors(rng, m), fraction_changed=float(rng.uniform(0, 1))))
    return Case(setup=setup, settings=settings, label_sets=sets)


def predictions(a: ClassificationAnswers, errors: tuple[str, ...]) -> list[ClassPrediction]:
    """The per-record form of array answers (what the runner recorded per image)."""
    out = []
    for r in range(a.labels.shape[0]):
        keep = a.labels[r] >= 0
        err = errors[r] if errors and errors[r] else None
        out.append(ClassPrediction(
            labels=tuple(int(x) for x in a.labels[r][keep]),
            scores=None if a.scores is None else tuple(float(x) for x in a.scores[r][keep]),
            error=err))
    return out


def pred_json(p: ClassPrediction) -> dict[str, Any]:
    return {"labels": list(p.labels), "scores": None if p.scores is None else list(p.scores),
            "error": p.error}


# -- the wire -----------------------------------------------------------------------------

_MODE = {"top1": pb.CORRECTNESS_MODE_TOP1, "topk": pb.CORRECTNESS_MODE_TOPK,
         "threshold": pb.CORRECTNESS_MODE_THRESHOLD}
_KIND = {"clean": pb.SETTING_KIND_CLEAN, "corruption": pb.SETTING_KIND_CORRUPTION,
         "transfer_attack": pb.SETTING_KIND_TRANSFER_ATTACK,
         "query_attack": pb.SETTING_KIND_QUERY_ATTACK,
         "degradation": pb.SETTING_KIND_DEGRADATION}


def setup_message(case: Case) -> pb.ScoringSetup:
    rule = case.setup.criterion
    assert isinstance(rule, CorrectnessRule)
    return pb.ScoringSetup(
        image_ids=list(case.setup.image_ids),
        classification=pb.ClassificationTruth(labels=[pb.LabelSet(labels=s)
                                                      for s in case.label_sets]),
        correctness=pb.CorrectnessRule(mode=_MODE[rule.mode], k=rule.k, threshold=rule.threshold),
        ranking=pb.RankingOptions(enabled=case.setup.ranking_enabled,
                                  reason=case.setup.ranking_reason,
                                  num_classes=case.setup.num_classes))


def setting_message(s: SettingData) -> pb.SettingAnswers:
    msg = pb.SettingAnswers(kind=_KIND[s.kind], name=s.name, level=s.level,
                            errors=list(s.errors))
    if s.image_index is not None:
        msg.image_index.extend(int(i) for i in s.image_index)
    if isinstance(s.answers, ClassificationAnswers):
        msg.classification.labels.CopyFrom(array_to_tensor(s.answers.labels))
        if s.answers.scores is not None:
            msg.classification.scores.CopyFrom(array_to_tensor(s.answers.scores))
    if s.query is not None:
        msg.query_attack.success.extend(bool(x) for x in s.query.success)
        if s.query.queries is not None:
            msg.query_attack.queries.extend(int(x) for x in s.query.queries)
        msg.query_attack.query_budget = s.query.budget
    if s.linf is not None and s.l2 is not None:
        msg.sizes.linf.extend(float(x) for x in s.linf)
        msg.sizes.l2.extend(float(x) for x in s.l2)
    if s.fraction_changed is not None:
        msg.fraction_of_pixels_changed = s.fraction_changed
    return msg


def requests(case: Case) -> list[pb.ScoreEvaluationRequest]:
    return [pb.ScoreEvaluationRequest(setup=setup_message(case))] + [
        pb.ScoreEvaluationRequest(setting=setting_message(s)) for s in case.settings]
