"""GET /v1/devices: what each backend plug-in reports about itself and its devices, by backend key.

Every plug-in available in this installation answers, configured or not, on any host: an
accelerator's plug-in says what it finds now (devices, their health, its runtime versions) and
why it cannot be used here when it cannot. Plug-ins with nothing to report (the host's CPU)
are left out. The shape of each report is its plug-in's (GET /openapi.json does not fix it).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from app.api.deps import RegistryDep

router = APIRouter(prefix="/v1/devices", tags=["devices"])


class DevicesOut(BaseModel):
    backends: dict[str, dict[str, Any]] = Field(
        description="backend key -> its plug-in's report (for an accelerator: its devices, their health, its runtime)")


@router.get("", response_model=DevicesOut, summary="Each backend's devices, their health, and its runtime")
async def list_devices(registry: RegistryDep):
    # a plug-in may enumerate devices (libusb can take a moment): off the event loop
    return DevicesOut(backends=await asyncio.to_thread(registry.reports))
