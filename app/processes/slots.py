"""A worker's slot in the process group, and what follows from it: its share of the devices and of the limits.

gunicorn gives its workers no stable index, so the master gives out slots (app/processes/arbiter.py):
slot k of N, the lowest one no live worker holds, so a worker that replaces a dead one takes its slot. A
worker joins its slot before the app is built: it takes the slot's lock (a file lock the kernel releases when
the process ends, however it ends: SIGKILL included), so two processes never answer for one slot, even if a
process manager started a new worker before the old one was gone; and its metrics go to the group's shared
files. Its TPUs are those it claims, one lock per TPU in the group's directory (DEVICE_SHARE k/N and
DEVICE_CLAIMS_DIR, set here; the rule is the Edge TPU plug-in's): at start the k-th contiguous part of
those listed; while serving, TPUs that come, go and come back, each opened by one process.

The limits that protect the host rather than one event loop are split among the workers: the connection
cap (file descriptors, connection memory) and the memory budget for bodies in flight. The CPU
interpreters (`WORKERS`, by default the core count) are split too, unless set.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.locks import try_lock
from app.settings import DeviceShare, Settings

log = logging.getLogger(__name__)

# Fixed, not settings: a slot's previous holder on its way out (its drain) releases the slot's lock by ending;
# waiting longer than this means something is wrong, and the worker says so rather than start without its slot.
LOCK_WAIT_S = 30.0
LOCK_POLL_S = 0.1  # the pace of looking again meanwhile


@dataclass(frozen=True)
class Slot:
    """Slot `index` of `count` in the process group whose files live in `run_dir`."""

    index: int
    count: int
    run_dir: Path

    @property
    def share(self) -> DeviceShare:
        return DeviceShare(self.index, self.count)

    def socket_path(self, index: int | None = None) -> Path:
        """Where slot `index` (default: this one) answers its siblings (app/processes/siblings.py)."""
        return self.run_dir / f"worker-{self.index if index is None else index}.sock"

    @property
    def lock_path(self) -> Path:
        return self.run_dir / f"slot-{self.index}.lock"

    @property
    def metrics_dir(self) -> Path:
        return metrics_dir(self.run_dir)

    def others(self) -> list[int]:
        return [i for i in range(self.count) if i != self.index]


def metrics_dir(run_dir: Path) -> Path:
    """prometheus_client's multiprocess directory of the group (PROMETHEUS_MULTIPROC_DIR)."""
    return run_dir / "metrics"


class ThisWorker:
    """This process's place in the group. Module state, because it is the process's: a process holds one slot, its
    lock until it ends, and its models load once before it listens."""

    def __init__(self) -> None:
        self.slot: Slot | None = None   # None: the process serves alone
        self.lock_fd: int | None = None  # the slot's lock, held open until the process ends
        self.loaded = threading.Event()  # set once its models are loaded and it listens (app/service.py: mark_loaded)
        self.when_loaded: list[Callable[[], None]] = []


THIS_WORKER = ThisWorker()
loaded = THIS_WORKER.loaded


def when_loaded(callback: Callable[[], None]) -> None:
    """Call `callback` once this worker's models are loaded, before it serves (the worker listens then)."""
    THIS_WORKER.when_loaded.append(callback)


def mark_loaded() -> None:
    for callback in THIS_WORKER.when_loaded:
        callback()
    THIS_WORKER.loaded.set()


def current() -> Slot | None:
    """This process's slot; None when it serves alone."""
    return THIS_WORKER.slot


def join(slot: Slot, heartbeat=None) -> None:
    """Make this process the holder of `slot`: its lock (waiting, bounded, for a previous holder still on its
    way out; `heartbeat()` is called meanwhile), and its metrics in the group's files. Before the app is built."""
    from app import metrics

    THIS_WORKER.lock_fd = take_lock(slot.lock_path, LOCK_WAIT_S, heartbeat)
    metrics.use_multiprocess(slot.metrics_dir)
    THIS_WORKER.slot = slot


def take_lock(path: Path, wait_s: float, heartbeat=None) -> int:
    """An exclusive lock on `path`, held until the process ends (the descriptor is kept open, not
    inherited by children). RuntimeError when another process still holds it after wait_s."""
    deadline = time.monotonic() + wait_s
    while (fd := try_lock(path)) is None:
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{path.name} is still held by another process after {wait_s:g} s: a worker "
                               "of this slot is still running")
        if heartbeat is not None:
            heartbeat()
        time.sleep(LOCK_POLL_S)
    return fd


def process_settings(settings: Settings, slot: Slot) -> Settings:
    """The settings of the worker in `slot`: its share of the devices, its part of the host's limits."""
    n = slot.count
    update = {
        "device_share": slot.share,
        "device_claims_dir": slot.run_dir,
        "max_connections": math.ceil(settings.max_connections / n),
        # a multipart body is held twice for a moment: each worker can hold one at least
        "max_body_bytes_in_flight": max(math.ceil(settings.max_body_bytes_in_flight / n),
                                        2 * settings.max_body_bytes),
    }
    if "workers" not in settings.model_fields_set:
        update["workers"] = max(1, (os.cpu_count() or 1) // n)
    return settings.model_copy(update=update)


def processes_for(tpus: int, segments: int, cores: int) -> int:
    """EDGETPU_SERVE_PROCESSES=auto: one process per TPU, or per `segments` TPUs (a pipeline's TPUs are in one
    process), no more than the cores; one where there is no Edge TPU (CPU interpreters already use every core)."""
    return max(1, min(tpus // max(1, segments), cores))
