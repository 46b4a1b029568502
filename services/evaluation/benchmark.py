"""Benchmarks across models (CANARY, seed 003): one plan, several targets (CAN-5/7/8/10).

A multi-target plan (``targets:``) runs the same tests on every model it names. Each model
stands for itself twice: as a target (queried through the proxy, as a single-target plan's
target is) and, through its ``surrogate``, as the white-box model transfer attacks are crafted
on. A transfer attack of the plan that names no surrogate is expanded into one setting per
model surrogate, ``<attack>.<surrogate>``, and every target is evaluated on every one of them,
which fills CANARY's K attacks x M models x M models data matrix (CAN-7): ``values[k][i][j]``
is the misclassification ratio (MR, the success rate over the images the model got right) of
attack k's examples crafted on model i and evaluated on model j. A query attack runs against
each target itself (the matrix's diagonal).

Classifiers, detectors and segmenters alike (every model of one plan does one task): "got
right" is the plan's own correctness rule as the scoring service judged it -- IEEE-C1..C3, or
IEEE-C4 / IEEE-C5 for detection and segmentation targets, whose transfer attacks are crafted
on surrogates of that task (``mtcnn-surrogate``, ``u2netp-surrogate``, or a tenant's own
detector / segmenter) -- so the matrix entry is the share of the images a model answered
correctly that the transfer examples make it answer wrongly, read from the scoring service
(its success rate, which counts its per-image verdicts; this module never judges an answer).
CANARY metrics defined only for classifiers (class F1, confidences) are reported as "not
applicable" with the reason for the other tasks, never as 0; the CAN-5 ratios of a
detection or segmentation pair count the scoring service's per-image verdicts.

How it runs, with no new machinery: each model is one :class:`EvaluationRunner` over a derived
single-target plan (:func:`member_plan`); models other than the first keep their work items
and query-attack artifacts under their own prefix in the evaluation's store
(:class:`MemberStore`), their proxy sessions under ``<evaluation>.m<k>/...``; the adversarial
examples of the expanded transfer settings are shared by name, so each (attack, surrogate,
chunk) is crafted once and sent to every target (CAN-9's stored examples are the ones every
model sees). With an executor (``fortis serve --executor processes|kubernetes``) the workers
run every model's items first, model by model in the same order (:func:`member_runs`,
``worker.py``), and the models' runners then find them finished, as a single-target plan's
runner does. The first model runs last and its report is the evaluation's report, with the
cross-model section this module computes through the scoring service (``Compute``: the
two-way squeeze and transfer heat maps, IRT abilities, defence effects, fast ranks) -- never
by importing scoring code.

Fast mode (CAN-10, ``baseline: {evaluation: ID}``): the plan's one model is ranked against a
finished multi-target evaluation of the same tenant without re-running it: the baseline's
stored matrix is reused, the baseline's stored adversarial examples are sent to the new model
(looked up in the baseline evaluation's artifacts before crafting), and the new model's own
white-box results are added (``twoway.fast_rank``).

Domain code: ports only, no gRPC.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import structlog
from fortis.services.common import errors
from fortis.services.evaluation.answers import ClassAnswers
from fortis.services.evaluation.convert import setting_verdicts
from fortis.services.evaluation.plan import AttackTest, Member, Plan, TargetRef, crafted_on
from fortis.services.evaluation.ports import (
    Catalogue,
    Scored,
    Setting,
    TargetDescription,
)
from fortis.services.evaluation.runner import EvaluationRunner, build_stages
from fortis.services.evaluation.stages import LabeledImage
from fortis.services.evaluation.stages.base import safe_artifact_part
from fortis.services.evaluation.store import EvaluationStorage

__all__ = ["BenchmarkRunner", "MemberRun", "MemberStore", "benchmark_sources",
           "check_baseline", "expanded_attack_names", "member_plan", "member_runs",
           "member_store", "shared_settings", "transfer_matrix"]

log = structlog.get_logger("fortis.evaluation.benchmark")

#: The metric of the data matrix: CANARY's misclassification ratio (CAN-2), our success rate.
MATRIX_METRIC = "MR"
#: A metric that has no meaning for the target's task (CANARY's node status).
NOT_APPLICABLE = "not applicable"


def _is_transfer(at: AttackTest, catalogue: Catalogue) -> bool:
    entry = catalogue.attacks.get(at.id)
    return entry is not None and entry.needs_surrogate


def member_plan(plan: Plan, member: Member, surrogates: Sequence[str], catalogue: Catalogue,
                *, primary: bool) -> Plan:
    """The single-target plan of one model: its target, and every transfer attack that names
    no surrogate expanded into ``<name>.<surrogate>`` per model surrogate (CAN-7). Only the
    primary model keeps the acceptance criteria and the CANARY per-attack metrics."""
    attacks: list[AttackTest] = []
    for at in plan.attacks:
        if _is_transfer(at, catalogue) and not at.surrogate:
            attacks += [replace(at, name=crafted_on(at.name, s), surrogate=s, ensemble=())
                        for s in dict.fromkeys(surrogates)]
        else:
            attacks.append(at)
    target = TargetRef(name=member.name, task=plan.target.task,
                       endpoint=plan.target.endpoint if primary else "")
    return replace(plan, target=target, attacks=tuple(attacks), members=(), baseline="",
                   acceptance=plan.acceptance if primary else (),
                   canary=plan.canary if primary else False)


def expanded_attack_names(plan: Plan, catalogue: Catalogue) -> list[str]:
    """The attack names of a multi-target plan after expansion (what acceptance may name)."""
    surrogates = _own_sources(plan)
    return [a.name for a in member_plan(plan, plan.members[0] if plan.members else
                                        Member(name=plan.target.name), surrogates, catalogue,
                                        primary=True).attacks]


def _own_sources(plan: Plan) -> list[str]:
    """The plan's models' surrogates, each once (two models may share a white-box twin: its
    examples are crafted once and its row of the matrix stands for both)."""
    return list(dict.fromkeys(m.surrogate for m in plan.members if m.surrogate))


def benchmark_sources(plan: Plan, baseline: Mapping[str, Any] | None) -> list[str]:
    """The surrogates transfer attacks are crafted on (the matrix's source rows): the models'
    own, then (CAN-10 fast mode) the baseline's."""
    sources = _own_sources(plan)
    if baseline is not None:
        sources += [s for s in baseline["sources"] if s not in sources]
    return sources


def shared_settings(plan: Plan, catalogue: Catalogue, sources: Sequence[str]) -> set[str]:
    """The artifact stems of the expanded transfer settings, shared by every model."""
    return {safe_artifact_part(crafted_on(a.name, s), default="attack")
            for a in plan.attacks if _is_transfer(a, catalogue) and not a.surrogate
            for s in sources}


@dataclass(frozen=True, kw_only=True)
class MemberRun:
    """One model's part of a multi-target evaluation: its index in ``targets``, its
    single-target plan, the evaluation id its proxy sessions are named by, the prefix of its
    work items and artifacts, and how progress names it."""

    index: int
    member: Member
    plan: Plan
    evaluation_id: str
    prefix: str
    label: str

    @property
    def primary(self) -> bool:
        return self.index == 0


def member_runs(plan: Plan, catalogue: Catalogue, evaluation_id: str,
                sources: Sequence[str]) -> list[MemberRun]:
    """The models of a multi-target plan in the order they run -- the others first, the
    primary (whose report is the evaluation's) last -- the same in the evaluation service and
    in every worker, so the transfer examples a model crafts are stored before the next
    model is sent them."""
    members = list(plan.members)
    order = list(range(1, len(members))) + [0]
    out = []
    for pos, k in enumerate(order):
        m = members[k]
        out.append(MemberRun(
            index=k, member=m,
            plan=member_plan(plan, m, sources, catalogue, primary=k == 0),
            evaluation_id=evaluation_id if k == 0 else f"{evaluation_id}.m{k}",
            prefix="" if k == 0 else f"m{k}/",
            label=f"model {pos + 1} of {len(members)} ({m.name})"))
    return out


def member_store(store: EvaluationStorage, run: MemberRun, *, evaluation_id: str,
                 shared: set[str], baseline: str) -> MemberStore:
    """The store as ``run``'s model sees it (``MemberStore``)."""
    return MemberStore(store, evaluation_id=evaluation_id, member_id=evaluation_id,
                       prefix=run.prefix, shared=shared, label=run.label, fallback=baseline,
                       keep_finish=not run.primary)


class MemberStore:
    """The evaluation store as one model of a multi-target evaluation sees it.

    Work items and artifacts carry the prefix ``m<k>/`` (none for the primary model), except
    the adversarial examples of the shared transfer settings (``shared``: crafted once, sent
    to every model). ``finish`` of a non-primary model is kept here, not stored: the
    evaluation's report is the primary model's. ``fallback`` is a baseline evaluation whose
    shared artifacts are read when this one has none (CAN-10 fast mode). Everything else is
    the parent store's, on the parent evaluation's row."""

    def __init__(self, inner: EvaluationStorage, *, evaluation_id: str, member_id: str,
                 prefix: str, shared: set[str], label: str, fallback: str = "",
                 keep_finish: bool = True) -> None:
        self._inner = inner
        self._eid = evaluation_id
        self._member = member_id
        self._prefix = prefix
        self._shared = shared
        self._label = label
        self._fallback = fallback
        self._keep_finish = keep_finish
        self.finished: dict[str, Any] | None = None

    def __getattr__(self, name: str) -> Any:        # tenant, changed, version, ...
        return getattr(self._inner, name)

    def _key(self, key: str) -> str:
        return self._prefix + key

    def _artifact_name(self, name: str) -> str:
        if self._is_shared(name):
            return name
        return self._prefix + name

    def _is_shared(self, name: str) -> bool:
        if not name.startswith("adversarial/"):
            return False
        stem = name[len("adversarial/"):].rsplit("-", 1)[0]
        return stem in self._shared

    # rows ------------------------------------------------------------------------------
    def get(self, evaluation_id: str) -> Any:
        return self._inner.get(self._eid)

    def update_running(self, evaluation_id: str, **fields: Any) -> bool:
        if "message" in fields and fields["message"]:
            fields["message"] = f"{self._label}: {fields['message']}"
        elif "stage" in fields:
            fields["message"] = self._label
        return self._inner.update_running(self._eid, **fields)

    def finish(self, evaluation_id: str, *, report_json: str, report_html: str, summary: Any,
               finished_at: float) -> None:
        if self._keep_finish:
            self.finished = {"report_json": report_json, "summary": summary}
            return
        self._inner.finish(self._eid, report_json=report_json, report_html=report_html,
                           summary=summary, finished_at=finished_at)

    # work items --------------------------------------------------------------------------
    def item(self, evaluation_id: str, key: str) -> tuple[bool, int, bytes | None]:
        return self._inner.item(self._eid, self._key(key))

    def start_item(self, evaluation_id: str, key: str) -> int:
        return self._inner.start_item(self._eid, self._key(key))

    def finish_item(self, evaluation_id: str, key: str, result: bytes, **kw: Any) -> None:
        if "message" in kw:
            kw["message"] = f"{self._label}: {kw['message']}"
        self._inner.finish_item(self._eid, self._key(key), result, **kw)

    def items(self, evaluation_id: str) -> Iterator[tuple[str, int, bool]]:
        p = self._prefix
        for key, attempts, done in self._inner.items(self._eid):
            if p and key.startswith(p):
                yield key[len(p):], attempts, done
            elif not p and not _member_key(key):
                yield key, attempts, done

    def add_items(self, evaluation_id: str, keys: Any) -> int:
        return self._inner.add_items(self._eid, [self._key(k) for k in keys])

    # claims of fan-out workers (``claims.py``): the model's items, on the parent's row ------
    def claim_key(self, evaluation_id: str, key: str, worker_id: str, *,
                  lease_s: float) -> str:
        return self._inner.claim_key(self._eid, self._key(key), worker_id, lease_s=lease_s)

    def finish_claimed(self, evaluation_id: str, key: str, worker_id: str, result: bytes, *,
                       images: int, queries: int, message: str) -> bool:
        return self._inner.finish_claimed(self._eid, self._key(key), worker_id, result,
                                          images=images, queries=queries,
                                          message=f"{self._label}: {message}")

    def renew_leases(self, evaluation_id: str, worker_id: str, *, lease_s: float) -> int:
        return self._inner.renew_leases(self._eid, worker_id, lease_s=lease_s)

    def release_items(self, evaluation_id: str, worker_id: str,
                      keys: Any = None) -> int:
        return self._inner.release_items(
            self._eid, worker_id, None if keys is None else [self._key(k) for k in keys])

    # artifacts ---------------------------------------------------------------------------
    def put_artifact(self, evaluation_id: str, name: str, data: bytes) -> Any:
        return self._inner.put_artifact(self._eid, self._artifact_name(name), data)

    def artifact(self, evaluation_id: str, name: str) -> bytes | None:
        data = self._inner.artifact(self._eid, self._artifact_name(name))
        if data is None and self._fallback and self._is_shared(name):
            data = self._inner.artifact(self._fallback, name)
        return data


def check_baseline(store: EvaluationStorage, evaluation_id: str) -> Mapping[str, Any]:
    """The benchmark section of a finished multi-target evaluation of the store's tenant
    (CAN-10's baseline); InvalidArgument / FailedPrecondition naming ``baseline.evaluation``
    otherwise. Another tenant's evaluation is unknown here, as any foreign id is."""
    row = store.get(evaluation_id)
    if row is None:
        raise errors.InvalidArgument("baseline.evaluation", "no evaluation with this id")
    if row.state != "SUCCEEDED":
        raise errors.FailedPrecondition(f"baseline evaluation '{evaluation_id}' is "
                                        f"{row.state}, not SUCCEEDED")
    try:
        doc = json.loads(store.report(evaluation_id)[0])
    except (ValueError, errors.FortisError):
        doc = None
    bench = doc.get("benchmark") if isinstance(doc, Mapping) else None
    if not isinstance(bench, Mapping) or bench.get("mode") != "benchmark" \
            or not bench.get("twoway_models"):
        raise errors.InvalidArgument("baseline.evaluation", "the baseline is not a "
                                     "multi-target evaluation of at least two models with "
                                     "surrogates (its report has no benchmark matrix)")
    return bench


def baseline_of(store: EvaluationStorage, plan: Plan) -> dict[str, Any]:
    """The stored multi-target evaluation a fast-mode plan is ranked against (its benchmark
    section, model names and surrogates); InvalidArgument naming ``baseline.evaluation`` when
    it is of another task (its matrix counts another correctness rule)."""
    bench = check_baseline(store, plan.baseline)
    task = str(bench.get("task") or "classification")
    if task != plan.target.task:
        raise errors.InvalidArgument("baseline.evaluation", f"the baseline evaluated {task} "
                                     f"targets; this plan's target is a {plan.target.task} "
                                     "target")
    models = [m for m in bench.get("models") or [] if isinstance(m, Mapping)]
    return {"evaluation": plan.baseline, "bench": bench,
            "names": [str(m.get("name")) for m in models],
            "sources": list(dict.fromkeys(str(m["surrogate"]) for m in models
                                          if m.get("surrogate")))}


def _member_key(key: str) -> bool:
    """A work-item key of a non-primary model (``m<k>/...``)."""
    head = key.split("/", 1)[0]
    return len(head) > 1 and head[0] == "m" and head[1:].isdigit()


# --------------------------------------------------------------------------------------------
# what one model's run left for the cross-model section
# --------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class MemberResult:
    member: Member
    scored: Scored
    settings: Sequence[Setting]
    labels: np.ndarray                  # N true labels (first label of each image)
    target: TargetDescription


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
        transfer = _is_transfer(at, catalogue)
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


# --------------------------------------------------------------------------------------------
# the runner
# --------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class BenchmarkRunner(EvaluationRunner):
    """Runs a multi-target plan (or a fast-mode plan) model by model, each as an
    :class:`EvaluationRunner` over its own single-target plan; see the module doc. Takes the
    same arguments; with an ``executor`` the workers run every model's items first."""

    #: IRT sampler length (CAN-8); the seed's 7000/3000 by default.
    irt_chain: int = 7000
    irt_burn_in: int = 3000
    results: list[MemberResult] = field(default_factory=list)

    def run(self) -> Scored:
        plan, eid = self.plan, self.evaluation_id
        baseline = self._baseline() if plan.baseline else None
        members = list(plan.members)
        sources = benchmark_sources(plan, baseline)
        shared = shared_settings(plan, self.catalogue, sources)
        runs = member_runs(plan, self.catalogue, eid, sources)
        if self.executor is not None:
            # the workers run every model's items (each model's keys under its prefix, in
            # the order below); the runners that follow find them finished and score
            images = self.datasets.images(plan)
            self._fan_out([r.prefix + k.format() for r in runs
                           for st in build_stages(r.plan, len(images), self.catalogue)
                           for k in st.keys()])
        by_index: dict[int, MemberResult] = {}
        scored: Scored | None = None
        for r in runs:
            mstore = member_store(self.store, r, evaluation_id=eid, shared=shared,
                                  baseline=plan.baseline)

            def hook(sc: Scored, settings: Sequence[Setting], images: Sequence[LabeledImage],
                     target: TargetDescription, *, _m: Member = r.member, _k: int = r.index
                     ) -> Any:
                labels = np.array([lab[0] if len(lab) else -1 for _, _, lab in images])
                by_index[_k] = MemberResult(member=_m, scored=sc, settings=settings,
                                            labels=labels, target=target)
                if _k != 0:
                    return None
                return self._section(by_index, sources, baseline)

            runner = EvaluationRunner(
                evaluation_id=r.evaluation_id, plan=r.plan,
                plan_text=self.plan_text, store=mstore,  # type: ignore[arg-type]
                proxy=self.proxy, perturbation=self.perturbation, scoring=self.scoring,
                report=self.report, datasets=self.datasets, catalogue=self.catalogue,
                cancelled=self.cancelled, on_scored=hook, with_examples=r.primary)
            scored = runner.run()
        assert scored is not None
        self.results = [by_index[k] for k in range(len(members))]
        return scored

    # ----------------------------------------------------------------------------------
    def _baseline(self) -> dict[str, Any]:
        """The stored multi-target evaluation a fast-mode plan is ranked against."""
        return baseline_of(self.store, self.plan)

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

    def _section(self, by_index: Mapping[int, MemberResult], sources: list[str],
                 baseline: Mapping[str, Any] | None) -> dict[str, Any]:
        plan, cat = self.plan, self.catalogue
        members = list(plan.members)
        results = [by_index[k] for k in range(len(members))]
        notes: list[str] = []
        names, values = transfer_matrix(plan, cat, results, sources)
        model_names = [m.name for m in members]
        if plan.target.task != "classification":
            notes.append(f"MR on {plan.target.task} targets: the share of the images a model "
                         "answered correctly under the plan's IEEE-"
                         f"{'C4' if plan.target.task == 'detection' else 'C5'} rule that the "
                         "attack's examples make it answer wrongly")
        out: dict[str, Any] = {
            "mode": "fast" if baseline is not None else "benchmark", "metric": MATRIX_METRIC,
            "task": plan.target.task, "attacks": names, "model_names": model_names,
            "sources": sources, "models": [_summary(r) for r in results],
            "matrix": _jsonable(values), "baseline_evaluation": plan.baseline or None,
            "notes": notes}
        if baseline is None:
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
            out["defence"] = self._defence(by_index, members, sources, notes)
        else:
            out["fast"] = self._fast(results[0], baseline, values, names, sources, notes)
        return _jsonable(out)

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
        if self.plan.target.task == "classification":
            return _probabilities(s.answers, len(res.target.labels))
        v = setting_verdicts(res.scored.metrics).get((kind, name, 0))
        return None if v is None else v.astype(np.int64)

    def _defence(self, by_index: Mapping[int, MemberResult], members: Sequence[Member],
                 sources: Sequence[str], notes: list[str]) -> list[dict[str, Any]]:
        """CAN-5 for every model named the defended version of another: capability deltas,
        rectify/sacrifice ratios overall, and per transfer attack the attack-metric deltas
        with each model attacked through its own surrogate (white-box). Detection and
        segmentation pairs: from the per-image verdicts (``_judged``); the metrics defined
        on class labels or confidences are not applicable there (``_not_for_task``)."""
        out = []
        names = [m.name for m in members]
        task = self.plan.target.task
        for d, m in enumerate(members):
            if not m.defends:
                continue
            b = names.index(m.defends)
            rb, rd = by_index[b], by_index[d]
            pb, pd = self._judged(rb, "clean"), self._judged(rd, "clean")
            if pb is None or pd is None or len(pb) != len(pd):
                notes.append(f"CAN-5 {m.name} vs {m.defends}: " + (
                    "needs both targets' scores" if task == "classification" else
                    "needs the scoring service's per-image verdicts of both targets"))
                continue
            labels = rb.labels if task == "classification" else np.ones(len(pb), np.int64)
            entry: dict[str, Any] = {"baseline": m.defends, "defended": m.name}
            entry["result"] = self._not_for_task(self._compute(
                "canary.defence_effect",
                {"labels": labels, "baseline_clean": pb, "defended_clean": pd}, {}, notes))
            per_attack: dict[str, Any] = {}
            for at in self.plan.attacks:
                if not _is_transfer(at, self.catalogue) or at.surrogate:
                    continue
                sb, sd = members[b].surrogate, m.surrogate
                if not sb or not sd:
                    continue
                ab = _setting(rb, "transfer_attack", crafted_on(at.name, sb))
                ad = _setting(rd, "transfer_attack", crafted_on(at.name, sd))
                if ab is None or ad is None or ab.image_index != ad.image_index:
                    continue
                idx = np.array(ab.image_index or range(len(labels)), dtype=np.int64)
                arrays = {"labels": labels[idx], "baseline_clean": pb[idx],
                          "defended_clean": pd[idx]}
                if task == "classification":
                    qb = self._judged(rb, "transfer_attack", crafted_on(at.name, sb))
                    qd = self._judged(rd, "transfer_attack", crafted_on(at.name, sd))
                    if qb is None or qd is None:
                        continue
                    arrays.update(baseline_adv=qb, defended_adv=qd)
                per_attack[at.name] = self._not_for_task(self._compute(
                    "canary.defence_effect", arrays,
                    {"baseline_attack": {"MR": _success(rb, crafted_on(at.name, sb))},
                     "defended_attack": {"MR": _success(rd, crafted_on(at.name, sd))}},
                    notes))
            entry["attacks"] = per_attack
            out.append(entry)
        if out and task != "classification":
            notes.append(f"CAN-5 on {task} targets: CA, RR and SR count the images answered "
                         f"correctly under the plan's IEEE-{'C4' if task == 'detection' else 'C5'}"
                         " rule (the scoring service's per-image verdicts); the metrics of "
                         "class F1 and confidences are not applicable")
        return out

    def _not_for_task(self, node: Any) -> Any:
        """A CAN-5 result of a detection or segmentation pair with the metrics defined on
        class labels and confidences (CF, CC and their deltas FV / CV, ARAC, AITC) marked
        "not applicable" with the reason: never a number computed from verdicts."""
        task = self.plan.target.task
        if task == "classification" or not isinstance(node, dict):
            return node
        why = {"CF": "macro F1 over the classes of a classifier's top-1 answers",
               "CC": "the mean confidence of the true class",
               "ARAC": "the adversarial class's confidence",
               "AITC": "the true class's confidence"}
        rule = "IEEE-C4" if task == "detection" else "IEEE-C5"

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
