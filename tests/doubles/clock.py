"""TEST DOUBLES of a monotonic clock, and of an event loop's timers on it: time moves only when a test (or an
engine double) says so.

FakeClock is thread-safe, since interpreter threads read it. It starts far from zero, as a real monotonic clock does.
"""

from __future__ import annotations

import concurrent.futures
import heapq
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


class FakeTimers:
    """TEST DOUBLE of an event loop's timers and executor, on a FakeClock: what `call_later` schedules runs
    when the test moves time past it (`advance`), in time order, each at its own time; `run_in_executor`
    runs the function at once, on the caller's thread. Two of them on one clock stand for two loops (one
    that has ended is one the test no longer advances)."""

    def __init__(self, clock: FakeClock):
        self.clock = clock
        self._due: list[tuple[float, int, FakeTimerHandle]] = []
        self._scheduled = 0

    def time(self) -> float:
        return self.clock()

    def call_later(self, delay: float, callback, *args) -> FakeTimerHandle:
        handle = FakeTimerHandle(self.clock() + max(0.0, delay), callback, args)
        self._scheduled += 1
        heapq.heappush(self._due, (handle.when, self._scheduled, handle))
        return handle

    def run_in_executor(self, executor, func, *args) -> concurrent.futures.Future:
        done = concurrent.futures.Future()
        done.set_result(func(*args))
        return done

    def advance(self, seconds: float) -> None:
        """Move the clock `seconds` on, running every callback that falls due on the way (those they schedule too)."""
        end = self.clock() + seconds
        while self._due and self._due[0][0] <= end:
            when, _, handle = heapq.heappop(self._due)
            self.clock.advance(max(0.0, when - self.clock()))
            if not handle.cancelled:
                handle.callback(*handle.args)
        self.clock.advance(end - self.clock())

    @property
    def pending(self) -> int:
        """Callbacks scheduled and not yet run nor cancelled."""
        return sum(not handle.cancelled for _, _, handle in self._due)


class FakeTimerHandle:
    def __init__(self, when: float, callback, args: tuple):
        self.when, self.callback, self.args = when, callback, args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
