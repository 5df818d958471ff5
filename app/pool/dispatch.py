"""A pool for one (model, backend): its members (app/pool/member.py: interpreters, or a pipeline of
segments), each taking as many requests at once as it has lanes (one for an interpreter).

Admission in two steps (app/pool/admission.py decides): before a request's body is read,
`check_room()` refuses it at once (Busy: 503 + Retry-After) when the line is full, without
taking anything; once its input has arrived, it takes a place (`admit()`) before any work on
it, so a client sending its body slowly holds no place (it is bounded by the body deadline).

Dispatch: each member has a thread per lane, which takes the next job straight from the
pool's thread-safe queue and completes the request's future through the event loop
(`call_soon_threadsafe`), so a device never waits for the loop between requests.

Members join and leave while the pool serves (TPUs plugged in and unplugged: the plug-in's probe,
app/registry/devices.py): `add()` a member loaded and warmed on a new device; `leave()` a member whose
device left (it is `departed`, out until the device is back: `replace()`). A request whose invoke fails
because its device left (DeviceGone) goes back in line for the others; a pool whose every device left
hands its line to the pool serving the model instead (`hand_over()`: the same model version on its
fallback backend), or answers it at once (`refuse_waiting()`): every request gets its answer. Every wait
of a request has a deadline: `wait_timeout_s` to be taken by an interpreter (then Busy),
and for the invoke itself the watchdog's timeout (then DeviceHung, app/pool/watchdog.py) or
`invoke_timeout_s` (then InvokeTimeout, 504). A request hands the member all of the model's input
tensors and gets all its output tensors back (RunResult).

The clock (seconds, monotonic) and the timers are passed in: admission, the deadlines' arithmetic and
the invoke times read the clock, and the deadlines fire on the timers (the running event loop's unless a
test passes fake ones that run on its fake clock: tests/doubles/clock.py), so a test moves time itself.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Protocol

import numpy as np

from app.engines import Engine, TensorSpec
from app.errors import Busy, DeviceGone, DeviceHung, InvokeTimeout
from app.pool.admission import OVERLOAD_HOLD_S, Admission
from app.pool.member import Member, RunResult, timed_run
from app.pool.watchdog import Watchdog
from app.threads import lower_this_thread

log = logging.getLogger(__name__)

_STOP = object()  # one per member thread: end after the jobs queued before it
# How often a request goes back in line because the device running it left: beyond, a 503. Fixed: a request
# whose device leaves three times running meets a host losing its TPUs, and waiting longer helps nobody.
MAX_HAND_BACKS = 3


def departed_problem(devices: Sequence[str]) -> str:
    """What a member whose devices left says (readiness, /v1/devices)."""
    return f"is gone: {', '.join(devices)} not listed any more (unplugged?); out of the pool until it is back"


class Timers(Protocol):
    """Where a request's deadline checks are scheduled: an asyncio event loop (its `call_later`), or a
    test's fake timers on the pool's fake clock. Used from the event loop's thread only."""

    def call_later(self, delay: float, callback: Callable[..., object], *args: object) -> asyncio.TimerHandle: ...


class _Retire:
    """In the line for the idle lanes of one member that left: the lane of that member that takes it ends
    (closing the member's interpreter); another lane puts it back for them."""

    __slots__ = ("member",)

    def __init__(self, member: Member):
        self.member = member
Inputs = Sequence[np.ndarray]  # every input tensor of the model, in its order


class _Job:
    """One request's inputs on their way to a member, and the one future its request awaits.

    Taken by exactly one side: an interpreter thread (`claim()` before it runs it) or the
    request giving up (`claim()` at its deadline, or when it is cancelled), whichever is first.
    The future is settled from any thread through `_notify`; only the loop touches it directly."""

    __slots__ = ("inputs", "loop", "timers", "done", "pool", "member", "created_at", "queued_at", "taken_at",
                 "invoking", "finished", "timer", "handed_back", "_token")

    def __init__(self, inputs: Inputs | None, loop: asyncio.AbstractEventLoop, timers: Timers, now: float,
                 pool: EnginePool):
        self.inputs = inputs
        self.loop = loop
        self.timers = timers  # its deadline checks run here, on the loop's thread
        self.done = loop.create_future()
        self.pool = pool  # whose line it is in (a pool handing its line over passes it on), whose deadlines apply
        self.member: Member | None = None
        self.created_at = now  # its request's place in line was taken just before; the
        # wait deadline and the bound by time under overload run from here
        self.queued_at = 0.0
        self.taken_at: float | None = None  # set by the interpreter thread that takes it
        self.invoking = False  # set by that thread just before the invoke: the input is on the device
        self.finished = False  # set by that thread once the invoke has returned
        self.timer: asyncio.TimerHandle | None = None
        self.handed_back = 0  # times its device left during its invoke
        self._token = threading.Lock()

    def claim(self) -> bool:
        return self._token.acquire(blocking=False)

    def untake(self) -> None:
        """Its member's device left during its invoke: back to not taken, claimable by the next member.
        Called by the thread that claimed it; taken_at first, so the loop never sees a half-reset job."""
        self.taken_at = None
        self.invoking = False
        self.member = None
        self._token.release()

    @property
    def abandoned(self) -> bool:
        """Claimed before any interpreter took it: its request stopped waiting."""
        return self._token.locked() and self.taken_at is None


def _settle(future: asyncio.Future, result=None, error: BaseException | None = None) -> None:
    if future.done():  # the request stopped waiting (deadline, client gone)
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def _notify(job: _Job, future: asyncio.Future, result=None, error: BaseException | None = None) -> None:
    try:
        job.loop.call_soon_threadsafe(_settle, future, result, error)
    except RuntimeError:  # that event loop has ended: nobody is waiting any more
        pass


class Place:
    """A place in a pool's bounded line, taken at admission and given back when the request ends."""

    __slots__ = ("pool", "_held")

    def __init__(self, pool: EnginePool):
        self.pool = pool
        self._held = True

    async def run(self, inputs: Inputs) -> RunResult:
        return await self.pool._run(inputs)

    async def run_after(self, prepare: Callable[[], Inputs], executor: Executor) -> RunResult:
        """`prepare()` on one of `executor`'s threads, which hands the inputs straight to the
        members' queue: no hop back through the event loop between the two."""
        return await self.pool._run_after(prepare, executor)

    def release(self) -> None:
        if self._held:
            self._held = False
            self.pool._leave()


class EnginePool:
    def __init__(self, label: str, members: list[Member], max_waiting: int, wait_timeout_s: float,
                 retry_after_s: float, watchdog: Watchdog | None = None, invoke_timeout_s: float = 30.0,
                 *, max_queue_ms: float = 0.0, thread_nice: int = 0, clock: Callable[[], float] = time.monotonic,
                 timers: Callable[[], Timers] = asyncio.get_running_loop, overload_hold_s: float = OVERLOAD_HOLD_S,
                 backend: str | None = None):
        """`clock` reads the time of every deadline and invoke (seconds, monotonic); `timers()` gives, on the
        event loop a request runs on, the timers its deadline checks are scheduled on (that loop's by default;
        their delays are measured on `clock`)."""
        if not members:
            raise ValueError("a pool needs at least one member")
        self.label = label
        self.backend = backend  # its backend's key: each run says which backend ran it (RunResult.backend)
        self.max_waiting = max_waiting
        self.members = members
        self.wait_timeout_s = wait_timeout_s
        self.invoke_timeout_s = invoke_timeout_s
        self.retry_after_s = retry_after_s
        self.watchdog = watchdog
        self.thread_nice = thread_nice  # for interpreters that compute on the host's cores
        self.clock = clock
        self.timers = timers
        self.admission = Admission(label, max_waiting, max_queue_ms, retry_after_s, clock, overload_hold_s)
        self._lock = threading.Lock()
        # notified whenever a member's health changes: tests and shutdown wait on it, no polling
        self.changed = threading.Condition(self._lock)
        self._running = 0  # runs under way now
        self._successor: EnginePool | None = None  # where the line goes once every device left (hand_over)
        self._refusing: str | None = None  # every device left and nothing serves instead: why (refuse_waiting)
        self.closed = threading.Event()
        # Bounded: admission keeps it far below this; twice the line leaves room for jobs whose
        # requests gave up waiting and which no interpreter has skipped yet.
        self._jobs: queue.Queue = queue.Queue(maxsize=2 * (sum(m.lanes for m in members) + max_waiting))
        for member in members:
            self._start(member)

    def _start(self, member: Member) -> None:
        name = f"pool-{self.label}-{member.device or self.members.index(member)}"
        member.threads = [threading.Thread(target=self._serve, args=(member,), daemon=True,
                                           name=name if member.lanes == 1 else f"{name}-{lane}")
                          for lane in range(member.lanes)]
        member.live_lanes = member.lanes
        for thread in member.threads:
            thread.start()

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """The model's input tensors (every member loads the same files)."""
        return self.members[0].inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self.members[0].outputs

    @property
    def engine(self) -> Engine | None:
        """A whole model's engine, for plug-ins that analyse its graph; None for a pipeline."""
        return self.members[0].engine

    @property
    def interpreters(self) -> int:
        """Interpreters loaded: one per member, one per segment of a pipeline."""
        return sum(len(m.stages) for m in self.members)

    @property
    def load_ms(self) -> float:
        return sum(m.load_ms for m in self.members)

    @property
    def first_inference_ms(self) -> float | None:
        """The first inference this pool ran (the warm-up, or the first request after a reload)."""
        return self.members[0].first_inference_ms

    @property
    def warm(self) -> bool:
        return all(m.warm for m in self.members)

    @property
    def unhealthy(self) -> list[Member]:
        return [m for m in self.members if not m.healthy]

    @property
    def admitted(self) -> int:
        """Requests holding a place: running or waiting."""
        return self.admission.admitted

    @property
    def overloaded(self) -> bool:
        return self.admission.overloaded

    @property
    def busy(self) -> int:
        """Requests running now (a hung one included, until it returns)."""
        return self._running

    @property
    def waiting(self) -> int:
        """Inputs handed to the pool and not yet taken by an interpreter (the queue depth)."""
        return self._jobs.qsize()

    # -- admission -------------------------------------------------------------------------

    def check_room(self) -> None:
        """Refuse at once, as admit() would now, without taking a place (the check before a body)."""
        successor = self._successor
        if successor is not None:
            return successor.check_room()
        with self._lock:
            self.admission.refuse_if_full(self._healthy_or_refuse())

    def admit(self) -> Place:
        """A place in line, or an error at once: every device unhealthy, closed, or the line full. A pool
        that handed its line over gives a place in its successor's."""
        successor = self._successor
        if successor is not None:
            return successor.admit()
        with self._lock:
            self.admission.enter(self._healthy_or_refuse())
        return Place(self)

    def _healthy_or_refuse(self) -> int:
        """The healthy members' lanes; DeviceGone or DeviceHung if none, Busy if closed (under self._lock)."""
        healthy = sum(m.lanes for m in self.members if m.healthy)
        if healthy == 0:
            if all(m.departed for m in self.members):
                if self._refusing is None:  # devices left a moment ago: wait in line for what follows (hand_over)
                    return 0
                raise DeviceGone(f"{self.label}: {self._refusing}", self.retry_after_s)
            raise DeviceHung(f"{self.label}: every device is unhealthy ("
                             + "; ".join(f"{m.where} {m.problem}" for m in self.members)
                             + ")", self.retry_after_s)
        if self.closed.is_set():
            raise Busy(f"{self.label}: closed (shutting down, or replaced by a reload)", self.retry_after_s)
        return healthy

    def _leave(self) -> None:
        with self._lock:
            self.admission.leave()

    async def run(self, inputs: Inputs) -> RunResult:
        """Admit, run, leave: for callers that did not take a place beforehand."""
        place = self.admit()
        try:
            return await place.run(inputs)
        finally:
            place.release()

    # -- the request's side --------------------------------------------------------------------
    # One future per request, settled by whichever thread finishes its part last (an interpreter
    # with the output, an image thread with a decoding error), and one timer on the loop for its
    # deadlines: an interpreter thread never has to reach the loop except to answer.

    async def _run(self, inputs: Inputs) -> RunResult:
        job = _Job(inputs, asyncio.get_running_loop(), self.timers(), self.clock(), self)
        self._queue(job)
        return await self._outcome(job)

    async def _run_after(self, prepare: Callable[[], Inputs], executor: Executor) -> RunResult:
        job = _Job(None, asyncio.get_running_loop(), self.timers(), self.clock(), self)
        executor.submit(self._prepare_and_queue, job, prepare)
        return await self._outcome(job)

    def _prepare_and_queue(self, job: _Job, prepare: Callable[[], Inputs]) -> None:
        """On an image thread: the inputs, then straight into the line."""
        if job.abandoned:  # its request gave up while this thread was busy with others
            return
        late = self.admission.too_late(job.created_at, self.clock())
        if late is not None and job.claim():  # overloaded, and it waited its bound for this thread
            _notify(job, job.done, error=late)
            return
        try:
            job.inputs = prepare()
            if job.abandoned:  # gave up while its input was prepared
                return
            self._queue(job)
        except Exception as e:  # a bad image, the line full: handed to the request
            _notify(job, job.done, error=e)

    def _queue(self, job: _Job) -> None:
        job.queued_at = self.clock()
        successor = self._successor
        if successor is not None:
            return successor._adopt(job)
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise Busy(f"{self.label}: the line is full", self.retry_after_s) from None

    def _adopt(self, job: _Job) -> None:
        """A job from a pool that handed its line over: into this line, under this pool's deadlines."""
        job.pool = self
        self._hand_back(job)

    async def _outcome(self, job: _Job) -> RunResult:
        # The first check comes at the earlier deadline: a job taken at once has its invoke
        # limit from then, and one not taken is refused at the wait deadline.
        job.timer = job.timers.call_later(min(self.wait_timeout_s, self._invoke_limit_s), self._check_deadline, job)
        watched = False
        try:
            return await job.done
        except asyncio.CancelledError:
            # The request is gone: an interpreter that has not taken its input skips it. One that
            # has stays watched: a hang is the device's, whether or not anybody waits for the answer.
            watched = not job.claim() and job.pool.watchdog is not None
            raise
        finally:
            if not watched:
                job.timer.cancel()

    @property
    def _invoke_limit_s(self) -> float:
        return self.watchdog.timeout_s if self.watchdog else self.invoke_timeout_s

    def _check_deadline(self, job: _Job) -> None:
        """On the loop, at a deadline of the job: refuse it (not taken in time), fail it (its
        invoke outlived its limit), or look again at the next deadline."""
        if job.pool is not self:  # handed over: the deadlines of the pool whose line it is in now
            return job.pool._check_deadline(job)
        if job.finished or (job.done.done() and not (job.done.cancelled() and job.invoking)):
            return  # answered, or its request gone and no invoke to watch (a cancelled one is watched)
        now = self.clock()
        wait_deadline = job.created_at + self.wait_timeout_s
        member, taken_at = job.member, job.taken_at  # read once: a job handed back resets them from a thread
        if taken_at is None or member is None:
            if now < wait_deadline:
                # again at least every invoke limit: a job taken meanwhile has its deadline from then
                job.timer = job.timers.call_later(min(wait_deadline - now, self._invoke_limit_s),
                                                  self._check_deadline, job)
                return
            if job.claim():  # no interpreter took it: it never will now
                job.done.set_exception(Busy(f"{self.label}: no interpreter free within {self.wait_timeout_s} s",
                                            self.retry_after_s))
                return
            # taken just as the wait ended: its invoke is under way
            member, taken_at = job.member, job.taken_at
            if taken_at is None or member is None:  # handed back meanwhile: its wait deadline again
                job.timer = job.timers.call_later(self._invoke_limit_s / 4, self._check_deadline, job)
                return
        limit = self._invoke_limit_s
        invoke_deadline = taken_at + limit
        if now < invoke_deadline:
            job.timer = job.timers.call_later(invoke_deadline - now, self._check_deadline, job)
            return
        if self.watchdog:
            stalled = member.stalled(now, limit)
            if not stalled:  # a pipeline moving slowly, none of its segments hung: look again soon
                job.timer = job.timers.call_later(limit / 4, self._check_deadline, job)
                return
            _settle(job.done, error=self.watchdog.quarantine(self, member, stalled))
        else:
            job.done.set_exception(InvokeTimeout(f"{self.label}: the invoke did not finish within {limit} s "
                                                 "(EDGETPU_SERVE_INVOKE_TIMEOUT_S)", self.retry_after_s))

    # -- the members' side ----------------------------------------------------------------------

    def _serve(self, member: Member) -> None:
        """One lane of a member: next job, run, answer; until stopped, or out of the pool for good."""
        lower_this_thread(self.thread_nice)
        jobs = self._jobs
        while True:
            job = jobs.get()
            if job is _STOP:
                break
            if type(job) is _Retire:
                if job.member is member:
                    break
                if job.member.live_lanes > 0:  # for one of its lanes still waiting
                    self._put_back(job)
                continue
            if not member.healthy:  # taken out meanwhile (a pipeline's idle lane): the job goes to the others
                self._hand_back(job)
                if self._back_in_pool(member):
                    continue
                break
            job.member, job.taken_at = member, self.clock()
            if not job.claim():  # its request stopped waiting
                continue
            late = self.admission.too_late(job.created_at, job.taken_at)
            if late is not None:  # a 503 now, and the lane goes to the next
                _notify(job, job.done, error=late)
                continue
            job.invoking = True
            result, error = None, None
            try:
                result = _run_counted(self, member, job.inputs, (job.taken_at - job.queued_at) * 1000)
            except DeviceGone as gone:  # its device left mid-invoke: out of the pool, the request to the others
                self.leave(member, departed_problem([gone.device or member.where]), gone.device)
                self._again(job, gone)
                if self._back_in_pool(member):
                    continue
                break
            except Exception as e:  # handed to the request
                error = e
            job.finished = True
            _notify(job, job.done, result, error)
            if result is not None and not result.cold:
                self.admission.note_invoke(result.inference_ms)
            if not member.healthy and not self._back_in_pool(member):  # the watchdog took it out meanwhile
                break
        self._lane_ended(member)

    def _hand_back(self, job: _Job) -> None:
        successor = self._successor
        if successor is not None:
            return successor._adopt(job)
        try:
            self._jobs.put_nowait(job)
        except queue.Full:  # never while admission bounds the line; answered rather than lost
            if job.claim():
                _notify(job, job.done, error=Busy(f"{self.label}: the line is full", self.retry_after_s))

    def _put_back(self, item: _Retire) -> None:
        try:
            self._jobs.put_nowait(item)
        except queue.Full:  # the lane ends at its next job instead
            pass

    def _again(self, job: _Job, gone: DeviceGone) -> None:
        """A job whose device left during its invoke: back in line for another member (or the successor),
        a few times at most; the device's failed invoke gave it no answer yet."""
        if job.handed_back >= MAX_HAND_BACKS:
            job.finished = True
            _notify(job, job.done, error=DeviceGone(f"{self.label}: {gone}", self.retry_after_s))
            return
        job.handed_back += 1
        job.untake()
        self._hand_back(job)

    def _back_in_pool(self, member: Member) -> bool:
        """A lane of a member the watchdog took out: wait while it is repaired in place (True once it is
        back); end at once otherwise (an interpreter, whose replacement needs its device), or when the pool closes."""
        if not member.repaired_in_place:
            return False
        with self.changed:
            self.changed.wait_for(lambda: member.healthy or self.closed.is_set())
            return member.healthy and not self.closed.is_set()

    def _lane_ended(self, member: Member) -> None:
        """The last lane of a member to end closes it."""
        with self._lock:
            member.live_lanes -= 1
            last = member.live_lanes == 0
        if last:
            member.close()

    def _count_running(self, step: int) -> None:
        with self._lock:
            self._running += step

    # -- members joining and leaving while serving (devices plugged in and unplugged) -----------------

    def add(self, member: Member) -> bool:
        """A member on a device that joined serves from now on (loaded and warmed up beforehand); False if
        the pool closed meanwhile (the caller closes it)."""
        with self._lock:
            if self.closed.is_set():
                return False
            self.members.append(member)
            with self._jobs.mutex:  # room in the queue for the line admission now allows
                self._jobs.maxsize = 2 * (sum(m.lanes for m in self.members) + self.max_waiting)
            self._successor, self._refusing = None, None  # a device again: the line is this pool's again
            self._start(member)
            self.changed.notify_all()
        log.info("%s: %s joined the pool (%d healthy)", self.label, member.where,
                 len(self.members) - len(self.unhealthy))
        return True

    def leave(self, member: Member, problem: str, device: str | None = None) -> bool:
        """A device of this member left (unplugged): the member is out of the pool, `departed`, until
        `replace()` puts it (or a member on another device) back; the requests inside it go to the others
        (a pipeline's are failed with DeviceGone, and their lanes put them back in line). False if it was
        out already (hung, or left before)."""
        with self._lock:
            if not member.healthy:
                return False
            member.healthy, member.problem, member.departed = False, problem, True
            self.changed.notify_all()
        stages = [s for s in member.stages if device is None or s.device == device] or member.stages
        member.lose(stages, DeviceGone(f"{self.label}: {member.where} {problem}", self.retry_after_s))
        if not member.repaired_in_place:  # its idle lanes end now, releasing the device's interpreter
            for _ in range(member.live_lanes):
                self._put_back(_Retire(member))
        log.warning("%s: %s %s: out of the pool", self.label, member.where, problem)
        return True

    @property
    def handed_to(self) -> str | None:
        """The backend of the pool this one handed its line to (every device left), if it did."""
        successor = self._successor
        return None if successor is None else successor.backend or successor.label

    @property
    def departed(self) -> bool:
        """Every member is out because its device left: nothing here can serve until one is back."""
        return all(m.departed and not m.healthy for m in self.members)

    def hand_over(self, successor: EnginePool) -> int:
        """Every device left and the model is served by another backend now: this pool's line goes to
        `successor` (the same model version's pool on that backend), the requests waiting now and any
        queued from now on, under the successor's deadlines; admission here gives places there. The
        number of requests handed over. A device joining (`add`, `replace`) takes the line back."""
        with self._lock:
            if successor is self or self.closed.is_set():
                return 0
            self._successor = successor
            self.changed.notify_all()
        moved = 0
        for job in self._take_waiting():
            successor._adopt(job)
            moved += 1
        if moved:
            log.warning("%s: every device left: %d waiting request(s) handed to %s", self.label, moved,
                        successor.label)
        return moved

    def refuse_waiting(self, reason: str) -> int:
        """Every device left and none serves the model instead: the requests waiting in line are answered
        now (DeviceGone: 503 with Retry-After) rather than at their wait deadline, and so is every new one
        until a device is back (`add`, `replace`). How many were waiting."""
        with self._lock:
            self._refusing = reason
        refused = 0
        for job in self._take_waiting():
            if job.claim():
                _notify(job, job.done, error=DeviceGone(f"{self.label}: {reason}", self.retry_after_s))
                refused += 1
        return refused

    def _take_waiting(self) -> list[_Job]:
        """Empty the line of requests (the stops of a pool closing, and retirements, stay in it)."""
        jobs, kept = [], []
        while True:
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                break
            (jobs if isinstance(item, _Job) else kept).append(item)
        for item in kept:
            self._jobs.put(item)
        return jobs

    def warm_up(self) -> None:
        """Run one input through every member (blocking; before the pool serves)."""
        for member in self.members:
            self.warm_up_member(member)

    def warm_up_member(self, member: Member) -> None:
        inputs = [np.full(spec.shape, spec.zero_point, spec.dtype) for spec in member.inputs]
        if self.watchdog is None:
            timed_run(member, inputs, self.clock)
        else:
            self.watchdog.warm_up(self, member, inputs)

    # -- health: what the watchdog changes ----------------------------------------------------

    def take_out(self, member: Member, problem: str) -> bool:
        """Mark a healthy member unhealthy (out of the pool); False if it was already."""
        with self._lock:
            if not member.healthy:
                return False
            member.healthy, member.problem = False, problem
            self.changed.notify_all()
            return True

    def note_problem(self, member: Member, problem: str) -> None:
        with self._lock:
            member.problem = problem
            self.changed.notify_all()

    def replace(self, old: Member, fresh: Member) -> bool:
        """Put a re-created member in for `old` (a new one, or `old` repaired in place: its lanes go on)
        and serve on it; False if the pool closed."""
        with self._lock:
            if self.closed.is_set():
                return False
            if fresh is not old:
                self.members[self.members.index(old)] = fresh
                self._start(fresh)
            fresh.healthy, fresh.problem, fresh.departed = True, None, False
            self._successor, self._refusing = None, None  # a device again: the line is this pool's again
            self.changed.notify_all()
            return True

    def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Block until predicate() holds after a health change (or now), at most timeout_s."""
        with self.changed:
            return self.changed.wait_for(predicate, timeout_s)

    # -- the end -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop taking work: each member's last lane closes it after the jobs queued before now. A hung
        interpreter closes if its invoke ever returns; the lanes of a member out for repair end now."""
        with self._lock:
            if self.closed.is_set():
                return
            self.closed.set()
            lanes = sum(len(m.threads) for m in self.members if m.healthy or m.repaired_in_place)
            self.changed.notify_all()
        for _ in range(lanes):
            self._jobs.put(_STOP)

    def join(self, timeout_s: float) -> bool:
        """Wait (bounded) until the healthy members are closed; False if some are not yet."""
        deadline = time.monotonic() + timeout_s
        for member in list(self.members):
            if member.healthy:
                for thread in member.threads:
                    thread.join(max(0.0, deadline - time.monotonic()))
        return not any(m.healthy and any(t.is_alive() for t in m.threads) for m in self.members)


def _run_counted(pool: EnginePool, member: Member, inputs: Inputs, queue_ms: float) -> RunResult:
    """timed_run, counted busy while it runs (and no longer before its request hears of the result)."""
    pool._count_running(1)
    try:
        return timed_run(member, inputs, pool.clock, queue_ms, pool.backend)
    finally:
        pool._count_running(-1)
