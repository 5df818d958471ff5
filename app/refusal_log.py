"""What the doors log of the requests they refuse or fail, without a line per request (RefusalLog): the HTTP doors'
5xx answers and the bugs they answer (app/api/errors.py, app/api/deepstack.py, app/api/v2/router.py), the ZMQ door's
refused requests and dropped peers (app/frontdoors/). Every refusal is still counted in /metrics; the log says
that they happen and why, without letting an overload or a hostile client fill it: one place for every door."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable

from app.settings import default

REFUSED = 503
REFUSAL_LOG_WINDOW_S = default("refusal_log_window_s")  # until an app sets its own (REFUSAL_LOG_WINDOW_S)


class RefusalLog:
    """Refusals logged without a line per request: the first of each kind after a quiet window in full (a refusal at
    WARNING; a failure at ERROR, with its traceback where one is given), then, while they go on, one line per
    window: how many more, of which kind. A kind is a refusal's `reason` where it carries one (the ZMQ door's short
    labels), else its class: a bounded set, and a new kind in the middle of a flood of another is still seen in
    full. The summary is written by a timer on the event loop when the window closes, so the last one of a burst
    is not lost. `event_loop` gives the loop whose timers close the windows (the running one; a test passes a
    double whose time it moves itself). The summary names `status` where all of the window's share one (an HTTP
    door's 503s)."""

    def __init__(self, logger: logging.Logger, window_s: float = REFUSAL_LOG_WINDOW_S, *,
                 event_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.get_running_loop,
                 status: int | None = REFUSED):
        self.log = logger
        self.status = status
        self.window_s = window_s
        self.counts: Counter[str] = Counter()
        self._statuses: set[int | None] = set()
        self._logged: set[str] = set()   # the kinds logged in full since the last quiet window
        self._event_loop = event_loop
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def refused(self, method: str, path: str, error: Exception, status: int | None = None) -> None:
        """Call on the event loop, once per refused request (`method` and `path` say where: a route, or another
        protocol's door and peer)."""
        self._note(logging.WARNING, method, path, error, status, None)

    def failed(self, method: str, path: str, error: BaseException, status: int | None = 500,
               exc_info: bool = False) -> None:
        """A request that failed (a 5xx that is not a refusal, or a bug): at ERROR, its traceback with the first of
        its kind where `exc_info`; call from the except block that caught it."""
        self._note(logging.ERROR, method, path, error, status, exc_info)

    def _note(self, level: int, method: str, path: str, error: BaseException, status: int | None,
              exc_info: bool | None) -> None:
        kind = getattr(error, "reason", None) or type(error).__name__
        loop = self._event_loop()
        if self._loop is not loop:  # a new loop (a test's app after another's): its own windows
            self._loop, self._timer = loop, None
            self._logged.clear()
            self.counts.clear()
        if kind in self._logged:
            self.counts[kind] += 1
            self._statuses.add(status if status is not None else self.status)
            return
        self._logged.add(kind)
        number = status if status is not None else self.status
        where = f"{method} {path}: {number} " if number is not None else f"{method} {path}: "
        self.log.log(level, "%s%s (further ones are summed up every %g s)", where, error, self.window_s,
                     exc_info=error if exc_info else None)
        if self._timer is None:
            self._timer = loop.call_later(self.window_s, self._close_window)

    def _close_window(self) -> None:
        if not self.counts:  # quiet: the next refusal of any kind is logged in full
            self._timer = None
            self._logged.clear()
            return
        statuses = self._statuses - {None}
        status = f" ({next(iter(statuses))})" if len(statuses) == 1 and None not in self._statuses else ""
        self.log.warning("refused %d more requests%s in the last %g s: %s", sum(self.counts.values()), status,
                         self.window_s, ", ".join(f"{n} x {what}" for what, n in self.counts.most_common()))
        self.counts.clear()
        self._statuses.clear()
        self._timer = self._loop.call_later(self.window_s, self._close_window)
