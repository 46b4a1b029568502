"""The evaluation service's application layer: accepts plans, runs them in worker threads,
resumes unfinished evaluations after a restart (CAN-9), cancels on request. No gRPC here:
the runner's ports are injected.

Tenancy: evaluations live in their tenant's namespace (the store's
``for_tenant`` view): tenant B can neither see nor block tenant A's evaluation ids, and a
foreign id is NOT_FOUND with the same message as an unknown one. Evaluation ids are
restricted (``check_evaluation_id``) and artifacts are kept in the store under the
(tenant, evaluation, name) key: one shared store, whichever worker wrote them."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import structlog
from fortis.infra.serving import tracing
from fortis.infra.serving.quotas import QuotaSettings
from fortis.infra.serving.status import status_for
from fortis.services.common import errors
from fortis.services.evaluation.benchmark import (
    BenchmarkRunner,
    baseline_of,
    benchmark_sources,
    check_baseline,
    member_runs,
)
from fortis.services.evaluation.estimate import QueryEstimate, estimate_plan, ledger_groups
from fortis.services.evaluation.executors import Executor
from fortis.services.evaluation.plan import Plan, check_against_target, load_plan
from fortis.services.evaluation.plan_text import parse_plan_text
from fortis.services.evaluation.ports import (
    Catalogue,
    PerturbationPort,
    ProxyPort,
    ReportPort,
    ScoringPort,
)
from fortis.services.evaluation.runner import DatasetPort, EvaluationRunner, RecordedFailure
from fortis.services.evaluation.scheduling import FairScheduler
from fortis.services.evaluation.stages import Cancelled
from fortis.services.evaluation.store import FINAL_STATES, EvaluationRow, EvaluationStorage

log = structlog.get_logger("fortis.evaluation")

#: Evaluation ids: letters, digits, '-', '_', '.', not starting with '.', at most 100 (they
#: name proxy sessions "<id>/clean" and artifact folders).
EVALUATION_ID_MAX = 100
_EVALUATION_ID = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]*")


def check_attacks(plan: Plan, perturbation: PerturbationPort, output_kind: str = "") -> None:
    """Every attack of the plan as the perturbation service would run it (ValidateAttack):
    its rules between parameters, its task and targeted support, the signal it needs from a
    target returning ``output_kind`` ("" = not known). One InvalidArgument naming each
    problem by its plan field (``attacks[i].params.epsilon``), before anything runs."""
    found: list[errors.FieldViolation] = []
    for i, at in enumerate(plan.attacks):
        try:
            perturbation.validate_attack(at.id, at.params, task=plan.target.task,
                                         output_kind=output_kind, criterion=at.criterion,
                                         surrogate=at.surrogate, ensemble=at.ensemble)
        except errors.InvalidArgument as exc:
            for v in exc.violations:
                where = "id" if v.field in ("attack_id", "") else v.field
                found.append(errors.FieldViolation(f"attacks[{i}].{where}", v.description))
        except errors.PermissionDenied as exc:
            # a target's twin as surrogate without the operator's white-box grant: refused
            # before anything runs, naming the plan's field
            raise errors.PermissionDenied(exc.description or exc.message,
                                          field=f"attacks[{i}].{exc.field or 'surrogate'}"
                                          ) from None
    # A benchmark crafts its transfer attacks that name no surrogate on each model's own
    # surrogate: each model's surrogate is checked as such an attack would name it.
    expanded = next((at for at in plan.attacks if not at.surrogate), None)
    for k, m in enumerate(plan.members):
        if expanded is None or not m.surrogate:
            continue
        try:
            perturbation.validate_attack(expanded.id, expanded.params, task=plan.target.task,
                                         output_kind=output_kind, criterion=expanded.criterion,
                                         surrogate=m.surrogate)
        except errors.InvalidArgument:
            pass        # the attack's own problems are reported above by its field
        except errors.PermissionDenied as exc:
            raise errors.PermissionDenied(exc.description or exc.message,
                                          field=f"targets[{k}].surrogate") from None
    if found:
        raise errors.InvalidArgument.from_violations(found[:100])


#: A probe image for the perturbations whose refusals only running them shows (a model
#: file under the perturbation service's model root): small, so the check costs little.
_PROBE = np.zeros((32, 32, 3), dtype=np.uint8)


def check_models(plan: Plan, perturbation: PerturbationPort) -> None:
    """The plan's perturbations that load a model (neural_style's ``model`` / ``model_path``)
    run once on a small probe image, so a model the run could not load (no model root, a path
    outside it, another tenant's upload) is refused now, naming ``corruptions[i].params.*``;
    degradation operators on a surrogate are checked for the tenant's white-box grant
    (``degradation[i].surrogate``)."""
    for i, c in enumerate(plan.corruptions):
        if c.id != "neural_style" and not ({"model", "model_path"} & set(c.params)):
            continue
        try:
            perturbation.perturb(c.id, min(c.severities or (1,)), plan.seed,
                                 [("validate", _PROBE)], params=c.params)
        except errors.InvalidArgument as exc:
            raise errors.InvalidArgument.from_violations(
                [errors.FieldViolation(f"corruptions[{i}].{v.field}", v.description)
                 for v in exc.violations]) from None
    for i, d in enumerate(plan.degradation):
        if not d.surrogate:
            continue
        try:
            perturbation.perturb(d.id, min(d.levels or (1,)), plan.seed,
                                 [("validate", _PROBE[:1, :1, :1])], surrogate=d.surrogate,
                                 labels=[0])
        except errors.PermissionDenied as exc:
            raise errors.PermissionDenied(exc.description or exc.message,
                                          field=f"degradation[{i}].surrogate") from None
        except errors.FortisError:
            pass        # the probe is no image for this surrogate: only its grant is asked


#: A tenant's newest evaluations searched for a finished run of the same plan (the estimate's
#: expected counts): bounded, so an estimate costs one page of the store whatever its size.
PRIOR_SCAN = 200


def _normalised(plan_text: str, fmt: str) -> tuple[str, object]:
    """The plan's document as canonical JSON (comments, key order and layout aside) and its
    name; ("", None) when it does not parse."""
    try:
        doc = parse_plan_text(plan_text, fmt)
    except errors.FortisError:
        return "", None
    return json.dumps(doc, sort_keys=True, default=str), doc.get("name")


def check_evaluation_id(evaluation_id: str) -> None:
    """InvalidArgument (field ``evaluation_id``, never echoing the id) unless safe."""
    if len(evaluation_id) > EVALUATION_ID_MAX or not _EVALUATION_ID.fullmatch(evaluation_id):
        raise errors.InvalidArgument(
            "evaluation_id", f"use at most {EVALUATION_ID_MAX} letters, digits, '-', '_' or '.',"
            " not starting with '.'")


@dataclass(frozen=True, kw_only=True)
class Ports:
    proxy: ProxyPort
    perturbation: PerturbationPort
    scoring: ScoringPort
    report: ReportPort


class EvaluationManager:
    """Owns the store and the worker threads.

    Scheduling (per-tenant quotas and fair scheduling): evaluations wait in a
    :class:`~fortis.services.evaluation.scheduling.FairScheduler` (round-robin across tenants,
    oldest first within one, each tenant's ``running`` quota respected) and a worker starts
    the one it picks; CreateEvaluation beyond the tenant's ``queued`` quota is refused
    (``QuotaExceeded``, nothing stored). Resumed evaluations re-enter the same queue."""

    def __init__(self, store: EvaluationStorage, *, ports_for: Callable[[str], Ports],
                 datasets: DatasetPort, workers: int = 2,
                 catalogue_ttl_s: float = 60.0, quotas: QuotaSettings | None = None,
                 executor: Executor | None = None) -> None:
        self.store = store
        #: Workers that run the work items; None: the worker threads run them.
        self.executor = executor
        self.ports_for = ports_for
        self.datasets = datasets
        self._catalogue: tuple[float, Catalogue] | None = None
        self._catalogue_ttl = catalogue_ttl_s
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="evaluation")
        self._cancel: dict[tuple[str, str], threading.Event] = {}
        #: The trace context of the call that created (or resumed) each queued evaluation:
        #: its run is a child of that call's span (one trace from CreateEvaluation on).
        self._trace_of: dict[tuple[str, str], dict[str, str]] = {}
        self._lock = threading.Lock()
        self._closed = False
        #: Evaluations a worker thread is running now (what a shutdown may cut short).
        self._running: set[tuple[str, str]] = set()
        self._idle = threading.Condition(self._lock)
        self.quotas = quotas or QuotaSettings()
        #: Waiting and started evaluations (payload: the creating call's request id).
        self._sched: FairScheduler[str] = FairScheduler(workers, self.quotas.running_limit)

    def resume_unfinished(self) -> list[str]:
        """Restart every evaluation a previous process left pending or running."""
        resumed = []
        # All enter the fair queue (oldest first within a tenant) before any starts.
        for row in self.store.active():
            self.store.for_tenant(row.tenant).mark_resumed(row.evaluation_id)
            with self._lock:
                self._enqueue_locked(row.tenant, row.evaluation_id)
            resumed.append(row.evaluation_id)
        self._dispatch()
        if resumed:
            log.info("resumed evaluations", evaluations=resumed)
        return resumed

    def catalogue(self, tenant: str) -> Catalogue:
        """What plans may name, learned from the perturbation service (cached briefly)."""
        now = time.monotonic()
        with self._lock:
            cached = self._catalogue
        if cached is not None and now - cached[0] < self._catalogue_ttl:
            return cached[1]
        cat = self.ports_for(tenant).perturbation.catalogue()
        with self._lock:
            self._catalogue = (now, cat)
        return cat

    def validate(self, *, tenant: str, plan_text: str, fmt: str = "") -> Plan:
        """A plan checked against the catalogue and the targets this tenant may query:
        InvalidArgument listing every problem, each naming its field."""
        catalogue = self.catalogue(tenant)
        plan = load_plan(plan_text, catalogue, fmt)
        proxy = self.ports_for(tenant).proxy
        targets = proxy.target_names()
        shown = ", ".join(sorted(targets)[:20]) or "none"
        if not plan.members and plan.target.name not in targets:
            raise errors.InvalidArgument("target.name", f"no target '{plan.target.name[:100]}' "
                                         f"on this server; available: {shown}")
        missing = [errors.FieldViolation(f"targets[{i}].name", f"no target '{m.name[:100]}' "
                                         f"on this server; available: {shown}")
                   for i, m in enumerate(plan.members) if m.name not in targets]
        if missing:
            raise errors.InvalidArgument.from_violations(missing)
        if plan.baseline:
            check_baseline(self.store.for_tenant(tenant), plan.baseline)
        perturbation = self.ports_for(tenant).perturbation
        # what the first stage would refuse, found now: the data it reads, the models the
        # plan names (another tenant's upload, no model root), the surrogates' grants
        if hasattr(self.datasets, "check") and hasattr(self.datasets, "for_tenant"):
            self.datasets.for_tenant(tenant).check(plan)
        check_models(plan, perturbation)
        for name in [m.name for m in plan.members] or [plan.target.name]:
            if not plan.attacks:  # the signal each attack needs (IEEE-A8), before anything runs
                break
            try:
                target = proxy.target_info(name)
            except (errors.Unavailable, errors.DeadlineExceeded, errors.TargetFailed):
                target = None    # the target is down now: the run checks again when it starts
            if target is not None:
                check_against_target(replace(plan, target=replace(plan.target, name=name)),
                                     target, catalogue)
            check_attacks(plan, perturbation, target.output_kind if target else "")
        return plan

    def estimate(self, *, tenant: str, plan: Plan, plan_text: str, fmt: str = "",
                 expected: bool = True) -> QueryEstimate:
        """The target queries a validated plan will make (``estimate.py``): over the images
        its dataset selection resolves to, with the expected counts of the tenant's latest
        finished evaluation of the same plan, the least time under the target's and the
        tenant's images/s limits, and the price the plan (its endpoint's
        ``?price_per_1000=``) or else the operator's target configuration declares. The
        tenant's queries today and its daily quota come from the proxy, over its contract."""
        catalogue = self.catalogue(tenant)
        datasets = self.datasets.for_tenant(tenant)
        n = datasets.count(plan)
        store = self.store.for_tenant(tenant)
        members: list[tuple[Plan, str]] = []
        if plan.is_benchmark:       # each model as the benchmark runs it, in index order
            sources = benchmark_sources(plan, baseline_of(store, plan) if plan.baseline
                                        else None)
            runs = sorted(member_runs(plan, catalogue, "estimate", sources),
                          key=lambda r: r.index)
            members = [(r.plan, r.prefix.replace("/", ":")) for r in runs]
        proxy = self.ports_for(tenant).proxy
        terms = proxy.target_terms()
        usage = proxy.tenant_usage()
        prices: dict[str, tuple[float, str]] = {}
        own = {m.name: m.price_per_1000 for m in plan.members} or \
            {plan.target.name: plan.target.price_per_1000}
        for name, price in own.items():
            operator = terms.get(name, (0.0, None))[1]
            if price is not None:
                prices[name] = (price, "plan")
            elif operator is not None:
                prices[name] = (operator, "target")
        # the expected counts read the tenant's stored evaluations; the quota check at
        # creation needs the fixed part only
        prior_from, prior = self._prior_run(tenant, plan_text, fmt) if expected else ("", None)
        return estimate_plan(
            plan, n, catalogue, members=members, prior=prior, prior_from=prior_from,
            target_rates={k: v[0] for k, v in terms.items()},
            tenant_rate=usage.images_per_second, prices=prices,
            tenant_queries_today=usage.queries_today,
            tenant_queries_per_day=usage.queries_per_day)

    def _prior_run(self, tenant: str, plan_text: str, fmt: str
                   ) -> tuple[str, dict[str, int] | None]:
        """The ledger counts of the tenant's newest SUCCEEDED evaluation of this plan (the
        same text, or the same document once parsed: comments and layout aside), among its
        :data:`PRIOR_SCAN` newest evaluations; ("", None) when there is none."""
        store = self.store.for_tenant(tenant)
        want: tuple[str, object] | None = None
        for row in store.list(tenant, limit=PRIOR_SCAN):
            if row.state != "SUCCEEDED":
                continue
            if row.plan_text != plan_text:
                # another text: parsed only when the names agree (the stored name is the plan's)
                want = want or _normalised(plan_text, fmt)
                if row.plan_name != want[1] or _normalised(row.plan_text, "")[0] != want[0]:
                    continue
            try:
                doc = json.loads(store.report(row.evaluation_id)[0])
                sessions = doc["ledger"]["sessions"]
                counts = {str(k): int(v) for k, v in sessions.items()}
            except (ValueError, TypeError, KeyError, errors.FortisError):
                continue
            return row.evaluation_id, ledger_groups(counts, row.evaluation_id)
        return "", None

    def check_daily_quota(self, tenant: str, est: QueryEstimate) -> None:
        """QuotaExceeded (RESOURCE_EXHAUSTED, QuotaFailure on ``tenant:<name>``) when the
        plan's fixed queries exceed what is left of the tenant's queries per day: refused
        before anything is stored or sent. The fixed part, not the upper bound: a query
        attack's bound is often far above what it spends, and the proxy still refuses any
        query past the quota while the evaluation runs."""
        quota, used = est.tenant_queries_per_day, est.tenant_queries_today
        if not quota or est.fixed <= quota - used:
            return
        log.warning("evaluation_refused", reason="quota", quota="queries_per_day",
                    tenant=tenant, planned=est.fixed, used=used, limit=quota)
        raise errors.QuotaExceeded([errors.QuotaViolation(
            f"tenant:{tenant[:100]}",
            f"queries per day: planned {est.fixed} (fixed; at most {est.upper_bound} with "
            f"the adaptive attacks), used today {used}, quota {quota}: {max(0, quota - used)} "
            "left; the count starts again at 00:00 UTC")])

    def create(self, *, tenant: str, plan_text: str, fmt: str = "", evaluation_id: str = "") -> EvaluationRow:
        plan = self.validate(tenant=tenant, plan_text=plan_text, fmt=fmt)
        store = self.store.for_tenant(tenant)
        if evaluation_id:
            check_evaluation_id(evaluation_id)
        eid = evaluation_id or f"ev-{time.strftime('%Y%m%d')}-{uuid.uuid4().hex[:8]}"
        known = store.get(evaluation_id) if evaluation_id else None
        # the tenant's daily query quota, asked of the proxy before anything is stored
        est = self.estimate(tenant=tenant, plan=plan, plan_text=plan_text, fmt=fmt,
                            expected=False) \
            if known is None else None
        # Existing id, quota check, insert and queue as one step: an idempotent re-create
        # returns the evaluation whatever the quota; no two creates race past the quota.
        with self._lock:
            existing = store.get(evaluation_id) if evaluation_id else None
            if existing is None:
                if est is not None:
                    self.check_daily_quota(tenant, est)
                self._check_queued_quota(tenant, target=plan.target.name)
                store.insert(evaluation_id=eid, tenant=tenant, plan_text=plan_text,
                             plan_name=plan.name)
                self._enqueue_locked(tenant, eid)
        if existing is not None:
            if existing.plan_text != plan_text:
                raise errors.AlreadyExists(f"evaluation '{evaluation_id}' exists with another plan")
            return existing
        # Audit: who created what against which target; the request id comes from
        # the call's bound context (the server interceptor).
        log.info("evaluation_created", tenant=tenant, evaluation_id=eid, target=plan.target.name,
                 plan=plan.name)
        self._dispatch()
        row = store.get(eid)
        assert row is not None
        return row

    def get(self, tenant: str, evaluation_id: str) -> EvaluationRow:
        if not evaluation_id:
            raise errors.InvalidArgument("evaluation_id", "required")
        check_evaluation_id(evaluation_id)
        row = self.store.for_tenant(tenant).get(evaluation_id)
        if row is None:
            raise errors.NotFound("evaluation", evaluation_id)
        return row

    def cancel(self, tenant: str, evaluation_id: str) -> EvaluationRow:
        row = self.get(tenant, evaluation_id)
        if row.state in FINAL_STATES:
            raise errors.FailedPrecondition(f"evaluation '{evaluation_id}' already ended ({row.state})")
        with self._lock:
            ev = self._cancel.setdefault((tenant, evaluation_id), threading.Event())
            if self._sched.remove(tenant, evaluation_id):    # queued: it never starts
                self._cancel.pop((tenant, evaluation_id), None)
                self._trace_of.pop((tenant, evaluation_id), None)
        ev.set()
        self.store.for_tenant(tenant).update_running(evaluation_id, state="CANCELLED", stage="done",
                                  message="cancelled by a caller", finished_at=time.time())
        return self.get(tenant, evaluation_id)

    def close(self) -> None:
        """Stop for a shutdown: running evaluations stop at their next item boundary and stay
        RUNNING in the store, so the next start resumes them (CAN-9); queued ones never
        start. Does not wait: ``wait_idle`` bounds the wait, since one item may be long."""
        with self._lock:
            self._closed = True
            for ev in self._cancel.values():
                ev.set()
        changed = getattr(self.store, "changed", None)
        if changed is not None:     # WatchEvaluation streams notice at once (and end)
            with changed:
                changed.notify_all()
        self._pool.shutdown(wait=False, cancel_futures=True)
        close = getattr(self.executor, "close", None)
        if close is not None:       # local worker processes stop with the service
            close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran: the service is shutting down (SIGTERM)."""
        return self._closed

    def wait_idle(self, timeout: float) -> list[str]:
        """Wait at most ``timeout`` seconds for the worker threads to finish; return the ids
        of the evaluations still running (a shutdown cuts them short, to be resumed)."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._idle.wait(left)
            return sorted(f"{t}/{e}" for t, e in self._running)

    def _check_queued_quota(self, tenant: str, *, target: str) -> None:
        """QuotaExceeded (RESOURCE_EXHAUSTED, QuotaFailure on ``tenant:<name>``) and an audit
        line when the tenant already has its ``queued`` quota of evaluations waiting.
        Called with the lock held."""
        limit = self.quotas.queued_limit(tenant)
        waiting = self._sched.queued(tenant)
        if limit and waiting >= limit:
            log.warning("evaluation_refused", reason="quota", quota="queued_evaluations",
                        tenant=tenant, target=target, limit=limit, queued=waiting)
            raise errors.QuotaExceeded([errors.QuotaViolation(
                f"tenant:{tenant[:100]}",
                f"queued evaluations: {waiting} of {limit} waiting to start; wait for one to "
                "start or cancel one")])

    def queue_counts(self, tenant: str) -> tuple[int, int]:
        """(running, queued) evaluations of ``tenant`` in the scheduler now."""
        with self._lock:
            return self._sched.running(tenant), self._sched.queued(tenant)

    def _enqueue_locked(self, tenant: str, evaluation_id: str) -> None:
        """Put an evaluation in the fair queue (the lock held); :meth:`_dispatch` starts it
        when its turn comes. The creating call's request id and trace context follow it into
        its worker."""
        request_id = str(structlog.contextvars.get_contextvars().get("request_id", ""))
        carrier: dict[str, str] = {}
        tracing.inject(carrier)
        if carrier:
            self._trace_of[(tenant, evaluation_id)] = carrier
        self._cancel.setdefault((tenant, evaluation_id), threading.Event())
        self._sched.push(tenant, evaluation_id, request_id)

    def _dispatch(self) -> None:
        """Hand every evaluation the scheduler lets start now to a worker thread (never more
        than the workers: the pool never holds a waiting task)."""
        with self._lock:
            if self._closed:
                return
            for pick in self._sched.drain():
                ev = self._cancel.setdefault((pick.tenant, pick.job_id), threading.Event())
                self._pool.submit(self._run, pick.tenant, pick.job_id, ev, pick.payload)

    def _run(self, tenant: str, evaluation_id: str, cancel: threading.Event,
             request_id: str = "") -> None:
        if self._closed:
            return
        key = (tenant, evaluation_id)
        with self._lock:
            self._running.add(key)
            carrier = self._trace_of.pop(key, {})
        try:
            with tracing.span("evaluation.run", {"fortis.tenant": tenant[:200],
                                                 "fortis.evaluation_id": evaluation_id[:200]},
                              parent=tracing.extract(carrier)):
                self._run_one(tenant, evaluation_id, cancel, request_id)
        finally:
            with self._idle:
                self._running.discard(key)
                self._sched.done(tenant, evaluation_id)
                self._cancel.pop(key, None)
                self._idle.notify_all()
            self._dispatch()     # the freed worker takes the next tenant's turn

    def _run_one(self, tenant: str, evaluation_id: str, cancel: threading.Event,
                 request_id: str) -> None:
        store = self.store.for_tenant(tenant)
        row = store.get(evaluation_id)
        if row is None or row.state in FINAL_STATES:
            return
        structlog.contextvars.bind_contextvars(evaluation_id=evaluation_id, tenant=row.tenant,
                                               request_id=request_id, **tracing.trace_ids())
        t0 = time.monotonic()
        target = ""
        try:
            ports = self.ports_for(row.tenant)
            catalogue = self.catalogue(row.tenant)
            plan = load_plan(row.plan_text, catalogue)
            target = plan.target.name
            log.info("evaluation_started", target=target, resumed=row.resumed_count > 0)
            runner = BenchmarkRunner if plan.is_benchmark else EvaluationRunner
            # the report's expected queries: a finished run of the same plan, if any
            prior = {} if plan.is_benchmark else \
                {"estimate_prior": self._prior_run(row.tenant, row.plan_text, "")[1]}
            runner(evaluation_id=evaluation_id, plan=plan, plan_text=row.plan_text,
                   store=store, proxy=ports.proxy,
                   perturbation=ports.perturbation, scoring=ports.scoring,
                   report=ports.report, datasets=self.datasets.for_tenant(row.tenant),
                   catalogue=catalogue,
                   cancelled=cancel.is_set, executor=self.executor, **prior).run()
            final = store.get(evaluation_id)
            log.info("evaluation_finished", target=target,
                     state=final.state if final is not None else "UNKNOWN",
                     duration_s=round(time.monotonic() - t0, 3))
        except RecordedFailure as exc:
            log.info("evaluation_finished", target=target, state="FAILED",
                     duration_s=round(time.monotonic() - t0, 3), error=str(exc)[:300],
                     recorded_by="worker")
        except Cancelled:
            if self._closed:
                log.info("evaluation_interrupted", target=target, reason="shutdown",
                         duration_s=round(time.monotonic() - t0, 3))
            else:
                log.info("evaluation_finished", target=target, state="CANCELLED",
                         duration_s=round(time.monotonic() - t0, 3))
        except Exception as exc:  # noqa: BLE001 - any failure ends the evaluation as FAILED
            if self._closed:
                # shutting down: leave it RUNNING so the next start resumes it
                log.info("evaluation_interrupted", target=target, reason="shutdown",
                         duration_s=round(time.monotonic() - t0, 3))
                return
            if cancel.is_set():
                log.info("evaluation_finished", target=target, state="CANCELLED",
                         duration_s=round(time.monotonic() - t0, 3))
                return  # cancelled while a call was in flight: CANCELLED stays
            status = status_for(exc)
            log.error("evaluation failed", error=status.message,
                      **({"exception": repr(exc)[:500]} if not isinstance(exc, errors.FortisError) else {}))
            store.update_running(evaluation_id, state="FAILED", stage="done",
                                      error_code=str(status.code), error_message=status.message,
                                      error_status=status.SerializeToString(),
                                      finished_at=time.time())
            log.info("evaluation_finished", target=target, state="FAILED",
                     duration_s=round(time.monotonic() - t0, 3), error_code=status.code)
        finally:
            structlog.contextvars.unbind_contextvars("evaluation_id", "request_id", "trace_id",
                                                     "span_id")
