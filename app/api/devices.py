"""GET /v1/devices: the Edge TPUs, their health, libedgetpu and the TFLite runtime, the pinned set.

Answers on any host, TPU or not: what libedgetpu lists now, what the service runs on
each TPU, and why the edgetpu backend could not be used here when it cannot.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from app.api.deps import RegistryDep
from app.errors import BackendNotAvailable

router = APIRouter(prefix="/v1/devices", tags=["devices"])
EDGETPU = "edgetpu"  # the plug-in whose report this is


class LibraryOut(BaseModel):
    path: str
    loaded: bool
    version: str | None = Field(description="edgetpu_version()")
    runtime_version: int | None = Field(description="the Edge TPU runtime version (RuntimeVersion(N))")
    package_version: str | None = Field(description="the Debian package's version, where dpkg knows it")


class RuntimeOut(BaseModel):
    name: str
    version: str
    module: str


class PinnedSetOut(BaseModel):
    name: str
    description: str
    libedgetpu: str
    runtime_version: int
    tflite_runtime: str
    python: str


class InterpreterOut(BaseModel):
    model: str
    healthy: bool
    problem: str | None
    load_ms: float
    first_inference_ms: float | None = Field(description="this TPU's warm-up: its first inference")


class DeviceOut(BaseModel):
    index: int | None = Field(description="position in libedgetpu's list: the ':N' device spec; null if gone")
    type: str
    path: str
    health: Literal["healthy", "unhealthy", "unused", "missing"]
    interpreters: list[InterpreterOut]


class DevicesOut(BaseModel):
    library: LibraryOut
    tflite_runtime: RuntimeOut | None
    pinned_set: PinnedSetOut | None = Field(description="the known-good set libedgetpu and the runtime match")
    devices: list[DeviceOut]
    error: str | None = Field(description="why the edgetpu backend cannot be used here, if it cannot")


@router.get("", response_model=DevicesOut, summary="Edge TPUs, their health, and the runtime versions")
async def list_devices(registry: RegistryDep):
    # libusb enumeration can take a moment: off the event loop
    report = await asyncio.to_thread(registry.report, EDGETPU)
    if report is None:
        raise BackendNotAvailable(f"the {EDGETPU} backend is not available in this installation "
                                  "(the start-up log says why)")
    return DevicesOut.model_validate(report)
