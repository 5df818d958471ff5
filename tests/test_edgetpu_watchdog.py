"""The watchdog: an invoke that hangs (as USB Accelerators do until they reset) takes its
device out of the pool, a background thread re-creates it, readiness says so meanwhile.

The hanging device is HangingEngineDouble, a TEST DOUBLE engine whose run() blocks until
the test lets it go; nothing here needs a TPU.
"""

import asyncio
import io
import threading

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from app.engines import Backend, TensorSpec, register, unregister
from app.errors import Busy, DeviceHung
from app.main import create_app
from app.api.deps import service_of
from app.pool import EnginePool, InterpreterMember, Stage, Watchdog
from app.registry import Registry
from app.settings import Settings
from tests.conftest import DEFAULT_MODEL, MODELS
from tests.doubles.clock import FakeClock, FakeTimers
from tests.pool_requests import run_in

WATCHDOG_S = 0.3
RETRY_S = 0.05
EVENTUALLY_S = 10


class HangingEngineDouble:
    """TEST DOUBLE of an engine on a TPU that can hang: run() blocks while `hang` is set."""

    key = "hanging"
    model_file = "int8"
    created: list["HangingEngineDouble"] = []
    hang_next = threading.Event()  # the next run() of any instance hangs
    fail_loads = 0                 # that many load() calls fail first (a device still resetting)

    def __init__(self):
        self.inputs = (TensorSpec("in", (1, 224, 224, 3), np.dtype(np.uint8), 1 / 128, 127),)
        self.outputs = (TensorSpec("out", (1, 1000), np.dtype(np.uint8), 1 / 256, 0),)
        self.released = threading.Event()
        self.hanging = threading.Event()
        self.closed = False
        HangingEngineDouble.created.append(self)

    @classmethod
    def load(cls, path, options):
        if cls.fail_loads:
            cls.fail_loads -= 1
            raise RuntimeError("device not listed yet")
        return cls()

    def run(self, inputs):
        if HangingEngineDouble.hang_next.is_set():
            HangingEngineDouble.hang_next.clear()
            self.hanging.set()
            self.released.wait(EVENTUALLY_S)
        return [np.zeros(self.outputs[0].shape, np.uint8)]

    def close(self):
        self.closed = True


class HangingBackendDouble(Backend):
    """TEST DOUBLE plug-in: HangingEngineDouble interpreters, registered from outside the product list."""

    key = HangingEngineDouble.key
    engine = HangingEngineDouble


@pytest.fixture(autouse=True)
def fresh_double():
    HangingEngineDouble.created = []
    HangingEngineDouble.hang_next.clear()
    HangingEngineDouble.fail_loads = 0
    register(HangingBackendDouble)
    yield
    unregister(HangingBackendDouble.key)
    for engine in HangingEngineDouble.created:
        engine.released.set()


def eventually(pool: EnginePool, condition, what: str):
    """Wait for a health change of the pool that makes condition() true: woken by the pool, no polling."""
    if not pool.wait_until(condition, EVENTUALLY_S):
        raise AssertionError(f"not within {EVENTUALLY_S} s: {what}")


def pool_of(n: int, recreate_gate: threading.Event | None = None, timers: FakeTimers | None = None) -> EnginePool:
    """With a gate, re-creation waits until the test opens it: what the test asserts about the
    unhealthy state cannot race a recovery that a fast machine finishes first. With fake timers (on a fake
    clock), an invoke outlives the watchdog's timeout when the test moves time, not by the machine's pace;
    without, the pool keeps real time."""

    def reload(old: Stage) -> Stage:
        if recreate_gate is not None:
            recreate_gate.wait(EVENTUALLY_S)
        return Stage(HangingEngineDouble.load(None, None), 1.0, device=old.device)

    members = [InterpreterMember(Stage(HangingEngineDouble(), 1.0, device=f"tpu{i}")) for i in range(n)]
    watchdog = Watchdog(WATCHDOG_S, reload, RETRY_S)
    on_fake_time = {} if timers is None else {"clock": timers.clock, "timers": lambda: timers}
    return EnginePool("m/hanging", members, max_waiting=4, wait_timeout_s=5, retry_after_s=1, watchdog=watchdog,
                      **on_fake_time)


def test_a_hung_invoke_takes_its_device_out_and_it_comes_back_re_created():
    recreate_gate = threading.Event()
    timers = FakeTimers(FakeClock())
    pool = pool_of(2, recreate_gate, timers)
    first, second = pool.members
    x = np.zeros((1, 224, 224, 3), np.uint8)

    async def scenario():
        HangingEngineDouble.hang_next.set()
        request = asyncio.ensure_future(run_in(pool, [x]))
        await asyncio.to_thread(first.engine.hanging.wait, EVENTUALLY_S)
        assert not request.done() and first.healthy  # hanging, within the watchdog's time
        timers.advance(WATCHDOG_S)
        with pytest.raises(DeviceHung, match=r"tpu0 did not finish an invoke within 0.3 s \(watchdog\)") as hung:
            await request
        assert hung.value.retry_after_s == 1
        assert not first.healthy and pool.members.unhealthy == [first]
        served = await run_in(pool, [x])  # the other TPU still serves
        recreate_gate.set()
        await asyncio.to_thread(eventually, pool, lambda: pool.members[0] is not first, "the hung member is replaced")
        return served

    served = asyncio.run(scenario())
    assert served.outputs[0].shape == (1, 1000)
    fresh = pool.members[0]
    assert fresh.healthy and fresh.device == "tpu0" and fresh.warm  # re-created and warmed up
    assert fresh.engine is not first.engine and pool.members[1] is second
    assert not first.engine.closed  # its invoke still hangs: nothing can close it yet
    first.engine.released.set()
    first.threads[0].join(EVENTUALLY_S)  # its thread ends once the invoke returns, closing the engine
    assert first.engine.closed


def test_a_hang_whose_client_has_gone_still_takes_the_device_out():
    """Clients often give up sooner than the watchdog: the hang is the device's, not the request's."""
    recreate_gate = threading.Event()
    timers = FakeTimers(FakeClock())
    pool = pool_of(1, recreate_gate, timers)
    (only,) = pool.members
    x = np.zeros((1, 224, 224, 3), np.uint8)

    async def scenario():
        HangingEngineDouble.hang_next.set()
        request = asyncio.ensure_future(run_in(pool, [x]))
        await asyncio.to_thread(only.engine.hanging.wait, EVENTUALLY_S)
        request.cancel()  # the client leaves mid-invoke
        with pytest.raises(asyncio.CancelledError):
            await request
        assert only.healthy
        timers.advance(WATCHDOG_S)  # the loop runs on; the watchdog's deadline passes
        await asyncio.to_thread(eventually, pool, lambda: not only.healthy, "taken out by the watchdog")
        assert "watchdog" in only.problem
        recreate_gate.set()
        await asyncio.to_thread(eventually, pool, lambda: pool.members[0] is not only, "re-created")
        return await run_in(pool, [x])

    assert asyncio.run(scenario()).outputs[0].shape == (1, 1000)


def test_an_invoke_that_ends_after_its_client_left_leaves_the_device_healthy():
    timers = FakeTimers(FakeClock())
    pool = pool_of(1, timers=timers)
    (only,) = pool.members
    x = np.zeros((1, 224, 224, 3), np.uint8)

    async def scenario():
        HangingEngineDouble.hang_next.set()
        request = asyncio.ensure_future(run_in(pool, [x]))
        await asyncio.to_thread(only.engine.hanging.wait, EVENTUALLY_S)
        request.cancel()  # the client leaves mid-invoke
        with pytest.raises(asyncio.CancelledError):
            await request
        only.engine.released.set()  # the invoke returns within the watchdog's time
        served = await run_in(pool, [x])  # the one interpreter is past that invoke
        assert timers.pending == 1  # the left request's check, watching its invoke
        timers.advance(WATCHDOG_S * 2)  # it runs: the invoke has ended, nothing to take out
        return served

    assert asyncio.run(scenario()).outputs[0].shape == (1, 1000)
    assert only.healthy and pool.members == [only]


def test_a_request_refused_late_whose_client_left_puts_no_device_out():
    """Refused as too late under overload by the interpreter's lane that took it, its client leaving while the
    refusal is on its way: no invoke ran, so the watchdog has nothing to watch. (The image step refuses before a job
    exists: tests/test_core_images.py.)"""
    timers = FakeTimers(FakeClock())
    pool = pool_of(1, timers=timers)
    pool.deadlines.wait_timeout_s = WATCHDOG_S  # both of its deadlines pass when the test moves time
    refusing, go_on = threading.Event(), threading.Event()
    late = [True]

    def slow_refusal(since, now):  # the lane has claimed the job; the refusal waits until its client left
        if not late[0]:
            return None
        late[0] = False
        refusing.set()
        go_on.wait(EVENTUALLY_S)
        return Busy("overloaded", 1)
    pool.line.too_late = slow_refusal
    (only,) = pool.members
    x = np.zeros((1, 224, 224, 3), np.uint8)
    errors = []

    async def scenario():
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
        request = asyncio.ensure_future(run_in(pool, [x]))
        await asyncio.to_thread(refusing.wait, EVENTUALLY_S)
        request.cancel()  # the client leaves
        with pytest.raises(asyncio.CancelledError):
            await request
        go_on.set()
        # the lane answers the refusal, then takes the next request: its refusal has reached the loop before this
        # answer; then both deadlines of the left request pass
        served = await run_in(pool, [x])
        timers.advance(WATCHDOG_S * 3)
        return served

    assert asyncio.run(scenario()).outputs[0].shape == (1, 1000)
    assert only.healthy and pool.members == [only] and errors == []


def test_with_every_device_hung_requests_fail_fast_until_one_is_back():
    recreate_gate = threading.Event()
    pool = pool_of(1, recreate_gate)
    (only,) = pool.members
    HangingEngineDouble.fail_loads = 3  # the device takes a few attempts to come back
    x = np.zeros((1, 224, 224, 3), np.uint8)

    async def scenario():
        HangingEngineDouble.hang_next.set()
        with pytest.raises(DeviceHung):
            await run_in(pool, [x])
        with pytest.raises(DeviceHung, match="every device is unhealthy"):
            pool.admit()  # refused at admission, before any waiting on a device that is not there
        recreate_gate.set()
        await asyncio.to_thread(eventually, pool, lambda: pool.members[0] is not only, "re-created")
        return await run_in(pool, [x])

    assert not asyncio.run(scenario()).cold
    assert "re-creating it failed (attempt 3: device not listed yet)" in only.problem


def test_readiness_reflects_the_hung_device(tmp_path):
    settings = Settings(model_dir=MODELS, backends=["hanging"], watchdog_backends=["hanging"], workers=1,
                        watchdog_timeout_s=WATCHDOG_S, watchdog_retry_s=RETRY_S, models=[DEFAULT_MODEL])
    registry = Registry(settings)
    registry.configure()
    registry.load_all()
    assert registry.ready()
    pool = registry.get(DEFAULT_MODEL).pool("hanging")
    HangingEngineDouble.fail_loads = 1000  # stays down until the test says so

    async def hang():
        HangingEngineDouble.hang_next.set()
        with pytest.raises(DeviceHung):
            await run_in(pool, [np.zeros((1, 224, 224, 3), np.uint8)])

    try:
        asyncio.run(hang())
        status = registry.status(DEFAULT_MODEL)
        assert not registry.ready() and status.state == "unhealthy"
        assert "hanging: interpreter" in status.error and "watchdog" in status.error
        HangingEngineDouble.fail_loads = 0
        eventually(pool, registry.ready, "ready again once the device is re-created")
        assert registry.status(DEFAULT_MODEL).error is None
    finally:
        registry.close()  # also stops a re-creation still trying


def test_readyz_over_http():
    settings = Settings(model_dir=MODELS, backends=["hanging"], watchdog_backends=["hanging"], workers=1,
                        watchdog_timeout_s=WATCHDOG_S, watchdog_retry_s=RETRY_S, models=[DEFAULT_MODEL])
    app = create_app(settings)
    with TestClient(app) as client:
        registry = service_of(app).registry
        assert registry.wait_loaded(EVENTUALLY_S) and client.get("/readyz").status_code == 200
        HangingEngineDouble.fail_loads = 1000
        HangingEngineDouble.hang_next.set()
        buffer = io.BytesIO()
        Image.new("RGB", (64, 48), (200, 100, 50)).save(buffer, "PNG")
        hung = client.post("/v1/classify", content=buffer.getvalue(), headers={"Content-Type": "image/png"})
        assert hung.status_code == 503 and hung.headers["Retry-After"] == "1"
        assert "watchdog" in hung.json()["error"]
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["models"][DEFAULT_MODEL]["state"] == "unhealthy"
        HangingEngineDouble.fail_loads = 0
        pool = registry.get(DEFAULT_MODEL).pool("hanging")
        eventually(pool, lambda: not pool.members.unhealthy, "re-created")
        assert client.get("/readyz").status_code == 200
