"""IEEE Std 3129-2023 metrics for image-recognition services (section 4.7).

Pure domain code (no gRPC): classification prediction correctness (4.7.6, IEEE-C1/C2), Wilson
confidence intervals for every rate (IEEE-M8) and the metrics tree of an evaluation
(IEEE-M1..M7). The tree is built from per-image booleans only (Clean_Result(i),
Corr_Result(i, j), Adv_Result(i, j)), so it is the same for every service type; how those
booleans are decided for multi-label-set classification, object detection and semantic
segmentation (IEEE-C3..C5, IEEE-P6) lives in ``fortis.services.scoring.correctness``.

Metric tree returned by :func:`compute_ieee_metrics` (alias :func:`compute_classification_metrics`;
a plain JSON-able dict)::

    m                                   M, the number of clean images
    accuracy                            {value, ci95, m, correct}                    IEEE-M1
    corruptions.<name>.<severity>       {robustness, ci95, m, correct}               IEEE-M2, M7
    corruptions.<name>.mean             {robustness, ci95: null, severities}         mean over severities
    average_robustness_corr             {value, ci95: null, n, m, definition}        IEEE-M2 eq. (3)
    average_robustness_corr_by_severity {"<s>": {value, ci95: null, n}}              IEEE-M7
    worstcase_robustness_corr           {value, ci95, m, correct, n_settings}        IEEE-M4 eq. (6)
    worstcase_robustness_corr_by_severity {"<s>": {value, ci95, m, correct, n_settings}}
    attacks.<name>                      {robustness_adv, ci95, m, correct, kind,     IEEE-M3, M6
                                         success_rate, success_rate_ci95, success_rate_n,
                                         successes, mean_queries, median_queries,
                                         mean_queries_successful, query_budget,
                                         errors, error_images, clean_mismatches}
    average_robustness_adv              {value, ci95: null, n, m, definition}        IEEE-M3 eq. (5)
    worstcase_robustness_adv            {value, ci95, m, correct, n_settings}        IEEE-M5 eq. (7)

Severity keys are strings ("1".."5") so that the tree survives a JSON round trip unchanged.
Where there is nothing to average (no corruptions, no attacks) every ``value`` and ``ci95``
is ``null``, never 0.

Confidence intervals: every per-image binary rate (accuracy, robustness per setting,
worst-case robustness, success rate) has a 95 % Wilson score interval (IEEE-M8). The
*averages* (over severities, corruptions or attacks) are means of correlated proportions
measured on the same M images, so a Wilson interval on the pooled count would be too narrow;
their ``ci95`` is left ``null`` on purpose.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
from fortis.core.criteria import CORRECTNESS_MODES, CorrectnessRule
from fortis.services.common.errors import FieldViolation, InvalidArgument

__all__ = [
    "CORRECTNESS_MODES",
    "AttackImageOutcome",
    "ClassPrediction",
    "CorrectnessRule",
    "ResultVector",
    "compute_classification_metrics",
    "compute_ieee_metrics",
    "is_correct",
    "wilson_interval",
]

_Z95 = 1.959963984540054
_MAX_LISTED = 20  # at most this many missing-image violations in one error


# --------------------------------------------------------------------------------------------
# Correctness (IEEE-C1, IEEE-C2). The rule itself is plan data shared with the evaluation
# service (fortis.core.criteria); it is re-exported here for the scoring code.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ClassPrediction:
    """One answer of a classification target, as the proxy recorded it.

    ``labels`` are ranked best first (a labels-only target gives one); ``scores`` are in the
    same order, or ``None`` when the target returns no scores. ``error`` is set when the
    query failed: the prediction then counts as incorrect and the error is reported.
    """

    labels: tuple[int, ...]
    scores: tuple[float, ...] | None
    error: str | None = None


def is_correct(pred: ClassPrediction, truth: Sequence[int], rule: CorrectnessRule) -> bool:
    """Whether ``pred`` is correct for an image whose acceptable labels are ``truth``.

    Any one of ``truth`` matching counts (the image's labels in the service's label set,
    IEEE-P6). Rules: see :class:`CorrectnessRule` (IEEE-C1, IEEE-C2 Alternatives 1-3).
    A failed query (``pred.error``) is incorrect.
    """
    if pred.error is not None:
        return False
    if rule.mode == "threshold" and pred.scores is None:
        raise InvalidArgument("correctness.mode", "threshold needs a score-returning target")
    if pred.scores is not None and len(pred.scores) != len(pred.labels):
        raise InvalidArgument("prediction.scores",
                              f"{len(pred.scores)} scores for {len(pred.labels)} labels")
    accepted = {int(t) for t in truth}
    if not accepted:
        raise InvalidArgument("truth", "an image needs at least one acceptable label")
    if rule.mode == "top1":
        return bool(pred.labels) and int(pred.labels[0]) in accepted
    if rule.mode == "topk":
        return any(int(label) in accepted for label in pred.labels[: rule.k])
    assert pred.scores is not None  # threshold mode, checked above
    return any(int(label) in accepted and float(score) > rule.threshold
               for label, score in zip(pred.labels, pred.scores, strict=True))


# --------------------------------------------------------------------------------------------
# Confidence intervals (IEEE-M8)
# --------------------------------------------------------------------------------------------


def wilson_interval(successes: int, n: int, z: float = _Z95) -> tuple[float, float]:
    """Wilson score interval for ``successes`` out of ``n`` (IEEE-M8; 95 % by default).

    ``n == 0`` gives ``(0.0, 1.0)`` (nothing is known). The bounds are exactly 0.0 / 1.0 when
    ``successes`` is 0 / ``n``.
    """
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / denom
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return (lo, hi)


# --------------------------------------------------------------------------------------------
# Metrics (IEEE-M1..M7)
# --------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class AttackImageOutcome:
    """What one adversarial attack did to one image (IEEE-M3, IEEE-M6).

    ``correct`` is Adv_Result(i, j): the target is still right on the adversarial image it
    actually received. ``success`` is set by query attacks (misled within the budget Q_m);
    ``None`` for transfer attacks, where success := ``initially_correct and not correct``.
    ``queries`` comes from the proxy's ledger (``None`` for transfer attacks). An outcome with
    ``error`` counts as incorrect for Robustness_Adv and is left out of the success rate and
    query statistics (neither success nor failure is known); it is counted under ``errors``.
    An ``excluded`` outcome was left out by the plan's success criterion before the attack (a
    targeted attack's image already of the target class): its Adv_Result is its
    Clean_Result, and it is no part of the success rate or the query statistics.
    """

    image_id: str
    correct: bool
    initially_correct: bool
    success: bool | None
    queries: int | None
    error: str | None = None
    excluded: bool = False

    @property
    def attacked(self) -> bool:
        """Answered, right on the clean image and not left out: the images whose outcome the
        success rate counts (IEEE-M6)."""
        return self.error is None and bool(self.initially_correct) and not self.excluded

    @property
    def misled(self) -> bool:
        """Attacked and misled (query attacks: within the budget; transfer attacks: wrong on
        the adversarial the target received)."""
        return self.attacked and bool(self.success if self.success is not None
                                      else not self.correct)


def _rate(correct: int, m: int, value_key: str = "value") -> dict[str, Any]:
    lo, hi = wilson_interval(correct, m)
    return {value_key: correct / m if m else None, "ci95": [lo, hi], "m": m, "correct": correct}


def _null_average(definition: str) -> dict[str, Any]:
    return {"value": None, "ci95": None, "n": 0, "definition": definition}


#: Per-image results of one setting: a mapping image id -> bool, or a numpy array of M booleans
#: (or 0/1 integers) in the order of ``image_ids``.
ResultVector: TypeAlias = Mapping[str, bool] | np.ndarray


def _result_vector(results: Any, field: str, image_ids: Sequence[str],
                   known: set[str]) -> tuple[np.ndarray, list[FieldViolation]]:
    """One column of a result matrix (Clean_Result, Corr_Result(., j)) as an (M,) bool array."""
    m = len(image_ids)
    if isinstance(results, np.ndarray):
        if results.shape != (m,):
            return np.zeros(m, bool), [FieldViolation(
                field, f"an array of M = {m} results in the order of image_ids is needed, got "
                       f"shape {results.shape}")]
        if results.dtype != np.bool_:
            if not np.issubdtype(results.dtype, np.integer) or not np.isin(results, (0, 1)).all():
                return np.zeros(m, bool), [FieldViolation(
                    field, f"results must be booleans (or 0/1), got dtype {results.dtype}")]
            results = results.astype(bool)
        return results, []
    if not isinstance(results, Mapping):
        return np.zeros(m, bool), [FieldViolation(field, "must map image id -> bool")]
    violations = [FieldViolation(field, f"no result for image '{i}'")
                  for i in image_ids if i not in results]
    violations += [FieldViolation(field, f"result for image '{i}' which is not in image_ids")
                   for i in results if i not in known]
    if violations:
        return np.zeros(m, bool), violations
    return np.fromiter((bool(results[i]) for i in image_ids), dtype=bool, count=m), []


AVG_CORR_DEFINITION = ("mean over the N corruptions of Robustness_Corr(j), where "
                       "Robustness_Corr(j) is the mean over corruption j's severities "
                       "(IEEE 3129 eq. (3), IEEE-M2/M7)")
AVG_ADV_DEFINITION = "mean over the K attacks of Robustness_Adv(j) (IEEE 3129 eq. (5), IEEE-M3)"


def compute_ieee_metrics(
    *,
    clean: ResultVector,
    corruptions: Mapping[str, Mapping[int, ResultVector]],
    attacks: Mapping[str, Sequence[AttackImageOutcome]],
    attack_budgets: Mapping[str, int | None],
    image_ids: Sequence[str],
    attack_coverage: Mapping[str, Sequence[str]] | None = None,
    corruption_coverage: Mapping[str, Mapping[int, np.ndarray]] | None = None,
) -> dict[str, Any]:
    """IEEE 3129 section 4.7 metrics (IEEE-M1..M7, with IEEE-M8 intervals) from per-image
    booleans, whatever the service type (see the module docstring for the exact tree).

    The tree depends only on the result matrices, so a classification, detection or
    segmentation service gives the same tree: the service type only changes how each boolean
    was decided (IEEE-C1..C5, ``fortis.services.scoring.correctness``).

    ``clean`` is Clean_Result(i) (IEEE-M1), ``corruptions[name][severity]`` is
    Corr_Result(i, (name, severity)) (IEEE-M2, M4, M7); each is either a mapping image id ->
    bool or a numpy array of M booleans in the order of ``image_ids`` (the fast path for large
    M). ``attacks[name]`` holds one :class:`AttackImageOutcome` per image (IEEE-M3, M5, M6) and
    ``attack_budgets[name]`` is Q_m (``None`` for transfer attacks). Every image of
    ``image_ids`` must appear exactly once in every mapping, and no other image may: otherwise
    :class:`InvalidArgument` names the field (``clean``, ``corruptions.<name>.<severity>``,
    ``attacks.<name>``) and the image.

    ``attack_coverage[name]``, when given, is the subset of images attack ``name`` was run on
    (a plan may limit an expensive query attack to its first N images). Robustness_Adv(j),
    the success rate and the query statistics of that attack are then taken over its subset
    (M_j = its size, IEEE-M3 with M := M_j), and WorstCase_Robustness_Adv (IEEE-M5) over the
    images every attack covered. Images outside the subset are never counted as robust.
    ``corruption_coverage[name][severity]``, when given, is likewise the indices of the
    images a corruption setting was sent (sequential acceptance stops a setting early):
    its Robustness_Corr is over them, the worst case (IEEE-M4) over the images every
    setting covered.

    Worst case (IEEE-M4): an image counts only if it is right under *every* corruption
    setting (every corruption at every severity); ``worstcase_robustness_corr_by_severity``
    takes the product over corruptions at one severity. IEEE-M5 likewise over the attacks.
    The products are computed on a (settings x M) boolean matrix, so M = 10,000 images under
    75 settings takes milliseconds.
    """
    ids, known = _checked_image_ids(image_ids)
    m = len(ids)
    # Every input is checked before anything is computed, and all its faults reported at once.
    clean_vec, violations = _result_vector(clean, "clean", ids, known)
    corr_res, v = _corruption_results(corruptions, ids, known)
    violations += v
    att_res, covered, v = _attack_results(attacks, attack_budgets, attack_coverage, ids, known)
    violations += v
    _refuse_violations(violations)

    out: dict[str, Any] = {"m": m}
    out["accuracy"] = _rate(int(np.count_nonzero(clean_vec)), m)       # IEEE-M1
    cover = {name: {int(sev): np.asarray(idx, dtype=np.int64) for sev, idx in by.items()}
             for name, by in (corruption_coverage or {}).items()}
    out.update(_corruption_robustness(corr_res, m, cover))
    out.update(_corruption_worst_case(corr_res, m, cover))
    out.update(_attack_robustness(att_res, covered, ids, clean_vec, attack_budgets, m))
    out["worstcase_robustness_adv"] = _attack_worst_case(att_res, ids, m)
    return out


def _checked_image_ids(image_ids: Sequence[str]) -> tuple[list[str], set[str]]:
    """The M image ids as strings, and as a set; InvalidArgument when none or repeated."""
    ids = [str(i) for i in image_ids]
    if not ids:
        raise InvalidArgument("image_ids", "at least one image is needed (M >= 1)")
    known = set(ids)
    if len(known) != len(ids):
        dup = sorted(i for i, c in Counter(ids).items() if c > 1)
        raise InvalidArgument("image_ids", f"duplicate image ids: {', '.join(dup[:10])}")
    return ids, known


def _corruption_results(corruptions: Mapping[str, Mapping[int, ResultVector]],
                        ids: list[str], known: set[str]
                        ) -> tuple[dict[str, dict[int, np.ndarray]], list[FieldViolation]]:
    """Corr_Result(i, (name, severity)) as one boolean vector per setting, and what is wrong
    with the input (a corruption without severities, a severity not an integer or twice)."""
    violations: list[FieldViolation] = []
    corr_res: dict[str, dict[int, np.ndarray]] = {}
    for name, by_sev in corruptions.items():
        field = f"corruptions.{name}"
        if not isinstance(by_sev, Mapping) or not by_sev:
            violations.append(FieldViolation(field, "needs at least one severity"))
            continue
        corr_res[name] = {}
        for sev, results in by_sev.items():
            try:
                s = int(sev)
                if isinstance(sev, bool) or str(s) != str(sev).strip():
                    raise ValueError
            except (TypeError, ValueError):
                violations.append(FieldViolation(f"{field}.{sev}", "severity must be an integer"))
                continue
            if s in corr_res[name]:
                violations.append(FieldViolation(f"{field}.{s}", "severity given twice"))
                continue
            corr_res[name][s], v = _result_vector(results, f"{field}.{s}", ids, known)
            violations += v
    return corr_res, violations


def _attack_results(attacks: Mapping[str, Sequence[AttackImageOutcome]],
                    attack_budgets: Mapping[str, int | None],
                    attack_coverage: Mapping[str, Sequence[str]] | None,
                    ids: list[str], known: set[str]
                    ) -> tuple[dict[str, dict[str, AttackImageOutcome]], dict[str, list[str]],
                               list[FieldViolation]]:
    """Each attack's outcomes by image id and the images it covered, and what is wrong with
    the input (an image missing, repeated, unknown or outside the coverage; a bad budget)."""
    violations: list[FieldViolation] = []
    att_res: dict[str, dict[str, AttackImageOutcome]] = {}
    covered: dict[str, list[str]] = {}
    for name, outcomes in attacks.items():
        field = f"attacks.{name}"
        by_id: dict[str, AttackImageOutcome] = {}
        for o in outcomes:
            if not isinstance(o, AttackImageOutcome):
                violations.append(FieldViolation(field, "entries must be AttackImageOutcome"))
                break
            if o.image_id in by_id:
                violations.append(FieldViolation(field, f"image '{o.image_id}' given twice"))
            elif o.image_id not in known:
                violations.append(FieldViolation(
                    field, f"result for image '{o.image_id}' which is not in image_ids"))
            by_id[o.image_id] = o
        cover = ids
        if attack_coverage is not None and attack_coverage.get(name) is not None:
            cover = [str(i) for i in attack_coverage[name]]
            bad = [i for i in cover if i not in known]
            if not cover:
                violations.append(FieldViolation(f"attack_coverage.{name}", "must list at least one image"))
            elif bad:
                violations.append(FieldViolation(f"attack_coverage.{name}",
                                                 f"image '{bad[0]}' is not in image_ids"))
            cover_set = set(cover)
            violations += [FieldViolation(field, f"result for image '{i}' which the attack did not cover")
                           for i in by_id if i not in cover_set and i in known]
        violations += [FieldViolation(field, f"no result for image '{i}'")
                       for i in cover if i not in by_id]
        covered[name] = cover
        budget = attack_budgets.get(name)
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)
                                   or budget < 1):
            violations.append(FieldViolation(f"attack_budgets.{name}",
                                             f"must be a positive integer or null; got {budget!r}"))
        att_res[name] = by_id
    return att_res, covered, violations


def _refuse_violations(violations: list[FieldViolation]) -> None:
    """InvalidArgument listing the first ``_MAX_LISTED`` faults (and how many more)."""
    if violations:
        more = len(violations) - _MAX_LISTED
        listed = violations[:_MAX_LISTED]
        if more > 0:
            listed.append(FieldViolation(listed[-1].field, f"... and {more} more"))
        raise InvalidArgument.from_violations(listed)


def _covered(cover: Mapping[str, Mapping[int, np.ndarray]], name: str, sev: int,
             m: int) -> np.ndarray | None:
    idx = cover.get(name, {}).get(sev)
    return None if idx is None or idx.size >= m else idx


def _corruption_robustness(corr_res: Mapping[str, Mapping[int, np.ndarray]], m: int,
                           cover: Mapping[str, Mapping[int, np.ndarray]]) -> dict[str, Any]:
    """IEEE-M2 and M7: Robustness_Corr per setting and per corruption, their average over
    the corruptions, and that average at each severity."""
    corr_tree: dict[str, Any] = {}
    per_corruption_mean: list[float] = []
    by_severity_values: dict[int, list[float]] = {}
    for name, by_sev in corr_res.items():
        node: dict[str, Any] = {}
        sev_values: list[float] = []
        for s in sorted(by_sev):
            idx = _covered(cover, name, s, m)
            node[str(s)] = _rate(int(np.count_nonzero(by_sev[s])), m if idx is None
                                 else int(idx.size), "robustness")
            sev_values.append(node[str(s)]["robustness"])
            by_severity_values.setdefault(s, []).append(node[str(s)]["robustness"])
        mean = statistics.fmean(sev_values)
        node["mean"] = {"robustness": mean, "ci95": None, "severities": sorted(by_sev)}
        per_corruption_mean.append(mean)
        corr_tree[name] = node
    out: dict[str, Any] = {"corruptions": corr_tree}
    if per_corruption_mean:
        out["average_robustness_corr"] = {
            "value": statistics.fmean(per_corruption_mean), "ci95": None,
            "n": len(per_corruption_mean), "m": m, "definition": AVG_CORR_DEFINITION}
    else:
        out["average_robustness_corr"] = _null_average(AVG_CORR_DEFINITION)
    out["average_robustness_corr_by_severity"] = {
        str(s): {"value": statistics.fmean(vals), "ci95": None, "n": len(vals)}
        for s, vals in sorted(by_severity_values.items())}
    return out


def _corruption_worst_case(corr_res: Mapping[str, Mapping[int, np.ndarray]], m: int,
                           cover: Mapping[str, Mapping[int, np.ndarray]]) -> dict[str, Any]:
    """IEEE-M4: prod_j Corr_Result(i, j) over a (settings x M) matrix, over every setting and
    over the corruptions at each severity; over the images every setting covered."""
    out: dict[str, Any] = {}
    settings = [(name, s) for name, by_sev in corr_res.items() for s in sorted(by_sev)]

    def common(keys: Sequence[tuple[str, int]]) -> np.ndarray:
        mask = np.ones(m, dtype=bool)
        for n, s in keys:
            idx = _covered(cover, n, s, m)
            if idx is not None:
                sub = np.zeros(m, dtype=bool)
                sub[idx] = True
                mask &= sub
        return mask

    if settings:
        mask = common(settings)
        every = np.logical_and.reduce(np.stack([corr_res[n][s] for n, s in settings]), axis=0)
        out["worstcase_robustness_corr"] = {
            **_rate(int(np.count_nonzero(every & mask)), int(mask.sum())),
            "n_settings": len(settings)}
    else:
        out["worstcase_robustness_corr"] = {"value": None, "ci95": None, "m": m,
                                            "correct": None, "n_settings": 0}
    by_sev_worst: dict[str, Any] = {}
    for s in sorted({s for by_sev in corr_res.values() for s in by_sev}):
        at_s = [n for n, by_sev in corr_res.items() if s in by_sev]
        mask = common([(n, s) for n in at_s])
        every = np.logical_and.reduce(np.stack([corr_res[n][s] for n in at_s]), axis=0)
        by_sev_worst[str(s)] = {**_rate(int(np.count_nonzero(every & mask)), int(mask.sum())),
                                "n_settings": len(at_s)}
    out["worstcase_robustness_corr_by_severity"] = by_sev_worst
    return out


def _attack_robustness(att_res: Mapping[str, Mapping[str, AttackImageOutcome]],
                       covered: Mapping[str, list[str]], ids: list[str], clean_vec: np.ndarray,
                       attack_budgets: Mapping[str, int | None], m: int) -> dict[str, Any]:
    """IEEE-M3 and M6: each attack's Robustness_Adv, success rate and query statistics over
    the images it covered, and the average over the attacks."""
    att_tree: dict[str, Any] = {}
    clean_by_id = dict(zip(ids, clean_vec.tolist(), strict=True)) if att_res else {}
    for name, by_id in att_res.items():
        att_tree[name] = _attack_metrics(by_id, covered[name], clean_by_id,
                                         attack_budgets.get(name))
    out: dict[str, Any] = {"attacks": att_tree}
    if att_tree:
        sizes = {len(c) for c in covered.values()}
        out["average_robustness_adv"] = {
            "value": statistics.fmean(a["robustness_adv"] for a in att_tree.values()),
            "ci95": None, "n": len(att_tree), "m": m if sizes == {m} else None,
            "m_per_attack": {name: len(c) for name, c in covered.items()},
            "definition": AVG_ADV_DEFINITION}
    else:
        out["average_robustness_adv"] = _null_average(AVG_ADV_DEFINITION)
    return out


def _attack_worst_case(att_res: Mapping[str, Mapping[str, AttackImageOutcome]],
                       ids: list[str], m: int) -> dict[str, Any]:
    """IEEE-M5: the images robust to every attack, over the images every attack covered."""
    if att_res:
        common = [i for i in ids if all(i in by_id for by_id in att_res.values())]
        correct = sum(all(_adv_result(by_id[i]) for by_id in att_res.values()) for i in common)
        node = _rate(correct, len(common)) if common else {
            "value": None, "ci95": None, "m": 0, "correct": None}
        return {**node, "n_settings": len(att_res), "over": "images covered by every attack"}
    return {"value": None, "ci95": None, "m": m, "correct": None, "n_settings": 0}


def compute_classification_metrics(
    *,
    clean: ResultVector,
    corruptions: Mapping[str, Mapping[int, ResultVector]],
    attacks: Mapping[str, Sequence[AttackImageOutcome]],
    attack_budgets: Mapping[str, int | None],
    image_ids: Sequence[str],
    attack_coverage: Mapping[str, Sequence[str]] | None = None,
    corruption_coverage: Mapping[str, Mapping[int, np.ndarray]] | None = None,
) -> dict[str, Any]:
    """IEEE 3129 section 4.7 metrics for a classification service: the task-independent
    :func:`compute_ieee_metrics` under its original name (same arguments, same tree)."""
    return compute_ieee_metrics(clean=clean, corruptions=corruptions, attacks=attacks,
                                attack_budgets=attack_budgets, image_ids=image_ids,
                                attack_coverage=attack_coverage)


def _adv_result(o: AttackImageOutcome) -> bool:
    """Adv_Result(i, j): a failed query counts as incorrect."""
    return bool(o.correct) and o.error is None


def _attack_metrics(by_id: Mapping[str, AttackImageOutcome], ids: Sequence[str],
                    clean: Mapping[str, bool], budget: int | None) -> dict[str, Any]:
    outcomes = [by_id[i] for i in ids]
    is_query = any(o.queries is not None or o.success is not None for o in outcomes)
    correct = sum(_adv_result(o) for o in outcomes)
    node = _rate(correct, len(ids), "robustness_adv")
    node["kind"] = "query" if is_query else "transfer"

    ok = [o for o in outcomes if o.error is None]
    attacked = [o for o in ok if o.attacked]
    successes = [o for o in attacked if o.misled]
    n0 = len(attacked)
    node["success_rate"] = len(successes) / n0 if n0 else None
    node["success_rate_ci95"] = list(wilson_interval(len(successes), n0)) if n0 else None
    node["success_rate_n"] = n0
    node["successes"] = len(successes)

    queries = [o.queries for o in attacked if o.queries is not None]
    succ_queries = [o.queries for o in successes if o.queries is not None]
    node["mean_queries"] = statistics.fmean(queries) if queries else None
    node["median_queries"] = float(statistics.median(queries)) if queries else None
    node["mean_queries_successful"] = statistics.fmean(succ_queries) if succ_queries else None
    node["query_budget"] = budget
    errored = [o.image_id for o in outcomes if o.error is not None]
    node["errors"] = len(errored)
    node["error_images"] = errored[:_MAX_LISTED]
    # The attack's own clean check should agree with Clean_Result(i); count disagreements
    # (a non-deterministic target or a different encoding would show up here).
    node["clean_mismatches"] = sum(
        1 for o in ok if bool(o.initially_correct) != bool(clean[o.image_id]))
    node["excluded"] = sum(1 for o in outcomes if o.excluded)
    return node
