"""Call admission on a server: draining (no new calls once a stop began), the per-tenant call
rate and the refusal of a tenant past one of its per-server quotas. Seats and call slots are
taken by the interceptor (``interceptor.py``) with these helpers.
"""

from __future__ import annotations

import threading
import time
from typing import NoReturn

import grpc
import structlog
from fortis.infra.serving.quotas import CallRate
from fortis.services.common import errors

log = structlog.get_logger("fortis.server")

#: Calls that take no seat (``ServerSettings.seats``): their costly part takes a work slot of
#: its own, or they mostly wait (a Predict for its rate-limit turn, a query attack for its
#: answers), and a seat held while waiting would keep the tenant's other calls waiting too.
UNSEATED_METHODS = frozenset({
    "/fortis.proxy.v1.TargetProxyService/Predict",
    "/fortis.proxy.v1.TargetProxyService/PredictStream",
    "/fortis.perturbation.v1.PerturbationService/ApplyPerturbation",
    "/fortis.perturbation.v1.PerturbationService/ApplyPerturbationStream",
    "/fortis.perturbation.v1.PerturbationService/RunAttack",
    "/fortis.scoring.v1.ScoringService/Compute",
    "/fortis.scoring.v1.ScoringService/ScoreEvaluation",
    "/fortis.report.v1.ReportService/RenderReport",
    "/fortis.evaluation.v1.UploadService/UploadBlob",
})

#: Message of a call refused while the server drains (UNAVAILABLE: retry elsewhere or later).
DRAINING_MESSAGE = ("the server is shutting down (draining its calls in progress); retry: "
                    "another replica, or this service once restarted, takes the call")


class Drain:
    """The calls in progress on one server, and whether new ones are refused (on
    SIGTERM every service drains in-flight work and exits within the pod's grace period).

    A call counts from the moment it is admitted until gRPC reports it terminated (its answer
    sent, or cancelled), so a server stopped once the count is 0 cuts no answer in transit.
    Health and reflection calls are not counted and never refused: health keeps answering
    NOT_SERVING while the server drains."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._calls = 0
        self._refusing = False

    @property
    def refusing(self) -> bool:
        return self._refusing

    @property
    def calls(self) -> int:
        with self._cond:
            return self._calls

    def enter(self, context: grpc.ServicerContext) -> None:
        """Admit a call (errors.Unavailable while draining); it leaves when it terminates."""
        with self._cond:
            if self._refusing:
                raise errors.Unavailable(DRAINING_MESSAGE)
            self._calls += 1
        try:
            registered = context.add_callback(self._leave)
        except Exception:  # noqa: BLE001 - test doubles of the context may lack add_callback
            registered = False
        if not registered:          # already terminated, or nothing to tell us when it does
            self._leave()

    def _leave(self) -> None:
        with self._cond:
            self._calls -= 1
            if self._calls <= 0:
                self._cond.notify_all()

    def refuse_new_calls(self) -> None:
        with self._cond:
            self._refusing = True

    def wait(self, timeout: float) -> int:
        """Wait at most ``timeout`` seconds for the calls in progress to end; the number left."""
        with self._cond:
            self._cond.wait_for(lambda: self._calls <= 0, timeout=max(0.0, timeout))
            return self._calls


def wait_for_turn(rate: CallRate, tenant: str, context: grpc.ServicerContext) -> None:
    """The tenant's next call start under ``--max-call-rate-per-tenant``: at once, after a
    short wait (the call holds its thread, counted in the tenant's calls in progress), or
    RESOURCE_EXHAUSTED when the turn is further away than the call's deadline or the most a
    call waits."""
    wait = rate.turn(tenant)
    remaining = getattr(context, "time_remaining", lambda: None)()
    if wait is None or (wait and remaining is not None and remaining < wait):
        refuse(tenant, "call_rate", rate.limit(tenant),
                "calls of this tenant started per second on this server "
                "(--max-call-rate-per-tenant); retry after a short wait")
    if wait:
        time.sleep(wait)


def refuse(tenant: str, reason: str, limit: int, what: str) -> NoReturn:
    """RESOURCE_EXHAUSTED for a tenant past one of its per-server quotas, with its audit line."""
    log.warning("call_refused", reason=reason, limit=limit)
    raise errors.QuotaExceeded([errors.QuotaViolation(f"tenant:{tenant}",
                                                      f"at most {limit} {what}")])


