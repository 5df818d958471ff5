"""A pool for one (model, backend): the one owner of its lock, its members and their health, made of parts that
know nothing of it:

  - the line (app/pool/line.py): a queue with admission counts;
  - the lanes (app/pool/lane.py): a thread per lane of each member (one for a whole model's interpreter, 2K for a
    pipeline of K segments), each a loop that takes a job, runs it and returns to the pool what the pool must act on;
  - the deadlines (app/pool/deadlines.py): one timer per request on the event loop;
  - the members (app/pool/member.py, pipeline.py) and the watchdog (app/pool/watchdog.py), which changes health
    through the pool.

A request takes a `Place` in line (`admit()`, after `check_room()` before its body was read) and runs its inputs
through it (`Place.run`): inputs at hand, queued from the event loop, or inputs still being made on another thread
(an image thread), queued by that thread the moment they are made, with no hop through the loop. Members join and
leave while the pool serves (TPUs plugged in and unplugged: `add`, `leave`, `replace`); a pool whose every device
left hands its line to the pool serving the model instead (`hand_over`: the same model version on its fallback
backend) or answers it at once (`refuse_waiting`): every request gets its answer. Every change of health is made
under the one lock, the one admission holds while it counts the healthy lanes, and notifies `changed`: tests and
shutdown wait on it, no polling.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from functools import partial

import numpy as np

from app.errors import Busy, DeviceGone, DeviceHung
from app.pool.admission import OVERLOAD_HOLD_S
from app.pool.deadlines import Deadlines, outcome
from app.pool.job import Inputs, Job, Retire, Timers
from app.pool.lane import RETIRED, STOPPED, Lane, Left
from app.pool.line import Line
from app.pool.member import Member, Members, RunResult, timed_run
from app.pool.watchdog import Watchdog

log = logging.getLogger(__name__)


def departed_problem(devices: Sequence[str]) -> str:
    """What a member whose devices left says (readiness, /v1/devices)."""
    return f"is gone: {', '.join(devices)} not listed any more (unplugged?); out of the pool until it is back"


class Place:
    """A place in a pool's line, taken at admission (`EnginePool.admit`) and given back when the request ends."""

    __slots__ = ("pool", "since", "_held")

    def __init__(self, pool: EnginePool, since: float):
        self.pool = pool
        self.since = since  # the pool's clock at admission: the wait deadline runs from here
        self._held = True

    def run(self, inputs: Inputs | Future[Inputs]) -> Awaitable[RunResult]:
        """Every input tensor through one member, within the line's deadlines: every output tensor. `inputs` may
        still be in the making on another thread (a `concurrent.futures.Future` of them, an image thread's): that
        thread queues the job the moment they are made (the device never waits for the event loop in between),
        and the failure that made none is the request's. An awaitable handed through, no coroutine of its own (each
        level a request awaits through runs twice)."""
        pool = self.pool
        made = inputs if isinstance(inputs, Future) else None
        job = Job(inputs if made is None else None, asyncio.get_running_loop(), pool.timers(), self.since)
        # The timer is set before the job is queued: the lane that takes it runs only once this thread lets go of
        # the GIL, so what the loop does after the hand-off delays the device (about 10 us at one client).
        pool.deadlines.start(job)
        try:
            if made is None:
                pool.put(job)
            else:  # its callback runs on the thread that makes them (here, if they are made already)
                made.add_done_callback(partial(self._put_made, job))
        except BaseException:
            job.timer.cancel()
            raise
        return outcome(job)

    def _put_made(self, job: Job, made: Future[Inputs]) -> None:
        """On the thread that made the job's inputs: the job into the line; or the failure that made none (a bad
        image, a place that waited too long), or the line full, to the request. None when it gave up."""
        if made.cancelled():
            return
        error = made.exception()
        if error is None:
            job.inputs = made.result()
            try:
                return self.pool.put(job)
            except Busy as full:
                error = full
        if job.claim():
            job.answer(error=error)

    def overdue(self) -> Busy | None:
        """Busy when this place has waited too long to be worth any work (for an image thread, say): past the
        bound by time of an overloaded line, or past the wait deadline."""
        pool = self.pool
        return pool.line.too_late(self.since, pool.clock()) or pool.deadlines.waited_out(self.since)

    def release(self) -> None:
        if self._held:
            self._held = False
            pool = self.pool
            with pool.lock:
                pool.line.leave()

    def __enter__(self) -> Place:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class EnginePool:
    """One (model, backend)'s members, line, lanes and deadlines, under one lock."""

    def __init__(self, label: str, members: list[Member], max_waiting: int, wait_timeout_s: float,
                 retry_after_s: float, watchdog: Watchdog | None = None, invoke_timeout_s: float = 30.0,
                 *, max_queue_ms: float = 0.0, thread_nice: int = 0, clock: Callable[[], float] = time.monotonic,
                 timers: Callable[[], Timers] = asyncio.get_running_loop, overload_hold_s: float = OVERLOAD_HOLD_S,
                 backend: str | None = None):
        """`clock`: the time of every deadline and invoke (seconds, monotonic); `timers()`: on the loop a request
        runs on, where its deadline checks are scheduled (that loop's by default)."""
        if not members:
            raise ValueError("a pool needs at least one member")
        self.label = label
        self.backend = backend  # its backend's key: each run says which backend ran it (RunResult.backend)
        self.retry_after_s = retry_after_s
        self.watchdog = watchdog
        self.clock = clock
        self.timers = timers
        self.thread_nice = thread_nice  # for interpreters on the host's cores, while overloaded (app/threads.py)
        self.members = Members(members)  # the one list: joining and leaving change it in place
        self.line = Line(label, self.members.lanes, max_waiting, max_queue_ms, retry_after_s, clock, overload_hold_s)
        self.deadlines = Deadlines(label, wait_timeout_s, invoke_timeout_s, retry_after_s, watchdog, clock, self)
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)  # notified whenever a member's health changes
        self.closed = threading.Event()
        self.successor: EnginePool | None = None  # where the line goes once every device left (hand_over)
        self._refusing: str | None = None  # every device left and nothing serves instead: why (refuse_waiting)
        self._lanes: list[Lane] = []
        with self.lock:
            for member in self.members:
                self._start(member)

    @property
    def busy(self) -> int:
        """Requests running now (a hung one included, until it returns)."""
        with self.lock:
            return sum(lane.busy for lane in self._lanes)

    @property
    def handed_to(self) -> str | None:
        """The backend of the pool this one handed its line to (every device left), if it did."""
        successor = self.successor
        return None if successor is None else successor.backend or successor.label

    def check_room(self) -> None:
        """Refuse at once, as admit() would now, without taking a place (the check before a body)."""
        successor = self.successor
        if successor is not None:
            return successor.check_room()
        with self.lock:
            self.line.refuse_if_full(self._healthy_lanes())

    def admit(self) -> Place:
        """A place in line (in the successor's, once handed over), or an error at once: every device unhealthy,
        closed, or the line full."""
        successor = self.successor
        if successor is not None:
            return successor.admit()
        with self.lock:
            self.line.enter(self._healthy_lanes())
        return Place(self, self.clock())

    def put(self, job: Job) -> None:
        """A request's job into this line (its deadlines started), or into the successor's: Busy if full."""
        job.queued_at = self.clock()
        successor = self.successor
        if successor is None:
            return self.line.put(job)
        job.keeper = successor.deadlines
        successor.put(job)

    def adopt(self, job: Job) -> None:
        """A job back in line from a thread (its device left), or moved here from a line handed over: under this
        line's deadlines from now on, answered with Busy if the line is full."""
        successor = self.successor
        if successor is not None:
            return successor.adopt(job)
        job.keeper = self.deadlines
        self.line.hand_back(job)

    def _healthy_lanes(self) -> int:
        """The healthy members' lanes; DeviceGone or DeviceHung if none, Busy if closed (under self.lock)."""
        healthy = self.members.healthy_lanes()
        if healthy == 0:
            if all(m.departed for m in self.members):
                if self._refusing is None:  # devices left a moment ago: wait in line for what follows (hand_over)
                    return 0
                raise DeviceGone(f"{self.label}: {self._refusing}", self.retry_after_s)
            problems = "; ".join(f"{m.where} {m.problem}" for m in self.members)
            raise DeviceHung(f"{self.label}: every device is unhealthy ({problems})", self.retry_after_s)
        if self.closed.is_set():
            raise Busy(f"{self.label}: closed (shutting down, or replaced by a reload)", self.retry_after_s)
        return healthy

    # -- members joining and leaving while serving (devices plugged in and unplugged), and health --------

    def add(self, member: Member) -> bool:
        """A member on a device that joined serves from now on (warmed up already); False if the pool closed."""
        with self.lock:
            if self.closed.is_set():
                return False
            self.members.append(member)
            self.line.make_room(self.members.lanes)  # room in the queue for the line admission now allows
            self.successor, self._refusing = None, None  # a device again: the line is this pool's again
            self._start(member)
            self.changed.notify_all()
        log.info("%s: %s joined the pool (%d healthy)", self.label, member.where, sum(m.healthy for m in self.members))
        return True

    def leave(self, member: Member, problem: str, device: str | None = None) -> bool:
        """A device of this member left (unplugged): the member is out, `departed`, until `replace()` puts it (or
        one on another device) back; the requests inside it go to the others. False if it was out already."""
        with self.lock:
            if not member.healthy:
                return False
            member.healthy, member.problem, member.departed = False, problem, True
            self.changed.notify_all()
        stages = [s for s in member.stages if device is None or s.device == device] or member.stages
        member.lose(stages, DeviceGone(f"{self.label}: {member.where} {problem}", self.retry_after_s))
        if not member.repaired_in_place:
            for _ in range(member.live_lanes):  # its idle lanes end now, releasing the device's interpreter
                self.line.put_back(Retire(member))
        log.warning("%s: %s %s: out of the pool", self.label, member.where, problem)
        return True

    def replace(self, old: Member, fresh: Member) -> bool:
        """A re-created member in for `old` (or `old` repaired in place: its lanes go on); False if closed."""
        with self.lock:
            if self.closed.is_set():
                return False
            if fresh is not old:
                self.members[self.members.index(old)] = fresh
                self._start(fresh)
            fresh.healthy, fresh.problem, fresh.departed = True, None, False
            self.successor, self._refusing = None, None
            self.changed.notify_all()
            return True

    def hand_over(self, successor: EnginePool) -> int:
        """Every device left and another backend serves the model now: this line goes to `successor` (the same
        version's pool there), the requests waiting and any queued from now on, under its deadlines, and admission
        here gives places there, until a device joins (`add`, `replace`). How many were handed over."""
        with self.lock:
            if successor is self or self.closed.is_set():
                return 0
            self.successor = successor
            self.changed.notify_all()
        moved = self.line.take_waiting()
        for job in moved:
            successor.adopt(job)
        if moved:
            log.warning("%s: every device left: %d waiting request(s) handed to %s", self.label, len(moved),
                        successor.label)
        return len(moved)

    def refuse_waiting(self, reason: str) -> int:
        """Every device left and none serves the model instead: the requests waiting, and every new one until a
        device is back, are answered now (DeviceGone: 503 with Retry-After). How many were waiting."""
        with self.lock:
            self._refusing = reason
        refused = [job for job in self.line.take_waiting() if job.claim()]
        for job in refused:
            job.answer(error=DeviceGone(f"{self.label}: {reason}", self.retry_after_s))
        return len(refused)

    def take_out(self, member: Member, problem: str) -> bool:
        """Mark a healthy member unhealthy (out of the pool); False if it was already."""
        with self.lock:
            if not member.healthy:
                return False
            member.healthy, member.problem = False, problem
            self.changed.notify_all()
            return True

    def note_problem(self, member: Member, problem: str) -> None:
        with self.lock:
            member.problem = problem
            self.changed.notify_all()

    def warm_up(self, member: Member | None = None) -> None:
        """One input through `member` (re-created, or on a device that joined), or through every member before the
        pool serves (blocking); bounded by the watchdog where there is one."""
        for each in self.members if member is None else [member]:
            inputs = [np.full(spec.shape, spec.zero_point, spec.dtype) for spec in each.inputs]
            if self.watchdog is None:
                timed_run(each, inputs, self.clock)
            else:
                self.watchdog.warm_up(self, each, inputs)

    def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Block until predicate() holds after a health change (or now), at most timeout_s."""
        with self.changed:
            return self.changed.wait_for(predicate, timeout_s)

    # -- the lanes, and the end ------------------------------------------------------------------

    def _start(self, member: Member) -> None:
        """A thread for each of the member's lanes, named after the pool and the member's device (else its place
        among the members). Under the lock: closing counts the threads started."""
        name = f"pool-{self.label}-{member.device or self.members.index(member)}"
        lanes = [Lane(member, self.line, self.clock, self.backend, self.thread_nice) for _ in range(member.lanes)]
        self._lanes.extend(lanes)
        member.threads = [threading.Thread(target=self._serve, args=(lane,), daemon=True,
                                           name=name if member.lanes == 1 else f"{name}-{i}")
                          for i, lane in enumerate(lanes)]
        member.live_lanes = member.lanes
        for thread in member.threads:
            thread.start()

    def _serve(self, lane: Lane) -> None:
        """A lane's thread: its loop, and what the pool does with what it returns; until the pool closes, or the
        member is out for good. The last lane of a member to end closes it."""
        member = lane.member
        while (happened := lane.serve()) is not STOPPED and happened is not RETIRED:
            if type(happened) is Left:  # out of the pool, and the request to the others
                job, gone = happened
                self.leave(member, departed_problem([gone.device or member.where]), gone.device)
                if job.again(DeviceGone(f"{self.label}: {gone}", self.retry_after_s)):
                    self.adopt(job)
            elif happened.job is not None:  # taken from the line while the member was out: to the others
                self.adopt(happened.job)
            if not self._back_in_pool(member):
                break
        lane.close()
        with self.lock:
            self._lanes.remove(lane)
            member.live_lanes -= 1
            last = member.live_lanes == 0
        if last:
            member.close()

    def _back_in_pool(self, member: Member) -> bool:
        """A member out of the pool: wait while it is repaired in place (True once it is back); False at once
        otherwise (an interpreter, whose replacement needs its device), or when the pool closes."""
        if not member.repaired_in_place:
            return False
        with self.changed:
            self.changed.wait_for(lambda: member.healthy or self.closed.is_set())
            return member.healthy and not self.closed.is_set()

    def close(self) -> None:
        """Stop taking work: each member's last lane closes it after the jobs queued before now (a hung one if its
        invoke ever returns; the lanes of a member out for repair end now). `members.join()` waits for them."""
        with self.lock:
            if self.closed.is_set():
                return
            self.closed.set()
            running = sum(len(m.threads) for m in self.members if m.healthy or m.repaired_in_place)
            self.changed.notify_all()
        self.line.stop(running)
