"""The fast requantizer equals the int64 definition on every accumulator of its range."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from app.emulator.fixedpoint import Rounding, quantize_multiplier
from app.emulator.requantize import FLOAT32_EXACT_INTEGERS, Requantizer, RequantParams, requantize_exact

SETTINGS = settings(max_examples=150, derandomize=True, deadline=None)


@st.composite
def layers(draw):
    channels = draw(st.integers(1, 6))
    dtype = np.dtype(draw(st.sampled_from([np.int8, np.uint8])))
    info = np.iinfo(dtype)
    # a few multipliers are powers of two (scales like 1/256), where IN_DOUBLE's results fall on exact halves
    reals = [2.0 ** -draw(st.integers(1, 12)) if draw(st.booleans()) and draw(st.booleans())
             else np.exp(draw(st.floats(np.log(1e-7), np.log(4.0)))) for _ in range(channels)]
    pairs = [quantize_multiplier(r) for r in reals]
    low = draw(st.integers(int(info.min), int(info.max)))
    high = draw(st.integers(low, int(info.max)))
    bound_bits = draw(st.integers(4, 30))
    bound = np.array([draw(st.integers(1, 2**bound_bits)) for _ in range(channels)], np.int64)
    params = RequantParams(
        bias=np.array([draw(st.integers(-(2**20), 2**20)) for _ in range(channels)], np.int64),
        output_multiplier=np.array([p[0] for p in pairs], np.int64),
        output_shift=np.array([p[1] for p in pairs], np.int64),
        output_offset=draw(st.integers(int(info.min), int(info.max))),
        quantized_activation_min=low, quantized_activation_max=high, output_dtype=dtype,
        rounding=draw(st.sampled_from(list(Rounding))), effective_output_scale=np.array(reals))
    acc_dtype = np.float32 if bound.max() < FLOAT32_EXACT_INTEGERS else np.float64
    return params, bound, np.dtype(acc_dtype), draw(st.integers(0, 2**32 - 1))


def _accumulators(bound: np.ndarray, seed: int, rows: int = 2000) -> np.ndarray:
    """Random values in the range, its ends, and every integer near zero (where the sign matters)."""
    rng = np.random.default_rng(seed)
    acc = rng.integers(-bound, bound + 1, size=(rows, bound.size))
    acc[0], acc[1] = -bound, bound
    near = np.clip(np.arange(-300, 301)[:, None], -bound, bound)
    return np.concatenate([acc, near])


@SETTINGS
@given(layers())
def test_fast_path_equals_the_definition(layer):
    params, bound, acc_dtype, seed = layer
    requantize = Requantizer(params, bound, acc_dtype)
    acc = _accumulators(bound, seed)
    expected = requantize_exact(acc, params).astype(params.output_dtype)
    got = requantize(acc.astype(acc_dtype))
    assert got.dtype == params.output_dtype
    np.testing.assert_array_equal(got, expected)


@SETTINGS
@given(layers())
def test_exact_around_every_step(layer):
    """Right below and at each output step: where a wrong rounding would show first."""
    params, bound, acc_dtype, _ = layer
    requantize = Requantizer(params, bound, acc_dtype)
    steps = requantize._steps()  # noqa: SLF001 (the proof's own points, checked independently here)
    points = np.clip(np.concatenate([steps - 1, steps, steps + 1], axis=1), -bound[:, None], bound[:, None]).T
    np.testing.assert_array_equal(requantize(points.astype(acc_dtype)),
                                  requantize_exact(points, params).astype(params.output_dtype))


def _typical_layer(rounding: Rounding, low: int) -> RequantParams:
    """A 1x1 convolution of EfficientNet-Lite0's size: 96 channels, multipliers around 2^-8."""
    rng = np.random.default_rng(3)
    pairs = [quantize_multiplier(m) for m in rng.uniform(1e-3, 8e-3, 96)]
    return RequantParams(bias=rng.integers(-5000, 5000, 96), output_multiplier=np.array([p[0] for p in pairs]),
                         output_shift=np.array([p[1] for p in pairs]), output_offset=-12,
                         quantized_activation_min=low, quantized_activation_max=127, output_dtype=np.dtype(np.int8),
                         rounding=rounding)


def test_typical_layers_take_a_float_path():
    bound = np.full(96, 16 * 127 * 128)
    assert Requantizer(_typical_layer(Rounding.SINGLE_ROUNDING, -128), bound, np.dtype(np.float32)).strategy.startswith(
        "float")
    relu = Requantizer(_typical_layer(Rounding.DOUBLE_ROUNDING, -12), bound, np.dtype(np.float32))
    assert relu.strategy.endswith("linear")  # below the zero point everything clamps: no sign term needed
    signed = Requantizer(_typical_layer(Rounding.DOUBLE_ROUNDING, -128), bound, np.dtype(np.float32))
    assert signed.strategy.endswith("signed")


def test_a_range_beyond_float64_keeps_the_int64_definition():
    params = _typical_layer(Rounding.SINGLE_ROUNDING, -128)
    huge = np.full(96, 2**60)
    requantize = Requantizer(params, huge, np.dtype(np.float64))
    assert requantize.strategy == "int64"
    acc = np.array([[2**59] * 96, [-(2**59)] * 96, [7] * 96])
    np.testing.assert_array_equal(requantize(acc), requantize_exact(acc, params).astype(np.int8))


def test_the_proof_refuses_an_evaluation_that_is_off():
    """The load-time check must reject a float evaluation that is wrong somewhere in the range."""
    params = _typical_layer(Rounding.SINGLE_ROUNDING, -128)
    bound = np.full(96, 16 * 127 * 128)
    requantize = Requantizer(params, bound, np.dtype(np.float32))
    good = requantize.evaluation
    points, exact = requantize._proof_points()  # noqa: SLF001
    assert requantize._agrees(good, points, exact)  # noqa: SLF001
    from dataclasses import replace

    off = replace(good, constant=(good.constant + good.float_type(1e-3)).astype(good.float_type))
    assert not requantize._agrees(off, points, exact)  # noqa: SLF001


def test_most_layers_get_the_fast_path():
    rng = np.random.default_rng(11)
    strategies = []
    for _ in range(100):
        channels = int(rng.integers(1, 64))
        pairs = [quantize_multiplier(m) for m in np.exp(rng.uniform(np.log(1e-5), np.log(0.1), channels))]
        params = RequantParams(bias=rng.integers(-(2**16), 2**16, channels),
                               output_multiplier=np.array([p[0] for p in pairs]),
                               output_shift=np.array([p[1] for p in pairs]), output_offset=int(rng.integers(-128, 128)),
                               quantized_activation_min=-128, quantized_activation_max=127,
                               output_dtype=np.dtype(np.int8), rounding=Rounding(rng.choice(["single", "double"])))
        bound = rng.integers(2**10, 2**23, channels)
        strategies.append(Requantizer(params, bound, np.dtype(np.float32)).strategy)
    assert strategies.count("int64") <= 5, strategies


def test_a_left_shift_that_can_wrap_keeps_the_int64_definition():
    """Multipliers above one shift acc left in int32 first (C++ wraps): not monotone, so no float path."""
    multiplier, shift = quantize_multiplier(8.5)
    params = RequantParams(bias=np.array([0]), output_multiplier=np.array([multiplier]),
                           output_shift=np.array([shift]), output_offset=0, quantized_activation_min=-128,
                           quantized_activation_max=127, output_dtype=np.dtype(np.int8),
                           rounding=Rounding.DOUBLE_ROUNDING)
    wrapping = Requantizer(params, np.array([2**29]), np.dtype(np.float64))
    assert wrapping.strategy == "int64"
    acc = np.array([[2**28 + 3], [-(2**28) - 5], [3], [-14]])
    np.testing.assert_array_equal(wrapping(acc.astype(np.float64)), requantize_exact(acc, params).astype(np.int8))
    assert Requantizer(params, np.array([1000]), np.dtype(np.float32)).strategy != "int64"


def _in_double_layer(reals: np.ndarray, low: int = -128) -> RequantParams:
    pairs = [quantize_multiplier(float(m)) for m in reals]
    return RequantParams(bias=np.random.default_rng(4).integers(-5000, 5000, reals.size),
                         output_multiplier=np.array([p[0] for p in pairs]), output_shift=np.array([p[1] for p in pairs]),
                         output_offset=-12, quantized_activation_min=low, quantized_activation_max=127,
                         output_dtype=np.dtype(np.int8), rounding=Rounding.IN_DOUBLE, effective_output_scale=reals)


def test_in_double_rounds_negative_halves_away_from_zero():
    """FULLY_CONNECTED's reference rounding: -1.5 -> -2 (the fixed-point modes give -1), 2.5 -> 3, and a result
    beyond int32 converts to INT32_MIN before the offset and the clamp (x86-64's cvttsd2si)."""
    params = replace(_in_double_layer(np.array([0.5])), bias=np.array([0]), output_offset=0)
    acc = np.array([[-3], [-1], [1], [3], [5], [-5], [-4]])
    np.testing.assert_array_equal(requantize_exact(acc, params).ravel(), [-2, -1, 1, 2, 3, -3, -2])
    huge = replace(params, effective_output_scale=np.array([4.0]), quantized_activation_min=-(2**31),
                   quantized_activation_max=2**31 - 1)
    np.testing.assert_array_equal(requantize_exact(np.array([[2**29], [2**29 - 1]]), huge).ravel(),
                                  [-(2**31), 2**31 - 4])
    beyond = Requantizer(replace(params, effective_output_scale=np.array([4.0])), np.array([2**29]),
                         np.dtype(np.float64))
    assert beyond.strategy == "int64"  # not monotone over its range: the definition itself runs


def test_in_double_with_ties_in_range_is_still_exact():
    """Multipliers of few bits put exact negative halves at steps: the proof must see them, and whatever evaluation
    it keeps must equal the definition on every accumulator of the range."""
    reals = np.array([0.5, 0.25, 0.125, 2.0 ** -7, 0.0037])
    params = _in_double_layer(reals)
    bound = np.full(reals.size, 2**12)
    requantize = Requantizer(params, bound, np.dtype(np.float32))
    acc = np.arange(-(2**12), 2**12 + 1)[:, None].repeat(reals.size, axis=1)
    np.testing.assert_array_equal(requantize(acc.astype(np.float32)), requantize_exact(acc, params).astype(np.int8))


def test_typical_in_double_layers_take_a_float_path():
    reals = np.random.default_rng(3).uniform(1e-3, 8e-3, 96)
    requantize = Requantizer(_in_double_layer(reals), np.full(96, 16 * 127 * 128), np.dtype(np.float32))
    assert requantize.strategy.startswith("float")
