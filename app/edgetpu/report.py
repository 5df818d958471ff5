"""What the Edge TPU plug-in reports for GET /v1/devices: the TPUs, their health, libedgetpu and the TFLite
runtime, the pinned set (its schema, and `device_report()` that fills it; its metrics: app/edgetpu/metrics.py).
Answers on any host, TPU or not: what libedgetpu lists now, what the service runs on each TPU, and why the
backend could not be used here when it cannot. The plug-in (app/engines/edgetpu.py) gathers what it knows and
calls these: the assembly lives here, with the schema."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from app.edgetpu.environment import Probe
from app.edgetpu.inventory import Inventory
from app.edgetpu.temperature import TemperatureWatch
from app.edgetpu.versions import VersionSet


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


class InterpreterOut(BaseModel):
    model: str
    healthy: bool
    problem: str | None
    load_ms: float
    first_inference_ms: float | None = Field(description="this TPU's warm-up: its first inference")


class HwWarningOut(BaseModel):
    level: int = Field(description="1: the chip raises an interrupt; 2: its shutdown alarm")
    celsius: float
    enabled: bool = Field(description="hw_temp_warnN_en: whether the chip acts on it (off by default)")


class TemperatureOut(BaseModel):
    """A PCIe TPU's thermal state from its driver's sysfs (<apex_dir>/apex_N); a USB Accelerator has none."""

    celsius: float
    warn_celsius: float = Field(description="EDGETPU_SERVE_EDGETPU_TEMPERATURE_WARN_CELSIUS")
    hot: bool = Field(description="at or above warn_celsius: a warning in the log, its models degraded in /readyz")
    trip_points_celsius: list[float | None] = Field(description="trip_point0..2_temp: where the driver lowers the "
                                                                "TPU's clock, one step each")
    hw_warnings: list[HwWarningOut]


class DeviceOut(BaseModel):
    index: int | None = Field(description="position in libedgetpu's list: the ':N' device spec; null if gone")
    type: str
    path: str
    health: Literal["healthy", "unhealthy", "unused", "missing"]
    interpreters: list[InterpreterOut]
    temperature: TemperatureOut | None = Field(
        default=None, description="PCIe TPUs: the driver's temperature, trip points and warning levels")
    problem: str | None = Field(default=None, description="why this process does not use a TPU it lists (no "
                                                          "access to its device node, say), with the fix")
    in_service: bool = Field(default=False, description="this process serves on it (several processes: its "
                                                        "claim is this process's)")


class ProbeOut(BaseModel):
    """The probe that lists the TPUs again while the service runs (EDGETPU_SERVE_EDGETPU_PROBE_INTERVAL_S)."""

    interval_s: float = Field(description="seconds between rounds; 0: off, the TPUs found at start only")
    running: bool
    last_probe: str | None = Field(description="when the TPUs were last listed (UTC)")
    in_service: int = Field(description="TPUs this process serves on now")
    waiting_for: list[str] = Field(description="EDGETPU_SERVE_EDGETPU_DEVICES specs that name no TPU now")
    probes: dict[str, int] = Field(description="rounds since start by result: unchanged, changed, failed")
    changes: dict[str, int] = Field(description="TPUs that joined and left since start")
    error: str | None = Field(description="why the last listing failed, if it did")


class EdgeTpuReport(BaseModel):
    library: LibraryOut
    tflite_runtime: RuntimeOut | None
    pinned_set: VersionSet | None = Field(description="the known-good set libedgetpu and the runtime match")
    devices: list[DeviceOut]
    probe: ProbeOut | None = Field(default=None, description="the TPUs followed while serving; null when "
                                                             "libedgetpu was not usable at start")
    error: str | None = Field(description="why the Edge TPU backend cannot be used here, if it cannot")


@dataclass(frozen=True)
class ServingOn:
    """One pool member the plug-in runs: its device's path and type, and its InterpreterOut fields."""

    path: str
    type: str
    interpreter: dict


def device_report(found: Probe, runtime: dict | None, error: str | None, serving: list[ServingOn],
                  inventory: Inventory | None, temperatures: TemperatureWatch, probe: dict | None) -> dict:
    """GET /v1/devices' Edge TPU entry: each TPU libedgetpu lists now (`found`), with what runs on it, its
    temperature and why this process does not use it; then the TPUs something still runs on that are not
    listed any more (missing); libedgetpu, the TFLite runtime (name, version, module) and the pinned set."""
    refused = inventory.refused if inventory is not None else {}
    in_service = {t.device.path for t in inventory.in_service} if inventory is not None else set()
    by_path: dict[str, list[dict]] = {}
    types: dict[str, str] = {}
    for member in serving:
        by_path.setdefault(member.path, []).append(member.interpreter)
        types[member.path] = member.type
    # a PCIe TPU's node /dev/apex_N and its driver's sysfs apex_N: one name
    thermal = {r.device: r.as_report(temperatures.warn_celsius) for r in temperatures.read()}

    def temperature(kind: str, path: str) -> dict | None:
        return thermal.get(Path(path).name) if kind == "pci" else None

    devices = [dict(index=i, type=d.type, path=d.path, health=_health(by_path.get(d.path, []), True),
                    interpreters=by_path.pop(d.path, []), temperature=temperature(d.type, d.path),
                    problem=refused.get(d.path), in_service=d.path in in_service)
               for i, d in enumerate(found.devices)]
    devices += [dict(index=None, type=types[path], path=path, health="missing", interpreters=interpreters,
                     temperature=temperature(types[path], path), in_service=False)
                for path, interpreters in by_path.items()]
    version = found.version
    return EdgeTpuReport.model_validate(dict(
        library=dict(path=found.library_path, loaded=found.loaded, version=version and version.text,
                     runtime_version=version and version.runtime_version,
                     package_version=version and version.package),
        tflite_runtime=runtime,
        pinned_set=found.pinned_set,
        devices=devices,
        probe=probe,
        error=error,
    )).model_dump()


def probe_report(inventory: Inventory | None, interval_s: float, running: bool) -> dict | None:
    """The probe's part of the report (ProbeOut); None without an inventory (libedgetpu unusable at start)."""
    if inventory is None:
        return None
    counts = inventory.counts
    return dict(interval_s=interval_s, running=running, last_probe=_utc(inventory.last_probe_at),
                in_service=len(inventory.in_service), waiting_for=inventory.waiting_for, probes=dict(counts.probes),
                changes=dict(counts.changes), error=inventory.error)


def _utc(unix: float | None) -> str | None:
    return None if unix is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))


def _health(interpreters: list[dict], listed: bool) -> str:
    if not listed:
        return "missing"
    if not interpreters:
        return "unused"
    return "healthy" if all(i["healthy"] for i in interpreters) else "unhealthy"
