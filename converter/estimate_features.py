"""What an int8 .tflite asks of an Edge TPU, measured from its structure alone.

Per operator, in execution order (TFLite stores operators in the order it runs them): its kind
(convolution, depthwise convolution, fully connected, or element-wise work such as pooling,
adds and concatenations), its multiply-accumulates, the bytes of its constant parameters
(int8 weights, int32 biases), the elements it reads and writes, and whether the Edge TPU would
run it (app.edgetpu.compat, the project's partition analysis). Per model: the bytes that cross
the link on every invoke: the input, and what the Edge TPU part hands back (the model's output,
or, when CPU ops follow, every tensor the Edge TPU part makes that the CPU part reads: a
detector's box encodings and class scores before TFLite_Detection_PostProcess). No interpreter,
no TensorFlow: the file is enough.

MACs, with the output shape [1, H, W, C_out]:
  CONV_2D            H * W * C_out * kh * kw * C_in
  DEPTHWISE_CONV_2D  H * W * C_out * kh * kw
  FULLY_CONNECTED    units * input features
  TRANSPOSE_CONV     input H * W * C_in * kh * kw * C_out
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from app.edgetpu.compat import analyze
from app.tflite_file import Operator, Subgraph, TfliteModel, read_tflite

CONV, DEPTHWISE, FULLY_CONNECTED, ELEMENTWISE, LAYOUT = "conv", "depthwise", "fc", "elementwise", "layout"
COLUMNS = ("opcode", "kind", "macs", "param_bytes", "out_elements", "on_tpu", "depth", "channels", "in_elements")
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
    in_elements: int = 0  # elements of the non-constant inputs it reads (what a CPU op's work scales with)


@dataclass(frozen=True)
class ModelFeatures:
    """A model's operators plus the bytes its input and output carry across the link per invoke."""

    ops: tuple[OpFeatures, ...]
    input_bytes: int
    output_bytes: int
    # the most activation bytes alive at once (produced, not yet consumed for the last time) while the
    # operators run: what the on-chip memory must hold besides cached parameters
    peak_activation_bytes: int
    # what the Edge TPU part sends back to the host: the output, or the tensors the CPU ops after it read;
    # None: the output (a model that runs wholly on the Edge TPU)
    tpu_output_bytes: int | None = None

    @property
    def tpu_handoff_bytes(self) -> int:
        return self.output_bytes if self.tpu_output_bytes is None else self.tpu_output_bytes

    @property
    def macs(self) -> int:
        return sum(op.macs for op in self.ops)

    @property
    def param_bytes(self) -> int:
        return sum(op.param_bytes for op in self.ops)

    def to_dict(self) -> dict:
        """Compact, for the calibration data file: one short list per operator, named by `columns`."""
        return {
            "input_bytes": self.input_bytes, "output_bytes": self.output_bytes,
            "peak_activation_bytes": self.peak_activation_bytes, "tpu_output_bytes": self.tpu_output_bytes,
            "columns": list(COLUMNS),
            "ops": [[op.opcode, op.kind, op.macs, op.param_bytes, op.out_elements, int(op.on_tpu), op.depth,
                     op.channels, op.in_elements] for op in self.ops],
        }

    @classmethod
    def from_dict(cls, data: dict) -> ModelFeatures:
        """Read to_dict(); a column an older entry lacks reads as 0. The kind follows the opcode by today's
        rule (op_kind), so a change of rule needs no rebuild."""
        columns = data.get("columns", COLUMNS[:8])
        ops = []
        for i, row in enumerate(data["ops"]):
            v = dict(zip(columns, row))
            ops.append(OpFeatures(i, v["opcode"], op_kind(v["opcode"]), int(v["macs"]), int(v["param_bytes"]),
                                  int(v["out_elements"]), bool(v["on_tpu"]), int(v.get("depth", 0)),
                                  int(v.get("channels", 0)), int(v.get("in_elements", 0))))
        tpu_output = data.get("tpu_output_bytes")
        return cls(ops=tuple(ops), input_bytes=int(data["input_bytes"]), output_bytes=int(data["output_bytes"]),
                   peak_activation_bytes=int(data["peak_activation_bytes"]),
                   tpu_output_bytes=None if tpu_output is None else int(tpu_output))

    def on_cpu(self) -> ModelFeatures:
        """The same model with every op on the host (what a CPU interpreter would run)."""
        return replace(self, ops=tuple(replace(op, on_tpu=False) for op in self.ops), tpu_output_bytes=None)

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
        in_elements = sum(_elements(graph.tensors[i].shape) for i in op.inputs
                          if i >= 0 and not graph.tensors[i].is_constant)
        depth, channels = _matrix(op, graph)
        ops.append(OpFeatures(index=op.index, opcode=op.opcode, kind=op_kind(op.opcode), macs=_macs(op, graph),
                              param_bytes=_param_bytes(op, graph), out_elements=out_elements,
                              on_tpu=report.on_edgetpu(op.index), depth=depth, channels=channels,
                              in_elements=in_elements))
    output_bytes = sum(_tensor_bytes(graph, i) for i in graph.outputs)
    handoff = _handoff_bytes(graph, [op.on_tpu for op in ops])
    return ModelFeatures(ops=tuple(ops), input_bytes=sum(_tensor_bytes(graph, i) for i in graph.inputs),
                         output_bytes=output_bytes, peak_activation_bytes=peak_activation_bytes(graph),
                         tpu_output_bytes=None if handoff == output_bytes else handoff)


def _handoff_bytes(graph: Subgraph, on_tpu: list[bool]) -> int:
    """Bytes the Edge TPU part sends back per invoke: each tensor an Edge TPU op makes that a CPU op reads
    or that is a model output, once."""
    made_on_tpu = {i for op, tpu in zip(graph.operators, on_tpu) if tpu for i in op.outputs if i >= 0}
    read_on_cpu = {i for op, tpu in zip(graph.operators, on_tpu) if not tpu for i in op.inputs if i >= 0}
    return sum(_tensor_bytes(graph, i) for i in made_on_tpu & (read_on_cpu | set(graph.outputs)))


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
