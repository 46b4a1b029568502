"""Per-target rate limit, counted in images per second.

A token bucket of capacity L whose tokens come back exactly one second after they are
spent (a sliding-window bucket). A classic bucket (capacity L, refill L/s) lets up to 2L
images through in a one-second window after an idle spell; this form guarantees what a
service owner asks for: no one-second window, anywhere, carries more than L images, while
still sustaining L images per second. Domain code: no gRPC.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable


class RateLimiter:
    """Grants images against a limit of ``images_per_second`` in any 1-second window."""

    def __init__(self, images_per_second: float, *, window_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if images_per_second < 0:
            raise ValueError("images_per_second must be >= 0 (0 = unlimited)")
        self.limit = int(images_per_second) if images_per_second else 0
        if images_per_second and self.limit < 1:
            raise ValueError("images_per_second must be 0 or >= 1")
        self.window = window_s
        self._clock = clock
        self._sleep = sleep
        self._grants: deque[tuple[float, int]] = deque()
        self._in_window = 0
        self._lock = threading.Lock()

    @property
    def unlimited(self) -> bool:
        return self.limit == 0

    def max_chunk(self) -> int:
        """Largest number of images one grant may carry."""
        return self.limit if self.limit else 1 << 30

    def acquire(self, n: int) -> float:
        """Block until ``n`` images may be sent; return the grant time (clock units).

        ``n`` must not exceed ``max_chunk()``: callers split larger batches.
        """
        if self.unlimited:
            return self._clock()
        if n > self.limit:
            raise ValueError(f"cannot send {n} images at once under a limit of {self.limit}/s")
        while True:
            with self._lock:
                now = self._clock()
                horizon = now - self.window
                while self._grants and self._grants[0][0] <= horizon:
                    self._in_window -= self._grants.popleft()[1]
                if self._in_window + n <= self.limit:
                    self._grants.append((now, n))
                    self._in_window += n
                    return now
                # Wait until enough earlier grants leave the window.
                need = self._in_window + n - self.limit
                freed = 0
                wait_until = now
                for t, k in self._grants:
                    freed += k
                    wait_until = t + self.window
                    if freed >= need:
                        break
            self._sleep(max(wait_until - now, 0.0) + 1e-4)
