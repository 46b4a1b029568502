"""The evaluation service's application layer: accepts plans, runs them in worker threads,
resumes unfinished evaluations after a restart (CAN-9), cancels on request. No gRPC here:
the runner's ports are injected."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import structlog
from fortis.services.common import errors
from fortis.services.evaluation.plan import load_plan
from fortis.services.evaluation.ports import PerturbationPort, ProxyPort, ReportPort, ScoringPort
from fortis.services.evaluation.runner import Cancelled, DatasetLoader, EvaluationRunner, RunContext
from fortis.services.evaluation.store import FINAL_STATES, EvaluationRow, EvaluationStore

log = structlog.get_logger("fortis.evaluation")


@dataclass(frozen=True, kw_only=True)
class Ports:
    proxy: ProxyPort
    perturbation: PerturbationPort
    scoring: ScoringPort
    report: ReportPort


class EvaluationManager:
    """Owns the store and the worker threads."""

    def __init__(self, store: EvaluationStore, *, ports_for: Callable[[str], Ports],
                 load_dataset: DatasetLoader, artifacts_dir: Path, workers: int = 2) -> None:
        self.store = store
        self.ports_for = ports_for
        self.load_dataset = load_dataset
        self.artifacts_dir = artifacts_dir
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="evaluation")
        self._cancel: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._closed = False

    def resume_unfinished(self) -> list[str]:
        """Restart every evaluation a previous process left pending or running."""
        resumed = []
        for row in self.store.active():
            self.store.mark_resumed(row.evaluation_id)
            self._submit(row.evaluation_id)
            resumed.append(row.evaluation_id)
        if resumed:
            log.info("resumed evaluations", evaluations=resumed)
        return resumed

    def create(self, *, tenant: str, plan_text: str, fmt: str = "", evaluation_id: str = "") -> EvaluationRow:
        plan = load_plan(plan_text, fmt)   # InvalidArgument with field paths on a bad plan
        if evaluation_id:
            if len(evaluation_id) > 100 or not all(c.isalnum() or c in "-_." for c in evaluation_id):
                raise errors.InvalidArgument("evaluation_id", "use at most 100 letters, digits, '-', '_' or '.'")
            existing = self.store.get(evaluation_id)
            if existing is not None:
                if existing.tenant != tenant:
                    raise errors.AlreadyExists(f"evaluation '{evaluation_id}' exists")
                if existing.plan_text != plan_text:
                    raise errors.AlreadyExists(f"evaluation '{evaluation_id}' exists with another plan")
                return existing
        eid = evaluation_id or f"ev-{time.strftime('%Y%m%d')}-{uuid.uuid4().hex[:8]}"
        self.store.insert(evaluation_id=eid, tenant=tenant, plan_text=plan_text, plan_name=plan.name)
        self._submit(eid)
        row = self.store.get(eid)
        assert row is not None
        return row

    def get(self, tenant: str, evaluation_id: str) -> EvaluationRow:
        if not evaluation_id:
            raise errors.InvalidArgument("evaluation_id", "required")
        row = self.store.get(evaluation_id)
        if row is None or row.tenant != tenant:
            raise errors.NotFound("evaluation", evaluation_id)
        return row

    def cancel(self, tenant: str, evaluation_id: str) -> EvaluationRow:
        row = self.get(tenant, evaluation_id)
        if row.state in FINAL_STATES:
            raise errors.FailedPrecondition(f"evaluation '{evaluation_id}' already ended ({row.state})")
        with self._lock:
            ev = self._cancel.setdefault(evaluation_id, threading.Event())
        ev.set()
        self.store.update(evaluation_id, state="CANCELLED", message="cancelled by a caller",
                          finished_at=time.time())
        return self.get(tenant, evaluation_id)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            for ev in self._cancel.values():
                ev.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _submit(self, evaluation_id: str) -> None:
        with self._lock:
            ev = self._cancel.setdefault(evaluation_id, threading.Event())
        self._pool.submit(self._run, evaluation_id, ev)

    def _run(self, evaluation_id: str, cancel: threading.Event) -> None:
        row = self.store.get(evaluation_id)
        if row is None or row.state in FINAL_STATES:
            return
        structlog.contextvars.bind_contextvars(evaluation_id=evaluation_id, tenant=row.tenant)
        try:
            plan = load_plan(row.plan_text)
            ports = self.ports_for(row.tenant)
            ctx = RunContext(evaluation_id=evaluation_id, plan=plan, plan_text=row.plan_text,
                             store=self.store, proxy=ports.proxy, perturbation=ports.perturbation,
                             scoring=ports.scoring, report=ports.report,
                             load_dataset=self.load_dataset, artifacts_dir=self.artifacts_dir,
                             cancelled=cancel.is_set)
            EvaluationRunner(ctx).run()
            log.info("evaluation finished", evaluation_id=evaluation_id)
        except Cancelled:
            log.info("evaluation cancelled", evaluation_id=evaluation_id)
        except Exception as exc:  # noqa: BLE001 - any failure ends the evaluation as FAILED
            if self._closed:
                return  # shutting down: leave it RUNNING so the next start resumes it
            code = type(exc).__name__ if isinstance(exc, errors.FortisError) else "INTERNAL"
            msg = str(exc) if isinstance(exc, errors.FortisError) else f"internal error: {exc!r}"
            log.error("evaluation failed", evaluation_id=evaluation_id, error=msg)
            self.store.update(evaluation_id, state="FAILED", error_code=code, error_message=msg,
                              finished_at=time.time())
        finally:
            structlog.contextvars.unbind_contextvars("evaluation_id")
