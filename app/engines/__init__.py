"""Backends by key. A backend whose runtime cannot be imported is left out, never fatal."""

from __future__ import annotations

import logging

from app.engines.base import Engine, EngineOptions, TensorSpec
from app.engines.cpu import CpuEngine

log = logging.getLogger(__name__)

ENGINES: dict[str, type[Engine]] = {CpuEngine.key: CpuEngine}

try:
    from app.engines.emulated import EmulatedEngine

    ENGINES[EmulatedEngine.key] = EmulatedEngine
except ImportError as e:  # e.g. no flatbuffers schema: the other backends still serve
    log.warning("emulated backend left out: %s", e)

try:
    from app.engines.edgetpu import EdgeTpuEngine

    ENGINES[EdgeTpuEngine.key] = EdgeTpuEngine
except ImportError as e:  # e.g. no flatbuffers: the other backends still serve
    log.warning("edgetpu backend left out: %s", e)

__all__ = ["ENGINES", "Engine", "EngineOptions", "TensorSpec"]
