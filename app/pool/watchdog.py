"""The watchdog: an invoke that outlives its timeout takes its member out of the pool, and a background
thread re-creates the stages that hung (a new interpreter and delegate on the same device) until that
succeeds. A USB Accelerator that hangs until it resets is the case it is for. One watchdog for every
kind of member (app/pool/member.py): a whole model's interpreter is replaced by a new one; a pipeline
fails the requests inside it and has its lost segment re-created in place, the others staying loaded.

The hung invoke cannot be killed: its thread is a daemon, so it never holds up the process's
exit; it closes its interpreter and ends if the invoke ever returns.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from app.errors import DeviceHung
from app.pool.member import Member, Stage, timed_run

log = logging.getLogger(__name__)


class WatchedPool(Protocol):
    """What the watchdog needs of a pool (app/pool/engine_pool.py EnginePool): the one owner of its members'
    health, which the watchdog changes through it and never by hand."""

    label: str
    retry_after_s: float
    clock: Callable[[], float]
    closed: threading.Event

    def take_out(self, member: Member, problem: str) -> bool: ...
    def note_problem(self, member: Member, problem: str) -> None: ...
    def replace(self, old: Member, fresh: Member) -> bool: ...
    def warm_up(self, member: Member | None = None) -> None: ...


@dataclass(frozen=True)
class Watchdog:
    timeout_s: float
    # loads a stage again on its device (a new interpreter and delegate): what members renew themselves with
    reload: Callable[[Stage], Stage]
    retry_s: float

    @property
    def hang_text(self) -> str:
        return f"did not finish an invoke within {self.timeout_s} s (watchdog)"

    def problem(self, member: Member, stalled: Sequence[Stage]) -> str:
        return member.describe(stalled) + self.hang_text

    def warm_up(self, pool: WatchedPool, member: Member, inputs: list[np.ndarray]) -> None:
        """The warm-up run, bounded by the timeout: a device that hangs on it is unhealthy (DeviceHung)."""
        finished, failure = threading.Event(), []

        def run():
            try:
                timed_run(member, inputs, pool.clock)
            except Exception as e:
                failure.append(e)
            finished.set()

        threading.Thread(target=run, name=f"warm-up-{pool.label}", daemon=True).start()
        if not finished.wait(self.timeout_s):
            stalled = member.stalled(pool.clock(), 0.0)  # the one input in it: whatever still invokes hangs
            problem = self.problem(member, stalled)
            pool.take_out(member, problem)
            error = DeviceHung(f"{pool.label}: warm-up on {member.device or 'its device'}: {problem}",
                               pool.retry_after_s)
            member.lose(stalled, error)
            raise error
        if failure:
            raise failure[0]

    def quarantine(self, pool: WatchedPool, member: Member, stalled: Sequence[Stage]) -> DeviceHung:
        """Take a member whose stages hung out of the pool (once), fail the requests inside it, and start
        re-creating it; the error for the request that found the hang."""
        problem = self.problem(member, stalled)
        error = DeviceHung(f"{pool.label}: {member.where} {problem}; it is out of the pool while it is re-created",
                           pool.retry_after_s)
        if not pool.take_out(member, problem):
            return error
        member.lose(stalled, error)
        log.error("%s: %s %s: unhealthy, re-creating it", pool.label, member.where, member.problem)
        threading.Thread(target=self._recover, args=(pool, member), name=f"recover-{pool.label}",
                         daemon=True).start()
        return error

    def _recover(self, pool: WatchedPool, old: Member) -> None:
        """Re-create what hung until it loads and warms up, then put it back in the pool (blocking)."""
        attempt, hung = 0, old.problem
        while not pool.closed.is_set():
            attempt += 1
            try:
                fresh = old.renew(self.reload)
                pool.warm_up(fresh)
            except Exception as e:  # any failure: the device may still be resetting
                pool.note_problem(old, f"{hung}; re-creating it failed (attempt {attempt}: {e}); "
                                      f"retrying in {self.retry_s} s")
                log.warning("%s: %s %s", pool.label, old.where, old.problem)
                pool.closed.wait(self.retry_s)
                continue
            if not pool.replace(old, fresh):  # closed meanwhile (a member repaired in place closes with it)
                if fresh is not old:
                    fresh.close()
                return
            log.info("%s: %s re-created after a hang (attempt %d)", pool.label, fresh.where, attempt)
            return
