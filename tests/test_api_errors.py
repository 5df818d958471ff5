"""app/api/errors.py: refusals and other 5xx logged without a line per request (app/refusal_log.py)."""

import asyncio
import logging

from fastapi import FastAPI
from starlette.testclient import TestClient

from app.api import errors
from app.errors import Busy, InvokeTimeout, NotReady
from tests.doubles.clock import FakeClock, FakeTimers

LOGGER = "test.refusals"


def test_refusals_are_logged_first_in_full_then_summed_up_per_window(caplog):
    """The windows close on fake timers (tests/doubles/clock.py): the test moves time, nothing sleeps."""
    timers = FakeTimers(FakeClock())
    refusals = errors.RefusalLog(logging.getLogger(LOGGER), window_s=10, event_loop=lambda: timers)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(100):
            refusals.refused("POST", "/v1/classify", Busy("m/cpu: all 1 interpreters busy", 1))
        refusals.refused("POST", "/v2/models/m/infer", NotReady("loading"))
        timers.advance(10)  # the first window closes: one summary
        timers.advance(10)  # a quiet window: nothing, and the next refusal is in full again
        refusals.refused("POST", "/v1/classify", Busy("again", 1))
        timers.advance(10)
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 4, lines
    assert lines[0].startswith("POST /v1/classify: 503 m/cpu: all 1 interpreters busy")
    assert lines[1].startswith("POST /v2/models/m/infer: 503 loading")  # a new kind in a flood of another: in full
    assert lines[2] == "refused 99 more requests (503) in the last 10 s: 99 x Busy"
    assert lines[3].startswith("POST /v1/classify: 503 again")


def test_on_the_running_loop_a_window_closes_on_the_loops_timer():
    """The default: the running loop's timer writes the summary (awaited as the log line itself, not slept for)."""
    async def main():
        summary = asyncio.get_running_loop().create_future()

        class Summary(logging.Handler):
            def emit(self, record):
                if record.getMessage().startswith("refused") and not summary.done():
                    summary.set_result(record.getMessage())

        logger = logging.getLogger(f"{LOGGER}.loop")
        handler = Summary()
        logger.addHandler(handler)
        try:
            refusals = errors.RefusalLog(logger, window_s=0.01)
            refusals.refused("POST", "/v1/classify", Busy("all busy", 1))
            refusals.refused("POST", "/v1/classify", Busy("all busy", 1))
            return await asyncio.wait_for(summary, 10)
        finally:
            logger.removeHandler(handler)

    assert asyncio.run(main()) == "refused 1 more requests (503) in the last 0.01 s: 1 x Busy"


def test_a_503_answer_is_unchanged_and_other_5xx_are_summed_up_too(caplog):
    app = FastAPI()
    errors.install(app)

    @app.get("/busy")
    async def busy():
        raise Busy("all busy", 2)

    @app.get("/late")
    async def late():
        raise InvokeTimeout("past its deadline", 1)

    with TestClient(app) as client, caplog.at_level(logging.WARNING, logger=errors.log.name):  # one event loop
        for _ in range(5):
            r = client.get("/busy")
            assert (r.status_code, r.json(), r.headers["retry-after"]) == (503, {"error": "all busy"}, "2")
        for _ in range(3):
            assert client.get("/late").status_code == 504
    messages = [r.getMessage() for r in caplog.records if r.name == errors.log.name]
    assert sum("all busy" in m for m in messages) == 1  # one line for five refusals
    assert sum("past its deadline" in m for m in messages) == 1  # and one for three failures, at ERROR
    assert [r.levelno for r in caplog.records if "past its deadline" in r.getMessage()] == [logging.ERROR]


def _all_serve_errors():
    import app.emulator.errors  # noqa: F401  (subclasses defined beside their engines)
    import app.tflite_file  # noqa: F401
    from app.errors import ServeError

    def below(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from below(sub)

    return sorted({ServeError, *below(ServeError)}, key=lambda c: c.__name__)


def test_each_error_carries_its_status_and_each_protocol_reads_it_once():
    """The status travels with the class (app/errors.py); /v1 answers it, v2 says it in the protocol's terms."""
    from app.api.v2.errors import status_of as v2_status_of
    from app.errors import (BackendNotAvailable, BadImage, BodyTooLarge, DeviceHung, DeviceUnavailable, EmptyBody,
                            ImageTooLarge, InvalidParameter, ModelDirError, ModelNotFound, ServeError, ShuttingDown,
                            UnsupportedMediaType)

    v1 = {ModelNotFound: 404, BackendNotAvailable: 422, InvalidParameter: 422, EmptyBody: 400, BadImage: 400,
          UnsupportedMediaType: 415, BodyTooLarge: 413, ImageTooLarge: 413, InvokeTimeout: 504, DeviceHung: 503,
          Busy: 503, NotReady: 503, ShuttingDown: 503, ModelDirError: 409, DeviceUnavailable: 409, ServeError: 500}
    for cls, status in v1.items():
        assert errors.status_of(cls.__new__(cls)) == status, cls
    for cls in _all_serve_errors():
        error = cls.__new__(cls)
        assert v2_status_of(error) in (400, 404, 413, 503, 504), cls  # the statuses the v2 protocol has
        assert (v2_status_of(error) == error.status) == (error.status not in (409, 415, 422, 500)), cls


def test_install_gives_the_refusal_log_its_window(monkeypatch):
    monkeypatch.setattr(errors.refusals, "window_s", errors.refusals.window_s)  # restored after the test
    errors.install(FastAPI(), 3.5)
    assert errors.refusals.window_s == 3.5
