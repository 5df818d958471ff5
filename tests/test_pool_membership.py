"""Members join and leave a pool while it serves (TPUs plugged in and unplugged), and no request is lost:
one inside a device that leaves goes to another member, a line whose every device left goes to the pool
serving the model instead (hand_over) or is answered at once (refuse_waiting), a member on a new device
serves from the moment it is added.

The devices are UnpluggableEngineDouble, a TEST DOUBLE engine whose run() fails with DeviceGone once the
test unplugs it, as the Edge TPU engine's does (tests/test_edgetpu_hotplug.py runs the real one)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from app.engines import TensorSpec
from app.errors import Busy, DeviceGone
from app.pool.pipeline import Pipeline
from app.pool import EnginePool, InterpreterMember, Stage
from tests.pool_requests import run_in
from tests.waiting import turns_until

EVENTUALLY_S = 10
SPEC_SHAPE = (1, 2)


class UnpluggableEngineDouble:
    """TEST DOUBLE engine on a device that can be unplugged: run() answers with its device's number, or
    fails with DeviceGone once unplugged; with `hold` set, it waits in run() until the test lets it go."""

    def __init__(self, number: int):
        self.number = number
        self.device = f"tpu{number}"
        self.inputs = (TensorSpec("in", SPEC_SHAPE, np.dtype(np.uint8), 1.0, 0),)
        self.outputs = (TensorSpec("out", SPEC_SHAPE, np.dtype(np.uint8), 1.0, 0),)  # a pipeline's stages chain
        self.plugged = True
        self.hold = threading.Event()     # set: the next run waits in the device
        self.inside = threading.Event()   # set once a held run is inside
        self.release = threading.Event()
        self.runs = 0
        self.closed = threading.Event()

    def run(self, inputs):
        if self.hold.is_set():
            self.hold.clear()
            self.inside.set()
            self.release.wait(EVENTUALLY_S)
        if not self.plugged:
            raise DeviceGone(f"{self.device} is gone", device=self.device)
        self.runs += 1
        return [np.full(SPEC_SHAPE, self.number, np.uint8)]

    def close(self):
        self.closed.set()


def member(number: int) -> InterpreterMember:
    engine = UnpluggableEngineDouble(number)
    return InterpreterMember(Stage(engine, 1.0, device=engine.device))


def pool_of(*members: InterpreterMember, backend: str = "edgetpu", max_waiting: int = 8) -> EnginePool:
    return EnginePool(f"m/{backend}", list(members), max_waiting=max_waiting, wait_timeout_s=EVENTUALLY_S,
                      retry_after_s=2, backend=backend)


def x() -> np.ndarray:
    return np.zeros(SPEC_SHAPE, np.uint8)


def answered_by(result) -> int:
    return int(result.outputs[0][0, 0])


def test_a_request_inside_a_device_that_leaves_is_answered_by_another():
    first, second = member(0), member(1)
    pool = pool_of(first, second)
    first.engine.hold.set()

    async def scenario():
        inside = asyncio.ensure_future(run_in(pool, [x()]))
        await asyncio.to_thread(first.engine.inside.wait, EVENTUALLY_S)
        first.engine.plugged = False  # unplugged during its invoke
        first.engine.release.set()
        return await inside

    result = asyncio.run(scenario())
    assert answered_by(result) == 1 and result.backend == "edgetpu"
    assert not first.healthy and first.departed and "tpu0 not listed any more" in first.problem
    assert pool.members.unhealthy == [first] and not pool.members.departed
    first.threads[0].join(EVENTUALLY_S)  # its lane ended, closing its interpreter: the device is released
    assert first.engine.closed.is_set()


def test_a_member_that_leaves_while_idle_is_closed_and_admission_counts_the_others():
    first, second = member(0), member(1)
    pool = pool_of(first, second, max_waiting=0)
    assert pool.leave(first, "is gone: tpu0 not listed any more") and not pool.leave(first, "again")
    assert first.engine.closed.wait(EVENTUALLY_S)  # its idle lane was retired

    async def scenario():
        second.engine.hold.set()
        running = asyncio.ensure_future(run_in(pool, [x()]))
        await asyncio.to_thread(second.engine.inside.wait, EVENTUALLY_S)
        with pytest.raises(Busy, match="all 1 interpreters busy"):  # one healthy member, no waiting line
            pool.admit()
        second.engine.release.set()
        return await running

    assert answered_by(asyncio.run(scenario())) == 1


def test_a_member_added_while_serving_takes_requests():
    first = member(0)
    pool = pool_of(first)
    second = member(1)
    assert pool.add(second)
    first.engine.hold.set()

    async def scenario():
        held = asyncio.ensure_future(run_in(pool, [x()]))
        await asyncio.to_thread(first.engine.inside.wait, EVENTUALLY_S)
        other = await run_in(pool, [x()])  # the first is busy: the new member answers
        first.engine.release.set()
        return other, await held

    other, held = asyncio.run(scenario())
    assert (answered_by(other), answered_by(held)) == (1, 0)
    assert pool.members.interpreters == 2 and [m.device for m in pool.members] == ["tpu0", "tpu1"]


def test_a_departed_member_comes_back_replaced_and_serves():
    first = member(0)
    pool = pool_of(first)
    pool.leave(first, "is gone")
    fresh = member(0)
    assert pool.replace(first, fresh)
    assert pool.members == [fresh] and fresh.healthy and not fresh.departed
    assert answered_by(asyncio.run(run_in(pool, [x()]))) == 0


def test_when_every_device_left_the_line_waits_then_goes_to_the_successor():
    """A request admitted while every device is gone waits (bounded) in line instead of a 503, then the
    pool serving the model instead answers it, and says so (RunResult.backend)."""
    only = member(0)
    pool = pool_of(only)
    cpu = pool_of(member(7), backend="cpu")
    pool.leave(only, "is gone")
    assert pool.members.departed and only.engine.closed.wait(EVENTUALLY_S)  # its lane retired

    async def scenario():
        waiting = asyncio.ensure_future(run_in(pool, [x()]))  # admitted: every device left a moment ago
        await turns_until(lambda: pool.line.waiting == 1, "its input queued")
        assert pool.line.admitted == 1
        assert pool.hand_over(cpu) == 1
        handed = await waiting
        after = await run_in(pool, [x()])  # a place in the successor's line from now on
        return handed, after

    handed, after = asyncio.run(scenario())
    assert (answered_by(handed), handed.backend) == (7, "cpu")
    assert (answered_by(after), after.backend) == (7, "cpu")


def test_when_every_device_left_and_nothing_serves_instead_every_request_gets_a_503():
    only = member(0)
    pool = pool_of(only)
    pool.leave(only, "is gone")
    assert only.engine.closed.wait(EVENTUALLY_S)

    async def scenario():
        waiting = asyncio.ensure_future(run_in(pool, [x()]))
        await turns_until(lambda: pool.line.waiting == 1, "its input queued")
        assert pool.refuse_waiting("every edgetpu device left") == 1
        with pytest.raises(DeviceGone, match="every edgetpu device left") as refused:
            await waiting
        with pytest.raises(DeviceGone, match="every edgetpu device left") as at_admission:
            pool.admit()
        return refused.value, at_admission.value

    refused, at_admission = asyncio.run(scenario())
    assert refused.status == at_admission.status == 503 and refused.retry_after_s == 2
    fresh = member(0)
    assert pool.replace(only, fresh)  # a device is back: the line is open again
    assert answered_by(asyncio.run(run_in(pool, [x()]))) == 0


def test_a_request_whose_every_device_leaves_in_turn_is_answered_503_not_lost():
    members = [member(i) for i in range(4)]
    for m in members:
        m.engine.plugged = False
    pool = pool_of(*members)

    async def scenario():
        with pytest.raises(DeviceGone):
            await run_in(pool, [x()])

    asyncio.run(scenario())  # handed back MAX_HAND_BACKS times, then answered
    assert all(not m.healthy for m in members)


def test_a_pipeline_whose_segment_device_leaves_is_repaired_in_place_and_loses_no_request():
    """A segmented model on two TPUs: the second unplugged under a request, which waits in line while the
    pipeline is out (its first segment staying loaded), and is answered once that segment is re-created."""
    first, second = UnpluggableEngineDouble(0), UnpluggableEngineDouble(1)
    pipeline = Pipeline("m/edgetpu", [Stage(first, 1.0, device="tpu0", index=0),
                                      Stage(second, 1.0, device="tpu1", index=1)])
    pool = pool_of(pipeline)
    second.plugged = False
    back = UnpluggableEngineDouble(1)

    async def scenario():
        request = asyncio.ensure_future(run_in(pool, [x()]))
        await asyncio.to_thread(lambda: pool.wait_until(lambda: not pipeline.healthy, EVENTUALLY_S))
        assert pipeline.departed and "tpu1 not listed any more" in pipeline.problem and not request.done()
        renewed = pipeline.renew(lambda stage: Stage(back, 1.0, device=stage.device, index=stage.index))
        assert renewed is pipeline and pool.replace(pipeline, renewed)
        return await request

    result = asyncio.run(scenario())
    assert answered_by(result) == 1 and back.runs == 1
    assert pipeline.stages[0].engine is first and first.runs == 2  # kept loaded: its segment ran again
    pool.close()
