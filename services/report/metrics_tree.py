"""``report.json``'s ``metrics`` tree from the typed ``ScoreEvaluationResponse``.

The tree keeps the shape reports always had (severity keys and failure-point thresholds are
strings so it survives a JSON round trip)::

    m                                     M, the number of clean images
    accuracy                              {value, ci95, m, correct}                   IEEE-M1
    corruptions.<name>.<severity>         {robustness, ci95, m, correct}              IEEE-M2, M7
    corruptions.<name>.mean               {robustness, ci95: null, severities}
    average_robustness_corr               {value, ci95: null, n, m, definition}       IEEE-M2
    average_robustness_corr_by_severity   {"<s>": {value, ci95: null, n}}             IEEE-M7
    worstcase_robustness_corr             {value, ci95, m, correct, n_settings}       IEEE-M4
    worstcase_robustness_corr_by_severity {"<s>": {value, ci95, m, correct, n_settings}}
    attacks.<name>                        {robustness_adv, ci95, m, correct, kind, success_rate,
                                           success_rate_ci95, success_rate_n, successes,
                                           mean_queries, median_queries,
                                           mean_queries_successful, query_budget, errors,
                                           error_images, clean_mismatches, mean_linf,
                                           max_linf, mean_l2, mean_l2_successful,
                                           median_l2_successful, success_by_queries,
                                           fooling_rate, fooling_threshold,
                                           never_fooled, excluded, excluded_reason,
                                           unsuccessful_mean_l2,
                                           unsuccessful_max_linf}            IEEE-M3, M6, PER-4
    average_robustness_adv                {value, ci95: null, n, m, definition, m_per_attack}
    worstcase_robustness_adv              {value, ci95, m, correct, n_settings, over}  IEEE-M5
    ranking                               {applicable, reason?, gamma_b, gamma_a, drr_k,
                                           settings: {name: {kind, m, ndcg_1, ndcg_at,
                                           drr_5, drr_n, applicable}}}                RANK-1..3
    degradation.<operator>                {m, m_used, levels, thresholds, applicable, reason,
                                           definitions, accuracy, rank, probability, changes,
                                           failure_points}                            DEG-2..4
    query_errors                          {total, settings: {name: {errors, of,
                                           examples: [{image_id, error}]}}}

Every rate's interval is ``[low, high]`` or ``null``; averages carry no interval on purpose
(IEEE-M8). An attack's ``success_by_queries`` is ``[[queries, success rate], ...]`` (query
attacks: the share of the images attacked misled within that many queries, from the ledger's
per-image counts; the last point is the success rate at the budget Q_m); ``mean_linf``,
``max_linf`` and ``mean_l2`` are the sizes of the successful adversarials (IEEE-M6, PER-3),
``unsuccessful_*`` those of the attacked images not misled; ``excluded`` images (with the
reason) were left out by the plan's criterion before the attack; ``fooling_rate`` at
``fooling_threshold`` (L2, [0, 1] scale) and ``never_fooled`` are PER-4 over the images
attacked; each ``null`` where not applicable (transfer attacks, no L2 sizes, nothing
attacked). Pure domain code (no gRPC).
"""

from __future__ import annotations

from typing import Any, Final

from fortis.scoring.v1 import scoring_pb2
from fortis.services.common.errors import InvalidArgument
from fortis.services.report import prose
from fortis.services.report.values import enum_text, finite, optional

__all__ = ["metrics_tree"]

_SETTING_KINDS: Final = {
    scoring_pb2.SETTING_KIND_CLEAN: "clean",
    scoring_pb2.SETTING_KIND_CORRUPTION: "corruption",
    scoring_pb2.SETTING_KIND_TRANSFER_ATTACK: "attack",
    scoring_pb2.SETTING_KIND_QUERY_ATTACK: "attack",
    scoring_pb2.SETTING_KIND_DEGRADATION: "degradation",
}


def _interval(msg: Any, path: str, low: str = "ci95_low", high: str = "ci95_high") -> Any:
    """``[low, high]`` when both ends are set, ``None`` when neither is; half an interval is
    a malformed request."""
    has_low, has_high = msg.HasField(low), msg.HasField(high)
    if has_low != has_high:
        missing = high if has_low else low
        raise InvalidArgument(f"{path}.{missing}", f"{low} and {high} come together")
    if not has_low:
        return None
    return [finite(getattr(msg, low)), finite(getattr(msg, high))]


def _rate(r: scoring_pb2.Rate, path: str, value_key: str = "value") -> dict[str, Any]:
    return {value_key: optional(r, "value"), "ci95": _interval(r, path), "m": r.m,
            "correct": optional(r, "correct")}


def _average(a: scoring_pb2.Average) -> dict[str, Any]:
    return {"value": optional(a, "value"), "ci95": None, "n": a.n, "m": optional(a, "m"),
            "definition": a.definition}


def _worst_case(w: scoring_pb2.WorstCase, path: str) -> dict[str, Any]:
    out = {**_rate(w.rate, f"{path}.rate"), "n_settings": w.n_settings}
    if w.over:
        out["over"] = w.over
    return out


def _corruptions(ieee: scoring_pb2.IeeeMetrics, path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for j, c in enumerate(ieee.corruptions):
        cpath = f"{path}.corruptions[{j}]"
        if not c.name:
            raise InvalidArgument(f"{cpath}.name", "each corruption needs a name")
        node: dict[str, Any] = {}
        for k, s in enumerate(c.severities):
            node[str(s.severity)] = _rate(s.robustness, f"{cpath}.severities[{k}].robustness",
                                          "robustness")
        node["mean"] = {"robustness": finite(c.mean_robustness), "ci95": None,
                        "severities": [s.severity for s in c.severities]}
        out[c.name] = node
    return out


def _attack(a: scoring_pb2.AttackMetrics, path: str) -> dict[str, Any]:
    success = a.success
    return {
        **_rate(a.robustness_adv, f"{path}.robustness_adv", "robustness_adv"),
        "kind": enum_text(a, "kind"),
        "success_rate": optional(success, "value"),
        "success_rate_ci95": _interval(success, f"{path}.success"),
        "success_rate_n": success.m, "successes": optional(success, "correct"),
        **{key: optional(a, key) for key in (
            "mean_queries", "median_queries", "mean_queries_successful", "query_budget",
            "mean_linf", "max_linf", "mean_l2", "mean_l2_successful", "median_l2_successful")},
        "errors": a.errors, "error_images": list(a.error_images),
        "clean_mismatches": a.clean_mismatches,
        "success_by_queries": _curve(a, path),
        **{key: optional(a, key) for key in ("fooling_rate", "fooling_threshold",
                                             "never_fooled", "unsuccessful_mean_l2",
                                             "unsuccessful_max_linf")},
        "excluded": a.excluded, "excluded_reason": a.excluded_reason,
    }


def _curve(a: scoring_pb2.AttackMetrics, path: str) -> list[list[float]] | None:
    """``[[queries, rate], ...]`` in increasing queries, rates in [0, 1]; None when empty."""
    out: list[list[float]] = []
    for k, p in enumerate(a.success_by_queries):
        rate = finite(p.success_rate)
        if p.queries < 0 or rate is None or not 0.0 <= rate <= 1.0 or \
                (out and p.queries <= out[-1][0]):
            raise InvalidArgument(f"{path}.success_by_queries[{k}]",
                                  "points need queries >= 0 in increasing order and a success "
                                  f"rate in [0, 1]; got ({p.queries}, {p.success_rate})")
        out.append([p.queries, rate])
    return out or None


def _ieee(ieee: scoring_pb2.IeeeMetrics) -> dict[str, Any]:
    path = "parts.metrics.ieee"
    attacks: dict[str, Any] = {}
    for j, a in enumerate(ieee.attacks):
        if not a.name:
            raise InvalidArgument(f"{path}.attacks[{j}].name", "each attack needs a name")
        attacks[a.name] = _attack(a, f"{path}.attacks[{j}]")
    avg_adv = _average(ieee.average_robustness_adv)
    if ieee.m_per_attack:
        avg_adv["m_per_attack"] = dict(ieee.m_per_attack)
    return {
        "m": ieee.m,
        "accuracy": _rate(ieee.accuracy, f"{path}.accuracy"),
        "corruptions": _corruptions(ieee, path),
        "average_robustness_corr": _average(ieee.average_robustness_corr),
        "average_robustness_corr_by_severity": {
            str(s.severity): {"value": optional(s.average, "value"), "ci95": None,
                              "n": s.average.n} for s in ieee.by_severity},
        "worstcase_robustness_corr": _worst_case(ieee.worstcase_robustness_corr,
                                                 f"{path}.worstcase_robustness_corr"),
        "worstcase_robustness_corr_by_severity": {
            str(s.severity): {**_rate(s.worst_case, f"{path}.by_severity[{k}].worst_case"),
                              "n_settings": s.n_settings}
            for k, s in enumerate(ieee.by_severity)},
        "attacks": attacks,
        "average_robustness_adv": avg_adv,
        "worstcase_robustness_adv": _worst_case(ieee.worstcase_robustness_adv,
                                                f"{path}.worstcase_robustness_adv"),
    }


def _ranking(r: scoring_pb2.Ranking) -> dict[str, Any]:
    if not r.applicable:
        return {"applicable": False, "reason": r.reason or None, "settings": {}}
    k = r.drr_k or 5
    settings = {s.name: {"kind": _SETTING_KINDS.get(s.kind), "m": s.m,
                         "ndcg_1": optional(s, "ndcg_1"),
                         "ndcg_at": [finite(v) for v in s.ndcg_at],
                         f"drr_{k}": optional(s, "drr"), "drr_n": s.drr_n,
                         "applicable": s.applicable} for s in r.settings}
    return {"applicable": True, "gamma_b": r.gamma_b, "gamma_a": r.gamma_a, "drr_k": k,
            "settings": settings}


def _profile(d: scoring_pb2.DegradationProfile, path: str) -> dict[str, Any]:
    accuracy = [{"level": p.level, "value": optional(p, "value"),
                 "ci95": _interval(p, f"{path}.accuracy[{k}]"), "m": p.n,
                 "correct": optional(p, "correct")} for k, p in enumerate(d.accuracy)]
    rank = [{"level": p.level, "value": optional(p, "value"), "at_least": optional(p, "at_least"),
             "censored": p.censored, "n": p.n, "reason": p.reason or None} for p in d.rank]
    probability = [{"level": p.level, "value": optional(p, "value"), "n": p.n,
                    "missing": p.missing, "reason": p.reason or None} for p in d.probability]
    changes = {lv: {"fraction_of_pixels_changed": finite(v)}
               for lv, v in sorted(d.fraction_of_pixels_changed.items())}
    failure_points: dict[str, Any] = {}
    for fp in d.failure_points:
        change = ({"fraction_of_pixels_changed": optional(fp, "fraction_of_pixels_changed")}
                  if fp.HasField("fraction_of_pixels_changed") else changes.get(fp.level))
        failure_points[str(fp.threshold)] = None if not fp.reached else {
            "threshold": fp.threshold, "level": fp.level, "accuracy": finite(fp.accuracy),
            "ci95": [finite(fp.ci95_low), finite(fp.ci95_high)], "change": change,
            "example_image": fp.example_image or None}
    return {
        "m": d.m, "m_used": d.m_used, "applicable": d.applicable, "reason": d.reason or None,
        "levels": [p.level for p in d.accuracy],
        "thresholds": [fp.threshold for fp in d.failure_points],
        "definitions": dict(prose.DEGRADATION_DEFINITIONS),
        "accuracy": accuracy, "rank": rank, "probability": probability,
        "changes": [{"level": lv, "change": c} for lv, c in changes.items()],
        "failure_points": failure_points,
    }


def _query_errors(q: scoring_pb2.QueryErrors) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for s in q.settings:
        examples = []
        for text in s.examples:
            image_id, sep, error = text.partition(": ")
            examples.append({"image_id": image_id, "error": error} if sep
                            else {"image_id": None, "error": text})
        settings[s.name] = {"errors": s.errors, "of": s.of, "examples": examples}
    return {"total": q.total, "settings": settings}


def metrics_tree(metrics: scoring_pb2.ScoreEvaluationResponse) -> dict[str, Any]:
    """The report's metric tree (module docstring) of one scored evaluation."""
    if not metrics.HasField("ieee"):
        raise InvalidArgument("parts.metrics.ieee", "the IEEE 3129 metrics are required")
    tree = _ieee(metrics.ieee)
    tree["ranking"] = (_ranking(metrics.ranking) if metrics.HasField("ranking") else
                       {"applicable": False, "reason": "no ranking metrics were computed",
                        "settings": {}})
    if metrics.degradation:
        tree["degradation"] = {}
        for j, d in enumerate(metrics.degradation):
            if not d.name:
                raise InvalidArgument(f"parts.metrics.degradation[{j}].name",
                                      "each degradation profile needs an operator name")
            tree["degradation"][d.name] = _profile(d, f"parts.metrics.degradation[{j}]")
    tree["query_errors"] = _query_errors(metrics.query_errors)
    return tree
