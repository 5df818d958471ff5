"""`cpu`: the int8 model on the TFLite CPU kernels (XNNPACK for int8, as the runtime picks)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.engines.base import Engine, EngineOptions, TensorSpec
from app.engines.litert import runtime
from app.errors import EngineLoadError
from app.model_dir import INT8


class CpuEngine(Engine):
    key = "cpu"
    model_file = INT8

    def __init__(self, interpreter):
        self._interpreter = interpreter
        inp = interpreter.get_input_details()[0]
        out = interpreter.get_output_details()[0]
        self.input = TensorSpec.from_detail(inp)
        self.output = TensorSpec.from_detail(out)
        self._input_index = inp["index"]
        self._output_index = out["index"]

    @classmethod
    def load(cls, path: Path, options: EngineOptions) -> CpuEngine:
        try:
            interpreter = runtime().Interpreter(model_path=str(path), num_threads=options.cpu_threads)
            interpreter.allocate_tensors()
        except (ValueError, RuntimeError) as e:
            raise EngineLoadError(f"cpu: cannot load {path}: {e}") from None
        if len(interpreter.get_input_details()) != 1 or len(interpreter.get_output_details()) != 1:
            raise EngineLoadError(f"cpu: {path} must have exactly one input and one output tensor")
        return cls(interpreter)

    def run(self, x: np.ndarray) -> np.ndarray:
        self._interpreter.set_tensor(self._input_index, x)
        self._interpreter.invoke()
        return self._interpreter.get_tensor(self._output_index)

    def close(self) -> None:
        self._interpreter = None
