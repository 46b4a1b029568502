"""What the benchmarks read of a server's processes from /proc (Linux): resident memory and
CPU time, summed over the pids given (a missing or ended process counts 0)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def rss_kb(pids: Iterable[int]) -> int:
    """Resident set size, KiB."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def cpu_s(pids: Iterable[int]) -> float:
    """CPU seconds used, user + system."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


def with_children(pid: int) -> list[int]:
    """``pid`` and its direct children."""
    try:
        return [pid, *(int(k) for k in
                       Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]
    except OSError:
        return [pid]
