"""A pool's line: a queue with admission counts.

The counts are admission's (app/pool/admission.py: the places held, the recent invoke time, the overload), the queue
is what the lanes take jobs from (app/pool/lane.py). Admission happens in two steps, each one check under the pool's
lock (app/pool/engine_pool.py): the room check before a request's body is read (`refuse_if_full`), and the place
taken once its input is here (`enter`). Like admission, the line has no lock of its own: the pool counts under its
lock, and the queue is thread-safe by itself.

The queue is a queue.SimpleQueue, whose put and get run in C, bounded by a check before each put. With
queue.Queue's Condition, the thread woken (a lane for a job, the loop for an answer) waited for the GIL while the
other still ran that Python. Several threads putting at once may pass the bound by one each: admission keeps the
line far below it.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

from app.errors import Busy
from app.pool.admission import OVERLOAD_HOLD_S, Admission
from app.pool.job import STOP, Job, Retire


class Line(Admission):
    """Admission's counts of one pool, and the bounded queue of its jobs."""

    def __init__(self, label: str, lanes: int, max_waiting: int, max_queue_ms: float, retry_after_s: float,
                 clock: Callable[[], float] = time.monotonic, hold_s: float = OVERLOAD_HOLD_S):
        """`lanes`: every member's lanes, which the queue has room for beside admission's `max_waiting`."""
        super().__init__(label, max_waiting, max_queue_ms, retry_after_s, clock, hold_s)
        self._queue = queue.SimpleQueue()
        self.maxsize = self._capacity(lanes)
        self.take = self._queue.get  # a lane's next item: blocks until there is one

    def _capacity(self, lanes: int) -> int:
        # Bounded: admission keeps it far below this; twice the line leaves room for jobs whose
        # requests gave up waiting and which no lane has skipped yet.
        return 2 * (lanes + self.max_waiting)

    def make_room(self, lanes: int) -> None:
        """Room in the queue for the line admission allows beside `lanes` (a member joined)."""
        self.maxsize = self._capacity(lanes)

    @property
    def waiting(self) -> int:
        """Inputs handed to the pool and not yet taken by a lane (the queue depth)."""
        return self._queue.qsize()

    def put(self, job: Job) -> None:
        """A request's job into the queue; Busy when it is full (never while admission bounds the line)."""
        if self._queue.qsize() >= self.maxsize:
            raise Busy(f"{self.label}: the line is full", self.retry_after_s)
        self._queue.put(job)

    def hand_back(self, job: Job) -> None:
        """A job back in the queue from a thread (a lane that could not run it, a line handed over): answered
        with Busy when the queue is full rather than lost."""
        try:
            self.put(job)
        except Busy as full:
            if job.claim():
                job.answer(error=full)

    def put_back(self, item: Retire) -> None:
        """A retirement for the lanes of another member; dropped when the queue is full (that lane ends at its
        next job instead)."""
        if self._queue.qsize() < self.maxsize:
            self._queue.put(item)

    def stop(self, lanes: int) -> None:
        """That many lanes end, each after the jobs queued before now (the pool closes)."""
        for _ in range(lanes):
            self._queue.put(STOP)

    def take_waiting(self) -> list[Job]:
        """Empty the line of requests (the stops of a pool closing, and retirements, stay in it)."""
        jobs, kept = [], []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            (jobs if isinstance(item, Job) else kept).append(item)
        for item in kept:
            self._queue.put(item)
        return jobs
