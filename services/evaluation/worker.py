"""The worker entry point's domain half: one of several processes (Indexed Job pods, or
local processes) running the work items of one evaluation.

A worker loads the evaluation's stored plan, its images and the target's description, and
runs every stage with the runner's own stage code (``build_stages``) under exclusive claims
(``claims.py``), so that together the workers compute exactly the items the single-process
runner would, each once. It scores nothing and renders nothing: when the workers are done
the evaluation service runs the runner, which finds every item finished and goes on to
scoring and the report, so the metrics equal a single-process run's (CAN-9's determinism:
every random draw comes from the plan's seed and the item's identity).

A multi-target plan (CANARY benchmark, ``benchmark.py``) is run model by model in the order
the evaluation service's ``BenchmarkRunner`` measures them (``benchmark.member_runs``): each
model's items under its prefix (``m<k>/``), its proxy sessions under ``<evaluation>.m<k>``,
its transfer examples shared by name, so the workers compute what the one-process run
computes; a worker goes on to the next model once every item of this one is finished (by
any worker), because the next model is sent the examples this one crafted.

A worker stops at its next item boundary when asked to (SIGTERM: ``stop``) or when the
evaluation was cancelled or ended, and gives back the leases of what it did not finish.
Failures are classified for the Job's backoff: a transient one (the proxy or the database
unreachable) is raised for the process to exit non-zero and be retried; a permanent one
(the plan no longer fits the target, a target's permanent refusal) ends the evaluation as
FAILED with its status, once, whatever the number of workers. Domain code: no gRPC.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog
from fortis.infra.serving import tracing
from fortis.infra.serving.status import status_for
from fortis.services.common import errors
from fortis.services.evaluation.benchmark import (
    baseline_of,
    benchmark_sources,
    member_runs,
    member_store,
    shared_settings,
)
from fortis.services.evaluation.claims import DEFAULT_LEASE_S, ItemClaims
from fortis.services.evaluation.plan import Plan, load_plan
from fortis.services.evaluation.ports import (
    Catalogue,
    PerturbationPort,
    ProxyPort,
    ReportInput,
    Scored,
    ScoringSetup,
    Setting,
)
from fortis.services.evaluation.runner import (
    DatasetPort,
    attack_truths,
    build_stages,
    check_target,
)
from fortis.services.evaluation.stages import Cancelled, RunContext
from fortis.services.evaluation.stages.base import WorkerProgress, chunks
from fortis.services.evaluation.store import ACTIVE_STATES, EvaluationStorage

log = structlog.get_logger("fortis.evaluation.worker")

#: Errors a retried pod may get past (the Job's backoff retries the pod).
TRANSIENT = (errors.Unavailable, errors.DeadlineExceeded)


def worker_id(index: int | str) -> str:
    """This process's name in leases: host, pid and Job completion index."""
    return f"{socket.gethostname()[:100]}-{os.getpid()}-i{index}"


def _not_here(what: str) -> errors.FailedPrecondition:
    return errors.FailedPrecondition(f"a worker does not call the {what} service")


class _NoScoring:
    """Scoring is the evaluation service's, never a worker's (stages measure only)."""

    def score(self, setup: ScoringSetup, settings: Iterable[Setting]) -> Scored:
        raise _not_here("scoring")

    def compute(self, metric: str, arrays: Mapping[str, np.ndarray],
                params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        raise _not_here("scoring")


class _NoReport:
    """The report is the evaluation service's, never a worker's."""

    def render(self, parts: ReportInput) -> tuple[str, str]:
        raise _not_here("report")


@dataclass(frozen=True)
class WorkerResult:
    """What one worker did: ``state`` is ``done`` (every item of the evaluation finished),
    ``stopped`` (asked to stop, or the evaluation ended or was cancelled) or ``failed``."""

    state: str
    ran: int = 0
    reused: int = 0
    waited: int = 0
    seconds: float = 0.0
    message: str = ""


@dataclass(kw_only=True)
class EvaluationWorker:
    """Runs the items of one evaluation that no other worker holds (see the module doc)."""

    evaluation_id: str
    store: EvaluationStorage          # scoped to the evaluation's tenant
    proxy: ProxyPort
    perturbation: PerturbationPort
    datasets: DatasetPort
    catalogue: Catalogue
    worker_id: str
    lease_s: float = DEFAULT_LEASE_S
    poll_s: float = 0.5
    parallel: int = 2
    stop: Callable[[], bool] = lambda: False
    #: How often the evaluation's state is re-read to notice a cancel (seconds).
    state_check_s: float = 1.0

    def __post_init__(self) -> None:
        self._checked = 0.0
        self._ended = False
        #: the claims of the parts (models) this worker finished
        self._done: list[ItemClaims] = []

    def _cancelled(self) -> bool:
        if self.stop() or self._ended:
            return True
        now = time.monotonic()
        if now - self._checked >= self.state_check_s:
            self._checked = now
            row = self.store.get(self.evaluation_id)
            self._ended = row is None or row.state not in ACTIVE_STATES
        return self._ended

    def _parts(self, plan: Plan) -> list[tuple[Plan, str, Any]]:
        """(single-target plan, evaluation id of its sessions, store as it sees it) of each
        part of the evaluation in run order: the plan itself, or each model of a
        multi-target plan (module doc)."""
        eid = self.evaluation_id
        if not plan.is_benchmark:
            return [(plan, eid, self.store)]
        baseline = baseline_of(self.store, plan) if plan.baseline else None
        sources = benchmark_sources(plan, baseline)
        shared = shared_settings(plan, self.catalogue, sources)
        return [(r.plan, r.evaluation_id,
                 member_store(self.store, r, evaluation_id=eid, shared=shared,
                              baseline=plan.baseline))
                for r in member_runs(plan, self.catalogue, eid, sources)]

    def run(self) -> WorkerResult:
        t0 = time.monotonic()
        eid = self.evaluation_id
        row = self.store.get(eid)
        if row is None:
            raise errors.NotFound("evaluation", eid)
        if row.state not in ACTIVE_STATES:
            return WorkerResult("stopped", message=f"the evaluation is {row.state}")
        claims = ItemClaims(self.store, eid, self.worker_id, lease_s=self.lease_s,
                            poll_s=self.poll_s)
        self._done = []
        try:
            plan = load_plan(row.plan_text, self.catalogue)
            images = self.datasets.images(plan)
            if not images:
                raise errors.FailedPrecondition("the plan's dataset selection is empty")
            for part, part_eid, store in self._parts(plan):
                target = self.proxy.target_info(part.target.name)
                check_target(part, target, images, self.catalogue)
                stages = build_stages(part, len(images), self.catalogue)
                # one set of claims per model: its keys are prefixed by its store
                claims = ItemClaims(store, part_eid, self.worker_id, lease_s=self.lease_s,
                                    poll_s=self.poll_s)
                ctx = RunContext(evaluation_id=part_eid, plan=part, plan_text=row.plan_text,
                                 store=store, proxy=self.proxy,
                                 perturbation=self.perturbation,
                                 scoring=_NoScoring(), report=_NoReport(),
                                 images=images, target=target,
                                 progress=WorkerProgress(store, part_eid),
                                 cancelled=self._cancelled, parallel=self.parallel,
                                 chunk_ranges=chunks(len(images), part.batch_size),
                                 claims=claims.start(),
                                 truths=attack_truths(part, self.datasets))
                log.info("worker_started", evaluation_id=eid, worker=self.worker_id,
                         target=part.target.name, items=sum(len(s.keys()) for s in stages))
                for stage in stages:
                    with tracing.stage_span(stage, part_eid):
                        stage.run(ctx)
                claims.close()
                self._done.append(claims)
        except Cancelled:
            claims.close()
            why = "asked to stop" if self.stop() else "the evaluation ended or was cancelled"
            return self._result("stopped", claims, t0, why)
        except TRANSIENT:
            claims.close()
            raise
        except Exception as exc:   # noqa: BLE001 - a permanent failure ends the evaluation
            claims.close()
            status = status_for(exc)
            self.store.update_running(eid, state="FAILED", stage="done",
                                      error_code=str(status.code), error_message=status.message,
                                      error_status=status.SerializeToString(),
                                      finished_at=time.time())
            log.error("worker_failed", evaluation_id=eid, worker=self.worker_id,
                      error=status.message)
            return self._result("failed", claims, t0, status.message)
        return self._result("done", claims, t0, "")      # every part's claims are closed

    def _result(self, state: str, claims: ItemClaims, t0: float, message: str) -> WorkerResult:
        every = [*self._done, claims] if claims not in self._done else self._done
        res = WorkerResult(state, ran=sum(c.ran for c in every),
                           reused=sum(c.reused for c in every),
                           waited=sum(c.waited for c in every),
                           seconds=round(time.monotonic() - t0, 3), message=message)
        log.info("worker_finished", evaluation_id=self.evaluation_id, worker=self.worker_id,
                 state=state, ran=res.ran, reused=res.reused, waited=res.waited,
                 duration_s=res.seconds)
        return res
