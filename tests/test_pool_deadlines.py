"""The pool's one timer per request: queue wait reported, the wait deadline ends when an
interpreter takes the job, and the invoke's own deadline runs from that moment."""

import asyncio
import threading
import time

import numpy as np
import pytest

from app.engines import TensorSpec
from app.errors import Busy, InvokeTimeout
from app.pool import EnginePool, Member


class SleepingEngineDouble:
    """Test double: an engine whose run() takes `seconds` (the GIL released, as a device's invoke)."""

    def __init__(self, seconds: float):
        self.input = TensorSpec("in", (1, 2), np.dtype(np.uint8), 1.0, 0)
        self.output = self.input
        self.seconds = seconds
        self.runs = 0
        self.lock = threading.Lock()

    def run(self, x):
        with self.lock:
            self.runs += 1
        time.sleep(self.seconds)
        return x

    def close(self):
        pass


def pool_of(engine, wait_s=5.0, invoke_s=30.0) -> EnginePool:
    return EnginePool("t", [Member(engine, 1.0)], max_waiting=8, wait_timeout_s=wait_s, retry_after_s=1,
                      invoke_timeout_s=invoke_s)


X = np.zeros((1, 2), np.uint8)


def test_queue_wait_is_reported_for_the_request_that_waited():
    pool = pool_of(SleepingEngineDouble(0.05))

    async def two_at_once():
        return await asyncio.gather(pool.run(X), pool.run(X))

    first, second = asyncio.run(two_at_once())
    waits = sorted([first.queue_ms, second.queue_ms])
    assert 0 <= waits[0] < 40 and waits[1] >= 40  # the second waited for the first's 50 ms invoke
    pool.close()


def test_an_invoke_longer_than_the_wait_deadline_is_not_refused_once_taken():
    pool = pool_of(SleepingEngineDouble(0.3), wait_s=0.1, invoke_s=5.0)
    result = asyncio.run(pool.run(X))
    assert result.inference_ms >= 290
    pool.close()


def test_a_job_never_taken_is_refused_at_the_wait_deadline_and_skipped():
    engine = SleepingEngineDouble(0.4)
    pool = pool_of(engine, wait_s=0.1, invoke_s=5.0)

    async def scenario():
        first = asyncio.create_task(pool.run(X))
        await asyncio.sleep(0.02)
        start = time.monotonic()
        with pytest.raises(Busy):
            await pool.run(X)
        waited = time.monotonic() - start
        await first
        return waited

    waited = asyncio.run(scenario())
    assert 0.09 <= waited < 0.3
    time.sleep(0.05)
    assert engine.runs == 1  # the refused job was skipped, never run
    pool.close()


def test_the_invoke_deadline_runs_from_the_take_not_from_the_queueing():
    pool = pool_of(SleepingEngineDouble(0.5), wait_s=5.0, invoke_s=0.2)

    async def scenario():
        start = time.monotonic()
        with pytest.raises(InvokeTimeout):
            await pool.run(X)
        return time.monotonic() - start

    assert 0.19 <= asyncio.run(scenario()) < 0.45
    pool.close()


class ScriptedEngineDouble:
    """Test double: run() takes the next of the given durations (s)."""

    def __init__(self, durations):
        self.input = TensorSpec("in", (1, 2), np.dtype(np.uint8), 1.0, 0)
        self.output = self.input
        self.durations = list(durations)

    def run(self, x):
        time.sleep(self.durations.pop(0))
        return x

    def close(self):
        pass


def test_an_invoke_taken_late_in_its_wait_still_times_out_at_its_own_limit():
    # the third request is taken at ~0.8 s of its 3 s wait; its invoke hangs: the 0.5 s limit from
    # the take answers it at ~1.3 s, not at the wait deadline
    pool = pool_of(ScriptedEngineDouble([0.01, 0.4, 0.4, 4.0]), wait_s=3.0, invoke_s=0.5)

    async def scenario():
        await pool.run(X)  # the cold first run
        start = time.monotonic()
        runs = [asyncio.ensure_future(pool.run(X)) for _ in range(3)]
        await runs[0], await runs[1]
        with pytest.raises(InvokeTimeout):
            await runs[2]
        return time.monotonic() - start

    try:
        assert asyncio.run(scenario()) < 1.6
    finally:
        pool.close()
