"""The core's image step (app/core/images.py, app/core/runs.py): an image is decoded and preprocessed on an image
thread once its request holds its place in line, and its tensor goes through the ticket (Ticket.run), the pool's one
run, queued by the image thread that made it: the pool never sees the image or the work on it. A request that gave
up while it waited for an image thread costs no decoding, and one whose place waited too long (an overloaded line's
bound by time, the wait deadline) is refused without it, and nothing reaches the line.

The model is the committed classifier's directory and tensors; its interpreter is RecordingEngineDouble, a TEST
DOUBLE that records what it ran and where, on a pool whose clock the tests move (tests/doubles/clock.py)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

import app.core.images as image_step
from app.core import Core, ImageInput, ImageWork
from app.engines import EngineOptions
from app.engines.cpu import CpuEngine
from app.errors import Busy, RequestError
from app.model_dir.reading import read_model_dir
from app.pool import EnginePool, InterpreterMember, Stage
from app.registry import ModelVersion, Ticket
from app.tasks.classify import TASK as CLASSIFY
from tests.conftest import DEFAULT_MODEL, MODELS
from tests.doubles.clock import FakeClock
from tests.waiting import turns_until

EVENTUALLY_S = 10
MODEL_DIR = read_model_dir(MODELS / DEFAULT_MODEL)
_real = CpuEngine.load(MODEL_DIR.file("int8"), EngineOptions())
INPUTS, OUTPUTS = _real.inputs, _real.outputs  # the committed model's tensors
_real.close()


class RecordingEngineDouble:
    """TEST DOUBLE of the model's interpreter: records each input it ran and the thread it ran on; answers zeros."""

    def __init__(self):
        self.inputs, self.outputs = INPUTS, OUTPUTS
        self.ran: list[tuple[np.ndarray, str]] = []

    def run(self, inputs):
        self.ran.append((inputs[0], threading.current_thread().name))
        return [np.zeros(spec.shape, spec.dtype) for spec in self.outputs]

    def close(self):
        pass


class GatedDecoder:
    """The real decoder (app/imaging), wrapped: records the thread of each call; the first call waits until `free()`
    when `hold_first` (an image thread kept busy by one request while others wait for it)."""

    def __init__(self, monkeypatch, hold_first: bool = False):
        self.real = image_step.decode_with_source
        self.threads: list[str] = []
        self.inside, self.gate = threading.Event(), threading.Event()
        if not hold_first:
            self.gate.set()
        monkeypatch.setattr(image_step, "decode_with_source", self)

    def __call__(self, *args, **kwargs):
        self.threads.append(threading.current_thread().name)
        if len(self.threads) == 1:
            self.inside.set()
            self.gate.wait(EVENTUALLY_S)
        return self.real(*args, **kwargs)

    def free(self):
        self.gate.set()


def ticket_on(engine: RecordingEngineDouble, clock: FakeClock, *, max_waiting: int = 4, max_queue_ms: float = 0.0,
              wait_s: float = 5.0) -> Ticket:
    """A ticket on a version of the committed model served by `engine` alone, on the pool's fake clock."""
    pool = EnginePool("m/double", [InterpreterMember(Stage(engine, 1.0))], max_waiting=max_waiting,
                      wait_timeout_s=wait_s, retry_after_s=2, max_queue_ms=max_queue_ms, clock=clock, backend="double")
    version = ModelVersion(MODEL_DIR, CLASSIFY, {"double": pool}, {"double": CLASSIFY.bind(MODEL_DIR, OUTPUTS)}, {}, 1)
    return Ticket(version, "double", None)


@pytest.fixture
def images():
    work = ImageWork(1, 50_000_000)
    yield work
    work.close()


def test_an_image_is_prepared_on_an_image_thread_and_its_tensor_runs_through_the_ticket(images, cat_png,
                                                                                         monkeypatch):
    decoder = GatedDecoder(monkeypatch)
    engine = RecordingEngineDouble()
    ticket = ticket_on(engine, FakeClock())
    queued_by = []
    put = ticket.pool.put
    monkeypatch.setattr(ticket.pool, "put", lambda job: queued_by.append(threading.current_thread().name) or put(job))

    async def scenario():
        async with ticket:
            return await Core(None, images).answer(ticket, ImageInput(cat_png.read_bytes()))

    try:
        answer = asyncio.run(scenario())
        (tensor, lane), = engine.ran
        assert decoder.threads[0].startswith("image") and lane.startswith("pool-m/double")
        assert queued_by == decoder.threads  # the image thread queued the tensor it made: no hop through the loop
        assert tensor.shape == INPUTS[0].shape and tensor.dtype == INPUTS[0].dtype  # the image's tensor, quantized
        assert {"decode", "preprocess", "queue", "inference"} <= set(answer.timing_ms)
        assert answer.backend == "double" and ticket.pool.line.admitted == 0  # its place given back at the end
    finally:
        ticket.pool.close()


def test_a_bad_image_is_its_requests_error_and_nothing_reaches_the_line(images):
    engine = RecordingEngineDouble()
    ticket = ticket_on(engine, FakeClock())

    async def scenario():
        async with ticket:
            with pytest.raises(RequestError):
                await Core(None, images).answer(ticket, ImageInput(b"not an image"))
            assert ticket.pool.line.admitted == 1 and ticket.pool.line.waiting == 0  # its place, no job

    try:
        asyncio.run(scenario())
        assert engine.ran == [] and ticket.pool.line.admitted == 0
    finally:
        ticket.pool.close()


class Body(bytearray):
    """A request body that can be watched (bytes takes no weak reference; a body read into a buffer is a bytearray)."""


def test_a_refused_body_is_freed_at_once_without_a_garbage_collection(images):
    """A bad image's error reaches its request without the frames that raised it: they hold the body, the ticket
    and the future the error sits in, a cycle that kept every refused body alive until a full collection (26 MB
    DOODS bodies piled up to 560 MB, issue 42)."""
    import gc
    import weakref

    engine = RecordingEngineDouble()
    ticket = ticket_on(engine, FakeClock())
    body = Body(b"not an image" * 1000)
    watched = weakref.ref(body)

    async def scenario(given) -> str:
        async with ticket:
            try:
                await Core(None, images).answer(ticket, ImageInput(given))
            except RequestError as e:  # not pytest.raises: its ExceptionInfo would hold the frames (and the body)
                return type(e).__name__
        return "answered"

    gc.disable()
    try:
        assert asyncio.run(scenario(body)) == "BadImage"
        del body
        assert watched() is None  # freed by its count alone
    finally:
        gc.enable()
        ticket.pool.close()


def test_a_request_that_gave_up_while_waiting_for_an_image_thread_costs_no_decoding(images, cat_png, monkeypatch):
    decoder = GatedDecoder(monkeypatch, hold_first=True)
    engine = RecordingEngineDouble()
    first, second, third = (ticket_on(engine, FakeClock()) for _ in range(3))
    data = cat_png.read_bytes()

    async def scenario():
        core = Core(None, images)
        busy = asyncio.ensure_future(core.answer(first, ImageInput(data)))  # holds the one image thread
        assert await asyncio.to_thread(decoder.inside.wait, EVENTUALLY_S)
        waiting = asyncio.ensure_future(core.answer(second, ImageInput(data)))
        await turns_until(lambda: second.place is not None, "the second request's place, and its image handed over")
        waiting.cancel()  # its client went away while its image waited for the thread
        with pytest.raises(asyncio.CancelledError):
            await waiting
        decoder.free()
        await busy
        await core.answer(third, ImageInput(data))  # after the second's turn on the one thread: it has had it

    try:
        asyncio.run(scenario())
        assert len(decoder.threads) == 2 and len(engine.ran) == 2  # the first's and the third's images alone
    finally:
        for ticket in (first, second, third):
            ticket.close()
            ticket.pool.close()


def test_under_overload_an_image_that_waited_past_max_queue_ms_for_a_thread_is_refused_undecoded(images, cat_png,
                                                                                                monkeypatch):
    decoder = GatedDecoder(monkeypatch, hold_first=True)
    clock = FakeClock()
    engine = RecordingEngineDouble()
    other = ticket_on(RecordingEngineDouble(), FakeClock())  # another model's request, holding the image thread
    ticket = ticket_on(engine, clock, max_waiting=0, max_queue_ms=30)
    data = cat_png.read_bytes()

    async def scenario():
        core = Core(None, images)
        busy = asyncio.ensure_future(core.answer(other, ImageInput(data)))
        assert await asyncio.to_thread(decoder.inside.wait, EVENTUALLY_S)
        ticket.admit()
        with pytest.raises(Busy):
            ticket.pool.admit()  # the line of 1 overflows: overloaded
        late = asyncio.ensure_future(core.answer(ticket, ImageInput(data)))
        clock.advance(0.060)  # past the 30 ms bound, waiting for the image thread
        decoder.free()
        with pytest.raises(Busy, match="waited .* ms in line"):
            await late
        await busy

    try:
        asyncio.run(scenario())
        assert len(decoder.threads) == 1 and engine.ran == []  # refused without its decoding, and never queued
    finally:
        for each in (other, ticket):
            each.close()
            each.pool.close()
    assert ticket.pool.line.admitted == 0


def test_a_place_past_its_wait_deadline_is_refused_before_its_image_is_decoded(images, cat_png, monkeypatch):
    decoder = GatedDecoder(monkeypatch)
    clock = FakeClock()
    engine = RecordingEngineDouble()
    ticket = ticket_on(engine, clock, wait_s=0.1)

    async def scenario():
        ticket.admit()
        clock.advance(0.2)  # its place waited past the wait deadline (image threads busy elsewhere, say)
        with pytest.raises(Busy, match="no interpreter free within 0.1 s"):
            await asyncio.wrap_future(images.prepare(cat_png.read_bytes(), ticket))

    try:
        asyncio.run(scenario())
        assert decoder.threads == [] and engine.ran == [] and ticket.pool.line.waiting == 0
    finally:
        ticket.close()
        ticket.pool.close()
