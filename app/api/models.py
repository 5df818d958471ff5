"""GET /v1/models, GET /v1/models/{name}, POST /v1/models/{name}/reload."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from app.api.auth import AdminKey
from app.api.deps import RegistryDep, SettingsDep
from app.api.schemas import (
    BackendOut,
    EdgeTpuViewOut,
    ErrorResponse,
    FileOut,
    ModelOut,
    ModelsOut,
    TensorOut,
)
from app.edgetpu.compat import CompatReport
from app.engines import TensorSpec
from app.registry import Registry, iso_time

router = APIRouter(prefix="/v1/models", tags=["models"])
ERRORS = {status: {"model": ErrorResponse} for status in (404, 409, 503)}
ADMIN_ERRORS = {status: {"model": ErrorResponse} for status in (401, 403, 404, 409, 503)}


def _tensor(spec: TensorSpec) -> TensorOut:
    return TensorOut(name=spec.name, shape=list(spec.shape), dtype=spec.dtype.name,
                     scale=spec.scale, zero_point=spec.zero_point)


def _edgetpu_view(report: CompatReport | None) -> EdgeTpuViewOut | None:
    return None if report is None else EdgeTpuViewOut.model_validate(report.to_dict())


def describe(registry: Registry, default_model: str, name: str) -> ModelOut:
    status = registry.status(name)
    model_dir = registry.model_dir(name)
    version = registry.serving(name)
    pools = version.pools if version else {}
    manifest = model_dir.manifest
    backends = {
        key: BackendOut(interpreters=len(pool.members), warm=pool.warm, load_ms=pool.load_ms,
                        first_inference_ms=pool.first_inference_ms,
                        input=_tensor(pool.engine.input), output=_tensor(pool.engine.output),
                        edgetpu_view=_edgetpu_view(pool.engine.edgetpu_view))
        for key, pool in pools.items()
    }
    return ModelOut(
        name=name, state=status.state, error=status.error, since=iso_time(status.since),
        version=version.number if version else None, loaded_at=iso_time(version.loaded_at) if version else None,
        default=name == default_model,
        description=manifest.description, source=manifest.source, licence=manifest.licence,
        labels=len(model_dir.labels), input=manifest.input.model_dump(), output=manifest.output.model_dump(),
        backends=backends, files={k: FileOut(**v.model_dump()) for k, v in manifest.files.items()},
        quality=manifest.quality_dict(),
        segments=manifest.segments.model_dump(mode="json") if manifest.segments else None,
        edgetpu_estimate=manifest.edgetpu_estimate.model_dump() if manifest.edgetpu_estimate else None,
    )


@router.get("", response_model=ModelsOut)
async def list_models(registry: RegistryDep, settings: SettingsDep):
    return ModelsOut(default_model=settings.default_model, default_backend=registry.default_backend,
                     models=[describe(registry, settings.default_model, n) for n in registry.names()])


@router.get("/{name}", response_model=ModelOut, responses=ERRORS)
async def get_model(name: str, registry: RegistryDep, settings: SettingsDep):
    registry.status_or_raise(name)
    return describe(registry, settings.default_model, name)


@router.post("/{name}/reload", response_model=ModelOut, responses=ADMIN_ERRORS, dependencies=[AdminKey],
             summary="Reload from disk; the next request on each interpreter is cold again")
async def reload_model(name: str, registry: RegistryDep, settings: SettingsDep):
    await asyncio.to_thread(registry.reload, name)
    return describe(registry, settings.default_model, name)
