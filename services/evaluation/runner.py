"""Runs one test plan (IEEE-P2): plan -> clean pass -> corruption robustness -> degradation
-> adversarial robustness -> scoring -> report. Domain code: reaches the other services
through ports (``ports.py``), runs its work as stages (``stages/``), each a list of resumable
work items (CAN-9).

The runner owns the order of the stages and the hand-over of their measured settings to the
scoring service and of the facts to the report service; it writes no report prose (the
report service does).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from importlib import metadata
from typing import Any

import numpy as np
from fortis.services.common.errors import FailedPrecondition, InvalidArgument, Unavailable
from fortis.services.evaluation.answers import SegmentationAnswers
from fortis.services.evaluation.canary_metrics import canary_metrics
from fortis.services.evaluation.examples import build_examples
from fortis.services.evaluation.executors import Executor
from fortis.services.evaluation.keys import SessionId
from fortis.services.evaluation.plan import Plan, check_against_target, check_surrogate_labels
from fortis.services.evaluation.ports import (
    Catalogue,
    LedgerSummary,
    PerturbationPort,
    ProxyPort,
    ReportInput,
    ReportPort,
    Scored,
    ScoringPort,
    ScoringSetup,
    Setting,
    TargetDescription,
)
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
from fortis.services.evaluation.store import ACTIVE_STATES, EvaluationStorage

__all__ = ["Cancelled", "DatasetPort", "EvaluationRunner", "LabeledImage", "RecordedFailure",
           "RunContext", "attack_truths", "build_stages", "check_target"]


class RecordedFailure(Exception):
    """A worker already ended the evaluation as FAILED with its own status:
    the service must not overwrite it."""


class DatasetPort:
    """How the runner gets the plan's images and (detection/segmentation) ground truth."""

    def images(self, plan: Plan) -> list[LabeledImage]:
        raise NotImplementedError

    def truths(self, plan: Plan) -> dict[str, Any]:
        raise NotImplementedError

    def for_tenant(self, tenant: str) -> DatasetPort:
        """The port as ``tenant``'s plans see it (its own uploads). Default: self."""
        return self


def attack_truths(plan: Plan, datasets: DatasetPort) -> dict[str, Any]:
    """Ground truth per image id for the query attacks' IEEE-C4 / C5 criteria (detection and
    segmentation plans with query attacks); empty otherwise."""
    if plan.target.task == "classification" or not plan.attacks:
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


@dataclass(kw_only=True)
class EvaluationRunner:
    """Executes one evaluation to the end (or until cancelled / failed)."""

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
    #: Workers that run the items first (``executors.py``). None: this process
    #: runs them all.
    executor: Executor | None = None
    #: Multi-target plans (``benchmark.py``): called with (scored, settings, images, target)
    #: after scoring; what it returns is the report's cross-model section (CAN-5/7/8/10).
    on_scored: Callable[..., Any] | None = None
    #: Example images for the report; off for the models of a multi-target plan
    #: whose own report is not kept (``benchmark.py``).
    with_examples: bool = True

    def run(self) -> Scored:
        plan, store, eid = self.plan, self.store, self.evaluation_id
        started = time.time()
        store.update_running(eid, state="RUNNING", stage="plan", started_at=started)
        images = self.datasets.images(plan)
        if not images:
            raise FailedPrecondition("the plan's dataset selection is empty")
        target = self.proxy.target_info(plan.target.name)
        check_target(plan, target, images, self.catalogue)
        stages = build_stages(plan, len(images), self.catalogue)
        keys = [k.format() for s in stages for k in s.keys()]
        if self.executor is not None:
            self._fan_out(keys)
        finished = {k for k, _, d in store.items(eid) if d}
        progress = Progress(store, eid)
        row = store.get(eid)
        progress.items_done = len([k for k in keys if k in finished])
        progress.queries = row.queries if row else 0
        progress.images_done = row.images_done if row else 0
        store.update_running(eid, items_total=len(keys), items_done=progress.items_done,
                             images_total=sum(s.images_total() for s in stages))
        ctx = RunContext(evaluation_id=eid, plan=plan, plan_text=self.plan_text, store=store,
                         proxy=self.proxy, perturbation=self.perturbation, scoring=self.scoring,
                         report=self.report, images=images, target=target,
                         progress=progress,
                         cancelled=self.cancelled,
                         chunk_ranges=chunks(len(images), plan.batch_size),
                         truths=attack_truths(plan, self.datasets))
        settings: list[Setting] = []
        for stage in stages:
            ctx.check_cancelled()       # a stage boundary is an item boundary (CAN-9)
            progress.stage(stage.progress_stage)
            settings += stage.run(ctx)

        # A cancel or a shutdown that came while the last items ran stops here: their
        # results are committed, scoring and the report are for the run that resumes it.
        ctx.check_cancelled()
        progress.stage("scoring")
        # Settings that failed are listed in the report with their errors (IEEE-P4); the
        # metrics are those of the settings that ran.
        failed = [s for s in settings if s.failure is not None]
        settings = [s for s in settings if s.failure is None]
        setup = self._scoring_setup(target, images)
        if plan.target.task == "segmentation":
            settings = [_fit_masks(s, setup.truth) for s in settings]
        scored = self.scoring.score(setup, settings)
        # example images: answers read from the settings, no target query
        examples = build_examples(ctx, settings, scored.metrics, truths=setup.truth) \
            if self.with_examples else []
        benchmark = self.on_scored(scored, settings, images, target) \
            if self.on_scored is not None else None
        # CANARY per attack (CAN-1..4) through the scoring service's Compute, when asked
        canary = canary_metrics(ctx, settings, self.catalogue) if plan.canary else None

        progress.stage("report")
        finished_at = time.time()
        tests = [t for s in stages for t in s.tests() if t.kind in ("corruption", "style")]
        tests += [t for s in stages for t in s.tests() if t.kind == "degradation"]
        observed = {k: v for s in stages if isinstance(s, QueryAttackStage)
                    for k, v in s.observed.items()}
        selected = {k: v for s in stages if isinstance(s, TransferAttackStage)
                    for k, v in s.selected.items()}
        tests += attack_tests(plan, len(images), self.catalogue, observed, selected)
        current = store.get(eid)
        report_json, report_html = self.report.render(ReportInput(
            plan=plan, plan_text=self.plan_text, target=target,
            environment={"python": platform.python_version(), "platform": platform.platform(),
                         "fortis": _version("fortis"), "torch": _version("torch"),
                         "numpy": _version("numpy")},
            metrics=scored.metrics, tests=tests, ledger=self._ledger(stages, ctx),
            evaluation_id=eid, started=started, finished=finished_at, images=len(images),
            resumed_count=current.resumed_count if current else 0, examples=examples,
            benchmark=benchmark, canary=canary, failed=failed))
        scored = replace(scored, summary=replace(
            scored.summary, failed_settings=tuple(s.label for s in failed)))
        store.finish(eid, report_json=report_json, report_html=report_html,
                     summary=scored.summary, finished_at=finished_at)
        return scored

    def _fan_out(self, keys: Sequence[str]) -> None:
        """Let the executor's workers run the unfinished items (they claim them from the
        store), and wait for them. A cancel stops the wait and the workers; a shutdown of
        this service only stops the wait (Kubernetes workers go on, the resumed evaluation
        finds their Job); a worker's permanent failure is already recorded."""
        assert self.executor is not None
        store, eid = self.store, self.evaluation_id
        done = {k for k, _, d in store.items(eid) if d}
        pending = [k for k in keys if k not in done]
        if not pending:
            return
        store.add_items(eid, keys)
        shards = self.executor.shards
        store.update_running(eid, stage="workers", items_total=len(keys),
                             message=f"{len(pending)} work items on {shards} workers")
        tenant = store.tenant or ""
        handle = self.executor.submit(tenant=tenant, evaluation_id=eid)

        def ended() -> bool:
            row = store.get(eid)
            return row is None or row.state not in ACTIVE_STATES

        outcome = self.executor.wait(handle, should_stop=lambda: self.cancelled() or ended())
        if outcome.state == "succeeded":
            return
        row = store.get(eid)
        if row is not None and row.state not in ACTIVE_STATES:
            self.executor.delete(handle)        # cancelled or failed: stop the rest
            if row.state == "FAILED":
                raise RecordedFailure(row.error_message)
            raise Cancelled("cancelled by a caller")
        if outcome.state == "stopped":
            raise Cancelled("stopped while waiting for the workers")
        raise Unavailable(f"the evaluation's workers failed ({outcome.reason}); its finished "
                          "items are kept: resume it to go on")

    def _scoring_setup(self, target: TargetDescription,
                       images: Sequence[LabeledImage]) -> ScoringSetup:
        plan = self.plan
        ids = tuple(i for i, _, _ in images)
        task = plan.target.task
        if task == "classification":
            truth: Any = [list(lab) for _, _, lab in images]
            criterion: Any = plan.correctness
        else:
            truths = self.datasets.truths(plan)
            truth = [truths[i] for i in ids]
            criterion = plan.detection if task == "detection" else plan.segmentation
        scored = target.output_kind in ("full_scores", "top_k")
        reason = ("" if scored else "the target returns labels only; NDCG and DRR need scores "
                  "(RANK-3)") if task == "classification" else \
            f"NDCG and DRR rank classes; not defined for {task}"
        return ScoringSetup(image_ids=ids, task=task, truth=truth, criterion=criterion,
                            ranking=scored and task == "classification", ranking_reason=reason,
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
