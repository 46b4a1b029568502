"""How values read on the report page (None -> "n/a", rates as percentages: the
Jinja filters) and the small readers every section uses to take a report document apart
without trusting its shape. Pure code, no gRPC."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeGuard

from fortis.services.report import figures

#: Example images accepted on the page: base64 data URIs of raster images only.
_DATA_URI: Final = re.compile(r"data:image/(?:png|jpeg|gif|webp);base64,[A-Za-z0-9+/]+={0,2}")
_MAX_URI_CHARS: Final = 8 << 20

# --------------------------------------------------------------------------------------------
# filters: how a value reads on the page (None -> "n/a", rates as percentages)
# --------------------------------------------------------------------------------------------


def txt(value: Any) -> str:
    """Any value as text; ``None`` becomes ``n/a``, floats six significant digits."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list | tuple):
        return ", ".join(txt(v) for v in value) if value else "none"
    return str(value)


def is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def pct(value: Any) -> str:
    return f"{100.0 * value:.2f}%" if is_number(value) else "n/a"


def pct_short(value: Any) -> str:
    """A rate as a short percentage (a threshold: ``0.3`` -> ``30%``)."""
    return f"{100.0 * value:.4g}%" if is_number(value) else "n/a"


def ci_text(ci: Any) -> str:
    if not is_interval(ci):
        return "n/a"
    return f"[{pct(ci[0])}, {pct(ci[1])}]"


def is_interval(ci: Any) -> bool:
    return (isinstance(ci, Sequence) and not isinstance(ci, str) and len(ci) == 2
            and all(is_number(v) for v in ci))


def num(value: Any, digits: int = 1) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return txt(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}f}" if math.isfinite(value) else "n/a"


def sig(value: Any, digits: int = 4) -> str:
    """A measurement with ``digits`` significant digits."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return txt(value)
    return f"{value:.{digits}g}" if math.isfinite(value) else "n/a"


def json_text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def nested_list(value: Any) -> bool:
    """A list shown as an ordered list (it holds mappings or lists), not as one line."""
    return isinstance(value, list | tuple) and any(isinstance(v, Mapping | list | tuple)
                                                   for v in value)


def shade(value: Any) -> str:
    """A CSS class that tints a robustness cell: h0 (below 20 %) .. h4 (80 % and above)."""
    if not is_number(value):
        return "na"
    return f"h{max(0, min(4, int(value * 5)))}"


# --------------------------------------------------------------------------------------------
# small readers
# --------------------------------------------------------------------------------------------


def as_map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def value_of(node: Any, key: str = "value") -> Any:
    """``node[key]`` when ``node`` is a mapping, else ``node`` itself (a plain number)."""
    return node.get(key) if isinstance(node, Mapping) else node


def int_key(key: Any) -> int | None:
    try:
        return int(str(key))
    except ValueError:
        return None


def level_sorted(keys: Any) -> list[str]:
    """Level / severity keys in numeric order (1, 2, ... 10), non-numeric ones last."""
    keys = [str(k) for k in keys]
    return sorted(keys, key=lambda k: (int_key(k) is None, int_key(k) or 0, k))


def safe_image(src: Any) -> str | None:
    """``src`` when it is a base64 data URI of a raster image, else None (never a URL)."""
    if isinstance(src, str) and len(src) <= _MAX_URI_CHARS and _DATA_URI.fullmatch(src):
        return src
    return None


def chart_dict(c: figures.Chart | None) -> dict[str, Any] | None:
    return None if c is None else {"src": c.src, "alt": c.alt, "width": c.width,
                                   "height": c.height}
