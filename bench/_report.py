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
