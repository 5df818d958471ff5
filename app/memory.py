"""Memory held by requests in flight: a byte budget for bodies, and glibc malloc kept honest.

ByteBudget: request bodies reserve their size before they are read; a body that does not
fit waits, first come first served, up to a deadline (then Busy: 503 + Retry-After). So
64 clients sending 18 MB each hold at most the budget, not 1.2 GB.

tune_malloc(): glibc's defaults suit long-lived heaps, not bursts of large buffers. Its
mmap threshold rises (up to 32 MiB) after the first large free, so later bodies land in the
heap, where freed memory mostly stays; and each thread may get its own arena (8 per core).
Measured (bench/hostile.py): after a burst of large bodies RSS stayed hundreds of MB above
idle. A fixed threshold sends every large buffer to mmap (returned to the OS on free) and two
arenas bound the per-thread caches; malloc_trim() after a burst returns the heap's free tail.
Only after a burst: at a few ms a call, trimming whenever the line of bodies empties would cost
a request at concurrency 1 more CPU than its HTTP (224x224 JPEG, simulated device: ~0.3 ms
on another thread, and the loop's hand-off to it).

Reservation.own(): a body is counted until its request ends, so its memory must be gone then, whatever
still refers to it. Something may: a failed request's exception keeps the frames that held the body
(the image thread's, through the job it answered: a reference cycle, freed only by the cyclic garbage
collector, whose full passes are rare and cost 150-300 ms of held GIL here). Measured: 10 sequential
20 MB bodies that were not images left 10 bodies resident (121 -> 326 MB) for as long as the process
stayed idle. So a request's own buffers that outlive it have their pages given back to the OS at its end
(release_pages: whoever still reads them reads zeros).
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import ctypes.util
import logging
import math
import mmap
import sys
import time
from collections.abc import Callable

from app.errors import Busy

log = logging.getLogger(__name__)

# mallopt() parameter numbers (glibc malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
# Fixed, not settings (TUNE_MALLOC turns them all off): the values measured for bursts of large bodies and
# pixels (docs/security.md); each alone changes little, and together they are glibc's, not the service's.
MMAP_THRESHOLD_BYTES = 1024 * 1024
TRIM_THRESHOLD_BYTES = 4 * 1024 * 1024
ARENA_MAX = 2
# A burst worth a malloc_trim(): bodies of at least this many bytes in flight at once since the
# last trim (glibc's own trim threshold: less than that free at the top of a heap stays anyway).
TRIM_AFTER_BYTES = TRIM_THRESHOLD_BYTES
# At most one trim per this many seconds: bursts that follow each other closely are trimmed once.
TRIM_INTERVAL_S = 1.0


def _libc():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt, libc.malloc_trim  # noqa: B018 (glibc only: musl and macOS have neither)
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()
# madvise(MADV_DONTNEED) frees a private anonymous page at once (it reads as zeros after): Linux's meaning
_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", None) if sys.platform.startswith("linux") else None
if _LIBC is not None and _MADV_DONTNEED is not None:
    _LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def tune_malloc() -> bool:
    """Fixed mmap threshold, trim threshold and arena count (glibc); False where there is no glibc."""
    if _LIBC is None:
        return False
    ok = _LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    ok &= _LIBC.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    ok &= _LIBC.mallopt(M_ARENA_MAX, ARENA_MAX) == 1
    return bool(ok)


def trim() -> None:
    """Give the free memory at the top of glibc's heaps back to the OS (a few ms; off the loop)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def release_pages(buffer: bytearray, start: int = 0, end: int | None = None) -> int:
    """Give the whole pages inside buffer[start:end] back to the OS now, though the buffer stays allocated (Linux
    with glibc: madvise MADV_DONTNEED; elsewhere nothing): whoever still reads them reads zeros. The bytes given
    back."""
    end = len(buffer) if end is None else end
    if _LIBC is None or _MADV_DONTNEED is None or end <= start:
        return 0
    view = (ctypes.c_char * len(buffer)).from_buffer(buffer)
    address = ctypes.addressof(view)
    del view  # the buffer's export ends here
    page = mmap.PAGESIZE
    first, last = -(-(address + start) // page) * page, (address + end) // page * page
    if last <= first or _LIBC.madvise(first, last - first, _MADV_DONTNEED) != 0:
        return 0
    return last - first


class ByteBudget:
    """At most `capacity` bytes reserved at once; waiters served in arrival order.

    Used from the event loop only. When the last reservation of a burst is released (a burst:
    `trim_after_bytes` or more reserved at once since the last trim), `trimmer` (malloc_trim) runs
    on a thread so the memory goes back to the OS; at most once per TRIM_INTERVAL_S, a trim due
    sooner waits for the interval's end (and for the end of a burst begun meanwhile).
    trim_after_bytes None: never.

    `clock` (seconds, monotonic) spaces the trims; `event_loop` gives the loop whose timer and
    executor run them (the running one). Both are passed in so that tests move time themselves.
    """

    def __init__(self, capacity: int, retry_after_s: float = 1.0, trim_after_bytes: int | None = TRIM_AFTER_BYTES,
                 trimmer: Callable[[], None] = trim, *, clock: Callable[[], float] = time.monotonic,
                 event_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.get_running_loop):
        self.capacity = capacity
        self.trim_after_bytes = trim_after_bytes
        self.retry_after_s = retry_after_s
        self.reserved = 0
        self.peak = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future]] = collections.deque()
        self._trimmer = trimmer
        self._clock = clock
        self._event_loop = event_loop
        self._burst_peak = 0  # the most reserved at once since the last trim
        self._last_trim = -math.inf  # on self._clock
        self._trim_due: asyncio.TimerHandle | None = None
        self._trim_loop: asyncio.AbstractEventLoop | None = None  # the loop _trim_due is on

    @property
    def waiting(self) -> int:
        """Reservations waiting in line for memory."""
        return len(self._waiters)

    async def acquire(self, size: int, timeout_s: float, ahead: bool = False) -> None:
        """Reserve `size` bytes, waiting in arrival order up to `timeout_s` (then Busy). `ahead`: for a request that
        holds part of the budget already, which waits before those that hold nothing (they could only wait for it
        to end, and it for them: each would hold until its timeout)."""
        if size > self.capacity:
            raise ValueError(f"{size} bytes can never fit a budget of {self.capacity}")
        if (ahead or not self._waiters) and self.reserved + size <= self.capacity:
            self._take(size)
            return
        future = asyncio.get_running_loop().create_future()
        entry = (size, future)
        if ahead:
            self._waiters.appendleft(entry)
        else:
            self._waiters.append(entry)
        start = self._clock()
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except (asyncio.TimeoutError, asyncio.CancelledError) as e:
            if future.done() and not future.cancelled():
                self.release(size)  # granted just as we gave up
            else:
                future.cancel()
                self._waiters.remove(entry)
                self._grant()
            if isinstance(e, asyncio.CancelledError):
                raise
            raise Busy(f"request bodies in flight fill the memory budget ({self.capacity} bytes); waited "
                       f"{self._clock() - start:.1f} s", self.retry_after_s) from None

    def release(self, size: int) -> None:
        self.reserved -= size
        self._grant()
        if self.reserved == 0 and self.trim_after_bytes is not None and self._burst_peak >= self.trim_after_bytes:
            loop = self._event_loop()
            if self._trim_due is None or self._trim_loop is not loop:  # one left on an ended loop never runs
                wait_s = self._last_trim + TRIM_INTERVAL_S - self._clock()
                self._trim_due, self._trim_loop = loop.call_later(max(0.0, wait_s), self._start_trim, loop), loop

    def _start_trim(self, loop: asyncio.AbstractEventLoop) -> None:
        self._trim_due = None
        if self.reserved:  # a burst begun meanwhile: trimmed when it ends
            return
        self._burst_peak = 0
        self._last_trim = self._clock()
        try:
            loop.run_in_executor(None, self._trimmer)
        except RuntimeError:  # the loop is shutting down its executor: nothing left to trim for
            pass

    def _take(self, size: int) -> None:
        self.reserved += size
        self.peak = max(self.peak, self.reserved)
        self._burst_peak = max(self._burst_peak, self.reserved)

    def _grant(self) -> None:
        while self._waiters and self.reserved + self._waiters[0][0] <= self.capacity:
            size, future = self._waiters.popleft()
            if not future.done():
                self._take(size)
                future.set_result(None)


class Reservation:
    """What one request holds of a ByteBudget, and the buffers it owns; released once, when the request ends."""

    def __init__(self, budget: ByteBudget):
        self.budget = budget
        self.size = 0
        self._buffers: list[bytearray] = []
        self.lingered = 0  # bytes of its buffers still referred to when it ended, given back then

    async def reserve(self, size: int, timeout_s: float) -> None:
        await self.budget.acquire(size, timeout_s, ahead=self.size > 0)
        self.size += size

    def shrink_to(self, size: int) -> None:
        if size < self.size:
            self.budget.release(self.size - size)
            self.size = size

    def own(self, buffer: bytearray) -> None:
        """`buffer` (the request's body, or what was decoded from it) is this request's: when the request ends, its
        memory goes back to the OS even if something still refers to it."""
        if not any(owned is buffer for owned in self._buffers):
            self._buffers.append(buffer)

    def release(self) -> None:
        buffers, self._buffers = self._buffers, []
        while buffers:
            buffer = buffers.pop()
            if sys.getrefcount(buffer) > 2:  # more than `buffer` and the call's argument: held beyond its request
                self.lingered += release_pages(buffer)
        if self.size:
            self.budget.release(self.size)
            self.size = 0
