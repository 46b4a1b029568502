"""structlog set-up: JSON lines with tenant/session/request ids bound through contextvars, and
the trace and span ids of the span a line is written in."""

from __future__ import annotations

import logging
import sys

import structlog
from fortis.infra.serving.tracing import add_trace_ids


class _CurrentStderr:
    """Whatever ``sys.stderr`` is when a line is written (not when logging was configured): a
    caller that swaps stderr (a test capturing it, an embedding tool) never leaves the logger
    writing to a closed stream."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(level: str = "info", *, json_lines: bool = True) -> None:
    lvl = getattr(logging, level.upper(), logging.INFO)
    renderer = structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, add_trace_ids,
                    structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso"), renderer],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False)
