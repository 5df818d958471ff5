"""A model's graph prepared for execution: one Step per operator, in the graph's order.

Everything that depends only on the model is done here, once: quantization parameters,
multipliers and shifts, weights as float matrices, look-up tables, the requantizers' proofs.
Every operator is checked before any is prepared further, so a model with operators the
emulator does not run fails at load with all of them listed, never at its first inference.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.emulator.errors import (INSTEAD, NOT_EMULATED, Unsupported, UnsupportedModel, UnsupportedOperator,
                                 UnsupportedOperators)
from app.emulator.kernels import PREPARE
from app.emulator.kernels.common import OpView, Step
from app.emulator.scratch import Scratch
from app.tflite_file import Subgraph, TfliteModel


@dataclass(frozen=True)
class Plan:
    graph: Subgraph
    steps: tuple[Step, ...]

    @property
    def opcodes(self) -> list[str]:
        return [step.operator.opcode for step in self.steps]


def supported_opcodes() -> list[str]:
    return sorted(PREPARE)


def prepare(model: TfliteModel, accelerate: bool = False) -> Plan:
    if not model.subgraphs:
        raise UnsupportedModel("the model has no subgraph")
    graph = model.graph
    dynamic = [t.name for t in graph.tensors if t.is_dynamic]
    if dynamic:
        raise UnsupportedModel(f"tensors {dynamic[:5]} have dynamic shapes; the emulator needs static shapes: {INSTEAD}")
    steps, problems = [], []
    scratch = Scratch()  # one set of temporaries for the whole plan: its steps run one at a time
    for operator in graph.operators:
        preparer = PREPARE.get(operator.opcode)
        if preparer is None:
            problems.append(UnsupportedOperator(operator.index, operator.opcode, NOT_EMULATED))
            continue
        try:
            steps.append(preparer(OpView(operator, graph, accelerate, scratch)))
        except Unsupported as e:
            problems.append(UnsupportedOperator(operator.index, operator.opcode, str(e)))
    if problems:
        raise UnsupportedOperators(problems)
    return Plan(graph, tuple(steps))
