"""GET /metrics: Prometheus exposition of app.metrics, and the middleware that counts requests."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, FastAPI, Response

from app import metrics

router = APIRouter(tags=["metrics"])


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def scrape():
    # the state collector walks pools and may read sysfs: off the event loop
    return Response(await asyncio.to_thread(metrics.exposition), media_type=metrics.CONTENT_TYPE)


def install(app: FastAPI) -> None:
    """Route, request counting on /v1 and /v2, and the registry's state read at each scrape."""
    app.include_router(router)
    app.add_middleware(metrics.RequestCounter, protocols={"/v1/": "v1", "/v2/": "v2"})
    metrics.watch(app.state.registry, app.state.settings.apex_sysfs_dir)
