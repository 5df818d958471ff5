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
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import ctypes.util
import logging
import time

from app.errors import Busy

log = logging.getLogger(__name__)

# mallopt() parameter numbers (glibc malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 1024 * 1024
TRIM_THRESHOLD_BYTES = 4 * 1024 * 1024
ARENA_MAX = 2


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


class ByteBudget:
    """At most `capacity` bytes reserved at once; waiters served in arrival order.

    Used from the event loop only. When the last reservation of a burst is released,
    malloc_trim runs on a thread so the memory goes back to the OS.
    """

    def __init__(self, capacity: int, retry_after_s: float = 1.0, trim_after_burst: bool = True):
        self.capacity = capacity
        self.trim_after_burst = trim_after_burst
        self.retry_after_s = retry_after_s
        self.reserved = 0
        self.peak = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future]] = collections.deque()
        self._trimmed = True

    async def acquire(self, size: int, timeout_s: float) -> None:
        if size > self.capacity:
            raise ValueError(f"{size} bytes can never fit a budget of {self.capacity}")
        if not self._waiters and self.reserved + size <= self.capacity:
            self._take(size)
            return
        future = asyncio.get_running_loop().create_future()
        entry = (size, future)
        self._waiters.append(entry)
        start = time.monotonic()
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
                       f"{time.monotonic() - start:.1f} s", self.retry_after_s) from None

    def release(self, size: int) -> None:
        self.reserved -= size
        self._grant()
        if self.reserved == 0 and not self._trimmed and self.trim_after_burst:
            self._trimmed = True
            asyncio.get_running_loop().run_in_executor(None, trim)

    def _take(self, size: int) -> None:
        self.reserved += size
        self.peak = max(self.peak, self.reserved)
        self._trimmed = False

    def _grant(self) -> None:
        while self._waiters and self.reserved + self._waiters[0][0] <= self.capacity:
            size, future = self._waiters.popleft()
            if not future.done():
                self._take(size)
                future.set_result(None)


class Reservation:
    """What one request holds of a ByteBudget; released once, when the request ends."""

    def __init__(self, budget: ByteBudget):
        self.budget = budget
        self.size = 0

    async def reserve(self, size: int, timeout_s: float) -> None:
        await self.budget.acquire(size, timeout_s)
        self.size += size

    def shrink_to(self, size: int) -> None:
        if size < self.size:
            self.budget.release(self.size - size)
            self.size = size

    def release(self) -> None:
        if self.size:
            self.budget.release(self.size)
            self.size = 0
