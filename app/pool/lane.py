"""A lane: the loop of one thread on one member of a pool (one lane for a whole model's interpreter, `lanes` for a
pipeline). It takes the next job straight from the line's thread-safe queue (app/pool/line.py), runs it on its
member and answers the request's future through the event loop (`Job.answer`), so a device never waits for the loop
between requests. A request hands the member all of the model's input tensors and gets all its output tensors back.

One run returns what happened as a value (`Answered`, `Failed`, `Left`), and the lane returns to its pool what the
pool must act on (app/pool/engine_pool.py): the pool closing (`STOPPED`), the member retired (`RETIRED`), its device
leaving under a job (`Left`: the job has no answer yet), or the member out of the pool (`Out`: taken out by the
watchdog, or left). The lane changes no member's health and knows no pool: it holds its member, the line and the
clock; and, for an interpreter that computes on the host's cores, the thread below the loop's priority that runs
its invokes while the line is overloaded (app/threads.py: the loop first while it refuses, the interpreter level
with every other process the rest of the time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from app.errors import DeviceGone
from app.pool.job import STOP, Job, Retire
from app.pool.line import Line
from app.pool.member import Member, RunResult, timed_run
from app.threads import Below


class Answered(NamedTuple):
    result: RunResult


class Failed(NamedTuple):
    error: Exception  # handed to the request


class Left(NamedTuple):
    """The member's device left during the invoke of `job` (DeviceGone): the job has no answer yet."""

    job: Job
    gone: DeviceGone


class Out(NamedTuple):
    """The member is out of the pool: `job` was taken from the line and not run (None: seen after a run)."""

    job: Job | None


STOPPED = "stopped"  # the pool closes: this lane ends
RETIRED = "retired"  # the member left while this lane was idle: it ends, closing the member if it is the last


class Lane:
    """One thread's loop on one member: take a job, run it, answer it."""

    __slots__ = ("member", "line", "clock", "backend", "below", "busy")

    def __init__(self, member: Member, line: Line, clock: Callable[[], float], backend: str | None = None,
                 nice: int = 0):
        """`nice`: steps below the process for the member's invokes while the line is overloaded (COMPUTE_NICE for
        a backend on the host's cores; 0, or a member whose invokes run on threads of its own: always here)."""
        self.member = member
        self.line = line
        self.clock = clock
        self.backend = backend  # its pool's backend: each run says which backend ran it (RunResult.backend)
        self.below = Below(nice) if nice > 0 and member.invokes_on_lane else None
        self.busy = False  # an invoke under way (a hung one included, until it returns)

    def serve(self) -> str | Left | Out:
        """Take jobs, run them and answer them, until something happens that the pool must act on: that."""
        member, line, clock = self.member, self.line, self.clock
        take = line.take
        while True:
            job = take()
            if job is STOP:
                return STOPPED
            if type(job) is Retire:
                if job.member is member:
                    return RETIRED
                if job.member.live_lanes > 0:  # for one of its lanes still waiting
                    line.put_back(job)
                continue
            if not member.healthy:  # taken out meanwhile (a pipeline's idle lane): the job goes to the others
                return Out(job)
            job.member, job.taken_at = member, clock()
            if not job.claim():  # its request stopped waiting
                continue
            late = line.too_late(job.created_at, job.taken_at)
            if late is not None:  # a 503 now, and the lane goes to the next
                job.answer(error=late)
                continue
            happened = self.run(job)
            if type(happened) is Left:
                return happened
            job.finished = True
            if type(happened) is Answered:
                # last: the loop that wakes for it waits for this thread to let go of the GIL
                job.answer(happened.result)
            else:
                job.answer(error=happened.error)
            if not member.healthy:  # the watchdog took it out meanwhile
                return Out(None)

    def run(self, job: Job) -> Answered | Failed | Left:
        """The job's inputs through the member, timed: what happened. Busy while it runs, and no longer before its
        request hears of the result."""
        job.invoking = True
        self.busy = True
        run = (self.member, job.inputs, self.clock, (job.taken_at - job.queued_at) * 1000, self.backend)
        try:
            if self.below is not None and self.line.overloaded:
                result = self.below.call(timed_run, *run)
            else:
                result = timed_run(*run)
        except DeviceGone as gone:
            return Left(job, gone)
        except Exception as e:
            return Failed(e)
        finally:
            self.busy = False
        if not result.cold:
            self.line.note_invoke(result.inference_ms)
        return Answered(result)

    def close(self) -> None:
        """Its thread is ending: the thread below, if it made one, ends too."""
        if self.below is not None:
            self.below.close()
