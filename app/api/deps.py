"""What every HTTP route shares, handed to the app once (app/api/app.py `http_app`): the service it is a door of, the
API keys, the table of inference routes (`HttpDoor`). A route reads it through `door_of(request)`, or through the
dependencies below (`ServiceDep`, `CoreDep`, `SettingsDep`); the inference routes read it per request without
FastAPI's dependency solving, whose cost per request bench/loop_cost.py measured.

The door asks of its service only what `ServiceView` says (app/service.py `Service` is one): the HTTP door is one of
the service's doors, beside Frigate's ZMQ door, and knows the service no better than that one does."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Annotated, Protocol

from fastapi import Depends, FastAPI, Request

from app.api.keys import ApiKeys
from app.api.routes import InferenceRoutes
from app.core import Core
from app.core.faces import Faces
from app.processes.siblings import Siblings
from app.settings import Settings


class DoorsView(Protocol):
    def problems(self) -> dict[str, str]:
        """Each of the service's doors that does not serve, and why (for /readyz)."""

    def reports(self) -> dict[str, dict]:
        """What each door says of itself (for /v1/devices)."""


class ServiceView(Protocol):
    """What the HTTP door asks of the service it opens onto."""

    settings: Settings
    core: Core
    faces: Faces  # the face commands (app/core/faces.py)
    siblings: Siblings | None  # the other worker processes of its group; None: alone
    doors: DoorsView

    def running(self) -> AbstractAsyncContextManager:
        """The service running for a block (the app's lifespan): started there unless its owner started it."""

    async def reload(self, name: str) -> None:
        """Reload a model in every worker process, each in place."""

    def device_reports(self) -> dict[str, dict]:
        """Each backend plug-in's report on itself and its devices. Blocking."""


class HttpDoor:
    """The HTTP door of a service: the service, and what only HTTP needs of it. Its core and settings are plain
    attributes: the inference routes read them per request."""

    __slots__ = ("service", "keys", "routes", "core", "settings")

    def __init__(self, service: ServiceView, keys: ApiKeys, routes: InferenceRoutes):
        self.service = service
        self.keys = keys
        self.routes = routes  # the inference routes: shedding, counting and admission read them
        self.core: Core = service.core
        self.settings: Settings = service.settings


def attach(app: FastAPI, door: HttpDoor) -> None:
    """Hand `app` its door: once, as it is made."""
    app.state.door = door


def door_of(request: Request) -> HttpDoor:
    """The door of the app serving `request`."""
    return request.app.state.door


def app_door(app: FastAPI) -> HttpDoor:
    """The door of an app made by http_app (for whoever holds the app: a test, a benchmark)."""
    return app.state.door


def service_of(app: FastAPI) -> ServiceView:
    """The service an app made by http_app is a door of."""
    return app.state.door.service


# async on purpose: FastAPI runs a plain-def dependency on its thread pool, a thread hop per request.
async def _service(request: Request) -> ServiceView:
    return door_of(request).service


async def _core(request: Request) -> Core:
    return door_of(request).service.core


async def _settings(request: Request) -> Settings:
    return door_of(request).service.settings


ServiceDep = Annotated[ServiceView, Depends(_service)]
CoreDep = Annotated[Core, Depends(_core)]
SettingsDep = Annotated[Settings, Depends(_settings)]
