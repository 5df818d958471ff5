"""CONV_2D, DEPTHWISE_CONV_2D and TRANSPOSE_CONV against BUILTIN_REF, on randomized models (FULLY_CONNECTED and
BATCH_MATMUL: test_emulator_matmul.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.emulator.kernels import conv
from app.emulator.kernels.common import compute_padding
from tests.emulator_cases import (
    OP_SETTINGS,
    activations,
    assert_matches_reference,
    case,
    quantization,
    random_values,
    reference,  # noqa: F401 (fixture)
    run_emulator,
    seeds,
)
from tests.tflite_builder import GraphBuilder


@st.composite
def filter_quantization(draw, type_name: str, channels: int):
    """Per-channel (int8 only) or per-tensor filter scales, and the filter zero point."""
    per_channel = type_name == "INT8" and draw(st.booleans())
    count = channels if per_channel else 1
    scales = [float(np.float32(np.exp(draw(st.floats(np.log(1e-3), np.log(0.05)))))) for _ in range(count)]
    zero_point = 0 if type_name == "INT8" else draw(st.integers(0, 255))
    return scales, zero_point


def _output_scale(draw, input_scale: float, filter_scales: list[float], depth: int) -> float:
    """An output scale that keeps results spread over the 8-bit range (not all clamped, not all zero)."""
    typical = input_scale * float(np.mean(filter_scales)) * 64 * np.sqrt(depth) * 2
    return float(np.float32(typical * 2.0 ** draw(st.floats(-3, 3))))


def _weights(seed: int, shape, type_name: str) -> np.ndarray:
    values = random_values(seed, shape, type_name)
    return np.maximum(values, -127) if type_name == "INT8" else values  # TFLite's int8 filters are symmetric


def _bias(g: GraphBuilder, seed: int, input_scale: float, filter_scales: list[float], channels: int) -> int:
    scales = [float(np.float32(np.float64(np.float32(input_scale)) * s)) for s in filter_scales]
    values = np.random.default_rng(seed + 1).integers(-(2**15), 2**15, channels)
    return g.tensor("bias", (channels,), "INT32", scale=scales if len(scales) > 1 else scales[0],
                    zero_point=[0] * len(scales), axis=0, data=values)


@st.composite
def conv_models(draw):
    type_name = draw(st.sampled_from(["INT8", "UINT8"]))
    batch, height, width = draw(st.integers(1, 2)), draw(st.integers(1, 12)), draw(st.integers(1, 12))
    in_c, out_c = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    padding = draw(st.sampled_from(["SAME", "VALID"]))
    if padding == "VALID":
        height, width = max(height, (kh - 1) * dh + 1), max(width, (kw - 1) * dw + 1)
    s_in, z_in = draw(quantization(type_name))
    filter_scales, filter_zero_point = draw(filter_quantization(type_name, out_c))
    s_out = _output_scale(draw, s_in, filter_scales, kh * kw * in_c)
    z_out = draw(quantization(type_name))[1]
    seed = draw(seeds)
    g = GraphBuilder()
    x = g.tensor("input", (batch, height, width, in_c), type_name, scale=s_in, zero_point=z_in)
    w = g.tensor("filter", (out_c, kh, kw, in_c), type_name, scale=filter_scales, zero_point=filter_zero_point,
                 axis=0, data=_weights(seed, (out_c, kh, kw, in_c), type_name))
    b = _bias(g, seed, s_in, filter_scales, out_c)
    p = compute_padding(padding, height, width, kh, kw, sh, sw, dh, dw)
    y = g.tensor("output", (batch, p.output_height, p.output_width, out_c), type_name, scale=s_out, zero_point=z_out)
    activation = draw(activations)
    g.op("CONV_2D", [x, w, b], [y], "Conv2DOptions", padding=padding, strideH=sh, strideW=sw, dilationHFactor=dh,
         dilationWFactor=dw, fusedActivationFunction=activation)
    return case(g.build([x], [y]), [random_values(seed + 2, (batch, height, width, in_c), type_name)],
                type=type_name, input=(batch, height, width, in_c), filter=(out_c, kh, kw), stride=(sh, sw),
                dilation=(dh, dw), padding=padding, activation=activation, input_q=(s_in, z_in),
                filter_q=(filter_scales, filter_zero_point), output_q=(s_out, z_out), seed=seed)


@st.composite
def depthwise_models(draw):
    type_name = draw(st.sampled_from(["INT8", "UINT8"]))
    batch, height, width = draw(st.integers(1, 2)), draw(st.integers(1, 12)), draw(st.integers(1, 12))
    in_c, multiplier = draw(st.integers(1, 8)), draw(st.integers(1, 3))
    out_c = in_c * multiplier
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dilation = draw(st.integers(1, 3))  # the Edge TPU needs equal dilations; TFLite takes any
    dh, dw = dilation, draw(st.sampled_from([dilation, 1]))
    padding = draw(st.sampled_from(["SAME", "VALID"]))
    if padding == "VALID":
        height, width = max(height, (kh - 1) * dh + 1), max(width, (kw - 1) * dw + 1)
    s_in, z_in = draw(quantization(type_name))
    filter_scales, filter_zero_point = draw(filter_quantization(type_name, out_c))
    s_out = _output_scale(draw, s_in, filter_scales, kh * kw)
    z_out = draw(quantization(type_name))[1]
    seed = draw(seeds)
    g = GraphBuilder()
    x = g.tensor("input", (batch, height, width, in_c), type_name, scale=s_in, zero_point=z_in)
    w = g.tensor("filter", (1, kh, kw, out_c), type_name, scale=filter_scales, zero_point=filter_zero_point,
                 axis=3, data=_weights(seed, (1, kh, kw, out_c), type_name))
    b = _bias(g, seed, s_in, filter_scales, out_c)
    p = compute_padding(padding, height, width, kh, kw, sh, sw, dh, dw)
    y = g.tensor("output", (batch, p.output_height, p.output_width, out_c), type_name, scale=s_out, zero_point=z_out)
    activation = draw(activations)
    g.op("DEPTHWISE_CONV_2D", [x, w, b], [y], "DepthwiseConv2DOptions", version=2, padding=padding, strideH=sh,
         strideW=sw, depthMultiplier=multiplier, dilationHFactor=dh, dilationWFactor=dw,
         fusedActivationFunction=activation)
    return case(g.build([x], [y]), [random_values(seed + 2, (batch, height, width, in_c), type_name)],
                type=type_name, input=(batch, height, width, in_c), filter=(kh, kw), multiplier=multiplier,
                stride=(sh, sw), dilation=(dh, dw), padding=padding, activation=activation, input_q=(s_in, z_in),
                filter_q=(filter_scales, filter_zero_point), output_q=(s_out, z_out), seed=seed)


@st.composite
def transpose_conv_models(draw):
    """The decoder's upsampling convolution, with every output size TFLite accepts (torch's output_padding)."""
    type_name = draw(st.sampled_from(["INT8", "UINT8"]))
    batch, height, width = draw(st.integers(1, 2)), draw(st.integers(1, 8)), draw(st.integers(1, 8))
    in_c, out_c = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    padding = draw(st.sampled_from(["SAME", "VALID"]))
    # TFLite requires the convolution of the output to give the input's size back: stride choices each way
    if padding == "SAME":
        out_h, out_w = (height - 1) * sh + 1, (width - 1) * sw + 1
    else:
        out_h, out_w = (height - 1) * sh + kh, (width - 1) * sw + kw
    out_h, out_w = out_h + draw(st.integers(0, sh - 1)), out_w + draw(st.integers(0, sw - 1))
    s_in, z_in = draw(quantization(type_name))
    filter_scales, filter_zero_point = draw(filter_quantization(type_name, out_c))
    s_out = _output_scale(draw, s_in, filter_scales, max(1, kh * kw * in_c // (sh * sw)))  # taps per output
    z_out = draw(quantization(type_name))[1]
    with_bias = draw(st.booleans())
    seed = draw(seeds)
    g = GraphBuilder()
    output_shape = g.constant("output_shape", [batch, out_h, out_w, out_c])
    w = g.tensor("filter", (out_c, kh, kw, in_c), type_name, scale=filter_scales, zero_point=filter_zero_point,
                 axis=0, data=_weights(seed, (out_c, kh, kw, in_c), type_name))
    x = g.tensor("input", (batch, height, width, in_c), type_name, scale=s_in, zero_point=z_in)
    inputs = [output_shape, w, x] + ([_bias(g, seed, s_in, filter_scales, out_c)] if with_bias else [])
    y = g.tensor("output", (batch, out_h, out_w, out_c), type_name, scale=s_out, zero_point=z_out)
    activation = draw(activations)
    g.op("TRANSPOSE_CONV", inputs, [y], "TransposeConvOptions", version=4, padding=padding, strideH=sh, strideW=sw,
         fusedActivationFunction=activation)
    return case(g.build([x], [y]), [random_values(seed + 2, (batch, height, width, in_c), type_name)],
                type=type_name, input=(batch, height, width, in_c), filter=(out_c, kh, kw), stride=(sh, sw),
                output=(out_h, out_w), padding=padding, bias=with_bias, activation=activation, input_q=(s_in, z_in),
                filter_q=(filter_scales, filter_zero_point), output_q=(s_out, z_out), seed=seed)


@OP_SETTINGS
@given(conv_models())
def test_conv_2d(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(depthwise_models())
def test_depthwise_conv_2d(reference, example):
    assert_matches_reference(reference, example)


@OP_SETTINGS
@given(transpose_conv_models())
def test_transpose_conv(reference, example):
    assert_matches_reference(reference, example)


@settings(OP_SETTINGS, max_examples=30)
@given(st.one_of(conv_models(), depthwise_models()))
def test_one_output_row_per_block_gives_the_same_bytes(example):
    """Large layers run in blocks of output rows (conv.BLOCK_VALUES); here every row is a block, numpy path."""
    whole = run_emulator(example.model, example.inputs, accelerate=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(conv, "BLOCK_VALUES", 1)
        rows = run_emulator(example.model, example.inputs, accelerate=False)
    assert [a.tobytes() for a in rows] == [a.tobytes() for a in whole]
