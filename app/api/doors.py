"""The HTTP front doors' inference routers, found rather than listed: every module of app/api (and of app/api/v2)
that declares `INFERENCE_ROUTERS` offers them, then those added from outside before the app is created (`add`: a
test's throwaway task). So a new task's door is its module here, touching no list; the app includes them first
(app/main.py), and the table of inference routes is read from them (app/api/routes.py).

Their order is the order in which a request is matched against their routes, one route after another (about
7 us each on a 2-core x86-64 under FastAPI 0.165): a module's `INFERENCE_RANK` (lower first; DEFAULT_RANK when
it declares none), then its name. The native routes and OIP v2's tensors rank first (a refused v2 infer cost
0.141 ms of loop CPU before this round's four doors, 0.225 ms with eight of their routes ahead of it: bench/
loop_cost.py); a door that must precede another ranks just before it (CodeProject.AI's /v1/vision/custom/list
before DeepStack's /v1/vision/custom/{name}); a new door takes the default, after them."""

from __future__ import annotations

import importlib
import pkgutil

from fastapi import APIRouter

import app.api
import app.api.v2

DEFAULT_RANK = 100
_ADDED: list[APIRouter] = []


def inference_routers() -> list[APIRouter]:
    doors = []
    for package in (app.api, app.api.v2):
        for module in pkgutil.iter_modules(package.__path__):
            if not module.ispkg:
                found = importlib.import_module(f"{package.__name__}.{module.name}")
                if hasattr(found, "INFERENCE_ROUTERS"):
                    doors.append((getattr(found, "INFERENCE_RANK", DEFAULT_RANK), found.__name__, found))
    return [router for *_, door in sorted(doors, key=lambda d: d[:2]) for router in door.INFERENCE_ROUTERS] + _ADDED


def add(router: APIRouter) -> None:
    """An inference router from outside app/api, for the apps created from now on."""
    _ADDED.append(router)


def remove(router: APIRouter) -> None:
    if router in _ADDED:
        _ADDED.remove(router)
