"""The one place the TFLite runtime is imported.

ai_edge_litert (PyPI, works with numpy 2) everywhere by default; tflite_runtime where an
image installs it together with the libedgetpu built from the same TensorFlow release.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from types import ModuleType

from app.errors import EngineLoadError

# module to import -> distribution that provides it, in order of preference
RUNTIMES = (
    ("ai_edge_litert.interpreter", "ai-edge-litert"),
    ("tflite_runtime.interpreter", "tflite-runtime"),
)


@dataclass(frozen=True)
class Runtime:
    module: ModuleType
    name: str
    version: str

    @property
    def Interpreter(self):  # noqa: N802 (the runtime's own class name)
        return self.module.Interpreter


@cache
def runtime() -> Runtime:
    problems = []
    for module_name, distribution in RUNTIMES:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            problems.append(f"{module_name}: {e}")
            continue
        try:
            version = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            version = "unknown"
        return Runtime(module, distribution, version)
    raise EngineLoadError(
        "no TFLite runtime found (" + "; ".join(problems) + "): pip install ai-edge-litert==2.3.0"
    )
