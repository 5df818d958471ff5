"""What kernels' prepare steps share: quantization parameters, activation ranges, padding, the step type.

These follow TFLite's Prepare functions (kernel_util.cc, padding.h), computed once at load.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from app.emulator.errors import Unsupported
from app.emulator.scratch import Scratch
from app.tflite_file import Operator, Subgraph, Tensor

QUANTIZED_TYPES = {"INT8": np.int8, "UINT8": np.uint8}
# Every tensor type a kernel here reads or writes: the 8-bit quantized ones, and the float32, integer and
# boolean tensors of float tails (MoveNet's keypoint decoding) and index arithmetic.
NUMPY_TYPES = {"INT8": np.int8, "UINT8": np.uint8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
               "FLOAT32": np.float32, "BOOL": np.bool_}


@dataclass(frozen=True)
class Step:
    """One prepared operator: run(*input arrays) -> output array (or a tuple of them)."""

    operator: Operator
    run: Callable[..., np.ndarray]
    inputs: tuple[int, ...]   # tensor indices fed to run, in order (constants are bound at prepare)
    outputs: tuple[int, ...]
    details: dict = field(default_factory=dict)  # how it runs, for inspection: {"accumulate": "float32", ...}
    # output tensor index -> the shape the kernel gives it, where TFLite's Prepare resizes an output whatever
    # the file declares (TFLite_Detection_PostProcess: converters often write no shape at all)
    resized: dict = field(default_factory=dict)


class OpView:
    """An operator with its tensors at hand, for prepare functions."""

    def __init__(self, operator: Operator, graph: Subgraph, accelerate: bool = False, scratch: Scratch | None = None):
        self.operator = operator
        self.graph = graph
        self.options = operator.options
        self.accelerate = accelerate  # numba kernels may replace numpy passes (app/emulator/accel.py)
        self.scratch = scratch if scratch is not None else Scratch()  # temporaries shared by the plan's steps

    def input(self, position: int) -> Tensor | None:
        if position >= len(self.operator.inputs) or self.operator.inputs[position] < 0:
            return None
        return self.graph.tensors[self.operator.inputs[position]]

    def output(self, position: int = 0) -> Tensor:
        return self.graph.tensors[self.operator.outputs[position]]

    def constant(self, position: int, what: str) -> np.ndarray:
        tensor = self.input(position)
        if tensor is None or tensor.data is None:
            raise Unsupported(f"{what} (input {position}) must be a constant tensor")
        return tensor.data

    def step_binding(self, run: Callable[..., np.ndarray], *positions: int, **details) -> Step:
        """A step whose run takes the values of `positions` in order: constant inputs are bound here,
        the others fed at run time."""
        constants = {p: self.input(p).data for p in positions if self.input(p).data is not None}
        if not constants:
            return self.step(run, *positions, **details)
        runtime = [p for p in positions if p not in constants]

        def bound(*arrays):
            values = dict(zip(runtime, arrays, strict=True)) | constants
            return run(*[values[p] for p in positions])

        return self.step(bound, *runtime, **details)

    def step(self, run: Callable[..., np.ndarray], *positions: int, resized: dict | None = None, **details) -> Step:
        """resized: output position -> the shape the kernel gives that output (see Step.resized)."""
        inputs = tuple(self.operator.inputs[p] for p in positions)
        shapes = {self.operator.outputs[p]: tuple(shape) for p, shape in (resized or {}).items()}
        return Step(self.operator, run, inputs, tuple(self.operator.outputs), details, shapes)


def tensor_type(tensor: Tensor, what: str, allowed=tuple(NUMPY_TYPES)) -> np.dtype:
    """The tensor's numpy type, when it is one of `allowed` (TensorType names)."""
    if tensor.type not in allowed:
        raise Unsupported(f"{what} {tensor.name!r} is {tensor.type}; expected {' or '.join(allowed)}")
    return np.dtype(NUMPY_TYPES[tensor.type])


def same_type(view: OpView, positions, allowed=tuple(NUMPY_TYPES)) -> np.dtype:
    """The type every input at `positions` and every output share (TFLite's TF_LITE_ENSURE_TYPES_EQ)."""
    dtype = tensor_type(view.output(), "output", allowed)
    for position in positions:
        if view.input(position).type != view.output().type:
            raise Unsupported(f"input {position} is {view.input(position).type}, output {view.output().type}; "
                              "expected the same type")
    for position in range(1, len(view.operator.outputs)):
        if view.output(position).type != view.output().type:
            raise Unsupported(f"output {position} is {view.output(position).type}, output 0 {view.output().type}")
    return dtype


def same_quantization(view: OpView, tensors, what: str) -> None:
    """TF_LITE_ENSURE_EQ on params.scale and params.zero_point (PACK, UNPACK): equal, or both unquantized."""
    def params(tensor):
        q = tensor.quantization
        return (0.0, 0) if q is None else (float(np.float32(q.scale[0])), int(q.zero_point[0]))

    reference = params(view.output())
    for tensor in tensors:
        if params(tensor) != reference:
            raise Unsupported(f"{what}: tensor {tensor.name!r} is quantized {params(tensor)}, the output "
                              f"{reference}; TFLite requires them equal")


def by_output_type(quantized: Callable[[OpView], Step], plain: Callable[[OpView], Step]) -> Callable[[OpView], Step]:
    """One prepare for an opcode with two kernels: `quantized` for an 8-bit output, `plain` for the others."""
    def prepare(view: OpView) -> Step:
        return quantized(view) if view.output().type in QUANTIZED_TYPES else plain(view)

    prepare.__doc__ = f"{quantized.__name__} for 8-bit outputs, {plain.__module__}.{plain.__name__} for the others"
    return prepare


def quantized_type(tensor: Tensor, what: str) -> np.dtype:
    if tensor.type not in QUANTIZED_TYPES:
        raise Unsupported(f"{what} {tensor.name!r} is {tensor.type}; expected INT8 or UINT8")
    if tensor.quantization is None:
        raise Unsupported(f"{what} {tensor.name!r} has no quantization parameters")
    return np.dtype(QUANTIZED_TYPES[tensor.type])


def scale_of(tensor: Tensor) -> float:
    """params.scale: the per-tensor scale, as the float32 TFLite holds."""
    return float(np.float32(tensor.quantization.scale[0]))


def zero_point_of(tensor: Tensor) -> int:
    return int(tensor.quantization.zero_point[0])


def per_tensor(tensor: Tensor, what: str) -> tuple[np.dtype, float, int]:
    dtype = quantized_type(tensor, what)
    if tensor.quantization.per_channel:
        raise Unsupported(f"{what} {tensor.name!r} is quantized per channel; expected per tensor")
    scale = scale_of(tensor)
    if not (np.isfinite(scale) and scale > 0):  # its multipliers would be infinite: a degenerate model
        raise Unsupported(f"{what} {tensor.name!r} has scale {scale}; expected a positive finite scale")
    return dtype, scale, zero_point_of(tensor)


def type_range(dtype: np.dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


ACTIVATIONS = ("NONE", "RELU", "RELU_N1_TO_1", "RELU6")


def activation_name(value) -> str:
    """fusedActivationFunction as its schema name."""
    names = {0: "NONE", 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH", 5: "SIGN_BIT"}
    return names.get(value, str(value)) if not isinstance(value, str) else value


def activation_range(activation, output: Tensor) -> tuple[int, int]:
    """CalculateActivationRangeQuantized: the fused activation as a clamp on quantized values.

    Each bound is zero_point + round(f / scale), computed in float32 with round half away from zero.
    """
    name = activation_name(activation)
    if name not in ACTIVATIONS:
        raise Unsupported(f"fused activation {name} is not emulated; expected one of {', '.join(ACTIVATIONS)}")
    qmin, qmax = type_range(quantized_type(output, "output"))
    scale, zero_point = np.float32(scale_of(output)), zero_point_of(output)

    def quantize(f: float) -> int:
        value = np.float32(f) / scale
        return zero_point + int(np.copysign(np.floor(np.abs(value) + np.float32(0.5)), value))

    if name == "RELU":
        return max(qmin, quantize(0.0)), qmax
    if name == "RELU6":
        return max(qmin, quantize(0.0)), min(qmax, quantize(6.0))
    if name == "RELU_N1_TO_1":
        return max(qmin, quantize(-1.0)), min(qmax, quantize(1.0))
    return qmin, qmax


@dataclass(frozen=True)
class Padding:
    """ComputePaddingHeightWidth: output size and the padding before (top/left); the rest goes after."""

    output_height: int
    output_width: int
    top: int
    left: int
    bottom: int
    right: int


def _output_size(padding: str, size: int, filter_size: int, stride: int, dilation: int) -> int:
    effective = (filter_size - 1) * dilation + 1
    if padding == "SAME":
        return (size + stride - 1) // stride
    return (size - effective + stride) // stride


def _padding_name(value) -> str:
    return {0: "SAME", 1: "VALID"}.get(value, value) if not isinstance(value, str) else value


def compute_padding(padding, height: int, width: int, filter_height: int, filter_width: int,
                    stride_height: int, stride_width: int, dilation_height: int = 1,
                    dilation_width: int = 1) -> Padding:
    name = _padding_name(padding)
    if name not in ("SAME", "VALID"):
        raise Unsupported(f"padding {name!r}; expected SAME or VALID")
    if min(stride_height, stride_width, dilation_height, dilation_width) < 1:
        raise Unsupported("strides and dilations must be >= 1")
    out_h = _output_size(name, height, filter_height, stride_height, dilation_height)
    out_w = _output_size(name, width, filter_width, stride_width, dilation_width)
    if out_h < 1 or out_w < 1:
        raise Unsupported(f"the filter does not fit the {height}x{width} input")

    def before_after(out: int, size: int, filter_size: int, stride: int, dilation: int) -> tuple[int, int]:
        effective = (filter_size - 1) * dilation + 1
        total = max((out - 1) * stride + effective - size, 0)
        before = total // 2
        # taps past the end of the input are skipped too; pad enough for every tap the views touch
        after = max((out - 1) * stride + effective - size - before, 0)
        return before, after

    top, bottom = before_after(out_h, height, filter_height, stride_height, dilation_height)
    left, right = before_after(out_w, width, filter_width, stride_width, dilation_width)
    return Padding(out_h, out_w, top, left, bottom, right)


def pad_spatial(input_data: np.ndarray, padding: Padding, value, dtype=np.float32) -> np.ndarray:
    """NHWC input converted to dtype, with `value` around it (the input zero point for convolutions).

    Without padding and already of dtype, the input itself: callers only read it.

    Buffers are allocated per call, not kept per step: measured as fast (freed memory comes back
    warm from the allocator) and it keeps the emulator's resident memory near TFLite's arena size.
    """
    n, h, w, c = input_data.shape
    shape = (n, h + padding.top + padding.bottom, w + padding.left + padding.right, c)
    if shape == input_data.shape:
        return input_data.astype(dtype, copy=False)
    out = np.full(shape, value, dtype)
    np.copyto(out[:, padding.top:padding.top + h, padding.left:padding.left + w, :], input_data)
    return out


def tap_view(padded: np.ndarray, i: int, j: int, padding: Padding, stride_height: int, stride_width: int,
             dilation_height: int, dilation_width: int) -> np.ndarray:
    """The input values filter tap (i, j) meets at every output position: [N, out_h, out_w, C]."""
    y0, x0 = i * dilation_height, j * dilation_width
    return padded[:, y0:y0 + stride_height * (padding.output_height - 1) + 1:stride_height,
                  x0:x0 + stride_width * (padding.output_width - 1) + 1:stride_width, :]


def multipliers(real_multipliers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """QuantizeMultiplier over an array of real multipliers -> (int64 multipliers, int64 shifts)."""
    from app.emulator.fixedpoint import quantize_multiplier

    pairs = [quantize_multiplier(float(m)) for m in np.atleast_1d(real_multipliers)]
    return (np.array([p[0] for p in pairs], dtype=np.int64), np.array([p[1] for p in pairs], dtype=np.int64))
