"""ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM on int8/uint8 tensors, with numpy (= TFLite) broadcasting.

The arithmetic kernels below are TFLite's, vectorised in int64 (reference/integer_ops/add.h,
mul.h, reference/sub.h, div.h). An 8-bit binary op is a function of two bytes, so at load each one is
evaluated once on all 65536 pairs and run as a table look-up: exact by construction, and one
gather per element instead of three requantizations.
"""

from __future__ import annotations

import numpy as np

from app.emulator.errors import InvokeFailed, Unsupported
from app.emulator.fixedpoint import (
    Rounding,
    count_leading_zeros_32,
    get_reciprocal,
    multiply_by_quantized_multiplier,
    multiply_by_quantized_multiplier_greater_than_one,
    multiply_by_quantized_multiplier_smaller_than_one_exp,
    quantize_multiplier,
    saturating_rounding_doubling_high_mul,
    wrap_int32,
)
from app.emulator.kernels.common import OpView, Step, activation_range, per_tensor

ADD_LEFT_SHIFT = 20  # 8-bit ADD/SUB: inputs go to Q(31-20) before rescaling
SUB_LANES = 4  # reference_ops::Sub's loop as compiled (SSE, int32): values per vector, the rest one by one
# tests/test_emulator_rounding.py: MUL measured to round twice; for ADD/SUB the two modes give the
# same result on every input tried (a tie needs odds of ~2^-21), so gemmlowp's is kept, like MUL.
ADD_ROUNDING = Rounding.DOUBLE_ROUNDING
MUL_ROUNDING = Rounding.DOUBLE_ROUNDING
DIV_ROUNDING = Rounding.DOUBLE_ROUNDING


def add(input1_data, input2_data, input1_offset: int, input2_offset: int, left_shift: int,
        input1_multiplier: int, input1_shift: int, input2_multiplier: int, input2_shift: int,
        output_multiplier: int, output_shift: int, output_offset: int,
        quantized_activation_min: int, quantized_activation_max: int, rounding: Rounding,
        subtract: bool = False, vector_lanes: bool = False) -> np.ndarray:
    """reference_integer_ops::AddElementwise (and SubElementwise with subtract=True), int64 throughout.

    vector_lanes: the result where the compiled loop runs SSE lanes rather than its scalar tail; they differ
    only for an output multiplier above one (SUB), see rounding_divide_by_pot_int32."""
    input1_val = np.asarray(input1_data, np.int64) + input1_offset
    input2_val = np.asarray(input2_data, np.int64) + input2_offset
    scaled_input1_val = multiply_by_quantized_multiplier_smaller_than_one_exp(
        input1_val << left_shift, input1_multiplier, input1_shift, rounding)
    scaled_input2_val = multiply_by_quantized_multiplier_smaller_than_one_exp(
        input2_val << left_shift, input2_multiplier, input2_shift, rounding)
    raw = scaled_input1_val - scaled_input2_val if subtract else scaled_input1_val + scaled_input2_val
    if output_shift > 0 and rounding is Rounding.DOUBLE_ROUNDING:
        # SUB's output multiplier above one (a calibrated range near zero): the same call, its
        # RoundingDivideByPOT given a negative exponent, as compiled (rounding_divide_by_pot_int32)
        raw_output = rounding_divide_by_pot_int32(saturating_rounding_doubling_high_mul(raw, output_multiplier),
                                                  -output_shift, vector_lanes)
    else:
        raw_output = multiply_by_quantized_multiplier_smaller_than_one_exp(raw, output_multiplier, output_shift,
                                                                           rounding)
    return np.clip(raw_output + output_offset, quantized_activation_min, quantized_activation_max)


def mul(input1_data, input2_data, input1_offset: int, input2_offset: int, output_multiplier: int,
        output_shift: int, output_offset: int, quantized_activation_min: int,
        quantized_activation_max: int, rounding: Rounding) -> np.ndarray:
    """reference_integer_ops::MulElementwise."""
    input1_val = np.asarray(input1_data, np.int64) + input1_offset
    input2_val = np.asarray(input2_data, np.int64) + input2_offset
    unclamped = multiply_by_quantized_multiplier(input1_val * input2_val, output_multiplier, output_shift,
                                                 rounding)
    return np.clip(unclamped + output_offset, quantized_activation_min, quantized_activation_max)


def count_leading_sign_bits(x) -> np.ndarray:
    """CountLeadingSignBits<int32>: leading bits equal to the sign bit, the sign bit excluded."""
    x = np.asarray(x, np.int64)
    positive = count_leading_zeros_32(np.maximum(x, 0)) - 1
    negative = count_leading_zeros_32(2 * np.abs(x) - 1)
    return np.where(x >= 0, positive, np.where(x == -(2**31), 0, negative))


def rounding_divide_by_pot_int32(x, exponent, vector_lanes: bool = False) -> np.ndarray:
    """gemmlowp RoundingDivideByPOT<int32> for any exponent, as x86-64 runs it. DIV's exponent reaches past 31
    (a dividend of 0 or 1 has 30-31 bits of headroom), SUB's is negative for an output multiplier above one:
    the mask `(1ll << exponent) - 1` is cut to 32 bits (all ones from 32 to 63) and the shift count of
    `x >> exponent` is taken mod 32 by the scalar instruction, so 0 / x gives 1 before the output offset; where
    the loop is vectorised (SUB's, 4 int32 lanes: vector_lanes) a count outside 0..31 fills with the sign bit
    instead (psrad). Both measured on the pinned runtime."""
    x = np.asarray(x, np.int64)
    exponent = np.asarray(exponent, np.int64)
    with np.errstate(over="ignore"):  # 1 << 63 wraps to INT64_MIN, and - 1 back to INT64_MAX: as in C++
        mask = wrap_int32(((np.int64(1) << (exponent & 63)) - 1) & 0xFFFFFFFF)
    remainder = wrap_int32(x & mask)
    threshold = (mask >> 1) + (x < 0)
    if vector_lanes:
        shifted = np.where((exponent >= 0) & (exponent <= 31), x >> np.clip(exponent, 0, 31), np.where(x < 0, -1, 0))
    else:
        shifted = x >> (exponent & 31)
    return wrap_int32(shifted + (remainder > threshold))


def div(input1_data, input2_data, input1_offset: int, input2_offset: int, output_multiplier: int, output_shift: int,
        output_offset: int, quantized_activation_min: int, quantized_activation_max: int,
        rounding: Rounding) -> np.ndarray:
    """reference_ops::DivElementwise (8-bit): the divisor's reciprocal by GetReciprocal, the dividend scaled up
    to its headroom, one MultiplyByQuantizedMultiplierGreaterThanOne, then the output rescale by the shift
    left over. A divisor below its zero point flips both signs first."""
    input1_val = np.asarray(input1_data, np.int64) + input1_offset
    input2_val = np.asarray(input2_data, np.int64) + input2_offset
    flip = input2_val < 0
    input1_val = np.where(flip, -input1_val, input1_val)
    input2_val = np.where(flip, -input2_val, input2_val)
    input2_inv, recip_shift = get_reciprocal(input2_val, 31)
    headroom = count_leading_sign_bits(input1_val)
    unscaled_quotient = wrap_int32(multiply_by_quantized_multiplier_greater_than_one(input1_val, input2_inv,
                                                                                     headroom, rounding))
    total_shift = output_shift - recip_shift - headroom
    # MultiplyByQuantizedMultiplierSmallerThanOneExp, its RoundingDivideByPOT taken as compiled
    unclamped_result = output_offset + rounding_divide_by_pot_int32(
        saturating_rounding_doubling_high_mul(unscaled_quotient, output_multiplier), -total_shift)
    return np.clip(unclamped_result, quantized_activation_min, quantized_activation_max)


def maximum(input1_data: np.ndarray, input2_data: np.ndarray) -> np.ndarray:
    """reference_ops::MaximumMinimumBroadcastSlow with max: on the quantized values, no rescaling."""
    return np.maximum(input1_data, input2_data)


def minimum(input1_data: np.ndarray, input2_data: np.ndarray) -> np.ndarray:
    """reference_ops::MaximumMinimumBroadcastSlow with min."""
    return np.minimum(input1_data, input2_data)


# ---- tables and prepare ----

def byte_values(dtype: np.dtype) -> np.ndarray:
    """Every value of an 8-bit type, ordered by its byte (so table[x.view(uint8)] looks x up)."""
    return np.arange(256, dtype=np.uint8).view(dtype)


class PairTable:
    """out = table[x1, x2] for two 8-bit tensors, broadcast like numpy."""

    def __init__(self, kernel, dtype1: np.dtype, dtype2: np.dtype, output_dtype: np.dtype):
        grid1, grid2 = np.meshgrid(byte_values(dtype1), byte_values(dtype2), indexing="ij")
        self.table = kernel(grid1, grid2).astype(output_dtype).reshape(-1)

    def __call__(self, x1: np.ndarray, x2: np.ndarray) -> np.ndarray:
        """table.take over uint16 indices x1 << 8 | x2: a quarter of the memory of intp indices, and take
        is several times faster than table[index] (measured, numpy 2.4)."""
        index = np.empty(np.broadcast_shapes(x1.shape, x2.shape), np.uint16)
        np.left_shift(x1.view(np.uint8), 8, out=index, dtype=np.uint16)
        np.bitwise_or(index, x2.view(np.uint8), out=index)
        return self.table.take(index)


def binary_step(view: OpView, kernel, output_dtype) -> Step:
    dtype1 = per_tensor(view.input(0), "input1")[0]
    dtype2 = per_tensor(view.input(1), "input2")[0]
    table = PairTable(kernel, dtype1, dtype2, output_dtype)
    shape1, shape2 = view.input(0).shape, view.input(1).shape
    try:
        expected = np.broadcast_shapes(shape1, shape2)
    except ValueError:
        raise Unsupported(f"shapes {shape1} and {shape2} do not broadcast") from None
    if tuple(expected) != tuple(view.output().shape):
        raise Unsupported(f"output shape {view.output().shape}; the inputs broadcast to {expected}")
    constants = {p: view.input(p).data for p in (0, 1) if view.input(p).data is not None}
    runtime = [p for p in (0, 1) if p not in constants]

    def run(*arrays):
        values = dict(zip(runtime, arrays, strict=True)) | constants
        return table(np.asarray(values[0]), np.asarray(values[1]))

    return view.step(run, *runtime)


def _same_types(view: OpView) -> np.dtype:
    dtype, _, _ = per_tensor(view.output(), "output")
    for position in (0, 1):
        if per_tensor(view.input(position), f"input{position + 1}")[0] != dtype:
            raise Unsupported(f"input{position + 1} is {view.input(position).type}, output {view.output().type}")
    return dtype


def prepare_add(view: OpView, subtract: bool = False) -> Step:
    dtype = _same_types(view)
    (_, s1, z1), (_, s2, z2) = per_tensor(view.input(0), "input1"), per_tensor(view.input(1), "input2")
    _, s_out, z_out = per_tensor(view.output(), "output")
    # 2 * max(float, float) is a float in C++; the divisions are in double.
    twice_max_input_scale = float(np.float32(2) * max(np.float32(s1), np.float32(s2)))
    real_input1_multiplier = s1 / twice_max_input_scale
    real_input2_multiplier = s2 / twice_max_input_scale
    real_output_multiplier = twice_max_input_scale / float(np.float32(1 << ADD_LEFT_SHIFT) * np.float32(s_out))
    m1, sh1 = quantize_multiplier(real_input1_multiplier)
    m2, sh2 = quantize_multiplier(real_input2_multiplier)
    mo, sho = quantize_multiplier(real_output_multiplier)
    # SUB's Prepare takes an output multiplier above one (QuantizeMultiplierGreaterThanOne: "valid if the stats
    # range is very narrow"); ADD's fails a CHECK there, and both fail on the input multipliers.
    for shift in (sh1, sh2) if subtract else (sh1, sh2, sho):
        if shift > 0:
            raise Unsupported("a rescale multiplier is not below one (TFLite's QuantizeMultiplierSmallerThanOneExp)")
    act_min, act_max = activation_range(view.options.get("fusedActivationFunction", 0), view.output())

    def kernel(x1, x2, vector_lanes: bool = False):
        return add(x1, x2, -z1, -z2, ADD_LEFT_SHIFT, m1, sh1, m2, sh2, mo, sho, z_out, act_min, act_max,
                   ADD_ROUNDING, subtract=subtract, vector_lanes=vector_lanes)

    if sho > 0:
        return _lanes_and_tail_step(view, kernel, dtype)
    return binary_step(view, kernel, dtype)


def _lanes_and_tail_step(view: OpView, kernel, output_dtype) -> Step:
    """SUB with an output multiplier above one: reference_ops::Sub's loop over the flat tensors runs SSE lanes 4
    values at a time and its last size % 4 values one by one, and the two give different results (see
    rounding_divide_by_pot_int32): a table for each. With broadcasting (BroadcastQuantSubSlow's loops) where each
    runs is not known: refused."""
    shape1, shape2, output_shape = view.input(0).shape, view.input(1).shape, view.output().shape
    rank = max(len(shape1), len(shape2))
    if (1,) * (rank - len(shape1)) + tuple(shape1) != (1,) * (rank - len(shape2)) + tuple(shape2):
        raise Unsupported("SUB with an output multiplier above one and broadcasting is not emulated (TFLite's "
                          "result depends on which values its compiled loop runs in SSE lanes)")
    dtype1, dtype2 = per_tensor(view.input(0), "input1")[0], per_tensor(view.input(1), "input2")[0]
    lanes = PairTable(lambda a, b: kernel(a, b, vector_lanes=True), dtype1, dtype2, output_dtype)
    tail = PairTable(kernel, dtype1, dtype2, output_dtype)
    size = int(np.prod(output_shape))
    body = SUB_LANES * (size // SUB_LANES)
    constants = {p: view.input(p).data for p in (0, 1) if view.input(p).data is not None}
    runtime = [p for p in (0, 1) if p not in constants]

    def run(*arrays):
        values = dict(zip(runtime, arrays, strict=True)) | constants
        x1, x2 = np.asarray(values[0]).reshape(-1), np.asarray(values[1]).reshape(-1)
        out = lanes(x1, x2)
        out[body:] = tail(x1[body:], x2[body:])
        return out.reshape(output_shape)

    return view.step(run, *runtime)


def prepare_sub(view: OpView) -> Step:
    return prepare_add(view, subtract=True)


def prepare_mul(view: OpView) -> Step:
    dtype = _same_types(view)
    (_, s1, z1), (_, s2, z2) = per_tensor(view.input(0), "input1"), per_tensor(view.input(1), "input2")
    _, s_out, z_out = per_tensor(view.output(), "output")
    # input1_scale * input2_scale / output_scale, all float in C++, then widened to double
    real_multiplier = float(np.float32(np.float32(s1) * np.float32(s2)) / np.float32(s_out))
    multiplier, shift = quantize_multiplier(real_multiplier)
    act_min, act_max = activation_range(view.options.get("fusedActivationFunction", 0), view.output())

    def kernel(x1, x2):
        return mul(x1, x2, -z1, -z2, multiplier, shift, z_out, act_min, act_max, MUL_ROUNDING)

    return binary_step(view, kernel, dtype)


def prepare_div(view: OpView) -> Step:
    """8-bit DIV. Its Eval first fails on a divisor value of 0, a byte equal to the divisor's zero point
    (CheckNonZero): at load for a constant divisor, at invoke otherwise."""
    dtype = _same_types(view)
    (_, s1, z1), (_, s2, z2) = per_tensor(view.input(0), "input1"), per_tensor(view.input(1), "input2")
    _, s_out, z_out = per_tensor(view.output(), "output")
    # input1_scale / (input2_scale * output_scale): float arithmetic in C++, then widened to double
    real_multiplier = float(np.float32(s1) / np.float32(np.float32(s2) * np.float32(s_out)))
    multiplier, shift = quantize_multiplier(real_multiplier)
    act_min, act_max = activation_range(view.options.get("fusedActivationFunction", 0), view.output())
    divisor = view.input(1).data
    if divisor is not None and (divisor.astype(np.int64) == z2).any():
        raise Unsupported("the constant divisor holds a 0 (its zero point): TFLite's DIV fails every invoke")

    def kernel(x1, x2):
        return div(x1, x2, -z1, -z2, multiplier, shift, z_out, act_min, act_max, DIV_ROUNDING)

    step = binary_step(view, kernel, dtype)
    if divisor is not None:
        return step
    zero = np.asarray(z2).astype(dtype)

    def run(*arrays):
        if (np.asarray(arrays[-1]) == zero).any():
            raise InvokeFailed("DIV: Division by 0 (a divisor byte at its zero point, as TFLite's CheckNonZero "
                               "reads it)")
        return step.run(*arrays)

    return Step(step.operator, run, step.inputs, step.outputs, step.details, step.resized)


def _prepare_extremum(view: OpView, kernel) -> Step:
    """TFLite compares the raw quantized values: scales are not reconciled, so neither are they here."""
    dtype = _same_types(view)
    return binary_step(view, kernel, dtype)


def prepare_maximum(view: OpView) -> Step:
    return _prepare_extremum(view, maximum)


def prepare_minimum(view: OpView) -> Step:
    return _prepare_extremum(view, minimum)


PREPARE = {
    "ADD": prepare_add,
    "SUB": prepare_sub,
    "MUL": prepare_mul,
    "DIV": prepare_div,
    "MAXIMUM": prepare_maximum,
    "MINIMUM": prepare_minimum,
}
