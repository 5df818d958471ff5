"""The pool's one timer per request: queue wait reported, the wait deadline ends when an
interpreter takes the job, and the invoke's own deadline runs from that moment.

The pool reads a fake clock here, and its deadline checks run on fake timers on that clock
(tests/doubles/clock.py): the deadlines pass when the test moves time, after the events it waits for
(a job taken, an invoke started), and each check runs at its own moment of the fake clock, during the
test's `timers.advance()`; nothing waits for real time, so a slow machine changes nothing.
"""

import asyncio
import threading

import numpy as np
import pytest

from app.engines import TensorSpec
from app.errors import Busy, InvokeTimeout
from app.pool import EnginePool, InterpreterMember, Stage
from tests.doubles.clock import FakeClock, FakeTimers
from tests.pool_requests import run_in
from tests.waiting import turns_until


class SteppedEngineDouble:
    """Test double: the n-th run signals `started[n]` and holds until the test opens `gates[n]`;
    it then takes `seconds[n]` of the fake clock (default none)."""

    def __init__(self, clock: FakeClock, runs: int = 8, seconds=()):
        self.inputs = (TensorSpec("in", (1, 2), np.dtype(np.uint8), 1.0, 0),)
        self.outputs = self.inputs
        self.clock = clock
        self.started = [threading.Event() for _ in range(runs)]
        self.gates = [threading.Event() for _ in range(runs)]
        self.seconds = list(seconds) + [0.0] * (runs - len(seconds))
        self.runs = 0

    def run(self, inputs):
        n = self.runs
        self.runs += 1
        self.started[n].set()
        self.gates[n].wait(10)
        self.clock.advance(self.seconds[n])
        return list(inputs)

    async def wait_started(self, n: int) -> None:
        assert await asyncio.to_thread(self.started[n].wait, 10), f"run {n} never started"

    def open(self, n: int) -> None:
        self.gates[n].set()

    def close(self):
        for gate in self.gates:
            gate.set()


def pool_of(engine, timers: FakeTimers, wait_s=5.0, invoke_s=30.0) -> EnginePool:
    return EnginePool("t", [InterpreterMember(Stage(engine, 1.0))], max_waiting=8, wait_timeout_s=wait_s, retry_after_s=1,
                      invoke_timeout_s=invoke_s, clock=timers.clock, timers=lambda: timers)


X = np.zeros((1, 2), np.uint8)


def test_queue_wait_is_reported_for_the_request_that_waited():
    clock = FakeClock()
    engine = SteppedEngineDouble(clock, seconds=[0.05, 0.05])
    pool = pool_of(engine, FakeTimers(clock))

    async def two_at_once():
        runs = [asyncio.ensure_future(run_in(pool, [X])) for _ in range(2)]
        await engine.wait_started(0)
        await turns_until(lambda: pool.line.waiting == 1, "the second input in line")
        engine.open(0)
        engine.open(1)
        return await asyncio.gather(*runs)

    try:
        first, second = asyncio.run(two_at_once())
        assert first.queue_ms == 0.0  # taken at once
        assert second.queue_ms == pytest.approx(50.0)  # waited for the first's 50 ms invoke
        assert first.inference_ms == second.inference_ms == pytest.approx(50.0)
    finally:
        pool.close()


def test_an_invoke_longer_than_the_wait_deadline_is_not_refused_once_taken():
    clock = FakeClock()
    timers = FakeTimers(clock)
    engine = SteppedEngineDouble(clock)
    pool = pool_of(engine, timers, wait_s=0.1, invoke_s=5.0)

    async def scenario():
        request = asyncio.ensure_future(run_in(pool, [X]))
        await engine.wait_started(0)
        # three wait deadlines after it was queued, taken before the first: each check runs now, and a refusal
        # would settle the request with Busy before its invoke ends
        timers.advance(0.3)
        engine.open(0)
        return await request

    try:
        assert asyncio.run(scenario()).inference_ms == pytest.approx(300.0)
    finally:
        pool.close()


def test_a_job_never_taken_is_refused_at_the_wait_deadline_and_skipped():
    clock = FakeClock()
    timers = FakeTimers(clock)
    engine = SteppedEngineDouble(clock)
    pool = pool_of(engine, timers, wait_s=0.1, invoke_s=5.0)

    async def scenario():
        first = asyncio.ensure_future(run_in(pool, [X]))
        await engine.wait_started(0)  # the one interpreter is held
        second = asyncio.ensure_future(run_in(pool, [X]))
        await turns_until(lambda: pool.line.waiting == 1, "the second in line, behind it")
        timers.advance(0.1)  # its wait deadline
        with pytest.raises(Busy, match="no interpreter free within 0.1 s"):
            await second
        engine.open(0)
        await first
        third = asyncio.ensure_future(run_in(pool, [X]))  # in line after the refused one
        await engine.wait_started(1)
        engine.open(1)
        await third

    try:
        asyncio.run(scenario())
        assert engine.runs == 2  # the first and the third: the refused job was skipped, never run
        assert pool.line.admitted == 0
    finally:
        pool.close()


def test_the_invoke_deadline_runs_from_the_take_not_from_the_queueing():
    # the second request waits 0.15 s in line, then its invoke runs 0.1 s (0.25 s since it was queued,
    # over the 0.2 s limit, but within it since the take): not refused; at 0.25 s since the take it is
    clock = FakeClock()
    timers = FakeTimers(clock)
    engine = SteppedEngineDouble(clock)
    pool = pool_of(engine, timers, wait_s=5.0, invoke_s=0.2)

    async def scenario():
        first = asyncio.ensure_future(run_in(pool, [X]))
        await engine.wait_started(0)
        second = asyncio.ensure_future(run_in(pool, [X]))
        await turns_until(lambda: pool.line.waiting == 1, "the second in line")
        timers.advance(0.15)
        engine.open(0)
        await first
        await engine.wait_started(1)  # taken 0.15 s after it was queued
        timers.advance(0.1)  # its check at 0.2 s since the queueing finds it taken 0.1 s ago: not answered,
        assert timers.pending == 1 and not second.done()  # only checked again (at its invoke deadline)
        timers.advance(0.15)  # 0.25 s since the take
        with pytest.raises(InvokeTimeout, match="within 0.2 s"):
            await second
        engine.open(1)

    try:
        asyncio.run(scenario())
    finally:
        pool.close()


def test_an_invoke_taken_late_in_its_wait_still_times_out_at_its_own_limit():
    # the third request is taken at 0.8 s of its 3 s wait; its invoke hangs: the 0.5 s limit from
    # the take answers it, long before the wait deadline
    clock = FakeClock()
    timers = FakeTimers(clock)
    engine = SteppedEngineDouble(clock, seconds=[0.4, 0.4])
    pool = pool_of(engine, timers, wait_s=3.0, invoke_s=0.5)

    async def scenario():
        queued_at = clock()
        runs = [asyncio.ensure_future(run_in(pool, [X])) for _ in range(3)]
        for n in range(2):
            await engine.wait_started(n)
            engine.open(n)
            await runs[n]
        await engine.wait_started(2)
        timers.advance(0.5)  # taken at 0.8 s, now 1.3 s: its own limit, 1.7 s before its wait deadline
        with pytest.raises(InvokeTimeout):
            await runs[2]
        engine.open(2)
        return clock() - queued_at

    try:
        assert asyncio.run(scenario()) == pytest.approx(1.3)
    finally:
        pool.close()
