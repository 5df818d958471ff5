"""Refusals logged without a line per request (RefusalLog): the HTTP doors' 503s (app/api/errors.py) and the ZMQ
door's refused requests (app/frontdoors/zmq_door.py). Every refusal is still counted in /metrics; the log says
that they happen and why, without letting an overload or a hostile client fill it."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable

from app.settings import default

REFUSED = 503
REFUSAL_LOG_WINDOW_S = default("refusal_log_window_s")  # until an app sets its own (REFUSAL_LOG_WINDOW_S)


class RefusalLog:
    """Refusals logged without a line per request: the first after a quiet window in full (WARNING),
    then, while they go on, one line per window: how many, of which kind. The summary is written
    by a timer on the event loop when the window closes, so the last one of a burst is not lost.
    `event_loop` gives the loop whose timers close the windows (the running one; a test passes a
    double whose time it moves itself). The summary counts refusals by their `reason` where they carry one (the
    ZMQ door's), else by their class, and names `status` where all of them share one (an HTTP door's 503s)."""

    def __init__(self, logger: logging.Logger, window_s: float = REFUSAL_LOG_WINDOW_S, *,
                 event_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.get_running_loop,
                 status: int | None = REFUSED):
        self.log = logger
        self.status = status
        self.window_s = window_s
        self.counts: Counter[str] = Counter()
        self._event_loop = event_loop
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def refused(self, method: str, path: str, error: Exception, status: int | None = None) -> None:
        """Call on the event loop, once per refused request (`method` and `path` say where: a route, or another
        protocol's door and endpoint)."""
        loop = self._event_loop()
        if self._timer is not None and self._loop is loop:
            self.counts[getattr(error, "reason", None) or type(error).__name__] += 1  # a bounded set of keys
            return
        self.log.warning("%s %s: %d %s (further refusals are summed up every %g s)", method, path,
                         status or self.status or REFUSED, error, self.window_s)
        self.counts.clear()
        self._loop, self._timer = loop, loop.call_later(self.window_s, self._close_window)

    def _close_window(self) -> None:
        if not self.counts:  # quiet: the next refusal is logged in full
            self._timer = None
            return
        status = f" ({self.status})" if self.status is not None else ""
        self.log.warning("refused %d more requests%s in the last %g s: %s", sum(self.counts.values()), status,
                         self.window_s, ", ".join(f"{n} x {what}" for what, n in self.counts.most_common()))
        self.counts.clear()
        self._timer = self._loop.call_later(self.window_s, self._close_window)
