"""ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM, FLOOR_DIV, FLOOR_MOD, SQRT, RSQRT on float32 and integer tensors, and 8-bit
DIV and SQRT, against BUILTIN_REF: broadcasting, fused activations, constant operands, NaN, infinities, -0.0, ties
and the integer extremes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.emulator import Interpreter, InvokeFailed, UnsupportedOperators
from app.emulator.kernels.arithmetic import activation_function_with_min_max
from tests.emulator_cases import (
    OP_SETTINGS,
    assert_matches_reference,
    case,
    quantization,
    reference,  # noqa: F401 (fixture)
    run_emulator,
    seeds,
    shapes,
    values_of,
)
from tests.tflite_builder import GraphBuilder

# opcode -> the types its reference kernel takes (unquantized), and whether it has a fused activation
BINARY = {
    "ADD": (["FLOAT32", "INT32", "INT64"], True),
    "SUB": (["FLOAT32", "INT32", "INT64"], True),
    "MUL": (["FLOAT32", "INT32", "INT64"], True),
    "DIV": (["FLOAT32", "INT32"], True),
    "MAXIMUM": (["FLOAT32", "INT32", "INT64"], False),
    "MINIMUM": (["FLOAT32", "INT32", "INT64"], False),
    "FLOOR_DIV": (["FLOAT32", "INT32", "INT16", "INT8"], False),
    "FLOOR_MOD": (["FLOAT32", "INT32", "INT64", "INT16", "INT8"], False),
}
CHECKS_DIVISOR = {"FLOOR_DIV", "FLOOR_MOD"}  # and DIV on integers


@st.composite
def broadcast_pair(draw):
    """Two shapes that broadcast (numpy's rules, TFLite's too): dimensions dropped in front or set to 1."""
    output = draw(shapes(min_rank=0, max_rank=5, max_side=4))

    def operand():
        rank = draw(st.integers(0, len(output)))
        tail = output[len(output) - rank:]
        return tuple(1 if draw(st.integers(0, 3)) == 0 else d for d in tail)

    first, second = operand(), operand()
    return first, second, tuple(np.broadcast_shapes(first, second))


@st.composite
def binary_models(draw, opcode: str):
    types, has_activation = BINARY[opcode]
    type_name = draw(st.sampled_from(types))
    shape1, shape2, output = draw(broadcast_pair())
    seed = draw(seeds)
    special = draw(st.booleans())
    small = draw(st.booleans())  # small operands (ties, exact quotients) or wide ones
    low, high = (-8.0, 8.0) if small else (-1e4, 1e4)
    x1 = values_of(seed, shape1, type_name, special=special, low=low, high=high)
    x2 = values_of(seed + 1, shape2, type_name, special=special, low=low, high=high)
    if type_name != "FLOAT32" and small:
        x1, x2 = (x1 % 17 - 8).astype(x1.dtype), (x2 % 7 - 3).astype(x2.dtype)
    if opcode in CHECKS_DIVISOR or (opcode == "DIV" and type_name != "FLOAT32"):
        x2 = np.where(x2 == 0, np.ones_like(x2), x2)  # a zero fails the invoke: its own test
        if (opcode, type_name) in (("DIV", "INT32"), ("FLOOR_MOD", "INT32"), ("FLOOR_MOD", "INT64")):
            x2 = np.where(x2 == -1, np.full_like(x2, 2), x2)  # INT_MIN / -1 traps in C (SIGFPE): not an example
    activation = draw(st.sampled_from(["NONE", "RELU", "RELU6", "RELU_N1_TO_1"])) if has_activation else None
    constant = draw(st.sampled_from([None, 0, 1]))
    g = GraphBuilder()
    a = g.tensor("a", shape1, type_name, data=x1 if constant == 0 else None)
    b = g.tensor("b", shape2, type_name, data=x2 if constant == 1 else None)
    y = g.tensor("y", output, type_name)
    if activation is not None:
        g.op(opcode, [a, b], [y], fusedActivationFunction=activation)
    else:
        g.op(opcode, [a, b], [y])
    inputs = [x for position, (tensor, x) in enumerate([(a, x1), (b, x2)]) if position != constant]
    runtime = [tensor for position, tensor in enumerate([a, b]) if position != constant]
    return case(g.build(runtime, [y]), inputs, opcode=opcode, type=type_name, shapes=(shape1, shape2),
                activation=activation, constant=constant, seed=seed, special=special)


def test_the_activation_clamp_keeps_nan_and_negative_zero_and_clamps_infinities():
    lowest, highest = np.finfo(np.float32).min, np.finfo(np.float32).max
    x = np.array([np.nan, -0.0, np.inf, -np.inf, 1.0], np.float32)
    got = activation_function_with_min_max(x, lowest, highest)
    assert np.isnan(got[0]) and np.signbit(got[1]) and got[2] == highest and got[3] == lowest
    relu = activation_function_with_min_max(x, np.float32(0), highest)
    assert np.signbit(relu[1]) and relu[1] == 0  # std::max(-0.0f, 0.0f) is -0.0f


@pytest.mark.parametrize("opcode", sorted(BINARY))
def test_binary(reference, opcode):
    @OP_SETTINGS
    @given(binary_models(opcode))
    def examples(example):
        assert_matches_reference(reference, example)

    examples()


@pytest.mark.parametrize("opcode,type_name", [("FLOOR_DIV", "INT32"), ("FLOOR_DIV", "FLOAT32"), ("FLOOR_MOD", "INT32"),
                                              ("DIV", "INT32")])
def test_a_zero_divisor_fails_the_invoke_like_tflite(reference, opcode, type_name):
    g = GraphBuilder()
    a, b, y = (g.tensor(name, (3,), type_name) for name in "aby")
    g.op(opcode, [a, b], [y])
    model = g.build([a, b], [y])
    dtype = np.float32 if type_name == "FLOAT32" else np.int32
    inputs = [np.array([1, 2, 3], dtype), np.array([1, 0, 2], dtype)]
    assert "Refused" in type(reference.run(model, inputs)).__name__
    with pytest.raises(InvokeFailed, match="Division by 0"):
        run_emulator(model, inputs)
    inputs[1][1] = -1 if type_name != "FLOAT32" else -0.0  # -0.0 == 0 too, for FLOOR_DIV's check
    if type_name == "FLOAT32":
        assert "Refused" in type(reference.run(model, inputs)).__name__
        with pytest.raises(InvokeFailed):
            run_emulator(model, inputs)
    else:
        assert_matches_reference(reference, model, inputs)
    g = GraphBuilder()  # a constant zero divisor: every invoke would fail, so the load does
    a, y = g.tensor("a", (3,), type_name), g.tensor("y", (3,), type_name)
    g.op(opcode, [a, g.tensor("b", (3,), type_name, data=np.array([1, 0, 1]))], [y])
    with pytest.raises(UnsupportedOperators, match="constant divisor holds a 0"):
        Interpreter(model_content=g.build([a], [y]))


@st.composite
def unary_float_models(draw):
    opcode = draw(st.sampled_from(["SQRT", "RSQRT"]))
    shape = draw(shapes(min_rank=0, max_rank=4, max_side=6))
    seed = draw(seeds)
    positive = draw(st.booleans())
    x = values_of(seed, shape, "FLOAT32", special=draw(st.booleans()), low=0.0 if positive else -50.0, high=1e4)
    g = GraphBuilder()
    a, y = g.tensor("a", shape, "FLOAT32"), g.tensor("y", shape, "FLOAT32")
    g.op(opcode, [a], [y])
    return case(g.build([a], [y]), [x], opcode=opcode, shape=shape, seed=seed)


@OP_SETTINGS
@given(unary_float_models())
def test_sqrt_and_rsqrt_on_float(reference, example):
    assert_matches_reference(reference, example)


@st.composite
def quantized_sqrt_models(draw):
    input_q = draw(quantization("INT8"))
    input_q = (input_q[0], -128)  # every byte at or above the zero point: no negative input
    output_q = draw(quantization("INT8", 1e-3, 0.2))
    seed = draw(seeds)
    shape = draw(shapes(max_side=8))
    g = GraphBuilder()
    a = g.tensor("a", shape, "INT8", scale=input_q[0], zero_point=input_q[1])
    y = g.tensor("y", shape, "INT8", scale=output_q[0], zero_point=output_q[1])
    g.op("SQRT", [a], [y])
    return case(g.build([a], [y]), [values_of(seed, shape, "INT8")], input_q=input_q, output_q=output_q)


@OP_SETTINGS
@given(quantized_sqrt_models())
def test_sqrt_on_int8(reference, example):
    assert_matches_reference(reference, example)


def test_a_negative_int8_sqrt_fails_the_invoke(reference):
    g = GraphBuilder()
    a = g.tensor("a", (2,), "INT8", scale=0.1, zero_point=0)
    y = g.tensor("y", (2,), "INT8", scale=0.1, zero_point=0)
    g.op("SQRT", [a], [y])
    model = g.build([a], [y])
    assert_matches_reference(reference, model, [np.array([0, 100], np.int8)])
    assert "Refused" in type(reference.run(model, [np.array([-1, 100], np.int8)])).__name__
    with pytest.raises(InvokeFailed, match="non-negative"):
        run_emulator(model, [np.array([-1, 100], np.int8)])


@st.composite
def quantized_div_models(draw):
    """8-bit DIV (TF 2.21 quantizes a pose model's distance weighting to it): every byte pair, divisors at their
    zero point excluded: a divisor of 0 fails the invoke (its own test)."""
    type_name = draw(st.sampled_from(["INT8", "UINT8"]))
    q1, q2, q_out = (draw(quantization(type_name)) for _ in range(3))
    shape1, shape2, output = draw(broadcast_pair())
    seed = draw(seeds)
    x1, x2 = values_of(seed, shape1, type_name), values_of(seed + 1, shape2, type_name)
    low = np.iinfo(x2.dtype).min
    x2 = np.where(x2.astype(np.int64) == q2[1], np.full_like(x2, q2[1] - 1 if q2[1] > low else q2[1] + 1), x2)
    activation = draw(st.sampled_from(["NONE", "RELU", "RELU6", "RELU_N1_TO_1"]))
    g = GraphBuilder()
    a = g.tensor("a", shape1, type_name, scale=q1[0], zero_point=q1[1])
    b = g.tensor("b", shape2, type_name, scale=q2[0], zero_point=q2[1])
    y = g.tensor("y", output, type_name, scale=q_out[0], zero_point=q_out[1])
    g.op("DIV", [a, b], [y], fusedActivationFunction=activation)
    return case(g.build([a, b], [y]), [x1, x2], type=type_name, qs=(q1, q2, q_out), shapes=(shape1, shape2),
                activation=activation, seed=seed)


@OP_SETTINGS
@given(quantized_div_models())
def test_div_on_8_bits(reference, example):
    assert_matches_reference(reference, example)


def test_an_8_bit_div_is_exact_on_every_pair_and_fails_on_a_zero_divisor(reference):
    zero_point = 10
    pairs = [(a, b) for a in range(256) for b in range(256) if b != zero_point]
    g = GraphBuilder()  # all 65280 pairs whose divisor is not 0 (not at its zero point)
    a, b, y = (g.tensor(name, (len(pairs),), "UINT8", scale=0.1, zero_point=zero_point) for name in "aby")
    g.op("DIV", [a, b], [y])
    assert_matches_reference(reference, g.build([a, b], [y]), [np.array(column, np.uint8) for column in zip(*pairs)])
    g = GraphBuilder()
    a, b, y = (g.tensor(name, (4,), "UINT8", scale=0.1, zero_point=zero_point) for name in "aby")
    g.op("DIV", [a, b], [y])
    model = g.build([a, b], [y])
    inputs = [np.array([1, 2, 3, 4], np.uint8), np.array([0, 1, 2, zero_point], np.uint8)]
    assert "Refused" in type(reference.run(model, inputs)).__name__  # CheckNonZero: a byte at the zero point
    with pytest.raises(InvokeFailed, match="Division by 0"):
        run_emulator(model, inputs)
    inputs[1][3] = 0  # a stored 0 is a real -1: fine
    assert_matches_reference(reference, model, inputs)
