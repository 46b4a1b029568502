"""A target's declared price per 1000 queries (``?price_per_1000=X`` on a target's endpoint in
a plan, or on its configuration for ``fortis serve --target``): parsed once, the same way,
wherever it is declared, and taken off the endpoint before the endpoint is used.

The price is a currency-less number ("1.0 per 1000 queries" in whatever unit the declarer
means): finite, at least 0, at most :data:`MAX_PRICE_PER_1000`, given once.
"""

from __future__ import annotations

import math
from urllib.parse import unquote_plus

from fortis.services.common.errors import InvalidArgument

__all__ = ["MAX_PRICE_PER_1000", "PRICE_PARAM", "split_price"]

PRICE_PARAM = "price_per_1000"
#: Largest price per 1000 queries accepted (a larger one is a typo, and its products would
#: lose every digit that matters).
MAX_PRICE_PER_1000 = 1e9


def split_price(endpoint: str, field: str) -> tuple[str, float | None]:
    """(``endpoint`` without its ``price_per_1000`` query items, the price or None). The
    rest of the endpoint's text is left as it was. InvalidArgument naming ``field`` for a
    price that is not one finite number in 0..MAX_PRICE_PER_1000, or given twice."""
    base, sep, query = endpoint.partition("?")
    if not sep:
        return endpoint, None
    items = query.split("&")
    prices = [
        unquote_plus(i.partition("=")[2]) for i in items if i.partition("=")[0] == PRICE_PARAM
    ]
    if not prices:
        return endpoint, None
    kept = [i for i in items if i.partition("=")[0] != PRICE_PARAM]
    if len(prices) > 1:
        raise InvalidArgument(field, f"{PRICE_PARAM} is given {len(prices)} times; give it once")
    raw = prices[0].strip()
    try:
        value = float(raw)
    except ValueError:
        raise InvalidArgument(field, f"{PRICE_PARAM} must be a number, got {raw[:40]!r}") from None
    if not math.isfinite(value) or value < 0 or value > MAX_PRICE_PER_1000:
        raise InvalidArgument(
            field,
            f"{PRICE_PARAM} must be a finite number in 0..{MAX_PRICE_PER_1000:g}, got {raw[:40]!r}",
        )
    return base + ("?" + "&".join(kept) if kept else ""), value
