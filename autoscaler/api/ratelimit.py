"""Rate limiting of authentication failures per client address.

After `max_failures` bad tokens within `window_s`, the client is refused with 429
until the window passes: guessing tokens online becomes pointless, and a
misconfigured agent does not flood the database.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from autoscaler.errors import AutoscalerError


class TooManyFailures(AutoscalerError):
    http_status = 429


class AuthFailureLimiter:
    def __init__(self, max_failures: int = 20, window_s: float = 60.0) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, client: str, now: float) -> deque[float]:
        q = self._failures.setdefault(client, deque())
        while q and q[0] <= now - self.window_s:
            q.popleft()
        return q

    def check(self, client: str) -> None:
        with self._lock:
            if len(self._recent(client, time.monotonic())) >= self.max_failures:
                raise TooManyFailures(
                    f"too many failed authentications from {client}; wait {int(self.window_s)} s and check your token"
                )

    def failed(self, client: str) -> None:
        with self._lock:
            self._recent(client, time.monotonic()).append(time.monotonic())
            if len(self._failures) > 10_000:  # bound memory under a spray of addresses
                self._failures.pop(next(iter(self._failures)))
