"""The report page's "estimated vs actual queries" table: the query estimate made before the
run (fixed counts and upper bounds) beside what the ledger counted. Pure code, no gRPC."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fortis.services.report.page_values import as_list, as_map, is_number

__all__ = ["estimate_section"]

_KINDS = {"fixed": "fixed", "upper_bound": "upper bound"}


def estimate_section(estimate: Any) -> dict[str, Any] | None:
    """Rows (stage, setting, kind, estimated, actual, within) and totals; None when the
    report has no estimate. ``within``: the actual count respects the estimate (equal to a
    fixed count, at most an upper bound)."""
    e = as_map(estimate)
    if not e:
        return None
    rows = []
    for r in as_list(e.get("per_setting")):
        if not isinstance(r, Mapping):
            continue
        est, act = r.get("estimated"), r.get("actual")
        kind = str(r.get("kind") or "")
        within = None
        if (
            is_number(est)
            and is_number(act)
            and isinstance(est, int | float)
            and isinstance(act, int | float)
        ):
            within = act == est if kind == "fixed" else act <= est
        rows.append(
            {
                "stage": str(r.get("stage") or "").replace("_", " "),
                "setting": r.get("setting"),
                "kind": _KINDS.get(kind, kind),
                "estimated": est,
                "actual": act,
                "within": within,
            }
        )
    return {
        "rows": rows,
        "fixed": e.get("fixed"),
        "upper_bound": e.get("upper_bound"),
        "expected": e.get("expected"),
        "total_actual": e.get("total_actual"),
    }
