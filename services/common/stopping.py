"""Stopping long computations when their caller has gone, so one tenant cannot stall every
tenant (``Compute("irt")`` once went on after the caller's deadline): long computations
check the caller's deadline or cancellation and stop.

Shared by every service (scoring's metrics and IRT sampler, perturbation's attacks and
operators, ScoreEvaluation, RenderReport). A long loop of domain code takes
``should_stop: StopCheck`` (default :func:`never`) and calls :func:`raise_if_stopped` every few iterations. The transport builds the check from its
call with :func:`caller_stop`, which decides the error by the condition that holds: the
deadline passed -> :class:`DeadlineExceeded`, the call is otherwise no longer active (the
caller cancelled, the server is shutting down) -> :class:`Cancelled`. Pure code, no gRPC.
"""

from __future__ import annotations

from collections.abc import Callable

from fortis.services.common.errors import Cancelled, DeadlineExceeded

#: A check a long computation calls every few iterations: True (or an error raised by the
#: check itself) means "stop now".
StopCheck = Callable[[], bool]


def never() -> bool:
    """The default check: never stop (in-process callers, the CLI's ``fortis score``)."""
    return False


def raise_if_stopped(should_stop: StopCheck, what: str) -> None:
    """Raise when ``should_stop`` says so: whatever error the check raises itself (see
    :func:`caller_stop`), else :class:`Cancelled` naming ``what`` was stopped."""
    if should_stop():
        raise Cancelled(f"{what} stopped: the call is no longer active")


def caller_stop(is_active: Callable[[], bool],
                time_remaining: Callable[[], float | None]) -> StopCheck:
    """A check over a call's ``is_active()`` and ``time_remaining()`` (seconds, None = no
    deadline). It raises :class:`DeadlineExceeded` once the deadline has passed and
    :class:`Cancelled` once the call is no longer active for any other reason; otherwise it
    returns False. The deadline is looked at first: a call past its deadline is inactive too."""

    def check() -> bool:
        remaining = time_remaining()
        if remaining is not None and remaining <= 0:
            raise DeadlineExceeded("the caller's deadline passed; the computation was stopped")
        if not is_active():
            raise Cancelled("the call was cancelled; the computation was stopped")
        return False

    return check
