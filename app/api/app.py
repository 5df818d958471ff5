"""The HTTP door's app: `http_app(service)`, FastAPI onto a service (app/service.py makes it, on first ask), assembled
in reading order: the door every route shares (the service, the API keys, the table of inference routes), the app
with its lifespan, then the routes.

The lifespan starts the service (every door but HTTP, which the server that runs this app runs), unless its owner
started it (python -m app, whose HTTP server this is), and hands the HTTP server its limits and the head check: the
protocol reads them from the lifespan state (app/http_server.py), whoever started the server. At SIGTERM the server
lets the admitted requests finish (DRAIN_TIMEOUT_S); then the service stops (its doors, the drain, every interpreter
and image thread closed).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import APIRouter, FastAPI

from app import tasks
from app.api import auth, devices, doors, errors, health, metrics, models, openapi, page
from app.api.body import HoldBodyBudget
from app.api.deps import HttpDoor, ServiceView, attach
from app.api.keys import ApiKeys
from app.api.routes import InferenceRoutes
from app.api.shedding import HeadAdmission
from app.api.v2 import router as v2
from app.http_server import HttpLimits, lifespan_state
from app.memory import TRIM_AFTER_BYTES, ByteBudget

# FastAPI's native OpenTelemetry, off: the service's monitoring is Prometheus (/metrics), no
# OpenTelemetry SDK is installed, and asking per request whether one is configured cost ~7 us of
# event-loop CPU (bench/loop_cost.py).
NO_OPENTELEMETRY = {"tracing": False, "metrics": False, "logs": False}

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[dict]]


def inference_routers() -> list[APIRouter]:
    """The front doors' routers (app/api/doors.py, in routing order: each task's native routes, OIP v2's, DeepStack's,
    ...), included first, with the table of their routes in front of them (app/api/routes.py). Their route classes
    check the inference key themselves: included here with no dependencies."""
    return doors.inference_routers()


def description(tasks: Iterable[str]) -> str:
    """What the service does (GET /openapi.json, /docs), from the tasks it serves: never one task's words alone."""
    return (f"Int8 image models on a Coral Edge TPU, the CPU, or a bit-exact int8 emulator; tasks: "
            f"{', '.join(tasks)}.")


def http_app(service: ServiceView) -> FastAPI:
    """The HTTP door onto `service`: its routes, its middleware, the limits its lifespan hands the server. A key
    that cannot be one is a ServeError here."""
    settings = service.settings
    routers = inference_routers()
    # the table of inference routes (app/api/routes.py): shedding, counting and admission read it
    door = HttpDoor(service, ApiKeys.from_settings(settings),
                    InferenceRoutes.of(routers))
    app = FastAPI(title="edgetpu-serve", version="0.1.0", telemetry=NO_OPENTELEMETRY, routes=[door.routes.front],
                  lifespan=lifespan_of(door),
                  description=description(tasks.TASKS))
    attach(app, door)
    errors.install(app, settings.refusal_log_window_s)
    app.add_middleware(HoldBodyBudget, budget=ByteBudget(
        settings.max_body_bytes_in_flight, settings.retry_after_s,
        trim_after_bytes=TRIM_AFTER_BYTES if settings.tune_malloc else None))
    door.routes.include(app)  # behind the table's route in front of them
    app.include_router(health.router)
    app.include_router(models.router, dependencies=[auth.InferenceKey])
    app.include_router(devices.router, dependencies=[auth.InferenceKey])
    app.include_router(v2.health)  # open, like /healthz
    app.include_router(v2.router, dependencies=[auth.InferenceKey])
    metrics.install(app, door.routes)  # /metrics: open until inference keys are set, like /v1
    page.install(app)
    openapi.install(app, service.core, settings.max_top_k)
    return app


def lifespan_of(door: HttpDoor) -> Lifespan:
    """The app's lifespan: its service running (started here unless its owner started it), and the HTTP server's
    limits and head check handed over."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict]:
        service = door.service
        async with service.running():
            # the HTTP server's protocol reads its limits and the head check from here (app/http_server.py)
            yield lifespan_state(HttpLimits.from_settings(service.settings), HeadAdmission(service.core, door.routes))

    return lifespan
