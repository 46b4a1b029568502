"""The gRPC health service of every Fortis server, without grpcio-health-checking's deadlock.

``grpc_health.v1.health.HealthServicer`` (1.81.1) sends a ``Watch`` stream's answers while
holding its lock, and its stream-close callback takes that lock. The callback runs on the
server's one event thread (``_serve``), which is also the thread that must complete the send
the lock holder waits for: a client that opens a ``Watch`` and goes away while the status
changes (a channel with client-side health checking reconnecting; the internal round_robin
channels watch health to skip a draining server) stops the event thread for good, and with it
every call of the server, ``Check`` included. Found by the fresh-clone CI (a server whose
connections age every 0.3 s hung in its stop); ``tests/unit/test_health.py`` reproduces it
with the stock servicer in a few seconds.

:class:`HealthServicer` is the stock servicer whose close callback never waits on the event
thread: it takes the lock only if it is free at once, and otherwise leaves the removal of
the stream's callback to a short-lived thread. Everything else (statuses, ``Check``,
``Watch``, ``enter_graceful_shutdown``) is the stock behaviour. Transport code (gRPC).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from grpc_health.v1 import health


class HealthServicer(health.HealthServicer):  # type: ignore[misc]
    """``grpc_health``'s servicer whose ``Watch`` close callback never blocks the server's
    event thread (see the module docstring)."""

    def _on_close_callback(self, send_response_callback: Callable[[Any], Any],
                           service: str) -> Callable[[], None]:
        def discard() -> None:          # the caller holds the lock
            callbacks = self._send_response_callbacks.get(service)
            if callbacks is not None:
                callbacks.discard(send_response_callback)

        def forget() -> None:
            with self._lock:
                discard()

        def callback() -> None:
            if self._lock.acquire(blocking=False):
                try:
                    discard()
                finally:
                    self._lock.release()
            else:       # a sender holds it and may be waiting for this very thread
                threading.Thread(target=forget, daemon=True, name="health-close").start()
            send_response_callback(None)

        return callback
