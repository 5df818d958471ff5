"""The v2 error table and the route class that applies it: every failure is JSON, none drops the connection."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import APIRouter, FastAPI

from app.api.v2.errors import status_of
from app.api.v2.router import V2Route
from app.errors import (
    BackendNotAvailable,
    BadImage,
    BodyTooLarge,
    Busy,
    DeviceHung,
    EngineLoadError,
    ImageTooLarge,
    InvokeTimeout,
    ModelDirError,
    ModelNotFound,
    NotReady,
    RequestError,
    ShuttingDown,
)


@pytest.mark.parametrize("error, status", [
    (ModelNotFound("m"), 404), (BackendNotAvailable("b"), 400), (BadImage("x"), 400), (RequestError("r"), 400),
    (BodyTooLarge("big"), 413), (Busy("busy", 1), 503), (DeviceHung("hung", 2), 503), (NotReady("loading"), 503),
    (ModelDirError("bad file"), 503), (EngineLoadError("no runtime"), 503),
    (InvokeTimeout("slow", 1), 504), (ImageTooLarge("bomb"), 413), (ShuttingDown("draining"), 503),
])
def test_every_domain_error_has_a_status(error, status):
    assert status_of(error) == status


def test_route_class_answers_domain_errors_and_bugs_as_json():
    router = APIRouter(route_class=V2Route)

    @router.get("/busy")
    async def busy():
        raise Busy("all interpreters busy", 3)

    @router.get("/bug")
    async def bug():
        raise ZeroDivisionError("a bug")

    app = FastAPI()
    app.include_router(router)

    async def calls():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
            return await c.get("/busy"), await c.get("/bug")

    busy_response, bug_response = asyncio.run(calls())
    assert busy_response.status_code == 503 and busy_response.headers["retry-after"] == "3"
    assert busy_response.json() == {"error": "all interpreters busy"}
    assert bug_response.status_code == 500 and bug_response.json() == {"error": "internal error: ZeroDivisionError"}
