"""An HTTP front door's way into the core: `held(request, task, model, backend)` is `Core.hold` with what HTTP
adds, the room check skipped when the request's head already had it (app/api/shedding.py), and the request
counted (app/api/metrics.py) under the model and the backend the core reports: the backend that ran it (the
ticket's, after its run), or, for a request that failed once its model was known, the error's `target`.
`answer_image(...)` is the native routes' whole request: the hold, the image body read, the task's answer.
`core_of(request)` and `settings_of(request)`: the core and the settings serving a request, read here only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Request

from app.api.body import image_bytes
from app.api.metrics import count_as
from app.core import Core, ImageInput, Ticket
from app.errors import ServeError
from app.settings import Settings
from app.tasks import Answer, Task

# The request scope's key under which the HTTP head check says it made the room check (app/api/shedding.py).
ROOM_CHECKED = "edgetpu_serve.room_checked"


@asynccontextmanager
async def held(request: Request, task: Task | None, model: str | None, backend: str | None) -> AsyncIterator[Ticket]:
    core = core_of(request)
    try:
        async with core.hold(task, model, backend, room_checked=ROOM_CHECKED in request.scope) as ticket:
            yield ticket
    except ServeError as e:
        if e.target is not None:
            count_as(request, e.target.model, e.target.backend)
        raise
    count_as(request, ticket.model, ticket.backend)


async def answer_image(request: Request, task: Task, model: str | None, backend: str | None,
                       options: object = None) -> Answer:
    """One image, the request's body (multipart field `image`, or the raw body: app/api/body.py), through the model
    to the task's answer; the hold (and its room check) before the body is read."""
    async with held(request, task, model, backend) as ticket:
        given = ImageInput(await image_bytes(request, settings_of(request).max_body_bytes))
        return await core_of(request).answer(ticket, given, options)


def core_of(request: Request) -> Core:
    return request.app.state.core


def settings_of(request: Request) -> Settings:
    return request.app.state.settings
