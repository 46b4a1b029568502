"""What every benchmark prints beside its figures: the machine, the command that produced them
and its goals as ratios, in one shape (``scripts/performance_table.py`` turns the saved JSON
of every benchmark into docs/performance.md)."""

from __future__ import annotations

import os
import platform
import shlex
import sys


def machine() -> dict:
    """The machine a figure was measured on (the ratios, not the times, travel between
    machines; the machine says which)."""
    out = {"platform": platform.platform(), "cpus": os.cpu_count(),
           "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    out["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import torch
        out["torch"] = torch.__version__
        out["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return out


def command_line() -> str:
    """The command that produced this output, as typed from the repository root."""
    return " ".join(["python", *map(shlex.quote, sys.argv)])


def goal(name: str, ratio: float, target: float, op: str) -> dict:
    """One goal: ``ratio`` measured in this run against ``target`` (``op`` "<=" or ">=")."""
    if op not in ("<=", ">="):
        raise ValueError(f"op must be '<=' or '>=', not {op!r}")
    met = ratio <= target if op == "<=" else ratio >= target
    return {"name": name, "ratio": round(float(ratio), 3), "target": f"{op} {target:g}",
            "met": bool(met)}


def best_images_per_s(pieces: list, streams: int | None = None) -> float:
    """Images/s of ``pieces`` (functions each running one batch through the bare model and
    returning its image count) at the machine's best: one after the other, and spread over
    ``streams`` threads (the CPU count by default; torch leaves the interpreter while it
    computes, so batches run side by side as an evaluation's items in flight do). The
    higher of the two is the reference a stage is held to: a stage that runs its items side
    by side must not be compared with a model kept to one core."""
    import threading
    import time

    t0 = time.perf_counter()
    total = sum(p() for p in pieces)
    sequential = total / (time.perf_counter() - t0)
    streams = streams or os.cpu_count() or 1
    if streams < 2 or len(pieces) < 2:
        return sequential
    counts = [0] * streams

    def worker(k: int) -> None:
        counts[k] = sum(p() for p in pieces[k::streams])

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    parallel = sum(counts) / (time.perf_counter() - t0)
    return max(sequential, parallel)
