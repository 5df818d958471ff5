"""Activations on int8/uint8: RELU, RELU6, RELU_N1_TO_1, LEAKY_RELU, PRELU, LOGISTIC, TANH, HARD_SWISH,
SOFTMAX, L2_NORMALIZATION; LEAKY_RELU on float32, which ai-edge-quantizer does not quantize (its int8
graphs keep it float between a DEQUANTIZE and a QUANTIZE), and LOGISTIC on float32 (float tails).

Element-wise ones are functions of one byte (two for PRELU) and run as tables built at load from
the kernels below (kernels/activations.cc with reference/*.h). LOGISTIC and TANH are tables in
TFLite too, built in float with the C library's expf/tanhf (app/emulator/libm.py). SOFTMAX (gemmlowp
fixed point in the reference kernel) and L2_NORMALIZATION depend on a whole row, so they run
vectorised over rows.
"""

from __future__ import annotations

import numpy as np

from app.emulator.errors import InvokeFailed, Unsupported
from app.emulator.fixedpoint import (
    Rounding,
    exp_on_negative_values,
    get_reciprocal,
    multiply_by_quantized_multiplier,
    multiply_by_quantized_multiplier_greater_than_one,
    multiply_by_quantized_multiplier_smaller_than_one_exp,
    quantize_multiplier,
    rescale,
    rounding_divide_by_pot,
    saturating_rounding_doubling_high_mul,
    saturating_rounding_multiply_by_pot,
)
from app.emulator.kernels.common import OpView, Step, per_tensor, type_range
from app.emulator.kernels.elementwise import binary_step
from app.emulator.kernels.quantize import ByteTable
from app.emulator.libm import expf, tanhf

# Measured on the pinned runtime (tests/test_emulator_activations.py).
RELU_ROUNDING = Rounding.DOUBLE_ROUNDING
L2_NORMALIZATION_ROUNDING = Rounding.DOUBLE_ROUNDING
SOFTMAX_ROUNDING = Rounding.DOUBLE_ROUNDING
f32 = np.float32


def _float_ratio(numerator: float, denominator: float) -> float:
    """A C++ `float / float` widened to double: the division happens in float."""
    return float(f32(numerator) / f32(denominator))


def _roundf(x) -> int:
    """roundf: float, half away from zero."""
    x = f32(x)
    return int(np.copysign(np.floor(np.abs(x) + f32(0.5)), x))


# ---- RELU family ----

def relu_x(input_data, input_offset: int, output_multiplier: int, output_shift: int, output_offset: int,
           quantized_activation_min: int, quantized_activation_max: int) -> np.ndarray:
    """reference_ops::ReluX (quantized): requantize to the output scale, then clamp to the activation range."""
    value = np.asarray(input_data, np.int64) - input_offset
    clamped = output_offset + multiply_by_quantized_multiplier(value, output_multiplier, output_shift,
                                                               RELU_ROUNDING)
    return np.clip(clamped, quantized_activation_min, quantized_activation_max)


def _prepare_relu(view: OpView, act_min: float, act_max: float | None) -> Step:
    input_dtype, input_scale, input_zero_point = per_tensor(view.input(0), "input")
    output_dtype, output_scale, output_zero_point = per_tensor(view.output(), "output")
    if input_dtype != output_dtype:
        raise Unsupported(f"input {view.input(0).type}, output {view.output().type}; expected the same type")
    low, high = type_range(output_dtype)
    multiplier, shift = quantize_multiplier(_float_ratio(input_scale, output_scale))
    quantized_min = max(low, output_zero_point + _roundf(f32(act_min) / f32(output_scale)))
    quantized_max = high if act_max is None else min(high, output_zero_point + _roundf(f32(act_max) / f32(output_scale)))
    table = ByteTable(lambda q: relu_x(q, input_zero_point, multiplier, shift, output_zero_point, quantized_min,
                                       quantized_max), input_dtype, output_dtype)
    return view.step(table, 0)


def prepare_relu(view: OpView) -> Step:
    return _prepare_relu(view, 0.0, None)


def prepare_relu6(view: OpView) -> Step:
    return _prepare_relu(view, 0.0, 6.0)


def prepare_relu_n1_to_1(view: OpView) -> Step:
    return _prepare_relu(view, -1.0, 1.0)


def quantize_leaky_relu(input_data, input_offset: int, output_offset: int, output_multiplier_identity: int,
                        output_shift_identity: int, output_multiplier_alpha: int, output_shift_alpha: int,
                        quantized_min: int, quantized_max: int) -> np.ndarray:
    """reference_ops::QuantizeLeakyRelu: one multiplier for x >= 0, another (with alpha) below."""
    value = np.asarray(input_data, np.int64) - input_offset
    identity = multiply_by_quantized_multiplier(value, output_multiplier_identity, output_shift_identity,
                                                RELU_ROUNDING)
    alpha = multiply_by_quantized_multiplier(value, output_multiplier_alpha, output_shift_alpha, RELU_ROUNDING)
    return np.clip(output_offset + np.where(value >= 0, identity, alpha), quantized_min, quantized_max)


def leaky_relu(input_data: np.ndarray, alpha: np.float32) -> np.ndarray:
    """optimized_ops::LeakyRelu (float; BUILTIN_REF runs it too): x where x > 0, else x * alpha, in float32."""
    return np.where(input_data > 0, input_data, input_data * alpha).astype(np.float32, copy=False)


def prepare_leaky_relu(view: OpView) -> Step:
    if view.input(0).type == "FLOAT32":  # ai-edge-quantizer leaves it float, between DEQUANTIZE and QUANTIZE
        if view.output().type != "FLOAT32":
            raise Unsupported(f"input FLOAT32, output {view.output().type}; expected the same type")
        alpha_f32 = f32(view.options.get("alpha", 0.0))
        return view.step(lambda x: leaky_relu(x, alpha_f32), 0)
    input_dtype, input_scale, input_zero_point = per_tensor(view.input(0), "input")
    output_dtype, output_scale, output_zero_point = per_tensor(view.output(), "output")
    if input_dtype != output_dtype:
        raise Unsupported(f"input {view.input(0).type}, output {view.output().type}; expected the same type")
    alpha = f32(view.options.get("alpha", 0.0))
    m_alpha, s_alpha = quantize_multiplier(float(f32(f32(input_scale) * alpha) / f32(output_scale)))
    m_identity, s_identity = quantize_multiplier(_float_ratio(input_scale, output_scale))
    low, high = type_range(output_dtype)
    table = ByteTable(lambda q: quantize_leaky_relu(q, input_zero_point, output_zero_point, m_identity, s_identity,
                                                    m_alpha, s_alpha, low, high), input_dtype, output_dtype)
    return view.step(table, 0)


def prelu(input_data, alpha_data, input_offset: int, alpha_offset: int, output_offset: int,
          output_multiplier_1: int, output_shift_1: int, output_multiplier_2: int, output_shift_2: int,
          quantized_min: int, quantized_max: int) -> np.ndarray:
    """reference_ops::BroadcastPrelu4DSlow: x rescaled where x >= 0, x * alpha rescaled below."""
    input_value = np.asarray(input_data, np.int64) + input_offset
    alpha_value = np.asarray(alpha_data, np.int64) + alpha_offset
    positive = multiply_by_quantized_multiplier(input_value, output_multiplier_1, output_shift_1, RELU_ROUNDING)
    negative = multiply_by_quantized_multiplier(input_value * alpha_value, output_multiplier_2, output_shift_2,
                                                RELU_ROUNDING)
    return np.clip(np.where(input_value >= 0, positive, negative) + output_offset, quantized_min, quantized_max)


def prepare_prelu(view: OpView) -> Step:
    input_dtype, input_scale, input_zero_point = per_tensor(view.input(0), "input")
    alpha_dtype, alpha_scale, alpha_zero_point = per_tensor(view.input(1), "alpha")
    output_dtype, output_scale, output_zero_point = per_tensor(view.output(), "output")
    if not input_dtype == alpha_dtype == output_dtype:
        raise Unsupported("input, alpha and output must have the same type")
    m1, s1 = quantize_multiplier(_float_ratio(input_scale, output_scale))
    m2, s2 = quantize_multiplier(float(f32(f32(input_scale) * f32(alpha_scale)) / f32(output_scale)))
    low, high = type_range(output_dtype)

    def kernel(x, alpha):
        return prelu(x, alpha, -input_zero_point, -alpha_zero_point, output_zero_point, m1, s1, m2, s2, low, high)

    return binary_step(view, kernel, output_dtype)


# ---- LOGISTIC, TANH: float tables, as TFLite builds them ----

def populate_lookup_table(input_scale: float, input_zero_point: int, output_scale: float, output_zero_point: int,
                          dtype: np.dtype, transform) -> ByteTable:
    """PopulateLookupTable: dequantize in float, transform, round(x / output_scale) + zero point, clamp."""
    low, high = type_range(dtype)
    values = np.arange(256, dtype=np.uint8).view(dtype)
    inverse_scale = f32(1) / f32(output_scale)
    dequantized = f32(input_scale) * (values.astype(np.int64) - input_zero_point).astype(f32)
    transformed = transform(dequantized.astype(f32))
    product = (transformed * inverse_scale).astype(f32)
    rescaled = np.copysign(np.floor(np.abs(product) + f32(0.5)), product).astype(f32)
    quantized = (rescaled + f32(output_zero_point)).astype(np.int64)
    table = ByteTable(lambda q: q, dtype, dtype)
    table.table = np.clip(quantized, low, high).astype(dtype)
    return table


def _logistic(x: np.ndarray) -> np.ndarray:
    return (f32(1) / (f32(1) + expf(-x))).astype(f32)


def _prepare_table_activation(view: OpView, transform, check_output: bool) -> Step:
    input_dtype, input_scale, input_zero_point = per_tensor(view.input(0), "input")
    output_dtype, output_scale, output_zero_point = per_tensor(view.output(), "output")
    if input_dtype != output_dtype:
        raise Unsupported(f"input {view.input(0).type}, output {view.output().type}; expected the same type")
    if check_output and output_scale != 1.0 / 256:
        raise Unsupported(f"output scale {output_scale}; TFLite requires 1/256")
    table = populate_lookup_table(input_scale, input_zero_point, output_scale, output_zero_point, input_dtype,
                                  transform)
    return view.step(table, 0)


LOGISTIC_CUTOFF_UPPER = f32(16.619047164916992188)  # reference_ops::Logistic's constants
LOGISTIC_CUTOFF_LOWER = f32(-9.0)


def logistic(input_data: np.ndarray) -> np.ndarray:
    """reference_ops::Logistic<float>: 1.0f above 16.619047f, expf(x) below -9, else 1.f / (1.f + expf(-x));
    NaN takes the last branch (both comparisons fail)."""
    x = np.asarray(input_data, f32)
    above, below = x > LOGISTIC_CUTOFF_UPPER, x < LOGISTIC_CUTOFF_LOWER
    with np.errstate(all="ignore"):
        result = f32(1) / (f32(1) + expf(-x))
        result = np.where(below, expf(x), result)
    return np.where(above, f32(1), result).astype(f32)


def prepare_logistic(view: OpView) -> Step:
    if view.input(0).type == "FLOAT32":  # a float tail's sigmoid (BUILTIN_REF runs the reference kernel)
        if view.output().type != "FLOAT32":
            raise Unsupported(f"input FLOAT32, output {view.output().type}; expected the same type")
        return view.step_binding(logistic, 0)
    return _prepare_table_activation(view, _logistic, check_output=True)


def prepare_tanh(view: OpView) -> Step:
    return _prepare_table_activation(view, tanhf, check_output=False)


# ---- HARD_SWISH: 16-bit fixed point ----

INT16_MIN, INT16_MAX = -(2**15), 2**15 - 1


def _wrap_int16(x: np.ndarray) -> np.ndarray:
    return ((np.asarray(x, np.int64) - INT16_MIN) & 0xFFFF) + INT16_MIN


def _srdhm_int16(a, b) -> np.ndarray:
    """gemmlowp SaturatingRoundingDoublingHighMul on int16."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    ab = a * b
    nudge = np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    total = ab + nudge
    high = np.where(total >= 0, total >> 15, -((-total) >> 15))
    return np.where((a == INT16_MIN) & (b == INT16_MIN), INT16_MAX, _wrap_int16(high))


def _saturating_doubling_high_mul_int16(a, b) -> np.ndarray:
    """SaturatingDoublingHighMul (hard_swish.h): truncating, no rounding nudge."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    ab = a * b
    high = np.where(ab >= 0, ab >> 15, -((-ab) >> 15))
    return np.where((a == INT16_MIN) & (b == INT16_MIN), INT16_MAX, _wrap_int16(high))


def _saturating_left_shift_int16(value, amount: int) -> np.ndarray:
    return np.clip(np.asarray(value, np.int64) * (1 << amount), INT16_MIN, INT16_MAX)


def _down_scale_int32_to_int16_multiplier(multiplier: int) -> int:
    """DownScaleInt32ToInt16Multiplier: round the Q0.31 multiplier to Q0.15."""
    if multiplier >= 2**31 - 1 - (1 << 15):
        return INT16_MAX
    return (multiplier + (1 << 15)) >> 16


def hard_swish(input_data, input_zero_point: int, output_zero_point: int, output_multiplier_fixedpoint_int16: int,
               output_multiplier_exponent: int, reluish_multiplier_fixedpoint_int16: int,
               reluish_multiplier_exponent: int, dtype: np.dtype) -> np.ndarray:
    """reference_ops::HardSwish (quantized): x * relu6(x + 3) / 6 in 16-bit fixed point."""
    input_value = _wrap_int16(np.asarray(input_data, np.int64) - input_zero_point)
    input_value_on_hires_input_scale = _wrap_int16(input_value * (1 << 7))
    input_value_on_preshift_output_scale = _srdhm_int16(input_value_on_hires_input_scale,
                                                        output_multiplier_fixedpoint_int16)
    reluish_value = input_value_on_hires_input_scale
    if reluish_multiplier_exponent > 0:
        reluish_value = _saturating_left_shift_int16(reluish_value, reluish_multiplier_exponent - 1)
    reluish_value = _srdhm_int16(reluish_value, reluish_multiplier_fixedpoint_int16)
    if reluish_multiplier_exponent > 0:
        reluish_value = _saturating_left_shift_int16(reluish_value, 1)
    if reluish_multiplier_exponent < 0:
        reluish_value = _wrap_int16(rounding_divide_by_pot(reluish_value, -reluish_multiplier_exponent))
    reluish_value = _wrap_int16((reluish_value + (1 << 15)) >> 1)
    preshift_output_value = _saturating_doubling_high_mul_int16(reluish_value, input_value_on_preshift_output_scale)
    output_value = _wrap_int16(rounding_divide_by_pot(preshift_output_value, -output_multiplier_exponent))
    output_value = _wrap_int16(output_value + output_zero_point)
    low, high = type_range(dtype)
    return np.clip(output_value, low, high)


def prepare_hard_swish(view: OpView) -> Step:
    input_dtype, input_scale, input_zero_point = per_tensor(view.input(0), "input")
    output_dtype, output_scale, output_zero_point = per_tensor(view.output(), "output")
    if input_dtype != output_dtype:
        raise Unsupported(f"input {view.input(0).type}, output {view.output().type}; expected the same type")
    hires_input_scale = f32(1.0 / 128.0) * f32(input_scale)
    reluish_scale = f32(3.0) / f32(32768.0)
    output_multiplier, output_exponent = quantize_multiplier(float(hires_input_scale / f32(output_scale)))
    if output_exponent > 0:
        raise Unsupported("the output multiplier exponent must be <= 0 (TFLite's HardSwishPrepare check)")
    reluish_multiplier, reluish_exponent = quantize_multiplier(float(hires_input_scale / reluish_scale))
    output_int16 = _down_scale_int32_to_int16_multiplier(output_multiplier)
    reluish_int16 = _down_scale_int32_to_int16_multiplier(reluish_multiplier)
    table = ByteTable(lambda q: hard_swish(q, input_zero_point, output_zero_point, output_int16, output_exponent,
                                           reluish_int16, reluish_exponent, input_dtype), input_dtype, output_dtype)
    return view.step(table, 0)


# ---- SOFTMAX: gemmlowp fixed point, per row ----

SOFTMAX_SCALED_DIFF_INTEGER_BITS = 5
SOFTMAX_ACCUMULATION_INTEGER_BITS = 12


def preprocess_softmax_scaling(beta: float, input_scale: float, input_integer_bits: int) -> tuple[int, int]:
    """PreprocessSoftmaxScaling: beta * input_scale in Q(input_integer_bits), capped, as multiplier and left shift."""
    real = min(float(beta) * float(input_scale) * (1 << (31 - input_integer_bits)), (1 << 31) - 1.0)
    return quantize_multiplier(real)


def calculate_input_radius(input_integer_bits: int, input_left_shift: int, total_signed_bits: int = 31) -> int:
    """CalculateInputRadius: the largest input difference that still matters after rescaling."""
    rescaled = 1.0 * ((1 << input_integer_bits) - 1) * (1 << (total_signed_bits - input_integer_bits)) / (
        1 << input_left_shift)
    return int(np.floor(rescaled))


def softmax(input_data: np.ndarray, input_beta_multiplier: int, input_beta_left_shift: int, diff_min: int,
            output_dtype: np.dtype) -> np.ndarray:
    """reference_ops::Softmax (quantized): exp of the differences to the row maximum in Q5.26, summed in
    Q12.19, divided through GetReciprocal, over the last axis."""
    values = np.asarray(input_data, np.int64)
    input_diff = values - values.max(axis=-1, keepdims=True)
    used = input_diff >= diff_min
    rescaled = multiply_by_quantized_multiplier_greater_than_one(input_diff, input_beta_multiplier,
                                                                 input_beta_left_shift, SOFTMAX_ROUNDING)
    exp_in_0 = exp_on_negative_values(rescaled, SOFTMAX_SCALED_DIFF_INTEGER_BITS)
    terms = np.where(used, rescale(exp_in_0, 0, SOFTMAX_ACCUMULATION_INTEGER_BITS), 0)
    sum_of_exps = terms.sum(axis=-1, keepdims=True)
    shifted_scale, num_bits_over_unit = get_reciprocal(sum_of_exps, SOFTMAX_ACCUMULATION_INTEGER_BITS)
    bits = 8
    unsat_output = rounding_divide_by_pot(saturating_rounding_doubling_high_mul(shifted_scale, exp_in_0),
                                          num_bits_over_unit + 31 - bits)
    low, high = type_range(output_dtype)
    shifted_output = np.clip(unsat_output + low, low, high)
    return np.where(used, shifted_output, low).astype(output_dtype)


# Rows at least this long are answered from a table of each row's 256 outputs (one per difference to its maximum)
# rather than element by element: the table's work is 256 per row, the elements' their length.
ROW_TABLE_MIN_LENGTH = 256
# gemmlowp's RoundingDivideByPOT asserts its exponent <= 31: the reference kernel aborts the process on a row whose
# exponentials sum to 512 or more (num_bits_over_unit + 31 - 8 > 31), e.g. 512 equal values (measured).
MAX_EXPONENT = 31


class SoftmaxTables:
    """softmax() with its per-element fixed point read from tables: for 8-bit inputs the difference to the row's
    maximum takes one of 256 values, so exp_on_negative_values of it and its term in the sum are computed once
    per difference at load (exact: the same function of the same integer). Per element the run is then a
    look-up, the row sums, GetReciprocal per row, and the output in one integer step: the kernel's
    RoundingDivideByPOT(SaturatingRoundingDoublingHighMul(scale, exp), e) of two non-negative values a and b is
    floor(floor((a b + 2^30) / 2^31) / 2^e + 1/2) = (a b + 2^30 + 2^(30 + e)) >> (31 + e) (nested floors of
    divisions by positive integers combine; a b < 2^62 and e <= 31 keep it in int64). An unused difference
    (below diff_min) has exponential 0 in the table, which gives the type's lowest value, as the kernel writes.
    Long rows (an attention's, 400 cells at 640) take that step once per row and difference, then a gather.
    The DFL softmax of a YOLO head runs it on 2100 x 4 rows of 16 at 320x320."""

    def __init__(self, input_beta_multiplier: int, input_beta_left_shift: int, diff_min: int,
                 output_dtype: np.dtype):
        diffs = np.arange(-255, 1, dtype=np.int64)  # x - max(row) for 8-bit values
        rescaled = multiply_by_quantized_multiplier_greater_than_one(diffs, input_beta_multiplier,
                                                                     input_beta_left_shift, SOFTMAX_ROUNDING)
        exp_in_0 = exp_on_negative_values(rescaled, SOFTMAX_SCALED_DIFF_INTEGER_BITS)
        used = diffs >= diff_min
        # Q12.19 terms, at most 2^19: int32 halves the gather, the row sums run in int64
        self.terms = np.where(used, rescale(exp_in_0, 0, SOFTMAX_ACCUMULATION_INTEGER_BITS), 0).astype(np.int32)
        self.exponentials = np.where(used, exp_in_0, 0)  # Q0.31, non-negative
        if (self.exponentials < 0).any():
            raise AssertionError("exp_on_negative_values gave a negative value")
        self.output_dtype = output_dtype
        self.low, self.high = type_range(output_dtype)

    def __call__(self, input_data: np.ndarray) -> np.ndarray:
        values = np.asarray(input_data, np.int16)
        index = values - values.max(axis=-1, keepdims=True) + 255  # into the tables: diff + 255
        sum_of_exps = self.terms.take(index).sum(axis=-1, keepdims=True, dtype=np.int64)
        shifted_scale, num_bits_over_unit = get_reciprocal(sum_of_exps, SOFTMAX_ACCUMULATION_INTEGER_BITS)
        exponent = num_bits_over_unit + 31 - 8
        if (exponent > MAX_EXPONENT).any():
            raise InvokeFailed("SOFTMAX: a row's exponentials sum to 512 or more, where TFLite's reference kernel "
                               "aborts (gemmlowp's RoundingDivideByPOT asserts an exponent <= 31); the cpu backend "
                               "runs TFLite's optimized kernels")
        if values.shape[-1] < ROW_TABLE_MIN_LENGTH:
            return self._outputs(shifted_scale, exponent, self.exponentials.take(index))
        table = self._outputs(shifted_scale, exponent, self.exponentials)  # [rows..., 256]
        rows = table.reshape(-1, table.shape[-1])
        offsets = np.arange(0, rows.size, rows.shape[1], dtype=np.intp).reshape(index.shape[:-1] + (1,))
        return rows.reshape(-1).take(index + offsets)

    def _outputs(self, shifted_scale: np.ndarray, exponent: np.ndarray, exponentials: np.ndarray) -> np.ndarray:
        """RoundingDivideByPOT(SRDHM(shifted_scale, exp_in_0), exponent) + low, clamped: in one shift (see above)."""
        if (shifted_scale < 0).any():  # GetReciprocal's 1 / (1 + x) is in (1/2, 1]: never, but then the definition
            return self._definition(shifted_scale, exponent, exponentials)
        unsat_output = (shifted_scale * exponentials + ((1 << 30) + (np.int64(1) << (30 + exponent)))) >> (
            31 + exponent)
        return (np.minimum(unsat_output, self.high - self.low) + self.low).astype(self.output_dtype)

    def _definition(self, shifted_scale: np.ndarray, exponent: np.ndarray, exponentials: np.ndarray) -> np.ndarray:
        unsat_output = rounding_divide_by_pot(saturating_rounding_doubling_high_mul(shifted_scale, exponentials),
                                              exponent)
        return np.clip(unsat_output + self.low, self.low, self.high).astype(self.output_dtype)


def prepare_softmax(view: OpView) -> Step:
    input_dtype, input_scale, _ = per_tensor(view.input(0), "input")
    output_dtype, _, _ = per_tensor(view.output(), "output")
    if input_dtype != output_dtype:
        raise Unsupported(f"input {view.input(0).type}, output {view.output().type}; expected the same type")
    beta = float(f32(view.options.get("beta", 1.0)))
    multiplier, left_shift = preprocess_softmax_scaling(beta, float(f32(input_scale)),
                                                        SOFTMAX_SCALED_DIFF_INTEGER_BITS)
    diff_min = -calculate_input_radius(SOFTMAX_SCALED_DIFF_INTEGER_BITS, left_shift)
    return view.step(SoftmaxTables(multiplier, left_shift, diff_min, output_dtype), 0)


# ---- L2_NORMALIZATION: Newton-Raphson inverse square root in gemmlowp fixed point ----

def get_inv_sqrt_quantized_multiplier_exp(value: np.ndarray, reverse_shift: int) -> tuple[np.ndarray, np.ndarray]:
    """GetInvSqrtQuantizedMultiplierExp (common.h), vectorised over rows: 1/sqrt(value) as multiplier and shift."""
    value = np.asarray(value, np.int64).copy()
    small = value <= 1
    value = np.where(small, 2, value)
    shift = np.full(value.shape, 11, np.int64)
    while (big := value >= (1 << 29)).any():
        value = np.where(big, value // 4, value)
        shift = shift + big
    # CountLeadingZeros of a 32-bit value: value < 2^29 here, so frexp's exponent is its bit length
    leading_zeros = 32 - np.frexp(value.astype(np.float64))[1].astype(np.int64)
    left_shift_bit_pairs = (leading_zeros - 1) // 2 - 1
    shift = shift - left_shift_bit_pairs
    value = value << (2 * left_shift_bit_pairs)
    fixedpoint_input = value >> 1  # F3
    fixedpoint_half_input = saturating_rounding_multiply_by_pot(fixedpoint_input, -1)
    fixedpoint_half_three = (1 << 28) + (1 << 27)
    x = np.full(value.shape, 1 << 28, np.int64)  # F3 one
    mul = saturating_rounding_doubling_high_mul
    for _ in range(5):
        x3 = saturating_rounding_multiply_by_pot(mul(mul(x, x), x), 6)  # F9 -> F3
        difference = mul(fixedpoint_half_three, x) - mul(fixedpoint_half_input, x3)  # F6
        x = saturating_rounding_multiply_by_pot(difference, 3)  # F6 -> F3
    x = mul(x, 1518500250)  # * sqrt(2)/2 in F0
    negative_shift = shift < 0
    x = np.where(negative_shift, x << np.where(negative_shift, -shift, 0), x)
    shift = np.where(negative_shift, 0, shift)
    x = np.where(small, 2**31 - 1, x)
    shift = np.where(small, 0, shift)
    return x, shift * reverse_shift


def l2_normalization(input_data: np.ndarray, input_zero_point: int, output_dtype: np.dtype) -> np.ndarray:
    """reference_integer_ops::L2Normalization (int8) and reference_ops::L2Normalization (uint8), over the last axis."""
    values = np.asarray(input_data, np.int64) - input_zero_point
    square = (values * values).sum(axis=-1, keepdims=True)
    multiplier, shift = get_inv_sqrt_quantized_multiplier_exp(square, -1)
    if output_dtype == np.int8:
        out = multiply_by_quantized_multiplier(values, multiplier, shift + 7, L2_NORMALIZATION_ROUNDING)
        return np.clip(out, -128, 127)
    rescaled = multiply_by_quantized_multiplier_smaller_than_one_exp(128 * values, multiplier, shift,
                                                                     L2_NORMALIZATION_ROUNDING)
    return np.clip(128 + rescaled, 0, 255)


def prepare_l2_normalization(view: OpView) -> Step:
    input_dtype, _, input_zero_point = per_tensor(view.input(0), "input")
    output_dtype, output_scale, output_zero_point = per_tensor(view.output(), "output")
    if input_dtype != output_dtype:
        raise Unsupported(f"input {view.input(0).type}, output {view.output().type}; expected the same type")
    expected_zero_point = 0 if output_dtype == np.int8 else 128
    if output_scale != 1.0 / 128 or output_zero_point != expected_zero_point:
        raise Unsupported(f"output quantization ({output_scale}, {output_zero_point}); TFLite requires "
                          f"(1/128, {expected_zero_point})")
    if view.options.get("fusedActivationFunction", 0) not in (0, "NONE"):
        raise Unsupported("a fused activation on L2_NORMALIZATION is not supported by TFLite")

    def run(x: np.ndarray) -> np.ndarray:
        return l2_normalization(x, input_zero_point, output_dtype).astype(output_dtype)

    return view.step(run, 0)


PREPARE = {
    "RELU": prepare_relu,
    "RELU6": prepare_relu6,
    "RELU_N1_TO_1": prepare_relu_n1_to_1,
    "LEAKY_RELU": prepare_leaky_relu,
    "PRELU": prepare_prelu,
    "LOGISTIC": prepare_logistic,
    "TANH": prepare_tanh,
    "HARD_SWISH": prepare_hard_swish,
    "SOFTMAX": prepare_softmax,
    "L2_NORMALIZATION": prepare_l2_normalization,
}
