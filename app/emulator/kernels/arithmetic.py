"""ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM, FLOOR_DIV, FLOOR_MOD, SQRT, RSQRT on float32 and integer tensors:
the arithmetic of float tails (MoveNet decodes its keypoints in float after the Edge TPU's part) and of
index computations (int32 row = index // width).

TFLite's reference kernels (reference/add.h, sub.h, mul.h, div.h, maximum_minimum.h, floor_div.h,
floor_mod.h, kernels/elementwise.cc) compute one C++ operation per element, in the tensor's type, then
clamp to the fused activation's range. numpy's float32 + - * / and sqrt are the same IEEE operations,
so the bytes agree; what needs care is spelled out where it happens:

- The clamp is `min(max(x, act_min), act_max)` with std::max/std::min, whose argument order decides
  NaN and -0.0: NaN passes through, -0.0 stays -0.0 under RELU, and without an activation the range is
  [lowest, max], so a float result of +-inf becomes +-FLT_MAX (kernel_util.h CalculateActivationRange).
- MAXIMUM is `a > b ? a : b` and MINIMUM `a < b ? a : b`: with a NaN the second operand wins when the
  comparison fails.
- FLOOR_DIV computes std::floor(double(a) / double(b)), converted back to the type; a zero anywhere in
  the divisor fails the invoke ("Division by 0"), for floats too. FLOOR_MOD is C's % (fmodf for
  float) moved to the divisor's sign, with the same check.
- Integer DIV truncates toward zero (C's /) and fails on a zero divisor; float DIV does not check.

8-bit quantized ADD, SUB, MUL, DIV, MAXIMUM and MINIMUM are elementwise.py's table kernels; kernels/__init__.py
picks by the output's type. SQRT on int8 is the quantized kernel of elementwise.cc (in float, per byte).
"""

from __future__ import annotations

import numpy as np

from app.emulator.errors import InvokeFailed, Unsupported
from app.emulator.kernels.common import OpView, Step, activation_name, per_tensor, same_type, type_range
from app.emulator.kernels.quantize import ByteTable

f32 = np.float32
FLOAT_AND_INTEGER = ("FLOAT32", "INT32", "INT64")


# ---- the fused activation on unquantized values ----

def calculate_activation_range(activation, dtype: np.dtype) -> tuple:
    """CalculateActivationRange<T>: RELU [0, max], RELU6 [0, 6], RELU_N1_TO_1 [-1, 1], none [lowest, max]."""
    name = activation_name(activation)
    info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
    lowest, highest = dtype.type(info.min), dtype.type(info.max)
    ranges = {"NONE": (lowest, highest), "RELU": (dtype.type(0), highest), "RELU6": (dtype.type(0), dtype.type(6)),
              "RELU_N1_TO_1": (dtype.type(-1), dtype.type(1))}
    if name not in ranges:
        raise Unsupported(f"fused activation {name} is not emulated; expected one of {', '.join(ranges)}")
    return ranges[name]


def activation_function_with_min_max(x: np.ndarray, output_activation_min, output_activation_max) -> np.ndarray:
    """ActivationFunctionWithMinMax: std::min(std::max(x, min), max); max(a, b) is (a < b) ? b : a."""
    x = np.where(x < output_activation_min, output_activation_min, x)
    return np.where(output_activation_max < x, output_activation_max, x)


# ---- the kernels ----

def add(input1_data, input2_data, output_activation_min, output_activation_max) -> np.ndarray:
    """reference_ops::Add / BroadcastAdd6DSlow (float, int32, int64): a + b, then the activation range."""
    return activation_function_with_min_max(input1_data + input2_data, output_activation_min, output_activation_max)


def sub(input1_data, input2_data, output_activation_min, output_activation_max) -> np.ndarray:
    """reference_ops::SubWithActivation / BroadcastSubSlow: a - b, then the activation range."""
    return activation_function_with_min_max(input1_data - input2_data, output_activation_min, output_activation_max)


def mul(input1_data, input2_data, output_activation_min, output_activation_max) -> np.ndarray:
    """reference_ops::Mul / BroadcastMul6DSlow: a * b, then the activation range."""
    return activation_function_with_min_max(input1_data * input2_data, output_activation_min, output_activation_max)


def truncating_divide(input1_data: np.ndarray, input2_data: np.ndarray) -> np.ndarray:
    """C++ integer `/`: the quotient truncated toward zero (numpy's // floors), wrapped to the type."""
    a, b = np.asarray(input1_data), np.asarray(input2_data)
    floored = np.floor_divide(a, b)  # in the type itself: no absolute value to overflow at INT_MIN
    inexact = np.fmod(a, b) != 0  # numpy's integer fmod is C's %
    return np.where(inexact & ((a < 0) != (b < 0)), floored + 1, floored)


def div(input1_data, input2_data, output_activation_min, output_activation_max) -> np.ndarray:
    """reference_ops::Div / BroadcastDivSlow (float32, int32): a / b, then the activation range."""
    if input1_data.dtype.kind == "f":
        quotient = input1_data / input2_data
    else:
        quotient = truncating_divide(input1_data, input2_data)
    return activation_function_with_min_max(quotient, output_activation_min, output_activation_max)


def maximum(input1_data, input2_data) -> np.ndarray:
    """MaximumOp: el1 > el2 ? el1 : el2."""
    return np.where(input1_data > input2_data, input1_data, input2_data)


def minimum(input1_data, input2_data) -> np.ndarray:
    """MinimumOp: el1 < el2 ? el1 : el2."""
    return np.where(input1_data < input2_data, input1_data, input2_data)


def floor_div(input1_data: np.ndarray, input2_data: np.ndarray) -> np.ndarray:
    """reference_ops::FloorDiv: std::floor(double(a) / double(b)), converted back to the type."""
    quotient = np.floor(input1_data.astype(np.float64) / input2_data.astype(np.float64))
    if input1_data.dtype.kind == "f":
        return quotient.astype(input1_data.dtype)
    return float_to_integer(quotient, input1_data.dtype)


def float_to_integer(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """static_cast<T>(double) as x86-64 compiles it: truncation by cvttsd2si to 32 bits (64 for int64), whose
    out-of-range answer is INT_MIN, then the low bits for narrower types."""
    if dtype == np.int64:
        return values.astype(np.int64)
    wide = np.where((values >= -(2.0**31)) & (values < 2.0**31), values, -(2.0**31)).astype(np.int32)
    return wide.astype(dtype)


def floor_mod(input1_data: np.ndarray, input2_data: np.ndarray) -> np.ndarray:
    """reference_ops::FloorMod: the truncated remainder (C's %, fmodf for float), plus the divisor when the
    remainder is not zero and its sign differs from the divisor's."""
    trunc_mod = np.fmod(input1_data, input2_data)  # fmodf for float32; C's % for integers (numpy's integer fmod)
    adjust = (trunc_mod != 0) & ((input2_data < 0) != (trunc_mod < 0))
    return np.where(adjust, trunc_mod + input2_data, trunc_mod).astype(input1_data.dtype)


def sqrt(input_data: np.ndarray) -> np.ndarray:
    """std::sqrt on float (correctly rounded: IEEE requires it, numpy's and libm's agree)."""
    return np.sqrt(input_data)


def rsqrt(input_data: np.ndarray) -> np.ndarray:
    """elementwise.cc Rsqrt (float): 1.0f / std::sqrt(value)."""
    return f32(1) / np.sqrt(input_data)


# ---- prepare ----

def _output_shape(view: OpView) -> tuple[int, ...]:
    shape1, shape2 = view.input(0).shape, view.input(1).shape
    try:
        expected = tuple(np.broadcast_shapes(shape1, shape2))
    except ValueError:
        raise Unsupported(f"shapes {shape1} and {shape2} do not broadcast") from None
    if expected != tuple(view.output().shape):
        raise Unsupported(f"output shape {view.output().shape}; the inputs broadcast to {expected}")
    return expected


def _binary(view: OpView, types, kernel, check_divisor: str | None = None) -> Step:
    """A broadcasting binary op on unquantized tensors of one type. check_divisor names the op whose kernel
    fails on a zero in its second input (at load for a constant divisor, at invoke for a computed one)."""
    dtype = same_type(view, (0, 1), types)
    shape = _output_shape(view)
    divisor = view.input(1).data
    if check_divisor and divisor is not None and (divisor == 0).any():
        raise Unsupported(f"the constant divisor holds a 0: TFLite's {check_divisor} fails every invoke")

    def run(x1: np.ndarray, x2: np.ndarray) -> np.ndarray:
        if check_divisor and divisor is None and (x2 == 0).any():
            raise InvokeFailed(f"{check_divisor}: Division by 0 (a zero in the divisor, as TFLite checks)")
        with np.errstate(all="ignore"):  # IEEE results (inf, NaN) and integer wrap-around, as in C++
            return np.asarray(kernel(np.asarray(x1), np.asarray(x2)), dtype).reshape(shape)

    return view.step_binding(run, 0, 1)


def _with_activation(view: OpView, types, kernel, check_divisor: str | None = None) -> Step:
    dtype = same_type(view, (0, 1), types)
    low, high = calculate_activation_range(view.options.get("fusedActivationFunction", 0), dtype)
    return _binary(view, types, lambda a, b: kernel(a, b, low, high), check_divisor)


def prepare_add(view: OpView) -> Step:
    return _with_activation(view, FLOAT_AND_INTEGER, add)


def prepare_sub(view: OpView) -> Step:
    return _with_activation(view, FLOAT_AND_INTEGER, sub)


def prepare_mul(view: OpView) -> Step:
    return _with_activation(view, FLOAT_AND_INTEGER, mul)


def prepare_div(view: OpView) -> Step:
    if view.output().type == "INT32":
        return _with_activation(view, ("INT32",), div, check_divisor="DIV")
    return _with_activation(view, ("FLOAT32",), div)


def prepare_maximum(view: OpView) -> Step:
    return _binary(view, ("FLOAT32", "INT16", "INT32", "INT64"), maximum)


def prepare_minimum(view: OpView) -> Step:
    return _binary(view, ("FLOAT32", "INT16", "INT32", "INT64"), minimum)


def prepare_floor_div(view: OpView) -> Step:
    return _binary(view, ("FLOAT32", "INT8", "INT16", "INT32"), floor_div, check_divisor="FLOOR_DIV")


def prepare_floor_mod(view: OpView) -> Step:
    return _binary(view, ("FLOAT32", "INT8", "INT16", "INT32", "INT64"), floor_mod, check_divisor="FLOOR_MOD")


def sqrt_quantized(input_data, input_scale: float, input_zero_point: int, output_scale: float,
                   output_zero_point: int, dtype: np.dtype) -> np.ndarray:
    """SqrtEvalQuantized: input_scale * (q - zp) in float, std::sqrt, / output_scale, a truncating cast to
    int, + output zero point, clamped. (A negative input fails the invoke: the caller checks.)"""
    dequantized_input = f32(input_scale) * (np.asarray(input_data, np.int64) - input_zero_point).astype(f32)
    float_output = np.sqrt(np.maximum(dequantized_input, f32(0)))  # correctly rounded, as std::sqrt
    quantized_output = np.trunc(float_output / f32(output_scale)).astype(np.int64) + output_zero_point
    low, high = type_range(dtype)
    return np.clip(quantized_output, low, high)


def _prepare_unary(view: OpView, kernel) -> Step:
    dtype = same_type(view, (0,), ("FLOAT32",))

    def run(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):  # sqrt of a negative is NaN, 1/sqrt(0) inf: as in C++
            return np.asarray(kernel(x), dtype)

    return view.step_binding(run, 0)


def prepare_sqrt(view: OpView) -> Step:
    if view.input(0).type != "INT8":
        return _prepare_unary(view, sqrt)
    dtype, input_scale, input_zero_point = per_tensor(view.input(0), "input")
    output_dtype, output_scale, output_zero_point = per_tensor(view.output(), "output")
    if output_dtype != dtype:
        raise Unsupported(f"input {view.input(0).type}, output {view.output().type}; expected the same type")
    values = np.arange(256, dtype=np.uint8).view(dtype).astype(np.int64)
    negative = (f32(input_scale) * (values - input_zero_point).astype(f32)) < 0  # by byte
    table = ByteTable(lambda q: sqrt_quantized(q, input_scale, input_zero_point, output_scale, output_zero_point,
                                               dtype), dtype, dtype)

    def run(x: np.ndarray) -> np.ndarray:
        if negative.take(x.view(np.uint8)).any():
            raise InvokeFailed("SQRT: Sqrt is only defined for non-negative values (a negative int8 input)")
        return table(x)

    return view.step_binding(run, 0)


def prepare_rsqrt(view: OpView) -> Step:
    return _prepare_unary(view, rsqrt)


# Opcodes with an 8-bit quantized kernel elsewhere (elementwise.py): kernels/__init__.py picks by output type.
FLOAT_AND_INTEGER_PREPARE = {
    "ADD": prepare_add,
    "SUB": prepare_sub,
    "MUL": prepare_mul,
    "DIV": prepare_div,
    "MAXIMUM": prepare_maximum,
    "MINIMUM": prepare_minimum,
}

PREPARE = {
    "FLOOR_DIV": prepare_floor_div,
    "FLOOR_MOD": prepare_floor_mod,
    "SQRT": prepare_sqrt,
    "RSQRT": prepare_rsqrt,
}
