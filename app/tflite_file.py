"""A .tflite file as plain Python values: tensors, operators, options, constant data.

Read with the flatbuffer schema that ships inside the pinned runtime
(`ai_edge_litert.schema_py_generated`, TFLite's schema.fbs compiled with the object API),
so the reader and the runtime agree on every field. Shared by the numpy emulator and the
Edge TPU compatibility analysis; neither needs the interpreter to look at a model.
Only the first subgraph is the model's graph (TFLite runs subgraph 0); the others are
bodies of control-flow ops and are listed for the analysis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import flatbuffers.flexbuffers as flexbuffers
import numpy as np

from app.errors import EngineLoadError

TFLITE_IDENTIFIER = b"TFL3"
# TensorType -> numpy dtype, for the types a quantized classifier carries.
_DTYPES = {
    "FLOAT32": np.float32, "FLOAT16": np.float16, "FLOAT64": np.float64,
    "INT8": np.int8, "UINT8": np.uint8, "INT16": np.int16, "UINT16": np.uint16,
    "INT32": np.int32, "UINT32": np.uint32, "INT64": np.int64, "UINT64": np.uint64,
    "BOOL": np.bool_,
}


class TfliteFileError(EngineLoadError):
    """The bytes are not a TFLite model this reader understands."""


@cache
def schema() -> ModuleType:
    try:
        from ai_edge_litert import schema_py_generated
    except ImportError as e:  # the Edge TPU images carry tflite_runtime, which has no schema module
        raise TfliteFileError(f"reading .tflite files needs ai-edge-litert's schema module: {e}") from None
    return schema_py_generated


@cache
def _names(enum_name: str) -> dict[int, str]:
    """Value -> name of one of the schema's enums (BuiltinOperator, TensorType, ...)."""
    enum = getattr(schema(), enum_name)
    return {value: key for key, value in vars(enum).items() if not key.startswith("_") and isinstance(value, int)}


@dataclass(frozen=True)
class Quantization:
    """real = scale * (q - zero_point), per tensor (one entry) or per channel along `axis`."""

    scale: np.ndarray        # float32
    zero_point: np.ndarray   # int64
    axis: int                # TFLite's quantized_dimension

    @property
    def per_channel(self) -> bool:
        return self.scale.size > 1


@dataclass(frozen=True)
class Tensor:
    index: int
    name: str
    type: str                     # TensorType name: "INT8", "UINT8", "INT32", "FLOAT32", ...
    shape: tuple[int, ...]
    shape_signature: tuple[int, ...]  # -1 where a dimension is dynamic
    quantization: Quantization | None
    data: np.ndarray | None = field(default=None, repr=False)  # constant tensors (weights, biases, shapes)

    @property
    def dtype(self) -> np.dtype | None:
        kind = _DTYPES.get(self.type)
        return None if kind is None else np.dtype(kind)

    @property
    def is_constant(self) -> bool:
        return self.data is not None

    @property
    def is_dynamic(self) -> bool:
        return -1 in self.shape_signature


@dataclass(frozen=True)
class Operator:
    index: int
    opcode: str                  # builtin name ("CONV_2D"), or the custom code ("edgetpu-custom-op")
    custom: bool
    version: int
    inputs: tuple[int, ...]      # tensor indices; -1 for an omitted optional input
    outputs: tuple[int, ...]
    options: dict[str, Any]      # builtin options by schema field name (strideW, fusedActivationFunction, ...)
    custom_options: bytes | None = field(default=None, repr=False)

    def custom_options_map(self) -> dict[str, Any]:
        """A custom operator's options read as the flexbuffer map most custom ops carry (TFLite_Detection_PostProcess's
        max_detections, nms_iou_threshold, ...): key -> int, float, bool, str, None or list, as stored; {} when
        the operator has none. TfliteFileError when they are not a flexbuffer map."""
        if not self.custom_options:
            return {}
        try:
            values = flexbuffers.Loads(self.custom_options)
        except Exception as e:  # a corrupt flexbuffer fails anywhere in the reader
            raise TfliteFileError(f"operator #{self.index} {self.opcode}: custom options are not a readable "
                                  f"flexbuffer ({type(e).__name__}: {e})") from None
        if not isinstance(values, dict):
            raise TfliteFileError(f"operator #{self.index} {self.opcode}: custom options are a flexbuffer "
                                  f"{type(values).__name__}, not a map")
        return values


@dataclass(frozen=True)
class Subgraph:
    name: str
    tensors: tuple[Tensor, ...]
    operators: tuple[Operator, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


@dataclass(frozen=True)
class TfliteModel:
    version: int
    description: str
    subgraphs: tuple[Subgraph, ...]

    @property
    def graph(self) -> Subgraph:
        """The subgraph the interpreter runs."""
        return self.subgraphs[0]


def read_tflite(source: bytes | str | Path) -> TfliteModel:
    """Parse a .tflite file (path or bytes); TfliteFileError if it is not one."""
    buf = source if isinstance(source, (bytes, bytearray, memoryview)) else _read(Path(source))
    buf = bytes(buf)
    if len(buf) < 8 or buf[4:8] != TFLITE_IDENTIFIER:
        raise TfliteFileError(f"not a TFLite model: no {TFLITE_IDENTIFIER.decode()} identifier")
    try:
        model = schema().ModelT.InitFromPackedBuf(buf, 0)
        return TfliteModel(
            version=int(model.version),
            description=_text(model.description),
            subgraphs=tuple(_subgraph(model, g, buf) for g in model.subgraphs or ()),
        )
    except TfliteFileError:
        raise
    except Exception as e:  # a corrupt flatbuffer fails anywhere in the generated code
        raise TfliteFileError(f"not a readable TFLite flatbuffer: {type(e).__name__}: {e}") from None


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise TfliteFileError(f"cannot read {path}: {e}") from None


def _text(value) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _subgraph(model, graph, buf: bytes) -> Subgraph:
    tensors = tuple(_tensor(i, t, model, buf) for i, t in enumerate(graph.tensors or ()))
    operators = tuple(_operator(i, op, model) for i, op in enumerate(graph.operators or ()))
    return Subgraph(
        name=_text(graph.name),
        tensors=tensors,
        operators=operators,
        inputs=tuple(int(i) for i in _seq(graph.inputs)),
        outputs=tuple(int(i) for i in _seq(graph.outputs)),
    )


def _seq(values) -> list:
    return [] if values is None else list(values)


def _tensor(index: int, t, model, buf: bytes) -> Tensor:
    type_name = _names("TensorType").get(t.type, f"TYPE_{t.type}")
    shape = tuple(int(d) for d in _seq(t.shape))
    signature = tuple(int(d) for d in _seq(t.shapeSignature)) or shape
    return Tensor(
        index=index,
        name=_text(t.name),
        type=type_name,
        shape=shape,
        shape_signature=signature,
        quantization=_quantization(t.quantization),
        data=_constant(model, t, type_name, shape, buf),
    )


def _quantization(q) -> Quantization | None:
    if q is None or q.scale is None or len(q.scale) == 0:
        return None
    scale = np.asarray(q.scale, dtype=np.float32)
    zero_point = np.asarray(_seq(q.zeroPoint) or [0] * scale.size, dtype=np.int64)
    return Quantization(scale, zero_point, int(q.quantizedDimension))


def _constant(model, t, type_name: str, shape: tuple[int, ...], buf: bytes) -> np.ndarray | None:
    if not model.buffers or t.buffer >= len(model.buffers):
        return None
    buffer = model.buffers[t.buffer]
    raw = buffer.data
    if raw is None or len(raw) == 0:
        if buffer.size:  # models over 2 GB keep buffers after the flatbuffer
            raw = np.frombuffer(buf, np.uint8, count=int(buffer.size), offset=int(buffer.offset))
        else:
            return None
    dtype = _DTYPES.get(type_name)
    if dtype is None:
        raise TfliteFileError(f"constant tensor {_text(t.name)!r} has type {type_name}, which is not read here")
    data = np.frombuffer(np.asarray(raw, dtype=np.uint8).tobytes(), dtype=np.dtype(dtype).newbyteorder("<"))
    expected = int(np.prod(shape)) if shape else 1
    if data.size != expected:
        raise TfliteFileError(f"constant tensor {_text(t.name)!r}: {data.size} values for shape {shape}")
    return data.astype(dtype, copy=False).reshape(shape)


def _operator(index: int, op, model) -> Operator:
    code = model.operatorCodes[op.opcodeIndex]
    # builtinCode is the full enum; deprecatedBuiltinCode is what files before 2.3 filled (max 127).
    builtin = max(int(code.builtinCode), int(code.deprecatedBuiltinCode))
    name = _names("BuiltinOperator").get(builtin, f"BUILTIN_{builtin}")
    custom = name == "CUSTOM"
    if custom:
        name = _text(code.customCode)
    options = {}
    for holder in (op.builtinOptions, op.builtinOptions2):
        if holder is not None:
            options.update({key: _plain(value) for key, value in vars(holder).items()})
    custom_options = None
    if op.customOptions is not None and len(op.customOptions):
        custom_options = np.asarray(op.customOptions, dtype=np.uint8).tobytes()
    return Operator(
        index=index,
        opcode=name,
        custom=custom,
        version=int(code.version),
        inputs=tuple(int(i) for i in _seq(op.inputs)),
        outputs=tuple(int(i) for i in _seq(op.outputs)),
        options=options,
        custom_options=custom_options,
    )


def _plain(value):
    """Option values as Python scalars and lists (numpy arrays come from vector fields)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value
