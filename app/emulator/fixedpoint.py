"""TFLite's fixed-point arithmetic, exactly, as pure vectorised numpy with int64 intermediates.

These are the definitions the fast paths are checked against (tests/test_emulator_fixedpoint.py)
and what the load-time tables are computed with. C semantics are spelled out where they
differ from numpy's: integer division truncates toward zero (numpy `//` floors), `>>` on a
negative int is arithmetic, std::round rounds half away from zero (np.round: half to even).

Rounding mode. MultiplyByQuantizedMultiplier exists in two forms: DOUBLE_ROUNDING (gemmlowp's
SaturatingRoundingDoublingHighMul, then RoundingDivideByPOT) and SINGLE_ROUNDING (one 64-bit
product, one rounding shift, as TFLITE_SINGLE_ROUNDING builds have it). They differ by one on
some values. The pinned ai-edge-litert 2.3.0 is built with DOUBLE_ROUNDING: CONV_2D,
DEPTHWISE_CONV_2D, BATCH_MATMUL, MUL, QUANTIZE, RELU and MEAN round twice. Its reference
FULLY_CONNECTED does not call MultiplyByQuantizedMultiplier at all (LiteRT, April 2025: "do requant
in float"): IN_DOUBLE, std::round(double(acc) * effective_output_scale), the scale a double
quotient of the tensors' scales, half away from zero (tests/test_emulator_rounding.py keeps the
evidence of each). So every caller names its mode: there is no default.
"""

from __future__ import annotations

import math
from enum import Enum

import numpy as np

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


class Rounding(Enum):
    DOUBLE_ROUNDING = "double"   # SaturatingRoundingDoublingHighMul + RoundingDivideByPOT
    SINGLE_ROUNDING = "single"   # (x * m + 2^(s-1)) >> s, TFLITE_SINGLE_ROUNDING builds
    IN_DOUBLE = "in-double"      # static_cast<int32_t>(round(double(x) * effective_output_scale)): no multiplier


def tflite_round(x: float) -> int:
    """std::round / TfLiteRound: half away from zero."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def round_half_away(x: np.ndarray) -> np.ndarray:
    """std::round over an array (float in, float out, same type): half away from zero.

    Exact for every float: the fraction x - trunc(x) is computed without rounding, so neither the
    largest float below 0.5 (where floor(|x| + 0.5) would give 1) nor large values go astray.
    """
    x = np.asarray(x)
    whole = np.trunc(x)
    with np.errstate(invalid="ignore"):  # infinities: inf - inf is NaN, and NaN >= 0.5 is False: they stay
        away = np.abs(x - whole) >= x.dtype.type(0.5) if x.dtype.kind == "f" else np.zeros(x.shape, bool)
    return np.where(away, whole + np.copysign(x.dtype.type(1), x), whole) if away.any() else whole


def round_in_double(x, effective_output_scale) -> np.ndarray:
    """static_cast<int32_t>(round(static_cast<double>(x) * effective_output_scale)), as an int64 array.

    The reference FULLY_CONNECTED's requantization (Rounding.IN_DOUBLE): the int32 accumulator times a
    double, rounded half away from zero. A result outside int32 converts as x86-64's cvttsd2si does,
    to INT32_MIN (C++ leaves it undefined; the compiled runtime gives that).
    """
    scaled = round_half_away(np.asarray(x, np.int64).astype(np.float64) * np.asarray(effective_output_scale,
                                                                                        np.float64))
    return np.where(np.abs(scaled) < 2.0**31, scaled, INT32_MIN).astype(np.int64)


def quantize_multiplier(double_multiplier: float) -> tuple[int, int]:
    """QuantizeMultiplier (quantization_util.cc): real multiplier -> (Q0.31 multiplier, shift).

    real = quantized_multiplier * 2^(shift - 31), quantized_multiplier in [2^30, 2^31).
    """
    if double_multiplier == 0.0:
        return 0, 0
    q, shift = math.frexp(double_multiplier)
    q_fixed = tflite_round(q * (1 << 31))
    if q_fixed == 1 << 31:
        q_fixed //= 2
        shift += 1
    if shift < -31:  # every bit would be shifted out: TFLite flushes to zero
        return 0, 0
    return int(q_fixed), int(shift)


def c_divide(numerator, denominator) -> np.ndarray:
    """C integer division: truncates toward zero (numpy's // floors)."""
    numerator = np.asarray(numerator, dtype=np.int64)
    quotient = np.abs(numerator) // denominator
    return np.where(numerator < 0, -quotient, quotient)


def wrap_int32(x: np.ndarray) -> np.ndarray:
    """Two's complement wrap to int32, what C++ int32 arithmetic does on overflow in practice."""
    x = np.asarray(x, dtype=np.int64)
    return ((x - INT32_MIN) & 0xFFFFFFFF) + INT32_MIN


def saturating_rounding_doubling_high_mul(a, b) -> np.ndarray:
    """gemmlowp SaturatingRoundingDoublingHighMul: (a*b*2 + 2^31) / 2^32 in Q0.31, ties toward +inf.

    The only overflow, INT32_MIN * INT32_MIN, saturates to INT32_MAX. The nudge is 2^30 for a
    non-negative product and 1 - 2^30 otherwise, then the division by 2^31 truncates toward zero.
    """
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    ab = a * b
    negative = ab >> 63  # -1 where ab < 0, else 0
    total = ab + (1 << 30) + negative * ((1 << 31) - 1)  # nudge: 2^30, or 1 - 2^30 when negative
    high = (total + (negative & ((1 << 31) - 1))) >> 31  # truncating division: bias negatives up first
    overflow = (a == INT32_MIN) & (b == INT32_MIN)
    return np.where(overflow, INT32_MAX, high) if overflow.any() else high


def rounding_divide_by_pot(x, exponent) -> np.ndarray:
    """gemmlowp RoundingDivideByPOT: x / 2^exponent, ties away from zero."""
    x = np.asarray(x, dtype=np.int64)
    exponent = np.asarray(exponent, dtype=np.int64)
    mask = (np.int64(1) << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def multiply_by_quantized_multiplier(x, quantized_multiplier, shift, rounding: Rounding) -> np.ndarray:
    """MultiplyByQuantizedMultiplier (common.h): x * quantized_multiplier * 2^(shift - 31), rounded.

    DOUBLE_ROUNDING: RoundingDivideByPOT(SRDHM(x * 2^left_shift, m), right_shift), the left
    shift in wrapping int32 arithmetic as in C++. SINGLE_ROUNDING: (x * m + 2^(30 - shift)) >> (31 - shift).
    """
    if rounding is Rounding.IN_DOUBLE:
        raise ValueError("Rounding.IN_DOUBLE takes the effective scale, not a multiplier: use round_in_double")
    x = np.asarray(x, dtype=np.int64)
    quantized_multiplier = np.asarray(quantized_multiplier, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    if rounding is Rounding.SINGLE_ROUNDING:
        total_shift = 31 - shift
        return (x * quantized_multiplier + (np.int64(1) << (total_shift - 1))) >> total_shift
    left_shift = np.maximum(shift, 0)
    right_shift = np.maximum(-shift, 0)
    return rounding_divide_by_pot(
        saturating_rounding_doubling_high_mul(wrap_int32(x << left_shift), quantized_multiplier), right_shift)


def multiply_by_quantized_multiplier_smaller_than_one_exp(x, quantized_multiplier, left_shift,
                                                          rounding: Rounding) -> np.ndarray:
    """MultiplyByQuantizedMultiplierSmallerThanOneExp: the elementwise ops' rescale (left_shift <= 0)."""
    if rounding is Rounding.SINGLE_ROUNDING:
        return multiply_by_quantized_multiplier(x, quantized_multiplier, left_shift, rounding)
    return rounding_divide_by_pot(saturating_rounding_doubling_high_mul(x, quantized_multiplier),
                                  -np.asarray(left_shift, dtype=np.int64))


def multiply_by_quantized_multiplier_greater_than_one(x, quantized_multiplier, left_shift,
                                                      rounding: Rounding) -> np.ndarray:
    """MultiplyByQuantizedMultiplierGreaterThanOne: SRDHM(x * 2^left_shift, m)."""
    if rounding is Rounding.SINGLE_ROUNDING:
        return multiply_by_quantized_multiplier(x, quantized_multiplier, left_shift, rounding)
    x = np.asarray(x, dtype=np.int64)
    return saturating_rounding_doubling_high_mul(wrap_int32(x << np.asarray(left_shift, np.int64)),
                                                 quantized_multiplier)


# ---- gemmlowp FixedPoint<int32, I>: raw int32 values with I integer bits (softmax, L2 norm) ----

def saturating_rounding_multiply_by_pot(x, exponent: int) -> np.ndarray:
    """gemmlowp SaturatingRoundingMultiplyByPOT: x * 2^exponent, saturating up, rounding down."""
    x = np.asarray(x, dtype=np.int64)
    if exponent <= 0:
        return rounding_divide_by_pot(x, -exponent)
    threshold = (1 << (31 - exponent)) - 1
    result = np.where(x > threshold, INT32_MAX, x << exponent)
    return np.where(x < -threshold, INT32_MIN, result)


def rescale(x, integer_bits_from: int, integer_bits_to: int) -> np.ndarray:
    """gemmlowp Rescale<to>(FixedPoint<from>): a saturating, rounding power-of-two multiply."""
    return saturating_rounding_multiply_by_pot(x, integer_bits_from - integer_bits_to)


def rounding_half_sum(a, b) -> np.ndarray:
    """gemmlowp RoundingHalfSum on int32: (a + b +- 1) / 2 in C."""
    total = np.asarray(a, np.int64) + np.asarray(b, np.int64)
    biased = total + np.where(total >= 0, 1, -1)
    return np.where(biased >= 0, biased >> 1, -((-biased) >> 1))


def _fixed_mul(a, b) -> np.ndarray:
    """FixedPoint<I1> * FixedPoint<I2> -> FixedPoint<I1 + I2>: the raw product is SRDHM."""
    return saturating_rounding_doubling_high_mul(a, b)


def exp_on_interval_between_negative_one_quarter_and_0_excl(a) -> np.ndarray:
    """gemmlowp: exp(a) for a in [-1/4, 0) in Q0.31, a Taylor expansion around -1/8."""
    constant_term = 1895147668        # exp(-1/8)
    constant_1_over_3 = 715827883
    x = np.asarray(a, np.int64) + (1 << 28)  # a + 1/8
    x2 = _fixed_mul(x, x)
    x3 = _fixed_mul(x2, x)
    x4 = _fixed_mul(x2, x2)
    x4_over_4 = saturating_rounding_multiply_by_pot(x4, -2)
    poly = saturating_rounding_multiply_by_pot(_fixed_mul(x4_over_4 + x3, constant_1_over_3) + x2, -1)
    return constant_term + _fixed_mul(constant_term, x + poly)


_EXP_BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308), (2, 39332535), (3, 720401),
               (4, 242))  # exp(-2^k) in Q0.31


def exp_on_negative_values(a, integer_bits: int) -> np.ndarray:
    """gemmlowp exp_on_negative_values: FixedPoint<integer_bits> a <= 0 -> exp(a) in Q0.31."""
    a = np.asarray(a, np.int64)
    fractional_bits = 31 - integer_bits
    one_quarter = 1 << (fractional_bits - 2)
    a_mod_quarter_minus_one_quarter = (a & (one_quarter - 1)) - one_quarter
    result = exp_on_interval_between_negative_one_quarter_and_0_excl(
        rescale(a_mod_quarter_minus_one_quarter, integer_bits, 0))
    remainder = a_mod_quarter_minus_one_quarter - a
    for exponent, multiplier in _EXP_BARREL:
        if integer_bits > exponent:
            bit = (remainder >> (fractional_bits + exponent)) & 1
            result = np.where(bit != 0, _fixed_mul(result, multiplier), result)
    if integer_bits > 5:
        result = np.where(a < -(1 << (36 - integer_bits)), 0, result)
    return np.where(a == 0, INT32_MAX, result)


def one_over_one_plus_x_for_x_in_0_1(a) -> np.ndarray:
    """gemmlowp: 1 / (1 + a) for a in [0, 1) in Q0.31, three Newton-Raphson steps in Q2.29."""
    half_denominator = rounding_half_sum(a, INT32_MAX)
    constant_48_over_17 = 1515870810
    constant_neg_32_over_17 = -1010580540
    x = constant_48_over_17 + _fixed_mul(half_denominator, constant_neg_32_over_17)
    one_q2 = 1 << 29
    for _ in range(3):
        half_denominator_times_x = _fixed_mul(half_denominator, x)
        one_minus_half_denominator_times_x = one_q2 - half_denominator_times_x
        x = x + rescale(_fixed_mul(x, one_minus_half_denominator_times_x), 4, 2)
    return rescale(x, 1, 0)  # ExactMulByPot<-1> reinterprets Q2 as Q1, then Rescale<0>


def count_leading_zeros_32(x) -> np.ndarray:
    x = np.asarray(x, np.int64) & 0xFFFFFFFF
    bits = np.where(x > 0, np.frexp(x.astype(np.float64))[1], 0)  # exact: x < 2^32 fits a double
    return 32 - bits


def get_reciprocal(x, x_integer_digits: int) -> tuple[np.ndarray, np.ndarray]:
    """GetReciprocal (common.h): 1/x for a positive FixedPoint<x_integer_digits> as (Q0.31 raw, num_bits_over_unit)."""
    x = np.asarray(x, np.int64)
    headroom_plus_one = count_leading_zeros_32(x)
    num_bits_over_unit = x_integer_digits - headroom_plus_one
    shifted = ((x << headroom_plus_one) & 0xFFFFFFFF) - (1 << 31)
    shifted_sum_minus_one = wrap_int32(shifted)
    return one_over_one_plus_x_for_x_in_0_1(shifted_sum_minus_one), num_bits_over_unit
