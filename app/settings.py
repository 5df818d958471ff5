"""Every setting of the service, from environment variables prefixed EDGETPU_SERVE_."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.edgetpu.delegate import PERFORMANCE, is_device_spec

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "models"


def _split(value):
    """Lists from the environment as comma-separated words: EDGETPU_SERVE_BACKENDS=cpu,emulated."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EDGETPU_SERVE_", extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    log_level: str = "info"

    model_dir: Path = DEFAULT_MODEL_DIR
    # Models to serve (names of sub-directories of model_dir); empty = every one found.
    models: Annotated[list[str], NoDecode] = []
    default_model: str = "efficientnet_lite0"
    # Backends each model is loaded on; the first is the default for requests.
    backends: Annotated[list[str], NoDecode] = ["cpu"]

    # Interpreters per (model, backend): requests beyond that wait in line.
    workers: int = Field(default=os.cpu_count() or 1, ge=1, le=64)
    cpu_threads: int = Field(default=1, ge=1, le=64, description="threads per CPU interpreter")
    max_waiting: int = Field(default=32, ge=0, description="requests allowed to wait per pool before 503")
    wait_timeout_s: float = Field(default=10.0, gt=0, description="longest wait for an interpreter before 503")
    # The deadline of one invoke on a backend without a watchdog: past it the request gets a 504.
    invoke_timeout_s: float = Field(default=30.0, gt=0)
    # SIGTERM: requests already admitted get this long to finish before interpreters are closed.
    drain_timeout_s: float = Field(default=10.0, ge=0)
    retry_after_s: int = Field(default=1, ge=0)
    warmup_at_start: bool = True
    # Threads that decode and resize images: more than the cores the interpreters leave free
    # only preempt them, and each holds a decoded image (app/inference.py ImageWork).
    # Unset: half the cores when an interpreter computes on them (cpu, emulated), every core
    # when only devices do (edgetpu): app.inference.image_threads.
    image_threads: int | None = Field(default=None, ge=1, le=64)

    # The edgetpu backend: one interpreter per TPU (`workers` does not apply to it).
    # The platform's libedgetpu (libedgetpu.so.1, libedgetpu.1.dylib, edgetpu.dll) unless a path is given.
    edgetpu_library: str | None = None
    # Delegate device specs, one interpreter each (":0", "usb", "usb:1", "pci:0"); empty = every TPU listed.
    edgetpu_devices: Annotated[list[str], NoDecode] = []
    edgetpu_performance: Literal[PERFORMANCE] | None = Field(
        default=None, description="the delegate's Performance option; unset = the library's default (Max)")
    # fail: refuse to start without a usable TPU; fallback: serve those models on `cpu` (plain int8 file).
    edgetpu_on_failure: Literal["fail", "fallback"] = "fail"
    # strict: libedgetpu + TFLite runtime must be a pinned set (app/edgetpu/versions.toml); warn: log and go on.
    edgetpu_version_check: Literal["strict", "warn"] = "strict"
    # An invoke longer than this marks its device unhealthy: out of the pool until re-created.
    watchdog_timeout_s: float = Field(default=5.0, gt=0)
    watchdog_backends: Annotated[list[str], NoDecode] = ["edgetpu"]
    watchdog_retry_s: float = Field(default=2.0, gt=0, description="wait between attempts to re-create a device")

    max_body_bytes: int = Field(default=20 * 1024 * 1024, ge=1)
    max_image_pixels: int = Field(default=50_000_000, ge=1, description="decompression bomb guard")
    max_top_k: int = Field(default=1000, ge=1)

    @field_validator("models", "backends", "edgetpu_devices", "watchdog_backends", mode="before")
    @classmethod
    def _comma_separated(cls, value):
        return _split(value)

    @field_validator("backends")
    @classmethod
    def _at_least_one(cls, value):
        if not value:
            raise ValueError("at least one backend is needed")
        return value

    @field_validator("edgetpu_devices")
    @classmethod
    def _device_specs(cls, value):
        wrong = [spec for spec in value if not is_device_spec(spec)]
        if wrong:
            raise ValueError(f"{wrong}: each device is ':N', 'usb', 'usb:N', 'pci' or 'pci:N'")
        return value
