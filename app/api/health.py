"""GET /healthz (the process answers) and GET /readyz (every model serving: ready or degraded)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.api.deps import RegistryDep
from app.api.schemas import LiveOut, ModelStateOut, ReadyOut
from app.registry import iso_time

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=LiveOut)
async def healthz():
    return LiveOut(live=True)


@router.get("/readyz", response_model=ReadyOut, responses={503: {"model": ReadyOut}})
async def readyz(registry: RegistryDep):
    models = {}
    for name in registry.names():
        status = registry.status(name)
        models[name] = ModelStateOut(state=status.state, error=status.error, since=iso_time(status.since))
    if registry.ready():
        return ReadyOut(ready=True, models=models)
    waiting = sorted(name for name, m in models.items() if m.state not in ("ready", "degraded"))
    body = ReadyOut(ready=False, models=models, error=f"not ready: {', '.join(waiting) or 'no models'}")
    return JSONResponse(body.model_dump(), status_code=503)
