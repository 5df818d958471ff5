"""Which TPUs this process may open when several processes share a host's TPUs: a claim on each.

A TPU is opened by at most one process at any moment, and the kernel enforces it: a claim is an exclusive
lock (flock) on a file named after the TPU's path, the one identity that stays while TPUs come and go
(their index in libedgetpu's list moves), in the directory the processes share (the process group's). The
kernel releases it when the process ends, however it ends (SIGKILL too). A process opens a TPU only while it
holds its claim (`open()`), and lets a claim go only once every interpreter it opened on that TPU is closed.
The file keeps the slot of its last holder.

The rule (`choose`), applied at start and at every probe round, with N processes and P TPUs listed:
  - a TPU this process holds stays its own while libedgetpu lists it: moving a TPU between processes
    would close interpreters that requests are using. One no longer listed (unplugged) is let go as
    soon as its interpreters are closed, for whichever process sees it back first;
  - a free TPU (plugged in, let go, or its holder dead) is claimed by a process that holds fewer than its
    fair share, ceil(P / N), so the counts even out as TPUs come, go and come back: its own contiguous
    share (slot k of N: the k-th of N parts of the list, as at a start) first, then the others in order.
    A free TPU whose last holder is another process that holds fewer than its fair share is left to it:
    a TPU plugged back returns where it was, a replaced worker finds its predecessor's TPUs;
  - a model cut into K segments has its K TPUs in one process: TPUs are claimed in sets of K (the most
    segments of a model this process serves), a set whole or not at all, the fair share counted in whole
    sets, and a set broken by an unplugged TPU completed first;
  - a process with no TPU serves on its CPU fallback where EDGETPU_ON_FAILURE allows, and claims one at
    the first probe round that finds one free.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from app.edgetpu.delegate import Target
from app.edgetpu.errors import EdgeTpuUnavailable
from app.locks import try_lock
from app.settings import DeviceShare

log = logging.getLogger(__name__)


def fair_share(present: int, processes: int, unit: int = 1) -> int:
    """The most TPUs a process claims of `present`: an even part, in whole sets of `unit`."""
    return math.ceil((present // unit) / processes) * unit


class Claims:
    """This process's claims, as slot `share.index` of `share.count` sharing a host's TPUs. Thread-safe:
    the probe's thread chooses, interpreter threads open and close."""

    def __init__(self, directory: Path, share: DeviceShare, unit: int = 1):
        self.directory = directory
        self.share = share
        self.unit = max(1, unit)
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}     # TPU path -> the descriptor holding its claim
        self._open: Counter[str] = Counter()  # TPU path -> interpreters open on it here
        self._lost: set[str] = set()        # held, not listed any more: let go once closed
        self.present = 0                    # the TPUs found at the last choice (listed, named, usable)
        self._closing = False               # the plug-in closed: claims let go without a word

    def file(self, path: str) -> Path:
        return self.directory / f"tpu-{hashlib.sha256(path.encode()).hexdigest()[:24]}.claim"

    @property
    def held(self) -> set[str]:
        with self._lock:
            return set(self._held)

    # -- the rule ----------------------------------------------------------------------------------

    def choose(self, found: list[Target]) -> list[Target]:
        """This process's TPUs among those `found` now (listed, named by EDGETPU_DEVICES, usable): the ones it
        holds, and those it claims now by the rule above; in the order found."""
        with self._lock:
            self.present = len(found)
            listed = {t.device.path for t in found}
            for path in self._held:
                (self._lost.discard if path in listed else self._lost.add)(path)
            for path in [p for p in self._lost if not self._open[p]]:
                self._let_go(path)
            self._claim(found)
            return [t for t in found if t.device.path in self._held]

    def _claim(self, found: list[Target]) -> None:
        me, unit = self.share.index, self.unit
        fair = fair_share(len(found), self.share.count, unit)
        mine = sum(t.device.path in self._held for t in found)
        need = (-mine) % unit  # what completes a set broken by an unplugged TPU
        if not need and mine + unit > fair:
            return
        free: dict[str, tuple[int, int | None]] = {}  # path -> (its lock, held until chosen; its last holder)
        holders: Counter[int | None] = Counter({me: mine})
        for target in found:
            path = target.device.path
            if path in self._held:
                continue
            fd = try_lock(self.file(path))
            if fd is None:
                holders[_holder(self.file(path))] += 1
            else:
                free[path] = (fd, _holder_in(fd))

        def may_take(path: str) -> bool:
            last = free[path][1]
            return last is None or last == me or holders[last] >= fair

        try:
            own = self.share.of(found)
            order = [*own, *(t for t in found if t not in own)]
            candidates = [t.device.path for t in order if t.device.path in free and may_take(t.device.path)]
            taken, candidates = candidates[:need], candidates[need:]
            while mine + len(taken) + unit <= fair and len(candidates) >= unit:
                taken, candidates = taken + candidates[:unit], candidates[unit:]
            for path in taken:
                fd = free.pop(path)[0]
                _write_holder(fd, me, path)
                self._held[path] = fd
            if taken:
                log.info("Edge TPU(s) %s claimed by this process (slot %d of %d): it holds %d of the %d listed",
                         ", ".join(taken), me, self.share.count, mine + len(taken), len(found))
        finally:
            for fd, _ in free.values():
                os.close(fd)

    def _let_go(self, path: str, quiet: bool = False) -> None:
        os.close(self._held.pop(path))
        self._lost.discard(path)
        if not quiet:
            log.info("Edge TPU %s let go (not listed any more, its interpreters closed): free for whichever "
                     "process sees it back first", path)

    # -- opening ------------------------------------------------------------------------------------

    def open(self, path: str) -> Callable[[], None]:
        """Before an interpreter is made on this TPU: counts it open, and gives the call that counts it
        closed (once). EdgeTpuUnavailable when this process does not hold the TPU (any more)."""
        with self._lock:
            if path not in self._held or path in self._lost:
                raise EdgeTpuUnavailable(f"edgetpu: the Edge TPU {path} is not this process's (another process "
                                         "sharing the host's TPUs holds it, or it was unplugged)")
            self._open[path] += 1
        done = []  # an engine closed, then collected, counts once

        def closed() -> None:
            with self._lock:
                if done:
                    return
                done.append(True)
                self._open[path] -= 1
                if not self._open[path] and path in self._lost:
                    self._let_go(path, quiet=self._closing)

        return closed

    def close(self) -> None:
        """Let every claim go, each once its interpreters are closed (the plug-in's close, at shutdown)."""
        with self._lock:
            self._closing = True
            self._lost.update(self._held)
            for path in [p for p in self._lost if not self._open[p]]:
                self._let_go(path, quiet=True)


def _write_holder(fd: int, slot: int, path: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{slot} {os.getpid()} {path}\n".encode(), 0)


def _holder_in(fd: int) -> int | None:
    """The slot a claim file names (its holder, or its last one), None if it names none."""
    first = os.pread(fd, 64, 0).split(b" ", 1)[0]
    return int(first) if first.isdigit() else None


def _holder(file: Path) -> int | None:
    try:
        fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _holder_in(fd)
    finally:
        os.close(fd)
