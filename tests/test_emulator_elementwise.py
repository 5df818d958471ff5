"""ADD, SUB, MUL, MAXIMUM, MINIMUM against BUILTIN_REF: broadcasting, activations, constants, quantization."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tests.emulator_cases import (
    OP_SETTINGS,
    activations,
    assert_matches_reference,
    case,
    every_byte,
    quantization,
    reference,  # noqa: F401 (fixture)
    seeds,
    shapes,
)
from tests.tflite_builder import GraphBuilder

OPTIONS = {"ADD": "AddOptions", "SUB": "SubOptions", "MUL": "MulOptions", "MAXIMUM": None, "MINIMUM": None}


@st.composite
def broadcast_pair(draw):
    """Two shapes that broadcast: the second drops leading dimensions and sets some to 1 (or swaps)."""
    first = draw(shapes(max_side=7))
    second = list(first[draw(st.integers(0, len(first) - 1)):])
    second = tuple(1 if draw(st.booleans()) else d for d in second)
    return (first, second) if draw(st.booleans()) else (second, first)


@st.composite
def binary_models(draw, opcode: str, narrow_output: bool = False):
    """narrow_output: an output scale so small that the output multiplier is above one (1 to 256), as a
    calibration that saw one value gives (a SUB of equal halves in a YOLO head's decode: scale 7.8e-9)."""
    type_name = draw(st.sampled_from(["INT8", "UINT8"]))
    shape1, shape2 = draw(broadcast_pair())
    if narrow_output:  # the same shapes: with broadcasting the emulator refuses it (test below)
        shape2 = shape1
    output_shape = tuple(max(a, b) for a, b in zip((1,) * (len(shape2) - len(shape1)) + tuple(shape1),
                                                    (1,) * (len(shape1) - len(shape2)) + tuple(shape2), strict=True))
    q1, q2 = draw(quantization(type_name, 1e-3, 1.0)), draw(quantization(type_name, 1e-3, 1.0))
    if opcode in ("MAXIMUM", "MINIMUM"):
        q2 = q_out = q1  # TFLite compares raw values: the converter gives them one quantization
    elif narrow_output:
        narrowest = 2 * max(float(np.float32(q1[0])), float(np.float32(q2[0]))) / 2**20  # a multiplier of one
        q_out = (float(np.float32(narrowest * 2.0 ** -draw(st.floats(0.01, 8)))), draw(quantization(type_name))[1])
    else:
        q_out = draw(quantization(type_name, 1e-3, 2.0))
    constant_second = draw(st.booleans())
    seed = draw(seeds)
    g = GraphBuilder()
    x1 = g.tensor("input1", shape1, type_name, scale=q1[0], zero_point=q1[1])
    second = every_byte(seed + 1, shape2, type_name)
    x2 = g.tensor("input2", shape2, type_name, scale=q2[0], zero_point=q2[1],
                  data=second if constant_second else None)
    y = g.tensor("output", output_shape, type_name, scale=q_out[0], zero_point=q_out[1])
    fields, activation = {}, None
    if OPTIONS[opcode]:
        activation = draw(activations)
        fields = {"fusedActivationFunction": activation}
    g.op(opcode, [x1, x2], [y], OPTIONS[opcode], version=2, **fields)
    inputs = [every_byte(seed, shape1, type_name)] + ([] if constant_second else [second])
    return case(g.build([x1] if constant_second else [x1, x2], [y]), inputs, type=type_name, shapes=(shape1, shape2),
                q=(q1, q2, q_out), activation=activation, constant_second=constant_second, seed=seed)


@OP_SETTINGS
@given(binary_models("ADD"))
def test_add(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(binary_models("SUB"))
def test_sub(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(binary_models("SUB", narrow_output=True))
def test_sub_with_an_output_multiplier_above_one(reference, example):
    """SUB's Prepare takes it (QuantizeMultiplierGreaterThanOne) and its kernel still calls the smaller-than-one
    rescale: RoundingDivideByPOT with a negative exponent, as compiled."""
    assert_matches_reference(reference, example)


def test_sub_with_an_output_multiplier_above_one_and_broadcasting_is_refused_with_the_reason():
    import pytest

    from app.emulator import Interpreter
    from app.emulator.errors import UnsupportedOperators

    g = GraphBuilder()
    x1, x2 = g.tensor("x1", (2, 3), "INT8", scale=1.0), g.tensor("x2", (1, 3), "INT8", scale=1.0)
    y = g.tensor("y", (2, 3), "INT8", scale=1e-7, zero_point=0)
    g.op("SUB", [x1, x2], [y], "SubOptions", version=2)
    with pytest.raises(UnsupportedOperators, match="output multiplier above one and broadcasting"):
        Interpreter(model_content=g.build([x1, x2], [y]))


@OP_SETTINGS
@given(binary_models("MUL"))
def test_mul(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(binary_models("MAXIMUM"))
def test_maximum(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(binary_models("MINIMUM"))
def test_minimum(reference, example):
    assert_matches_reference(reference, example)
