"""Failed authentications, limited per client address, in memory.

A sliding window: an address with ``limit`` failures (a token presented and refused)
within the last ``window_s`` seconds is refused every authentication, good tokens too,
until the oldest of those failures leaves the window; ``retry_after`` says how long that
is. Refusing good tokens as well is the point: otherwise a guess that succeeds would
still stand out. A request without any token is not a guess and is not counted.

Each replica keeps its own counts (a guesser spread over N replicas gets N × limit per
window: still far too few to find a 256-bit secret). At most ``max_addresses`` addresses
are tracked; past that the one that failed longest ago is forgotten, so a flood of
addresses costs bounded memory.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque


class AuthFailureLimiter:
    def __init__(self, *, limit: int = 20, window_s: float = 60.0, max_addresses: int = 10_000):
        self.limit = limit
        self.window_s = window_s
        self.max_addresses = max_addresses
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()  # sync routes authenticate on a thread pool

    def retry_after(self, address: str, now: float) -> int | None:
        """Seconds until ``address`` may authenticate again, or None when it may now."""
        with self._lock:
            failures = self._failures.get(address)
            if failures is None:
                return None
            self._forget_old(failures, now)
            if len(failures) < self.limit:
                return None
            return max(1, math.ceil(failures[0] + self.window_s - now))

    def record_failure(self, address: str, now: float) -> None:
        with self._lock:
            failures = self._failures.setdefault(address, deque(maxlen=self.limit))
            self._forget_old(failures, now)
            failures.append(now)
            self._failures.move_to_end(address)
            while len(self._failures) > self.max_addresses:
                self._failures.popitem(last=False)

    def _forget_old(self, failures: deque[float], now: float) -> None:
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
