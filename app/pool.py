"""A pool of interpreters for one (model, backend): one request per interpreter at a time.

Admission in two steps: before a request's body is read, `check_room()` refuses it at once
(Busy: 503 + Retry-After) when the line is full, without taking anything; once its input has
arrived, it takes a place (`admit()`) before any work on it. A place is held by requests
running or waiting for an interpreter, at most `max_waiting` beyond the healthy ones, so a
client sending its body slowly holds no place (it is bounded by the body deadline instead).

Hand-off: each interpreter has its own thread, which takes the next job straight from the
pool's thread-safe queue and completes the request's future through the event loop
(`call_soon_threadsafe`), so a device never waits for the loop between requests. Every wait
of a request has a deadline: `wait_timeout_s` to be taken by an interpreter (then Busy),
and for the invoke itself the watchdog's timeout (then DeviceHung) or `invoke_timeout_s`
(then InvokeTimeout, 504).

With a watchdog, an invoke that outlives its timeout (a USB Accelerator that hangs until
it resets) fails its request, takes that interpreter out of the pool (unhealthy; also when
its client has given up meanwhile, as clients with shorter timeouts do), and a
background thread re-creates it (a new interpreter and delegate for the same device) until
that succeeds. The hung invoke cannot be killed: its thread is a daemon, so it never holds
up the process's exit; it closes its interpreter and ends if the invoke ever returns.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from app.engines import Engine, EngineOptions
from app.errors import Busy, DeviceHung, InvokeTimeout
from app.threads import lower_this_thread

log = logging.getLogger(__name__)

_STOP = object()  # one per interpreter thread: end after the jobs queued before it
# A pool is overloaded from a refusal for want of room until it has refused nobody for this long;
# while it is, the line is bounded by time (max_queue_ms) as well as by count: a request is refused
# on arrival if the line ahead would take longer than that, and when taken if it waited longer.
OVERLOAD_HOLD_S = 2.0


@dataclass
class Member:
    engine: Engine
    load_ms: float
    first_inference_ms: float | None = None
    device: str | None = None      # the TPU this interpreter is bound to, for health reports
    healthy: bool = True
    problem: str | None = None     # why it is unhealthy
    options: EngineOptions | None = None  # how it was loaded, so the watchdog can load it again
    thread: threading.Thread | None = field(default=None, repr=False, compare=False)

    @property
    def warm(self) -> bool:
        return self.first_inference_ms is not None


@dataclass(frozen=True)
class Watchdog:
    timeout_s: float
    # builds a loaded replacement for a member (same device, new interpreter and delegate)
    recreate: Callable[[Member], Member]
    retry_s: float


@dataclass(frozen=True)
class RunResult:
    output: np.ndarray
    inference_ms: float
    cold: bool
    queue_ms: float = 0.0  # from the request's queueing to an interpreter taking it
    segments_ms: list[float] | None = None  # a pipelined model: each segment's invoke (app/pipeline.py)


class _Job:
    """One input on its way to an interpreter, and the one future its request awaits.

    Taken by exactly one side: an interpreter thread (`claim()` before it runs it) or the
    request giving up (`claim()` at its deadline, or when it is cancelled), whichever is first.
    The future is settled from any thread through `_notify`; only the loop touches it directly."""

    __slots__ = ("x", "loop", "done", "member", "created_at", "queued_at", "taken_at", "invoking", "finished", "timer",
                 "_token")

    def __init__(self, x: np.ndarray | None, loop: asyncio.AbstractEventLoop):
        self.x = x
        self.loop = loop
        self.done = loop.create_future()
        self.member: Member | None = None
        self.created_at = time.monotonic()  # its request's place in line was taken just before; the
        # wait deadline and the bound by time under overload run from here
        self.queued_at = 0.0
        self.taken_at = 0.0   # set by the interpreter thread that takes it
        self.invoking = False  # set by that thread just before the invoke: the input is on the device
        self.finished = False  # set by that thread once the invoke has returned
        self.timer: asyncio.TimerHandle | None = None
        self._token = threading.Lock()

    def claim(self) -> bool:
        return self._token.acquire(blocking=False)

    @property
    def abandoned(self) -> bool:
        """Claimed before any interpreter took it: its request stopped waiting."""
        return self._token.locked() and self.taken_at == 0.0


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

    async def run(self, x: np.ndarray) -> RunResult:
        return await self.pool._run(x)

    async def run_after(self, prepare: Callable[[], np.ndarray], executor: Executor) -> RunResult:
        """`prepare()` on one of `executor`'s threads, which hands the input straight to the
        interpreters' queue: no hop back through the event loop between the two."""
        return await self.pool._run_after(prepare, executor)

    def release(self) -> None:
        if self._held:
            self._held = False
            self.pool._leave()


class EnginePool:
    def __init__(self, label: str, members: list[Member], max_waiting: int, wait_timeout_s: float,
                 retry_after_s: float, watchdog: Watchdog | None = None, invoke_timeout_s: float = 30.0,
                 *, max_queue_ms: float = 0.0, thread_nice: int = 0):
        if not members:
            raise ValueError("a pool needs at least one engine")
        self.label = label
        self.members = members
        self.max_waiting = max_waiting
        self.wait_timeout_s = wait_timeout_s
        self.invoke_timeout_s = invoke_timeout_s
        self.retry_after_s = retry_after_s
        self.watchdog = watchdog
        self.max_queue_ms = max_queue_ms
        self.thread_nice = thread_nice  # for interpreters that compute on the host's cores
        self._invoke_ms: float | None = None  # recent invoke time (moving average), for admission by time
        self._overloaded_until = 0.0  # monotonic time; see OVERLOAD_HOLD_S
        self._lock = threading.Lock()
        # notified whenever a member's health changes: tests and shutdown wait on it, no polling
        self.changed = threading.Condition(self._lock)
        self._admitted = 0
        self._running = 0  # invokes under way now
        self._closed = threading.Event()
        # Bounded: admission keeps it far below this; twice the line leaves room for jobs whose
        # requests gave up waiting and which no interpreter has skipped yet.
        self._jobs: queue.Queue = queue.Queue(maxsize=2 * (len(members) + max_waiting))
        for member in members:
            self._start(member)

    def _start(self, member: Member) -> None:
        member.thread = threading.Thread(target=self._serve, args=(member,), daemon=True,
                                         name=f"pool-{self.label}-{member.device or self.members.index(member)}")
        member.thread.start()

    @property
    def engine(self) -> Engine:
        """A representative engine, for its tensor specs (all members load the same file)."""
        return self.members[0].engine

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
        return self._admitted

    @property
    def busy(self) -> int:
        """Interpreters running an invoke now (a hung one included, until it returns)."""
        return self._running

    @property
    def waiting(self) -> int:
        """Inputs handed to the pool and not yet taken by an interpreter (the queue depth)."""
        return self._jobs.qsize()

    # -- admission -------------------------------------------------------------------------

    def check_room(self) -> None:
        """Refuse at once, as admit() would now, without taking a place (the check before a body)."""
        with self._lock:
            self._refuse_if_full()

    def admit(self) -> Place:
        """A place in line, or an error at once: every device unhealthy, or the line full."""
        with self._lock:
            self._refuse_if_full()
            self._admitted += 1
        return Place(self)

    def _refuse_if_full(self) -> None:
        """Busy or DeviceHung if no place can be had now (called under self._lock)."""
        healthy = sum(m.healthy for m in self.members)
        if healthy == 0:
            raise DeviceHung(f"{self.label}: every device is unhealthy ("
                             + "; ".join(f"{m.device or 'interpreter'} {m.problem}" for m in self.members)
                             + ")", self.retry_after_s)
        if self._closed.is_set():
            raise Busy(f"{self.label}: closed (shutting down, or replaced by a reload)", self.retry_after_s)
        now = time.monotonic()
        if self._admitted >= healthy + self.max_waiting:
            self._overloaded_until = now + OVERLOAD_HOLD_S
            raise Busy(f"{self.label}: all {healthy} interpreters busy and {self._admitted - healthy} requests "
                       "already waiting", self.retry_after_s)
        if (self.max_queue_ms and now < self._overloaded_until and self._invoke_ms is not None
                and self._admitted >= healthy):
            # Overloaded: more arrive than the interpreters serve, so a deeper line only adds latency.
            # The new request waits for everyone ahead of it to be taken, `healthy` at a time.
            clears_ms = (self._admitted - healthy + 1) * self._invoke_ms / healthy
            if clears_ms > self._queue_bound_ms:
                self._overloaded_until = now + OVERLOAD_HOLD_S
                raise Busy(f"{self.label}: overloaded, all {healthy} interpreters busy and the line ahead would "
                           f"take ~{clears_ms:.0f} ms to clear (EDGETPU_SERVE_MAX_QUEUE_MS {self.max_queue_ms:g})",
                           self.retry_after_s)

    def _too_late(self, job: _Job, now: float) -> Busy | None:
        """Overloaded, and this request has waited longer than the bound since it was admitted (for an
        image thread or an interpreter): it joined a deep line before the bound by time applied, and
        is refused rather than served late (CoDel's idea), so none waits past the bound."""
        if not self.max_queue_ms:
            return None
        waited_ms = (now - job.created_at) * 1000
        if waited_ms <= self._queue_bound_ms or not self.overloaded:
            return None
        return Busy(f"{self.label}: overloaded, every interpreter busy: this request waited {waited_ms:.0f} ms in line "
                    f"(EDGETPU_SERVE_MAX_QUEUE_MS {self.max_queue_ms:g})", self.retry_after_s)

    @property
    def _queue_bound_ms(self) -> float:
        """MAX_QUEUE_MS, but never less than one invoke: an interpreter that finishes always finds the
        next input ready (a model slower than the bound would otherwise idle while each is decoded)."""
        return max(self.max_queue_ms, self._invoke_ms or 0.0)

    @property
    def overloaded(self) -> bool:
        """Refused a request for want of room within the last OVERLOAD_HOLD_S."""
        return time.monotonic() < self._overloaded_until

    def _leave(self) -> None:
        with self._lock:
            self._admitted -= 1

    async def run(self, x: np.ndarray) -> RunResult:
        """Admit, run, leave: for callers that did not take a place beforehand."""
        place = self.admit()
        try:
            return await place.run(x)
        finally:
            place.release()

    # -- the request's side --------------------------------------------------------------------
    # One future per request, settled by whichever thread finishes its part last (an interpreter
    # with the output, an image thread with a decoding error), and one timer on the loop for its
    # deadlines: an interpreter thread never has to reach the loop except to answer.

    async def _run(self, x: np.ndarray) -> RunResult:
        job = _Job(x, asyncio.get_running_loop())
        self._queue(job)
        return await self._outcome(job)

    async def _run_after(self, prepare: Callable[[], np.ndarray], executor: Executor) -> RunResult:
        job = _Job(None, asyncio.get_running_loop())
        executor.submit(self._prepare_and_queue, job, prepare)
        return await self._outcome(job)

    def _prepare_and_queue(self, job: _Job, prepare: Callable[[], np.ndarray]) -> None:
        """On an image thread: the input, then straight into the line."""
        if job.abandoned:  # its request gave up while this thread was busy with others
            return
        late = self._too_late(job, time.monotonic())
        if late is not None and job.claim():  # overloaded, and it waited its bound for this thread
            _notify(job, job.done, error=late)
            return
        try:
            job.x = prepare()
            if job.abandoned:  # gave up while its input was prepared
                return
            self._queue(job)
        except Exception as e:  # a bad image, the line full: handed to the request
            _notify(job, job.done, error=e)

    def _queue(self, job: _Job) -> None:
        job.queued_at = time.monotonic()
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise Busy(f"{self.label}: the line is full", self.retry_after_s) from None

    async def _outcome(self, job: _Job) -> RunResult:
        # The first check comes at the earlier deadline: a job taken at once has its invoke
        # limit from then, and one not taken is refused at the wait deadline.
        job.timer = job.loop.call_at(job.loop.time() + min(self.wait_timeout_s, self._invoke_limit_s),
                                     self._check_deadline, job)
        watched = False
        try:
            return await job.done
        except asyncio.CancelledError:
            # The request is gone: an interpreter that has not taken its input skips it. One that
            # has stays watched: a hang is the device's, whether or not anybody waits for the answer.
            watched = not job.claim() and self.watchdog is not None
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
        if job.finished or (job.done.done() and not (job.done.cancelled() and job.invoking)):
            return  # answered, or its request gone and no invoke to watch (a cancelled one is watched)
        now = time.monotonic()
        wait_deadline = job.created_at + self.wait_timeout_s
        if job.taken_at == 0.0:
            if now < wait_deadline:
                # again at least every invoke limit: a job taken meanwhile has its deadline from then
                job.timer = job.loop.call_at(job.loop.time() + min(wait_deadline - now, self._invoke_limit_s),
                                             self._check_deadline, job)
                return
            if job.claim():  # no interpreter took it: it never will now
                job.done.set_exception(Busy(f"{self.label}: no interpreter free within {self.wait_timeout_s} s",
                                            self.retry_after_s))
                return
            # taken just as the wait ended: its invoke is under way
        limit = self._invoke_limit_s
        invoke_deadline = job.taken_at + limit
        if now < invoke_deadline:
            job.timer = job.loop.call_at(job.loop.time() + invoke_deadline - now, self._check_deadline, job)
            return
        if self.watchdog:
            self._quarantine(job.member)
            _settle(job.done, error=DeviceHung(
                f"{self.label}: {job.member.device or 'the device'} {self._hang_text}; it is out of the pool "
                "while it is re-created", self.retry_after_s))
        else:
            job.done.set_exception(InvokeTimeout(f"{self.label}: the invoke did not finish within {limit} s "
                                                 "(EDGETPU_SERVE_INVOKE_TIMEOUT_S)", self.retry_after_s))

    # -- the interpreter's side ----------------------------------------------------------------

    def _serve(self, member: Member) -> None:
        """An interpreter's thread: next job, invoke, answer; until stopped or taken out."""
        lower_this_thread(self.thread_nice)
        jobs = self._jobs
        while True:
            job = jobs.get()
            if job is _STOP:
                break
            job.member, job.taken_at = member, time.monotonic()
            if not job.claim():  # its request stopped waiting
                continue
            late = self._too_late(job, job.taken_at)
            if late is not None:  # a 503 now, and the interpreter goes to the next
                _notify(job, job.done, error=late)
                continue
            job.invoking = True
            result, error = None, None
            try:
                result = _run_counted(self, member, job.x, (job.taken_at - job.queued_at) * 1000)
            except Exception as e:  # handed to the request
                error = e
            job.finished = True
            _notify(job, job.done, result, error)
            if result is not None and not result.cold:
                self._note_invoke(result.inference_ms)
            if not member.healthy:  # the watchdog took it out while this invoke hung
                break
        member.engine.close()

    def _note_invoke(self, ms: float) -> None:
        # a moving average over the last ~10 invokes; a lost update between threads only delays it
        self._invoke_ms = ms if self._invoke_ms is None else self._invoke_ms + 0.2 * (ms - self._invoke_ms)

    def _count_running(self, step: int) -> None:
        with self._lock:
            self._running += step

    def warm_up(self) -> None:
        """Run one input through every interpreter (blocking; before the pool serves)."""
        for member in self.members:
            self._warm_up(member)

    def _warm_up(self, member: Member) -> None:
        x = np.full(self.engine.input.shape, self.engine.input.zero_point, self.engine.input.dtype)
        if self.watchdog is None:
            _timed_run(member, x)
            return
        finished, failure = threading.Event(), []

        def run():
            try:
                _timed_run(member, x)
            except Exception as e:
                failure.append(e)
            finished.set()

        threading.Thread(target=run, name=f"warm-up-{self.label}", daemon=True).start()
        if not finished.wait(self.watchdog.timeout_s):
            member.healthy, member.problem = False, self._hang_text
            raise DeviceHung(f"{self.label}: warm-up on {member.device or 'its device'}: "
                             f"{member.problem}", self.retry_after_s)
        if failure:
            raise failure[0]

    # -- the watchdog ------------------------------------------------------------------------------

    @property
    def _hang_text(self) -> str:
        return f"did not finish an invoke within {self.watchdog.timeout_s} s (watchdog)"

    def _quarantine(self, member: Member) -> None:
        with self._lock:
            if not member.healthy:
                return
            member.healthy, member.problem = False, self._hang_text
            self.changed.notify_all()
        log.error("%s: %s %s: unhealthy, re-creating it", self.label, member.device or "interpreter", member.problem)
        threading.Thread(target=self._recover, args=(member,), name=f"recover-{self.label}", daemon=True).start()

    def _recover(self, old: Member) -> None:
        """Re-create a hung member until it loads and warms up, then swap it in (blocking)."""
        attempt = 0
        while not self._closed.is_set():
            attempt += 1
            try:
                fresh = self.watchdog.recreate(old)
                self._warm_up(fresh)
            except Exception as e:  # any failure: the device may still be resetting
                with self._lock:
                    old.problem = (f"{self._hang_text}; re-creating it failed (attempt {attempt}: {e}); "
                                   f"retrying in {self.watchdog.retry_s} s")
                    self.changed.notify_all()
                log.warning("%s: %s %s", self.label, old.device or "interpreter", old.problem)
                self._closed.wait(self.watchdog.retry_s)
                continue
            with self._lock:
                if self._closed.is_set():
                    fresh.engine.close()
                    return
                self.members[self.members.index(old)] = fresh
                self._start(fresh)
                self.changed.notify_all()
            log.info("%s: %s re-created after a hang (attempt %d)", self.label, fresh.device or "interpreter", attempt)
            return

    def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Block until predicate() holds after a health change (or now), at most timeout_s."""
        with self.changed:
            return self.changed.wait_for(predicate, timeout_s)

    # -- the end -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop taking work: each healthy interpreter's thread closes it after the jobs queued
        before now. A hung one closes its interpreter if its invoke ever returns."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            healthy = [m for m in self.members if m.healthy]
            self.changed.notify_all()
        for _ in healthy:
            self._jobs.put(_STOP)

    def join(self, timeout_s: float) -> bool:
        """Wait (bounded) until the healthy interpreters are closed; False if some are not yet."""
        deadline = time.monotonic() + timeout_s
        for member in list(self.members):
            if member.healthy and member.thread is not None:
                member.thread.join(max(0.0, deadline - time.monotonic()))
        return not any(m.healthy and m.thread is not None and m.thread.is_alive() for m in self.members)


def _run_counted(pool: EnginePool, member: Member, x: np.ndarray, queue_ms: float) -> RunResult:
    """_timed_run, counted busy while it runs (and no longer before its request hears of the result)."""
    pool._count_running(1)
    try:
        return _timed_run(member, x, queue_ms)
    finally:
        pool._count_running(-1)


def _timed_run(member: Member, x: np.ndarray, queue_ms: float = 0.0) -> RunResult:
    cold = not member.warm
    start = time.perf_counter()
    output = member.engine.run(x)
    elapsed = (time.perf_counter() - start) * 1000
    if cold:
        member.first_inference_ms = elapsed
    return RunResult(output, elapsed, cold, queue_ms, getattr(member.engine, "last_segments_ms", None))
