"""What the CLI prints, shared by its local and remote commands: exit codes, error lines,
the progress display and the report summary."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

#: Exit code of bad input (an invalid plan, a missing file, a busy port).
EXIT_BAD_INPUT = 2
#: Exit code of a run that failed, or a server that refused.
EXIT_FAILED = 1


def err(msg: str) -> None:
    """One ``fortis: ...`` line on stderr (never a traceback for an expected failure)."""
    print(f"fortis: {msg}", file=sys.stderr)


def print_violations(exc: Any) -> None:
    """Every bad field of an InvalidArgument, one per line."""
    for v in exc.violations:
        print(f"  {v.field}: {v.description}", file=sys.stderr)


def print_summary(report: dict[str, Any], out: Path) -> None:
    m = report["metrics"]
    acc = m["accuracy"]
    print(f"\nTarget {report['target']['name']}: clean accuracy {acc['value']:.4f} "
          f"(95% CI {acc['ci95'][0]:.3f}-{acc['ci95'][1]:.3f}, M={acc['m']})")
    arc = (m.get("average_robustness_corr") or {}).get("value")
    wrc = (m.get("worstcase_robustness_corr") or {}).get("value")
    if arc is not None:
        print(f"Average robustness to corruptions {arc:.4f}; worst case {wrc:.4f}")
    for name, a in (m.get("attacks") or {}).items():
        extra = ""
        if a.get("mean_queries") is not None:
            extra = (f", success rate {a['success_rate']:.3f}, mean queries "
                     f"{a['mean_queries']:.1f} (budget {a['query_budget']})")
        print(f"  attack {name}: robustness {a['robustness_adv']:.4f}{extra}")
    failed = [f for f in report.get("failed_settings") or () if isinstance(f, dict)]
    if failed:
        print(f"{len(failed)} setting{'s' if len(failed) != 1 else ''} failed to run (no "
              "results; listed in the report):", file=sys.stderr)
        for f in failed:
            print(f"  {f.get('setting')}: {f.get('code')}: {str(f.get('message'))[:300]} "
                  f"({f.get('images_done')} of {f.get('images_planned')} images done)",
                  file=sys.stderr)
    print(f"Report: {out / 'report.json'}  {out / 'report.html'}")


def follow(client: Any, evaluation_id: str, quiet: bool, timeout_s: float | None = None) -> Any:
    """Follow an evaluation: a live bar on a terminal; on a pipe or log file, one plain line
    per stage and at most one every 10 seconds, so CI logs stay readable."""
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    bar = tqdm(total=1, unit="item", file=sys.stderr, dynamic_ncols=True) \
        if tty and not quiet else None
    last_stage, last_t = [""], [0.0]

    def on_progress(p: Any) -> None:
        if quiet:
            return
        if bar is not None:
            bar.total = max(p.items_total, 1)
            bar.n = p.items_done
            bar.set_description(f"{p.stage}")
            bar.set_postfix_str(f"queries={p.queries}")
            bar.refresh()
            return
        now = time.monotonic()
        if p.stage != last_stage[0] or now - last_t[0] >= 10.0:
            last_stage[0], last_t[0] = p.stage, now
            print(f"  [{p.stage}] {p.items_done}/{p.items_total} items, {p.queries} queries",
                  file=sys.stderr, flush=True)

    try:
        return client.wait(evaluation_id, timeout_s=timeout_s, on_progress=on_progress)
    finally:
        if bar is not None:
            bar.close()
