"""What an int8 .tflite asks of an Edge TPU, measured from its structure alone.

Per operator, in execution order (TFLite stores operators in the order it runs them): its kind
(convolution, depthwise convolution, fully connected, or element-wise work such as pooling,
adds and concatenations), its multiply-accumulates, the bytes of its constant parameters
(int8 weights, int32 biases), the elements it writes, and whether the Edge TPU would run it
(app.edgetpu.compat, the project's partition analysis). Per model: the input and output bytes
that cross the link on every invoke. No interpreter, no TensorFlow: the file is enough.

MACs, with the output shape [1, H, W, C_out]:
  CONV_2D            H * W * C_out * kh * kw * C_in
  DEPTHWISE_CONV_2D  H * W * C_out * kh * kw
  FULLY_CONNECTED    units * input features
  TRANSPOSE_CONV     input H * W * C_in * kh * kw * C_out
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.edgetpu.compat import analyze
from app.tflite_file import Operator, Subgraph, TfliteModel, read_tflite

CONV, DEPTHWISE, FULLY_CONNECTED, ELEMENTWISE, LAYOUT = "conv", "depthwise", "fc", "elementwise", "layout"
KINDS = (CONV, DEPTHWISE, FULLY_CONNECTED, ELEMENTWISE, LAYOUT)
# Operators that only move or re-label bytes: the compiler folds most of them into its neighbours' addressing
# (a PAD before a convolution becomes the convolution's border; PyTorch exports write one before every strided
# convolution that Keras expresses as padding="same").
LAYOUT_OPS = frozenset({"RESHAPE", "SQUEEZE", "EXPAND_DIMS", "QUANTIZE", "DEQUANTIZE", "PAD"})


@dataclass(frozen=True)
class OpFeatures:
    """One operator as the cost model sees it."""

    index: int
    opcode: str
    kind: str
    macs: int
    param_bytes: int
    out_elements: int
    on_tpu: bool
    # the matrix the MACs form: `depth` values summed into each of `channels` outputs (conv: kh*kw*C_in and
    # C_out; depthwise: kh*kw and C_out; fully connected: features and units; 0 for the other kinds)
    depth: int = 0
    channels: int = 0


@dataclass(frozen=True)
class ModelFeatures:
    """A model's operators plus the bytes its input and output carry across the link per invoke."""

    ops: tuple[OpFeatures, ...]
    input_bytes: int
    output_bytes: int
    # the most activation bytes alive at once (produced, not yet consumed for the last time) while the
    # operators run: what the on-chip memory must hold besides cached parameters
    peak_activation_bytes: int

    @property
    def macs(self) -> int:
        return sum(op.macs for op in self.ops)

    @property
    def param_bytes(self) -> int:
        return sum(op.param_bytes for op in self.ops)

    def to_dict(self) -> dict:
        """Compact, for the calibration data file: one short list per operator."""
        return {
            "input_bytes": self.input_bytes, "output_bytes": self.output_bytes,
            "peak_activation_bytes": self.peak_activation_bytes,
            "columns": ["opcode", "kind", "macs", "param_bytes", "out_elements", "on_tpu", "depth", "channels"],
            "ops": [[op.opcode, op.kind, op.macs, op.param_bytes, op.out_elements, int(op.on_tpu), op.depth,
                     op.channels] for op in self.ops],
        }

    @classmethod
    def from_dict(cls, data: dict) -> ModelFeatures:
        # the kind follows the opcode by today's rule (op_kind), so a change of rule needs no rebuild
        ops = tuple(OpFeatures(i, opcode, op_kind(opcode), int(macs), int(params), int(elements), bool(on_tpu),
                               int(depth), int(channels))
                    for i, (opcode, _kind, macs, params, elements, on_tpu, depth, channels) in enumerate(data["ops"]))
        return cls(ops=ops, input_bytes=int(data["input_bytes"]), output_bytes=int(data["output_bytes"]),
                   peak_activation_bytes=int(data["peak_activation_bytes"]))

    def summary(self) -> dict:
        return {"ops": len(self.ops), "macs": self.macs, "param_bytes": self.param_bytes,
                "macs_by_kind": {k: sum(op.macs for op in self.ops if op.kind == k) for k in KINDS},
                "input_bytes": self.input_bytes, "output_bytes": self.output_bytes,
                "peak_activation_bytes": self.peak_activation_bytes}


def op_kind(opcode: str) -> str:
    if opcode in ("CONV_2D", "TRANSPOSE_CONV", "CONV_3D"):
        return CONV
    if opcode == "DEPTHWISE_CONV_2D":
        return DEPTHWISE
    if opcode == "FULLY_CONNECTED":
        return FULLY_CONNECTED
    if opcode in LAYOUT_OPS:
        return LAYOUT
    return ELEMENTWISE


def _elements(shape) -> int:
    return int(np.prod(shape)) if len(shape) else 1


def _macs(op: Operator, graph: Subgraph) -> int:
    tensors = graph.tensors
    if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        out = tensors[op.outputs[0]].shape
        weights = tensors[op.inputs[1]].shape  # conv [C_out, kh, kw, C_in]; depthwise [1, kh, kw, C_out]
        per_output = weights[1] * weights[2] * (weights[3] if op.opcode == "CONV_2D" else 1)
        return _elements(out) * int(per_output)
    if op.opcode == "FULLY_CONNECTED":
        weights = tensors[op.inputs[1]].shape  # [units, features]
        rows = _elements(tensors[op.outputs[0]].shape) // max(int(weights[0]), 1)
        return int(rows * weights[0] * weights[1])
    if op.opcode == "TRANSPOSE_CONV":  # inputs: output shape, weights [C_out, kh, kw, C_in], input
        weights = tensors[op.inputs[1]].shape
        return _elements(tensors[op.inputs[2]].shape) * int(weights[0] * weights[1] * weights[2])
    return 0


def _matrix(op: Operator, graph: Subgraph) -> tuple[int, int]:
    """(depth, channels) of the op's multiply-accumulate matrix; (0, 0) for ops without MACs."""
    if op.opcode not in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV"):
        return 0, 0
    weights = graph.tensors[op.inputs[1]].shape
    if op.opcode == "CONV_2D":
        return int(weights[1] * weights[2] * weights[3]), int(weights[0])
    if op.opcode == "DEPTHWISE_CONV_2D":
        return int(weights[1] * weights[2]), int(weights[3])
    if op.opcode == "FULLY_CONNECTED":
        return int(weights[1]), int(weights[0])
    return int(weights[1] * weights[2] * weights[3]), int(weights[0])  # TRANSPOSE_CONV [C_out, kh, kw, C_in]


def _param_bytes(op: Operator, graph: Subgraph) -> int:
    """Bytes of the constant tensors an op reads as parameters (not small shape/axis operands of layout ops)."""
    if op_kind(op.opcode) == LAYOUT:
        return 0
    total = 0
    for index in op.inputs:
        if index >= 0 and graph.tensors[index].is_constant:
            total += graph.tensors[index].data.nbytes
    return total


def features(model: TfliteModel) -> ModelFeatures:
    """The cost-model view of subgraph 0 (what the interpreter runs)."""
    graph = model.graph
    report = analyze(model)
    ops = []
    for op in graph.operators:
        out_elements = sum(_elements(graph.tensors[i].shape) for i in op.outputs if i >= 0)
        depth, channels = _matrix(op, graph)
        ops.append(OpFeatures(index=op.index, opcode=op.opcode, kind=op_kind(op.opcode), macs=_macs(op, graph),
                              param_bytes=_param_bytes(op, graph), out_elements=out_elements,
                              on_tpu=report.on_edgetpu(op.index), depth=depth, channels=channels))
    return ModelFeatures(ops=tuple(ops), input_bytes=sum(_tensor_bytes(graph, i) for i in graph.inputs),
                         output_bytes=sum(_tensor_bytes(graph, i) for i in graph.outputs),
                         peak_activation_bytes=peak_activation_bytes(graph))


def _tensor_bytes(graph: Subgraph, index: int) -> int:
    tensor = graph.tensors[index]
    return _elements(tensor.shape) * (tensor.dtype or np.dtype("u1")).itemsize


def peak_activation_bytes(graph: Subgraph) -> int:
    """Liveness over the execution order: a tensor lives from the op that makes it (or the start, for a model
    input) to the last op that reads it (or the end, for a model output); the peak of the live sum."""
    last_use: dict[int, int] = {}
    for op in graph.operators:
        for i in op.inputs:
            if i >= 0 and not graph.tensors[i].is_constant:
                last_use[i] = op.index
    end = len(graph.operators)
    for i in graph.outputs:
        last_use[i] = end
    live = {i: _tensor_bytes(graph, i) for i in graph.inputs}
    peak = sum(live.values())
    for op in graph.operators:
        for i in op.outputs:
            if i >= 0:
                live[i] = _tensor_bytes(graph, i)
        peak = max(peak, sum(live.values()))
        for i in [i for i in live if last_use.get(i, -1) <= op.index]:
            del live[i]
    return peak


def features_of_file(path: Path | bytes) -> ModelFeatures:
    return features(read_tflite(path))
