"""Small .tflite graphs written directly with TFLite's flatbuffer schema, for tests that need one
operator in one configuration (a fused activation on a pooling op, a dilation, a float tensor)
without a TensorFlow conversion. The files are real TFLite flatbuffers that app.tflite_file reads;
their weights are placeholders, so they are for graph analysis, not for running.
"""

from __future__ import annotations

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

# opcode -> (BuiltinOptions member, options class) for the operators the tests build
OPTIONS = {
    "CONV_2D": ("Conv2DOptions", schema.Conv2DOptionsT),
    "DEPTHWISE_CONV_2D": ("DepthwiseConv2DOptions", schema.DepthwiseConv2DOptionsT),
    "MAX_POOL_2D": ("Pool2DOptions", schema.Pool2DOptionsT),
    "AVERAGE_POOL_2D": ("Pool2DOptions", schema.Pool2DOptionsT),
    "FULLY_CONNECTED": ("FullyConnectedOptions", schema.FullyConnectedOptionsT),
    "SOFTMAX": ("SoftmaxOptions", schema.SoftmaxOptionsT),
    "STRIDED_SLICE": ("StridedSliceOptions", schema.StridedSliceOptionsT),
    "CONCATENATION": ("ConcatenationOptions", schema.ConcatenationOptionsT),
    "MEAN": ("ReducerOptions", schema.ReducerOptionsT),
    "SUM": ("ReducerOptions", schema.ReducerOptionsT),
    "PAD": ("PadOptions", schema.PadOptionsT),
    "PACK": ("PackOptions", schema.PackOptionsT),
    "SPLIT": ("SplitOptions", schema.SplitOptionsT),
    "SQUEEZE": ("SqueezeOptions", schema.SqueezeOptionsT),
    "RESHAPE": ("ReshapeOptions", schema.ReshapeOptionsT),
    "TRANSPOSE": ("TransposeOptions", schema.TransposeOptionsT),
    "ADD": ("AddOptions", schema.AddOptionsT),
    "QUANTIZE": ("QuantizeOptions", schema.QuantizeOptionsT),
    "DEQUANTIZE": ("DequantizeOptions", schema.DequantizeOptionsT),
    "FLOOR_MOD": ("FloorModOptions", schema.FloorModOptionsT),
}
TYPES = {"INT8": np.int8, "UINT8": np.uint8, "INT32": np.int32, "INT64": np.int64, "FLOAT32": np.float32}


class GraphBuilder:
    """Tensors and operators in execution order -> .tflite bytes."""

    def __init__(self):
        self.tensors: list[schema.TensorT] = []
        self.buffers: list[schema.BufferT] = [schema.BufferT()]  # buffer 0: the empty one, by convention
        self.operators: list[schema.OperatorT] = []
        self.codes: list[schema.OperatorCodeT] = []

    def tensor(self, name: str, shape, type: str = "INT8", data=None, signature=None,
               quantized: bool = True, zero_point: int = 0) -> int:
        t = schema.TensorT()
        t.name, t.shape, t.type = name, list(shape), getattr(schema.TensorType, type)
        if signature is not None:
            t.shapeSignature = list(signature)
        if quantized and type in ("INT8", "UINT8"):
            q = schema.QuantizationParametersT()
            q.scale, q.zeroPoint = [0.05], [zero_point]
            t.quantization = q
        t.buffer = 0
        if data is not None:
            buffer = schema.BufferT()
            buffer.data = list(np.asarray(data, dtype=TYPES[type]).reshape(shape).tobytes())
            self.buffers.append(buffer)
            t.buffer = len(self.buffers) - 1
        self.tensors.append(t)
        return len(self.tensors) - 1

    def activation(self, name: str, shape, type: str = "INT8", **kw) -> int:
        return self.tensor(name, shape, type, **kw)

    def constant(self, name: str, values, type: str = "INT32", shape=None, **kw) -> int:
        values = np.asarray(values)
        return self.tensor(name, values.shape if shape is None else shape, type, data=values, **kw)

    def op(self, opcode: str, inputs, outputs, custom_code: str | None = None, **options) -> None:
        code = schema.OperatorCodeT()
        builtin = schema.BuiltinOperator.CUSTOM if custom_code else getattr(schema.BuiltinOperator, opcode)
        code.builtinCode = builtin
        code.deprecatedBuiltinCode = min(builtin, 127)
        code.version = 1
        if custom_code:
            code.customCode = custom_code
        self.codes.append(code)
        o = schema.OperatorT()
        o.opcodeIndex, o.inputs, o.outputs = len(self.codes) - 1, list(inputs), list(outputs)
        if opcode in OPTIONS:
            member, cls = OPTIONS[opcode]
            values = cls()
            for key, value in options.items():
                setattr(values, key, value)
            o.builtinOptionsType = getattr(schema.BuiltinOptions, member)
            o.builtinOptions = values
        self.operators.append(o)

    def build(self, inputs, outputs) -> bytes:
        subgraph = schema.SubGraphT()
        subgraph.tensors, subgraph.operators = self.tensors, self.operators
        subgraph.inputs, subgraph.outputs, subgraph.name = list(inputs), list(outputs), "main"
        model = schema.ModelT()
        model.version, model.description = 3, "built by tests/tflite_builder.py"
        model.operatorCodes, model.subgraphs, model.buffers = self.codes, [subgraph], self.buffers
        builder = flatbuffers.Builder(1024)
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
