"""The HTTP front doors' inference routers, found rather than listed: every module of app/api (and of app/api/v2)
that declares `INFERENCE_ROUTERS` offers them, in module-name order, then those added from outside before the app
is created (`add`: a test's throwaway task). So a new task's door is its module here, touching no list; the app
includes them first (app/main.py), and the table of inference routes is read from them (app/api/routes.py)."""

from __future__ import annotations

import importlib
import pkgutil

from fastapi import APIRouter

import app.api
import app.api.v2

_ADDED: list[APIRouter] = []


def inference_routers() -> list[APIRouter]:
    found = []
    for package in (app.api, app.api.v2):
        for module in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
            if module.ispkg:
                continue
            found += getattr(importlib.import_module(f"{package.__name__}.{module.name}"), "INFERENCE_ROUTERS", ())
    return found + _ADDED


def add(router: APIRouter) -> None:
    """An inference router from outside app/api, for the apps created from now on."""
    _ADDED.append(router)


def remove(router: APIRouter) -> None:
    if router in _ADDED:
        _ADDED.remove(router)
