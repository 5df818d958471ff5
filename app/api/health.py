"""GET /healthz (the process answers) and GET /readyz (every model serving: ready or degraded).

Ready means every model serves somewhere: a model a backend cannot run is "degraded", with one line per backend
saying why, and the answer is still 200; 503 while a model loads, or where one is failed (no backend serves it).

Under several worker processes, /readyz answers for all of them (app/processes/views.py), with each one's
own view under `workers`; /healthz answers for the worker that took the connection."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.api.deps import ServiceDep
from app.api.schemas import LiveOut, ModelStateOut, ReadyOut, WorkerStateOut
from app.processes import views
from app.registry import iso_time

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=LiveOut)
async def healthz():
    return LiveOut(live=True)


@router.get("/readyz", response_model=ReadyOut, responses={503: {"model": ReadyOut}})
async def readyz(service: ServiceDep):
    siblings, core = service.siblings, service.core
    if siblings is not None:  # several worker processes: every one's state, merged (app/processes/views.py)
        ready, states, workers = views.readiness(await siblings.everyone("status"))
        models = {name: ModelStateOut(state=m["state"], error=m["error"], since=iso_time(m["since"]))
                  for name, m in states.items()}
        workers = [WorkerStateOut(**w) for w in workers]
    else:
        models, workers = {}, None
        for name in core.models():
            status = core.status(name)
            models[name] = ModelStateOut(state=status.state, error=status.error, since=iso_time(status.since))
        ready = core.ready()
    closed = service.doors.problems()  # the service's doors that do not serve (Frigate's ZMQ door, say)
    if ready and not closed:
        return ReadyOut(ready=True, models=models, workers=workers)
    waiting = sorted(name for name, m in models.items() if m.state not in ("ready", "degraded"))
    error = f"not ready: {', '.join(waiting + list(closed.values())) or 'no models'}"
    body = ReadyOut(ready=False, models=models, error=error, workers=workers)
    return JSONResponse(body.model_dump(), status_code=503)
