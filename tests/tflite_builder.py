"""Small .tflite models built directly as flatbuffers: one or a few ops, any shapes and quantization.

No TensorFlow: the object API of the schema that ships in ai-edge-litert packs ModelT into the
same bytes the converter writes, so the real interpreter, the emulator and the Edge TPU analysis
read identical files. The emulator's per-op tests reach shapes, strides and quantization
parameters a converter would never produce on purpose; the compatibility tests put one
operator in one configuration (a fused activation on a pooling op, a dilation, a float tensor).

    g = GraphBuilder()
    x = g.tensor("x", (1, 8, 8, 3), "INT8", scale=0.05, zero_point=-3)
    w = g.tensor("w", (4, 3, 3, 3), "INT8", scale=[0.01] * 4, zero_point=[0] * 4, data=weights)
    ...
    g.op("CONV_2D", [x, w, b], [y], "Conv2DOptions", padding="SAME", strideW=1, strideH=1)
    model_bytes = g.build(inputs=[x], outputs=[y])

For graphs that are analysed and never run, `activation()` gives a quantized tensor with a
placeholder scale, and `op()` finds the options table from the opcode (OPTIONS).
"""

from __future__ import annotations

from collections.abc import Sequence

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

_TYPES = {name: value for name, value in vars(schema.TensorType).items() if not name.startswith("_")}
_NUMPY = {"INT8": np.int8, "UINT8": np.uint8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "BOOL": np.bool_,
          "FLOAT32": np.float32}
_ENUMS = {
    "padding": schema.Padding,
    "fusedActivationFunction": schema.ActivationFunctionType,
    "mode": schema.MirrorPadMode,
}
EIGHT_BIT = ("INT8", "UINT8")
PLACEHOLDER_SCALE = 0.05  # for graphs that are analysed, never run

# opcode -> its options table, where op() is given fields without naming the table
OPTIONS = {
    "CONV_2D": "Conv2DOptions", "DEPTHWISE_CONV_2D": "DepthwiseConv2DOptions",
    "MAX_POOL_2D": "Pool2DOptions", "AVERAGE_POOL_2D": "Pool2DOptions",
    "FULLY_CONNECTED": "FullyConnectedOptions", "SOFTMAX": "SoftmaxOptions",
    "STRIDED_SLICE": "StridedSliceOptions", "CONCATENATION": "ConcatenationOptions",
    "MEAN": "ReducerOptions", "SUM": "ReducerOptions", "PAD": "PadOptions", "PACK": "PackOptions",
    "SPLIT": "SplitOptions", "SQUEEZE": "SqueezeOptions", "RESHAPE": "ReshapeOptions",
    "TRANSPOSE": "TransposeOptions", "ADD": "AddOptions", "QUANTIZE": "QuantizeOptions",
    "DEQUANTIZE": "DequantizeOptions", "FLOOR_MOD": "FloorModOptions", "UNPACK": "UnpackOptions",
    "SPLIT_V": "SplitVOptions", "ARG_MAX": "ArgMaxOptions", "ARG_MIN": "ArgMinOptions", "CAST": "CastOptions",
    "GATHER": "GatherOptions", "GATHER_ND": "GatherNdOptions", "SUB": "SubOptions", "MUL": "MulOptions",
    "DIV": "DivOptions", "FLOOR_DIV": "FloorDivOptions", "MAXIMUM": "MaximumMinimumOptions",
    "MINIMUM": "MaximumMinimumOptions", "RESIZE_BILINEAR": "ResizeBilinearOptions",
    "RESIZE_NEAREST_NEIGHBOR": "ResizeNearestNeighborOptions", "EXPAND_DIMS": "ExpandDimsOptions",
    "SLICE": "SliceOptions", "PADV2": "PadV2Options",
}


class GraphBuilder:
    def __init__(self) -> None:
        self.tensors: list[schema.TensorT] = []
        self.buffers: list[schema.BufferT] = [schema.BufferT()]  # buffer 0: the empty one, by convention
        self.opcodes: dict[tuple[int, int, str | None], int] = {}
        self.codes: list[schema.OperatorCodeT] = []
        self.operators: list[schema.OperatorT] = []

    def tensor(self, name: str, shape: Sequence[int], type: str = "INT8", *, scale=None, zero_point=None,
               axis: int = 0, data: np.ndarray | None = None, signature: Sequence[int] | None = None) -> int:
        """Add a tensor; scale/zero_point scalars for per-tensor, sequences for per-channel along axis."""
        t = schema.TensorT()
        t.name, t.shape, t.type = name, [int(d) for d in shape], _TYPES[type]
        if signature is not None:
            t.shapeSignature = [int(d) for d in signature]
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

    def activation(self, name: str, shape: Sequence[int], type: str = "INT8", *, zero_point: int = 0,
                   quantized: bool = True, signature: Sequence[int] | None = None) -> int:
        """A non-constant tensor; 8-bit ones quantized with a placeholder scale unless quantized=False."""
        scale = PLACEHOLDER_SCALE if quantized and type in EIGHT_BIT else None
        return self.tensor(name, shape, type, scale=scale, zero_point=zero_point, signature=signature)

    def constant(self, name: str, values, type: str = "INT32", *, shape: Sequence[int] | None = None,
                 zero_point: int | None = None) -> int:
        """A constant: unquantized for integer operands (axes, paddings, shapes, biases); 8-bit
        weights get the placeholder scale (with their own scales, use tensor(..., data=))."""
        array = np.asarray(values, dtype=_NUMPY[type])
        scale = PLACEHOLDER_SCALE if type in EIGHT_BIT else None
        return self.tensor(name, array.shape if shape is None else shape, type, scale=scale,
                           zero_point=zero_point, data=array)

    def op(self, opcode: str, inputs: Sequence[int], outputs: Sequence[int], options: str | None = None,
           version: int = 1, custom_code: str | None = None, **fields) -> None:
        """Add an operator; options names the schema's options table (default: OPTIONS[opcode] when
        fields are given), fields its fields by schema name. opcode "CUSTOM" takes custom_code."""
        builtin = getattr(schema.BuiltinOperator, opcode)
        key = (builtin, version, custom_code)
        if key not in self.opcodes:
            code = schema.OperatorCodeT()
            code.builtinCode = builtin
            code.deprecatedBuiltinCode = min(builtin, 127)
            code.version = version
            if custom_code is not None:
                code.customCode = custom_code
            self.codes.append(code)
            self.opcodes[key] = len(self.codes) - 1
        operator = schema.OperatorT()
        operator.opcodeIndex = self.opcodes[key]
        operator.inputs, operator.outputs = list(inputs), list(outputs)
        if options is None and opcode in OPTIONS:
            options = OPTIONS[opcode]
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


def conv_chain(middle: str | None = None, **middle_options) -> bytes:
    """uint8 input -> QUANTIZE -> CONV_2D -> [middle op] -> CONV_2D -> QUANTIZE -> uint8 output.

    With `middle` (e.g. "TRANSPOSE"), that operator sits in the middle of an otherwise
    Edge TPU clean graph: the shape of the classic "unsupported op in the middle" problem.
    """
    g = GraphBuilder()
    image = g.activation("image", [1, 8, 8, 4], "UINT8", zero_point=128)
    x = g.activation("quantized", [1, 8, 8, 4])
    g.op("QUANTIZE", [image], [x])
    w1 = g.constant("conv1/weights", np.ones((4, 3, 3, 4)), "INT8")
    b1 = g.constant("conv1/bias", np.zeros(4), "INT32")
    y = g.activation("conv1", [1, 8, 8, 4])
    g.op("CONV_2D", [x, w1, b1], [y], padding=0, strideW=1, strideH=1, dilationWFactor=1, dilationHFactor=1)
    if middle is not None:
        z = g.activation(middle.lower(), [1, 8, 8, 4])
        if middle == "TRANSPOSE":
            perm = g.constant("perm", [0, 2, 1, 3])
            g.op("TRANSPOSE", [y, perm], [z])
        else:
            g.op(middle, [y], [z], **middle_options)
        y = z
    w2 = g.constant("conv2/weights", np.ones((4, 1, 1, 4)), "INT8")
    b2 = g.constant("conv2/bias", np.zeros(4), "INT32")
    out = g.activation("conv2", [1, 8, 8, 4])
    g.op("CONV_2D", [y, w2, b2], [out], padding=0, strideW=1, strideH=1, dilationWFactor=1, dilationHFactor=1)
    result = g.activation("scores", [1, 8, 8, 4], "UINT8", zero_point=128)
    g.op("QUANTIZE", [out], [result])
    return g.build([image], [result])
