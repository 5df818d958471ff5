"""GET /v1/models, GET /v1/models/{name}, POST /v1/models/{name}/reload."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from app.api.deps import RegistryDep, SettingsDep
from app.api.schemas import (
    BackendOut,
    EdgeTpuViewOut,
    ErrorResponse,
    FileOut,
    ModelOut,
    ModelsOut,
    OpViewOut,
    TensorOut,
)
from app.edgetpu.compat import CompatReport
from app.engines import TensorSpec
from app.errors import NotReady
from app.model_dir import read_model_dir
from app.registry import Registry

router = APIRouter(prefix="/v1/models", tags=["models"])
ERRORS = {status: {"model": ErrorResponse} for status in (404, 409, 503)}


def _tensor(spec: TensorSpec) -> TensorOut:
    return TensorOut(name=spec.name, shape=list(spec.shape), dtype=spec.dtype.name,
                     scale=spec.scale, zero_point=spec.zero_point)


def _edgetpu_view(report: CompatReport | None) -> EdgeTpuViewOut | None:
    if report is None:
        return None
    ops = [OpViewOut(index=v.index, opcode=v.opcode, on_edgetpu=report.on_edgetpu(v.index), supported=v.supported,
                     reason=v.reason) for v in report.ops]
    first = report.first_unsupported
    return EdgeTpuViewOut(summary=report.summary(), mapped=report.mapped, total=report.total,
                          first_unsupported=None if first is None else ops[first.index], ops=ops)


def describe(registry: Registry, default_model: str, name: str) -> ModelOut:
    status = registry.status(name)
    try:
        loaded = registry.get(name)
        model_dir, pools = loaded.model_dir, loaded.pools
    except NotReady:
        model_dir, pools = read_model_dir(registry.settings.model_dir / name), {}
    manifest = model_dir.manifest
    backends = {
        key: BackendOut(interpreters=len(pool.members), warm=pool.warm, load_ms=pool.load_ms,
                        first_inference_ms=pool.first_inference_ms,
                        input=_tensor(pool.engine.input), output=_tensor(pool.engine.output),
                        edgetpu_view=_edgetpu_view(pool.engine.edgetpu_view))
        for key, pool in pools.items()
    }
    return ModelOut(
        name=name, state=status.state, error=status.error, default=name == default_model,
        description=manifest.description, source=manifest.source, licence=manifest.licence,
        labels=len(model_dir.labels), input=manifest.input.model_dump(), output=manifest.output.model_dump(),
        backends=backends, files={k: FileOut(**v.model_dump()) for k, v in manifest.files.items()},
        quality=manifest.quality_dict(),
    )


@router.get("", response_model=ModelsOut)
async def list_models(registry: RegistryDep, settings: SettingsDep):
    return ModelsOut(default_model=settings.default_model, default_backend=registry.default_backend,
                     models=[describe(registry, settings.default_model, n) for n in registry.names()])


@router.get("/{name}", response_model=ModelOut, responses=ERRORS)
async def get_model(name: str, registry: RegistryDep, settings: SettingsDep):
    registry.status_or_raise(name)
    return describe(registry, settings.default_model, name)


@router.post("/{name}/reload", response_model=ModelOut, responses=ERRORS,
             summary="Reload from disk; the next request on each interpreter is cold again")
async def reload_model(name: str, registry: RegistryDep, settings: SettingsDep):
    await asyncio.to_thread(registry.reload, name)
    return describe(registry, settings.default_model, name)
