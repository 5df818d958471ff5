"""TEST DOUBLE of a monotonic clock: time moves only when a test (or an engine double) says so.

Thread-safe, since interpreter threads read it. It starts far from zero, as a real monotonic clock does.
"""

from __future__ import annotations

import threading


class FakeClock:
    def __init__(self, start: float = 1000.0):
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
