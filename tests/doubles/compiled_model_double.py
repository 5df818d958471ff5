"""TEST DOUBLE of an edgetpu_compiler output: a real .tflite file, not a runnable Edge TPU model.

No compiler runs here (it is x86-64 Linux only, from Coral's apt repository), so tests
build what the compiler writes, with the same containers: one `edgetpu-custom-op` node
whose custom options are a FlexBuffer map {"1": version, "4": DarwiNN package}, the
package a "DWN1" flatbuffer starting with `min_runtime_version` and carrying the
compiler's version. The package holds no executable, so no TPU could run it; the real
TFLite runtime still loads the graph, and refuses the unresolved custom op without a delegate.
"""

from __future__ import annotations

import flatbuffers
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

CUSTOM_OP = "edgetpu-custom-op"
COMPILER_VERSION = "16.0.384591198"


def package_bytes(min_runtime_version: int, compiler_version: str = COMPILER_VERSION) -> bytes:
    """Package (executable.fbs): min_runtime_version = slot 0, compiler_version = slot 4."""
    builder = flatbuffers.Builder(64)
    compiler = builder.CreateString(compiler_version)
    builder.StartObject(5)
    builder.PrependInt32Slot(0, min_runtime_version, 0)
    builder.PrependUOffsetTRelativeSlot(4, compiler, 0)
    builder.Finish(builder.EndObject(), file_identifier=b"DWN1")
    return bytes(builder.Output())


def custom_options(package: bytes) -> bytes:
    """libedgetpu's CustomOpData: the package is a FlexBuffer *string* (as its C++ writes it)."""
    builder = flexbuffers.Builder()
    with builder.Map():
        builder.Key("1")
        builder.Int(1)
        builder.Key("4")
        # Builder.String() only takes text; the C++ writer stores the binary package as a string.
        builder._WriteBlob(package, append_zero=True, type_=flexbuffers.Type.STRING)  # noqa: SLF001
        builder.Key("5")
        builder.Int(0)
    return bytes(builder.Finish())


def _tensor(name: str, shape: list[int], type_: int = schema.TensorType.UINT8, scale: float | None = 1.0 / 128,
            zero_point: int = 127) -> schema.TensorT:
    tensor = schema.TensorT()
    tensor.name, tensor.shape, tensor.type, tensor.buffer = name, list(shape), type_, 0
    if scale is not None:
        quantization = schema.QuantizationParametersT()
        quantization.scale, quantization.zeroPoint = [scale], [zero_point]
        tensor.quantization = quantization
    return tensor


def io_of(source: bytes) -> tuple[list[schema.TensorT], list[schema.TensorT]]:
    """The input and output tensors of a .tflite, as the compiler keeps them (name, shape, type, quantization)."""
    model = schema.ModelT.InitFromPackedBuf(source, 0)
    graph = model.subgraphs[0]

    def copy(index: int) -> schema.TensorT:
        t = graph.tensors[index]
        q = t.quantization
        scale = float(q.scale[0]) if q is not None and q.scale is not None and len(q.scale) else None
        zero_point = int(q.zeroPoint[0]) if scale is not None else 0
        name = t.name.decode() if isinstance(t.name, bytes) else t.name
        return _tensor(name, list(t.shape), t.type, scale, zero_point)

    return [copy(i) for i in graph.inputs], [copy(i) for i in graph.outputs]


def compiled_model_bytes(min_runtime_version: int = 14, compiler_version: str = COMPILER_VERSION,
                         input_shape: tuple[int, ...] = (1, 224, 224, 3), classes: int = 1000,
                         source: bytes | None = None) -> bytes:
    """One edgetpu-custom-op from the input to the output; with `source`, between that model's own
    input and output tensors (as the compiler keeps them), else a 224x224 uint8 image to `classes` scores."""
    code = schema.OperatorCodeT()
    code.deprecatedBuiltinCode = code.builtinCode = schema.BuiltinOperator.CUSTOM
    code.customCode, code.version = CUSTOM_OP, 1
    if source is not None:
        inputs, outputs = io_of(source)
    else:
        inputs, outputs = [_tensor("input", list(input_shape))], [_tensor("output", [1, classes])]
    op = schema.OperatorT()
    op.opcodeIndex = 0
    op.inputs, op.outputs = list(range(len(inputs))), list(range(len(inputs), len(inputs) + len(outputs)))
    op.customOptions = list(custom_options(package_bytes(min_runtime_version, compiler_version)))
    op.customOptionsFormat = schema.CustomOptionsFormat.FLEXBUFFERS
    subgraph = schema.SubGraphT()
    subgraph.tensors = inputs + outputs
    subgraph.inputs, subgraph.outputs, subgraph.operators, subgraph.name = op.inputs, op.outputs, [op], "main"
    model = schema.ModelT()
    model.version, model.description = 3, "test double of an edgetpu_compiler output"
    model.operatorCodes, model.subgraphs, model.buffers = [code], [subgraph], [schema.BufferT()]
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def compiled_detector_bytes(size: int = 16) -> bytes:
    """What edgetpu_compiler makes of an SSD: edgetpu-custom-op from the uint8 image to the head's box encodings and
    class scores, then TFLite_Detection_PostProcess on the CPU (its four float32 outputs)."""
    import numpy as np

    from app.detection_postprocess import POSTPROCESS_OP
    from tests.detection_models import postprocess_options
    from tests.tflite_builder import GraphBuilder

    g = GraphBuilder()
    image = g.activation("image", [1, size, size, 3], "UINT8")
    boxes = g.activation("box_encodings", [1, 16, 4], "UINT8")
    classes = g.activation("class_predictions", [1, 16, 3], "UINT8")
    g.op("CUSTOM", [image], [boxes, classes], custom_code=CUSTOM_OP)
    g.operators[-1].customOptions = list(custom_options(package_bytes(14)))
    anchors = g.tensor("anchors", [16, 4], "FLOAT32", data=np.zeros((16, 4)))
    outs = [g.activation(f"out{i}", shape, "FLOAT32", quantized=False)
            for i, shape in enumerate(([1, 10, 4], [1, 10], [1, 10], [1]))]
    g.op("CUSTOM", [boxes, classes, anchors], outs, custom_code=POSTPROCESS_OP)
    g.operators[-1].customOptions = list(postprocess_options())
    return g.build([image], outs)
