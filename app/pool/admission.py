"""Admission to a pool's line: by count always, and by time while the pool is overloaded.

A place is held by requests running or waiting for an interpreter, at most `max_waiting`
beyond the healthy interpreters (none while every device of the pool has left and the pool waits for a
device or for the backend serving its model instead: then the line holds `max_waiting`). A pool is overloaded from a refusal for want of room until it
has refused nobody for `hold_s` (OVERLOAD_HOLD_S); while it is, the line is also bounded by time
(`max_queue_ms`): a request is refused on arrival if the line ahead would take longer than
that to clear (from the running average of invoke times), and when its turn comes if it has
waited longer (CoDel's idea). A line that never overflows is bounded by count only.

The clock is passed in (seconds, monotonic), so the arithmetic can be tested with a fake one.
Not locked: the pool calls it under its own lock, together with its health checks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from app.errors import Busy
from app.settings import default

OVERLOAD_HOLD_S = default("overload_hold_s")  # for pools built without settings (tests)
# The running average of invoke times weighs the newest by this: about the last ten count.
INVOKE_AVERAGE_WEIGHT = 0.2


class Admission:
    """The count of places held, the recent invoke time, and the overload state of one pool."""

    def __init__(self, label: str, max_waiting: int, max_queue_ms: float, retry_after_s: float,
                 clock: Callable[[], float] = time.monotonic, hold_s: float = OVERLOAD_HOLD_S):
        self.label = label
        self.max_waiting = max_waiting
        self.max_queue_ms = max_queue_ms
        self.retry_after_s = retry_after_s
        self.hold_s = hold_s  # overloaded until it has refused nobody for this long
        self.clock = clock
        self.admitted = 0  # places held: requests running or waiting
        self.invoke_ms: float | None = None  # running average of warm invokes
        self._overloaded_until = -math.inf

    def refuse_if_full(self, healthy: int) -> None:
        """Busy if no place can be had now among `healthy` interpreters and the line behind them."""
        now = self.clock()
        if self.admitted >= healthy + self.max_waiting:
            self._overloaded_until = now + self.hold_s
            raise Busy(f"{self.label}: all {healthy} interpreters busy and {self.admitted - healthy} requests "
                       "already waiting", self.retry_after_s)
        if (self.max_queue_ms and now < self._overloaded_until and self.invoke_ms is not None
                and healthy and self.admitted >= healthy):
            # Overloaded: more arrive than the interpreters serve, so a deeper line only adds latency.
            # The new request waits for everyone ahead of it to be taken, `healthy` at a time.
            clears_ms = (self.admitted - healthy + 1) * self.invoke_ms / healthy
            if clears_ms > self.queue_bound_ms:
                self._overloaded_until = now + self.hold_s
                raise Busy(f"{self.label}: overloaded, all {healthy} interpreters busy and the line ahead would "
                           f"take ~{clears_ms:.0f} ms to clear (EDGETPU_SERVE_MAX_QUEUE_MS {self.max_queue_ms:g})",
                           self.retry_after_s)

    def enter(self, healthy: int) -> None:
        """Take a place, or Busy at once."""
        self.refuse_if_full(healthy)
        self.admitted += 1

    def leave(self) -> None:
        self.admitted -= 1

    def too_late(self, since: float, now: float) -> Busy | None:
        """Overloaded, and a request admitted at `since` has waited longer than the bound (for an image
        thread or an interpreter): it joined a deep line before the bound by time applied, and is
        refused rather than served late, so none waits past the bound."""
        if not self.max_queue_ms:
            return None
        waited_ms = (now - since) * 1000
        if waited_ms <= self.queue_bound_ms or not self.overloaded:
            return None
        return Busy(f"{self.label}: overloaded, every interpreter busy: this request waited {waited_ms:.0f} ms in line "
                    f"(EDGETPU_SERVE_MAX_QUEUE_MS {self.max_queue_ms:g})", self.retry_after_s)

    def note_invoke(self, ms: float) -> None:
        """A warm invoke's time, into the running average (a lost update between threads only delays it)."""
        self.invoke_ms = ms if self.invoke_ms is None else self.invoke_ms + INVOKE_AVERAGE_WEIGHT * (ms - self.invoke_ms)

    @property
    def queue_bound_ms(self) -> float:
        """MAX_QUEUE_MS, but never less than one invoke: an interpreter that finishes always finds the
        next input ready (a model slower than the bound would otherwise idle while each is decoded)."""
        return max(self.max_queue_ms, self.invoke_ms or 0.0)

    @property
    def overloaded(self) -> bool:
        """Refused a request for want of room within the last `hold_s`."""
        return self.clock() < self._overloaded_until
