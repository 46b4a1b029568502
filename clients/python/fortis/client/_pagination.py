"""Walking every page of a paginated List call (AIP-158), so callers never forget a page."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

from fortis.client.types import Page

T = TypeVar("T")


def iter_pages(fetch: Callable[[str], Page[T]]) -> Iterator[T]:
    """Every item of every page: ``fetch(page_token)`` returns one page, starting from "".

    Stops at the first empty ``next_page_token``, or when a server hands back the token it was
    given (a server bug that would otherwise loop forever).
    """
    token = ""
    while True:
        page = fetch(token)
        yield from page.items
        if not page.next_page_token or page.next_page_token == token:
            return
        token = page.next_page_token
