"""What the proxy needs of state shared by its replicas, so budgets hold across all of
them. The rate limiter's side is ``ratelimit.LimiterStore``; this
is the session budgets' side. Implemented in Redis by ``redis_store.RedisSessionBudgets``;
without one (the embedded default) the budgets live in the proxy's memory. Domain code."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from fortis.common.v1 import common_pb2
from fortis.services.proxy.ledger import SessionRecord


class SharedBudgets(Protocol):
    """A session's hard budgets (``query_budget``, per-image Q_m) held across replicas.

    ``reserve`` checks and charges atomically across replicas (``initial()``: the ledger's
    attempts per image id, read only when the store has no count for the session yet) and
    returns ``(charged, attempts in the session, attempts per image id asked)``; ``refund``
    gives back images charged and never sent. Both raise ``errors.Unavailable`` when the
    store cannot answer (``refund`` may instead log and keep the charge: the safe side)."""

    def reserve(self, rec: SessionRecord, images: Sequence[common_pb2.Image],
                initial: Callable[[], Mapping[str, int]]
                ) -> tuple[bool, int, dict[str, int]]: ...

    def refund(self, rec: SessionRecord, images: Sequence[common_pb2.Image]) -> None: ...
