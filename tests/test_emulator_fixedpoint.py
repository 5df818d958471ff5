"""The fixed-point helpers against plain Python integers with C semantics, edge cases named."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.emulator.fixedpoint import (
    INT32_MAX,
    INT32_MIN,
    Rounding,
    exp_on_negative_values,
    get_reciprocal,
    multiply_by_quantized_multiplier,
    quantize_multiplier,
    round_half_away,
    round_in_double,
    rounding_divide_by_pot,
    saturating_rounding_doubling_high_mul,
    tflite_round,
)

int32s = st.integers(INT32_MIN, INT32_MAX)
FIXED = settings(max_examples=300, derandomize=True, deadline=None)


def c_divide(a: int, b: int) -> int:
    """C's / on integers: truncation toward zero."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def srdhm(a: int, b: int) -> int:
    if a == b == INT32_MIN:
        return INT32_MAX
    ab = a * b
    nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
    return c_divide(ab + nudge, 1 << 31)


def rdbpot(x: int, exponent: int) -> int:
    mask = (1 << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if remainder > threshold else 0)


def test_srdhm_saturates_only_int32_min_squared():
    assert saturating_rounding_doubling_high_mul(INT32_MIN, INT32_MIN) == INT32_MAX
    assert saturating_rounding_doubling_high_mul(INT32_MIN, INT32_MAX) == srdhm(INT32_MIN, INT32_MAX) == -INT32_MAX


def test_srdhm_rounds_ties_up_and_truncates_toward_zero():
    # 3 * 2^30 / 2^31 = 1.5 -> 2; -1.5 -> -1 (toward +inf, the nudge then C truncation)
    assert saturating_rounding_doubling_high_mul(3, 1 << 30) == 2
    assert saturating_rounding_doubling_high_mul(-3, 1 << 30) == -1
    assert saturating_rounding_doubling_high_mul(-5, 1 << 30) == -2  # -2.5 -> -2


def test_rounding_divide_by_pot_ties_go_away_from_zero_for_negatives():
    values = np.array([-6, -5, -3, -2, 2, 3, 5, 6])
    assert rounding_divide_by_pot(values, 2).tolist() == [-2, -1, -1, -1, 1, 1, 1, 2]  # -1.5 -> -2, 1.5 -> 2
    assert rounding_divide_by_pot(-1, 1) == -1 and rounding_divide_by_pot(1, 1) == 1  # -0.5 -> -1, 0.5 -> 1
    assert rounding_divide_by_pot(values, 0).tolist() == values.tolist()


@FIXED
@given(int32s, int32s)
def test_srdhm_matches_c(a, b):
    assert int(saturating_rounding_doubling_high_mul(a, b)) == srdhm(a, b)


@FIXED
@given(int32s, st.integers(0, 31))
def test_rounding_divide_by_pot_matches_c(x, exponent):
    assert int(rounding_divide_by_pot(x, exponent)) == rdbpot(x, exponent)


@FIXED
@given(st.integers(-(2**24), 2**24), st.integers(1 << 30, INT32_MAX), st.integers(-31, 7))
def test_multiply_by_quantized_multiplier_both_modes(x, multiplier, shift):
    left, right = max(shift, 0), max(-shift, 0)
    shifted = ((x << left) - INT32_MIN) % 2**32 + INT32_MIN  # x * (1 << left_shift) in int32, wrapping
    double = rdbpot(srdhm(shifted, multiplier), right)
    single = (x * multiplier + (1 << (30 - shift))) >> (31 - shift)
    assert int(multiply_by_quantized_multiplier(x, multiplier, shift, Rounding.DOUBLE_ROUNDING)) == double
    assert int(multiply_by_quantized_multiplier(x, multiplier, shift, Rounding.SINGLE_ROUNDING)) == single


def test_left_shift_wraps_like_int32():
    # 2^30 * 2 overflows int32 to INT32_MIN before the multiply, as the C++ does in practice
    assert int(multiply_by_quantized_multiplier(1 << 30, 1 << 30, 1, Rounding.DOUBLE_ROUNDING)) == srdhm(INT32_MIN,
                                                                                                           1 << 30)


@pytest.mark.parametrize("real", [1.0, 0.5, 0.75, 1e-3, 2.5e-7, 0.9999999999, 123.456, 2.0**-31, 2.0**-33])
def test_quantize_multiplier_reconstructs_the_real_value(real):
    multiplier, shift = quantize_multiplier(real)
    if real < 2.0**-32:
        assert (multiplier, shift) == (0, 0)  # flushed to zero, as TFLite does below 2^-31
        return
    assert 2**30 <= multiplier < 2**31
    assert math.isclose(multiplier * 2.0 ** (shift - 31), real, rel_tol=2**-30)


def test_quantize_multiplier_rounding_up_to_2_31_carries_into_the_shift():
    multiplier, shift = quantize_multiplier(1 - 2**-40)  # rounds to 2^31: halved, shift + 1
    assert (multiplier, shift) == (1 << 30, 1)


def test_tflite_round_is_half_away_from_zero():
    assert [tflite_round(v) for v in (0.5, 1.5, 2.5, -0.5, -1.5, -2.5)] == [1, 2, 3, -1, -2, -3]


def _std_round(v: float) -> float:
    """std::round in Python's exact arithmetic: the fraction of |v| compared with one half."""
    if not math.isfinite(v):
        return v
    whole = math.floor(abs(v))
    return math.copysign(whole + (1 if abs(v) - whole >= 0.5 else 0), v)


def test_round_half_away_is_std_round_on_every_float():
    """Where floor(|x| + 0.5) goes wrong: the largest float below 0.5 (its sum rounds up to 1), and floats so large
    that + 0.5 rounds; NaN and the infinities pass, -0.0 keeps its sign."""
    below_half32, below_half64 = np.nextafter(np.float32(0.5), np.float32(0)), np.nextafter(0.5, 0.0)
    for values in (np.array([below_half32, -below_half32, 2.5, -2.5, 2.0**23 + 1, -0.0, np.nan, np.inf, -np.inf],
                            np.float32),
                   np.array([below_half64, -below_half64, 0.5, -1.5, 2.0**52 + 1, 2.0**53 - 1, -0.0, np.inf])):
        got = round_half_away(values)
        want = np.array([_std_round(v) for v in values.tolist()], values.dtype)
        assert got.dtype == values.dtype
        assert got.tobytes() == want.tobytes(), (values, got, want)
    assert round_half_away(np.array([below_half32], np.float32))[0] == 0  # floor(|x| + 0.5) gave 1


def test_round_in_double_is_fully_connecteds_requantization():
    """static_cast<int32_t>(round(double(acc) * scale)): ties away from zero, and INT32_MIN beyond int32."""
    acc = np.array([-3, -1, 1, 3, 5, 2**30, -(2**30)])
    np.testing.assert_array_equal(round_in_double(acc, 0.5), [-2, -1, 1, 2, 3, 2**29, -(2**29)])
    np.testing.assert_array_equal(round_in_double(acc, 4.0)[-2:], [INT32_MIN, INT32_MIN])
    with pytest.raises(ValueError, match="IN_DOUBLE"):
        multiply_by_quantized_multiplier(acc, 1 << 30, 0, Rounding.IN_DOUBLE)


def test_exp_on_negative_values_is_exp_within_fixed_point_precision():
    x = -np.linspace(0, 31.9, 400)
    raw = np.round(x * 2**26).astype(np.int64)  # Q5.26
    result = exp_on_negative_values(raw, 5) / 2**31
    np.testing.assert_allclose(result, np.exp(raw / 2**26), atol=2e-9 * 64)
    assert exp_on_negative_values(0, 5) == INT32_MAX


def test_get_reciprocal_is_the_inverse_in_fixed_point():
    x = np.array([1 << 19, 3 << 19, 1000 << 19, (4095 << 19) + 12345])  # Q12.19 sums of exps
    raw, bits_over_unit = get_reciprocal(x, 12)
    reciprocal = raw / 2**31 / 2.0**bits_over_unit
    np.testing.assert_allclose(reciprocal, 2**19 / x, rtol=1e-8)
