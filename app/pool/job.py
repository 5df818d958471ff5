"""What stands in a pool's line for its lanes to take: a request's `Job`, with the one future its request awaits; a
`Retire` for the idle lanes of a member that left; `STOP` for a lane of a pool that closes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from app.pool.member import Member

Inputs = Sequence[np.ndarray]  # every input tensor of the model, in its order
STOP = object()  # one per lane: end after the jobs queued before it
# How often a request goes back in line because the device running it left: beyond, a 503. Fixed: a request
# whose device leaves three times running meets a host losing its TPUs, and waiting longer helps nobody.
MAX_HAND_BACKS = 3


class Timers(Protocol):
    """Where a request's deadline checks are scheduled: an asyncio event loop (its `call_later`), or a test's fake
    timers on the pool's fake clock. Used from the event loop's thread only."""

    def call_later(self, delay: float, callback: Callable[..., object], *args: object) -> asyncio.TimerHandle: ...


class Keeper(Protocol):
    """Who keeps a job's deadlines: those of the pool whose line it is in (app/pool/deadlines.py `Deadlines`)."""

    watchdog: object | None  # set: an invoke is watched even after its request left

    def check(self, job: Job) -> None: ...


class Retire:
    """In the line for the idle lanes of one member that left: the lane of that member that takes it ends (closing
    the member's interpreter); another lane puts it back for them."""

    __slots__ = ("member",)

    def __init__(self, member: Member):
        self.member = member


class Job:
    """One request's inputs on their way to a member, and the one future its request awaits.

    Taken by exactly one side: a lane (`claim()` before it runs it) or the request giving up (`claim()` at its
    deadline, or when it is cancelled), whichever is first. The future is settled from any thread through
    `answer()`; only the loop touches it directly."""

    __slots__ = ("inputs", "loop", "timers", "done", "keeper", "member", "created_at", "queued_at", "taken_at",
                 "invoking", "finished", "timer", "handed_back", "_token")

    def __init__(self, inputs: Inputs, loop: asyncio.AbstractEventLoop, timers: Timers, created_at: float):
        self.inputs = inputs
        self.loop = loop
        self.timers = timers  # its deadline checks run here, on the loop's thread
        self.done = loop.create_future()
        self.keeper: Keeper | None = None  # the deadlines of the line it is in (a line handed over passes it on)
        self.member: Member | None = None
        self.created_at = created_at  # when its request took its place in line: the wait deadline and the bound
        # by time under overload run from here
        self.queued_at = 0.0
        self.taken_at: float | None = None  # set by the lane that takes it
        self.invoking = False  # set by that lane just before the invoke: the input is on the device
        self.finished = False  # set by that lane once the invoke has returned
        self.timer: asyncio.TimerHandle | None = None
        self.handed_back = 0  # times its device left during its invoke
        self._token = threading.Lock()

    def claim(self) -> bool:
        return self._token.acquire(blocking=False)

    def again(self, gone: BaseException) -> bool:
        """Its member's device left during its invoke: back to not taken, claimable by the next member (True), or,
        past MAX_HAND_BACKS, answered with `gone` (False). Called by the lane that claimed it; taken_at first, so the
        loop never sees a half-reset job."""
        if self.handed_back >= MAX_HAND_BACKS:
            self.finished = True
            self.answer(error=gone)
            return False
        self.handed_back += 1
        self.taken_at = None
        self.invoking = False
        self.member = None
        self._token.release()
        return True

    def answer(self, result: object = None, error: BaseException | None = None) -> None:
        """From any thread: the request's future settled on its loop, with `result` or `error`."""
        try:
            self.loop.call_soon_threadsafe(settle, self.done, result, error)
        except RuntimeError:  # that event loop has ended: nobody is waiting any more
            pass


def settle(future: asyncio.Future, result: object = None, error: BaseException | None = None) -> None:
    """On the loop: the future's outcome, unless its request stopped waiting (deadline, client gone)."""
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
