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
single-target plan (:func:`member_plan`) that measures and scores its target and returns the
result (``ModelRun``); models other than the first keep their work items and query-attack
artifacts under their own prefix in the evaluation's store (:class:`MemberStore`), their
proxy sessions under ``<evaluation>.m<k>/...``; the adversarial examples of the expanded
transfer settings are shared by name, so each (attack, surrogate, chunk) is crafted once and
sent to every target (CAN-9's stored examples are the ones every model sees). With an
executor (``fortis serve --executor processes|kubernetes``) the workers run every model's
items first, model by model in the same order (:func:`member_runs`, ``worker.py``), and the
models' runners then find them finished, as a single-target plan's runner does. Once every
model ran, the cross-model section is computed from their results through the scoring
service (``cross_model.py``: the two-way squeeze and transfer heat maps, IRT abilities,
defence effects, fast ranks) and the first model's report, with that section, is the
evaluation's.

Fast mode (CAN-10, ``baseline: {evaluation: ID}``): the plan's one model is ranked against a
finished multi-target evaluation of the same tenant without re-running it: the baseline's
stored matrix is reused, the baseline's stored adversarial examples are sent to the new model
(looked up in the baseline evaluation's artifacts before crafting), and the new model's own
white-box results are added (``twoway.fast_rank``).

Domain code: ports only, no gRPC.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from fortis.core.task import TASKS, Task
from fortis.services.common import errors
from fortis.services.evaluation.cross_model import CrossModel, MemberResult, is_transfer
from fortis.services.evaluation.executors import Executor
from fortis.services.evaluation.plan import AttackTest, Member, Plan, TargetRef, crafted_on
from fortis.services.evaluation.ports import (
    Catalogue,
    PerturbationPort,
    ProxyPort,
    ReportPort,
    RunStore,
    Scored,
    ScoringPort,
)
from fortis.services.evaluation.runner import (
    DatasetPort,
    EvaluationRunner,
    build_stages,
    wait_for_workers,
)
from fortis.services.evaluation.stages.base import safe_artifact_part
from fortis.services.evaluation.store import EvaluationStorage

if TYPE_CHECKING:
    from fortis.services.evaluation.store import EvaluationRow

__all__ = ["BenchmarkRunner", "MemberRun", "MemberStore", "baseline_of", "benchmark_sources",
           "check_baseline", "expanded_attack_names", "member_plan", "member_runs",
           "member_store", "shared_settings"]

def member_plan(plan: Plan, member: Member, surrogates: Sequence[str], catalogue: Catalogue,
                *, primary: bool) -> Plan:
    """The single-target plan of one model: its target, and every transfer attack that names
    no surrogate expanded into ``<name>.<surrogate>`` per model surrogate (CAN-7). Only the
    primary model keeps the acceptance criteria and the CANARY per-attack metrics."""
    attacks: list[AttackTest] = []
    for at in plan.attacks:
        if is_transfer(at, catalogue) and not at.surrogate:
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
            for a in plan.attacks if is_transfer(a, catalogue) and not a.surrogate
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
    model is sent them (crafted once). Nothing waits on this order to compute: the
    cross-model section is computed from every model's result once they all ran."""
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


def member_store(store: RunStore, run: MemberRun, *, evaluation_id: str,
                 shared: set[str], baseline: str) -> MemberStore:
    """The store as ``run``'s model sees it (``MemberStore``)."""
    return MemberStore(store, evaluation_id=evaluation_id, prefix=run.prefix, shared=shared,
                       label=run.label, fallback=baseline)


class MemberStore:
    """The evaluation store as one model of a multi-target evaluation sees it: the
    :class:`~.ports.RunStore` one model's run (or a worker's part) needs, on the parent
    evaluation's row whatever evaluation id the model's run names (its proxy sessions'
    ``<evaluation>.m<k>``).

    Work items and artifacts carry the prefix ``m<k>/`` (none for the primary model), except
    the adversarial examples of the shared transfer settings (``shared``: crafted once, sent
    to every model). Progress messages name the model (``label``). ``fallback`` is a
    baseline evaluation whose shared artifacts are read when this one has none (CAN-10 fast
    mode)."""

    def __init__(self, inner: RunStore, *, evaluation_id: str, prefix: str, shared: set[str],
                 label: str, fallback: str = "") -> None:
        self._inner = inner
        self._eid = evaluation_id
        self._prefix = prefix
        self._shared = shared
        self._label = label
        self._fallback = fallback

    @property
    def tenant(self) -> str | None:
        return self._inner.tenant

    def _key(self, key: str) -> str:
        return self._prefix + key

    def _labelled(self, message: str) -> str:
        return f"{self._label}: {message}"

    def _artifact_name(self, name: str) -> str:
        return name if self._is_shared(name) else self._prefix + name

    def _is_shared(self, name: str) -> bool:
        if not name.startswith("adversarial/"):
            return False
        stem = name[len("adversarial/"):].rsplit("-", 1)[0]
        return stem in self._shared

    # the parent evaluation's row -----------------------------------------------------------
    def get(self, evaluation_id: str) -> EvaluationRow | None:
        return self._inner.get(self._eid)

    def update_running(self, evaluation_id: str, **fields: Any) -> bool:
        if fields.get("message"):
            fields["message"] = self._labelled(fields["message"])
        elif "stage" in fields:
            fields["message"] = self._label
        return self._inner.update_running(self._eid, **fields)

    def finish(self, evaluation_id: str, *, report_json: str, report_html: str, summary: Any,
               finished_at: float) -> bool:
        return self._inner.finish(self._eid, report_json=report_json, report_html=report_html,
                                  summary=summary, finished_at=finished_at)

    # the model's work items ----------------------------------------------------------------
    def item(self, evaluation_id: str, key: str) -> tuple[bool, int, bytes | None]:
        return self._inner.item(self._eid, self._key(key))

    def start_item(self, evaluation_id: str, key: str) -> int:
        return self._inner.start_item(self._eid, self._key(key))

    def finish_item(self, evaluation_id: str, key: str, result: bytes, *, items_done: int,
                    images_done: int, queries: int, message: str) -> None:
        self._inner.finish_item(self._eid, self._key(key), result, items_done=items_done,
                                images_done=images_done, queries=queries,
                                message=self._labelled(message))

    def items(self, evaluation_id: str) -> Iterator[tuple[str, int, bool]]:
        p = self._prefix
        for key, attempts, done in self._inner.items(self._eid):
            if p and key.startswith(p):
                yield key[len(p):], attempts, done
            elif not p and not _member_key(key):
                yield key, attempts, done

    def add_items(self, evaluation_id: str, keys: Iterable[str]) -> int:
        return self._inner.add_items(self._eid, [self._key(k) for k in keys])

    # claims of fan-out workers (``claims.py``) on the model's items -------------------------
    def claim_key(self, evaluation_id: str, key: str, worker_id: str, *,
                  lease_s: float) -> str:
        return self._inner.claim_key(self._eid, self._key(key), worker_id, lease_s=lease_s)

    def finish_claimed(self, evaluation_id: str, key: str, worker_id: str, result: bytes, *,
                       images: int, queries: int, message: str) -> bool:
        return self._inner.finish_claimed(self._eid, self._key(key), worker_id, result,
                                          images=images, queries=queries,
                                          message=self._labelled(message))

    def renew_leases(self, evaluation_id: str, worker_id: str, *, lease_s: float) -> int:
        return self._inner.renew_leases(self._eid, worker_id, lease_s=lease_s)

    def release_items(self, evaluation_id: str, worker_id: str,
                      keys: Iterable[str] | None = None) -> int:
        return self._inner.release_items(
            self._eid, worker_id, None if keys is None else [self._key(k) for k in keys])

    # artifacts: the model's own under its prefix, the shared examples by name ---------------
    def put_artifact(self, evaluation_id: str, name: str, data: bytes) -> object:
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
    stored = str(bench.get("task") or Task.CLASSIFICATION)
    # a stored name this version does not know is another task than the plan's
    task = Task(stored) if stored in TASKS else None
    if task != plan.target.task:
        raise errors.InvalidArgument("baseline.evaluation", f"the baseline evaluated {stored} "
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
# the runner: the models' runs, then the cross-model section from their results
# --------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class BenchmarkRunner:
    """Runs a multi-target plan (or a fast-mode plan): each model is an
    :class:`EvaluationRunner` over its own single-target plan that returns its results;
    once every model ran, the cross-model section is computed from them
    (:class:`~.cross_model.CrossModel`) and the primary model's report, with that section,
    is the evaluation's. Takes the arguments of an :class:`EvaluationRunner`; with an
    ``executor`` the workers run every model's items first."""

    evaluation_id: str
    plan: Plan
    plan_text: str
    store: EvaluationStorage
    proxy: ProxyPort
    perturbation: PerturbationPort
    scoring: ScoringPort
    report: ReportPort
    datasets: DatasetPort
    catalogue: Catalogue
    cancelled: Callable[[], bool] = lambda: False
    executor: Executor | None = None
    #: IRT sampler length (CAN-8); the seed's 7000/3000 by default.
    irt_chain: int = 7000
    irt_burn_in: int = 3000

    def run(self) -> Scored:
        plan = self.plan
        baseline = baseline_of(self.store, plan) if plan.baseline else None
        sources = benchmark_sources(plan, baseline)
        runs = member_runs(plan, self.catalogue, self.evaluation_id, sources)
        if self.executor is not None:
            self._fan_out(runs)
        shared = shared_settings(plan, self.catalogue, sources)
        runners = {r.index: self._runner(r, shared) for r in runs}
        measured = {r.index: runners[r.index].evaluate() for r in runs}
        results = [MemberResult.of(m, measured[k]) for k, m in enumerate(plan.members)]
        section = CrossModel(plan=plan, catalogue=self.catalogue, scoring=self.scoring,
                             irt_chain=self.irt_chain, irt_burn_in=self.irt_burn_in
                             ).section(results, sources, baseline)
        return runners[0].finish(measured[0], benchmark=section)

    def _fan_out(self, runs: Sequence[MemberRun]) -> None:
        """The workers run every model's items (each model's keys under its prefix, in the
        order of ``runs``); the models' runners then find them finished and score."""
        assert self.executor is not None
        n_images = len(self.datasets.images(self.plan))
        keys = [r.prefix + k.format() for r in runs
                for st in build_stages(r.plan, n_images, self.catalogue) for k in st.keys()]
        wait_for_workers(self.executor, self.store, self.evaluation_id, keys,
                         cancelled=self.cancelled)

    def _runner(self, run: MemberRun, shared: set[str]) -> EvaluationRunner:
        """The runner of one model: its single-target plan, on the evaluation's store as the
        model sees it; only the primary model's report (with its example images) is kept."""
        store = member_store(self.store, run, evaluation_id=self.evaluation_id, shared=shared,
                             baseline=self.plan.baseline)
        return EvaluationRunner(
            evaluation_id=run.evaluation_id, plan=run.plan, plan_text=self.plan_text,
            store=store, proxy=self.proxy, perturbation=self.perturbation,
            scoring=self.scoring, report=self.report, datasets=self.datasets,
            catalogue=self.catalogue, cancelled=self.cancelled, with_examples=run.primary)
