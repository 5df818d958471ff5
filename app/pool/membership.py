"""Who serves in a pool: its members (app/pool/member.py: interpreters, or pipelines of segments), their
health, and members joining and leaving while the pool serves.

TPUs are plugged in and unplugged (the plug-in's probe, app/registry/devices.py): `add()` a member loaded
and warmed on a new device; `leave()` a member whose device left (it is `departed`, out until the device is
back: `replace()`). A pool whose every device left hands its line to the pool serving the model instead
(`hand_over()`: the same model version on its fallback backend), or answers it at once (`refuse_waiting()`):
every request gets its answer. The watchdog (app/pool/watchdog.py) changes health through `take_out()`,
`note_problem()`, `warm_up_member()` and `replace()`.

Every change is made under one lock, the one admission holds while it counts the healthy lanes
(`healthy_lanes()`, app/pool/line.py), and notifies `changed`: tests and shutdown wait on it, no polling.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from app.errors import Busy, DeviceGone, DeviceHung
from app.pool.member import Member, timed_run
from app.pool.watchdog import Watchdog

if TYPE_CHECKING:
    from app.pool.lanes import Lanes
    from app.pool.line import Line

log = logging.getLogger(__name__)


def departed_problem(devices: Sequence[str]) -> str:
    """What a member whose devices left says (readiness, /v1/devices)."""
    return f"is gone: {', '.join(devices)} not listed any more (unplugged?); out of the pool until it is back"


class Membership:
    """The members of one pool and their health; the line they serve and their lanes come with `serve()`."""

    line: Line
    lanes: Lanes

    def __init__(self, label: str, members: list[Member], retry_after_s: float, watchdog: Watchdog | None,
                 clock: Callable[[], float]):
        if not members:
            raise ValueError("a pool needs at least one member")
        self.label = label
        self.members = members
        self.retry_after_s = retry_after_s
        self.watchdog = watchdog
        self.clock = clock
        self.lock = threading.Lock()
        # notified whenever a member's health changes: tests and shutdown wait on it, no polling
        self.changed = threading.Condition(self.lock)
        self.closed = threading.Event()
        self._refusing: str | None = None  # every device left and nothing serves instead: why (refuse_waiting)

    def serve(self, line: Line, lanes: Lanes) -> None:
        """Start serving `line`: every member's lanes start."""
        self.line, self.lanes = line, lanes
        with self.lock:
            for member in self.members:
                lanes.start(member, self._tag(member))

    def _tag(self, member: Member) -> object:
        """What its lanes' threads are named after: its device, else its place among the members."""
        return member.device or self.members.index(member)

    @property
    def all_lanes(self) -> int:
        """Every member's lanes, healthy or not."""
        return sum(m.lanes for m in self.members)

    def healthy_lanes(self) -> int:
        """The healthy members' lanes; DeviceGone or DeviceHung if none, Busy if closed (under self.lock)."""
        healthy = 0
        for member in self.members:  # a loop, not a generator: twice per request
            if member.healthy:
                healthy += member.lanes
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

    @property
    def unhealthy(self) -> list[Member]:
        return [m for m in self.members if not m.healthy]

    @property
    def departed(self) -> bool:
        """Every member is out because its device left: nothing here can serve until one is back."""
        return all(m.departed and not m.healthy for m in self.members)

    # -- members joining and leaving while serving (devices plugged in and unplugged) -----------------

    def add(self, member: Member) -> bool:
        """A member on a device that joined serves from now on (loaded and warmed up beforehand); False if
        the pool closed meanwhile (the caller closes it)."""
        with self.lock:
            if self.closed.is_set():
                return False
            self.members.append(member)
            self.line.make_room(self.all_lanes)  # room in the queue for the line admission now allows
            self._serve_again()
            self.lanes.start(member, self._tag(member))
            self.changed.notify_all()
        log.info("%s: %s joined the pool (%d healthy)", self.label, member.where,
                 len(self.members) - len(self.unhealthy))
        return True

    def leave(self, member: Member, problem: str, device: str | None = None) -> bool:
        """A device of this member left (unplugged): the member is out of the pool, `departed`, until
        `replace()` puts it (or a member on another device) back; the requests inside it go to the others
        (a pipeline's are failed with DeviceGone, and their lanes put them back in line). False if it was
        out already (hung, or left before)."""
        with self.lock:
            if not member.healthy:
                return False
            member.healthy, member.problem, member.departed = False, problem, True
            self.changed.notify_all()
        stages = [s for s in member.stages if device is None or s.device == device] or member.stages
        member.lose(stages, DeviceGone(f"{self.label}: {member.where} {problem}", self.retry_after_s))
        if not member.repaired_in_place:
            self.lanes.retire(member)
        log.warning("%s: %s %s: out of the pool", self.label, member.where, problem)
        return True

    def replace(self, old: Member, fresh: Member) -> bool:
        """Put a re-created member in for `old` (a new one, or `old` repaired in place: its lanes go on)
        and serve on it; False if the pool closed."""
        with self.lock:
            if self.closed.is_set():
                return False
            if fresh is not old:
                self.members[self.members.index(old)] = fresh
                self.lanes.start(fresh, self._tag(fresh))
            fresh.healthy, fresh.problem, fresh.departed = True, None, False
            self._serve_again()
            self.changed.notify_all()
            return True

    def _serve_again(self) -> None:
        """A device again (under self.lock): the line is this pool's again, and admission no longer refuses."""
        self.line.successor, self._refusing = None, None

    def hand_over(self, successor: Line) -> int:
        """Every device left and the model is served by another backend now: this pool's line goes to
        `successor` (the same model version's line on that backend), the requests waiting now and any
        queued from now on, under the successor's deadlines; admission here gives places there. The
        number of requests handed over. A device joining (`add`, `replace`) takes the line back."""
        with self.lock:
            if successor is self.line or self.closed.is_set():
                return 0
            self.line.successor = successor
            self.changed.notify_all()
        moved = 0
        for job in self.line.take_waiting():
            successor.adopt(job)
            moved += 1
        if moved:
            log.warning("%s: every device left: %d waiting request(s) handed to %s", self.label, moved,
                        successor.label)
        return moved

    def refuse_waiting(self, reason: str) -> int:
        """Every device left and none serves the model instead: the requests waiting in line are answered
        now (DeviceGone: 503 with Retry-After) rather than at their wait deadline, and so is every new one
        until a device is back (`add`, `replace`). How many were waiting."""
        with self.lock:
            self._refusing = reason
        refused = 0
        for job in self.line.take_waiting():
            if job.claim():
                job.answer(error=DeviceGone(f"{self.label}: {reason}", self.retry_after_s))
                refused += 1
        return refused

    # -- health: what the watchdog changes ----------------------------------------------------

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

    def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Block until predicate() holds after a health change (or now), at most timeout_s."""
        with self.changed:
            return self.changed.wait_for(predicate, timeout_s)

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

    # -- the end -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop taking work: each member's last lane closes it after the jobs queued before now. A hung
        interpreter closes if its invoke ever returns; the lanes of a member out for repair end now."""
        with self.lock:
            if self.closed.is_set():
                return
            self.closed.set()
            running = sum(len(m.threads) for m in self.members if m.healthy or m.repaired_in_place)
            self.changed.notify_all()
        self.lanes.stop(running)
