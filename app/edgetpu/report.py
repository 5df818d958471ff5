"""What the Edge TPU plug-in reports for GET /v1/devices: the TPUs, their health, libedgetpu and
the TFLite runtime, the pinned set. Answers on any host, TPU or not: what libedgetpu lists now,
what the service runs on each TPU, and why the backend could not be used here when it cannot."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

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
