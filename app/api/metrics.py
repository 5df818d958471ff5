"""GET /metrics: Prometheus exposition of app.metrics, and the middleware that counts requests.

RequestCounter counts every answered request to an inference route (the table, app/api/routes.py) by protocol,
model, backend and status. Which model and backend serve a request is known only once the core has resolved
them: the door notes them in the request's scope from what the core returns (app/api/held.py: the hold's model
and the backend that ran the request, or a failed request's `ServeError.target`). A request refused before that
(no such model, a bad parameter) counts under model="" and backend="".
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, FastAPI, Request, Response

from app import metrics
from app.api import auth
from app.api.deps import ServiceDep
from app.api.routes import InferenceRoutes

router = APIRouter(tags=["metrics"])

# The ASGI scope's key under which RequestCounter keeps the labels of the request it counts.
SCOPE_KEY = "edgetpu_serve.counted"


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def scrape(service: ServiceDep):
    siblings = service.siblings
    if siblings is None:
        # the state collector walks pools and may read sysfs: off the event loop
        return Response(await asyncio.to_thread(metrics.exposition), media_type=metrics.CONTENT_TYPE)
    # several worker processes: every worker's counters from the shared files, and the state gauges of
    # every worker that answers now, merged (app/metrics.py)
    answers = await siblings.everyone("state")
    states = {slot: answer["families"] for slot, answer in answers.items() if answer is not None}
    text = await asyncio.to_thread(metrics.group_exposition, siblings.slot.metrics_dir, states, siblings.processes)
    return Response(text, media_type=metrics.CONTENT_TYPE)


class Counted:
    """The labels of one counted request: the model and backend its door noted (`count_as`)."""

    __slots__ = ("model", "backend")

    def __init__(self) -> None:
        self.model = ""
        self.backend = ""


def count_as(request: Request, model: str, backend: str) -> None:
    """Count this request under `model` and `backend` (where no RequestCounter is around the app: nothing)."""
    labels = request.scope.get(SCOPE_KEY)
    if labels is not None:
        labels.model, labels.backend = model, backend


class RequestCounter:
    """ASGI middleware: counts answered requests to the inference routes by protocol and status.

    Plain ASGI: `routes` says which requests are inference requests and of which protocol
    (app/api/routes.py InferenceRoutes.protocol_of); it only reads the status it passes on, and the labels
    the request's door noted in its scope (`count_as`).
    """

    def __init__(self, app, routes):
        self.app = app
        self.routes = routes

    async def __call__(self, scope, receive, send):
        protocol = self.routes.protocol_of(scope["method"], scope["path"]) if scope["type"] == "http" else None
        if protocol is None:
            return await self.app(scope, receive, send)
        labels = scope[SCOPE_KEY] = Counted()
        status = {"code": 500}

        async def send_and_watch(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            metrics.answered(protocol, labels.model, labels.backend, status["code"])


def install(app: FastAPI, routes: InferenceRoutes) -> None:
    """Route, and request counting on the inference routes (the table, app/api/routes.py); the service watches its
    registry's state for the scrapes (app/service.py). The route takes the inference key: open until keys are set
    (scrapers send it as a bearer token)."""
    app.include_router(router, dependencies=[auth.InferenceKey])
    app.add_middleware(RequestCounter, routes=routes)
