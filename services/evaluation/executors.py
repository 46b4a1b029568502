"""Where an evaluation's work items run: the ``Executor`` protocol and its back ends.

- No executor (``None``, the default ``--executor local``): the evaluation service's own
  worker threads run every item, as always.
- :class:`ProcessExecutor` (``--executor processes``): N local ``fortis worker`` processes,
  each with ``JOB_COMPLETION_INDEX`` set as Kubernetes sets it, sharing the evaluation's items
  through claims in the store (SQLite files on one machine, or PostgreSQL). It is the
  Indexed Job on one machine: the same worker entry point, the same claims, and a failed
  index restarted up to ``backoff_limit`` times in all, as the Job's backoff does. Useful on
  a many-core machine (one Python process per core) and how the tests exercise fan-out.
- ``k8s_jobs.IndexedJobExecutor`` (``--executor kubernetes``): one Indexed Job per
  evaluation in the tenant's namespace.

The runner submits, waits (stopping at a cancel) and deletes; when the workers are done it
runs the stages itself, finding every item finished, and scores. Domain code: no gRPC.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog
from fortis.infra.serving import tracing
from fortis.services.common import errors
from fortis.services.evaluation.k8s_jobs import JobOutcome

log = structlog.get_logger("fortis.evaluation.executors")

EXECUTORS = ("local", "processes", "kubernetes")


class Executor(Protocol):
    """Runs ``shards`` workers on one evaluation and reports how they ended."""

    @property
    def shards(self) -> int: ...

    def submit(self, *, tenant: str, evaluation_id: str) -> str:
        """Start the workers (or find those a previous attempt started); a handle."""
        ...

    def wait(self, handle: str, *, should_stop: Callable[[], bool] = lambda: False,
             poll_s: float = 2.0, timeout_s: float = 0.0) -> JobOutcome:
        """Block until the workers end (``succeeded``/``failed``) or ``should_stop()``."""
        ...

    def delete(self, handle: str) -> None:
        """Stop the workers (a cancelled evaluation) and forget them."""
        ...


@dataclass(frozen=True, kw_only=True)
class ProcessSettings:
    """How local worker processes are started."""

    #: the worker command; ``JOB_COMPLETION_INDEX`` and the evaluation come in the environment
    command: Sequence[str]
    shards: int = 2
    #: failed processes restarted, in all (Kubernetes' ``backoffLimit``)
    backoff_limit: int = 2
    #: extra environment (addresses, the internal key: never on the command line)
    env: Mapping[str, str] = field(default_factory=dict)
    #: SIGTERM to SIGKILL when stopping workers (their grace period)
    grace_s: float = 10.0

    def __post_init__(self) -> None:
        if not 1 <= self.shards <= 256:
            raise errors.InvalidArgument("worker_processes", "must be from 1 to 256")
        if not 0 <= self.backoff_limit <= 100:
            raise errors.InvalidArgument("worker_backoff_limit", "must be from 0 to 100")
        if not self.command:
            raise errors.InvalidArgument("worker_command", "must not be empty")


@dataclass(frozen=True)
class WorkerExit:
    """A worker process that ended: its index, exit code (0 done, 1 failed, 143 stopped by
    SIGTERM at an item boundary, negative: killed by that signal) and when (``time.time()``)."""

    evaluation_id: str
    index: int
    code: int
    at: float


@dataclass
class _Run:
    tenant: str
    evaluation_id: str
    procs: dict[int, subprocess.Popen[bytes]]
    #: the evaluation run's trace context (``TRACEPARENT``): the workers' spans are its
    #: children, a restarted worker's too
    trace_env: dict[str, str] = field(default_factory=dict)
    failures: int = 0
    succeeded: set[int] = field(default_factory=set)
    last_error: str = ""


class ProcessExecutor:
    """``shards`` local worker processes per evaluation (see the module docstring)."""

    def __init__(self, settings: ProcessSettings,
                 env: Callable[[], Mapping[str, str]] = dict) -> None:
        self.settings = settings
        #: more environment, read at each start (e.g. the service's address, known only
        #: once it is bound)
        self._env = env
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()
        #: Every worker exit seen, in order (a restarted index appears once per process).
        self.exits: list[WorkerExit] = []

    @property
    def shards(self) -> int:
        return self.settings.shards

    def _spawn(self, run: _Run, index: int) -> subprocess.Popen[bytes]:
        inherited = {k: v for k, v in os.environ.items()     # this process's own context
                     if k not in (tracing.ENV_TRACEPARENT, tracing.ENV_TRACESTATE)}
        env = {**inherited, **self.settings.env, **self._env(),
               "JOB_COMPLETION_INDEX": str(index),
               "FORTIS_EVALUATION_ID": run.evaluation_id, "FORTIS_TENANT": run.tenant,
               "FORTIS_SHARDS": str(self.settings.shards), **run.trace_env}
        return subprocess.Popen(list(self.settings.command), env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)

    def submit(self, *, tenant: str, evaluation_id: str) -> str:
        handle = f"{tenant}/{evaluation_id}"
        with self._lock:
            if handle in self._runs:
                return handle
            run = _Run(tenant, evaluation_id, {}, trace_env=tracing.env_carrier())
            run.procs = {i: self._spawn(run, i) for i in range(self.settings.shards)}
            self._runs[handle] = run
        log.info("workers_started", evaluation_id=evaluation_id, shards=self.settings.shards,
                 pids=[p.pid for p in run.procs.values()])
        return handle

    def _poll(self, run: _Run) -> JobOutcome | None:
        for index, proc in list(run.procs.items()):
            code = proc.poll()
            if code is None:
                continue
            del run.procs[index]
            self.exits.append(WorkerExit(run.evaluation_id, index, code, time.time()))
            if code == 0:
                run.succeeded.add(index)
                continue
            run.failures += 1
            run.last_error = f"worker index {index} exited with code {code}"
            if run.failures > self.settings.backoff_limit:
                self._stop(run)
                return JobOutcome("failed", len(run.succeeded), run.failures,
                                  f"BackoffLimitExceeded: {run.last_error}")
            log.warning("worker_restarted", evaluation_id=run.evaluation_id, index=index,
                        exit_code=code, failures=run.failures)
            run.procs[index] = self._spawn(run, index)
        if not run.procs:
            return JobOutcome("succeeded", len(run.succeeded), run.failures)
        return None

    def status(self, handle: str) -> JobOutcome | None:
        with self._lock:
            run = self._runs.get(handle)
            if run is None:
                raise errors.NotFound("worker processes", handle)
            return self._poll(run)

    def wait(self, handle: str, *, should_stop: Callable[[], bool] = lambda: False,
             poll_s: float = 0.2, timeout_s: float = 0.0) -> JobOutcome:
        deadline = time.monotonic() + timeout_s if timeout_s else None
        while True:
            outcome = self.status(handle)
            if outcome is not None:
                with self._lock:
                    self._runs.pop(handle, None)
                return outcome
            if should_stop() or (deadline is not None and time.monotonic() > deadline):
                return JobOutcome("stopped")
            time.sleep(poll_s)

    def _stop(self, run: _Run) -> None:
        for proc in run.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        end = time.monotonic() + self.settings.grace_s
        for proc in run.procs.values():
            try:
                proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        run.procs.clear()

    def pids(self) -> list[int]:
        """Process ids of the workers running now (every evaluation)."""
        with self._lock:
            return [p.pid for r in self._runs.values() for p in r.procs.values()
                    if p.poll() is None]

    def delete(self, handle: str) -> None:
        with self._lock:
            run = self._runs.pop(handle, None)
        if run is not None:
            self._stop(run)

    def close(self) -> None:
        """Stop every worker (the service is shutting down; their items are resumed)."""
        with self._lock:
            runs = list(self._runs.values())
            self._runs.clear()
        for run in runs:
            self._stop(run)
