"""The TPUs this process serves on, kept up to date while it serves: TPUs come and go without a restart.

libedgetpu answers `edgetpu_list_devices()` afresh at each call. At start the plug-in takes the TPUs its
settings name (EDGETPU_DEVICES; every one listed when unset) that it can open (device node and
permissions, app/edgetpu/access.py) and that are this process's (`choose`, one function of the plug-in:
where several processes share the host's TPUs, each claims its own, app/edgetpu/claims.py). From then on
a `Prober` thread lists them again every PROBE_INTERVAL_S: a TPU plugged in joins, one unplugged leaves,
and the plug-in's listener hears of each round (the registry: pools follow, models move between their CPU
fallback and the TPU). An invoke that fails on a TPU no longer listed asks `gone()`, which wakes the probe
at once rather than at its next round.

A TPU is known by its path (a USB Accelerator's sysfs directory, a PCIe node): its index in the list
(the delegate's ":N") moves as others come and go, so it is resolved again before each delegate is made.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from app.edgetpu.access import HOST, DeviceTree, access_problem
from app.edgetpu.delegate import Target, resolve_present
from app.edgetpu.library import Device, EdgeTpuLibrary

log = logging.getLogger(__name__)

# What a probe round found: the listing failed, or it changed what is in service, or not.
PROBE_RESULTS = ("unchanged", "changed", "failed")
CHANGES = ("joined", "left")

Choose = Callable[[list[Target]], list[Target]]


@dataclass(frozen=True)
class Change:
    """What one listing changed: TPUs taken into service, and TPUs gone from it."""

    joined: tuple[Target, ...] = ()
    left: tuple[Target, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.joined or self.left)


@dataclass
class Counts:
    """What the probe has done since start, for /metrics."""

    probes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PROBE_RESULTS, 0))
    changes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CHANGES, 0))


class Inventory:
    """The TPUs in service now, and what the last listing saw. Thread-safe: the probe's thread lists,
    interpreter threads ask `gone()`, requests read it for /v1/devices, /readyz and /metrics."""

    def __init__(self, library: EdgeTpuLibrary, requested: list[str], choose: Choose, tree: DeviceTree = HOST,
                 clock: Callable[[], float] = time.time):
        self.library = library
        self.requested = list(requested)
        self.choose = choose
        self.tree = tree
        self.clock = clock
        self.wake: Callable[[], None] = lambda: None  # the probe's: a round now (set by its owner)
        self.counts = Counts()
        self._lock = threading.Lock()
        self._in_service: list[Target] = []
        self._listed: list[Device] = []
        self._waiting_for: list[str] = []   # requested specs that name no TPU now
        self._refused: dict[str, str] = {}  # path -> why this process cannot open that TPU
        self._error: str | None = None      # why the last listing failed
        self.last_probe_at: float | None = None

    # -- what is known -----------------------------------------------------------------------------

    @property
    def in_service(self) -> list[Target]:
        """The TPUs to serve on, in libedgetpu's order at the last listing (their ":N" then)."""
        with self._lock:
            return list(self._in_service)

    @property
    def listed(self) -> list[Device]:
        with self._lock:
            return list(self._listed)

    @property
    def waiting_for(self) -> list[str]:
        """Requested specs (EDGETPU_DEVICES) that named no TPU at the last listing."""
        with self._lock:
            return list(self._waiting_for)

    @property
    def refused(self) -> dict[str, str]:
        """TPUs listed and wanted that this process cannot open: path -> the problem and its fix."""
        with self._lock:
            return dict(self._refused)

    @property
    def error(self) -> str | None:
        with self._lock:
            return self._error

    def serves(self, path: str) -> bool:
        with self._lock:
            return any(t.device.path == path for t in self._in_service)

    # -- listing ------------------------------------------------------------------------------------

    def take(self) -> Change:
        """List the TPUs now and bring what is in service up to date; what joined and what left."""
        try:
            listed = self.library.list_devices()
            found, missing = resolve_present(self.requested, listed)
        except (OSError, ValueError) as e:
            return self._failed(str(e))
        usable, refused = [], {}
        for target in found:
            problem = access_problem(target.device, self.tree)
            if problem is None:
                usable.append(target)
            else:
                refused[target.device.path] = problem
        usable = self.choose(usable)  # after the access check: a process never claims a TPU it cannot open
        with self._lock:
            before = {t.device.path for t in self._in_service}
            now = {t.device.path for t in usable}
            change = Change(tuple(t for t in usable if t.device.path not in before),
                            tuple(t for t in self._in_service if t.device.path not in now))
            new_refusals = {path: why for path, why in refused.items() if self._refused.get(path) != why}
            self._in_service, self._listed, self._waiting_for, self._refused = usable, listed, missing, refused
            self._error, self.last_probe_at = None, self.clock()
            self.counts.probes["changed" if change else "unchanged"] += 1
            self.counts.changes["joined"] += len(change.joined)
            self.counts.changes["left"] += len(change.left)
            in_service = len(usable)
        for target in change.left:
            log.warning("Edge TPU %s is gone (not listed by libedgetpu any more): out of service, %d TPU(s) "
                        "in service", target.label, in_service)
        for target in change.joined:
            log.info("Edge TPU %s found: taking it into service, %d TPU(s) in service", target.label, in_service)
        for path, why in new_refusals.items():
            log.warning("Edge TPU %s is listed but cannot be used: %s", path, why)
        return change

    def _failed(self, error: str) -> Change:
        with self._lock:
            first = self._error != error
            self._error, self.last_probe_at = error, self.clock()
            self.counts.probes["failed"] += 1
        if first:
            log.warning("Edge TPU probe: cannot list the TPUs: %s", error)
        return Change()

    def gone(self, path: str) -> bool:
        """An invoke failed on this TPU: whether libedgetpu no longer lists it. If so, the probe runs now."""
        try:
            listed = self.library.list_devices()
        except OSError:
            return False
        if any(device.path == path for device in listed):
            return False
        self.wake()
        return True


class Prober:
    """A thread that runs `probe_round()` every `interval_s`, at once when woken, until stopped.

    The clock is passed in (seconds, monotonic): a test with a fake clock moves it and calls `poke()`,
    and waits for `rounds` with `wait_rounds()`; nothing has to sleep through a time window."""

    def __init__(self, interval_s: float, probe_round: Callable[[], None], name: str = "edgetpu-probe",
                 clock: Callable[[], float] = time.monotonic):
        self.interval_s = interval_s
        self.probe_round = probe_round
        self.clock = clock
        self.rounds = 0
        self._changed = threading.Condition()
        self._woken = False
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """A round now, without waiting for the interval to pass."""
        with self._changed:
            self._woken = True
            self._changed.notify_all()

    def poke(self) -> None:
        """Look at the clock again (after a test moved its fake one)."""
        with self._changed:
            self._changed.notify_all()

    def stop(self, timeout_s: float) -> bool:
        """End the thread after the round under way; False if it has not ended within timeout_s."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        if self._thread.ident is None or self._thread is threading.current_thread():
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def wait_rounds(self, count: int, timeout_s: float) -> bool:
        """Block until `count` rounds have run in all (or the probe stopped), at most timeout_s."""
        with self._changed:
            return self._changed.wait_for(lambda: self.rounds >= count or self._stopped, timeout_s)

    def _run(self) -> None:
        next_at = self.clock() + self.interval_s  # the first listing was the start's
        while True:
            with self._changed:
                while not (self._stopped or self._woken or self.clock() >= next_at):
                    self._changed.wait(max(0.001, next_at - self.clock()))
                if self._stopped:
                    return
                self._woken = False
            try:
                self.probe_round()
            except Exception:  # a round that fails never ends the probe: the next one tries again
                log.exception("Edge TPU probe: the round failed")
            with self._changed:
                self.rounds += 1
                self._changed.notify_all()
            next_at = self.clock() + self.interval_s
