"""Small .tflite models built directly as flatbuffers: one or a few ops, any shapes and quantization.

No TensorFlow: the object API of the schema that ships in ai-edge-litert packs ModelT into the
same bytes the converter writes, so the real interpreter and the emulator read identical files.
Used by the emulator's per-op tests to reach shapes, strides and quantization parameters that a
converter would never produce on purpose.

    g = GraphBuilder()
    x = g.tensor("x", (1, 8, 8, 3), "INT8", scale=0.05, zero_point=-3)
    w = g.tensor("w", (4, 3, 3, 3), "INT8", scale=[0.01] * 4, zero_point=[0] * 4, data=weights)
    ...
    g.op("CONV_2D", [x, w, b], [y], "Conv2DOptions", padding="SAME", strideW=1, strideH=1)
    model_bytes = g.build(inputs=[x], outputs=[y])
"""

from __future__ import annotations

from collections.abc import Sequence

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

_TYPES = {name: value for name, value in vars(schema.TensorType).items() if not name.startswith("_")}
_NUMPY = {"INT8": np.int8, "UINT8": np.uint8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
          "FLOAT32": np.float32}
_ENUMS = {
    "padding": schema.Padding,
    "fusedActivationFunction": schema.ActivationFunctionType,
    "mode": schema.MirrorPadMode,
}


class GraphBuilder:
    def __init__(self) -> None:
        self.tensors: list[schema.TensorT] = []
        self.buffers: list[schema.BufferT] = [schema.BufferT()]  # buffer 0: the empty one, by convention
        self.opcodes: dict[tuple[int, int], int] = {}
        self.codes: list[schema.OperatorCodeT] = []
        self.operators: list[schema.OperatorT] = []

    def tensor(self, name: str, shape: Sequence[int], type: str = "INT8", *, scale=None, zero_point=None,
               axis: int = 0, data: np.ndarray | None = None) -> int:
        """Add a tensor; scale/zero_point scalars for per-tensor, sequences for per-channel along axis."""
        t = schema.TensorT()
        t.name, t.shape, t.type = name, [int(d) for d in shape], _TYPES[type]
        t.buffer = 0
        if data is not None:
            array = np.ascontiguousarray(np.asarray(data, dtype=_NUMPY[type]).reshape(shape))
            buffer = schema.BufferT()
            buffer.data = list(array.tobytes()) or None
            self.buffers.append(buffer)
            t.buffer = len(self.buffers) - 1
        if scale is not None:
            q = schema.QuantizationParametersT()
            q.scale = [float(s) for s in np.atleast_1d(scale)]
            zero_points = np.atleast_1d(zero_point if zero_point is not None else 0)
            if zero_points.size == 1 and len(q.scale) > 1:
                zero_points = np.repeat(zero_points, len(q.scale))
            q.zeroPoint = [int(z) for z in zero_points]
            q.quantizedDimension = axis
            t.quantization = q
        self.tensors.append(t)
        return len(self.tensors) - 1

    def constant(self, name: str, values, type: str = "INT32") -> int:
        """An unquantized constant (axes, paddings, shapes, begin/end/strides)."""
        array = np.asarray(values, dtype=_NUMPY[type])
        return self.tensor(name, array.shape, type, data=array)

    def op(self, opcode: str, inputs: Sequence[int], outputs: Sequence[int], options: str | None = None,
           version: int = 1, **fields) -> None:
        """Add an operator; options names the schema's options table, fields its fields by schema name."""
        builtin = getattr(schema.BuiltinOperator, opcode)
        key = (builtin, version)
        if key not in self.opcodes:
            code = schema.OperatorCodeT()
            code.builtinCode = builtin
            code.deprecatedBuiltinCode = min(builtin, 127)
            code.version = version
            self.codes.append(code)
            self.opcodes[key] = len(self.codes) - 1
        operator = schema.OperatorT()
        operator.opcodeIndex = self.opcodes[key]
        operator.inputs, operator.outputs = list(inputs), list(outputs)
        if options is not None:
            table = getattr(schema, f"{options}T")()
            for name, value in fields.items():
                if not hasattr(table, name):
                    raise AttributeError(f"{options} has no field {name!r}")
                if name in _ENUMS and isinstance(value, str):
                    value = getattr(_ENUMS[name], value)
                setattr(table, name, value)
            operator.builtinOptionsType = getattr(schema.BuiltinOptions, options)
            operator.builtinOptions = table
        elif fields:
            raise ValueError(f"fields {sorted(fields)} given without an options table")
        self.operators.append(operator)

    def build(self, inputs: Sequence[int], outputs: Sequence[int]) -> bytes:
        subgraph = schema.SubGraphT()
        subgraph.tensors, subgraph.operators = self.tensors, self.operators
        subgraph.inputs, subgraph.outputs, subgraph.name = list(inputs), list(outputs), "main"
        model = schema.ModelT()
        model.version, model.description = 3, "built by tests/tflite_builder.py"
        model.operatorCodes, model.subgraphs, model.buffers = self.codes, [subgraph], self.buffers
        builder = flatbuffers.Builder(4096)
        builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
        return bytes(builder.Output())
