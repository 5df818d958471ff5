"""create_app(settings): assembles the routers; the lifespan loads the models and hands the HTTP
server its limits.

`app` (this module's attribute) and `create_app()` without settings are what other servers load
(`uvicorn app.main:app`, `uvicorn --factory app.main:create_app`, gunicorn): the app they get starts
only where the server runs our HTTP protocol, and otherwise refuses and says how (app/launch.py).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI

from app import launch, processes, tasks
from app.api import auth, devices, errors, health, metrics, models, openapi, page
from app.api.body import HoldBodyBudget
from app.api.routes import InferenceRoutes, task_routers
from app.api.shedding import HeadAdmission
from app.api.v2 import router as v2
from app.http_server import HttpLimits, lifespan_state
from app.imaging import reuse_image_buffers
from app.inference import ImageWork, image_threads
from app.memory import TRIM_AFTER_BYTES, ByteBudget
from app.processes.siblings import Siblings, reload_here
from app.registry import Registry
from app.settings import Settings

log = logging.getLogger(__name__)

# FastAPI's native OpenTelemetry, off: the service's monitoring is Prometheus (/metrics), no
# OpenTelemetry SDK is installed, and asking per request whether one is configured cost ~7 us of
# event-loop CPU (bench/loop_cost.py).
NO_OPENTELEMETRY = {"tracing": False, "metrics": False, "logs": False}


def inference_routers() -> list[APIRouter]:
    """The routers of the inference routes (app/api/routes.py), included first: every request is matched
    against the routes in order, and these are the ones under load. Each task's (the task names its
    router: app/tasks/), then the protocols' (OIP v2). They check the inference key themselves (DirectRoute)."""
    return [*task_routers(tasks.TASKS.values()), v2.inference]


def create_app(settings: Settings | None = None) -> FastAPI:
    """The service's app. Without `settings`, a server's factory call (settings from EDGETPU_SERVE_*):
    built only where the server holds the HTTP limits (app/launch.py)."""
    if settings is None:
        return launch.app_for_server("app.main:create_app", create_app)
    reuse_image_buffers()
    registry = Registry(settings)
    # Model directories are checked now, so a misconfiguration stops the process at
    # once; interpreters load (and warm up) in the background while /healthz answers.
    registry.configure()

    slot = processes.current()  # one of several worker processes (app/processes), or None: alone
    siblings = Siblings(slot, registry) if slot is not None else None

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        launch.check_server(app)  # started by another server: refuses unless it runs our protocol
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
            yield lifespan_state(HttpLimits.from_settings(settings), HeadAdmission(registry, inference_routes))
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
            images.close()

    app = FastAPI(title="edgetpu-serve", version="0.1.0", lifespan=lifespan, telemetry=NO_OPENTELEMETRY,
                  description="Image classification on a Coral Edge TPU, the CPU, or a bit-exact int8 emulator.")
    images = ImageWork(image_threads(settings.image_threads, registry.host_cpu), settings.max_image_pixels,
                       nice=settings.compute_nice,
                       max_decoded_pixels=settings.max_decoded_pixels, accept_damaged=settings.accept_damaged_images)
    app.state.settings = settings
    app.state.registry = registry
    app.state.siblings = siblings
    app.state.images = images
    app.state.api_keys = auth.ApiKeys.from_settings(settings)
    errors.install(app, settings.refusal_log_window_s)
    budget = ByteBudget(settings.max_body_bytes_in_flight, settings.retry_after_s,
                        trim_after_bytes=TRIM_AFTER_BYTES if settings.tune_malloc else None)
    app.add_middleware(HoldBodyBudget, budget=budget)
    routers = inference_routers()
    for router in routers:
        app.include_router(router)
    app.include_router(health.router)
    app.include_router(models.router, dependencies=[auth.InferenceKey])
    app.include_router(devices.router, dependencies=[auth.InferenceKey])
    app.include_router(v2.health)  # open, like /healthz
    app.include_router(v2.router, dependencies=[auth.InferenceKey])
    # the table of inference routes (app/api/routes.py): shedding, counting and admission read it
    inference_routes = app.state.inference_routes = InferenceRoutes.of(
        route for router in routers for route in router.routes)
    metrics.install(app, inference_routes)  # /metrics: open until inference keys are set, like /v1
    page.install(app)
    openapi.install(app, registry)
    return app


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


def __getattr__(name: str):
    if name == "app":  # `uvicorn app.main:app`, `gunicorn app.main:app`
        return launch.app_for_server("app.main:app", create_app)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
