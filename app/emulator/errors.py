"""The emulator's errors: typed, and saying what was got and what was expected."""

from __future__ import annotations

from dataclasses import dataclass

from app.errors import EngineLoadError, ServeError


class Unsupported(Exception):
    """Raised by a kernel's prepare step: this operator, as configured, is not emulated."""


@dataclass(frozen=True)
class UnsupportedOperator:
    index: int      # position in the graph (operator index)
    opcode: str
    reason: str

    def __str__(self) -> str:
        return f"#{self.index} {self.opcode}: {self.reason}"


class UnsupportedOperators(EngineLoadError):
    """A model has operators the emulator does not run; all of them are listed, at load."""

    def __init__(self, operators: list[UnsupportedOperator]):
        self.operators = tuple(operators)
        listed = "; ".join(str(op) for op in self.operators)
        super().__init__(f"the emulator cannot run {len(self.operators)} operator(s) of this model: {listed}")


class UnsupportedModel(EngineLoadError):
    """The graph as a whole is outside what the emulator runs (dynamic shapes, several subgraphs ...)."""


class InvokeFailed(ServeError, RuntimeError):
    """A kernel refused its input values at invoke, where TFLite's kernel fails too (its invoke raises RuntimeError):
    a fault of the model (TFLite_Detection_PostProcess decoding an inverted box from negative anchor sizes)."""


class InvalidTensor(ServeError, ValueError):
    """set_tensor/get_tensor got an index, shape or dtype the model does not have."""
