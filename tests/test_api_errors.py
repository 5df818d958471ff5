"""app/api/errors.py: refusals logged without a line per request; other 5xx one by one."""

import asyncio
import logging

from fastapi import FastAPI
from starlette.testclient import TestClient

from app.api import errors
from app.errors import Busy, InvokeTimeout, NotReady

LOGGER = "test.refusals"


def test_refusals_are_logged_first_in_full_then_summed_up_per_window(caplog):
    async def burst():
        refusals = errors.RefusalLog(logging.getLogger(LOGGER), window_s=0.05)
        for _ in range(100):
            refusals.refused("POST", "/v1/classify", Busy("m/cpu: all 1 interpreters busy", 1))
        refusals.refused("POST", "/v2/models/m/infer", NotReady("loading"))
        await asyncio.sleep(0.08)  # the first window closes: one summary
        await asyncio.sleep(0.08)  # a quiet window: nothing, and the next refusal is in full again
        refusals.refused("POST", "/v1/classify", Busy("again", 1))
        await asyncio.sleep(0.08)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        asyncio.run(burst())
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 3, lines
    assert lines[0].startswith("POST /v1/classify: 503 m/cpu: all 1 interpreters busy")
    assert lines[1] == "refused 100 more requests (503) in the last 0.05 s: 99 x Busy, 1 x NotReady"
    assert lines[2].startswith("POST /v1/classify: 503 again")


def test_a_503_answer_is_unchanged_and_other_5xx_are_logged_each(caplog):
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
    assert sum("past its deadline" in m for m in messages) == 3
