"""The watchdog: an invoke that outlives its timeout takes its interpreter out of the pool, and a
background thread re-creates it (a new interpreter and delegate for the same device) until that
succeeds. A USB Accelerator that hangs until it resets is the case it is for.

The hung invoke cannot be killed: its thread is a daemon, so it never holds up the process's
exit; it closes its interpreter and ends if the invoke ever returns.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from app.errors import DeviceHung
from app.pool.member import Member, timed_run

log = logging.getLogger(__name__)


class WatchedPool(Protocol):
    """What the watchdog needs of a pool (app/pool/dispatch.py EnginePool)."""

    label: str
    retry_after_s: float
    clock: Callable[[], float]
    closed: threading.Event

    def take_out(self, member: Member, problem: str) -> bool: ...
    def note_problem(self, member: Member, problem: str) -> None: ...
    def replace(self, old: Member, fresh: Member) -> bool: ...
    def warm_up_member(self, member: Member) -> None: ...


@dataclass(frozen=True)
class Watchdog:
    timeout_s: float
    # builds a loaded replacement for a member (same device, new interpreter and delegate)
    recreate: Callable[[Member], Member]
    retry_s: float

    @property
    def hang_text(self) -> str:
        return f"did not finish an invoke within {self.timeout_s} s (watchdog)"

    def warm_up(self, pool: WatchedPool, member: Member, x: np.ndarray) -> None:
        """The warm-up run, bounded by the timeout: a device that hangs on it is unhealthy (DeviceHung)."""
        finished, failure = threading.Event(), []

        def run():
            try:
                timed_run(member, x, pool.clock)
            except Exception as e:
                failure.append(e)
            finished.set()

        threading.Thread(target=run, name=f"warm-up-{pool.label}", daemon=True).start()
        if not finished.wait(self.timeout_s):
            member.healthy, member.problem = False, self.hang_text
            raise DeviceHung(f"{pool.label}: warm-up on {member.device or 'its device'}: "
                             f"{member.problem}", pool.retry_after_s)
        if failure:
            raise failure[0]

    def quarantine(self, pool: WatchedPool, member: Member) -> None:
        """Take a hung member out of the pool (once) and start re-creating it."""
        if not pool.take_out(member, self.hang_text):
            return
        log.error("%s: %s %s: unhealthy, re-creating it", pool.label, member.device or "interpreter", member.problem)
        threading.Thread(target=self._recover, args=(pool, member), name=f"recover-{pool.label}",
                         daemon=True).start()

    def _recover(self, pool: WatchedPool, old: Member) -> None:
        """Re-create a hung member until it loads and warms up, then swap it in (blocking)."""
        attempt = 0
        while not pool.closed.is_set():
            attempt += 1
            try:
                fresh = self.recreate(old)
                pool.warm_up_member(fresh)
            except Exception as e:  # any failure: the device may still be resetting
                pool.note_problem(old, f"{self.hang_text}; re-creating it failed (attempt {attempt}: {e}); "
                                      f"retrying in {self.retry_s} s")
                log.warning("%s: %s %s", pool.label, old.device or "interpreter", old.problem)
                pool.closed.wait(self.retry_s)
                continue
            if not pool.replace(old, fresh):  # closed meanwhile
                fresh.engine.close()
                return
            log.info("%s: %s re-created after a hang (attempt %d)", pool.label, fresh.device or "interpreter", attempt)
            return
