"""``fortis compare A.json B.json``: what changed between two evaluations of the same plan
(e.g. two versions of a model: the same plan with another target), and which changes hold
once the number of comparisons is accounted for.

Every metric with a rate is compared: accuracy (IEEE-M1), each corruption severity (IEEE-M2,
M7) and mean, the averages and worst cases (IEEE-M2..M5), each attack's robustness and success
rate (IEEE-M3, M6). The test, stated on every row:

- ``McNemar exact (paired)`` when both reports carry per-image outcomes (report.json
  ``outcomes``) over the same image ids (in any order) and the metric is a per-image rate:
  the images whose outcome differs, b (1 in A, 0 in B) and c (0 in A, 1 in B), give
  p = min(1, 2 P(X <= min(b, c))), X ~ Bin(b + c, 1/2) (``services/common/paired_tests.py``).
  Two evaluations of one plan judge the same images, so this is the test of the design: the
  images both got right or both got wrong say nothing about the difference. Success rates are
  compared over the images both evaluations attacked (right on the clean image).
- ``two-proportion z-test`` where both reports give the counts (correct of m) but no usable
  outcomes (the row says why): pooled p = (x_A + x_B) / (n_A + n_B),
  z = (p_B - p_A) / sqrt(p (1 - p) (1/n_A + 1/n_B)), two-sided p-value = erfc(|z| / sqrt 2).
  It treats the evaluations as independent samples.
- ``CI overlap`` where there are 95 % intervals but no counts: significant when the intervals
  do not overlap (no p-value, so it cannot be adjusted: outside an adjusted family).
- ``no test`` where neither exists (averages over settings, a corruption's mean over its
  severities: the severities share their images, so pooling their counts is not a test).

Family control (``family``): ~90 metrics tested at alpha 0.05 each flag some change by chance
in most comparisons of a model with itself, so significance is read from p-values adjusted
over the family of metrics the gate reads (all compared metrics, or those matching
``metrics`` globs, e.g. the plan's acceptance criteria): ``holm`` (default; family-wise error
rate <= alpha under any dependence), ``bh`` (Benjamini-Hochberg: false discovery rate <= alpha
for independent or positively dependent tests) or ``none`` (each at alpha, the old rule).
Rows outside the family are shown with their raw p-value and never flag.

Warnings when the plans differ beyond ``target``/``targets``/``name``/``description`` or the
evaluations used different images. Rows are sorted significant first, then by the size of the
change. ``--fail-on-regression`` exits 4 when B is significantly worse than A on a metric of
the family (lower robustness or accuracy, higher attack success rate).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from fortis.server.cli.report_doc import number as _f
from fortis.services.common.paired_tests import FAMILIES, adjust, mcnemar_exact, paired_counts

__all__ = ["EXIT_REGRESSION", "MAX_REPORT_BYTES", "cmd_compare", "compare_reports",
           "read_outcomes", "two_proportion_z"]

#: Exit code of ``--fail-on-regression`` when B is significantly worse on some metric.
EXIT_REGRESSION: Final = 4
#: A report.json larger than this is refused before it is parsed (a 10,000-image evaluation
#: with 75 settings is ~2 MB).
MAX_REPORT_BYTES: Final = 256 * 1024 * 1024
#: Bounds on a report's ``outcomes`` (images, settings), so a hostile file fails fast.
MAX_OUTCOME_IMAGES: Final = 2_000_000
MAX_OUTCOME_SETTINGS: Final = 10_000
PAIRED: Final = "McNemar exact (paired)"
Z_TEST: Final = "two-proportion z-test"
_PLAN_IGNORED: Final = frozenset({"target", "targets", "name", "description"})
_AVERAGES: Final = ("average_robustness_corr", "average_robustness_adv")
_ATTACK_KINDS: Final = ("transfer_attack", "query_attack")
_KINDS: Final = frozenset({"clean", "corruption", "degradation", *_ATTACK_KINDS})
_GLOBAL: Final = ("accuracy", *_AVERAGES, "worstcase_robustness_corr", "worstcase_robustness_adv")
_FAMILY_TEXT: Final = {
    "holm": "Holm step-down: family-wise error rate (any false flag) <= alpha",
    "bh": "Benjamini-Hochberg: false discovery rate (share of false flags) <= alpha",
    "none": "none: each metric at alpha (about alpha x family size false flags expected)"}


def two_proportion_z(x1: int, n1: int, x2: int, n2: int) -> tuple[float, float]:
    """The pooled two-proportion z statistic of ``x2/n2`` against ``x1/n1`` and its two-sided
    p-value (z = 0, p = 1 when the pooled rate is 0 or 1: no variation to test)."""
    if n1 <= 0 or n2 <= 0:
        raise ValueError("both samples need at least one image")
    p = (x1 + x2) / (n1 + n2)
    se = math.sqrt(p * (1.0 - p) * (1.0 / n1 + 1.0 / n2))
    if se == 0.0:
        return 0.0, 1.0
    z = (x2 / n2 - x1 / n1) / se
    return z, math.erfc(abs(z) / math.sqrt(2.0))


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _ci(value: Any) -> list[float] | None:
    if isinstance(value, list | tuple) and len(value) == 2:
        lo, hi = _f(value[0]), _f(value[1])
        if lo is not None and hi is not None and lo <= hi:
            return [lo, hi]
    return None


def _node(tree: Any, *keys: str) -> Mapping[str, Any]:
    for k in keys:
        tree = tree.get(k) if isinstance(tree, Mapping) else None
    return tree if isinstance(tree, Mapping) else {}


#: A measured rate: (value, ci95, successes, trials); higher_is_better.
_Rate = tuple[float | None, list[float] | None, int | None, int | None]
#: Where a metric's per-image outcomes come from: ("setting", kinds, name, level),
#: ("worst", kinds), ("success", attack name) or None (not a per-image rate).
_Source = tuple[Any, ...] | None


def _rates(metrics: Mapping[str, Any]) -> Iterator[tuple[str, _Rate, bool, _Source]]:
    """Every (metric path, rate, higher is better, per-image source) of a metrics tree."""
    acc = _node(metrics, "accuracy")
    yield "accuracy", (_f(acc.get("value")), _ci(acc.get("ci95")), _count(acc.get("correct")),
                       _count(acc.get("m"))), True, ("setting", ("clean",), "", 0)
    for name in _AVERAGES:
        node = _node(metrics, name)
        if node:
            yield name, (_f(node.get("value")), None, None, None), True, None
    for name, kinds in (("worstcase_robustness_corr", ("corruption",)),
                        ("worstcase_robustness_adv", _ATTACK_KINDS)):
        node = _node(metrics, name)
        if node:
            yield name, (_f(node.get("value")), _ci(node.get("ci95")),
                         _count(node.get("correct")), _count(node.get("m"))), True, \
                ("worst", kinds)
    for cid, node in _node(metrics, "corruptions").items():
        if not isinstance(node, Mapping):
            continue
        for sev in sorted((k for k in node if str(k).isdigit()), key=int):
            s = _node(node, sev)
            yield f"corruptions.{cid}.{sev}", (
                _f(s.get("robustness")), _ci(s.get("ci95")), _count(s.get("correct")),
                _count(s.get("m"))), True, ("setting", ("corruption",), str(cid), int(sev))
        mean = _node(node, "mean")
        if mean:
            yield f"corruptions.{cid}.mean", (_f(mean.get("robustness")), _ci(mean.get("ci95")),
                                              None, None), True, None
    for name, a in _node(metrics, "attacks").items():
        if not isinstance(a, Mapping):
            continue
        yield f"attacks.{name}.robustness_adv", (
            _f(a.get("robustness_adv")), _ci(a.get("ci95")), _count(a.get("correct")),
            _count(a.get("m"))), True, ("setting", _ATTACK_KINDS, str(name), 0)
        yield f"attacks.{name}.success_rate", (
            _f(a.get("success_rate")), _ci(a.get("success_rate_ci95")),
            _count(a.get("successes")), _count(a.get("success_rate_n"))), False, \
            ("success", str(name))


# -- per-image outcomes --------------------------------------------------------------------

@dataclass(frozen=True)
class Outcomes:
    """A report's per-image outcomes, checked: the image ids and each setting's string."""

    image_ids: list[str]
    settings: dict[tuple[str, str, int], str]

    def reordered(self, order: Sequence[int]) -> Outcomes:
        """The same outcomes with the images in ``order`` (indices into ``image_ids``)."""
        return Outcomes([self.image_ids[k] for k in order],
                        {key: "".join(s[k] for k in order) for key, s in self.settings.items()})


def read_outcomes(report: Mapping[str, Any], side: str) -> Outcomes | None:
    """The checked ``outcomes`` of a report document (None when it has none); ValueError
    naming ``<side>: outcomes...`` and what is wrong when it is malformed."""
    raw = report.get("outcomes")
    if raw is None:
        return None
    where = f"{side}: outcomes"
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be an object, not {type(raw).__name__}")
    ids = raw.get("image_ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValueError(f"{where}.image_ids must be a list of strings")
    n = len(ids)
    if n > MAX_OUTCOME_IMAGES:
        raise ValueError(f"{where}.image_ids has {n} images, more than {MAX_OUTCOME_IMAGES}")
    if len(set(ids)) != n:
        raise ValueError(f"{where}.image_ids must be unique")
    raw_settings = raw.get("settings")
    if not isinstance(raw_settings, list):
        raise ValueError(f"{where}.settings must be a list")
    if len(raw_settings) > MAX_OUTCOME_SETTINGS:
        raise ValueError(f"{where}.settings has {len(raw_settings)} entries, more than "
                         f"{MAX_OUTCOME_SETTINGS}")
    settings: dict[tuple[str, str, int], str] = {}
    for j, s in enumerate(raw_settings):
        path = f"{where}.settings[{j}]"
        if not isinstance(s, Mapping):
            raise ValueError(f"{path} must be an object")
        kind, name, level, out = s.get("kind"), s.get("name"), s.get("level"), s.get("outcomes")
        if kind not in _KINDS:
            raise ValueError(f"{path}.kind must be one of {', '.join(sorted(_KINDS))}")
        if not isinstance(name, str):
            raise ValueError(f"{path}.name must be a string")
        if isinstance(level, bool) or not isinstance(level, int):
            raise ValueError(f"{path}.level must be an integer")
        if not isinstance(out, str):
            raise ValueError(f"{path}.outcomes must be a string, not {type(out).__name__}")
        if len(out) != n:
            raise ValueError(f"{path}.outcomes has {len(out)} characters for {n} images "
                             "(one per image of image_ids)")
        if out.strip("10-"):
            raise ValueError(f"{path}.outcomes may hold only '1', '0' and '-'")
        if (kind, name, level) in settings:
            raise ValueError(f"{path}: setting {kind}/{name}/{level} given twice")
        settings[(kind, name, level)] = out
    return Outcomes(list(ids), settings)


def _pairing(oa: Outcomes | None, ob: Outcomes | None
             ) -> tuple[Outcomes | None, Outcomes | None, str]:
    """A's and B's outcomes over the same images in A's order, or (None, None, why not)."""
    if oa is None or ob is None:
        which = "A and B" if oa is None and ob is None else "A" if oa is None else "B"
        verb = "carry" if oa is None and ob is None else "carries"
        return None, None, f"{which} {verb} no per-image outcomes"
    if oa.image_ids == ob.image_ids:
        return oa, ob, ""
    if set(oa.image_ids) != set(ob.image_ids):
        common = len(set(oa.image_ids) & set(ob.image_ids))
        return None, None, (f"the reports' image ids differ ({common} in common of "
                            f"{len(oa.image_ids)} and {len(ob.image_ids)})")
    where = {i: k for k, i in enumerate(ob.image_ids)}
    return oa, ob.reordered([where[i] for i in oa.image_ids]), ""


def _combine(strings: Sequence[str]) -> str:
    """Per image: '-' if any setting did not cover it, '1' if all were right, else '0'."""
    out = []
    for chars in zip(*strings, strict=True):
        out.append("-" if "-" in chars else "0" if "0" in chars else "1")
    return "".join(out)


def _per_image(o: Outcomes, source: tuple[Any, ...]) -> str | None:
    """The per-image outcome string a metric counts ('1' counted), or None when the
    outcomes lack a setting it needs."""
    if source[0] == "setting":
        _, kinds, name, level = source
        found = [o.settings[(k, name, level)] for k in kinds if (k, name, level) in o.settings]
        return found[0] if len(found) == 1 else None
    if source[0] == "worst":
        strings = [s for (k, _, _), s in o.settings.items() if k in source[1]]
        return _combine(strings) if strings else None
    clean = o.settings.get(("clean", "", 0))
    attack = [o.settings[(k, source[1], 0)] for k in _ATTACK_KINDS
              if (k, source[1], 0) in o.settings]
    if clean is None or len(attack) != 1:
        return None
    # attacked: right on the clean image and covered; a success: not robust after the attack
    return "".join("-" if c != "1" or a == "-" else "1" if a == "0" else "0"
                   for c, a in zip(clean, attack[0], strict=True))


def _paired(source: _Source, oa: Outcomes, ob: Outcomes, ra: _Rate, rb: _Rate
            ) -> tuple[tuple[int, int, int] | None, str]:
    """(pairs, b, c) of a metric's per-image outcomes in A and B, or (None, why not)."""
    if source is None:
        return None, "not a per-image rate"
    strings = []
    for side, o, (_, _, x, n) in (("A", oa, ra), ("B", ob, rb)):
        s = _per_image(o, source)
        if s is None:
            return None, f"{side}'s outcomes lack the setting(s) of this metric"
        ones, zeros = s.count("1"), s.count("0")
        if x is not None and n is not None and (ones, ones + zeros) != (x, n):
            return None, (f"{side}'s outcomes ({ones}/{ones + zeros}) do not reproduce its "
                          f"counts ({x}/{n}; images left out or failed queries)")
        strings.append(s)
    return paired_counts(strings[0], strings[1]), ""


# -- rows and the family -------------------------------------------------------------------

def _row(metric: str, a: _Rate, b: _Rate, higher_better: bool, source: _Source,
         oa: Outcomes | None, ob: Outcomes | None, no_pairs: str) -> dict[str, Any]:
    (va, ca, xa, na), (vb, cb, xb, nb) = a, b
    row: dict[str, Any] = {"metric": metric, "a": va, "b": vb, "a_ci95": ca, "b_ci95": cb,
                           "difference": None, "test": "no test", "z": None, "p_value": None,
                           "p_adjusted": None, "in_family": False, "significant": False,
                           "change": "n/a", "regression": False}
    if va is None or vb is None:
        row["test"] = "missing in " + ("both" if va is None and vb is None else
                                       "A" if va is None else "B")
        return row
    row["difference"] = vb - va
    counted = xa is not None and na and xb is not None and nb and xa <= na and xb <= nb
    pairs, why = (None, no_pairs) if oa is None or ob is None else \
        _paired(source, oa, ob, a, b)
    if pairs is not None and pairs[0] > 0:
        n, bb, cc = pairs
        row.update(test=PAIRED, p_value=mcnemar_exact(bb, cc),
                   paired={"images": n, "a_not_b": bb, "b_not_a": cc})
        if counted:
            row.update(a_counts=[xa, na], b_counts=[xb, nb])
    elif counted:
        assert xa is not None and na and xb is not None and nb
        z, p = two_proportion_z(xa, na, xb, nb)
        row.update(test=Z_TEST, z=z, p_value=p, a_counts=[xa, na], b_counts=[xb, nb],
                   unpaired_because=why if pairs is None else "no image both evaluations "
                   "covered")
    elif ca is not None and cb is not None:
        row.update(test="CI overlap", ci_disjoint=ca[1] < cb[0] or cb[1] < ca[0])
    better = (vb > va) if higher_better else (vb < va)
    row["change"] = "same" if vb == va else "better" if better else "worse"
    return row


def _apply_family(rows: list[dict[str, Any]], family: str, alpha: float,
                  globs: Sequence[str] | None) -> list[str]:
    """Adjust the family's p-values in place and set ``significant``/``regression``;
    returns the family's metrics."""
    def gated(metric: str) -> bool:
        return globs is None or any(fnmatch.fnmatchcase(metric, g) for g in globs)

    members = [r for r in rows if r["p_value"] is not None and gated(r["metric"])]
    for r, p in zip(members, adjust([r["p_value"] for r in members], family), strict=True):
        r.update(in_family=True, p_adjusted=p, significant=p < alpha)
    if family == "none":        # no adjustment: the interval rule may gate too
        for r in rows:
            if r["test"] == "CI overlap" and gated(r["metric"]):
                r.update(in_family=True, significant=r["ci_disjoint"])
    for r in rows:
        r["regression"] = bool(r["significant"] and r["change"] == "worse")
    return [r["metric"] for r in rows if r["in_family"]]


def _plan_without_target(report: Mapping[str, Any]) -> dict[str, Any]:
    plan = report.get("plan")
    return {k: v for k, v in plan.items() if k not in _PLAN_IGNORED} \
        if isinstance(plan, Mapping) else {}


def _side(report: Mapping[str, Any]) -> dict[str, Any]:
    return {"evaluation": _node(report, "evaluation").get("id"),
            "plan": _node(report, "plan").get("name"),
            "target": _node(report, "target").get("name"),
            "images": _node(report, "evaluation").get("images")}


def acceptance_metrics(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The metric paths of the plans' acceptance criteria (B's plan, else A's)."""
    for report in (b, a):
        acc = _node(report, "plan", "acceptance")
        keys = [k for k in acc if isinstance(k, str) and ("." in k or k in _GLOBAL)]
        if keys:
            return keys
    return []


def _stopped_early(report: Mapping[str, Any]) -> list[str]:
    """The settings a sequential run stopped early (report.json ``sequential``)."""
    seq = report.get("sequential")
    rows = seq.get("settings") if isinstance(seq, Mapping) else None
    if not isinstance(rows, list):
        return []
    return [str(r.get("setting"))[:60] for r in rows
            if isinstance(r, Mapping) and r.get("stopped_early") is True][:1000]


def compare_reports(a: Mapping[str, Any], b: Mapping[str, Any], *, alpha: float = 0.05,
                    family: str = "holm", metrics: Sequence[str] | None = None
                    ) -> dict[str, Any]:
    """The comparison (module docstring) of two report documents, B against A. ``metrics``:
    globs of the metrics the gate reads (the family); None: every compared metric.
    ValueError naming the option or the report's field when something is wrong."""
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0.0 < alpha < 1.0:
        raise ValueError("alpha: must be between 0 and 1")
    if family not in FAMILIES:
        raise ValueError(f"family: must be one of {', '.join(FAMILIES)}")
    oa, ob = read_outcomes(a, "a"), read_outcomes(b, "b")
    warnings: list[str] = []
    pa, pb = _plan_without_target(a), _plan_without_target(b)
    if pa != pb:
        keys = sorted(k for k in set(pa) | set(pb) if pa.get(k) != pb.get(k))
        warnings.append("the plans differ beyond the target: " + ", ".join(keys)[:300]
                        + " (the comparison may not be like for like)")
    da, db = _node(a, "evaluation").get("dataset"), _node(b, "evaluation").get("dataset")
    if da != db:
        warnings.append(f"the image sets differ: A {json.dumps(da)[:200]}, "
                        f"B {json.dumps(db)[:200]}")
    elif _node(a, "evaluation").get("images") != _node(b, "evaluation").get("images"):
        warnings.append("the evaluations scored different numbers of images")
    for side, rep in (("A", a), ("B", b)):
        stopped = _stopped_early(rep)
        if stopped:
            warnings.append(
                f"{side} is a sequential run: {len(stopped)} setting(s) were sent only their "
                f"first images ({', '.join(stopped[:4])}{' ...' if len(stopped) > 4 else ''}); "
                "their values are over those images, the paired tests over the images both "
                "reports covered")
    pa_out, pb_out, no_pairs = _pairing(oa, ob)
    if no_pairs:
        warnings.append(f"no paired test: {no_pairs}; the unpaired z-test is used")
    ra = {name: (rate, hb, src) for name, rate, hb, src in _rates(_node(a, "metrics"))}
    rb = {name: (rate, hb, src) for name, rate, hb, src in _rates(_node(b, "metrics"))}
    empty: _Rate = (None, None, None, None)
    rows = []
    for name in list(ra) + [n for n in rb if n not in ra]:
        _, hb, src = ra.get(name) or rb[name]
        rows.append(_row(name, ra[name][0] if name in ra else empty,
                         rb[name][0] if name in rb else empty, hb, src, pa_out, pb_out,
                         no_pairs))
    if metrics is not None:
        unmatched = [g for g in metrics
                     if not any(fnmatch.fnmatchcase(r["metric"], g) for r in rows)]
    gated = _apply_family(rows, family, alpha, metrics)
    rows.sort(key=lambda r: (not r["significant"], -abs(r["difference"] or 0.0), r["metric"]))
    fam: dict[str, Any] = {"control": family, "description": _FAMILY_TEXT[family],
                           "alpha": alpha, "metrics": list(metrics) if metrics is not None
                           else "all", "size": len(gated)}
    if metrics is not None and unmatched:
        fam["not_compared"] = unmatched
    return {"a": _side(a), "b": _side(b), "alpha": alpha, "family": fam,
            "paired": not no_pairs, "warnings": warnings,
            "tests": {PAIRED: "exact binomial test on the images whose outcome differs "
                      "(b, c): p = min(1, 2 P(X <= min(b, c))), X ~ Bin(b + c, 1/2)",
                      Z_TEST: "pooled, two-sided, on correct/m counts (independent samples)",
                      "CI overlap": "the 95% intervals do not overlap (no p-value)",
                      "no test": "no counts and no interval (averages, means over severities)"},
            "rows": rows, "regressions": sum(r["regression"] for r in rows)}


def _fmt(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _p(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}" if v >= 1e-4 else f"{v:.1e}"


def format_table(result: Mapping[str, Any]) -> str:
    """The comparison as a readable table."""
    a, b, fam = result["a"], result["b"], result["family"]
    lines = [f"A: {a['evaluation']} (target {a['target']}, plan {a['plan']}, "
             f"{a['images']} images)",
             f"B: {b['evaluation']} (target {b['target']}, plan {b['plan']}, "
             f"{b['images']} images)"]
    lines += [f"warning: {w}" for w in result["warnings"]]
    width = max([len(r["metric"]) for r in result["rows"]] + [6])
    lines.append(f"{'metric':<{width}}  {'A':>7}  {'B':>7}  {'B-A':>8}  {'p':>8}  {'p adj':>8}  "
                 f"{'test':<22}  result")
    for r in result["rows"]:
        diff = "-" if r["difference"] is None else f"{r['difference']:+.4f}"
        if r["significant"]:
            verdict = "SIGNIFICANT, " + r["change"]
        elif r["test"] in (PAIRED, Z_TEST, "CI overlap") and r["change"] != "same":
            verdict = r["change"] + (", not significant" if r["in_family"] else ", not gated")
        else:
            verdict = r["change"] + (" (untested)" if r["change"] in ("better", "worse") else "")
        if r.get("unpaired_because"):
            verdict += f" [unpaired: {r['unpaired_because']}]"
        lines.append(f"{r['metric']:<{width}}  {_fmt(r['a']):>7}  {_fmt(r['b']):>7}  "
                     f"{diff:>8}  {_p(r['p_value']):>8}  {_p(r['p_adjusted']):>8}  "
                     f"{r['test']:<22}  {verdict}")
    n_sig = sum(r["significant"] for r in result["rows"])
    n_paired = sum(r["test"] == PAIRED for r in result["rows"])
    n_z = sum(r["test"] == Z_TEST for r in result["rows"])
    lines.append(f"family: {fam['size']} metric(s) ({'all compared' if fam['metrics'] == 'all' else ', '.join(fam['metrics'])}); "
                 f"{fam['description']}")
    if fam.get("not_compared"):
        lines.append("not compared (no such rate in the reports): "
                     + ", ".join(fam["not_compared"]))
    lines.append(f"{n_sig} significant change(s) at alpha {result['alpha']:g} "
                 f"({fam['control']}), {result['regressions']} of them worse in B; "
                 f"{n_paired} row(s) by the paired McNemar test, {n_z} by the z-test")
    return "\n".join(lines)


def _load(path: str) -> dict[str, Any]:
    p = Path(path)
    size = p.stat().st_size
    if size > MAX_REPORT_BYTES:
        raise ValueError(f"{size} bytes, more than {MAX_REPORT_BYTES} (not a report.json)")
    try:
        doc = json.loads(p.read_bytes())
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("metrics"), dict):
        raise ValueError("not a Fortis report.json (no metrics)")
    return doc


def cmd_compare(ns: argparse.Namespace) -> int:
    from fortis.server.cli.output import EXIT_BAD_INPUT, err

    reports = []
    for field, path in (("a", ns.a), ("b", ns.b)):
        try:
            reports.append(_load(path))
        except (OSError, ValueError) as exc:     # JSONDecodeError and UnicodeError included
            err(f"{field}: cannot read report {path}: {exc}")
            return EXIT_BAD_INPUT
    metrics: list[str] | None = list(ns.metrics) if ns.metrics else None
    if ns.gate == "acceptance":
        keys = acceptance_metrics(reports[0], reports[1])
        if not keys:
            err("--gate acceptance: neither plan has acceptance criteria")
            return EXIT_BAD_INPUT
        metrics = (metrics or []) + keys
    try:
        result = compare_reports(reports[0], reports[1], alpha=ns.alpha, family=ns.family,
                                 metrics=metrics)
    except ValueError as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    if ns.metrics and result["family"].get("not_compared"):
        bad = [g for g in ns.metrics if g in result["family"]["not_compared"]]
        if bad:
            err(f"--metrics: {', '.join(bad)} matches no compared metric")
            return EXIT_BAD_INPUT
    print(json.dumps(result, indent=2) if ns.json else format_table(result))
    return EXIT_REGRESSION if ns.fail_on_regression and result["regressions"] else 0


def add_parser(sub: Any) -> None:
    sp = sub.add_parser("compare", help="what changed between two evaluations of the same plan "
                        "(report.json files): a paired McNemar test per metric where both "
                        "carry per-image outcomes, with family-wise control")
    sp.add_argument("a", help="report.json of the reference evaluation (A)")
    sp.add_argument("b", help="report.json of the new evaluation (B)")
    sp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    sp.add_argument("--alpha", type=float, default=0.05,
                    help="significance level, after the family adjustment (default 0.05)")
    sp.add_argument("--family", choices=FAMILIES, default="holm",
                    help="control over the family of gated metrics: holm (family-wise error "
                    "rate, default), bh (Benjamini-Hochberg false discovery rate), none")
    sp.add_argument("--metrics", nargs="+", metavar="GLOB",
                    help="the metrics the gate reads (the family), as globs, e.g. "
                    "'accuracy' 'corruptions.*'; default: every compared metric")
    sp.add_argument("--gate", choices=("all", "acceptance"), default="all",
                    help="acceptance: the family is the plan's acceptance criteria metrics "
                    "(with --metrics: both)")
    sp.add_argument("--fail-on-regression", action="store_true",
                    help=f"exit {EXIT_REGRESSION} when B is significantly worse on a metric "
                    "of the family")
    sp.set_defaults(fn=cmd_compare)
