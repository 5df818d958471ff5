"""GET /metrics: Prometheus exposition of app.metrics, and the middleware that counts requests."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, FastAPI, Request, Response

from app import metrics
from app.api import auth
from app.api.routes import InferenceRoutes

router = APIRouter(tags=["metrics"])


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def scrape(request: Request):
    siblings = request.app.state.siblings
    if siblings is None:
        # the state collector walks pools and may read sysfs: off the event loop
        return Response(await asyncio.to_thread(metrics.exposition), media_type=metrics.CONTENT_TYPE)
    # several worker processes: every worker's counters from the shared files, and the state gauges of
    # every worker that answers now, merged (app/metrics.py)
    answers = await siblings.everyone("state")
    states = {slot: answer["families"] for slot, answer in answers.items() if answer is not None}
    text = await asyncio.to_thread(metrics.group_exposition, siblings.slot.metrics_dir, states, siblings.processes)
    return Response(text, media_type=metrics.CONTENT_TYPE)


def install(app: FastAPI, routes: InferenceRoutes) -> None:
    """Route, request counting on the inference routes (the table, app/api/routes.py), and the
    registry's state read at each scrape. The route takes the inference key: open until keys are set
    (scrapers send it as a bearer token)."""
    app.include_router(router, dependencies=[auth.InferenceKey])
    app.add_middleware(metrics.RequestCounter, routes=routes)
    metrics.watch(app.state.registry)
