"""GET /v1/models, GET /v1/models/{name}, POST /v1/models/{name}/reload: each model as the core describes it
(app/core/catalog.py: one description for every door).

Every backend plug-in may add keys to a model's answer and to each backend's entry in it
(Backend.describe_model, Backend.describe_backend): what a device's plug-in knows of the model."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from app.api.auth import AdminKey
from app.api.deps import CoreDep, ServiceDep
from app.api.schemas import ErrorResponse
from app.core import ModelDescription
from app.settings import CLASSIFICATION_DEFAULT, DETECTION_DEFAULT

router = APIRouter(prefix="/v1/models", tags=["models"])
ERRORS = {status: {"model": ErrorResponse} for status in (404, 409, 503)}
ADMIN_ERRORS = {status: {"model": ErrorResponse} for status in (401, 403, 404, 409, 503)}


class ModelsOut(BaseModel):
    default_model: str | None  # None: no classification model is served
    default_detection_model: str | None = None  # None: no detection model is served
    default_backend: str
    models: list[ModelDescription]


@router.get("", response_model=ModelsOut)
async def list_models(core: CoreDep):
    return ModelsOut(default_model=core.default_model(CLASSIFICATION_DEFAULT.task),
                     default_detection_model=core.default_model(DETECTION_DEFAULT.task),
                     default_backend=core.backends()[0], models=[core.describe(n) for n in core.models()])


@router.get("/{name}", response_model=ModelDescription, responses=ERRORS)
async def get_model(name: str, core: CoreDep):
    return core.describe(name)  # ModelNotFound for a name that is not served


@router.post("/{name}/reload", response_model=ModelDescription, responses=ADMIN_ERRORS, dependencies=[AdminKey],
             summary="Reload from disk; the next request on each interpreter is cold again")
async def reload_model(name: str, service: ServiceDep):
    await service.reload(name)  # every worker process, each in place
    return service.core.describe(name)
