"""What every backend offers: load a model file, run one input tensor, give the output tensor.

An Engine is one interpreter: not thread-safe, used by one request at a time (the
registry pools them). Engines move tensors only: no decoding, no labels.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from app.errors import EngineLoadError

if TYPE_CHECKING:
    from app.edgetpu.compat import CompatReport


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    scale: float
    zero_point: int

    @classmethod
    def from_detail(cls, detail: dict) -> TensorSpec:
        scale, zero_point = detail["quantization"]
        return cls(detail["name"], tuple(int(d) for d in detail["shape"]), np.dtype(detail["dtype"]),
                   float(scale), int(zero_point))


@dataclass(frozen=True)
class EngineOptions:
    cpu_threads: int = 1


class Engine(ABC):
    key: ClassVar[str]
    # which file of the model directory this backend runs (app.model_dir kinds)
    model_file: ClassVar[str]

    input: TensorSpec
    output: TensorSpec
    # What edgetpu_compiler would do with the model, for backends that parse the graph (emulated).
    edgetpu_view: CompatReport | None = None

    @classmethod
    @abstractmethod
    def load(cls, path: Path, options: EngineOptions) -> Engine:
        """Create and allocate the interpreter; raise EngineLoadError with the reason."""

    @abstractmethod
    def run(self, x: np.ndarray) -> np.ndarray:
        """One inference: input tensor (with batch dimension) -> a copy of the output tensor."""

    def close(self) -> None:
        """Release the interpreter (and its device) now rather than at garbage collection."""


class InterpreterEngine(Engine):
    """An engine around an object with TFLite's Python Interpreter interface (TFLite's own, or the
    emulator's): one input tensor in, one output tensor out."""

    def __init__(self, interpreter):
        self._interpreter = interpreter
        inp = interpreter.get_input_details()[0]
        out = interpreter.get_output_details()[0]
        self.input = TensorSpec.from_detail(inp)
        self.output = TensorSpec.from_detail(out)
        self._input_index = inp["index"]
        self._output_index = out["index"]

    @staticmethod
    def check_single_io(interpreter, key: str, path: Path) -> None:
        if len(interpreter.get_input_details()) != 1 or len(interpreter.get_output_details()) != 1:
            raise EngineLoadError(f"{key}: {path} must have exactly one input and one output tensor")

    def run(self, x: np.ndarray) -> np.ndarray:
        self._interpreter.set_tensor(self._input_index, x)
        self._interpreter.invoke()
        return self._interpreter.get_tensor(self._output_index)

    def close(self) -> None:
        self._interpreter = None
