"""The one place the TFLite runtime is imported.

ai_edge_litert (PyPI, works with numpy 2) everywhere by default; tflite_runtime where an
image installs it together with a device library built from the same TensorFlow release: an
installed tflite_runtime of a version some plug-in pins (`prefer_tflite_runtime`) comes first.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from types import ModuleType

from app.detection_postprocess import POSTPROCESS_OP, PostProcessError, postprocess_ops, read_options
from app.errors import EngineLoadError
from app.tflite_file import Operator, read_tflite

log = logging.getLogger(__name__)

# module to import -> distribution that provides it
AI_EDGE_LITERT = ("ai_edge_litert.interpreter", "ai-edge-litert")
TFLITE_RUNTIME = ("tflite_runtime.interpreter", "tflite-runtime")
RUNTIMES = (AI_EDGE_LITERT, TFLITE_RUNTIME)
# tflite_runtime versions that come first when installed, named by the plug-ins whose device
# library must run with the same TensorFlow build (at import, before any runtime() call)
_preferred_tflite_runtimes: set[str] = set()


def prefer_tflite_runtime(versions) -> None:
    """A plug-in's pinned tflite_runtime versions: installed, one of them is the runtime used."""
    _preferred_tflite_runtimes.update(versions)


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
    """tflite_runtime first where a plug-in pins its version (an accelerator's image)."""
    try:
        installed = metadata.version(TFLITE_RUNTIME[1])
    except metadata.PackageNotFoundError:
        installed = None
    if installed in _preferred_tflite_runtimes:
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


def interpreter_threads(path: Path, threads: int) -> int:
    """The thread count to give an interpreter of this file: `threads`, but 1 for a detector whose
    TFLite_Detection_PostProcess uses regular NMS. ai-edge-litert 2.3.0's multi-threaded regular NMS never
    looks at class number `num_threads`, writes past a buffer when detections_per_class < max_detections
    and crashed the process (free(): invalid next size) in 45 of 278 random graphs with 4 threads
    (tests/test_emulator_detection.py); fast NMS is unaffected. One thread slows the whole model, but
    answers right. Only files naming the op are parsed (a byte search first: loads stay cheap)."""
    if threads <= 1:
        return threads
    data = path.read_bytes()
    if POSTPROCESS_OP.encode() not in data:
        return threads
    regular = [op for op in postprocess_ops(read_tflite(data).graph) if _uses_regular_nms(op)]
    if not regular:
        return threads
    log.warning("%s: its %s uses regular NMS, which the TFLite runtime computes wrongly on several threads: "
                "running it on 1 thread, not %d", path.name, POSTPROCESS_OP, threads)
    return 1


def _uses_regular_nms(op: Operator) -> bool:
    """Whether the kernel runs regular NMS; an option stored as something other than a number (which the kernel
    would parse as text) counts as regular: one thread answers right either way."""
    try:
        return read_options(op).use_regular_non_max_suppression
    except PostProcessError:
        return True
