"""Shared request dependencies: the settings and the registry, from the app's state."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.errors import ModelNotFound
from app.registry import Registry
from app.settings import DefaultOf, Settings


# async on purpose: FastAPI runs a plain-def dependency on its thread pool, a thread hop per request.
async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_registry(request: Request) -> Registry:
    return request.app.state.registry


SettingsDep = Annotated[Settings, Depends(get_settings)]
RegistryDep = Annotated[Registry, Depends(get_registry)]


def named_or_default(name: str | None, registry: Registry, settings: Settings, default: DefaultOf, route: str) -> str:
    """The model a request names, else its task's default (settled at start); ModelNotFound when none is served."""
    if name is not None:
        return name
    chosen = registry.default_model(default.task)
    if chosen is None:
        raise ModelNotFound(f"no {default.task} model is served, so {route} has none to default to; serving "
                            f"{registry.names()}")
    return chosen
