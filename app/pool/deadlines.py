"""A request's deadlines in a pool's line, on one timer on the event loop per request.

Two deadlines: `wait_timeout_s` from the request's place in line to a lane taking its job (else Busy, 503), and from
the take the watchdog's timeout (then DeviceHung: the watchdog takes the member out, app/pool/watchdog.py) or
`invoke_timeout_s` (then InvokeTimeout, 504). The timer fires at the earlier deadline and, while neither has
passed, looks again at the next: a lane never has to reach the loop except to answer.

A job handed to another pool's line (every device left: app/pool/engine_pool.py `hand_over`) is under that line's
deadlines from then on (`Job.keeper`). The clock (seconds, monotonic) and the timers are the pool's, so a test moves
time itself (tests/doubles/clock.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from app.errors import Busy, InvokeTimeout
from app.pool.job import Job, settle
from app.pool.member import RunResult
from app.pool.watchdog import WatchedPool, Watchdog


class Deadlines:
    """The deadlines of the requests in one pool's line."""

    def __init__(self, label: str, wait_timeout_s: float, invoke_timeout_s: float, retry_after_s: float,
                 watchdog: Watchdog | None, clock: Callable[[], float], pool: WatchedPool):
        self.label = label
        self.wait_timeout_s = wait_timeout_s
        self.invoke_timeout_s = invoke_timeout_s
        self.retry_after_s = retry_after_s
        self.watchdog = watchdog  # None: the invoke's deadline is invoke_timeout_s, and nothing is re-created
        self.clock = clock
        self.pool = pool  # where a hung member is taken out (the watchdog's quarantine)

    @property
    def invoke_limit_s(self) -> float:
        return self.watchdog.timeout_s if self.watchdog else self.invoke_timeout_s

    def start(self, job: Job) -> None:
        """On the loop, before the job is queued: its one timer, at the earlier of its deadlines."""
        job.keeper = self
        wait_left = job.created_at + self.wait_timeout_s - self.clock()
        job.timer = job.timers.call_later(min(wait_left, self.invoke_limit_s), self.check, job)

    def waited_out(self, since: float) -> Busy | None:
        """Busy when a request in line since `since` has waited past its wait deadline (for an image thread, say)."""
        if self.clock() < since + self.wait_timeout_s:
            return None
        return Busy(f"{self.label}: no interpreter free within {self.wait_timeout_s} s", self.retry_after_s)

    def check(self, job: Job) -> None:
        """On the loop, at a deadline of the job: refuse it (not taken in time), fail it (its invoke outlived its
        limit), or look again at the next deadline."""
        if job.keeper is not self:  # handed over: the deadlines of the line it is in now
            return job.keeper.check(job)
        if job.finished or (job.done.done() and not (job.done.cancelled() and job.invoking)):
            return  # answered, or its request gone and no invoke to watch (a cancelled one is watched)
        now = self.clock()
        wait_deadline = job.created_at + self.wait_timeout_s
        member, taken_at = job.member, job.taken_at  # read once: a job handed back resets them from a thread
        if taken_at is None or member is None:
            if now < wait_deadline:
                # again at least every invoke limit: a job taken meanwhile has its deadline from then
                job.timer = job.timers.call_later(min(wait_deadline - now, self.invoke_limit_s), self.check, job)
                return
            if job.claim():  # no lane took it: none will now
                job.done.set_exception(Busy(f"{self.label}: no interpreter free within {self.wait_timeout_s} s",
                                            self.retry_after_s))
                return
            # taken just as the wait ended: its invoke is under way
            member, taken_at = job.member, job.taken_at
            if taken_at is None or member is None:  # handed back meanwhile: its wait deadline again
                job.timer = job.timers.call_later(self.invoke_limit_s / 4, self.check, job)
                return
        limit = self.invoke_limit_s
        invoke_deadline = taken_at + limit
        if now < invoke_deadline:
            job.timer = job.timers.call_later(invoke_deadline - now, self.check, job)
            return
        if self.watchdog:
            stalled = member.stalled(now, limit)
            if not stalled:  # a pipeline moving slowly, none of its segments hung: look again soon
                job.timer = job.timers.call_later(limit / 4, self.check, job)
                return
            settle(job.done, error=self.watchdog.quarantine(self.pool, member, stalled))
        else:
            job.done.set_exception(InvokeTimeout(f"{self.label}: the invoke did not finish within {limit} s "
                                                 "(EDGETPU_SERVE_INVOKE_TIMEOUT_S)", self.retry_after_s))


async def outcome(job: Job) -> RunResult:
    """The job's future, its timer set (`Deadlines.start`): what the request awaits."""
    watched = False
    try:
        return await job.done
    except asyncio.CancelledError:
        # The request is gone: a lane that has not taken its input skips it. One that has stays
        # watched: a hang is the device's, whether or not anybody waits for the answer.
        watched = not job.claim() and job.keeper.watchdog is not None
        raise
    finally:
        if not watched:
            job.timer.cancel()
        # A failure is in job.done too, and this frame joins its traceback: without the name, no cycle keeps the
        # job (and the request's input) alive until a full collection
        del job
