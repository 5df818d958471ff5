"""The service's lifetime inside its app (the ASGI lifespan that app/main.py gives it).

At start (a server that does not run our HTTP protocol was refused before: app/launch.py), load the models in the
background while /healthz answers, join the worker group when several processes serve the port
(app/processes: a worker listens once loaded), and reload every model on SIGHUP. While serving: the HTTP
protocol reads its limits and the head check from the lifespan state (app/http_server.py). At SIGTERM:
admitted requests finish (DRAIN_TIMEOUT_S), then every interpreter and image thread is closed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI

from app import processes
from app.api.routes import InferenceRoutes
from app.api.shedding import HeadAdmission
from app.http_server import HttpLimits, lifespan_state
from app.core import Core
from app.processes.siblings import Siblings, reload_here
from app.registry import Registry
from app.settings import Settings

log = logging.getLogger(__name__)

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[dict]]


def service_lifespan(settings: Settings, registry: Registry, siblings: Siblings | None, core: Core,
                     inference_routes: InferenceRoutes) -> Lifespan:
    """The lifespan of an app serving `registry`: `siblings` are the other workers of its group (None: alone);
    `core` its request path (with its image threads); `inference_routes` the table the head check reads."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict]:
        loading = asyncio.create_task(asyncio.to_thread(registry.load_all))
        if siblings is not None:
            await siblings.start()  # the others see it loading, and ask it for reloads, from now on
            # a worker listens once loaded: the kernel gives connections only to workers that accept, so
            # the other workers take the requests meanwhile (a restart after a crash fails nothing)
            await asyncio.shield(loading)
            processes.slots.mark_loaded()
        hangup = reload_on_hangup(registry)
        try:
            # the HTTP server's protocol reads its limits and the head check from here (app/http_server.py)
            yield lifespan_state(HttpLimits.from_settings(settings), HeadAdmission(core, inference_routes))
        finally:
            if hangup:
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            if siblings is not None:
                await siblings.stop()
            # Shutdown: admitted requests finish (bounded), then every interpreter is closed.
            if not await registry.drain(settings.drain_timeout_s):
                log.warning("drain: %d request(s) still in flight after %.1f s; closing anyway",
                            registry.active, settings.drain_timeout_s)
            # a load still under way drops what it loads once draining; wait for it, bounded
            await asyncio.wait({loading}, timeout=settings.drain_timeout_s)
            await asyncio.to_thread(registry.close)
            core.images.close()

    return lifespan


def reload_on_hangup(registry: Registry) -> bool:
    """SIGHUP reloads every model in place, as the admin route reloads one (under gunicorn the master sends it
    to each worker). Where the app's loop runs in the main thread (a server's, not a test client's): True."""
    if threading.current_thread() is not threading.main_thread():
        return False

    def hangup() -> None:
        log.info("SIGHUP: reloading every model")
        asyncio.ensure_future(reload_here(registry, None))

    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, hangup)
    return True
