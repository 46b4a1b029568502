"""The report page's CANARY sections: CAN-1..CAN-4 per attack, and a multi-target plan's
benchmark across models (CAN-5 defence effects, CAN-7 rankings and heat maps, CAN-8 IRT
abilities, CAN-10 fast-mode rank). Pure code, no gRPC."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from fortis.services.report import figures
from fortis.services.report.page_values import (
    as_list,
    as_map,
    chart_dict,
    is_number,
    num,
    pct,
    sig,
    txt,
    value_of,
)

#: Heat maps drawn at most (one per attack).
_MAX_HEATMAPS: Final = 12

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
    value = value_of(node)
    reason = node.get("reason") if isinstance(node, Mapping) else None
    status = node.get("status") if isinstance(node, Mapping) else None
    if fmt == "ctc":
        grade = node.get("grade") if isinstance(node, Mapping) else None
        text = sig(value, 3) + (f" s ({grade})" if grade and is_number(value) else
                                " s" if is_number(value) else "")
    elif fmt == "pct":
        text = pct(value)
    elif fmt == "num":
        text = num(value, 1)
    elif fmt == "txt":
        text = txt(value)
    else:
        text = sig(value)
    n = node.get("n") if isinstance(node, Mapping) else None
    return {"text": text, "missing": value is None,
            "reason": reason or (status if status and status != "ok" else None), "n": n}


def canary_section(canary: Any, order: Sequence[str]) -> dict[str, Any] | None:
    """CAN-1 once, CAN-2..CAN-4 as one table: metrics in the paper's order, attacks in the
    attack table's order (most effective first); n/a with its reason where missing."""
    c = as_map(canary)
    attacks = {n: a for n, a in as_map(c.get("attacks")).items() if isinstance(a, Mapping)}
    model = as_map(c.get("model"))
    if not attacks and not model:
        return None
    names = [n for n in order if n in attacks] + sorted(n for n in attacks if n not in order)
    rows, notes = [], []
    known = {(g, k) for g, k, *_ in _CANARY_ROWS}
    extra = sorted({(g, k) for a in attacks.values() for g in ("effect", "cost", "perturbation")
                    for k in as_map(a.get(g)) if (g, k) not in known and k not in _CANARY_SKIP})
    # a whole group may be one "not available" node (e.g. CAN-2 of a query attack)
    whole = {(n, g): str(grp.get("reason") or grp.get("status") or "not available")
             for n in names for g in _CANARY_GROUPS
             for grp in (as_map(attacks[n].get(g)),)
             if grp and "status" in grp and not set(grp) - _CANARY_SKIP}
    notes += [f"{_CANARY_GROUPS[g]} of {n}: {why}" for (n, g), why in whole.items()]
    for group, key, label, fmt in (*_CANARY_ROWS, *((g, k, k, "sig") for g, k in extra)):
        present = [n for n in names if key in as_map(attacks[n].get(group))]
        if not present:
            continue
        cells = []
        for n in names:
            node = as_map(attacks[n].get(group)).get(key)
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
            "notes": list(dict.fromkeys(notes))[:40] + [str(x) for x in as_list(c.get("notes"))]}


# --------------------------------------------------------------------------------------------
# benchmark across models (CAN-5, 7, 8, 10)
# --------------------------------------------------------------------------------------------


def _by_rank(rank: Any, name: str) -> tuple[int, float, str]:
    """Rank 1 first; no rank (or not a number) last."""
    return (0, float(rank), name) if is_number(rank) else (1, 0.0, name)


def _ranking_rows(ranking: Any) -> list[dict[str, Any]]:
    """A CAN-7 ranking ({entries: {name: {value, n, score, rank}}}) as rows, rank 1 first."""
    entries = as_map(as_map(ranking).get("entries"))
    rows = [{"name": n, **e} for n, e in entries.items() if isinstance(e, Mapping)]
    return sorted(rows, key=lambda r: _by_rank(r.get("rank"), r["name"]))


def _irt(irt: Any) -> dict[str, Any] | None:
    """CAN-8: overall abilities, with theta +- 1.96 SD from the fit that produced them (the
    second layer, else the single first-layer fit)."""
    irt = as_map(irt)
    subjects = as_map(irt.get("subjects"))
    if not subjects:
        return None
    layer1 = {cat: as_map(fit) for cat, fit in as_map(irt.get("layer1")).items()}
    source = as_map(irt.get("layer2")) or (next(iter(layer1.values())) if len(layer1) == 1
                                           else {})
    sds = {n: as_map(s).get("theta_sd") for n, s in as_map(source.get("subjects")).items()}
    rows = []
    for name, s in subjects.items():
        s = as_map(s)
        theta = s.get("theta")
        sd: Any = s.get("theta_sd") if is_number(s.get("theta_sd")) else sds.get(name)
        lo, hi = ((theta - 1.96 * sd, theta + 1.96 * sd)
                  if is_number(theta) and is_number(sd) else (None, None))
        rows.append({"name": name, "theta": theta, "lo": lo, "hi": hi, "score": s.get("score"),
                     "rank": s.get("rank"),
                     "by_category": [as_map(as_map(fit.get("subjects")).get(name)).get("theta")
                                     for fit in layer1.values()]})
    rows.sort(key=lambda r: _by_rank(r["rank"], str(r["name"])))
    chart = figures.irt_abilities([(r["name"], r["theta"], r["lo"], r["hi"]) for r in rows])
    return {"rows": rows, "categories": list(layer1), "figure": chart_dict(chart),
            "dropped": as_list(irt.get("dropped")), "two_layers": bool(irt.get("layer2"))}


_DEFENCE_LABELS: Final = {"ARAC": "ARAC: adversarial-class confidence reduction",
                          "AITC": "AITC: true-class confidence increase"}


_DELTA_KEYS: Final = ("value", "baseline", "defended", "reason")
_CAPABILITY_DELTAS: Final = (("AV", "AV: accuracy variance (CA)"),
                             ("FV", "FV: F1 variance (CF)"),
                             ("CV", "CV: confidence variance (CC)"))
_RATIOS: Final = (("RR", "RR: rectify ratio"), ("SR", "SR: sacrifice ratio"))


def _delta_row(label: str, node: Any) -> dict[str, Any]:
    """One CAN-5 delta: its value, the baseline's and the defended model's, and the reason."""
    return {"label": label, **{k: as_map(node).get(k) for k in _DELTA_KEYS}}


def _confidence_rows(result: Mapping[str, Any], suffix: str = "") -> list[dict[str, Any]]:
    """ARAC / AITC of one CAN-5 result that has them, labelled (``suffix``: the attack)."""
    return [{"label": f"{_DEFENCE_LABELS[key]}{suffix}",
             "value": as_map(result.get(key)).get("value"),
             "reason": as_map(result.get(key)).get("reason")}
            for key in ("ARAC", "AITC") if key in result]


def _defence_pair(d: Mapping[str, Any]) -> dict[str, Any]:
    """One defended/baseline pair: AV/FV/CV, RR/SR, ACV and, per transfer attack, the ACV of
    its MR and ARAC/AITC."""
    res = as_map(d.get("result"))
    caps = [_delta_row(label, res.get(key)) for key, label in _CAPABILITY_DELTAS]
    ratios = [{"label": label, "value": as_map(res.get(key)).get("value")}
              for key, label in _RATIOS]
    acv = [_delta_row(key, node) for key, node in as_map(res.get("ACV")).items()]
    extra = _confidence_rows(res)
    for attack, r in as_map(d.get("attacks")).items():   # per transfer attack (CAN-5)
        r = as_map(r)
        acv += [_delta_row(f"{key}, {attack}", node) for key, node in as_map(r.get("ACV")).items()]
        extra += _confidence_rows(r, f", {attack}")
    # ACV / ARAC / AITC that were not computed (no attack report given) are left out
    acv = [r for r in acv if any(r.get(k) is not None for k in _DELTA_KEYS[:3])]
    extra = [r for r in extra if r["value"] is not None]
    return {"baseline": d.get("baseline"), "defended": d.get("defended"), "caps": caps,
            "ratios": ratios, "acv": acv, "extra": extra, "n": res.get("n")}


def _defence(defence: Any) -> list[dict[str, Any]]:
    """CAN-5 per defended/baseline pair (:func:`_defence_pair`)."""
    return [_defence_pair(d) for d in as_list(defence) if isinstance(d, Mapping)]


def _heatmaps(bench: Mapping[str, Any]) -> list[dict[str, Any]]:
    metric = str(bench.get("metric") or "MR")
    maps = as_map(as_map(bench.get("twoway")).get("heatmaps"))
    charts = []
    if maps:
        for attack, h in list(maps.items())[:_MAX_HEATMAPS]:
            h = as_map(h)
            charts.append(figures.transfer_heatmap(attack, str(h.get("metric") or metric),
                                                   [str(x) for x in as_list(h.get("rows"))],
                                                   [str(x) for x in as_list(h.get("cols"))],
                                                   [as_list(r) for r in as_list(h.get("values"))]))
    else:   # the K x S x M matrix: crafted on each source (surrogate), evaluated on each model
        models = [str(x) for x in as_list(bench.get("model_names"))]
        sources = [str(x) for x in as_list(bench.get("sources"))]
        matrix = as_list(bench.get("matrix"))
        for k, attack in enumerate(as_list(bench.get("attacks"))[:_MAX_HEATMAPS]):
            if k < len(matrix):
                block = [as_list(r) for r in as_list(matrix[k])]
                rows = sources if sources and len(sources) == len(block) else models
                charts.append(figures.transfer_heatmap(str(attack), metric, rows, models,
                                                       block))
    return [c for c in (chart_dict(x) for x in charts) if c is not None]


def _model_attack(model: Mapping[str, Any], attack: str) -> Mapping[str, Any]:
    """One model's metrics of an attack: the attack by name, or (a transfer attack of a
    multi-target plan, named ``attack.surrogate``) crafted on the model's own surrogate."""
    runs = as_map(model.get("attacks"))
    return as_map(runs.get(attack)) or as_map(runs.get(f"{attack}.{model.get('surrogate')}"))


def benchmark_section(benchmark: Any) -> dict[str, Any] | None:
    b = as_map(benchmark)
    models = [m for m in as_list(b.get("models")) if isinstance(m, Mapping)]
    if not models and not b.get("matrix"):
        return None
    attacks = [str(a) for a in as_list(b.get("attacks"))]

    def robust(m: Mapping[str, Any]) -> tuple[int, float, str]:
        v = as_map(m.get("average_robustness_adv")).get("value")
        return (0, -float(v), str(m.get("name"))) if is_number(v) else (1, 0.0,
                                                                        str(m.get("name")))

    rows = [{"name": m.get("name"), "surrogate": m.get("surrogate"), "defends": m.get("defends"),
             "accuracy": as_map(m.get("accuracy")),
             "corr": as_map(m.get("average_robustness_corr")).get("value"),
             "adv": as_map(m.get("average_robustness_adv")).get("value"),
             "attacks": [_model_attack(m, a) for a in attacks]}
            for m in sorted(models, key=robust)]
    twoway = as_map(b.get("twoway"))
    tw, tr = as_map(twoway.get("two_way")), as_map(twoway.get("transfer"))
    fast = as_map(b.get("fast"))
    return {"mode": b.get("mode"), "metric": b.get("metric") or "MR", "attacks": attacks,
            "rows": rows, "heatmaps": _heatmaps(b),
            "model_ranking": _ranking_rows(tw.get("model_robustness")),
            "attack_ranking": _ranking_rows(tw.get("attack_effectiveness")),
            "transfer_attacks": _ranking_rows(tr.get("attack_transferability")),
            "transfer_models": _ranking_rows(tr.get("model_transfer_robustness")),
            "irt": _irt(b.get("irt")), "defence": _defence(b.get("defence")),
            "fast": fast or None, "baseline": b.get("baseline_evaluation"),
            "notes": [str(n) for n in as_list(b.get("notes"))]}
