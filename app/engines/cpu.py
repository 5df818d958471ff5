"""`cpu`: the int8 model on the TFLite CPU kernels (XNNPACK for int8, as the runtime picks)."""

from __future__ import annotations

from pathlib import Path

from app.engines.base import Backend, EngineOptions, InterpreterEngine
from app.engines.litert import interpreter_threads, runtime
from app.errors import EngineLoadError
from app.model_dir.schema import INT8


class CpuEngine(InterpreterEngine):
    key = "cpu"
    model_file = INT8

    @classmethod
    def load(cls, path: Path, options: EngineOptions) -> CpuEngine:
        try:
            interpreter = runtime().Interpreter(model_path=str(path),
                                                 num_threads=interpreter_threads(path, options.cpu_threads))
            interpreter.allocate_tensors()
        except (ValueError, RuntimeError) as e:  # an accelerator's compiled file: its plug-in explains
            raise EngineLoadError(f"cpu: cannot load {path}: {e}") from None
        return cls(interpreter)


class CpuBackend(Backend):
    """`workers` interpreters of `cpu_threads` threads each; nothing to check at start."""

    key = CpuEngine.key
    engine = CpuEngine


PLUGIN = CpuBackend
