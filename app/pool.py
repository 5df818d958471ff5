"""A pool of interpreters for one (model, backend): one request per interpreter at a time.

Interpreters are not thread-safe, so each request borrows one. Requests that find none
free wait in a bounded line: past `max_waiting` waiters, or after `wait_timeout_s`, the
request is refused with Busy (503 + Retry-After) instead of queueing without limit.
Invokes run on the pool's own threads (one per interpreter), off the event loop.

With a watchdog, an invoke that outlives `timeout_s` (a USB Accelerator that hangs until it
resets) fails its request, takes that interpreter out of the pool (unhealthy), and a
background thread re-creates it (a new interpreter and delegate for the same device)
until that succeeds. The hung invoke cannot be killed: its thread is a daemon, so it
never holds up the process's exit, and its interpreter is closed if it ever returns.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field

import numpy as np

from app.engines import Engine, EngineOptions
from app.errors import Busy, DeviceHung

log = logging.getLogger(__name__)


class _DaemonThread(Executor):
    """One daemon thread running one interpreter's invokes in order.

    Not a ThreadPoolExecutor: its threads are joined at interpreter exit, and an invoke
    stuck in a hung device would then keep the process from ever exiting.
    """

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._work, name=name, daemon=True).start()

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        self._jobs.put((future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        done = threading.Event()
        self._jobs.put((None, done.set, (), {}))
        if wait:
            done.wait()

    def _work(self) -> None:
        while True:
            future, fn, args, kwargs = self._jobs.get()
            if future is None:
                fn()
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as e:  # handed to whoever awaits the future
                future.set_exception(e)


@dataclass
class Member:
    engine: Engine
    load_ms: float
    first_inference_ms: float | None = None
    device: str | None = None      # the TPU this interpreter is bound to, for health reports
    healthy: bool = True
    problem: str | None = None     # why it is unhealthy
    retired: bool = False          # replaced after a hang: close its engine once its invoke returns
    options: EngineOptions | None = None  # how it was loaded, so the watchdog can load it again
    thread: Executor | None = field(default=None, repr=False, compare=False)

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


class EnginePool:
    def __init__(self, label: str, members: list[Member], max_waiting: int, wait_timeout_s: float,
                 retry_after_s: float, watchdog: Watchdog | None = None):
        if not members:
            raise ValueError("a pool needs at least one engine")
        self.label = label
        self.members = members
        self.max_waiting = max_waiting
        self.wait_timeout_s = wait_timeout_s
        self.retry_after_s = retry_after_s
        self.watchdog = watchdog
        self._idle: asyncio.Queue[Member] = asyncio.Queue()
        for member in members:
            self._start(member)
            self._idle.put_nowait(member)
        self._waiting = 0
        self._closed = threading.Event()

    def _start(self, member: Member) -> None:
        if member.thread is None:
            member.thread = _DaemonThread(f"pool-{self.label}-{member.device or len(self.members)}")

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

    def warm_up(self) -> None:
        """Run one input through every interpreter (blocking; before the pool serves)."""
        for member in self.members:
            self._warm_up(member)

    def _warm_up(self, member: Member) -> None:
        x = np.full(self.engine.input.shape, self.engine.input.zero_point, self.engine.input.dtype)
        work = member.thread.submit(_timed_run, member, x)
        try:
            work.result(timeout=self.watchdog.timeout_s if self.watchdog else None)
        except TimeoutError:
            member.healthy, member.problem = False, self._hang_text
            raise DeviceHung(f"{self.label}: warm-up on {member.device or 'its device'}: "
                             f"{member.problem}", self.retry_after_s) from None

    async def run(self, x: np.ndarray) -> RunResult:
        member = await self._acquire()
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(member.thread, _timed_run, member, x)
        # Back to the pool when the invoke has ended, not when the caller stops waiting:
        # a cancelled request must not hand a still-running interpreter to the next one.
        work.add_done_callback(lambda _: self._release(member))
        timeout = self.watchdog.timeout_s if self.watchdog else None
        try:
            return await asyncio.wait_for(asyncio.shield(work), timeout)
        except TimeoutError:
            self._quarantine(member, loop)
            raise DeviceHung(f"{self.label}: {member.device or 'the device'} {self._hang_text}; it is out of "
                             "the pool while it is re-created", self.retry_after_s) from None

    def _release(self, member: Member) -> None:
        if member.healthy and not member.retired:
            self._idle.put_nowait(member)

    @property
    def _hang_text(self) -> str:
        return f"did not finish an invoke within {self.watchdog.timeout_s} s (watchdog)"

    def _quarantine(self, member: Member, loop: asyncio.AbstractEventLoop) -> None:
        member.healthy, member.problem = False, self._hang_text
        log.error("%s: %s %s: unhealthy, re-creating it", self.label, member.device or "interpreter", member.problem)
        threading.Thread(target=self._recover, args=(member, loop), name=f"recover-{self.label}",
                         daemon=True).start()

    def _recover(self, old: Member, loop: asyncio.AbstractEventLoop) -> None:
        """Re-create a hung member until it loads and warms up, then swap it in (blocking)."""
        attempt = 0
        while not self._closed.is_set():
            attempt += 1
            try:
                fresh = self.watchdog.recreate(old)
                self._start(fresh)
                self._warm_up(fresh)
            except Exception as e:  # any failure: the device may still be resetting
                old.problem = (f"{self._hang_text}; re-creating it failed (attempt {attempt}: {e}); "
                               f"retrying in {self.watchdog.retry_s} s")
                log.warning("%s: %s %s", self.label, old.device or "interpreter", old.problem)
                self._closed.wait(self.watchdog.retry_s)
                continue
            log.info("%s: %s re-created after a hang (attempt %d)", self.label, fresh.device or "interpreter", attempt)
            try:
                loop.call_soon_threadsafe(self._swap, old, fresh)
            except RuntimeError:  # that event loop has ended: no request can race the swap
                self._swap(old, fresh)
            return

    def _swap(self, old: Member, fresh: Member) -> None:
        self.members[self.members.index(old)] = fresh
        _retire(old)
        self._idle.put_nowait(fresh)

    async def _acquire(self) -> Member:
        try:
            return self._idle.get_nowait()
        except asyncio.QueueEmpty:
            pass
        if len(self.unhealthy) == len(self.members):
            raise DeviceHung(f"{self.label}: every device is unhealthy ("
                             + "; ".join(f"{m.device or 'interpreter'} {m.problem}" for m in self.members)
                             + ")", self.retry_after_s)
        if self._waiting >= self.max_waiting:
            raise Busy(f"{self.label}: all {len(self.members)} interpreters busy and "
                       f"{self._waiting} requests already waiting", self.retry_after_s)
        self._waiting += 1
        try:
            return await asyncio.wait_for(self._idle.get(), self.wait_timeout_s)
        except TimeoutError:
            raise Busy(f"{self.label}: no interpreter free within {self.wait_timeout_s} s",
                       self.retry_after_s) from None
        finally:
            self._waiting -= 1

    def close(self) -> None:
        """Stop taking work; engines are closed once the invokes already running finish."""
        self._closed.set()

        def drain_then_close():
            for member in list(self.members):
                if member.healthy:
                    member.thread.shutdown(wait=True)
                    member.engine.close()
                else:
                    _retire(member)

        threading.Thread(target=drain_then_close, name=f"close-{self.label}", daemon=True).start()


def _retire(member: Member) -> None:
    """Close a hung member's engine on its own thread: after its invoke, if that ever returns."""
    member.retired = True
    member.thread.submit(member.engine.close)
    member.thread.shutdown(wait=False)


def _timed_run(member: Member, x: np.ndarray) -> RunResult:
    cold = not member.warm
    start = time.perf_counter()
    output = member.engine.run(x)
    elapsed = (time.perf_counter() - start) * 1000
    if cold:
        member.first_inference_ms = elapsed
    return RunResult(output, elapsed, cold)
