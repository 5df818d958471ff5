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
from app.registry import Registry

router = APIRouter(prefix="/v1/devices", tags=["devices"])


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


def _health(interpreters: list[InterpreterOut], listed: bool) -> str:
    if not listed:
        return "missing"
    if not interpreters:
        return "unused"
    return "healthy" if all(i.healthy for i in interpreters) else "unhealthy"


def _report(registry: Registry) -> DevicesOut:
    inventory = registry.edgetpu_inventory()
    rt, found = inventory.runtime, inventory.probe
    by_path: dict[str, list[InterpreterOut]] = {}
    types: dict[str, str] = {}
    for model, member in registry.edgetpu_members():
        by_path.setdefault(member.device, []).append(InterpreterOut(
            model=model, healthy=member.healthy, problem=member.problem, load_ms=member.load_ms,
            first_inference_ms=member.first_inference_ms))
        types[member.device] = member.options.tpu.type
    devices = [DeviceOut(index=i, type=d.type, path=d.path, health=_health(by_path.get(d.path, []), True),
                         interpreters=by_path.pop(d.path, []))
               for i, d in enumerate(found.devices)]
    devices += [DeviceOut(index=None, type=types[path], path=path, health="missing", interpreters=interpreters)
                for path, interpreters in by_path.items()]
    version = found.version
    return DevicesOut(
        library=LibraryOut(path=found.library_path, loaded=found.loaded, version=version and version.text,
                           runtime_version=version and version.runtime_version,
                           package_version=version and version.package),
        tflite_runtime=RuntimeOut(name=rt.name, version=rt.version, module=rt.module.__name__) if rt else None,
        pinned_set=PinnedSetOut(**vars(found.pinned_set)) if found.pinned_set else None,
        devices=devices,
        error=inventory.error,
    )


@router.get("", response_model=DevicesOut, summary="Edge TPUs, their health, and the runtime versions")
async def list_devices(registry: RegistryDep):
    # libusb enumeration can take a moment: off the event loop
    return await asyncio.to_thread(_report, registry)
