"""GET /v1/devices: what each backend plug-in reports about itself and its devices, by backend key.

Every plug-in available in this installation answers, configured or not, on any host: an
accelerator's plug-in says what it finds now (devices, their health, its runtime versions) and
why it cannot be used here when it cannot. Plug-ins with nothing to report (the host's CPU)
are left out. The shape of each report is its plug-in's (GET /openapi.json does not fix it).

Under several worker processes (app/processes) it answers for all of them: each TPU once, with the
interpreters and the slot (`worker`) of the worker that uses it, and under `workers` which TPUs
each worker holds (app/processes/views.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from app.api.deps import ServiceDep
from app.processes import views

router = APIRouter(prefix="/v1/devices", tags=["devices"])


class WorkerDevicesOut(BaseModel):
    slot: int
    answering: bool = Field(description="false: gone (a replacement on its way), or not started yet")
    devices: list[str] = Field(description="the paths of the devices it runs interpreters on")


class DevicesOut(BaseModel):
    backends: dict[str, dict[str, Any]] = Field(
        description="backend key -> its plug-in's report (for an accelerator: its devices, their health, its runtime)")
    frontdoors: dict[str, dict[str, Any]] | None = Field(
        default=None, description="the doors that are not HTTP (Frigate's ZMQ protocol: endpoint, serving, clients, "
                                  "answered and refused by reason)")
    workers: list[WorkerDevicesOut] | None = Field(
        default=None, description="several worker processes (EDGETPU_SERVE_PROCESSES): the devices each one holds")


@router.get("", response_model=DevicesOut, response_model_exclude_none=True,
            summary="Each backend's devices, their health, and its runtime")
async def list_devices(service: ServiceDep):
    siblings = service.siblings
    frontdoors = service.doors.reports() or None  # the service's doors that report (Frigate's ZMQ door)
    if siblings is not None:
        backends, workers = views.devices(await siblings.everyone("devices"))
        return DevicesOut(backends=backends, frontdoors=frontdoors, workers=[WorkerDevicesOut(**w) for w in workers])
    # a plug-in may enumerate devices (libusb can take a moment): off the event loop
    return DevicesOut(backends=await asyncio.to_thread(service.device_reports), frontdoors=frontdoors)
