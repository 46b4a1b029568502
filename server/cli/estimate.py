"""``fortis estimate PLAN`` and ``fortis run --dry-run``: the target queries a plan will make,
the least time they take and their price, before anything is sent (ValidatePlan's estimate,
asked of a running Fortis or of one started embedded)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from fortis.client import FortisClient

__all__ = ["estimate_action", "format_estimate", "show_estimate"]

_KINDS = {"fixed": "fixed", "upper_bound": "upper bound"}


def _seconds(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _money(x: float) -> str:
    return f"{x:,.4g}" if x < 1000 else f"{x:,.2f}"


def format_estimate(e: dict[str, Any]) -> str:
    """The estimate as a table per setting, totals, durations and price."""
    rows = [("stage", "setting", "kind", "images", "fixed", "upper", "expected")]
    multi = len({s["target"] for s in e["settings"]}) > 1
    for s in e["settings"]:
        name = f"{s['target']}: {s['setting']}" if multi else s["setting"]
        exp = "?" if s["expected"] is None else f"{s['expected']:,}"
        rows.append(
            (
                s["stage"],
                name,
                _KINDS.get(s["kind"], s["kind"]),
                f"{s['images']:,}",
                f"{s['fixed']:,}",
                f"{s['upper_bound']:,}",
                exp,
            )
        )
    exp_total = "?" if e["expected"] is None else f"{e['expected']:,}"
    rows.append(("total", "", "", "", f"{e['fixed']:,}", f"{e['upper_bound']:,}", exp_total))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    right = {3, 4, 5, 6}
    lines = [
        f"Plan '{e.get('plan_name', '')}': {e['images']:,} images, batch size "
        f"{e['batch_size']}; target queries (answered, as the ledger counts them):"
    ]
    for k, r in enumerate(rows):
        if k == len(rows) - 1:
            lines.append("  " + "  ".join("-" * w for w in widths))
        lines.append(
            "  "
            + "  ".join(
                c.rjust(w) if i in right else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            ).rstrip()
        )
    if e["expected"] is not None:
        lines.append(
            f"Expected: from the finished evaluation {e['expected_from']} of the same plan."
        )
    else:
        lines.append(
            "Expected: unknown for the adaptive settings (no finished evaluation of this plan yet)."
        )
    if e["durations"]:
        lines.append("Least duration (queries / rate; other work adds to it):")
        for d in e["durations"]:
            lines.append(
                f"  {d['limit']} ({d['rate']:g} {d['unit']}): "
                f"{_seconds(d['seconds_fixed'])} fixed, up to "
                f"{_seconds(d['seconds_upper_bound'])}"
            )
    else:
        lines.append("Least duration: no rate limit applies (the target's speed decides).")
    p = e["price"]
    if p is not None:
        per = (
            "several prices"
            if isinstance(p["per_1000"], float) and math.isnan(p["per_1000"])
            else f"{p['per_1000']:g} per 1000 queries"
        )
        lines.append(
            f"Price ({per}, declared by the {p['source']}): {_money(p['fixed'])} "
            f"fixed, up to {_money(p['upper_bound'])}"
        )
    else:
        lines.append("Price: not declared (?price_per_1000= on the target's endpoint).")
    if e["tenant_queries_per_day"]:
        left = max(0, e["tenant_queries_per_day"] - e["tenant_queries_today"])
        lines.append(
            f"Daily quota: {e['tenant_queries_today']:,} of "
            f"{e['tenant_queries_per_day']:,} used today (UTC); {left:,} left"
            + (
                "; the plan's fixed queries do not fit: it would be refused"
                if e["fixed"] > left
                else ""
            )
        )
    return "\n".join(lines)


def show_estimate(client: FortisClient, plan_text: str, as_json: bool) -> int:
    """Print the plan's estimate (``--json``: the client's plain data); exit code 0."""
    e = client.estimate(plan_text)
    if as_json:
        print(json.dumps(e, indent=2, sort_keys=True, default=str))
    else:
        print(format_estimate(e))
    return 0


def estimate_action(plan_text: str, as_json: bool) -> Callable[..., int]:
    """What ``fortis run --dry-run`` and ``fortis estimate`` do with a server's address (a
    running one, or the embedded one ``local._run_plan`` starts): print the estimate."""

    def act(address: str, key: str, tls: Any = None) -> int:
        with FortisClient(address, api_key=key, **(tls or {})) as client:
            return show_estimate(client, plan_text, as_json)

    return act
