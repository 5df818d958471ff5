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
