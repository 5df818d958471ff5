import asyncio
import contextlib
import os
import threading

import numpy as np
import pytest

from app.engines import EngineOptions, TensorSpec
from app.engines.cpu import CpuEngine
from app.errors import Busy, InvokeTimeout
from app.model_dir.reading import read_model_dir
from app.pool import OVERLOAD_HOLD_S, EnginePool, InterpreterMember, Stage
from tests.conftest import DEFAULT_MODEL, MODELS
from tests.doubles.clock import FakeClock
from tests.pool_requests import run_in
from tests.thread_nice import linux_only, this_thread
from tests.waiting import turns_until, until


class GatedEngineDouble:
    """Test double: an engine whose run() blocks until the test opens a gate."""

    def __init__(self):
        self.inputs = (TensorSpec("in", (1, 2), np.dtype(np.uint8), 1.0, 0),)
        self.outputs = self.inputs
        self.gate = threading.Event()
        self.started = threading.Event()

    def run(self, inputs):
        self.started.set()
        self.gate.wait(10)
        return list(inputs)

    def close(self):
        pass


def pool_of(engine, max_waiting=0, timeout=5.0, invoke_timeout=30.0, max_queue_ms=0.0, clock=None) -> EnginePool:
    return EnginePool("t", [InterpreterMember(Stage(engine, 1.0))], max_waiting=max_waiting, wait_timeout_s=timeout, retry_after_s=2,
                      invoke_timeout_s=invoke_timeout, max_queue_ms=max_queue_ms,
                      **({"clock": clock} if clock else {}))


def test_real_engine_first_run_is_cold_then_warm():
    path = read_model_dir(MODELS / DEFAULT_MODEL).file("int8")
    engine = CpuEngine.load(path, EngineOptions())
    pool = pool_of(engine)
    x = np.full(engine.inputs[0].shape, 127, np.uint8)

    async def two_runs():
        return await run_in(pool, [x]), await run_in(pool, [x])

    first, second = asyncio.run(two_runs())
    assert first.cold and not second.cold
    assert pool.members.first_inference_ms == first.inference_ms > 0
    assert np.array_equal(first.outputs[0], second.outputs[0])  # the same input, the same answer
    assert first.outputs[0].shape == (1, 1000)


def test_full_line_is_refused_at_once_with_retry_after():
    engine = GatedEngineDouble()
    pool = pool_of(engine, max_waiting=0)
    x = np.zeros((1, 2), np.uint8)

    async def scenario():
        running = asyncio.create_task(run_in(pool, [x]))
        await asyncio.to_thread(engine.started.wait, 5)
        with pytest.raises(Busy) as refused:
            await run_in(pool, [x])
        engine.gate.set()
        await running
        return refused.value

    error = asyncio.run(scenario())
    assert error.retry_after_s == 2 and "busy" in str(error)


def test_the_room_is_checked_once_by_check_room_and_once_by_admit_which_alone_takes_a_place():
    """check_room() (before a body) takes nothing; admit() checks the same room once and takes a place, or
    refuses at once: neither hides a second check, so a request checked at its head and admitted once its
    body is here meets the line's rule exactly twice."""
    pool = pool_of(GatedEngineDouble(), max_waiting=1)  # room for 1 running + 1 waiting
    checks = []
    refuse_if_full = pool.line.refuse_if_full

    def counted(healthy):
        checks.append(healthy)
        refuse_if_full(healthy)
    pool.line.refuse_if_full = counted
    try:
        pool.check_room()
        assert (len(checks), pool.line.admitted) == (1, 0)
        places = [pool.admit(), pool.admit()]
        assert (len(checks), pool.line.admitted) == (3, 2)
        with pytest.raises(Busy):
            pool.check_room()
        with pytest.raises(Busy):
            pool.admit()
        assert (len(checks), pool.line.admitted) == (5, 2)
        for place in places:
            place.release()
            place.release()  # a place is given back once, however often released
        assert pool.line.admitted == 0
    finally:
        pool.close()


def test_waiting_request_times_out():
    engine = GatedEngineDouble()
    pool = pool_of(engine, max_waiting=1, timeout=0.2)
    x = np.zeros((1, 2), np.uint8)

    async def scenario():
        running = asyncio.create_task(run_in(pool, [x]))
        await asyncio.to_thread(engine.started.wait, 5)
        with pytest.raises(Busy, match="within 0.2 s"):
            await run_in(pool, [x])
        engine.gate.set()
        await running

    asyncio.run(scenario())


def test_waiting_request_gets_the_interpreter_when_freed():
    engine = GatedEngineDouble()
    pool = pool_of(engine, max_waiting=1, timeout=5)
    x = np.ones((1, 2), np.uint8)

    async def scenario():
        first = asyncio.create_task(run_in(pool, [x]))
        await asyncio.to_thread(engine.started.wait, 5)
        second = asyncio.create_task(run_in(pool, [x]))
        await turns_until(lambda: pool.line.admitted == 2, "the second request's place in line")
        engine.gate.set()
        return await first, await second

    a, b = asyncio.run(scenario())
    assert a.cold and not b.cold


def test_an_invoke_past_its_deadline_is_answered_with_invoke_timeout():
    engine = GatedEngineDouble()  # no watchdog (as cpu): the deadline still holds
    pool = pool_of(engine, invoke_timeout=0.2)
    x = np.zeros((1, 2), np.uint8)

    async def scenario():
        with pytest.raises(InvokeTimeout, match="within 0.2 s") as late:
            await run_in(pool, [x])
        engine.gate.set()
        return late.value

    assert asyncio.run(scenario()).retry_after_s == 2
    assert pool.line.admitted == 0  # the place was given back


def test_a_closed_pool_refuses_at_once_and_its_thread_closes_the_engine():
    engine = GatedEngineDouble()
    engine.closed = False
    engine.close = lambda: setattr(engine, "closed", True)
    pool = pool_of(engine, max_waiting=4)
    pool.close()
    with pytest.raises(Busy):
        pool.admit()
    assert pool.members.join(5) and engine.closed


def test_the_input_reaches_the_engine_byte_identical_and_the_output_comes_back():
    engine = GatedEngineDouble()
    engine.gate.set()
    pool = pool_of(engine)
    x = np.arange(2, dtype=np.uint8).reshape(1, 2)
    result = asyncio.run(run_in(pool, [x]))
    assert result.outputs[0] is x  # the very array: no copy, no conversion on the way


def test_a_request_cancelled_while_waiting_is_skipped_by_the_interpreter():
    engine = GatedEngineDouble()
    pool = pool_of(engine, max_waiting=1)
    x = np.zeros((1, 2), np.uint8)
    runs = []
    engine_run = engine.run
    engine.run = lambda x: runs.append(x) or engine_run(x)

    async def scenario():
        first = asyncio.create_task(run_in(pool, [x]))
        await asyncio.to_thread(engine.started.wait, 5)
        second = asyncio.create_task(run_in(pool, [x]))
        await turns_until(lambda: pool.line.admitted == 2, "the second request's place in line")
        second.cancel()  # the client went away while in line
        with contextlib.suppress(asyncio.CancelledError):
            await second  # the cancellation has reached the pool before the interpreter is free
        engine.gate.set()
        await first
        return await run_in(pool, [x])  # served next: the cancelled job was skipped, not run

    asyncio.run(scenario())
    assert len(runs) == 2 and pool.line.admitted == 0


def test_busy_and_waiting_count_invokes_under_way_and_inputs_not_yet_taken():
    """The public gauges /metrics reads (pool_interpreters_busy, pool_queue_depth)."""
    engine = GatedEngineDouble()
    pool = pool_of(engine, max_waiting=1, timeout=5)
    x = np.ones((1, 2), np.uint8)

    async def scenario():
        assert (pool.busy, pool.line.waiting) == (0, 0)
        first = asyncio.create_task(run_in(pool, [x]))
        await asyncio.to_thread(engine.started.wait, 5)
        second = asyncio.create_task(run_in(pool, [x]))
        await turns_until(lambda: pool.line.waiting == 1, "the second input in line")
        during = pool.busy, pool.line.waiting
        engine.gate.set()
        await first, await second
        return during

    assert asyncio.run(scenario()) == (1, 1)
    assert (pool.busy, pool.line.waiting) == (0, 0)


class TimedEngineDouble:
    """Test double: an engine whose every run takes `seconds` of a fake clock (and no real time)."""

    def __init__(self, seconds: float, clock: FakeClock):
        self.inputs = (TensorSpec("in", (1, 2), np.dtype(np.uint8), 1.0, 0),)
        self.outputs = self.inputs
        self.seconds = seconds
        self.clock = clock

    def run(self, inputs):
        self.clock.advance(self.seconds)
        return list(inputs)

    def close(self):
        pass


def test_inputs_made_on_another_thread_are_queued_by_that_thread_and_its_failure_is_the_requests():
    """Place.run with a concurrent Future of the inputs (an image thread's, in the service): the thread that makes
    them queues the job (no hop through the event loop); a failure that made none reaches the request, and inputs
    that are never made (their request gone) queue nothing."""
    from concurrent.futures import Future

    engine = GatedEngineDouble()
    engine.gate.set()
    pool = pool_of(engine, max_waiting=2)
    queued_by = []
    put = pool.put
    pool.put = lambda job: queued_by.append(threading.current_thread().name) or put(job)

    def make(made, value):
        if value is None:
            made.set_exception(ValueError("not an image"))
        else:
            made.set_result([np.array([[value, 9]], np.uint8)])

    async def scenario():
        made = Future()
        with pool.admit() as place:
            running = asyncio.ensure_future(place.run(made))
            await asyncio.sleep(0)  # its job waits for its inputs, in no line
            assert pool.line.waiting == 0 and not running.done()
            maker = threading.Thread(target=make, args=(made, 7), name="maker")
            maker.start()
            result = await running
        failed = Future()
        with pool.admit() as place:
            threading.Thread(target=make, args=(failed, None)).start()
            with pytest.raises(ValueError, match="not an image"):
                await place.run(failed)
        gone = Future()
        with pool.admit() as place:
            given_up = asyncio.ensure_future(place.run(gone))
            await asyncio.sleep(0)
            given_up.cancel()
            gone.cancel()  # never made: its request gave up before its turn
            with pytest.raises(asyncio.CancelledError):
                await given_up
        return result

    try:
        result = asyncio.run(scenario())
        assert result.outputs[0].tolist() == [[7, 9]] and queued_by == ["maker"]
        assert pool.line.waiting == 0 and pool.line.admitted == 0
    finally:
        pool.close()


def test_under_overload_the_line_is_bounded_by_time_and_until_then_by_count_only():
    clock = FakeClock()
    engine = TimedEngineDouble(0.02, clock)  # 20 ms an invoke on the pool's clock, one interpreter
    pool = pool_of(engine, max_waiting=4, max_queue_ms=50, clock=clock)
    x = np.zeros((1, 2), np.uint8)

    async def scenario():
        for _ in range(3):  # the pool learns its invoke time (the first run is cold, not counted)
            assert (await run_in(pool, [x])).inference_ms == pytest.approx(20.0)
        held = [pool.admit() for _ in range(5)]  # not overloaded: the whole line of 1 + 4, 100 ms deep
        assert not pool.line.overloaded
        with pytest.raises(Busy, match="4 requests already waiting"):
            pool.admit()  # the line overflows: the pool is overloaded from now
        assert pool.line.overloaded
        for place in held[2:]:
            place.release()  # 1 running + 1 ahead: a new one would wait 2 x 20 ms
        extra = pool.admit()
        with pytest.raises(Busy, match="overloaded.*~60 ms.*MAX_QUEUE_MS 50"):
            pool.admit()  # 3 x 20 ms ahead: within the count, over the time bound
        extra.release()
        held[1].release()
        clock.advance(OVERLOAD_HOLD_S + 0.001)  # no refusal for OVERLOAD_HOLD_S: no longer overloaded
        assert not pool.line.overloaded
        more = [pool.admit() for _ in range(4)]  # by count only again
        for place in more + held[:1]:
            place.release()

    try:
        asyncio.run(scenario())
        assert pool.line.admitted == 0
    finally:
        pool.close()


def test_under_overload_a_request_that_waited_past_max_queue_ms_is_refused_when_its_turn_comes():
    clock = FakeClock()
    engine = GatedEngineDouble()
    pool = pool_of(engine, max_waiting=2, max_queue_ms=30, clock=clock)
    x = np.zeros((1, 2), np.uint8)

    async def scenario():
        first = asyncio.ensure_future(run_in(pool, [x]))  # runs, held at the gate
        await asyncio.to_thread(engine.started.wait, 5)
        late = asyncio.ensure_future(run_in(pool, [x]))   # joins the line before any overload
        await turns_until(lambda: pool.line.waiting == 1, "its task's place taken and its input queued")
        assert pool.line.admitted == 2
        third = pool.admit()  # the line of 1 + 2 is full
        with pytest.raises(Busy):
            pool.admit()  # and overflows: overloaded from now
        third.release()
        clock.advance(0.060)  # `late` has now waited 60 ms, past the 30 ms bound
        engine.gate.set()
        assert (await first).outputs[0].shape == (1, 2)
        with pytest.raises(Busy, match="waited .* ms in line"):
            await late

    try:
        asyncio.run(scenario())
        assert pool.line.admitted == 0
    finally:
        pool.close()


class ThreadNotingEngineDouble(GatedEngineDouble):
    """Test double: a gated engine that notes the thread each run ran on (its name and nice value, from /proc)."""

    def __init__(self):
        super().__init__()
        self.gate.set()
        self.ran_on: list[tuple[str, int]] = []

    def run(self, inputs):
        self.ran_on.append(this_thread())
        return super().run(inputs)


def runs_around_an_overload(thread_nice: int) -> tuple[ThreadNotingEngineDouble, bool]:
    """Through a pool of one interpreter: a run, a run taken before a refusal for want of room, two runs while the pool
    is overloaded, one after it has refused nobody for the hold. The engine, and whether every lane's thread and
    the threads below them ended once the pool closed."""
    clock = FakeClock()
    engine = ThreadNotingEngineDouble()
    pool = EnginePool("nice", [InterpreterMember(Stage(engine, 1.0))], max_waiting=0, wait_timeout_s=5, retry_after_s=2,
                      thread_nice=thread_nice, clock=clock)
    x = np.zeros((1, 2), np.uint8)

    async def scenario():
        await run_in(pool, [x])
        engine.gate.clear()
        engine.started.clear()
        running = asyncio.ensure_future(run_in(pool, [x]))
        await asyncio.to_thread(engine.started.wait, 5)
        with pytest.raises(Busy):
            pool.admit()  # the line overflows: overloaded from now
        engine.gate.set()
        await running
        assert pool.line.overloaded
        await run_in(pool, [x])
        await run_in(pool, [x])
        clock.advance(OVERLOAD_HOLD_S + 0.001)
        assert not pool.line.overloaded
        await run_in(pool, [x])

    try:
        asyncio.run(scenario())
    finally:
        pool.close()
    ended = pool.members.join(10) and until(
        lambda: not any(t.name.startswith("pool-nice-") for t in threading.enumerate()), 10,
        "the lanes' threads, and the threads below them, to end")
    return engine, ended


@linux_only
def test_a_cpu_interpreter_runs_at_the_process_priority_and_below_it_only_while_its_line_is_overloaded():
    """thread_nice (COMPUTE_NICE for a backend on the host's cores, app/threads.py): the lane's own thread at the
    process's priority, level with any other process; its runs on a thread that many nice steps below while the pool
    is overloaded (the loop refusing), and back on the lane's thread once it has refused nobody for the hold."""
    engine, ended = runs_around_an_overload(thread_nice=5)
    process = os.getpriority(os.PRIO_PROCESS, 0)
    lane, below = ("pool-nice-0", process), ("pool-nice-0-below", min(19, process + 5))
    assert engine.ran_on == [lane, lane, below, below, lane]
    assert ended


@linux_only
def test_without_thread_nice_a_lane_runs_every_invoke_itself_overloaded_or_not():
    engine, ended = runs_around_an_overload(thread_nice=0)
    assert engine.ran_on == [("pool-nice-0", os.getpriority(os.PRIO_PROCESS, 0))] * 5
    assert ended
