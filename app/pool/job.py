"""What stands in a pool's line (app/pool/line.py) for its lanes to take (app/pool/lanes.py): a request's
`Job`, with the one future its request awaits; a `Retire` for the idle lanes of a member that left; `STOP`
for a lane of a pool that closes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from app.pool.line import Line, Timers
    from app.pool.member import Member

Inputs = Sequence[np.ndarray]  # every input tensor of the model, in its order
STOP = object()  # one per lane: end after the jobs queued before it


class Retire:
    """In the line for the idle lanes of one member that left: the lane of that member that takes it ends
    (closing the member's interpreter); another lane puts it back for them."""

    __slots__ = ("member",)

    def __init__(self, member: Member):
        self.member = member


class Job:
    """One request's inputs on their way to a member, and the one future its request awaits.

    Taken by exactly one side: a lane (`claim()` before it runs it) or the request giving up (`claim()` at
    its deadline, or when it is cancelled), whichever is first. The future is settled from any thread
    through `answer()`; only the loop touches it directly."""

    __slots__ = ("inputs", "extra", "loop", "timers", "done", "line", "member", "created_at", "queued_at",
                 "taken_at", "invoking", "finished", "timer", "handed_back", "_token")

    def __init__(self, inputs: Inputs | None, loop: asyncio.AbstractEventLoop, timers: Timers, now: float,
                 line: Line):
        self.inputs = inputs
        self.extra: Any = None  # what the thread that prepared the inputs gives back beside them (Line.run_after)
        self.loop = loop
        self.timers = timers  # its deadline checks run here, on the loop's thread
        self.done = loop.create_future()
        self.line = line  # the line it is in (a line handed over passes it on), whose deadlines apply
        self.member: Member | None = None
        self.created_at = now  # its request's place in line was taken just before; the
        # wait deadline and the bound by time under overload run from here
        self.queued_at = 0.0
        self.taken_at: float | None = None  # set by the lane that takes it
        self.invoking = False  # set by that lane just before the invoke: the input is on the device
        self.finished = False  # set by that lane once the invoke has returned
        self.timer: asyncio.TimerHandle | None = None
        self.handed_back = 0  # times its device left during its invoke
        self._token = threading.Lock()

    def claim(self) -> bool:
        return self._token.acquire(blocking=False)

    def untake(self) -> None:
        """Its member's device left during its invoke: back to not taken, claimable by the next member.
        Called by the lane that claimed it; taken_at first, so the loop never sees a half-reset job."""
        self.taken_at = None
        self.invoking = False
        self.member = None
        self._token.release()

    @property
    def abandoned(self) -> bool:
        """Claimed before any lane took it: its request stopped waiting."""
        return self._token.locked() and self.taken_at is None

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
