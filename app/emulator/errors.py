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


NOT_EMULATED = "operator not emulated"
# Where the operators the emulator runs are listed, for a refusal to point at instead of repeating them.
SUPPORTED_LIST = "docs/emulator.md, or `python -m app.emulator`"
# The backend to ask for a model the emulator refuses: TFLite's own kernels run every builtin operator.
INSTEAD = "ask for it on the `cpu` backend (TFLite's own kernels) instead"
# Fixed: distinct refusal reasons a message spells out before it counts the rest ("... and 3 more"); the
# exception's `operators` keeps all of them.
REASONS_SHOWN = 8


def _positions(indices: list[int]) -> str:
    return f"operator {indices[0]}" if len(indices) == 1 else f"operators {', '.join(map(str, indices))}"


def summary(operators: tuple[UnsupportedOperator, ...]) -> str:
    """One line: each operator the emulator lacks named once with its indices, then each refused
    configuration with its reason (`PACK (operators 101, 140), UNPACK (operator 7) not emulated; ...`)."""
    missing: dict[str, list[int]] = {}
    refused: dict[tuple[str, str], list[int]] = {}
    for op in operators:
        if op.reason == NOT_EMULATED:
            missing.setdefault(op.opcode, []).append(op.index)
        else:
            refused.setdefault((op.opcode, op.reason), []).append(op.index)
    parts = []
    if missing:
        parts.append(", ".join(f"{opcode} ({_positions(indices)})" for opcode, indices in missing.items())
                     + " not emulated")
    reasons = [f"{opcode} ({_positions(indices)}): {reason}" for (opcode, reason), indices in refused.items()]
    if len(reasons) > REASONS_SHOWN:
        reasons = reasons[:REASONS_SHOWN] + [f"... and {len(reasons) - REASONS_SHOWN} more"]
    parts.extend(reasons)
    return "; ".join(parts).replace("\n", " ")


class UnsupportedOperators(EngineLoadError):
    """A model has operators the emulator does not run; all of them are kept in `operators`, and the
    message names each opcode once, with its operator indices, on one line."""

    def __init__(self, operators: list[UnsupportedOperator]):
        self.operators = tuple(operators)
        count = len(self.operators)
        super().__init__(f"the emulator cannot run {count} operator{'s' if count != 1 else ''} of this model: "
                         f"{summary(self.operators)}. The operators it runs: {SUPPORTED_LIST}; {INSTEAD}")


class UnsupportedModel(EngineLoadError):
    """The graph as a whole is outside what the emulator runs (dynamic shapes, several subgraphs ...)."""


class InvokeFailed(ServeError, RuntimeError):
    """A kernel refused its input values at invoke, where TFLite's kernel fails too (its invoke raises RuntimeError):
    a fault of the model (TFLite_Detection_PostProcess decoding an inverted box from negative anchor sizes)."""


class InvalidTensor(ServeError, ValueError):
    """set_tensor/get_tensor got an index, shape or dtype the model does not have."""
