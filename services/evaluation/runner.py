"""Runs one test plan (IEEE-P2): plan -> clean pass -> corruption robustness -> degradation
-> adversarial robustness -> scoring -> report. Domain code: reaches the other services
through ports (``ports.py``), runs its work as stages (``stages/``), each a list of resumable
work items (CAN-9).

The runner owns the order of the stages and the hand-over of their measured settings to the
scoring service and of the facts to the report service; it writes no report prose (the
report service does). Measuring and scoring (:meth:`EvaluationRunner.evaluate`) return a
value, :class:`ModelRun`, that reporting (:meth:`EvaluationRunner.finish`) turns into the
stored report: a multi-target plan (``benchmark.py``) evaluates each model with its own
runner and reports once, with what it computed from all their results.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from importlib import metadata
from typing import Any

import numpy as np
from fortis.core.task import Task
from fortis.infra.serving import tracing
from fortis.services.common.errors import FailedPrecondition, InvalidArgument, Unavailable
from fortis.services.evaluation.answers import SegmentationAnswers
from fortis.services.evaluation.canary_metrics import canary_metrics
from fortis.services.evaluation.estimate import estimate_plan, report_section
from fortis.services.evaluation.examples import build_examples
from fortis.services.evaluation.executors import Executor
from fortis.services.evaluation.keys import SessionId
from fortis.services.evaluation.outcomes import per_image_outcomes
from fortis.services.evaluation.plan import Plan, check_against_target, check_surrogate_labels
from fortis.services.evaluation.ports import (
    Catalogue,
    Example,
    LedgerSummary,
    PerturbationPort,
    ProxyPort,
    ReportInput,
    ReportPort,
    RunStore,
    Scored,
    ScoringPort,
    ScoringSetup,
    Setting,
    TargetDescription,
    TestDefinition,
)
from fortis.services.evaluation.sequential import SequentialRun, is_sequential, sequential_order
from fortis.services.evaluation.stages import (
    Cancelled,
    CleanStage,
    CorruptionStage,
    DegradationStage,
    LabeledImage,
    Progress,
    QueryAttackStage,
    RunContext,
    Stage,
    TransferAttackStage,
    attack_tests,
)
from fortis.services.evaluation.stages.base import chunks
from fortis.services.evaluation.store import ACTIVE_STATES

__all__ = ["Cancelled", "DatasetPort", "EvaluationRunner", "LabeledImage", "ModelRun",
           "RecordedFailure", "RunContext", "attack_truths", "build_stages", "check_target",
           "wait_for_workers"]


class RecordedFailure(Exception):
    """A worker already ended the evaluation as FAILED with its own status:
    the service must not overwrite it."""


class DatasetPort:
    """How the runner gets the plan's images and (detection/segmentation) ground truth."""

    def images(self, plan: Plan) -> list[LabeledImage]:
        raise NotImplementedError

    def truths(self, plan: Plan) -> dict[str, Any]:
        raise NotImplementedError

    def count(self, plan: Plan) -> int:
        """How many images the plan's selection resolves to (its query estimate's M)."""
        return len(self.images(plan))

    def for_tenant(self, tenant: str) -> DatasetPort:
        """The port as ``tenant``'s plans see it (its own uploads). Default: self."""
        return self


def attack_truths(plan: Plan, datasets: DatasetPort) -> dict[str, Any]:
    """Ground truth per image id for the query attacks' IEEE-C4 / C5 criteria (detection and
    segmentation plans with query attacks); empty otherwise."""
    if plan.target.task == Task.CLASSIFICATION or not plan.attacks:
        return {}
    return dict(datasets.truths(plan))


def build_stages(plan: Plan, n_images: int, catalogue: Catalogue) -> list[Stage]:
    """The stages of a plan, in execution order."""
    return [CleanStage(plan, n_images), CorruptionStage(plan, n_images, catalogue),
            DegradationStage(plan, n_images, catalogue),
            TransferAttackStage(plan, n_images, catalogue),
            QueryAttackStage(plan, n_images, catalogue)]


def check_target(plan: Plan, target: TargetDescription, images: Sequence[LabeledImage],
                 catalogue: Catalogue) -> None:
    """The plan fits the target (task, label range, scores for the rule and the attacks,
    targeted classes: ``plan.check_against_target``)."""
    check_against_target(plan, target, catalogue)
    n_labels = len(target.labels)
    for image_id, _, labels in images:
        for lab in labels:
            if not 0 <= lab < n_labels:
                raise InvalidArgument("dataset.label_map", f"image '{image_id}' has label {lab}, outside the target's {n_labels} labels")
    check_surrogate_labels(plan, list(target.labels), images, len(images))


def _fit_masks(setting: Setting, truths: Sequence[Any]) -> Setting:
    """Segmentation answers on the ground truth's grid: an answer of another size, or a
    failed one, becomes all -1 (no pixel right), as IEEE-C5 scores a failed query."""
    a = setting.answers
    if not isinstance(a, SegmentationAnswers):
        return setting
    index = setting.image_index or tuple(range(len(truths)))
    h, w = np.asarray(truths[0]).shape
    maps = np.full((len(index), h, w), -1, dtype=np.int64)
    for row, _ in enumerate(index):
        if a.class_maps is not None and not a.errors[row] and a.shapes[row] == (h, w):
            maps[row] = a.class_maps[row]
    return replace(setting, answers=SegmentationAnswers(class_maps=maps, errors=a.errors,
                                                        shapes=((h, w),) * len(index)))


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def wait_for_workers(executor: Executor, store: RunStore, evaluation_id: str,
                     keys: Sequence[str], *, cancelled: Callable[[], bool]) -> None:
    """Let the executor's workers run the unfinished items of ``keys`` (they claim them
    from the store), and wait for them. A cancel stops the wait and the workers; a shutdown
    of this service only stops the wait (Kubernetes workers go on, the resumed evaluation
    finds their Job); a worker's permanent failure is already recorded."""
    eid = evaluation_id
    done = {k for k, _, d in store.items(eid) if d}
    pending = [k for k in keys if k not in done]
    if not pending:
        return
    store.add_items(eid, keys)
    store.update_running(eid, stage="workers", items_total=len(keys),
                         message=f"{len(pending)} work items on {executor.shards} workers")
    handle = executor.submit(tenant=store.tenant or "", evaluation_id=eid)

    def ended() -> bool:
        row = store.get(eid)
        return row is None or row.state not in ACTIVE_STATES

    outcome = executor.wait(handle, should_stop=lambda: cancelled() or ended())
    if outcome.state == "succeeded":
        return
    row = store.get(eid)
    if row is not None and row.state not in ACTIVE_STATES:
        executor.delete(handle)        # cancelled or failed: stop the rest
        if row.state == "FAILED":
            raise RecordedFailure(row.error_message)
        raise Cancelled("cancelled by a caller")
    if outcome.state == "stopped":
        raise Cancelled("stopped while waiting for the workers")
    raise Unavailable(f"the evaluation's workers failed ({outcome.reason}); its finished "
                      "items are kept: resume it to go on")


@dataclass(frozen=True, kw_only=True)
class ModelRun:
    """What measuring and scoring one target gave (:meth:`EvaluationRunner.evaluate`):
    everything its report is made of but the cross-model section of a multi-target plan,
    which is computed from every model's ``ModelRun`` (``benchmark.py``)."""

    started: float
    images: Sequence[LabeledImage]
    target: TargetDescription
    #: the settings that ran (scored) and those that failed (listed with their errors)
    settings: Sequence[Setting]
    failed: Sequence[Setting]
    scored: Scored
    tests: Sequence[TestDefinition]
    ledger: LedgerSummary
    examples: Sequence[Example]
    canary: Any
    #: Sequential acceptance's record (``sequential.py``), None without it.
    sequential: Mapping[str, Any] | None = None


@dataclass(kw_only=True)
class EvaluationRunner:
    """Executes one evaluation to the end (or until cancelled / failed): :meth:`evaluate`
    measures and scores the target, :meth:`finish` renders and stores the report."""

    evaluation_id: str
    plan: Plan
    plan_text: str
    store: RunStore
    proxy: ProxyPort
    perturbation: PerturbationPort
    scoring: ScoringPort
    report: ReportPort
    datasets: DatasetPort
    catalogue: Catalogue
    cancelled: Callable[[], bool] = lambda: False
    #: Workers that run the items first (``executors.py``). None: this process
    #: runs them all.
    executor: Executor | None = None
    #: Example images for the report; off for the models of a multi-target plan
    #: whose own report is not kept (``benchmark.py``).
    with_examples: bool = True
    #: A finished run of the same plan's ledger counts (``estimate.ledger_groups``): the
    #: report's expected queries; None: none known.
    estimate_prior: Mapping[str, int] | None = None

    def run(self) -> Scored:
        return self.finish(self.evaluate())

    def evaluate(self) -> ModelRun:
        """Run (or resume) every stage and score the settings; nothing is reported yet."""
        started = time.time()
        self.store.update_running(self.evaluation_id, state="RUNNING", stage="plan",
                                  started_at=started)
        images, target = self._inputs()
        if is_sequential(self.plan):       # every prefix a sample without replacement
            images = [images[i] for i in sequential_order(len(images), self.plan.seed)]
        stages = build_stages(self.plan, len(images), self.catalogue)
        keys = [k.format() for s in stages for k in s.keys()]
        if self.executor is not None:
            wait_for_workers(self.executor, self.store, self.evaluation_id, keys,
                             cancelled=self.cancelled)
        ctx = self._context(images, target, self._progress(stages, keys))
        if is_sequential(self.plan):
            setup = self._scoring_setup(target, images)
            ctx.sequential = SequentialRun(
                plan=self.plan, n_images=len(images), scoring=self.scoring, setup=setup,
                prepare=partial(self._prepare, truth=setup.truth))
        settings: list[Setting] = []
        for stage in stages:
            ctx.check_cancelled()       # a stage boundary is an item boundary (CAN-9)
            ctx.progress.stage(stage.progress_stage)
            with tracing.stage_span(stage, self.evaluation_id):
                got = stage.run(ctx)
            settings += got
            if ctx.sequential is not None and isinstance(stage, CleanStage):
                ctx.sequential.set_clean(got[0])
        # A cancel or a shutdown that came while the last items ran stops here: their
        # results are committed, scoring and the report are for the run that resumes it.
        ctx.check_cancelled()
        return self._score(ctx, stages, settings, started)

    def finish(self, run: ModelRun, *, benchmark: Any = None) -> Scored:
        """Render the report of ``run`` (with a multi-target plan's cross-model section,
        ``benchmark``) and end the evaluation as SUCCEEDED with it."""
        plan, store, eid = self.plan, self.store, self.evaluation_id
        store.update_running(eid, stage="report", message="")
        finished_at = time.time()
        current = store.get(eid)
        report_json, report_html = self.report.render(ReportInput(
            plan=plan, plan_text=self.plan_text, target=run.target,
            environment={"python": platform.python_version(), "platform": platform.platform(),
                         "fortis": _version("fortis"), "torch": _version("torch"),
                         "numpy": _version("numpy")},
            metrics=run.scored.metrics, tests=list(run.tests), ledger=run.ledger,
            evaluation_id=eid, started=run.started, finished=finished_at,
            images=len(run.images), resumed_count=current.resumed_count if current else 0,
            examples=list(run.examples), benchmark=benchmark, canary=run.canary,
            failed=list(run.failed), sequential=run.sequential,
            estimate=report_section(estimate_plan(plan, len(run.images), self.catalogue,
                                                  prior=self.estimate_prior),
                                    run.ledger.sessions, eid),
            outcomes=per_image_outcomes([i for i, _, _ in run.images], run.settings,
                                        run.scored.metrics)))
        scored = replace(run.scored, summary=replace(
            run.scored.summary, failed_settings=tuple(s.label for s in run.failed)))
        store.finish(eid, report_json=report_json, report_html=report_html,
                     summary=scored.summary, finished_at=finished_at)
        return scored

    # -- the steps of evaluate -------------------------------------------------------------
    def _inputs(self) -> tuple[list[LabeledImage], TargetDescription]:
        """The plan's images and the target's description, checked against the plan."""
        images = self.datasets.images(self.plan)
        if not images:
            raise FailedPrecondition("the plan's dataset selection is empty")
        target = self.proxy.target_info(self.plan.target.name)
        check_target(self.plan, target, images, self.catalogue)
        return images, target

    def _progress(self, stages: Sequence[Stage], keys: Sequence[str]) -> Progress:
        """Progress counted from what earlier attempts (or the workers) finished."""
        store, eid = self.store, self.evaluation_id
        finished = {k for k, _, d in store.items(eid) if d}
        progress = Progress(store, eid)
        row = store.get(eid)
        progress.items_done = len([k for k in keys if k in finished])
        progress.queries = row.queries if row else 0
        progress.images_done = row.images_done if row else 0
        store.update_running(eid, items_total=len(keys), items_done=progress.items_done,
                             images_total=sum(s.images_total() for s in stages))
        return progress

    def _context(self, images: Sequence[LabeledImage], target: TargetDescription,
                 progress: Progress) -> RunContext:
        plan = self.plan
        return RunContext(evaluation_id=self.evaluation_id, plan=plan,
                          plan_text=self.plan_text, store=self.store, proxy=self.proxy,
                          perturbation=self.perturbation, scoring=self.scoring,
                          report=self.report, images=images, target=target,
                          progress=progress, cancelled=self.cancelled,
                          chunk_ranges=chunks(len(images), plan.batch_size),
                          truths=attack_truths(plan, self.datasets))

    def _score(self, ctx: RunContext, stages: Sequence[Stage], measured: Sequence[Setting],
               started: float) -> ModelRun:
        """Score the settings that ran and gather what the report lists besides the
        metrics: the tests, the ledger, example images and the CANARY per-attack metrics."""
        plan, images, target = self.plan, ctx.images, ctx.target
        ctx.progress.stage("scoring")
        # Settings that failed are listed in the report with their errors (IEEE-P4); the
        # metrics are those of the settings that ran.
        failed = [s for s in measured if s.failure is not None]
        settings = [s for s in measured if s.failure is None]
        setup = self._scoring_setup(target, images)
        settings = [self._prepare(s, setup.truth) for s in settings]
        scored = self.scoring.score(setup, settings)
        # example images: answers read from the settings, no target query
        examples = build_examples(ctx, settings, scored.metrics, truths=setup.truth) \
            if self.with_examples else []
        # CANARY per attack (CAN-1..4) through the scoring service's Compute, when asked
        canary = canary_metrics(ctx, settings, self.catalogue) if plan.canary else None
        ledger = self._ledger(stages, ctx)
        return ModelRun(started=started, images=images, target=target, settings=settings,
                        failed=failed, scored=scored, tests=self._tests(stages, len(images)),
                        ledger=ledger, examples=examples, canary=canary,
                        sequential=ctx.sequential.record(settings) if ctx.sequential else None)

    def _prepare(self, setting: Setting, truth: Any) -> Setting:
        """A setting as scoring takes it (segmentation answers on the truth's grid)."""
        if self.plan.target.task != Task.SEGMENTATION or setting.answers is None:
            return setting
        return _fit_masks(setting, truth)

    def _tests(self, stages: Sequence[Stage], n_images: int) -> list[TestDefinition]:
        """The plan's tests as the report lists them: perturbations, degradation, attacks."""
        tests = [t for s in stages for t in s.tests() if t.kind in ("corruption", "style")]
        tests += [t for s in stages for t in s.tests() if t.kind == "degradation"]
        observed = {k: v for s in stages if isinstance(s, QueryAttackStage)
                    for k, v in s.observed.items()}
        selected = {k: v for s in stages if isinstance(s, TransferAttackStage)
                    for k, v in s.selected.items()}
        return tests + attack_tests(self.plan, n_images, self.catalogue, observed, selected)

    def _scoring_setup(self, target: TargetDescription,
                       images: Sequence[LabeledImage]) -> ScoringSetup:
        plan = self.plan
        ids = tuple(i for i, _, _ in images)
        task = plan.target.task
        if task == Task.CLASSIFICATION:
            truth: Any = [list(lab) for _, _, lab in images]
            criterion: Any = plan.correctness
        else:
            truths = self.datasets.truths(plan)
            truth = [truths[i] for i in ids]
            criterion = plan.detection if task == Task.DETECTION else plan.segmentation
        scored = target.output_kind in ("full_scores", "top_k")
        reason = ("" if scored else "the target returns labels only; NDCG and DRR need scores "
                  "(RANK-3)") if task == Task.CLASSIFICATION else \
            f"NDCG and DRR rank classes; not defined for {task}"
        return ScoringSetup(image_ids=ids, task=task, truth=truth, criterion=criterion,
                            ranking=scored and task == Task.CLASSIFICATION, ranking_reason=reason,
                            num_classes=len(target.labels))

    def _ledger(self, stages: Sequence[Stage], ctx: RunContext) -> LedgerSummary:
        """Answered queries per session, read from the proxy's ledger. Every attempt at a
        query-attack chunk shares one session (Q_m across resumed attempts), so no
        session is left aborted; rows a crash interrupted stay in the ledger, unanswered."""
        eid, plan = self.evaluation_id, self.plan
        names = [SessionId.clean(eid)]
        if plan.corruptions:
            names.append(SessionId.corruptions(eid))
        if plan.degradation:
            names.append(SessionId.degradation(eid))
        names += [SessionId.transfer(eid, at.name) for at in plan.attacks
                  if not self.catalogue.attacks[at.id].is_query_attack]
        names += [SessionId.transfer(eid, f"{at.name}.select") for at in plan.attacks
                  if at.select_budget]      # CAN-6 budget selection's queries
        sessions = {str(s): self.proxy.session_queries(str(s))[0] for s in names}
        for stage in stages:
            if isinstance(stage, QueryAttackStage):
                for s in sorted(set(stage.sessions(ctx))):
                    sessions[s] = self.proxy.session_queries(s)[0]
        return LedgerSummary(sessions=sessions, aborted={})
