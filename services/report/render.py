"""``report.html``: one self-contained page from the report document, by Jinja2 templates.

The page is IEEE-P4's human-readable report, laid out for a QA lead who reads it in a minute:
the verdict against the plan's acceptance criteria, the key figures with their 95 % intervals
(IEEE-M8), the worst corruption and the most effective attack come first (in the first
screen); then the results (corruptions, attacks, CANARY metrics, benchmark across models,
degradation, ranking), each with its figures and example images, tables sorted worst first;
the test definitions (collapsed), the target and roles, the plan and how to repeat it last.

Inline CSS (with a print stylesheet), figures as ``data:`` images (:mod:`.figures`,
matplotlib SVG), no scripts, no external resources, and a Content-Security-Policy that
forbids loading any. The templates (``templates/*.html.j2``, shipped in the package and
loaded with ``PackageLoader``) are rendered with autoescaping on, so every name, plan line or
error text from the caller is text, never markup; example images are accepted only as
base64 ``data:image/...`` URIs. This module shapes the document into rows, cards and figures
the templates draw. :func:`write_report` writes ``report.json`` and ``report.html``
atomically. Pure domain code (no gRPC).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypeGuard

import jinja2
from fortis.services.report import annotate, figures

__all__ = ["render_html", "report_json", "write_report"]

#: Table of contents, in page order: (anchor, label). Only the sections a report renders are
#: listed, so no entry links to a missing anchor.
_SECTIONS: Final = (("summary", "Summary"), ("corruptions", "Corruptions"),
                    ("attacks", "Attacks"), ("canary", "CANARY"),
                    ("benchmark", "Benchmark"), ("degradation", "Degradation"),
                    ("worst-case", "Worst case"), ("ranking", "Ranking"),
                    ("query-errors", "Failed queries"), ("tests", "Tests"),
                    ("target", "Target"), ("ledger", "Ledger"),
                    ("environment", "Environment"), ("plan", "Plan"), ("repeat", "Repeat"))

#: Example images accepted on the page: base64 data URIs of raster images only.
_DATA_URI: Final = re.compile(r"data:image/(?:png|jpeg|gif|webp);base64,[A-Za-z0-9+/]+={0,2}")
_MAX_URI_CHARS: Final = 8 << 20
#: Bounds that keep the page readable and fast to render.
_MAX_ATTACK_EXAMPLES: Final = 3
_MAX_NDCG_LINES: Final = 10
_MAX_HEATMAPS: Final = 12
_MAX_PROFILE_FIGURES: Final = 20
_NDCG_TABLE_ROWS: Final = 10

# --------------------------------------------------------------------------------------------
# filters: how a value reads on the page (None -> "n/a", rates as percentages)
# --------------------------------------------------------------------------------------------


def _txt(value: Any) -> str:
    """Any value as text; ``None`` becomes ``n/a``, floats six significant digits."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list | tuple):
        return ", ".join(_txt(v) for v in value) if value else "none"
    return str(value)


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _pct(value: Any) -> str:
    return f"{100.0 * value:.2f}%" if _is_number(value) else "n/a"


def _pct_short(value: Any) -> str:
    """A rate as a short percentage (a threshold: ``0.3`` -> ``30%``)."""
    return f"{100.0 * value:.4g}%" if _is_number(value) else "n/a"


def _ci(ci: Any) -> str:
    if not _is_interval(ci):
        return "n/a"
    return f"[{_pct(ci[0])}, {_pct(ci[1])}]"


def _is_interval(ci: Any) -> bool:
    return (isinstance(ci, Sequence) and not isinstance(ci, str) and len(ci) == 2
            and all(_is_number(v) for v in ci))


def _num(value: Any, digits: int = 1) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _txt(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}f}" if math.isfinite(value) else "n/a"


def _sig(value: Any, digits: int = 4) -> str:
    """A measurement with ``digits`` significant digits."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _txt(value)
    return f"{value:.{digits}g}" if math.isfinite(value) else "n/a"


def _party(value: Any) -> Any:
    """A role as 'name (organisation)' when it is a {name, organisation} record."""
    if isinstance(value, Mapping):
        name = value.get("name") or ""
        org = value.get("organisation") or value.get("organization") or ""
        if name or org:
            return f"{name} ({org})" if name and org else (name or org)
        return None
    return value


def _json_text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _nested_list(value: Any) -> bool:
    """A list shown as an ordered list (it holds mappings or lists), not as one line."""
    return isinstance(value, list | tuple) and any(isinstance(v, Mapping | list | tuple)
                                                   for v in value)


def _shade(value: Any) -> str:
    """A CSS class that tints a robustness cell: h0 (below 20 %) .. h4 (80 % and above)."""
    if not _is_number(value):
        return "na"
    return f"h{max(0, min(4, int(value * 5)))}"


@functools.cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("fortis.services.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(txt=_txt, pct=_pct, pct_short=_pct_short, ci=_ci, num=_num, sig=_sig,
                       party=_party, json_text=_json_text, shade=_shade)
    env.tests["nested_list"] = _nested_list
    env.tests["interval"] = _is_interval
    return env


# --------------------------------------------------------------------------------------------
# small readers
# --------------------------------------------------------------------------------------------


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _value(node: Any, key: str = "value") -> Any:
    """``node[key]`` when ``node`` is a mapping, else ``node`` itself (a plain number)."""
    return node.get(key) if isinstance(node, Mapping) else node


def _int_key(key: Any) -> int | None:
    try:
        return int(str(key))
    except ValueError:
        return None


def _level_sorted(keys: Any) -> list[str]:
    """Level / severity keys in numeric order (1, 2, ... 10), non-numeric ones last."""
    keys = [str(k) for k in keys]
    return sorted(keys, key=lambda k: (_int_key(k) is None, _int_key(k) or 0, k))


def _image(src: Any) -> str | None:
    """``src`` when it is a base64 data URI of a raster image, else None (never a URL)."""
    if isinstance(src, str) and len(src) <= _MAX_URI_CHARS and _DATA_URI.fullmatch(src):
        return src
    return None


def _chart(c: figures.Chart | None) -> dict[str, Any] | None:
    return None if c is None else {"src": c.src, "alt": c.alt, "width": c.width,
                                   "height": c.height}


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
    fmt = _pct if is_rate else (lambda v: _num(v, 1))
    ci: Any = c.get("ci95")
    return {"metric": metric,
            "requirement": f"{c.get('op') or '?'} "
                           f"{_pct_short(c.get('threshold')) if is_rate else _sig(c.get('threshold'))}",
            "value": fmt(c.get("value")),
            "ci": (f"[{fmt(ci[0])}, {fmt(ci[1])}]" if _is_interval(ci) else "n/a"),
            "outcome": str(c.get("outcome") or "missing"),
            "confidence": _CONFIDENCE.get(str(c.get("confidence")), str(c.get("confidence"))),
            "text": c.get("text")}


def _verdict(verdict: Any) -> dict[str, Any]:
    """The verdict banner: pass / fail / pass but inconclusive / no criteria (neutral)."""
    v = _map(verdict)
    rows = [_criterion_row(c) for c in _list(v.get("criteria")) if isinstance(c, Mapping)]
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
    node = _map(node)
    return {"label": label, "value": _pct(node.get("value")), "ci": node.get("ci95"),
            "note": note, "ref": ref}


def _key_figures(metrics: Mapping[str, Any], accuracy: Mapping[str, Any]) -> list[Any]:
    corr = _map(metrics.get("average_robustness_corr"))
    adv = _map(metrics.get("average_robustness_adv"))
    wc_corr = _map(metrics.get("worstcase_robustness_corr"))
    wc_adv = _map(metrics.get("worstcase_robustness_adv"))
    correct, m = accuracy.get("correct"), accuracy.get("m", metrics.get("m"))
    cards = [_card("Clean accuracy", accuracy,
                   f"{_num(correct)} of {_num(m)} images" if _is_number(correct) else
                   f"{_num(m)} images", "IEEE-M1")]
    if corr.get("value") is not None or wc_corr.get("value") is not None:
        cards.append(_card("Avg robustness, corruptions", corr,
                           f"mean over {_num(corr.get('n'))} corruptions", "IEEE-M2"))
        cards.append(_card("Worst case, corruptions", wc_corr,
                           f"images right under all {_num(wc_corr.get('n_settings'))} settings",
                           "IEEE-M4"))
    if adv.get("value") is not None or wc_adv.get("value") is not None:
        cards.append(_card("Avg robustness, attacks", adv,
                           f"mean over {_num(adv.get('n'))} attacks", "IEEE-M3"))
        cards.append(_card("Worst case, attacks", wc_adv,
                           f"images right under all {_num(wc_adv.get('n_settings'))} attacks",
                           "IEEE-M5"))
    return cards


# --------------------------------------------------------------------------------------------
# corruptions
# --------------------------------------------------------------------------------------------


def _severity_keys(node: Mapping[str, Any]) -> list[str]:
    keys = [k for k in node if k.lstrip("-").isdigit() and isinstance(node[k], Mapping)]
    return sorted(keys, key=int)


def _mean(node: Mapping[str, Any]) -> Any:
    mean = node.get("mean")
    return mean.get("robustness") if isinstance(mean, Mapping) else mean


def _worst_first(value: Any, name: str) -> tuple[int, float, str]:
    return (0, float(value), name) if _is_number(value) else (1, 0.0, name)


def _corruptions(corruptions: Mapping[str, Any], accuracy: Any,
                 examples: Mapping[str, Any]) -> dict[str, Any]:
    """Rows sorted by mean robustness, worst first; the overview figure; the example grid."""
    nodes = {name: node for name, node in corruptions.items() if isinstance(node, Mapping)}
    order = sorted(nodes, key=lambda n: _worst_first(_mean(nodes[n]), n))
    sevs = sorted({s for node in nodes.values() for s in _severity_keys(node)}, key=int)
    rows = []
    for name in order:
        node = nodes[name]
        cells = [node.get(s) if isinstance(node.get(s), Mapping) else None for s in sevs]
        measured = [(c.get("robustness"), int(s), c.get("ci95")) for s, c in zip(sevs, cells,
                                                                             strict=True)
                    if c is not None and _is_number(c.get("robustness"))]
        low = min(measured, key=lambda x: (x[0], x[1])) if measured else None
        rows.append({"name": name, "cells": cells, "mean": _mean(node),
                     "lowest": {"value": low[0], "severity": low[1], "ci95": low[2]}
                     if low else None})
    series = [(name, _mean(nodes[name]),
               [(int(s), _map(nodes[name].get(s)).get("robustness"),
                 *(_map(nodes[name].get(s)).get("ci95") or [None, None])[:2])
                for s in _severity_keys(nodes[name])]) for name in order]
    grid = _corruption_grid(order, examples.get("corruption") or {},
                            {name: set(_severity_keys(node)) for name, node in nodes.items()})
    return {"severities": sevs, "rows": rows,
            "figure": _chart(figures.corruption_overview(series, accuracy)),
            "grid": grid}


def _answer_label(answer: Any) -> str:
    return str(answer or "").split(" (", 1)[0].strip()


def _changed(original: Any, perturbed: Any) -> bool:
    """Whether the target's answer moved: a query attack's verdict ("fooled after 12
    queries" / "not fooled within 40 queries") says so itself; otherwise the top labels
    ("Shirt (0.63)") differ."""
    if not original or not perturbed:
        return False
    text = str(perturbed)
    if text.startswith(("fooled ", "not fooled ")):
        return text.startswith("fooled ")
    return _answer_label(original) != _answer_label(perturbed)


def _boxes(value: Any) -> tuple[Mapping[str, Any], ...]:
    return tuple(b for b in _list(value) if isinstance(b, Mapping))


def _drawn_uri(image: str, boxes: str, truth_boxes: str, mask: str | None,
               truth_mask: str | None, truth_labels: bool) -> str | None:
    """One drawn example image (:func:`annotate.draw`) as a data URI; None when the image
    does not decode."""
    arr = annotate.decode_uri(image)
    if arr is None:
        return None
    m = annotate.decode_uri(mask) if mask else None
    t = annotate.decode_uri(truth_mask) if truth_mask else None
    return annotate.png_uri(annotate.draw(
        arr, boxes=json.loads(boxes), truth_boxes=json.loads(truth_boxes),
        mask=m if m is not None and m.ndim == 2 else None,
        truth_mask=t if t is not None and t.ndim == 2 else None, truth_labels=truth_labels))


def _drawn(ex: Mapping[str, Any], cache: dict[tuple[Any, ...], str | None]
           ) -> dict[str, str | None] | None:
    """A detection / segmentation example's three panels as the page shows them: the
    ground truth on the clean image, the clean answer and the answer on the image the
    target received (each over the ground truth's outline); None for an example without
    boxes or masks (classification). ``cache``: the page's panels drawn so far (a sample
    image's clean panels repeat on every corruption)."""
    truth = _boxes(ex.get("truth_boxes"))
    answers = {side: _boxes(ex.get(f"{side}_boxes")) for side in ("original", "perturbed")}
    masks = {side: ex.get(f"{side}_mask") if _image(ex.get(f"{side}_mask")) else None
             for side in ("truth", "original", "perturbed")}
    if not any(f"{side}_{what}" in ex for side in ("truth", "original", "perturbed")
               for what in ("boxes", "mask")):
        return None
    original, perturbed = _image(ex.get("original")), _image(ex.get("perturbed"))

    def one(image: str | None, boxes: tuple[Mapping[str, Any], ...], mask: str | None,
            truth_labels: bool = False) -> str | None:
        if image is None:
            return None
        try:
            key = (image, json.dumps(boxes, default=str), json.dumps(truth, default=str),
                   mask, masks["truth"], truth_labels)
            if key not in cache:
                cache[key] = _drawn_uri(*key)
            return cache[key]
        except (TypeError, ValueError, OSError):       # a malformed caller document
            return None

    return {"truth": one(original, (), None, truth_labels=True),
            "original": one(original, answers["original"], masks["original"]),
            "perturbed": one(perturbed, answers["perturbed"], masks["perturbed"])}


def _verdict_word(value: Any) -> str | None:
    return value if value in ("correct", "incorrect") else None


def _example(ex: Mapping[str, Any],
             cache: dict[tuple[Any, ...], str | None] | None = None) -> dict[str, Any] | None:
    """One example image as the page shows it; None when its perturbed image is unusable.

    ``marked`` (the answer drawn in red): the plan's correctness rule judges the answer on
    the perturbed image incorrect, when the document carries the rule's verdicts (IEEE-C1..
    C5); without them, the answer differs from the clean one (``changed``)."""
    perturbed = _image(ex.get("perturbed"))
    if perturbed is None:
        return None
    original_answer, perturbed_answer = ex.get("original_answer"), ex.get("perturbed_answer")
    changed = _changed(original_answer, perturbed_answer)
    verdict = _verdict_word(ex.get("perturbed_verdict"))
    original_verdict = _verdict_word(ex.get("original_verdict"))
    level = ex.get("level")
    return {"setting": str(ex.get("setting") or ""), "level": level,
            "level_key": str(level) if _is_number(level) else "",
            "image_id": ex.get("image_id"), "target": ex.get("target") or "",
            "original": _image(ex.get("original")), "perturbed": perturbed,
            "difference": _image(ex.get("difference")),
            "original_answer": original_answer, "perturbed_answer": perturbed_answer,
            "changed": changed, "note": ex.get("note"),
            "verdict": verdict, "original_verdict": original_verdict,
            "marked": verdict == "incorrect" if verdict else changed,
            "original_marked": original_verdict == "incorrect",
            "drawn": _drawn(ex, {} if cache is None else cache)}


def _rule_words(target: Mapping[str, Any]) -> str:
    """The plan's correctness rule in words, as the examples' pass / fail apply it."""
    params = _map(target.get("service_type_parameters"))
    if "detection" in params:
        d = _map(params["detection"])
        agg = _map(d.get("aggregate"))
        who = f"at least {agg.get('q')} ground-truth objects" if agg.get("mode") == "at_least" \
            else "every ground-truth object"
        how = {"top1": " (its best-overlapping box)",
               "topk": f" (among its {d.get('k')} best-overlapping boxes)"}.get(
                   str(d.get("mode")), "")
        conf = d.get("confidence_threshold")
        score = f", score at least {conf}" if _is_number(conf) else ""
        return (f"IEEE-C4: {who} matched by a box of its class with IoU above "
                f"{d.get('iou_threshold')}{how}{score}; an image without objects passes "
                "when no box is given")
    if "segmentation" in params:
        g = _map(params["segmentation"])
        classes = ", ".join(str(c) for c in _list(g.get("classes")))
        return (f"IEEE-C5: mIoU over the classes of interest ({classes}) above "
                f"{g.get('miou_threshold')}")
    if "correctness" in params:
        c = _map(params["correctness"])
        mode = c.get("mode")
        if mode == "topk":
            return f"IEEE-C2: a true label among the top {c.get('k')}"
        if mode == "threshold":
            return f"IEEE-C2: a true label with confidence above {c.get('threshold')}"
        return "IEEE-C2: the top-1 label is a true label"
    return "the plan's correctness rule"


def _examples(examples: Any, rule: str = "") -> dict[str, dict[str, list[dict[str, Any]]]]:
    """report["examples"] grouped: kind -> setting -> examples (in document order); each
    with ``rule``, the words its pass / fail applies."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    cache: dict[tuple[Any, ...], str | None] = {}
    for ex in _list(examples):
        if not isinstance(ex, Mapping) or ex.get("kind") not in ("corruption", "attack",
                                                                  "degradation"):
            continue
        shown = _example(ex, cache)
        if shown is not None:
            shown["rule"] = rule
            out.setdefault(str(ex["kind"]), {}).setdefault(shown["setting"], []).append(shown)
    return out


def _corruption_grid(order: Sequence[str], by_setting: Mapping[str, list[dict[str, Any]]],
                     tested: Mapping[str, set[str]] | None = None) -> dict[str, Any] | None:
    """Rows = corruptions (the table's order), columns = severities, the clean sample first.
    ``tested``: the severities the table has per corruption; a cell without an example at a
    severity the plan did not test says so (``untested``) rather than "n/a"."""
    if not by_setting:
        return None
    names = [n for n in order if n in by_setting] + sorted(n for n in by_setting
                                                          if n not in order)
    levels = _level_sorted({e["level_key"] for n in names for e in by_setting[n]})
    first = by_setting[names[0]][0]
    rows: list[dict[str, Any]] = []
    for name in names:
        cells = {e["level_key"]: e for e in by_setting[name]}
        sample = next((e for e in by_setting[name] if e["original"]), None)
        rows.append({"name": name, "sample": sample,
                     "cells": [cells.get(lv) for lv in levels],
                     "untested": [tested is not None and name in tested and lv not in cells
                                  and lv not in tested[name] for lv in levels]})
    one_image = len({r["sample"]["image_id"] for r in rows if r["sample"]}) == 1 and \
        all(r["sample"] for r in rows)
    examples = [e for n in names for e in by_setting[n]]
    return {"levels": levels, "rows": rows, "image_id": first["image_id"],
            "original_answer": first["original_answer"], "one_image": one_image,
            "drawn": any(e["drawn"] for e in examples),
            "judged": any(e["verdict"] or e["original_verdict"] for e in examples),
            "rule": first.get("rule") or ""}


# --------------------------------------------------------------------------------------------
# attacks
# --------------------------------------------------------------------------------------------


def _success_key(node: Mapping[str, Any], name: str) -> tuple[int, float, float, str]:
    """Most effective first: highest success rate, then lowest robustness; unknown last."""
    sr, rob = node.get("success_rate"), node.get("robustness_adv")
    return (0 if _is_number(sr) else 1, -float(sr) if _is_number(sr) else 0.0,
            float(rob) if _is_number(rob) else 2.0, name)


#: PER-3/PER-4 rows of a minimal-perturbation attack: (key, label, format); shown when set.
_PER4_ROWS: Final = (
    ("mean_l2_successful", "mean L2 of the images misled (PER-3)", _sig),
    ("median_l2_successful", "median L2 of the images misled (PER-3)", _sig),
    ("fooling_threshold", "threshold T, L2 (PER-4)", _sig),
    ("fooling_rate", "fooling rate: images misled within T (PER-4)", _pct),
    ("never_fooled", "never fooled within the search (PER-4)", _pct),
)


def _attacks(attacks: Mapping[str, Any], tests: Sequence[Mapping[str, Any]],
             examples: Mapping[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    by_id = {t.get("id"): t for t in tests}
    nodes = {n: node for n, node in attacks.items() if isinstance(node, Mapping)}
    rows = []
    for n, name in enumerate(sorted(nodes, key=lambda x: _success_key(nodes[x], x))):
        node, t = nodes[name], by_id.get(name, {})
        per4 = [(label, fmt(node.get(key))) for key, label, fmt in _PER4_ROWS
                if node.get(key) is not None]
        rows.append({"name": name, "anchor": f"attack-{n}", "node": node,
                     "kind": node.get("kind", t.get("kind")),
                     "attack_kind": t.get("attack_kind"), "attack": t.get("attack"),
                     "epsilon": t.get("epsilon"), "norm": t.get("norm"),
                     "surrogate": t.get("surrogate"), "criterion": t.get("criterion"),
                     "signal": t.get("signal_note"), "per4": per4,
                     "examples": (examples.get(name) or [])[:_MAX_ATTACK_EXAMPLES]})
    return rows


def _attack_figures(attacks: Sequence[Mapping[str, Any]], accuracy: Any) -> list[Any]:
    curves = [(a["name"], a["node"].get("query_budget"),
               [tuple(p[:2]) for p in _list(a["node"].get("success_by_queries"))
                if isinstance(p, list | tuple) and len(p) >= 2])
              for a in attacks]
    out = [_chart(figures.success_vs_queries([c for c in curves if c[2]]))]
    groups: dict[str, list[tuple[Any, Any, Any, Any]]] = {}
    norms: dict[str, Any] = {}
    for a in attacks:
        if a["attack"] and _is_number(a["epsilon"]):
            ci = a["node"].get("ci95")
            lo, hi = (ci[0], ci[1]) if _is_interval(ci) else (None, None)
            key = f"{a['attack']}" + (f" ({a['surrogate']})" if a["surrogate"] else "")
            groups.setdefault(key, []).append((a["epsilon"], a["node"].get("robustness_adv"),
                                               lo, hi))
            norms.setdefault(key, a["norm"])
    series = [(k, norms[k], pts) for k, pts in sorted(groups.items())
              if len({p[0] for p in pts}) >= 2]
    out.append(_chart(figures.robustness_vs_epsilon(series, accuracy)))
    return [c for c in out if c is not None]


# --------------------------------------------------------------------------------------------
# CANARY per attack (CAN-1..CAN-4)
# --------------------------------------------------------------------------------------------

#: CANARY metrics in the paper's order: (group, key, label, format). Keys are those of
#: services/scoring/canary.py's result dicts; unknown keys are shown after these.
_CANARY_ROWS: Final = (
    ("effect", "MR", "MR: misclassification ratio (CAN-2)", "pct"),
    ("effect", "TAS", "TAS: targeted attack success (CAN-2)", "pct"),
    ("effect", "AIAC", "AIAC: increase of the adversarial class's confidence (CAN-2)", "sig"),
    ("effect", "ARTC", "ARTC: reduction of the true class's confidence (CAN-2)", "sig"),
    ("effect", "ACAMC_A", "ACAMC-A: attention change, adversarial class (CAN-2)", "sig"),
    ("effect", "ACAMC_T", "ACAMC-T: attention change, true class (CAN-2)", "sig"),
    ("effect", "OTR", "OTR: observable transfer rate (CAN-2)", "pct"),
    ("cost", "CTC", "CTC: seconds per example, grade (CAN-3)", "ctc"),
    ("cost", "CTC_seconds", "CTC: seconds per example (CAN-3)", "sig"),
    ("cost", "CTC_grade", "CTC grade (CAN-3)", "txt"),
    ("cost", "QNC_F", "QNC-F: forward queries per example (CAN-3)", "num"),
    ("cost", "QNC_B", "QNC-B: backward queries per example (CAN-3)", "num"),
    ("perturbation", "AMD", "AMD: mean L-inf distance (CAN-4)", "sig"),
    ("perturbation", "AED", "AED: mean L2 distance (CAN-4)", "sig"),
    ("perturbation", "APCR", "APCR: pixels changed (CAN-4)", "pct"),
    ("perturbation", "AED_FD_L", "AED-FD low frequencies (CAN-4)", "sig"),
    ("perturbation", "AED_FD_H", "AED-FD high frequencies (CAN-4)", "sig"),
    ("perturbation", "AED_FD_low", "AED-FD low frequencies (CAN-4)", "sig"),
    ("perturbation", "AED_FD_high", "AED-FD high frequencies (CAN-4)", "sig"),
    ("perturbation", "ALMS", "ALMS: MS-GMSD structure change (CAN-4)", "sig"),
    ("perturbation", "ADMS", "ADMS: DISTS perceptual distance (CAN-4)", "sig"),
)
_CANARY_SKIP: Final = frozenset({"n", "n_total", "kind", "notes", "value", "status", "reason"})
_CANARY_GROUPS: Final = {"effect": "CAN-2 attack effect", "cost": "CAN-3 attack cost",
                         "perturbation": "CAN-4 perturbation cost"}
_MODEL_ROWS: Final = (("CA", "CA: clean accuracy", "pct"), ("CF", "CF: macro F1", "sig"),
                      ("CC", "CC: mean confidence of the true class", "sig"))


def _metric_cell(node: Any, fmt: str) -> dict[str, Any]:
    """A CANARY value as text, with the reason when it is missing."""
    value = _value(node)
    reason = node.get("reason") if isinstance(node, Mapping) else None
    status = node.get("status") if isinstance(node, Mapping) else None
    if fmt == "ctc":
        grade = node.get("grade") if isinstance(node, Mapping) else None
        text = _sig(value, 3) + (f" s ({grade})" if grade and _is_number(value) else
                                 " s" if _is_number(value) else "")
    elif fmt == "pct":
        text = _pct(value)
    elif fmt == "num":
        text = _num(value, 1)
    elif fmt == "txt":
        text = _txt(value)
    else:
        text = _sig(value)
    n = node.get("n") if isinstance(node, Mapping) else None
    return {"text": text, "missing": value is None,
            "reason": reason or (status if status and status != "ok" else None), "n": n}


def _canary(canary: Any, order: Sequence[str]) -> dict[str, Any] | None:
    """CAN-1 once, CAN-2..CAN-4 as one table: metrics in the paper's order, attacks in the
    attack table's order (most effective first); n/a with its reason where missing."""
    c = _map(canary)
    attacks = {n: a for n, a in _map(c.get("attacks")).items() if isinstance(a, Mapping)}
    model = _map(c.get("model"))
    if not attacks and not model:
        return None
    names = [n for n in order if n in attacks] + sorted(n for n in attacks if n not in order)
    rows, notes = [], []
    known = {(g, k) for g, k, *_ in _CANARY_ROWS}
    extra = sorted({(g, k) for a in attacks.values() for g in ("effect", "cost", "perturbation")
                    for k in _map(a.get(g)) if (g, k) not in known and k not in _CANARY_SKIP})
    # a whole group may be one "not available" node (e.g. CAN-2 of a query attack)
    whole = {(n, g): str(grp.get("reason") or grp.get("status") or "not available")
             for n in names for g in _CANARY_GROUPS
             for grp in (_map(attacks[n].get(g)),)
             if grp and "status" in grp and not set(grp) - _CANARY_SKIP}
    notes += [f"{_CANARY_GROUPS[g]} of {n}: {why}" for (n, g), why in whole.items()]
    for group, key, label, fmt in (*_CANARY_ROWS, *((g, k, k, "sig") for g, k in extra)):
        present = [n for n in names if key in _map(attacks[n].get(group))]
        if not present:
            continue
        cells = []
        for n in names:
            node = _map(attacks[n].get(group)).get(key)
            cell = _metric_cell(node, fmt)
            if (n, group) in whole:
                cell["reason"] = whole[(n, group)]
            elif cell["missing"] and cell["reason"]:
                notes.append(f"{key} of {n}: {cell['reason']}")
            cells.append(cell)
        rows.append({"label": label, "cells": cells})
    model_rows = [{"label": label, **_metric_cell(model.get(key), fmt)}
                  for key, label, fmt in _MODEL_ROWS if key in model]
    return {"attacks": names, "rows": rows, "model": model_rows, "n": model.get("n"),
            "notes": list(dict.fromkeys(notes))[:40] + [str(x) for x in _list(c.get("notes"))]}


# --------------------------------------------------------------------------------------------
# benchmark across models (CAN-5, 7, 8, 10)
# --------------------------------------------------------------------------------------------


def _by_rank(rank: Any, name: str) -> tuple[int, float, str]:
    """Rank 1 first; no rank (or not a number) last."""
    return (0, float(rank), name) if _is_number(rank) else (1, 0.0, name)


def _ranking_rows(ranking: Any) -> list[dict[str, Any]]:
    """A CAN-7 ranking ({entries: {name: {value, n, score, rank}}}) as rows, rank 1 first."""
    entries = _map(_map(ranking).get("entries"))
    rows = [{"name": n, **e} for n, e in entries.items() if isinstance(e, Mapping)]
    return sorted(rows, key=lambda r: _by_rank(r.get("rank"), r["name"]))


def _irt(irt: Any) -> dict[str, Any] | None:
    """CAN-8: overall abilities, with theta +- 1.96 SD from the fit that produced them (the
    second layer, else the single first-layer fit)."""
    irt = _map(irt)
    subjects = _map(irt.get("subjects"))
    if not subjects:
        return None
    layer1 = {cat: _map(fit) for cat, fit in _map(irt.get("layer1")).items()}
    source = _map(irt.get("layer2")) or (next(iter(layer1.values())) if len(layer1) == 1
                                         else {})
    sds = {n: _map(s).get("theta_sd") for n, s in _map(source.get("subjects")).items()}
    rows = []
    for name, s in subjects.items():
        s = _map(s)
        theta = s.get("theta")
        sd = s.get("theta_sd") if _is_number(s.get("theta_sd")) else sds.get(name)
        lo, hi = ((theta - 1.96 * sd, theta + 1.96 * sd)
                  if _is_number(theta) and _is_number(sd) else (None, None))
        rows.append({"name": name, "theta": theta, "lo": lo, "hi": hi, "score": s.get("score"),
                     "rank": s.get("rank"),
                     "by_category": [_map(_map(fit.get("subjects")).get(name)).get("theta")
                                     for fit in layer1.values()]})
    rows.sort(key=lambda r: _by_rank(r["rank"], str(r["name"])))
    chart = figures.irt_abilities([(r["name"], r["theta"], r["lo"], r["hi"]) for r in rows])
    return {"rows": rows, "categories": list(layer1), "figure": _chart(chart),
            "dropped": _list(irt.get("dropped")), "two_layers": bool(irt.get("layer2"))}


_DEFENCE_LABELS: Final = {"ARAC": "ARAC: adversarial-class confidence reduction",
                          "AITC": "AITC: true-class confidence increase"}


def _defence(defence: Any) -> list[dict[str, Any]]:
    """CAN-5 per defended/baseline pair: AV/FV/CV, RR/SR, ACV and, per transfer attack, the
    ACV of its MR and ARAC/AITC."""
    out = []
    for d in _list(defence):
        if not isinstance(d, Mapping):
            continue
        res = _map(d.get("result"))
        caps = [{"label": label, **{k: _map(res.get(key)).get(k)
                                    for k in ("value", "baseline", "defended", "reason")}}
                for key, label in (("AV", "AV: accuracy variance (CA)"),
                                   ("FV", "FV: F1 variance (CF)"),
                                   ("CV", "CV: confidence variance (CC)"))]
        ratios = [{"label": label, "value": _map(res.get(key)).get("value")}
                  for key, label in (("RR", "RR: rectify ratio"), ("SR", "SR: sacrifice ratio"))]
        acv = [{"label": key, **{k: _map(node).get(k) for k in ("value", "baseline", "defended",
                                                               "reason")}}
               for key, node in _map(res.get("ACV")).items()]
        extra = [{"label": _DEFENCE_LABELS[key], "value": _map(res.get(key)).get("value"),
                  "reason": _map(res.get(key)).get("reason")}
                 for key in ("ARAC", "AITC") if key in res]
        for attack, r in _map(d.get("attacks")).items():   # per transfer attack (CAN-5)
            r = _map(r)
            for key, node in _map(r.get("ACV")).items():
                acv.append({"label": f"{key}, {attack}",
                            **{k: _map(node).get(k) for k in ("value", "baseline", "defended",
                                                             "reason")}})
            extra += [{"label": f"{_DEFENCE_LABELS[key]}, {attack}",
                       "value": _map(r.get(key)).get("value"),
                       "reason": _map(r.get(key)).get("reason")}
                      for key in ("ARAC", "AITC") if key in r]
        # ACV / ARAC / AITC that were not computed (no attack report given) are left out
        acv = [r for r in acv if any(r.get(k) is not None for k in ("value", "baseline",
                                                                  "defended"))]
        extra = [r for r in extra if r["value"] is not None]
        out.append({"baseline": d.get("baseline"), "defended": d.get("defended"),
                    "caps": caps, "ratios": ratios, "acv": acv, "extra": extra,
                    "n": res.get("n")})
    return out


def _heatmaps(bench: Mapping[str, Any]) -> list[dict[str, Any]]:
    metric = str(bench.get("metric") or "MR")
    maps = _map(_map(bench.get("twoway")).get("heatmaps"))
    charts = []
    if maps:
        for attack, h in list(maps.items())[:_MAX_HEATMAPS]:
            h = _map(h)
            charts.append(figures.transfer_heatmap(attack, str(h.get("metric") or metric),
                                                   [str(x) for x in _list(h.get("rows"))],
                                                   [str(x) for x in _list(h.get("cols"))],
                                                   [_list(r) for r in _list(h.get("values"))]))
    else:   # the K x S x M matrix: crafted on each source (surrogate), evaluated on each model
        models = [str(x) for x in _list(bench.get("model_names"))]
        sources = [str(x) for x in _list(bench.get("sources"))]
        matrix = _list(bench.get("matrix"))
        for k, attack in enumerate(_list(bench.get("attacks"))[:_MAX_HEATMAPS]):
            if k < len(matrix):
                block = [_list(r) for r in _list(matrix[k])]
                rows = sources if sources and len(sources) == len(block) else models
                charts.append(figures.transfer_heatmap(str(attack), metric, rows, models,
                                                       block))
    return [c for c in (_chart(x) for x in charts) if c is not None]


def _model_attack(model: Mapping[str, Any], attack: str) -> Mapping[str, Any]:
    """One model's metrics of an attack: the attack by name, or (a transfer attack of a
    multi-target plan, named ``attack.surrogate``) crafted on the model's own surrogate."""
    runs = _map(model.get("attacks"))
    return _map(runs.get(attack)) or _map(runs.get(f"{attack}.{model.get('surrogate')}"))


def _benchmark(benchmark: Any) -> dict[str, Any] | None:
    b = _map(benchmark)
    models = [m for m in _list(b.get("models")) if isinstance(m, Mapping)]
    if not models and not b.get("matrix"):
        return None
    attacks = [str(a) for a in _list(b.get("attacks"))]

    def robust(m: Mapping[str, Any]) -> tuple[int, float, str]:
        v = _map(m.get("average_robustness_adv")).get("value")
        return (0, -float(v), str(m.get("name"))) if _is_number(v) else (1, 0.0,
                                                                         str(m.get("name")))

    rows = [{"name": m.get("name"), "surrogate": m.get("surrogate"), "defends": m.get("defends"),
             "accuracy": _map(m.get("accuracy")),
             "corr": _map(m.get("average_robustness_corr")).get("value"),
             "adv": _map(m.get("average_robustness_adv")).get("value"),
             "attacks": [_model_attack(m, a) for a in attacks]}
            for m in sorted(models, key=robust)]
    twoway = _map(b.get("twoway"))
    tw, tr = _map(twoway.get("two_way")), _map(twoway.get("transfer"))
    fast = _map(b.get("fast"))
    return {"mode": b.get("mode"), "metric": b.get("metric") or "MR", "attacks": attacks,
            "rows": rows, "heatmaps": _heatmaps(b),
            "model_ranking": _ranking_rows(tw.get("model_robustness")),
            "attack_ranking": _ranking_rows(tw.get("attack_effectiveness")),
            "transfer_attacks": _ranking_rows(tr.get("attack_transferability")),
            "transfer_models": _ranking_rows(tr.get("model_transfer_robustness")),
            "irt": _irt(b.get("irt")), "defence": _defence(b.get("defence")),
            "fast": fast or None, "baseline": b.get("baseline_evaluation"),
            "notes": [str(n) for n in _list(b.get("notes"))]}


# --------------------------------------------------------------------------------------------
# degradation, ranking, query errors
# --------------------------------------------------------------------------------------------


def _by_level(rows: Any) -> dict[str, Mapping[str, Any]]:
    return {str(r.get("level")): r for r in rows or [] if isinstance(r, Mapping)}


def _degradation(degradation: Any,
                 examples: Mapping[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    if not isinstance(degradation, Mapping):
        return []
    out: list[dict[str, Any]] = []
    for op, prof in degradation.items():
        if not isinstance(prof, Mapping):
            continue
        rank, prob = _by_level(prof.get("rank")), _by_level(prof.get("probability"))
        changes = {str(r.get("level")): r.get("change") for r in prof.get("changes") or []
                   if isinstance(r, Mapping)}
        rows: list[dict[str, Any]] = []
        accuracy = _by_level(prof.get("accuracy"))
        for lv in _level_sorted(accuracy):
            a, change = accuracy[lv], changes.get(lv)
            ci = a.get("ci95")
            rows.append({"level": lv, "accuracy": a.get("value"), "ci95": ci,
                         "rank": rank.get(lv, {}).get("value"),
                         "probability": prob.get(lv, {}).get("value"),
                         "changed": change.get("fraction_of_pixels_changed")
                         if isinstance(change, Mapping) else None})
        fps: list[dict[str, Any]] = sorted(({"threshold": float(t),
                       "level": fp.get("level") if isinstance(fp, Mapping) else None,
                       "example": fp.get("example_image") if isinstance(fp, Mapping) else None}
                      for t, fp in _map(prof.get("failure_points")).items()
                      if _is_number(_float(t))), key=lambda f: -f["threshold"])
        chart = figures.degradation_profile(
            op, [(_int_key(r["level"]), r["accuracy"],
                  *(r["ci95"] if _is_interval(r["ci95"]) else (None, None)), r["probability"])
                 for r in rows if _int_key(r["level"]) is not None],
            [(f["threshold"], f["level"]) for f in fps]) \
            if len(out) < _MAX_PROFILE_FIGURES else None
        exs = sorted(examples.get(op) or [], key=lambda e: (_int_key(e["level_key"]) or 0))
        out.append({"name": op, "m": prof.get("m"), "m_used": prof.get("m_used"),
                    "rows": rows, "failure_points": fps, "figure": _chart(chart),
                    "examples": exs, "reason": prof.get("reason")})
    return out


def _float(text: Any) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _query_errors(qe: Any) -> list[dict[str, Any]]:
    if not isinstance(qe, Mapping) or not qe.get("total"):
        return []
    return [{"name": name, "node": node,
             "examples": [x for x in (node.get("examples") or [])[:3] if isinstance(x, Mapping)]}
            for name, node in (qe.get("settings") or {}).items() if isinstance(node, Mapping)]


def _ranking(ranking: Any) -> dict[str, Any]:
    ranking = _map(ranking)
    k = ranking.get("drr_k") or 5
    rows: list[dict[str, Any]] = []
    if ranking.get("applicable"):
        for name, r in _map(ranking.get("settings")).items():
            if isinstance(r, Mapping):
                at = [v for v in _list(r.get("ndcg_at"))]
                rows.append({"name": name, "ndcg_1": r.get("ndcg_1"),
                             "ndcg_5": at[4] if len(at) > 4 else None,
                             "drr": r.get(f"drr_{k}"), "m": r.get("m"), "ndcg_at": at})
    rows.sort(key=lambda r: _worst_first(r["ndcg_1"], r["name"]))
    curves = [(r["name"], r["ndcg_at"]) for r in rows if r["ndcg_at"]][:_MAX_NDCG_LINES]
    chart = figures.ndcg_curves(curves, sum(1 for r in rows if r["ndcg_at"]))
    return {"rows": rows, "head": rows[:_NDCG_TABLE_ROWS], "rest": rows[_NDCG_TABLE_ROWS:],
            "k": k, "reason": ranking.get("reason"), "gamma_b": ranking.get("gamma_b"),
            "gamma_a": ranking.get("gamma_a"), "figure": _chart(chart)}


# --------------------------------------------------------------------------------------------
# target, roles, tests
# --------------------------------------------------------------------------------------------

#: Readable names of the service-type parameters (IEEE-P3, IEEE-C1..C5).
_PARAM_NAMES: Final = {
    "mode": "correctness mode", "k": "k (top-k)", "threshold": "confidence threshold",
    "iou_threshold": "IoU threshold", "confidence_threshold": "confidence threshold (lower "
    "scores dropped first)", "aggregate": "aggregation over objects (IEEE-C3)",
    "q": "q (at least q objects)", "classes": "classes of interest",
    "miou_threshold": "mIoU threshold", "ignore_label": "ignored label",
    "all_absent": "verdict when no class of interest is present",
    "label_sets": "acceptable label sets", "labels": "labels",
}
_RULE_NAMES: Final = {"correctness": "Classification correctness (IEEE-C1/C2)",
                      "detection": "Detection correctness (IEEE-C3/C4)",
                      "segmentation": "Segmentation correctness (IEEE-C5)"}
#: Fields each correctness mode uses (the others are not shown).
_MODE_FIELDS: Final = {"top1": ("mode",), "topk": ("mode", "k"),
                       "threshold": ("mode", "threshold")}


def _param_rows(rule: str, params: Mapping[str, Any], prefix: str = "") -> list[Any]:
    out: list[dict[str, Any]] = []
    mode = params.get("mode")
    for key, value in params.items():
        if rule == "correctness" and mode in _MODE_FIELDS and key in ("k", "threshold") \
                and key not in _MODE_FIELDS[mode]:
            continue
        if rule == "detection" and key == "k" and mode != "topk":
            continue
        if isinstance(value, Mapping):
            if key == "aggregate" and value.get("mode") != "at_least":
                value = {k: v for k, v in value.items() if k != "q"}
            out += _param_rows(rule, value, f"{prefix}{_PARAM_NAMES.get(key, key)}: ")
            continue
        if value is None:
            continue
        out.append({"name": prefix + _PARAM_NAMES.get(key, key), "key": key, "value": value})
    return out


def _service_parameters(report: Mapping[str, Any],
                        target: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Named rows per rule: the typed rule the evaluation used, else the plan's; other
    service parameters of the plan as given."""
    typed = _map(target.get("service_type_parameters"))
    given = _map(report.get("service_parameters"))
    out = []
    for rule in ("correctness", "detection", "segmentation"):
        params = _map(typed.get(rule)) or _map(given.get(rule))
        if params:
            out.append({"title": _RULE_NAMES[rule], "rows": _param_rows(rule, params)})
    other = {k: v for k, v in given.items() if k not in _RULE_NAMES}
    if other:
        out.append({"title": "Other service parameters (as the plan gives them)",
                    "rows": [{"name": _PARAM_NAMES.get(k, k), "key": k, "value": v}
                             for k, v in other.items()]})
    return out


def _roles(tester: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One roles table (IEEE-P1): the tester's name/organisation is the roles' tester."""
    roles = _map(tester.get("roles"))
    out = []
    for key, label in (("requester", "Test requester"), ("tester", "Tester"),
                       ("provider", "Service provider")):
        party = _map(roles.get(key))
        name = party.get("name")
        org = party.get("organisation") or party.get("organization")
        if key == "tester" and not (name or org):
            name, org = tester.get("name"), tester.get("organization")
        out.append({"role": label, "name": name, "organisation": org})
    return out


def _level_table(parameters: Any) -> dict[str, Any] | None:
    """Per-level parameters as a table: levels in numeric order, one named column each."""
    params = _map(parameters)
    levels = _level_sorted(k for k, v in params.items() if isinstance(v, Mapping))
    if not levels:
        return None
    columns: list[str] = []
    for lv in levels:
        columns += [str(c) for c in params[lv] if str(c) not in columns]
    return {"columns": columns,
            "rows": [{"level": lv, "cells": [params[lv].get(c) for c in columns]}
                     for lv in levels]}


def _tests(tests: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for t in tests:
        kind = t.get("kind")
        params = t.get("parameters")
        table = _level_table(params) if kind in ("corruption", "degradation") else None
        flat = {} if table is not None else {
            k: v for k, v in sorted(_map(params).items()) if not isinstance(v, Mapping)}
        bits = [str(t.get("family") or kind or "")]
        if t.get("severities"):
            bits.append("severities " + _txt(t.get("severities")))
        if t.get("levels"):
            bits.append("levels " + _txt(t.get("levels")))
        if t.get("epsilon") is not None:
            bits.append(f"epsilon {_txt(t.get('epsilon'))}"
                        + (f" ({t.get('norm')})" if t.get("norm") else ""))
        if t.get("query_budget") is not None:
            bits.append(f"budget {_txt(t.get('query_budget'))} queries")
        if t.get("surrogate"):
            bits.append(f"surrogate {t.get('surrogate')}")
        out.append({"t": t, "summary": ", ".join(b for b in bits if b), "table": table,
                    "flat": flat, "overrides": _map(t.get("params"))})
    return out


def _evaluation(evaluation: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The run's facts with times in ISO form only (the JSON keeps epoch seconds too)."""
    ds = _map(evaluation.get("dataset"))
    rows: list[tuple[str, Any]] = [
        ("Evaluation id", evaluation.get("id")),
        ("Started", evaluation.get("started_at")), ("Ended", evaluation.get("ended_at")),
        ("Duration", f"{_num(evaluation.get('duration_s'), 1)} s"),
        ("Images (M)", evaluation.get("images")),
        ("Dataset", f"{_txt(ds.get('source'))} ({_txt(ds.get('split'))}), offset "
                    f"{_txt(ds.get('offset'))}, limit {_txt(ds.get('limit'))}" if ds else None),
        ("Resumed", evaluation.get("resumed_count"))]
    skip = {"id", "started", "finished", "started_at", "ended_at", "duration_s", "images",
            "dataset", "resumed_count"}
    rows += [(k, v) for k, v in evaluation.items() if k not in skip]
    return rows


# --------------------------------------------------------------------------------------------
# the page
# --------------------------------------------------------------------------------------------


def _scope(corruptions: Any, attacks: Any, degradation: Any, ranking: Any) -> list[str]:
    """What this evaluation did not measure, said once in the summary."""
    out = []
    if not corruptions["rows"]:
        out.append("No corruptions were tested.")
    if not attacks:
        out.append("No adversarial attacks were tested.")
    if not degradation:
        out.append("No degradation operators were tested.")
    if not ranking["rows"]:
        out.append(f"Ranking metrics (NDCG, DRR): Not applicable: {_txt(ranking['reason'])}")
    return out


def render_html(report: Mapping[str, Any]) -> str:
    """One self-contained HTML page for the report document (inline CSS, figures as data:
    images, no scripts, no external resources; every piece of caller text escaped, nulls
    shown as ``n/a``)."""
    target = _map(report.get("target"))
    tester = _map(report.get("tester"))
    metrics = _map(report.get("metrics"))
    evaluation = _map(report.get("evaluation"))
    tests = [t for t in _list(report.get("tests")) if isinstance(t, Mapping)]
    accuracy = _map(metrics.get("accuracy"))
    examples = _examples(report.get("examples"), _rule_words(target))
    corruptions = _corruptions(_map(metrics.get("corruptions")), accuracy.get("value"),
                               examples)
    attacks = _attacks(_map(metrics.get("attacks")), tests, examples.get("attack") or {})
    degradation = _degradation(metrics.get("degradation"), examples.get("degradation") or {})
    ranking = _ranking(metrics.get("ranking"))
    query_errors = _query_errors(metrics.get("query_errors"))
    canary = _canary(report.get("canary"), [a["name"] for a in attacks])
    benchmark = _benchmark(report.get("benchmark"))
    worst = corruptions["rows"][0] if corruptions["rows"] else None
    strongest = attacks[0] if attacks and _is_number(attacks[0]["node"].get("success_rate")) \
        else None
    present = {"summary": True, "corruptions": bool(corruptions["rows"]),
               "attacks": bool(attacks), "canary": canary is not None,
               "benchmark": benchmark is not None, "degradation": bool(degradation),
               "worst-case": True, "ranking": bool(ranking["rows"]),
               "query-errors": bool(query_errors), "tests": bool(tests), "target": True,
               "ledger": True, "environment": True, "plan": True, "repeat": True}
    return _environment().get_template("report.html.j2").render(
        report=report, target=target, tester=tester, metrics=metrics, evaluation=evaluation,
        accuracy=accuracy, verdict=_verdict(report.get("verdict")),
        failed=[f for f in _list(report.get("failed_settings")) if isinstance(f, Mapping)],
        cards=_key_figures(metrics, accuracy), worst=worst, strongest=strongest,
        scope=_scope(corruptions, attacks, degradation, ranking),
        metrics_used=[m for m in _list(report.get("metrics_used")) if isinstance(m, Mapping)],
        repeat=_map(report.get("repeat")),
        date=evaluation.get("ended_at") or evaluation.get("started_at"),
        corruptions=corruptions, attacks=attacks,
        attack_figures=_attack_figures(attacks, accuracy.get("value")),
        canary=canary, benchmark=benchmark, degradation=degradation,
        query_errors=query_errors, ranking=ranking, tests=_tests(tests),
        service_parameters=_service_parameters(report, target), roles=_roles(tester),
        evaluation_rows=_evaluation(evaluation), ledger=_map(report.get("ledger")),
        present=present, nav=[(a, label) for a, label in _SECTIONS if present.get(a)],
        title=f"Fortis robustness report: {target.get('name') or 'target'}") + "\n"


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float as None: strict JSON has no NaN/Infinity, and the
    HTML page prints such a number as "n/a". Without this, an Inf anywhere in the report parts
    a caller sends would fail json.dumps (INTERNAL)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def report_json(report: Mapping[str, Any]) -> str:
    """``report.json``'s text: indent 2, sorted keys, strict JSON (a number that is not finite
    is null), UTF-8 as is."""
    return json.dumps(_finite(report), indent=2, sort_keys=True, allow_nan=False,
                      ensure_ascii=False)


def write_report(report: Mapping[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """Write ``report.json`` and ``report.html`` into ``out_dir`` (created if needed);
    returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out_dir / "report.json", out_dir / "report.html"
    _atomic_write(json_path, report_json(report) + "\n")
    _atomic_write(html_path, render_html(report))
    return json_path, html_path
