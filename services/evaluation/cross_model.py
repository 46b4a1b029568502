"""The cross-model section of a multi-target plan's report (CANARY, CAN-5/7/8/10), computed
from what every model's run returned (``runner.ModelRun``), once they all ran: the K x S x M
misclassification-ratio matrix (CAN-7), the two-way squeeze and transfer heat maps, IRT
abilities (CAN-8), defence effects (CAN-5) and, in fast mode, the new model's rank against a
baseline's stored matrix (CAN-10). Every metric is the scoring service's (``Compute``): this
module arranges its inputs, never judges an answer nor imports scoring code.

Domain code: ports only, no gRPC.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog
from fortis.core.strategy import strategy
from fortis.core.task import Task
from fortis.services.common import errors
from fortis.services.evaluation.answers import ClassAnswers
from fortis.services.evaluation.convert import setting_verdicts
from fortis.services.evaluation.plan import AttackTest, Member, Plan, crafted_on
from fortis.services.evaluation.ports import (
    Catalogue,
    Scored,
    ScoringPort,
    Setting,
    TargetDescription,
)
from fortis.services.evaluation.runner import ModelRun

__all__ = ["MATRIX_METRIC", "NOT_APPLICABLE", "CrossModel", "MemberResult", "is_transfer",
           "transfer_matrix"]

log = structlog.get_logger("fortis.evaluation.benchmark")

#: The metric of the data matrix: CANARY's misclassification ratio (CAN-2), our success rate.
MATRIX_METRIC = "MR"
#: A metric that has no meaning for the target's task (CANARY's node status).
NOT_APPLICABLE = "not applicable"


def is_transfer(at: AttackTest, catalogue: Catalogue) -> bool:
    """Whether ``at`` is crafted on a surrogate (a transfer attack), not run on the target."""
    entry = catalogue.attacks.get(at.id)
    return entry is not None and entry.needs_surrogate


@dataclass(frozen=True, kw_only=True)
class MemberResult:
    """What one model's run left for the cross-model section."""

    member: Member
    scored: Scored
    settings: Sequence[Setting]
    labels: np.ndarray                  # N true labels (first label of each image)
    target: TargetDescription

    @classmethod
    def of(cls, member: Member, run: ModelRun) -> MemberResult:
        labels = np.array([lab[0] if len(lab) else -1 for _, _, lab in run.images])
        return cls(member=member, scored=run.scored, settings=run.settings, labels=labels,
                   target=run.target)


def _rate(r: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"value": r.value if r.HasField("value") else None, "ci95": None,
                           "m": int(r.m)}
    if r.HasField("ci95_low") and r.HasField("ci95_high"):
        out["ci95"] = [r.ci95_low, r.ci95_high]
    if r.HasField("correct"):
        out["correct"] = int(r.correct)
    return out


def _avg(a: Any) -> dict[str, Any]:
    return {"value": a.value if a.HasField("value") else None}


def _summary(res: MemberResult) -> dict[str, Any]:
    ieee = res.scored.metrics.ieee
    attacks = {}
    for a in ieee.attacks:
        s = _rate(a.success)
        attacks[a.name] = {"success_rate": s["value"], "success_rate_ci95": s["ci95"],
                           "robustness_adv": _rate(a.robustness_adv)["value"]}
    return {"name": res.member.name, "surrogate": res.member.surrogate or None,
            "defends": res.member.defends or None, "accuracy": _rate(ieee.accuracy),
            "average_robustness_corr": _avg(ieee.average_robustness_corr),
            "average_robustness_adv": _avg(ieee.average_robustness_adv),
            "corruptions": {c.name: c.mean_robustness for c in ieee.corruptions},
            "attacks": attacks}


def _success(res: MemberResult, name: str) -> float:
    for a in res.scored.metrics.ieee.attacks:
        if a.name == name and a.success.HasField("value"):
            return float(a.success.value)
    return math.nan


def transfer_matrix(plan: Plan, catalogue: Catalogue, results: Sequence[MemberResult],
                    sources: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """The K x S x M matrix of MR (CAN-7): attack k crafted on source model i (its surrogate
    ``sources[i]``), evaluated on model j; NaN where not run. A query attack's values sit on
    the diagonal (a model's own surrogate row); a transfer attack with a fixed surrogate fills
    that surrogate's row only."""
    names = [a.name for a in plan.attacks]
    values = np.full((len(names), len(sources), len(results)), np.nan)
    for k, at in enumerate(plan.attacks):
        transfer = is_transfer(at, catalogue)
        for j, res in enumerate(results):
            if not transfer:
                if j < len(sources):
                    values[k, j, j] = _success(res, at.name)
                continue
            for i, s in enumerate(sources):
                if at.surrogate:
                    if at.surrogate == s:
                        values[k, i, j] = _success(res, at.name)
                else:
                    values[k, i, j] = _success(res, crafted_on(at.name, s))
    return names, values


def _probabilities(answers: Any, n_classes: int) -> np.ndarray | None:
    """N x C probabilities from ranked classification answers (top-k: the rest 0); None for
    labels-only answers."""
    if not isinstance(answers, ClassAnswers) or answers.scores is None:
        return None
    out = np.zeros((answers.n, n_classes), dtype=np.float64)
    for i in range(answers.n):
        for lab, sc in zip(answers.labels[i], answers.scores[i], strict=False):
            if 0 <= lab < n_classes and np.isfinite(sc):
                out[i, int(lab)] = float(sc)
    return out


def _setting(res: MemberResult, kind: str, name: str = "") -> Setting | None:
    for s in res.settings:
        if s.kind == kind and (not name or s.name == name):
            return s
    return None


def _jsonable(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.floating | np.integer):
        return _jsonable(x.item())
    return x



@dataclass(kw_only=True)
class CrossModel:
    """Computes the cross-model section of ``plan`` (a multi-target or fast-mode plan) from
    its models' results, through the scoring service's ``Compute``."""

    plan: Plan
    catalogue: Catalogue
    scoring: ScoringPort
    #: IRT sampler length (CAN-8); the seed's 7000/3000 by default.
    irt_chain: int = 7000
    irt_burn_in: int = 3000

    def _compute(self, metric: str, arrays: Mapping[str, np.ndarray],
                 params: Mapping[str, Any], notes: list[str]) -> Any:
        compute = getattr(self.scoring, "compute", None)
        if compute is None:
            notes.append(f"{metric}: the scoring port offers no Compute")
            return None
        try:
            return compute(metric, arrays, params)
        except errors.FortisError as exc:
            notes.append(f"{metric}: {exc}")
            log.warning("benchmark metric failed", metric=metric, error=str(exc)[:300])
            return None

    def section(self, results: Sequence[MemberResult], sources: list[str],
                baseline: Mapping[str, Any] | None) -> dict[str, Any]:
        """The report's ``benchmark`` section from every model's result (in the plan's model
        order), the surrogates transfer attacks were crafted on, and (fast mode) the
        baseline evaluation's stored section."""
        plan, cat = self.plan, self.catalogue
        members = list(plan.members)
        notes: list[str] = []
        names, values = transfer_matrix(plan, cat, results, sources)
        model_names = [m.name for m in members]
        if plan.target.task != Task.CLASSIFICATION:
            notes.append(f"MR on {plan.target.task} targets: the share of the images a model "
                         "answered correctly under the plan's "
                         f"{strategy(plan.target.task).rule_id} rule that the "
                         "attack's examples make it answer wrongly")
        out: dict[str, Any] = {
            "mode": "fast" if baseline is not None else "benchmark", "metric": MATRIX_METRIC,
            "task": plan.target.task, "attacks": names, "model_names": model_names,
            "sources": sources, "models": [_summary(r) for r in results],
            "matrix": _jsonable(values), "baseline_evaluation": plan.baseline or None,
            "notes": notes}
        if baseline is None:
            out.update(self._benchmark(results, values, names, sources, notes))
        else:
            out["fast"] = self._fast(results[0], baseline, values, names, sources, notes)
        return _jsonable(out)

    def _benchmark(self, results: Sequence[MemberResult], values: np.ndarray,
                   names: list[str], sources: list[str], notes: list[str]) -> dict[str, Any]:
        """The parts of a full benchmark (not fast mode): the square matrix and the two-way
        evaluation (CAN-7), IRT abilities (CAN-8) and defence effects (CAN-5)."""
        members = list(self.plan.members)
        out: dict[str, Any] = {}
        # CAN-7: square matrix over the models that have a surrogate, in model order.
        cube, mnames = self._square(values, members, sources)
        out["twoway_models"] = mnames
        out["matrix_square"] = _jsonable(cube)
        if len(mnames) >= 2:
            out["twoway"] = self._compute(
                "twoway", {"values": cube},
                {"attacks": names, "models": mnames, "metric": MATRIX_METRIC,
                 "higher_is_more_effective": True, "heatmaps": True}, notes)
        else:
            notes.append("CAN-7 two-way evaluation needs at least two models with a "
                         "surrogate")
        out["irt"] = self._irt(results, values, names, notes)
        out["defence"] = self._defence(results, members, notes)
        return out

    def _square(self, values: np.ndarray, members: Sequence[Member],
                sources: Sequence[str]) -> tuple[np.ndarray, list[str]]:
        idx = [(sources.index(m.surrogate), j) for j, m in enumerate(members)
               if m.surrogate in sources]
        cube = np.full((values.shape[0], len(idx), len(idx)), np.nan)
        for a, (i, _) in enumerate(idx):
            for b, (_, j) in enumerate(idx):
                cube[:, a, b] = values[:, i, j]
        return cube, [members[j].name for _, j in idx]

    def _irt(self, results: Sequence[MemberResult], values: np.ndarray, names: Sequence[str],
             notes: list[str]) -> Any:
        """CAN-8: the models' abilities from their metrics, by category: clean capability,
        each corruption's mean robustness, and per attack the share of examples resisted
        (1 - MR, averaged over the models the examples were crafted on)."""
        if len(results) < 2:
            notes.append("CAN-8 IRT needs at least two models")
            return None
        metrics: list[dict[str, Any]] = [{
            "name": "clean accuracy", "category": "capability", "higher_is_better": True,
            "values": [_rate(r.scored.metrics.ieee.accuracy)["value"] for r in results]}]
        corr = sorted({c.name for r in results for c in r.scored.metrics.ieee.corruptions})
        for c in corr:
            metrics.append({"name": c, "category": "corruption", "higher_is_better": True,
                            "values": [next((x.mean_robustness for x in
                                             r.scored.metrics.ieee.corruptions if x.name == c),
                                            None) for r in results]})
        for k, name in enumerate(names):
            at = self.plan.attacks[k]
            entry = self.catalogue.attacks.get(at.id)
            kind = entry.kind if entry is not None else "attack"
            with np.errstate(all="ignore"):
                col = [float(np.nanmean(values[k, :, j])) if np.isfinite(values[k, :, j]).any()
                       else None for j in range(len(results))]
            metrics.append({"name": name, "category": f"{kind} attacks",
                            "higher_is_better": True,
                            "values": [None if v is None else 1.0 - v for v in col]})
        return self._compute("irt", {}, {"subjects": [r.member.name for r in results],
                                         "metrics": metrics, "seed": int(self.plan.seed),
                                         "chain_length": self.irt_chain,
                                         "burn_in": self.irt_burn_in}, notes)

    def _judged(self, res: MemberResult, kind: str, name: str = "") -> np.ndarray | None:
        """One model's answers of a setting as CAN-5 reads them: a classifier's N x C
        probabilities; for a detector or segmenter, whether each image was answered
        correctly under the plan's IEEE-C4 / C5 rule (the scoring service's verdicts, as
        0/1 "labels" against a truth of all 1s, so CA, RR and SR count correct answers).
        None: not available (labels-only classifiers, no verdicts)."""
        s = _setting(res, kind, name)
        if s is None:
            return None
        if self.plan.target.task == Task.CLASSIFICATION:
            return _probabilities(s.answers, len(res.target.labels))
        v = setting_verdicts(res.scored.metrics).get((kind, name, 0))
        return None if v is None else v.astype(np.int64)

    def _defence(self, results: Sequence[MemberResult], members: Sequence[Member],
                 notes: list[str]) -> list[dict[str, Any]]:
        """CAN-5 for every model named the defended version of another: capability deltas,
        rectify/sacrifice ratios overall, and per transfer attack the attack-metric deltas
        with each model attacked through its own surrogate (white-box). Detection and
        segmentation pairs: from the per-image verdicts (``_judged``); the metrics defined
        on class labels or confidences are not applicable there (``_not_for_task``)."""
        names = [m.name for m in members]
        task = self.plan.target.task
        out = []
        for d, m in enumerate(members):
            entry = self._defence_pair(results[names.index(m.defends)], results[d], notes) \
                if m.defends else None
            if entry is not None:
                out.append(entry)
        if out and task != Task.CLASSIFICATION:
            notes.append(f"CAN-5 on {task} targets: CA, RR and SR count the images answered "
                         f"correctly under the plan's {strategy(task).rule_id}"
                         " rule (the scoring service's per-image verdicts); the metrics of "
                         "class F1 and confidences are not applicable")
        return out

    def _defence_pair(self, rb: MemberResult, rd: MemberResult,
                      notes: list[str]) -> dict[str, Any] | None:
        """CAN-5 of one pair: the defended model ``rd`` against its baseline ``rb``, overall
        and per transfer attack; None (with a note) without both models' clean answers."""
        task = self.plan.target.task
        pb, pd = self._judged(rb, "clean"), self._judged(rd, "clean")
        if pb is None or pd is None or len(pb) != len(pd):
            notes.append(f"CAN-5 {rd.member.name} vs {rb.member.name}: " + (
                "needs both targets' scores" if task == Task.CLASSIFICATION else
                "needs the scoring service's per-image verdicts of both targets"))
            return None
        labels = rb.labels if task == Task.CLASSIFICATION else np.ones(len(pb), np.int64)
        entry: dict[str, Any] = {"baseline": rb.member.name, "defended": rd.member.name}
        entry["result"] = self._not_for_task(self._compute(
            "canary.defence_effect",
            {"labels": labels, "baseline_clean": pb, "defended_clean": pd}, {}, notes))
        per_attack: dict[str, Any] = {}
        for at in self.plan.attacks:
            if not is_transfer(at, self.catalogue) or at.surrogate:
                continue
            sb, sd = rb.member.surrogate, rd.member.surrogate
            if not sb or not sd:
                continue
            arrays = self._defence_arrays(rb, rd, crafted_on(at.name, sb),
                                          crafted_on(at.name, sd), labels, pb, pd)
            if arrays is None:
                continue
            per_attack[at.name] = self._not_for_task(self._compute(
                "canary.defence_effect", arrays,
                {"baseline_attack": {"MR": _success(rb, crafted_on(at.name, sb))},
                 "defended_attack": {"MR": _success(rd, crafted_on(at.name, sd))}},
                notes))
        entry["attacks"] = per_attack
        return entry

    def _defence_arrays(self, rb: MemberResult, rd: MemberResult, on_b: str, on_d: str,
                        labels: np.ndarray, pb: np.ndarray,
                        pd: np.ndarray) -> dict[str, np.ndarray] | None:
        """The CAN-5 inputs of one transfer attack: each model's clean answers on the images
        it was attacked on, and (classifiers) its answers to the examples crafted on its own
        surrogate (settings ``on_b`` / ``on_d``); None when either did not run."""
        ab, ad = _setting(rb, "transfer_attack", on_b), _setting(rd, "transfer_attack", on_d)
        if ab is None or ad is None or ab.image_index != ad.image_index:
            return None
        idx = np.array(ab.image_index or range(len(labels)), dtype=np.int64)
        arrays = {"labels": labels[idx], "baseline_clean": pb[idx], "defended_clean": pd[idx]}
        if self.plan.target.task == Task.CLASSIFICATION:
            qb = self._judged(rb, "transfer_attack", on_b)
            qd = self._judged(rd, "transfer_attack", on_d)
            if qb is None or qd is None:
                return None
            arrays.update(baseline_adv=qb, defended_adv=qd)
        return arrays

    def _not_for_task(self, node: Any) -> Any:
        """A CAN-5 result of a detection or segmentation pair with the metrics defined on
        class labels and confidences (CF, CC and their deltas FV / CV, ARAC, AITC) marked
        "not applicable" with the reason: never a number computed from verdicts."""
        task = self.plan.target.task
        if task == Task.CLASSIFICATION or not isinstance(node, dict):
            return node
        why = {"CF": "macro F1 over the classes of a classifier's top-1 answers",
               "CC": "the mean confidence of the true class",
               "ARAC": "the adversarial class's confidence",
               "AITC": "the true class's confidence"}
        rule = strategy(task).rule_id

        def missing(what: str) -> dict[str, Any]:
            return {"value": None, "status": NOT_APPLICABLE,
                    "reason": f"{what} is defined for image classifiers; a {task} target's "
                              f"answers are judged right or wrong under {rule}"}

        out = dict(node)
        for side in ("baseline", "defended"):
            if isinstance(out.get(side), Mapping):
                out[side] = {**out[side], "CF": missing(why["CF"]), "CC": missing(why["CC"])}
        for key, base in (("FV", "CF"), ("CV", "CC"), ("ARAC", "ARAC"), ("AITC", "AITC")):
            if key in out:
                out[key] = {**missing(why[base]), "baseline": None, "defended": None}
        return out

    def _fast(self, new: MemberResult, baseline: Mapping[str, Any], values: np.ndarray,
              names: Sequence[str], sources: Sequence[str], notes: list[str]) -> Any:
        """CAN-10: the new model against the baseline's stored K x M x M matrix."""
        bench = baseline["bench"]
        b_attacks = [str(a) for a in bench.get("attacks") or []]
        b_models = list(bench.get("twoway_models") or [])
        cube = np.array(bench.get("matrix_square") or [], dtype=np.float64)
        if not b_models or cube.ndim != 3:
            notes.append("CAN-10: the baseline has no square matrix")
            return None
        b_sources = [str(m.get("surrogate")) for m in bench.get("models") or []
                     if isinstance(m, Mapping) and m.get("name") in b_models]
        k_of = {a: i for i, a in enumerate(names)}
        white = np.full(len(b_attacks), np.nan)
        on_new = np.full((len(b_attacks), len(b_models)), np.nan)
        own = self.plan.members[0].surrogate
        for k, a in enumerate(b_attacks):
            if a not in k_of:
                notes.append(f"CAN-10: baseline attack {a} is not in this plan")
                continue
            kk = k_of[a]
            if own in sources:
                white[k] = values[kk, sources.index(own), 0]
            for i, s in enumerate(b_sources):
                if s in sources:
                    on_new[k, i] = values[kk, sources.index(s), 0]
        return self._compute(
            "twoway.fast_rank",
            {"values": cube, "white_box": white,
             "evaluated_on_new": on_new},
            {"attacks": b_attacks, "models": b_models, "metric": MATRIX_METRIC,
             "higher_is_more_effective": True, "new_name": new.member.name,
             "new_kind": "model"}, notes)

