"""GET /v1/models, GET /v1/models/{name}, POST /v1/models/{name}/reload.

Every backend plug-in may add keys to a model's answer and to each backend's entry in it
(Backend.describe_model, Backend.describe_backend): what a device's plug-in knows of the model."""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import APIRouter, Request
from pydantic import BaseModel

from app.api.auth import AdminKey
from app.api.deps import RegistryDep
from app.api.schemas import (
    BackendOut,
    ErrorResponse,
    FileOut,
    ModelOut,
    ModelsOut,
    ProvenanceOut,
    TensorOut,
)
from app.engines import TensorSpec
from app.processes.siblings import reload_everywhere
from app.registry import Registry, iso_time
from app.settings import CLASSIFICATION_DEFAULT, DETECTION_DEFAULT

router = APIRouter(prefix="/v1/models", tags=["models"])
ERRORS = {status: {"model": ErrorResponse} for status in (404, 409, 503)}
ADMIN_ERRORS = {status: {"model": ErrorResponse} for status in (401, 403, 404, 409, 503)}


def _tensor(spec: TensorSpec) -> TensorOut:
    return TensorOut(name=spec.name, shape=list(spec.shape), dtype=spec.dtype.name,
                     scale=spec.scale, zero_point=spec.zero_point)


def _added(out: type[BaseModel], contributions: Iterable[dict]) -> dict:
    """The plug-ins' keys for a response model, merged in registry order; the core's own fields win."""
    merged = {}
    for keys in contributions:
        merged.update((key, value) for key, value in keys.items() if key not in out.model_fields)
    return merged


def provenance(model_dir) -> ProvenanceOut:
    manifest = model_dir.manifest
    command = manifest.build.command if manifest.build else None
    imported = manifest.imported
    if imported is None:
        return ProvenanceOut(origin="built", command=command)
    return ProvenanceOut(origin="imported", command=command, files=[f.model_dump() for f in imported.files],
                         labels=imported.labels, input=imported.input, metadata=imported.metadata or None)


def describe(registry: Registry, name: str) -> ModelOut:
    """A model as clients see it; `default`: it is the model of its task's routes when they name none (the
    default model of /v1/classify, of /v1/detect), as settled at start."""
    status = registry.status(name)
    model_dir = registry.models.model_dir(name)
    version = registry.serving(name)
    loaded = {key: pool.members for key, pool in version.pools.items()} if version else {}
    manifest = model_dir.manifest
    plugins = registry.plugins.values()
    backends = {
        key: BackendOut(interpreters=members.interpreters, warm=members.warm, load_ms=members.load_ms,
                        first_inference_ms=members.first_inference_ms,
                        input=_tensor(members.inputs[0]), output=_tensor(members.outputs[0]),
                        **_added(BackendOut, (plugin.describe_backend(key, members.engine, model_dir)
                                              for plugin in plugins)))
        for key, members in loaded.items()
    }
    return ModelOut(
        name=name, task=manifest.task, state=status.state, error=status.error, since=iso_time(status.since),
        version=version.number if version else None, loaded_at=iso_time(version.loaded_at) if version else None,
        default=name in registry.defaults.by_task.values(),
        description=manifest.description, source=manifest.source, licence=manifest.licence,
        labels=len(model_dir.labels), input=manifest.input.model_dump(), output=manifest.output.model_dump(),
        backends=backends, files={k: FileOut(**v.model_dump()) for k, v in manifest.files.items()},
        quality=manifest.quality_dict(), provenance=provenance(model_dir),
        segments=manifest.segments.model_dump(mode="json") if manifest.segments else None,
        **_added(ModelOut, (plugin.describe_model(model_dir) for plugin in plugins)),
    )


@router.get("", response_model=ModelsOut)
async def list_models(registry: RegistryDep):
    return ModelsOut(default_model=registry.default_for(CLASSIFICATION_DEFAULT.task),
                     default_detection_model=registry.default_for(DETECTION_DEFAULT.task),
                     default_backend=registry.default_backend,
                     models=[describe(registry, n) for n in registry.names()])


@router.get("/{name}", response_model=ModelOut, responses=ERRORS)
async def get_model(name: str, registry: RegistryDep):
    registry.status(name)  # ModelNotFound for a name that is not served
    return describe(registry, name)


@router.post("/{name}/reload", response_model=ModelOut, responses=ADMIN_ERRORS, dependencies=[AdminKey],
             summary="Reload from disk; the next request on each interpreter is cold again")
async def reload_model(name: str, request: Request, registry: RegistryDep):
    await reload_everywhere(registry, request.app.state.siblings, name)  # every worker process, each in place
    return describe(registry, name)
