"""A pool of interpreters for one (model, backend): one request per interpreter at a time.

Interpreters are not thread-safe, so each request borrows one. Requests that find none
free wait in a bounded line: past `max_waiting` waiters, or after `wait_timeout_s`, the
request is refused with Busy (503 + Retry-After) instead of queueing without limit.
Invokes run on the pool's own threads (one per interpreter), off the event loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from app.engines import Engine
from app.errors import Busy


@dataclass
class Member:
    engine: Engine
    load_ms: float
    first_inference_ms: float | None = None

    @property
    def warm(self) -> bool:
        return self.first_inference_ms is not None


@dataclass(frozen=True)
class RunResult:
    output: np.ndarray
    inference_ms: float
    cold: bool


class EnginePool:
    def __init__(self, label: str, members: list[Member], max_waiting: int, wait_timeout_s: float,
                 retry_after_s: float):
        if not members:
            raise ValueError("a pool needs at least one engine")
        self.label = label
        self.members = members
        self.max_waiting = max_waiting
        self.wait_timeout_s = wait_timeout_s
        self.retry_after_s = retry_after_s
        self._idle: asyncio.Queue[Member] = asyncio.Queue()
        for member in members:
            self._idle.put_nowait(member)
        self._waiting = 0
        self._executor = ThreadPoolExecutor(len(members), thread_name_prefix=f"pool-{label}")

    @property
    def engine(self) -> Engine:
        """A representative engine, for its tensor specs (all members load the same file)."""
        return self.members[0].engine

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

    def warm_up(self) -> None:
        """Run one input through every interpreter (blocking; before the pool serves)."""
        x = np.full(self.engine.input.shape, self.engine.input.zero_point, self.engine.input.dtype)
        for member in self.members:
            _timed_run(member, x)

    async def run(self, x: np.ndarray) -> RunResult:
        member = await self._acquire()
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor, _timed_run, member, x)
        finally:
            self._idle.put_nowait(member)

    async def _acquire(self) -> Member:
        try:
            return self._idle.get_nowait()
        except asyncio.QueueEmpty:
            pass
        if self._waiting >= self.max_waiting:
            raise Busy(f"{self.label}: all {len(self.members)} interpreters busy and "
                       f"{self._waiting} requests already waiting", self.retry_after_s)
        self._waiting += 1
        try:
            return await asyncio.wait_for(self._idle.get(), self.wait_timeout_s)
        except TimeoutError:
            raise Busy(f"{self.label}: no interpreter free within {self.wait_timeout_s} s",
                       self.retry_after_s) from None
        finally:
            self._waiting -= 1

    def close(self) -> None:
        """Stop taking work; engines are closed once the invokes already running finish."""

        def drain_then_close():
            self._executor.shutdown(wait=True)
            for member in self.members:
                member.engine.close()

        threading.Thread(target=drain_then_close, name=f"close-{self.label}", daemon=True).start()


def _timed_run(member: Member, x: np.ndarray) -> RunResult:
    cold = not member.warm
    start = time.perf_counter()
    output = member.engine.run(x)
    elapsed = (time.perf_counter() - start) * 1000
    if cold:
        member.first_inference_ms = elapsed
    return RunResult(output, elapsed, cold)
