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


def tree(pids: Iterable[int]) -> list[int]:
    """``pids`` and every process descended from them (a server's worker processes, and any
    they start)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found = list(dict.fromkeys(pids))
    seen = set(found)
    for p in found:                 # grows as children are found
        for child, ppid in parent.items():
            if ppid == p and child not in seen:
                seen.add(child)
                found.append(child)
    return found


_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def machine_cpu() -> dict[str, float]:
    """The whole machine's CPU time so far by kind (seconds summed over cores, /proc/stat):
    what a phase's difference of two readings shows is where the cores' time went, the
    processes of the benchmark or not (kernel threads writing back to disk, other work)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    return {k: int(v) / tick for k, v in zip(_STAT_FIELDS, fields, strict=False)}
