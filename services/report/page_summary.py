"""The report page's summary: the verdict on the plan's acceptance criteria and the key
figures with their 95 % intervals (IEEE-M8). Pure code, no gRPC."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from fortis.services.report.page_values import (
    as_list,
    as_map,
    is_interval,
    is_number,
    num,
    pct,
    pct_short,
    sig,
)

# --------------------------------------------------------------------------------------------
# summary: verdict, key figures, call-outs
# --------------------------------------------------------------------------------------------

#: How the confidence of a criterion's outcome reads (IEEE-M8).
_CONFIDENCE: Final = {"conclusive": "conclusive", "inconclusive": "inconclusive",
                      "no_ci": "no CI", "None": "no CI"}
#: Attack metrics judged as counts (queries), not as rates, in an acceptance criterion.
_COUNT_METRICS: Final = ("mean_queries", "median_queries")


def _criterion_row(c: Mapping[str, Any]) -> dict[str, Any]:
    metric = str(c.get("metric") or "")
    is_rate = metric.rsplit(".", 1)[-1] not in _COUNT_METRICS
    fmt = pct if is_rate else (lambda v: num(v, 1))
    ci: Any = c.get("ci95")
    return {"metric": metric,
            "requirement": f"{c.get('op') or '?'} " + (pct_short(c.get("threshold")) if is_rate
                                                      else sig(c.get("threshold"))),
            "value": fmt(c.get("value")),
            "ci": (f"[{fmt(ci[0])}, {fmt(ci[1])}]" if is_interval(ci) else "n/a"),
            "outcome": str(c.get("outcome") or "missing"),
            "confidence": _CONFIDENCE.get(str(c.get("confidence")), str(c.get("confidence"))),
            "text": c.get("text")}


def verdict_section(verdict: Any) -> dict[str, Any]:
    """The verdict banner: pass / fail / pass but inconclusive / no criteria (neutral)."""
    v = as_map(verdict)
    rows = [_criterion_row(c) for c in as_list(v.get("criteria")) if isinstance(c, Mapping)]
    status = v.get("status")
    if status not in ("pass", "fail", "incomplete") or not rows:
        return {"cls": "none", "word": "NO CRITERIA",
                "headline": "No acceptance criteria in the plan",
                "detail": "The plan declares no acceptance criteria, so there is no pass/fail "
                          "verdict; the key figures below are the results.",
                "rows": rows}
    failed = [r for r in rows if r["outcome"] == "fail"]
    missing = [r for r in rows if r["outcome"] == "missing"]
    unsure = [r for r in rows if r["confidence"] == "inconclusive"]
    n = len(rows)
    if status == "fail" or v.get("passed") is False or failed or missing:
        bad = failed + missing
        names = ", ".join(r["metric"] for r in bad[:4]) + (" ..." if len(bad) > 4 else "")
        how = "failed" if not missing else "not met (" + ", ".join(
            ([f"{len(failed)} failed"] if failed else []) + [f"{len(missing)} not measured"]) + ")"
        shaky = [r for r in unsure if r["outcome"] == "pass"]
        return {"cls": "fail", "word": "FAIL",
                "headline": f"{len(bad)} of {n} acceptance criteria {how}: {names}",
                "detail": "Pass/fail is decided on the measured value; the 95% interval says "
                          "whether that is conclusive (IEEE-M8)."
                          + (f" {len(shaky)} passing "
                             f"{'criterion is' if len(shaky) == 1 else 'criteria are'} "
                             "inconclusive." if shaky else ""), "rows": rows}
    unrun = [r for r in rows if r["outcome"] == "not_evaluated"]
    if unrun:
        names = ", ".join(r["metric"] for r in unrun[:4]) + (" ..." if len(unrun) > 4 else "")
        return {"cls": "warn", "word": "INCOMPLETE",
                "headline": f"{n - len(unrun)} of {n} acceptance criteria met; {len(unrun)} "
                            f"not evaluated because a setting failed to run: {names}",
                "detail": "The failed settings are listed with their errors below; a strict "
                          "gate counts criteria that were not evaluated as failed.",
                "rows": rows}
    if v.get("strict_passed") is False or unsure:
        return {"cls": "warn", "word": "PASS, INCONCLUSIVE",
                "headline": f"All {n} acceptance criteria met on the measured value; "
                            f"{len(unsure)} inconclusive (the 95% interval straddles the "
                            "threshold)",
                "detail": "More images would settle the inconclusive criteria; a strict gate "
                          "counts them as failed.", "rows": rows}
    return {"cls": "pass", "word": "PASS",
            "headline": f"All {n} acceptance criteria met",
            "detail": "Each measured value meets its threshold; where a 95% interval exists "
                      "it lies wholly on the passing side (IEEE-M8).", "rows": rows}


def _card(label: str, node: Any, note: str, ref: str) -> dict[str, Any]:
    node = as_map(node)
    return {"label": label, "value": pct(node.get("value")), "ci": node.get("ci95"),
            "note": note, "ref": ref}


def key_figures(metrics: Mapping[str, Any], accuracy: Mapping[str, Any]) -> list[Any]:
    corr = as_map(metrics.get("average_robustness_corr"))
    adv = as_map(metrics.get("average_robustness_adv"))
    wc_corr = as_map(metrics.get("worstcase_robustness_corr"))
    wc_adv = as_map(metrics.get("worstcase_robustness_adv"))
    correct, m = accuracy.get("correct"), accuracy.get("m", metrics.get("m"))
    cards = [_card("Clean accuracy", accuracy,
                   f"{num(correct)} of {num(m)} images" if is_number(correct) else
                   f"{num(m)} images", "IEEE-M1")]
    if corr.get("value") is not None or wc_corr.get("value") is not None:
        cards.append(_card("Avg robustness, corruptions", corr,
                           f"mean over {num(corr.get('n'))} corruptions", "IEEE-M2"))
        cards.append(_card("Worst case, corruptions", wc_corr,
                           f"images right under all {num(wc_corr.get('n_settings'))} settings",
                           "IEEE-M4"))
    if adv.get("value") is not None or wc_adv.get("value") is not None:
        cards.append(_card("Avg robustness, attacks", adv,
                           f"mean over {num(adv.get('n'))} attacks", "IEEE-M3"))
        cards.append(_card("Worst case, attacks", wc_adv,
                           f"images right under all {num(wc_adv.get('n_settings'))} attacks",
                           "IEEE-M5"))
    return cards


def sequential_section(seq: Any) -> dict[str, Any] | None:
    """Sequential acceptance under the verdict: each criterion's stopping point and its
    time-uniform interval, and the settings grouped by how many images they were sent."""
    sq = as_map(seq)
    if not sq:
        return None
    crit = []
    for c in as_list(sq.get("criteria")):
        c = as_map(c)
        iv = c.get("interval")
        crit.append({"metric": c.get("metric"), "rule": f"{c.get('op')} {c.get('threshold')}",
                     "outcome": c.get("outcome"), "images": num(c.get("images")),
                     "population": num(c.get("population")),
                     "interval": f"[{sig(iv[0], 3)}, {sig(iv[1], 3)}]" if is_interval(iv)
                     else "n/a"})
    groups: dict[tuple[str, Any, Any], list[Mapping[str, Any]]] = {}
    for r in as_list(sq.get("settings")):
        r = as_map(r)
        groups.setdefault((str(r.get("status")), r.get("images_used"),
                           r.get("images_planned")), []).append(r)
    words = {"open": "stopped once its criteria were decided", "full": "every image",
             "skip": "skipped (no criterion reads it)"}
    rows = []
    for (status, used, planned), rs in groups.items():
        names = [str(r.get("setting")) for r in rs]
        rows.append({"settings": ", ".join(names[:6]) + (f" and {len(names) - 6} more"
                                                         if len(names) > 6 else ""),
                     "status": words.get(status, status),
                     "images": f"{num(used)} / {num(planned)}",
                     "queries": num(sum(int(r.get("queries_used") or 0) for r in rs)),
                     "saved": num(sum(int(r.get("queries_saved_estimate") or 0) for r in rs))})
    return {"saved": num(sq.get("queries_saved_estimate")), "criteria": crit, "rows": rows,
            "explain": "The images were sent in a seeded random order and each setting stopped "
                       "as soon as every acceptance criterion reading it was decided by an "
                       "anytime-valid confidence sequence (" + str(sq.get("method") or "") +
                       f"; alpha {sq.get('alpha')}): its interval covers with 95% at the "
                       "stopping time (IEEE-M8), where a Wilson interval on the images seen "
                       "would not. A query attack's queries not sent are estimated from the "
                       "mean per image it was sent."}
