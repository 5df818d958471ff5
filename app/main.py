"""create_app(settings): the service's app, assembled in reading order: the registry (models checked now),
the image threads, the routes, then the app holding them, with its lifespan (app/lifespan.py: models load,
the HTTP server gets its limits, SIGTERM drains).

`app` and `create_app()` without settings are what other servers load (`uvicorn app.main:app`,
`uvicorn --factory app.main:create_app`, gunicorn): the app they get starts only where the server runs our
HTTP protocol, and otherwise refuses and says how (app/launch.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, FastAPI

from app import launch, processes, tasks
from app.api import auth, devices, doors, errors, health, metrics, models, openapi, page
from app.api.body import HoldBodyBudget
from app.api.routes import InferenceRoutes
from app.api.v2 import router as v2
from app.core import Core, ImageWork, image_threads
from app.imaging.decoding import reuse_image_buffers
from app.lifespan import service_lifespan
from app.memory import TRIM_AFTER_BYTES, ByteBudget
from app.processes.siblings import Siblings
from app.registry import Registry
from app.settings import Settings

# FastAPI's native OpenTelemetry, off: the service's monitoring is Prometheus (/metrics), no
# OpenTelemetry SDK is installed, and asking per request whether one is configured cost ~7 us of
# event-loop CPU (bench/loop_cost.py).
NO_OPENTELEMETRY = {"tracing": False, "metrics": False, "logs": False}


def inference_routers() -> list[APIRouter]:
    """The front doors' routers (app/api/doors.py, in routing order: each task's native routes, OIP v2's, DeepStack's,
    ...), included first, with the table of their routes in front of them (app/api/routes.py). Their route classes
    check the inference key themselves: included here with no dependencies."""
    return doors.inference_routers()


def description(tasks: Iterable[str]) -> str:
    """What the service does (GET /openapi.json, /docs), from the tasks it serves: never one task's words alone."""
    return (f"Int8 image models on a Coral Edge TPU, the CPU, or a bit-exact int8 emulator; tasks: "
            f"{', '.join(tasks)}.")


def create_app(settings: Settings | None = None) -> FastAPI:
    """The service's app. Without `settings`, a server's factory call (settings from EDGETPU_SERVE_*):
    built only where the server holds the HTTP limits (app/launch.py)."""
    if settings is None:
        return launch.app_for_server("app.main:create_app", create_app)
    reuse_image_buffers(settings.image_buffer_blocks, settings.image_buffer_block_bytes)
    registry = Registry(settings)
    # Model directories are checked now, so a misconfiguration stops the process at
    # once; interpreters load (and warm up) in the background while /healthz answers.
    registry.configure()
    slot = processes.current()  # one of several worker processes (app/processes), or None: alone
    siblings = Siblings(slot, registry) if slot is not None else None
    images = ImageWork(image_threads(settings.image_threads, registry.host_cpu), settings.max_image_pixels,
                       nice=settings.compute_nice, max_decoded_pixels=settings.max_decoded_pixels,
                       accept_damaged=settings.accept_damaged_images)
    core = Core(registry, images)
    routers = inference_routers()
    # the table of inference routes (app/api/routes.py): shedding, counting and admission read it
    inference_routes = InferenceRoutes.of(routers)

    app = FastAPI(title="edgetpu-serve", version="0.1.0", telemetry=NO_OPENTELEMETRY, routes=[inference_routes.front],
                  lifespan=service_lifespan(settings, registry, siblings, core, inference_routes),
                  description=description(tasks.TASKS))
    app.state.settings = settings
    app.state.registry = registry
    app.state.siblings = siblings
    app.state.images = images
    app.state.core = core
    app.state.api_keys = auth.ApiKeys.from_settings(settings)
    app.state.inference_routes = inference_routes
    errors.install(app, settings.refusal_log_window_s)
    app.add_middleware(HoldBodyBudget, budget=ByteBudget(
        settings.max_body_bytes_in_flight, settings.retry_after_s,
        trim_after_bytes=TRIM_AFTER_BYTES if settings.tune_malloc else None))
    inference_routes.include(app)  # behind the table's route in front of them
    app.include_router(health.router)
    app.include_router(models.router, dependencies=[auth.InferenceKey])
    app.include_router(devices.router, dependencies=[auth.InferenceKey])
    app.include_router(v2.health)  # open, like /healthz
    app.include_router(v2.router, dependencies=[auth.InferenceKey])
    metrics.install(app, inference_routes)  # /metrics: open until inference keys are set, like /v1
    page.install(app)
    openapi.install(app, registry)
    return app


def __getattr__(name: str) -> Any:
    """`app.main:app`, the name `uvicorn app.main:app` and gunicorn look up: the app built from the environment's
    settings at that lookup, once (app/launch.py app_for_server).

    A module attribute looked up by name, not a module-level `app = create_app()`, because building it reads
    the settings, checks every model directory and can refuse to start: done at import, that would happen
    wherever `app.main` is imported (tests, benchmarks, `python -m app` importing create_app), and a
    refusal would surface as an import error instead of the servers' own "app failed to load" exit
    (launch.CANNOT_START). docs/launch.md says the same for users."""
    if name == "app":
        return launch.app_for_server("app.main:app", create_app)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
