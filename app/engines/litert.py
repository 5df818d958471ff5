"""The one place the TFLite runtime is imported.

ai_edge_litert (PyPI, works with numpy 2) everywhere by default; tflite_runtime where an
image installs it together with the libedgetpu built from the same TensorFlow release:
an installed tflite_runtime of a pinned version (app/edgetpu/versions.toml) comes first.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from types import ModuleType

from app.edgetpu.versions import pins
from app.errors import EngineLoadError

log = logging.getLogger(__name__)

# module to import -> distribution that provides it
AI_EDGE_LITERT = ("ai_edge_litert.interpreter", "ai-edge-litert")
TFLITE_RUNTIME = ("tflite_runtime.interpreter", "tflite-runtime")
RUNTIMES = (AI_EDGE_LITERT, TFLITE_RUNTIME)


@dataclass(frozen=True)
class Runtime:
    module: ModuleType
    name: str
    version: str

    @property
    def Interpreter(self):  # noqa: N802 (the runtime's own class name)
        return self.module.Interpreter

    @property
    def load_delegate(self):
        return self.module.load_delegate


def preference() -> tuple[tuple[str, str], ...]:
    """tflite_runtime first where its version is pinned with a libedgetpu (the Edge TPU images)."""
    try:
        installed = metadata.version(TFLITE_RUNTIME[1])
    except metadata.PackageNotFoundError:
        installed = None
    if installed in {version_set.tflite_runtime for version_set in pins().sets}:
        return (TFLITE_RUNTIME, AI_EDGE_LITERT)
    return RUNTIMES


@cache
def runtime() -> Runtime:
    problems = []
    for module_name, distribution in preference():
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            problems.append(f"{module_name}: {e}")
            continue
        try:
            version = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            version = "unknown"
        log.info("TFLite runtime: %s %s (%s)", distribution, version, module_name)
        return Runtime(module, distribution, version)
    raise EngineLoadError(
        "no TFLite runtime found (" + "; ".join(problems) + "): pip install ai-edge-litert==2.3.0"
    )
