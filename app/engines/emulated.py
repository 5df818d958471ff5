"""`emulated`: the int8 model on the numpy emulator, bit-exact with TFLite's reference kernels.

No TFLite runtime and no hardware needed; slower than `cpu`, but its outputs are what the
reference integer kernels compute, byte for byte, on any machine.
"""

from __future__ import annotations

import logging
from pathlib import Path

from app.emulator import Interpreter
from app.engines.base import Backend, EngineOptions, InterpreterEngine
from app.model_dir.schema import INT8

log = logging.getLogger(__name__)


class EmulatedEngine(InterpreterEngine):
    key = "emulated"
    model_file = INT8

    def __init__(self, interpreter: Interpreter):
        super().__init__(interpreter)
        # The graph the emulator parsed, for plug-ins' analyses of the model (GET /v1/models/{name}).
        self.parsed_model = interpreter.model

    @classmethod
    def load(cls, path: Path, options: EngineOptions) -> EmulatedEngine:
        """The emulator prepares the whole graph here: an unsupported operator fails the load, listed."""
        # EngineLoadError subclasses for unreadable or unsupported models; cpu_threads = BLAS threads
        interpreter = Interpreter(model_path=path, num_threads=options.cpu_threads)
        interpreter.allocate_tensors()
        engine = cls(interpreter)
        log.info("emulated: %s, %d operators, numba kernels %s", path.name, len(interpreter.plan.steps),
                 "on" if interpreter.accelerated else "off (numpy only: pip install -e '.[accel]')")
        return engine

    @property
    def interpreter(self) -> Interpreter:
        """The emulator itself: its parsed graph (`.model`) is there for analyses of the model."""
        return self._interpreter


class EmulatedBackend(Backend):
    """`workers` emulator interpreters (cpu_threads = BLAS threads); no runtime, no device."""

    key = EmulatedEngine.key
    engine = EmulatedEngine


PLUGIN = EmulatedBackend
