"""The report page's results per setting: corruptions (worst first, with the severity
grid of example images), the example images themselves (boxes and masks drawn, the rule's
verdicts in words) and attacks (most effective first, with their figures). Pure code, no
gRPC."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from fortis.services.report import annotate, figures
from fortis.services.report.page_values import (
    as_list,
    as_map,
    chart_dict,
    is_interval,
    is_number,
    level_sorted,
    pct,
    safe_image,
    sig,
)

#: Example images shown per attack.
_MAX_ATTACK_EXAMPLES: Final = 3

# --------------------------------------------------------------------------------------------
# corruptions
# --------------------------------------------------------------------------------------------


def _severity_keys(node: Mapping[str, Any]) -> list[str]:
    keys = [k for k in node if k.lstrip("-").isdigit() and isinstance(node[k], Mapping)]
    return sorted(keys, key=int)


def _mean(node: Mapping[str, Any]) -> Any:
    mean = node.get("mean")
    return mean.get("robustness") if isinstance(mean, Mapping) else mean


def worst_first(value: Any, name: str) -> tuple[int, float, str]:
    return (0, float(value), name) if is_number(value) else (1, 0.0, name)


def corruption_section(corruptions: Mapping[str, Any], accuracy: Any,
                       examples: Mapping[str, Any]) -> dict[str, Any]:
    """Rows sorted by mean robustness, worst first; the overview figure; the example grid."""
    nodes = {name: node for name, node in corruptions.items() if isinstance(node, Mapping)}
    order = sorted(nodes, key=lambda n: worst_first(_mean(nodes[n]), n))
    sevs = sorted({s for node in nodes.values() for s in _severity_keys(node)}, key=int)
    rows = []
    for name in order:
        node = nodes[name]
        cells = [node.get(s) if isinstance(node.get(s), Mapping) else None for s in sevs]
        measured = [(c.get("robustness"), int(s), c.get("ci95")) for s, c in zip(sevs, cells,
                                                                             strict=True)
                    if c is not None and is_number(c.get("robustness"))]
        low = min(measured, key=lambda x: (x[0], x[1])) if measured else None
        rows.append({"name": name, "cells": cells, "mean": _mean(node),
                     "lowest": {"value": low[0], "severity": low[1], "ci95": low[2]}
                     if low else None})
    series = [(name, _mean(nodes[name]),
               [(int(s), as_map(nodes[name].get(s)).get("robustness"),
                 *(as_map(nodes[name].get(s)).get("ci95") or [None, None])[:2])
                for s in _severity_keys(nodes[name])]) for name in order]
    grid = _corruption_grid(order, examples.get("corruption") or {},
                            {name: set(_severity_keys(node)) for name, node in nodes.items()})
    return {"severities": sevs, "rows": rows,
            "figure": chart_dict(figures.corruption_overview(series, accuracy)),
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
    return tuple(b for b in as_list(value) if isinstance(b, Mapping))


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
    masks = {side: ex.get(f"{side}_mask") if safe_image(ex.get(f"{side}_mask")) else None
             for side in ("truth", "original", "perturbed")}
    if not any(f"{side}_{what}" in ex for side in ("truth", "original", "perturbed")
               for what in ("boxes", "mask")):
        return None
    original, perturbed = safe_image(ex.get("original")), safe_image(ex.get("perturbed"))

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
    perturbed = safe_image(ex.get("perturbed"))
    if perturbed is None:
        return None
    original_answer, perturbed_answer = ex.get("original_answer"), ex.get("perturbed_answer")
    changed = _changed(original_answer, perturbed_answer)
    verdict = _verdict_word(ex.get("perturbed_verdict"))
    original_verdict = _verdict_word(ex.get("original_verdict"))
    level = ex.get("level")
    return {"setting": str(ex.get("setting") or ""), "level": level,
            "level_key": str(level) if is_number(level) else "",
            "image_id": ex.get("image_id"), "target": ex.get("target") or "",
            "original": safe_image(ex.get("original")), "perturbed": perturbed,
            "difference": safe_image(ex.get("difference")),
            "original_answer": original_answer, "perturbed_answer": perturbed_answer,
            "changed": changed, "note": ex.get("note"),
            "verdict": verdict, "original_verdict": original_verdict,
            "marked": verdict == "incorrect" if verdict else changed,
            "original_marked": original_verdict == "incorrect",
            "drawn": _drawn(ex, {} if cache is None else cache)}


def rule_words(target: Mapping[str, Any]) -> str:
    """The plan's correctness rule in words, as the examples' pass / fail apply it."""
    params = as_map(target.get("service_type_parameters"))
    if "detection" in params:
        d = as_map(params["detection"])
        agg = as_map(d.get("aggregate"))
        who = f"at least {agg.get('q')} ground-truth objects" if agg.get("mode") == "at_least" \
            else "every ground-truth object"
        how = {"top1": " (its best-overlapping box)",
               "topk": f" (among its {d.get('k')} best-overlapping boxes)"}.get(
                   str(d.get("mode")), "")
        conf = d.get("confidence_threshold")
        score = f", score at least {conf}" if is_number(conf) else ""
        return (f"IEEE-C4: {who} matched by a box of its class with IoU above "
                f"{d.get('iou_threshold')}{how}{score}; an image without objects passes "
                "when no box is given")
    if "segmentation" in params:
        g = as_map(params["segmentation"])
        classes = ", ".join(str(c) for c in as_list(g.get("classes")))
        return (f"IEEE-C5: mIoU over the classes of interest ({classes}) above "
                f"{g.get('miou_threshold')}")
    if "correctness" in params:
        c = as_map(params["correctness"])
        mode = c.get("mode")
        if mode == "topk":
            return f"IEEE-C2: a true label among the top {c.get('k')}"
        if mode == "threshold":
            return f"IEEE-C2: a true label with confidence above {c.get('threshold')}"
        return "IEEE-C2: the top-1 label is a true label"
    return "the plan's correctness rule"


def example_groups(examples: Any, rule: str = "") -> dict[str, dict[str, list[dict[str, Any]]]]:
    """report["examples"] grouped: kind -> setting -> examples (in document order); each
    with ``rule``, the words its pass / fail applies."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    cache: dict[tuple[Any, ...], str | None] = {}
    for ex in as_list(examples):
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
    levels = level_sorted({e["level_key"] for n in names for e in by_setting[n]})
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
    sr: Any = node.get("success_rate")
    rob: Any = node.get("robustness_adv")
    return (0 if is_number(sr) else 1, -float(sr) if is_number(sr) else 0.0,
            float(rob) if is_number(rob) else 2.0, name)


#: PER-3/PER-4 rows of a minimal-perturbation attack: (key, label, format); shown when set.
_PER4_ROWS: Final = (
    ("mean_l2_successful", "mean L2 of the images misled (PER-3)", sig),
    ("median_l2_successful", "median L2 of the images misled (PER-3)", sig),
    ("fooling_threshold", "threshold T, L2 (PER-4)", sig),
    ("fooling_rate", "fooling rate: images misled within T (PER-4)", pct),
    ("never_fooled", "never fooled within the search (PER-4)", pct),
)


def attack_rows(attacks: Mapping[str, Any], tests: Sequence[Mapping[str, Any]],
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


def attack_figures(attacks: Sequence[Mapping[str, Any]], accuracy: Any) -> list[Any]:
    curves = [(a["name"], a["node"].get("query_budget"),
               [tuple(p[:2]) for p in as_list(a["node"].get("success_by_queries"))
                if isinstance(p, list | tuple) and len(p) >= 2])
              for a in attacks]
    out = [chart_dict(figures.success_vs_queries([c for c in curves if c[2]]))]
    groups: dict[str, list[tuple[Any, Any, Any, Any]]] = {}
    norms: dict[str, Any] = {}
    for a in attacks:
        if a["attack"] and is_number(a["epsilon"]):
            ci = a["node"].get("ci95")
            lo, hi = (ci[0], ci[1]) if is_interval(ci) else (None, None)
            key = f"{a['attack']}" + (f" ({a['surrogate']})" if a["surrogate"] else "")
            groups.setdefault(key, []).append((a["epsilon"], a["node"].get("robustness_adv"),
                                               lo, hi))
            norms.setdefault(key, a["norm"])
    series = [(k, norms[k], pts) for k, pts in sorted(groups.items())
              if len({p[0] for p in pts}) >= 2]
    out.append(chart_dict(figures.robustness_vs_epsilon(series, accuracy)))
    return [c for c in out if c is not None]
