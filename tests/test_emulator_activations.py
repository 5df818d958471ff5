"""RELU family, LEAKY_RELU (8-bit and float), PRELU, LOGISTIC (8-bit and float), TANH, HARD_SWISH, SOFTMAX, L2_NORMALIZATION
against BUILTIN_REF.

Element-wise inputs hold every one of the 256 byte values, so a table entry cannot hide.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.emulator_cases import (
    OP_SETTINGS,
    assert_matches_reference,
    case,
    every_byte,
    quantization,
    reference,  # noqa: F401 (fixture)
    run_emulator,
    seeds,
    shapes,
    unary_model,
    values_of,
)
from tests.tflite_builder import GraphBuilder

types = st.sampled_from(["INT8", "UINT8"])


@st.composite
def unary_examples(draw, opcode: str, options: str | None = None, output_q=None, min_size: int = 256, **fields):
    type_name = draw(types)
    shape = draw(shapes(max_side=12))
    if int(np.prod(shape)) < min_size:
        shape = shape[:-1] + (shape[-1] * -(-min_size // int(np.prod(shape))),)
    input_q = draw(quantization(type_name, 1e-3, 0.2))
    if output_q is None:
        out_q = draw(quantization(type_name, 1e-3, 0.2))
    else:
        out_q = output_q(type_name) if callable(output_q) else output_q
    values = {k: draw(v) if isinstance(v, st.SearchStrategy) else v for k, v in fields.items()}
    seed = draw(seeds)
    model = unary_model(opcode, shape, type_name, input_q, out_q, options, **values)
    return case(model, [every_byte(seed, shape, type_name)], opcode=opcode, type=type_name, shape=shape,
                input_q=input_q, output_q=out_q, seed=seed, **values)


def _fixed_output(type_name: str, scale: float, int8_zero_point: int, uint8_zero_point: int):
    return (scale, int8_zero_point if type_name == "INT8" else uint8_zero_point)


@OP_SETTINGS
@given(unary_examples("RELU"))
def test_relu(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(unary_examples("RELU6"))
def test_relu6(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(unary_examples("RELU_N1_TO_1"))
def test_relu_n1_to_1(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(unary_examples("LEAKY_RELU", "LeakyReluOptions", alpha=st.floats(0.0, 0.875, width=32)))
def test_leaky_relu(reference, example):
    assert_matches_reference(reference, example)


@st.composite
def float_leaky_relu_examples(draw):
    """ai-edge-quantizer's float island: int8 -> DEQUANTIZE -> LEAKY_RELU (float) -> QUANTIZE -> int8.

    Or the float op alone, on floats from a wide range with signed zeros and subnormals.
    """
    type_name = draw(types)
    shape = draw(shapes(max_side=12))
    alpha = draw(st.floats(-2.0, 2.0, width=32))
    seed = draw(seeds)
    g = GraphBuilder()
    if draw(st.booleans()):
        input_q, output_q = draw(quantization(type_name, 1e-3, 0.2)), draw(quantization(type_name, 1e-3, 0.2))
        x = g.tensor("input", shape, type_name, scale=input_q[0], zero_point=input_q[1])
        f, r = g.tensor("dequantized", shape, "FLOAT32"), g.tensor("leaky", shape, "FLOAT32")
        y = g.tensor("output", shape, type_name, scale=output_q[0], zero_point=output_q[1])
        g.op("DEQUANTIZE", [x], [f])
        g.op("LEAKY_RELU", [f], [r], "LeakyReluOptions", alpha=alpha)
        g.op("QUANTIZE", [r], [y])
        return case(g.build([x], [y]), [every_byte(seed, shape, type_name)], island=True, type=type_name,
                    shape=shape, alpha=alpha, input_q=input_q, output_q=output_q, seed=seed)
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(shape) * 10.0 ** rng.integers(-40, 30, shape)).astype(np.float32)
    values.reshape(-1)[:4] = np.array([0.0, -0.0, 1e-45, -1e-45], np.float32)[:values.size]
    x, y = g.tensor("input", shape, "FLOAT32"), g.tensor("output", shape, "FLOAT32")
    g.op("LEAKY_RELU", [x], [y], "LeakyReluOptions", alpha=alpha)
    return case(g.build([x], [y]), [values], island=False, shape=shape, alpha=alpha, seed=seed)


@OP_SETTINGS
@given(float_leaky_relu_examples())
def test_float_leaky_relu(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(unary_examples("LOGISTIC", output_q=lambda t: _fixed_output(t, 1 / 256, -128, 0)))
def test_logistic(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(unary_examples("TANH", output_q=lambda t: _fixed_output(t, 1 / 128, 0, 128)))
def test_tanh(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(unary_examples("HARD_SWISH"))
def test_hard_swish(reference, example):
    assert_matches_reference(reference, example)


@st.composite
def prelu_examples(draw):
    type_name = draw(types)
    shape = draw(shapes(min_rank=2, max_rank=4, max_side=8))
    alpha_shape = tuple(1 if draw(st.booleans()) else d for d in shape[1:])  # shared axes, as the converter writes
    input_q, alpha_q = draw(quantization(type_name, 1e-3, 0.2)), draw(quantization(type_name, 1e-3, 0.05))
    output_q = draw(quantization(type_name, 1e-3, 0.2))
    seed = draw(seeds)
    g = GraphBuilder()
    x = g.tensor("input", shape, type_name, scale=input_q[0], zero_point=input_q[1])
    alpha = g.tensor("alpha", alpha_shape, type_name, scale=alpha_q[0], zero_point=alpha_q[1],
                     data=every_byte(seed + 1, alpha_shape, type_name))
    y = g.tensor("output", shape, type_name, scale=output_q[0], zero_point=output_q[1])
    g.op("PRELU", [x, alpha], [y])
    return case(g.build([x], [y]), [every_byte(seed, shape, type_name)], type=type_name, shape=shape,
                alpha_shape=alpha_shape, q=(input_q, alpha_q, output_q), seed=seed)


@OP_SETTINGS
@given(prelu_examples())
def test_prelu(reference, example):
    assert_matches_reference(reference, example)


@st.composite
def softmax_examples(draw):
    type_name = draw(types)
    shape = draw(shapes(min_rank=1, max_rank=4, max_side=40))
    input_q = draw(quantization(type_name, 1e-3, 0.5))
    output_q = _fixed_output(type_name, 1 / 256, -128, 0)
    beta = draw(st.sampled_from([1.0, 0.5, 2.0]))
    seed = draw(seeds)
    model = unary_model("SOFTMAX", shape, type_name, input_q, output_q, "SoftmaxOptions", beta=beta)
    return case(model, [every_byte(seed, shape, type_name)], type=type_name, shape=shape, input_q=input_q,
                beta=beta, seed=seed)


@OP_SETTINGS
@given(softmax_examples())
def test_softmax(reference, example):
    assert_matches_reference(reference, example)


@st.composite
def attention_softmax_examples(draw):
    """Rows as long as an attention's (256 to 500 cells: the per-row tables), values from a narrow band (sums
    near the kernel's limit of 512) or every byte."""
    type_name = draw(types)
    rows, length = draw(st.integers(1, 3)), draw(st.integers(256, 500))
    input_q = draw(quantization(type_name, 1e-3, 0.5))
    output_q = _fixed_output(type_name, 1 / 256, -128, 0)
    seed = draw(seeds)
    values = every_byte(seed, (rows, length), type_name)
    if draw(st.booleans()):
        base = np.iinfo(values.dtype).min + draw(st.integers(0, 250))
        values = (base + np.random.default_rng(seed).integers(0, 6, values.shape)).astype(values.dtype)
    model = unary_model("SOFTMAX", (rows, length), type_name, input_q, output_q, "SoftmaxOptions", beta=1.0)
    return case(model, [values], type=type_name, shape=(rows, length), input_q=input_q, seed=seed)


@OP_SETTINGS
@given(attention_softmax_examples())
def test_softmax_over_long_rows(reference, example):
    assert_matches_reference(reference, example)


def test_softmax_fails_where_the_reference_kernel_aborts(reference):
    """512 equal values sum to 512 in Q12.19: RoundingDivideByPOT would take an exponent of 32, which gemmlowp
    asserts against, and BUILTIN_REF aborts the process; the emulator fails the invoke instead. 511 run."""
    from app.emulator.errors import InvokeFailed
    from tests.reference_worker import Aborted

    for length, fails in ((511, False), (512, True)):
        model = unary_model("SOFTMAX", (1, length), "INT8", (0.05, 0), (1 / 256, -128), "SoftmaxOptions", beta=1.0)
        values = [np.zeros((1, length), np.int8)]
        if not fails:
            assert_matches_reference(reference, model, values)
            continue
        assert isinstance(reference.run(model, values), Aborted)
        with pytest.raises(InvokeFailed, match="sum to 512 or more"):
            run_emulator(model, values)


@st.composite
def l2_normalization_examples(draw):
    type_name = draw(types)
    shape = draw(shapes(min_rank=1, max_rank=4, max_side=30))
    input_q = draw(quantization(type_name, 1e-3, 0.5))
    output_q = _fixed_output(type_name, 1 / 128, 0, 128)
    seed = draw(seeds)
    values = every_byte(seed, shape, type_name)
    if draw(st.booleans()):  # rows at the zero point: the kernel's special case for a zero norm
        values.reshape(-1, shape[-1])[0] = input_q[1]
    model = unary_model("L2_NORMALIZATION", shape, type_name, input_q, output_q, "L2NormOptions")
    return case(model, [values], type=type_name, shape=shape, input_q=input_q, seed=seed)


@OP_SETTINGS
@given(l2_normalization_examples())
def test_l2_normalization(reference, example):
    assert_matches_reference(reference, example)


@st.composite
def float_logistic_models(draw):
    """Float32 LOGISTIC around its cutoffs (-9 and 16.619047), beyond them, and at NaN, infinities and -0.0."""
    shape = draw(shapes(min_rank=0, max_side=8))
    seed = draw(seeds)
    low, high = draw(st.sampled_from([(-12.0, 20.0), (-100.0, 100.0), (-9.5, -8.5), (16.0, 17.0)]))
    values = values_of(seed, shape, "FLOAT32", special=draw(st.booleans()), low=low, high=high)
    g = GraphBuilder()
    x, y = g.tensor("input", shape, "FLOAT32"), g.tensor("output", shape, "FLOAT32")
    g.op("LOGISTIC", [x], [y])
    return case(g.build([x], [y]), [values], shape=shape, seed=seed, range=(low, high))


@OP_SETTINGS
@given(float_logistic_models())
def test_logistic_on_float(reference, example):
    assert_matches_reference(reference, example)
