"""Shared request dependencies: the settings and the registry, from the app's state."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.registry import Registry
from app.settings import Settings


# async on purpose: FastAPI runs a plain-def dependency on its thread pool, a thread hop per request.
async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_registry(request: Request) -> Registry:
    return request.app.state.registry


SettingsDep = Annotated[Settings, Depends(get_settings)]
RegistryDep = Annotated[Registry, Depends(get_registry)]
