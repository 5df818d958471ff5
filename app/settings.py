"""Every setting of the service, from environment variables prefixed EDGETPU_SERVE_."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

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
    retry_after_s: int = Field(default=1, ge=0)
    warmup_at_start: bool = True

    max_body_bytes: int = Field(default=20 * 1024 * 1024, ge=1)
    max_image_pixels: int = Field(default=50_000_000, ge=1, description="decompression bomb guard")
    max_top_k: int = Field(default=1000, ge=1)

    @field_validator("models", "backends", mode="before")
    @classmethod
    def _comma_separated(cls, value):
        return _split(value)

    @field_validator("backends")
    @classmethod
    def _at_least_one(cls, value):
        if not value:
            raise ValueError("at least one backend is needed")
        return value
