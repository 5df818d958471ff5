"""A pool for one (model, backend), in three parts:

  - the line (app/pool/line.py): admission (`check_room()`, then `admit()` for a `Place`), the bounded
    queue, and each request's deadlines on the injected clock and timers;
  - the lanes (app/pool/lanes.py): a thread per lane of each member (one for a whole model's interpreter,
    2K for a pipeline of K segments), taking jobs, running them on the member, answering the request's future;
  - the membership (app/pool/membership.py): the members, their health (what the watchdog changes), and
    members joining and leaving (`add`, `leave`, `replace`), the line handed to another pool (`hand_over`)
    or refused (`refuse_waiting`) once every device left.

`EnginePool` composes them for the registry and the front doors, and describes the model its members load
(every member loads the same files).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from app.engines import Engine, TensorSpec
from app.pool.admission import OVERLOAD_HOLD_S, Admission
from app.pool.job import Inputs
from app.pool.lanes import Lanes
from app.pool.line import Line, Place, Timers
from app.pool.member import Member, RunResult
from app.pool.membership import Membership
from app.pool.watchdog import Watchdog


class EnginePool:
    """The line, the lanes and the membership of one (model, backend), composed."""

    def __init__(self, label: str, members: list[Member], max_waiting: int, wait_timeout_s: float,
                 retry_after_s: float, watchdog: Watchdog | None = None, invoke_timeout_s: float = 30.0,
                 *, max_queue_ms: float = 0.0, thread_nice: int = 0, clock: Callable[[], float] = time.monotonic,
                 timers: Callable[[], Timers] = asyncio.get_running_loop, overload_hold_s: float = OVERLOAD_HOLD_S,
                 backend: str | None = None):
        """`clock` reads the time of every deadline and invoke (seconds, monotonic); `timers()` gives, on the
        event loop a request runs on, the timers its deadline checks are scheduled on (that loop's by default;
        their delays are measured on `clock`)."""
        self.label = label
        self.backend = backend  # its backend's key: each run says which backend ran it (RunResult.backend)
        self.membership = Membership(label, members, retry_after_s, watchdog, clock)
        self.members = self.membership.members  # the one list: joining and leaving change it in place
        admission = Admission(label, max_waiting, max_queue_ms, retry_after_s, clock, overload_hold_s)
        self.admission = admission  # who may wait, and the pool's overload state (app/pool/admission.py)
        self.watchdog = watchdog  # None: the invoke's deadline is invoke_timeout_s, and nothing is re-created
        self.line = Line(label, self.membership, admission, self.membership.all_lanes, wait_timeout_s,
                         invoke_timeout_s, retry_after_s, watchdog, clock, timers, backend)
        self.lanes = Lanes(label, self.line, self.membership, clock, retry_after_s, backend, thread_nice)
        self.membership.serve(self.line, self.lanes)

    # -- the model its members load ----------------------------------------------------------------

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

    # -- how it is doing ---------------------------------------------------------------------------

    @property
    def admitted(self) -> int:
        """Requests holding a place: running or waiting."""
        return self.admission.admitted

    @property
    def overloaded(self) -> bool:
        return self.admission.overloaded

    @property
    def waiting(self) -> int:
        """Inputs handed to the pool and not yet taken by a lane (the queue depth)."""
        return self.line.waiting

    @property
    def busy(self) -> int:
        """Requests running now (a hung one included, until it returns)."""
        return self.lanes.busy

    @property
    def unhealthy(self) -> list[Member]:
        return self.membership.unhealthy

    @property
    def departed(self) -> bool:
        """Every member is out because its device left: nothing here can serve until one is back."""
        return self.membership.departed

    @property
    def handed_to(self) -> str | None:
        """The backend of the pool this one handed its line to (every device left), if it did."""
        return self.line.handed_to

    # -- the line ----------------------------------------------------------------------------------

    def check_room(self) -> None:
        """Busy (or the reason no member serves) at once when admit() would refuse now; takes nothing."""
        self.line.check_room()

    def admit(self) -> Place:
        """A place in line, or an error at once: every device unhealthy, closed, or the line full."""
        return self.line.admit()

    async def run(self, inputs: Inputs) -> RunResult:
        """Admit, run, leave: for callers that did not take a place beforehand."""
        place = self.admit()
        try:
            return await place.run(inputs)
        finally:
            place.release()

    # -- membership (app/pool/membership.py says more) ------------------------------------------

    def add(self, member: Member) -> bool:
        return self.membership.add(member)

    def leave(self, member: Member, problem: str, device: str | None = None) -> bool:
        return self.membership.leave(member, problem, device)

    def replace(self, old: Member, fresh: Member) -> bool:
        return self.membership.replace(old, fresh)

    def hand_over(self, successor: EnginePool) -> int:
        return self.membership.hand_over(successor.line)

    def refuse_waiting(self, reason: str) -> int:
        return self.membership.refuse_waiting(reason)

    def warm_up(self) -> None:
        self.membership.warm_up()

    def warm_up_member(self, member: Member) -> None:
        self.membership.warm_up_member(member)

    def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        return self.membership.wait_until(predicate, timeout_s)

    # -- the end -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop taking work: each member's last lane closes it after the jobs queued before now."""
        self.membership.close()

    def join(self, timeout_s: float) -> bool:
        """Wait (bounded) until the healthy members are closed; False if some are not yet."""
        return self.lanes.join(timeout_s)
