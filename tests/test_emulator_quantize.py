"""QUANTIZE (requantize, int8 <-> uint8, from float), DEQUANTIZE, the two in a row, and CAST between every pair of
types, against BUILTIN_REF."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tests.emulator_cases import (
    OP_SETTINGS,
    assert_matches_reference,
    case,
    every_byte,
    quantization,
    reference,  # noqa: F401 (fixture)
    seeds,
    shapes,
    unary_model,
    values_of,
)
from tests.tflite_builder import GraphBuilder


@st.composite
def requantize_models(draw):
    source, target = draw(st.sampled_from(["INT8", "UINT8"])), draw(st.sampled_from(["INT8", "UINT8"]))
    shape = draw(shapes())
    input_q = draw(quantization(source, 1e-3, 1.0))
    output_q = draw(quantization(target, 1e-3, 1.0))
    if draw(st.booleans()):  # the converter's case: same scale, zero point moved by 128
        output_q = (input_q[0], input_q[1] + (128 if source == "INT8" else -128))
        target = "UINT8" if source == "INT8" else "INT8"
    seed = draw(seeds)
    model = unary_model("QUANTIZE", shape, source, input_q, output_q, output_type=target, version=2)
    return case(model, [every_byte(seed, shape, source)], source=source, target=target, shape=shape,
                input_q=input_q, output_q=output_q)


@st.composite
def float_quantize_models(draw):
    target = draw(st.sampled_from(["INT8", "UINT8"]))
    shape = draw(shapes())
    output_q = draw(quantization(target, 1e-3, 1.0))
    seed = draw(seeds)
    rng = np.random.default_rng(seed)
    span = output_q[0] * 300
    x = rng.uniform(-span, span, shape).astype(np.float32)
    x.reshape(-1)[: min(x.size, 8)] = (np.arange(min(x.size, 8)) - 4 + 0.5).astype(np.float32) * output_q[0]  # ties
    g = GraphBuilder()
    xi = g.tensor("input", shape, "FLOAT32")
    y = g.tensor("output", shape, target, scale=output_q[0], zero_point=output_q[1])
    g.op("QUANTIZE", [xi], [y])
    return case(g.build([xi], [y]), [x], target=target, shape=shape, output_q=output_q, seed=seed)


@st.composite
def dequantize_models(draw):
    source = draw(st.sampled_from(["INT8", "UINT8"]))
    shape = draw(shapes())
    input_q = draw(quantization(source, 1e-3, 10.0))
    seed = draw(seeds)
    model = unary_model("DEQUANTIZE", shape, source, input_q, None, output_type="FLOAT32", version=2)
    return case(model, [every_byte(seed, shape, source)], source=source, shape=shape, input_q=input_q)


@st.composite
def float_round_trip_models(draw):
    """8-bit -> DEQUANTIZE -> QUANTIZE -> 8-bit: the float hop converters leave between two int8 ops."""
    source, target = draw(st.sampled_from(["INT8", "UINT8"])), draw(st.sampled_from(["INT8", "UINT8"]))
    shape = draw(shapes())
    input_q, output_q = draw(quantization(source, 1e-3, 1.0)), draw(quantization(target, 1e-3, 1.0))
    seed = draw(seeds)
    g = GraphBuilder()
    x = g.tensor("input", shape, source, scale=input_q[0], zero_point=input_q[1])
    f = g.tensor("float", shape, "FLOAT32")
    y = g.tensor("output", shape, target, scale=output_q[0], zero_point=output_q[1])
    g.op("DEQUANTIZE", [x], [f], version=2)
    g.op("QUANTIZE", [f], [y])
    return case(g.build([x], [y]), [every_byte(seed, shape, source)], source=source, target=target, shape=shape,
                input_q=input_q, output_q=output_q)


@OP_SETTINGS
@given(float_round_trip_models())
def test_dequantize_then_quantize(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(requantize_models())
def test_quantize_requantizes_8_bit(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(float_quantize_models())
def test_quantize_from_float(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(dequantize_models())
def test_dequantize(reference, example):
    assert_matches_reference(reference, example)


CAST_TYPES = ["INT8", "UINT8", "INT16", "INT32", "INT64", "FLOAT32", "BOOL"]


@st.composite
def cast_models(draw):
    """Every pair of types; floats past the integer ranges, NaN and infinities (TFLite saturates them)."""
    source, target = draw(st.sampled_from(CAST_TYPES)), draw(st.sampled_from(CAST_TYPES))
    shape = draw(shapes(min_rank=0, max_side=6))
    seed = draw(seeds)
    wide = draw(st.sampled_from([1e2, 1e4, 1e10, 1e20]))
    values = values_of(seed, shape, source, special=draw(st.booleans()), low=-wide, high=wide)
    g = GraphBuilder()
    x = g.tensor("input", shape, source)
    y = g.tensor("output", shape, target)
    g.op("CAST", [x], [y])
    return case(g.build([x], [y]), [values], source=source, target=target, shape=shape, seed=seed)


@OP_SETTINGS
@given(cast_models())
def test_cast(reference, example):
    assert_matches_reference(reference, example)


def test_quantize_rounds_the_float_just_below_a_half_down(reference):
    """TfLiteRound is std::round: 0.49999997f rounds to 0 (floor(|x| + 0.5) in float gave 1), ties away from zero."""
    below_half = np.nextafter(np.float32(0.5), np.float32(0))
    values = np.array([[below_half, -below_half, 2.5, -2.5, 1.4999999, 8388609.0]], np.float32)
    g = GraphBuilder()
    x, y = g.tensor("x", values.shape, "FLOAT32"), g.tensor("y", values.shape, "INT8", scale=1.0, zero_point=0)
    g.op("QUANTIZE", [x], [y])
    model = g.build([x], [y])
    from tests.emulator_cases import run_emulator

    assert run_emulator(model, [values])[0].tolist() == [[0, 0, 3, -3, 1, 127]]
    assert_matches_reference(reference, model, [values])
