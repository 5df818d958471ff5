"""A pool's lanes: one thread per lane of each member (one for a whole model's interpreter, `lanes` for a
pipeline), each taking the next job straight from the line's thread-safe queue (app/pool/line.py), running
it on its member and completing the request's future through the event loop (`call_soon_threadsafe`), so a
device never waits for the loop between requests. A request hands the member all of the model's input
tensors and gets all its output tensors back (RunResult).

A job whose invoke fails because its device left (DeviceGone) takes the member out of the pool
(app/pool/membership.py `leave`) and goes back in line for the others, at most MAX_HAND_BACKS times. A lane
of a member the watchdog took out ends (a whole model's interpreter: its replacement needs the device) or
waits while the member is repaired in place (a pipeline); the last lane of a member to end closes it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.errors import DeviceGone
from app.pool.job import STOP, Inputs, Job, Retire
from app.pool.member import Member, RunResult, timed_run
from app.pool.membership import Membership, departed_problem
from app.threads import lower_this_thread

if TYPE_CHECKING:
    from app.pool.line import Line

# How often a request goes back in line because the device running it left: beyond, a 503. Fixed: a request
# whose device leaves three times running meets a host losing its TPUs, and waiting longer helps nobody.
MAX_HAND_BACKS = 3


class Lanes:
    """The members' threads of one pool: each takes a job from the line, runs it, answers it."""

    def __init__(self, label: str, line: Line, membership: Membership, clock: Callable[[], float],
                 retry_after_s: float, backend: str | None = None, thread_nice: int = 0):
        self.label = label
        self.line = line
        self.membership = membership  # a member whose device left mid-invoke leaves through it; its lock counts
        self.clock = clock
        self.retry_after_s = retry_after_s
        self.backend = backend  # its backend's key: each run says which backend ran it (RunResult.backend)
        self.thread_nice = thread_nice  # for interpreters that compute on the host's cores
        self._running = 0  # runs under way now

    @property
    def busy(self) -> int:
        """Requests running now (a hung one included, until it returns)."""
        return self._running

    def start(self, member: Member, tag: object) -> None:
        """A thread for each of the member's lanes, named after its pool and `tag` (its device, or its place
        among the members). Under the membership's lock: closing counts the threads started."""
        name = f"pool-{self.label}-{tag}"
        member.threads = [threading.Thread(target=self._serve, args=(member,), daemon=True,
                                           name=name if member.lanes == 1 else f"{name}-{lane}")
                          for lane in range(member.lanes)]
        member.live_lanes = member.lanes
        for thread in member.threads:
            thread.start()

    def retire(self, member: Member) -> None:
        """The idle lanes of a member that left end now, releasing its device's interpreter."""
        for _ in range(member.live_lanes):
            self.line.put_back(Retire(member))

    def stop(self, lanes: int) -> None:
        """That many lanes end, each after the jobs queued before now (the pool closes)."""
        for _ in range(lanes):
            self.line.jobs.put(STOP)

    def join(self, timeout_s: float) -> bool:
        """Wait (bounded) until the lanes of the healthy members ended; False if some have not yet."""
        members = self.membership.members
        deadline = time.monotonic() + timeout_s
        for member in list(members):
            if member.healthy:
                for thread in member.threads:
                    thread.join(max(0.0, deadline - time.monotonic()))
        return not any(m.healthy and any(t.is_alive() for t in m.threads) for m in members)

    def _serve(self, member: Member) -> None:
        """One lane of a member: next job, run, answer; until stopped, or out of the pool for good."""
        lower_this_thread(self.thread_nice)
        line = self.line
        jobs = line.jobs
        while True:
            job = jobs.get()
            if job is STOP:
                break
            if type(job) is Retire:
                if job.member is member:
                    break
                if job.member.live_lanes > 0:  # for one of its lanes still waiting
                    line.put_back(job)
                continue
            if not member.healthy:  # taken out meanwhile (a pipeline's idle lane): the job goes to the others
                line.hand_back(job)
                if self._back_in_pool(member):
                    continue
                break
            job.member, job.taken_at = member, self.clock()
            if not job.claim():  # its request stopped waiting
                continue
            late = line.admission.too_late(job.created_at, job.taken_at)
            if late is not None:  # a 503 now, and the lane goes to the next
                job.answer(error=late)
                continue
            job.invoking = True
            result, error = None, None
            try:
                result = self._run(member, job.inputs, (job.taken_at - job.queued_at) * 1000)
            except DeviceGone as gone:  # its device left mid-invoke: out of the pool, the request to the others
                self.membership.leave(member, departed_problem([gone.device or member.where]), gone.device)
                self._again(job, gone)
                if self._back_in_pool(member):
                    continue
                break
            except Exception as e:  # handed to the request
                error = e
            if result is not None and not result.cold:
                line.admission.note_invoke(result.inference_ms)
            job.finished = True
            job.answer(result, error)  # last: the loop that wakes for it waits for this thread to let go of the GIL
            if not member.healthy and not self._back_in_pool(member):  # the watchdog took it out meanwhile
                break
        self._lane_ended(member)

    def _run(self, member: Member, inputs: Inputs, queue_ms: float) -> RunResult:
        """timed_run, counted busy while it runs (and no longer before its request hears of the result)."""
        lock = self.membership.lock
        with lock:
            self._running += 1
        try:
            return timed_run(member, inputs, self.clock, queue_ms, self.backend)
        finally:
            with lock:
                self._running -= 1

    def _again(self, job: Job, gone: DeviceGone) -> None:
        """A job whose device left during its invoke: back in line for another member (or the successor),
        a few times at most; the device's failed invoke gave it no answer yet."""
        if job.handed_back >= MAX_HAND_BACKS:
            job.finished = True
            job.answer(error=DeviceGone(f"{self.label}: {gone}", self.retry_after_s))
            return
        job.handed_back += 1
        job.untake()
        self.line.hand_back(job)

    def _back_in_pool(self, member: Member) -> bool:
        """A lane of a member the watchdog took out: wait while it is repaired in place (True once it is
        back); end at once otherwise (an interpreter, whose replacement needs its device), or when the pool closes."""
        if not member.repaired_in_place:
            return False
        membership = self.membership
        with membership.changed:
            membership.changed.wait_for(lambda: member.healthy or membership.closed.is_set())
            return member.healthy and not membership.closed.is_set()

    def _lane_ended(self, member: Member) -> None:
        """The last lane of a member to end closes it."""
        with self.membership.lock:
            member.live_lanes -= 1
            last = member.live_lanes == 0
        if last:
            member.close()
