"""A pool's line: admission to it, the queue its members' lanes take jobs from, and each request's deadlines.

Admission in two steps (app/pool/admission.py decides), each one check of the line under the pool's lock:
  - `check_room()`, before a request's body is read: Busy (503 + Retry-After) at once when the line is
    full, and nothing taken;
  - `admit()`, once its input has arrived and before any work on it: a `Place`, or the same refusal at once.
A client sending its body slowly thus holds no place (it is bounded by the body deadline). Neither calls the
other: the room a request needs is checked once each time, and taken once.

A request with a place puts its inputs in the queue, from the event loop (`Place.run`) or straight from the
thread that prepared them (`Place.run_after`: no hop back through the loop in between), and awaits one
future, which the lane that runs it settles (app/pool/lanes.py). One timer on the loop keeps its
deadlines: `wait_timeout_s` to be taken by a lane (then Busy), and from then on the watchdog's timeout (then
DeviceHung, app/pool/watchdog.py) or `invoke_timeout_s` (then InvokeTimeout, 504).

A line whose every device left is handed to another (`successor`, set by app/pool/membership.py
`hand_over()`: the same model version's pool on its fallback backend): admission here gives places there,
and what is queued here from then on is queued there, under that line's deadlines.

The clock (seconds, monotonic) and the timers are passed in: admission, the deadlines' arithmetic and the
invoke times read the clock, and the deadlines fire on the timers (the running event loop's unless a test
passes fake ones that run on its fake clock: tests/doubles/clock.py), so a test moves time itself.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Protocol, TypeVar

from app.errors import Busy, InvokeTimeout
from app.pool.admission import Admission
from app.pool.job import Inputs, Job, Retire, settle
from app.pool.member import RunResult
from app.pool.watchdog import Watchdog

if TYPE_CHECKING:
    from app.pool.membership import Membership

Extra = TypeVar("Extra")  # what a request's input preparation gives back beside the inputs (run_after)


class Timers(Protocol):
    """Where a request's deadline checks are scheduled: an asyncio event loop (its `call_later`), or a
    test's fake timers on the pool's fake clock. Used from the event loop's thread only."""

    def call_later(self, delay: float, callback: Callable[..., object], *args: object) -> asyncio.TimerHandle: ...


class Place:
    """A place in a pool's bounded line, taken at admission and given back when the request ends."""

    __slots__ = ("line", "_held")

    def __init__(self, line: Line):
        self.line = line
        self._held = True

    # Awaitables handed through (no coroutine of their own): every level of coroutine a request awaits through runs
    # on the way in, and again when its answer comes.

    def run(self, inputs: Inputs) -> Awaitable[RunResult]:
        """Every input tensor through one member, within the line's deadlines: every output tensor."""
        return self.line.run(inputs)

    def run_after(self, prepare: Callable[[], tuple[Inputs, Extra]],
                  executor: Executor) -> Awaitable[tuple[RunResult, Extra]]:
        """`prepare()` on one of `executor`'s threads gives the inputs and an extra value (a decode's timings
        and geometry, say); that thread hands the inputs straight to the members' queue, with no hop back
        through the event loop between the two. The run's result, and the extra value."""
        return self.line.run_after(prepare, executor)

    def release(self) -> None:
        if self._held:
            self._held = False
            self.line.leave()


class Jobs:
    """The queue the lanes take jobs from: a queue.SimpleQueue, whose put and get run in C, bounded by a check before
    each put_nowait (queue.Full). With queue.Queue's Condition, the thread woken (a lane for a job, the loop for an
    answer) waited for the GIL while the other still ran that Python. Several threads putting at once may pass the
    bound by one each: admission keeps the line far below it."""

    __slots__ = ("_queue", "maxsize", "get", "get_nowait", "put", "qsize")

    def __init__(self, maxsize: int):
        self._queue = queue.SimpleQueue()
        self.maxsize = maxsize
        # the queue's own: get() blocks, get_nowait() raises queue.Empty, put() never blocks (a lane's STOP)
        self.get, self.get_nowait, self.put, self.qsize = (self._queue.get, self._queue.get_nowait, self._queue.put,
                                                           self._queue.qsize)

    def put_nowait(self, item: object) -> None:
        if self._queue.qsize() >= self.maxsize:
            raise queue.Full
        self._queue.put(item)


class Line:
    """The bounded line of one pool: who may wait (admission), the queue, and the deadlines of those waiting."""

    def __init__(self, label: str, membership: Membership, admission: Admission, lanes: int, wait_timeout_s: float,
                 invoke_timeout_s: float, retry_after_s: float, watchdog: Watchdog | None,
                 clock: Callable[[], float], timers: Callable[[], Timers], backend: str | None = None):
        """`lanes`: every member's lanes, which the queue has room for beside admission's `max_waiting`;
        `timers()` gives, on the event loop a request runs on, the timers its deadline checks are scheduled
        on (their delays are measured on `clock`)."""
        self.label = label
        self.backend = backend  # its pool's backend: what a line handed over to this one says it went to
        self.membership = membership  # how many lanes serve, or why none can (under its lock); the watchdog's
        self.admission = admission
        self.wait_timeout_s = wait_timeout_s
        self.invoke_timeout_s = invoke_timeout_s
        self.retry_after_s = retry_after_s
        self.watchdog = watchdog
        self.clock = clock
        self.timers = timers
        self.successor: Line | None = None  # where the line goes once every device left (hand_over)
        self.jobs = Jobs(self._capacity(lanes))

    def _capacity(self, lanes: int) -> int:
        # Bounded: admission keeps it far below this; twice the line leaves room for jobs whose
        # requests gave up waiting and which no lane has skipped yet.
        return 2 * (lanes + self.admission.max_waiting)

    def make_room(self, lanes: int) -> None:
        """Room in the queue for the line admission allows beside `lanes` (a member joined)."""
        self.jobs.maxsize = self._capacity(lanes)

    @property
    def handed_to(self) -> str | None:
        """The backend of the pool this line was handed to (every device left), if it was."""
        successor = self.successor
        return None if successor is None else successor.backend or successor.label

    @property
    def waiting(self) -> int:
        """Inputs handed to the pool and not yet taken by a lane (the queue depth)."""
        return self.jobs.qsize()

    # -- admission: one check, one take ----------------------------------------------------------

    def check_room(self) -> None:
        """Refuse at once, as admit() would now, without taking a place (the check before a body)."""
        successor = self.successor
        if successor is not None:
            return successor.check_room()
        with self.membership.lock:
            self.admission.refuse_if_full(self.membership.healthy_lanes())

    def admit(self) -> Place:
        """A place in line, or an error at once: every device unhealthy, closed, or the line full. A line
        handed over gives a place in its successor's."""
        successor = self.successor
        if successor is not None:
            return successor.admit()
        with self.membership.lock:
            self.admission.enter(self.membership.healthy_lanes())
        return Place(self)

    def leave(self) -> None:
        """A place given back (its request ended)."""
        with self.membership.lock:
            self.admission.leave()

    # -- the request's side --------------------------------------------------------------------
    # One future per request, settled by whichever thread finishes its part last (a lane with the
    # output, an image thread with a decoding error), and one timer on the loop for its deadlines:
    # a lane never has to reach the loop except to answer.

    # The job's deadline timer is set before its input is handed on: the thread that takes it next runs only once this
    # one lets go of the GIL, so what the loop does after the hand-off delays the device (about 10 us at one client).

    def run(self, inputs: Inputs) -> Awaitable[RunResult]:
        """Queued now (from the event loop), answered by awaiting what it returns: the job's outcome."""
        job = Job(inputs, asyncio.get_running_loop(), self.timers(), self.clock(), self)
        self._time(job)
        try:
            self._queue(job)
        except BaseException:
            job.timer.cancel()
            raise
        return self._outcome(job)

    async def run_after(self, prepare: Callable[[], tuple[Inputs, Extra]],
                        executor: Executor) -> tuple[RunResult, Extra]:
        job = Job(None, asyncio.get_running_loop(), self.timers(), self.clock(), self)
        self._time(job)
        try:
            executor.submit(self._prepare_and_queue, job, prepare)
        except BaseException:
            job.timer.cancel()
            raise
        result = await self._outcome(job)
        return result, job.extra

    def _prepare_and_queue(self, job: Job, prepare: Callable[[], tuple[Inputs, object]]) -> None:
        """On an image thread: the inputs, then straight into the line."""
        if job.abandoned:  # its request gave up while this thread was busy with others
            return
        late = self.admission.too_late(job.created_at, self.clock())
        if late is not None and job.claim():  # overloaded, and it waited its bound for this thread
            job.answer(error=late)
            return
        try:
            job.inputs, job.extra = prepare()
            if job.abandoned:  # gave up while its input was prepared
                return
            self._queue(job)
        except Exception as e:  # a bad image, the line full: handed to the request
            job.answer(error=e)

    def _queue(self, job: Job) -> None:
        job.queued_at = self.clock()
        successor = self.successor
        if successor is not None:
            return successor.adopt(job)
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            raise Busy(f"{self.label}: the line is full", self.retry_after_s) from None

    def _time(self, job: Job) -> None:
        # The first check comes at the earlier deadline: a job taken at once has its invoke
        # limit from then, and one not taken is refused at the wait deadline.
        job.timer = job.timers.call_later(min(self.wait_timeout_s, self.invoke_limit_s), self._check_deadline, job)

    async def _outcome(self, job: Job) -> RunResult:
        """The job's future, its timer set (`_time`)."""
        watched = False
        try:
            return await job.done
        except asyncio.CancelledError:
            # The request is gone: a lane that has not taken its input skips it. One that
            # has stays watched: a hang is the device's, whether or not anybody waits for the answer.
            watched = not job.claim() and job.line.watchdog is not None
            raise
        finally:
            if not watched:
                job.timer.cancel()

    # -- jobs moving between lines and lanes ------------------------------------------------------

    def adopt(self, job: Job) -> None:
        """A job from a line handed over to this one: into this line, under this line's deadlines."""
        job.line = self
        self.hand_back(job)

    def hand_back(self, job: Job) -> None:
        """A job back in line (from a lane that could not run it), or on to the successor."""
        successor = self.successor
        if successor is not None:
            return successor.adopt(job)
        try:
            self.jobs.put_nowait(job)
        except queue.Full:  # never while admission bounds the line; answered rather than lost
            if job.claim():
                job.answer(error=Busy(f"{self.label}: the line is full", self.retry_after_s))

    def put_back(self, item: Retire) -> None:
        try:
            self.jobs.put_nowait(item)
        except queue.Full:  # the lane ends at its next job instead
            pass

    def take_waiting(self) -> list[Job]:
        """Empty the line of requests (the stops of a pool closing, and retirements, stay in it)."""
        jobs, kept = [], []
        while True:
            try:
                item = self.jobs.get_nowait()
            except queue.Empty:
                break
            (jobs if isinstance(item, Job) else kept).append(item)
        for item in kept:
            self.jobs.put(item)
        return jobs

    # -- deadlines ---------------------------------------------------------------------------------

    @property
    def invoke_limit_s(self) -> float:
        return self.watchdog.timeout_s if self.watchdog else self.invoke_timeout_s

    def _check_deadline(self, job: Job) -> None:
        """On the loop, at a deadline of the job: refuse it (not taken in time), fail it (its
        invoke outlived its limit), or look again at the next deadline."""
        if job.line is not self:  # handed over: the deadlines of the line it is in now
            return job.line._check_deadline(job)
        if job.finished or (job.done.done() and not (job.done.cancelled() and job.invoking)):
            return  # answered, or its request gone and no invoke to watch (a cancelled one is watched)
        now = self.clock()
        wait_deadline = job.created_at + self.wait_timeout_s
        member, taken_at = job.member, job.taken_at  # read once: a job handed back resets them from a thread
        if taken_at is None or member is None:
            if now < wait_deadline:
                # again at least every invoke limit: a job taken meanwhile has its deadline from then
                job.timer = job.timers.call_later(min(wait_deadline - now, self.invoke_limit_s),
                                                  self._check_deadline, job)
                return
            if job.claim():  # no lane took it: none will now
                job.done.set_exception(Busy(f"{self.label}: no interpreter free within {self.wait_timeout_s} s",
                                            self.retry_after_s))
                return
            # taken just as the wait ended: its invoke is under way
            member, taken_at = job.member, job.taken_at
            if taken_at is None or member is None:  # handed back meanwhile: its wait deadline again
                job.timer = job.timers.call_later(self.invoke_limit_s / 4, self._check_deadline, job)
                return
        limit = self.invoke_limit_s
        invoke_deadline = taken_at + limit
        if now < invoke_deadline:
            job.timer = job.timers.call_later(invoke_deadline - now, self._check_deadline, job)
            return
        if self.watchdog:
            stalled = member.stalled(now, limit)
            if not stalled:  # a pipeline moving slowly, none of its segments hung: look again soon
                job.timer = job.timers.call_later(limit / 4, self._check_deadline, job)
                return
            settle(job.done, error=self.watchdog.quarantine(self.membership, member, stalled))
        else:
            job.done.set_exception(InvokeTimeout(f"{self.label}: the invoke did not finish within {limit} s "
                                                 "(EDGETPU_SERVE_INVOKE_TIMEOUT_S)", self.retry_after_s))
